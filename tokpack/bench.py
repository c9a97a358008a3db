"""Speed and memory, as ratios against baselines run in the same process on the same data.

    python -m tokpack.bench prepare [--mb 32] [--rss-mb 1024]
    python -m tokpack.bench loader [--memory-batches 10000]
    python -m tokpack.bench train [--folder data/sample] [--config configs/train_sample.toml]

Each prints a table and, last, one JSON line with every figure. Absolute times are noise on a
shared machine; the ratios are the result: medians over rounds in which the runs take turns.
Installed peers run too (nanoGPT's openwebtext recipe on HF datasets, litdata); to install them
without replacing torch:

    pip install datasets
    pip install --no-deps litdata lightning-utilities && pip install boto3 tifffile obstore
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .config import parser, run_cli, table
from .preparation import PrepareConfig, default_workers, prepare
from .tokenizer import load_encoding


def timed(fn: Callable[[], Any], repeat: int = 1) -> tuple[Any, float]:
    """``fn``'s result and its best wall time over ``repeat`` runs (the least disturbed one)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return result, best


def synthetic_corpus(folder: Path, megabytes: float, shard_mb: float = 16) -> list[str]:
    """Documents of real English prose (the Python docs topics, copied until ``megabytes``),
    written as .jsonl shards of about ``shard_mb``, as large corpora usually come."""
    from pydoc_data.topics import topics

    folder.mkdir(parents=True, exist_ok=True)
    docs: list[str] = []
    size = shard_size = copy = shard = 0
    out = open(folder / "shard-00000.jsonl", "w", encoding="utf-8")
    while size < megabytes * 1e6:
        for name, text in sorted(topics.items()):
            doc = f"{text}\n(copy {copy} of {name})\n"
            line = json.dumps({"text": doc}) + "\n"
            if shard_size > shard_mb * 1e6:
                out.close()
                shard, shard_size = shard + 1, 0
                out = open(folder / f"shard-{shard:05d}.jsonl", "w", encoding="utf-8")
            out.write(line)
            docs.append(doc)
            size, shard_size = size + len(doc.encode()), shard_size + len(line)
        copy += 1
    out.close()
    return docs


