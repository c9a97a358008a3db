"""Speed and memory, as ratios against baselines run in the same process on the same data.

    python -m tokpack.bench prepare [--mb 32] [--rss-mb 1024]
    python -m tokpack.bench loader [--memory-batches 10000]
    python -m tokpack.bench open [--shards 200 2000]
    python -m tokpack.bench packing [--tokens 2000000] [--block-size 1024]
    python -m tokpack.bench train [--folder data/sample] [--config configs/train_sample.toml]
    python -m tokpack.bench remote [--mb 32]            # needs tokpack[remote] and moto[server]
    python -m tokpack.bench chat [--mb 8] [--rss-mb 300] [--processes 2]
    python -m tokpack.bench dedup [--mb 16] [--rss-mb 300]  # peers: datasketch, datatrove (see its module)

Each prints its tables and, last, one JSON line with every figure. Absolute times are noise on a
shared machine; the ratios are the result: medians over rounds in which the runs take turns.
Installed peers run too (nanoGPT's openwebtext recipe on HF datasets, litdata); to install them
without replacing torch:

    pip install datasets
    pip install --no-deps litdata lightning-utilities && pip install boto3 tifffile obstore

See docs/benchmarks.md.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..cli import parser, run_cli
from .timing import machine


def _sizes(p: Any, mb: float, what: str, try_rss: str) -> None:
    """--mb (``what``) and --rss-mb, the size of the corpus whose peak RSS is read in a fresh process."""
    p.add_argument("--mb", type=float, default=mb, help=f"{what} (default: {mb:g})")
    p.add_argument("--rss-mb", type=float, default=None,
                   help=f"the same in MB for the peak-RSS run (default: the same corpus); try {try_rss}")


def _add_prepare(sub: Any) -> None:
    pp = sub.add_parser("prepare", help="tokpack.prepare against raw tiktoken")
    _sizes(pp, 32.0, "corpus size in MB for the throughput runs", "1024")
    pp.add_argument("--workers", type=int, default=0, help="threads (default: 0, every core)")
    pp.add_argument("--repeat", type=int, default=3, help="interleaved rounds; medians count (default: 3)")
    pp.add_argument("--no-peers", action="store_true", help="skip the installed peers (default: run them)")
    pp.add_argument("--torchrun", type=int, nargs="*", default=[],
                    help="also time whole commands: one process, and torchrun with each of these process counts "
                         "(default: none)")
    pp.add_argument("--processes", type=int, nargs="*", default=[],
                    help="also time whole commands: one process, and prepare --processes N for each of these (default: "
                         "none)")
    pp.add_argument("--ray", action="store_true", help="with --processes, also run them on a Ray head started "
                                                        "here (tokpack[ray]; default: off)")
    pp.add_argument("--tokenizer", help="also prepare with this Hugging Face tokenizer.json, against its own "
                                        "encode_batch (default: none)")
    pp.add_argument("--encoding", default="gpt2", help="the tiktoken encoding (default: gpt2)")


def _add_loader(sub: Any) -> None:
    lp = sub.add_parser("loader", help="build_loader against nanoGPT's get_batch and the raw gather")
    lp.add_argument("--tokens", type=int, default=50_000_000, help="tokens in the memmap (default: 50000000)")
    lp.add_argument("--block-size", type=int, default=1024, help="T (default: 1024)")
    lp.add_argument("--batch-size", type=int, default=32, help="B (default: 32)")
    lp.add_argument("--batches", type=int, default=200, help="batches per throughput run (default: 200)")
    lp.add_argument("--memory-batches", type=int, default=10_000,
                    help="batches before worker memory is read (default: 10000)")
    lp.add_argument("--work", type=int, default=300, help="per-sample work rounds for the workers table (default: 300)")
    lp.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians count (default: 5)")
    lp.add_argument("--no-peers", action="store_true", help="skip litdata even if installed (default: run it)")
    lp.add_argument("--start-methods", nargs="+", default=["forkserver", "spawn", "fork"],
                    help="worker start methods whose start-up is timed (default: forkserver spawn fork)")


def _add_others(sub: Any) -> None:
    tp = sub.add_parser("train", help="the three loops on scripts/train_gpt.py's model")
    tp.add_argument("--folder", type=Path, default=Path("data/sample"), help="prepared folder (default: data/sample)")
    tp.add_argument("--config", type=Path, default=Path("configs/train_sample.toml"),
                    help="training config for the model's shape (default: configs/train_sample.toml)")
    tp.add_argument("--steps", type=int, default=10, help="steps per loop (default: 10)")
    tp.add_argument("--num-workers", type=int, default=0, help="loader workers (default: 0)")
    op = sub.add_parser("open", help="opening a split of N shards, and a loader state over it")
    op.add_argument("--shards", type=int, nargs="+", default=[200, 2000], help="shard counts (default: 200 2000)")
    op.add_argument("--shard-tokens", type=int, default=64, help="tokens per shard (default: 64)")
    op.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians count (default: 3)")
    kp = sub.add_parser("packing", help="PackedDocuments against nanochat's best-fit loop and plain windows")
    kp.add_argument("--tokens", type=int, default=2_000_000, help="tokens of synthetic documents (default: 2000000)")
    kp.add_argument("--mean-length", type=float, default=600.0, help="mean document length (default: 600)")
    kp.add_argument("--block-size", type=int, default=1024, help="T (default: 1024)")
    kp.add_argument("--batch-size", type=int, default=8, help="B (default: 8)")
    kp.add_argument("--batches", type=int, default=1000, help="batches per run (default: 1000)")
    kp.add_argument("--buffer-size", type=int, default=1000, help="best fit's documents (default: 1000, nanochat's)")
    kp.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians count (default: 5)")
    ev = sub.add_parser("evaluate", help="tokpack.evaluate against nanoGPT's estimate_loss on the same model")
    ev.add_argument("--folder", type=Path, default=Path("data/sample"), help="prepared folder (default: data/sample)")
    ev.add_argument("--block-size", type=int, default=128, help="T (default: 128)")
    ev.add_argument("--batch-size", type=int, default=8, help="B (default: 8)")
    ev.add_argument("--n-layer", type=int, default=2, help="the GPT's layers (default: 2)")
    ev.add_argument("--n-embd", type=int, default=128, help="the GPT's width (default: 128)")
    ev.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians count (default: 3)")
    ev.add_argument("--split", default="val", help="the split scored (default: val; train for a longer sweep)")
    bp = sub.add_parser("tokenizer", help="tokpack's tokenizer training against rustbpe fed directly")
    bp.add_argument("--mb", type=float, default=100.0, help="corpus size in MB (default: 100)")
    bp.add_argument("--vocab-size", type=int, default=32768, help="vocabulary, special token included (default: 32768)")
    bp.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians count (default: 3)")
    bp.add_argument("--compression-vocab", type=int, default=4096,
                    help="vocabulary trained on the Python docs for the compression table (default: 4096)")


def _add_corpus(sub: Any) -> None:
    mp = sub.add_parser("remote", help="prepare from moto's S3 server against the same files on disk")
    mp.add_argument("--mb", type=float, default=32.0, help="corpus size in MB (default: 32)")
    mp.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians count (default: 3)")
    cp = sub.add_parser("chat", help="prepare --chat nanochat and bestfit-pad rows against nanochat's own loops, "
                        "--chat template against transformers")
    _sizes(cp, 8.0, "conversations in MB of jsonl", "300")
    cp.add_argument("--block-size", type=int, default=2048, help="T (default: 2048, nanochat's)")
    cp.add_argument("--batch-size", type=int, default=8, help="B (default: 8)")
    cp.add_argument("--batches", type=int, default=200, help="batches per run (default: 200)")
    cp.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians count (default: 3)")
    cp.add_argument("--processes", type=int, default=0,
                    help="also time whole commands: one process, and prepare --processes N, against nanochat's "
                         "loop as a process (default: 0, none)")
    cp.add_argument("--processes-mb", type=float, help="conversations in MB for those (default: 64)")
    dp = sub.add_parser("dedup", help="the split guard's clusters against exact Jaccard, its signatures against "
                        "datasketch and datatrove, decontamination against a Python scan, its cost in a prepare")
    _sizes(dp, 16.0, "jsonl in MB for the speed runs", "300")
    dp.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians count (default: 3)")
    dp.add_argument("--duplicated", type=int, default=100_000,
                    help="one-line documents, each a near-copy of one of a tenth of them, whose guarded prepare's "
                         "peak RSS is read (default: 100000)")
    dp.add_argument("--tasks", type=int, nargs="+", default=[1, 4, 16],
                    help="task counts whose guard stage is run on one corpus, its match shared among them "
                         "(default: 1 4 16)")
    dp.add_argument("--real-docs", type=int, default=800,
                    help="installed packages' licences and descriptions compared pair by pair (default: 800)")
    rp = sub.add_parser("resume", help="a packed loader resumed at far batches, against packing up to them again")
    rp.add_argument("--at", type=int, nargs="+", default=[10**3, 10**5, 10**7],
                    help="batches to resume at (default: 1000 100000 10000000)")
    rp.add_argument("--block-size", type=int, default=1024, help="T (default: 1024)")
    rp.add_argument("--batch-size", type=int, default=8, help="B (default: 8)")
    rp.add_argument("--buffer-size", type=int, default=1000, help="best fit's documents (default: 1000)")
    rp.add_argument("--documents", type=int, default=5000, help="synthetic documents (default: 5000)")
    rp.add_argument("--replay-limit", type=float, default=60.0,
                    help="seconds a replay may take before it is extrapolated (default: 60)")


def main(argv: Sequence[str] | None = None) -> int:
    p = parser("bench", __doc__)
    sub = p.add_subparsers(dest="what", required=True)
    for add in (_add_prepare, _add_loader, _add_others, _add_corpus):
        add(sub)
    args = p.parse_args(argv)

    def body() -> int:
        seen = machine()
        print(f"{seen['cores']} cores, load average {' '.join(map(str, seen['load_average']))} (1, 5, 15 min)")
        with tempfile.TemporaryDirectory(prefix="tokpack-bench-") as tmp:
            figures = _bench(args, Path(tmp))
        print(json.dumps({**figures, "machine": {**seen, "load_average_after": machine()["load_average"]}}))
        return 0

    return run_cli(body)


def _bench(args: Any, tmp: Path) -> dict[str, Any]:
    """The figures of the bench ``args.what``, its files in ``tmp``. Each bench imports its own
    modules, so torch (two seconds of a start here) loads only for those that use it."""
    if args.what == "prepare":
        from ..prepare.config.launch import cores
        from .prepare import bench_prepare

        if args.ray and not args.processes:
            raise ValueError("--ray runs the --processes commands on Ray; pass --processes N with it")
        if any(count < 1 for count in args.processes):
            raise ValueError(f"--processes {' '.join(map(str, args.processes))}: each count must be at least 1")
        return bench_prepare(args.mb, args.rss_mb, args.workers or cores(), args.repeat,
                             not args.no_peers, args.torchrun, args.tokenizer, args.encoding, args.processes, args.ray)
    if args.what == "tokenizer":
        from .tokenizer import bench_tokenizer

        return bench_tokenizer(tmp, args.mb, args.vocab_size, args.rounds, args.compression_vocab)
    if args.what == "remote":
        from .remote import bench_remote

        return bench_remote(tmp, args.mb, args.rounds)
    if args.what == "chat":
        from .chat import bench_chat

        return bench_chat(tmp, args.mb, args.rss_mb, args.block_size, args.batch_size, args.batches, args.rounds,
                          args.processes, args.processes_mb)
    if args.what == "dedup":
        from .dedup import bench_dedup

        if args.duplicated < 10:  # a tenth of them are the texts the rest are near-copies of
            raise ValueError(f"--duplicated {args.duplicated} must be at least 10 documents; try 100000")
        if any(n < 1 for n in args.tasks):
            raise ValueError(f"--tasks {' '.join(map(str, args.tasks))}: each count must be at least 1")
        return bench_dedup(tmp, args.mb, args.rounds, args.rss_mb, args.real_docs, args.duplicated, tuple(args.tasks))
    if args.what in ("packing", "resume"):
        from .packing import bench_packing, bench_resume

        if args.what == "packing":
            return bench_packing(tmp, args.tokens, args.block_size, args.batch_size, args.batches, args.buffer_size,
                                 args.rounds, args.mean_length)
        return bench_resume(tmp, args.at, args.block_size, args.batch_size, args.buffer_size, args.documents,
                            args.replay_limit)
    from .loops import bench_evaluate, bench_loader, bench_open, bench_train

    if args.what == "loader":
        return bench_loader(tmp, args.tokens, args.block_size, args.batch_size, args.batches, args.memory_batches,
                            args.work, args.rounds, not args.no_peers, args.start_methods)
    if args.what == "evaluate":
        return bench_evaluate(args.folder, args.block_size, args.batch_size, args.n_layer, args.n_embd, args.rounds,
                              args.split)
    if args.what == "open":
        return bench_open(tmp, args.shards, args.shard_tokens, args.rounds)
    return bench_train(args.folder, args.config, args.steps, args.num_workers)


if __name__ == "__main__":
    raise SystemExit(main())