def _prepare_in_fresh_process(corpus: Path, out: Path, workers: int) -> dict[str, Any]:
    code = ("import json, sys; from tokpack.preparation import PrepareConfig, prepare; "
            "r = prepare(PrepareConfig(inputs=(sys.argv[1],), out_dir=sys.argv[2], workers=int(sys.argv[3]), "
            "quiet=True)); print(json.dumps(r['stats']))")
    done = subprocess.run([sys.executable, "-c", code, str(corpus), str(out), str(workers)],
                          check=True, capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


def interleaved(runs: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """Each run's wall times over ``rounds`` rounds, the runs taking turns within a round, so that a
    noisy stretch of a shared machine falls on all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            times[name].append(timed(fn)[1])
    return times


def ratio(times: dict[str, list[float]], ours: str, other: str) -> float:
    """Median over rounds of other's time / ours: above 1, ours is faster."""
    return statistics.median(o / t for t, o in zip(times[ours], times[other]))


def bench_prepare(megabytes: float, rss_megabytes: float | None, workers: int, repeat: int,
                  peers: bool, torchrun: Sequence[int] = ()) -> dict[str, Any]:
    enc = load_encoding("gpt2")
    with tempfile.TemporaryDirectory(prefix="tokpack-bench-") as tmp:
        corpus = Path(tmp) / "corpus"
        docs = synthetic_corpus(corpus, megabytes)
        files = sorted(corpus.iterdir())
        config = PrepareConfig(inputs=(str(corpus),), out_dir=str(Path(tmp) / "out"), workers=workers, quiet=True,
                               force=True)
        counts: dict[str, int] = {}

        def count(name: str, fn: Callable[[], int]) -> Callable[[], None]:
            return lambda: counts.__setitem__(name, fn())

        runs = {
            "encode_ordinary, 1 thread": count("one", lambda: sum(len(enc.encode_ordinary(d)) for d in docs)),
            f"encode_ordinary_batch, {workers} threads":
                count("batch", lambda: sum(map(len, enc.encode_ordinary_batch(docs, num_threads=workers)))),
            f"tokpack.prepare, {workers} workers": count("tokpack", lambda: _prepared_tokens(prepare(config))),
        }
        for processes in torchrun:
            # Whole commands, start-up included: what a user of torchrun waits for.
            runs[f"python -m tokpack.prepare, 1 process x {workers} threads"] = _command(
                ["-m", "tokpack.prepare", str(corpus), "--out-dir", str(Path(tmp) / "cmd"), "--force", "--quiet"])
            threads = max(1, workers // processes)
            runs[f"torchrun, {processes} processes x {threads} threads"] = _command(
                ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}", "-m", "tokpack.prepare",
                 str(corpus), "--out-dir", str(Path(tmp) / f"torchrun{processes}"), "--force", "--quiet",
                 "--workers", str(threads)])
        if peers:
            from . import bench_peers

            for name, module, fn in (
                ("nanoGPT openwebtext recipe (HF datasets)", "datasets",
                 lambda: _quietly(bench_peers.nanogpt_openwebtext, files, _fresh(Path(tmp) / "hf"), workers)),
                ("litdata optimize (TokensLoader)", "litdata",
                 lambda: _quietly(bench_peers.litdata_optimize, files, _fresh(Path(tmp) / "lit"), workers)),
            ):
                skip = bench_peers.missing(module)
                if skip:
                    print(f"{name}: {skip}")
                else:
                    runs[f"{name}, {workers} workers"] = fn
        times = interleaved(runs, repeat)
        assert counts["one"] == counts["batch"] == counts["tokpack"], counts
        rss_corpus = corpus
        if rss_megabytes:
            rss_corpus = Path(tmp) / "rss-corpus"
            synthetic_corpus(rss_corpus, rss_megabytes)
        rss = _prepare_in_fresh_process(rss_corpus, Path(tmp) / "rss-out", workers)["peak_rss_mb"]
    tokens = counts["one"]
    ours = f"tokpack.prepare, {workers} workers"
    rows = [{"run": name, "seconds": statistics.median(t), "tokens/s": tokens / statistics.median(t),
             "tokpack time / this": 1 / ratio(times, ours, name)} for name, t in times.items()]
    corpus_mb = sum(len(d.encode()) for d in docs) / 1e6
    print(f"corpus: {corpus_mb:.1f} MB, {len(docs):,} documents, {tokens:,} tokens; "
          f"medians of {repeat} interleaved rounds")
    print(table(rows, ["run", "seconds", "tokens/s", "tokpack time / this"]))
    print(f"tokpack.prepare peak RSS on a {rss_megabytes or corpus_mb:.0f} MB corpus (own process): {rss:.0f} MB")
    names = list(times)
    return {
        "bench": "prepare", "corpus_mb": corpus_mb, "documents": len(docs), "tokens": tokens, "workers": workers,
        "rounds": repeat, "prepare_tok_s": tokens / statistics.median(times[ours]),
        "prepare_vs_1thread": ratio(times, ours, names[0]), "prepare_vs_allcore": ratio(times, ours, names[1]),
        **{f"prepare_time_over_{_key(n)}": 1 / ratio(times, ours, n) for n in names[3:]},
        "rss_corpus_mb": rss_megabytes or corpus_mb, "prepare_peak_rss_mb": rss,
    }


def _command(args: list[str]) -> Callable[[], None]:
    return lambda: subprocess.run([sys.executable, *args], check=True, capture_output=True)


def _prepared_tokens(result: dict[str, Any]) -> int:
    return sum(s["tokens"] - s["documents"] for s in result["splits"].values())  # less one eot a document


def _quietly(fn: Callable[..., Any], *args: Any) -> Any:
    from .bench_peers import quiet

    with quiet():
        return fn(*args)


def _fresh(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def _key(name: str) -> str:
    return "_".join(re.findall(r"[a-z0-9]+", name.split("(")[0].lower()))


def main(argv: Sequence[str] | None = None) -> int:
    p = parser("bench", __doc__)
    sub = p.add_subparsers(dest="what", required=True)
    pp = sub.add_parser("prepare", help="tokpack.prepare against raw tiktoken")
    pp.add_argument("--mb", type=float, default=32.0, help="corpus size in MB for the throughput runs (default: 32)")
    pp.add_argument("--rss-mb", type=float, default=None,
                    help="corpus size in MB for the peak-RSS run (default: the same corpus); try 1024")
    pp.add_argument("--workers", type=int, default=0, help="threads (default: 0, every core)")
    pp.add_argument("--repeat", type=int, default=3, help="interleaved rounds; medians count (default: 3)")
    pp.add_argument("--no-peers", action="store_true", help="skip the installed peers (default: run them)")
    pp.add_argument("--torchrun", type=int, nargs="*", default=[],
                    help="also time whole commands: one process, and torchrun with each of these process counts "
                         "(default: none)")
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
    tp = sub.add_parser("train", help="the three loops on scripts/train_gpt.py's model")
    tp.add_argument("--folder", type=Path, default=Path("data/sample"), help="prepared folder (default: data/sample)")
    tp.add_argument("--config", type=Path, default=Path("configs/train_sample.toml"),
                    help="training config for the model's shape (default: configs/train_sample.toml)")
    tp.add_argument("--steps", type=int, default=10, help="steps per loop (default: 10)")
    tp.add_argument("--num-workers", type=int, default=0, help="loader workers (default: 0)")
    args = p.parse_args(argv)

    def body() -> int:
        if args.what == "prepare":
            figures = bench_prepare(args.mb, args.rss_mb, args.workers or default_workers(), args.repeat,
                                    not args.no_peers, args.torchrun)
        elif args.what == "loader":
            from .bench_loops import bench_loader

            with tempfile.TemporaryDirectory(prefix="tokpack-bench-") as tmp:
                figures = bench_loader(Path(tmp), args.tokens, args.block_size, args.batch_size, args.batches,
                                       args.memory_batches, args.work, args.rounds, not args.no_peers,
                                       args.start_methods)
        else:
            from .bench_loops import bench_train

            figures = bench_train(args.folder, args.config, args.steps, args.num_workers)
        print(json.dumps(figures))
        return 0

    return run_cli(body)


if __name__ == "__main__":
    raise SystemExit(main())
