"""Prepare from an S3-compatible store against prepare from the same files on the local disk,
and training batches from a prepared folder in the store against the same folder on disk.

    pip install "tokpack[remote]" "moto[server]"
    python -m tokpack.bench remote [--mb 32] [--rounds 3]

moto's S3 server is started on 127.0.0.1 (its own thread, sharing this machine's cores), the
synthetic corpus uploaded, and the two prepares take turns with the same two on a corpus of 20
documents (the fixed cost of a run); each runs in a fresh process, whose peak RSS is read. The
remote run reads every object once, in ranges: O(corpus) bytes over the network, two ranges of
memory per open input. Then the prepared folder is published to the store
and read back through the cache (``tokpack.storage.cache``): the split's fetch (its time, rate and
disk use), and a loader's batches/s from a cold cache, a warm one, and in order through a cache
limited to half the split (its peak disk use), against the local folder's, 0 and 2 workers.

See docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..cli import table
from .prepare import synthetic_corpus
from .timing import interleaved, ratio, ratio_range

BUCKET = "tokpack-bench"
UNIT_MB = 8.0  # units of a sharded run: a remote publish spools one at a time
SHARD_TOKENS = 1 << 18  # the published folder's shards (512 KB): half the split holds one a worker and more


def _prepare(source: str, out: Path | str, env: dict[str, str], spool: Path | None = None,
             shard_tokens: int = 0) -> dict[str, Any]:
    # Run as the command runs it: fix_mmap_threshold, as python -m tokpack.prepare calls it.
    code = ("import json, sys; from tokpack.prepare import PrepareConfig, prepare; "
            "from tokpack.prepare.memory import fix_mmap_threshold; fix_mmap_threshold(); "
            "r = prepare(PrepareConfig(inputs=(sys.argv[1],), out_dir=sys.argv[2], quiet=True, force=True, "
            "unit_mb=float(sys.argv[3]), spool_dir=sys.argv[4] or None, shard_tokens=int(sys.argv[5]))); "
            "print(json.dumps(r['stats']))")
    done = subprocess.run([sys.executable, "-c", code, source, str(out), str(UNIT_MB), str(spool or ""),
                           str(shard_tokens)], check=True, capture_output=True, text=True, env=env)
    return json.loads(done.stdout.splitlines()[-1])


def bench_remote(tmp: Path, megabytes: float, rounds: int) -> dict[str, Any]:
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError:
        raise ValueError('bench remote needs moto\'s server and boto3: pip install "tokpack[remote]" "moto[server]"') \
            from None
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
        corpus = tmp / "corpus"
        synthetic_corpus(corpus, megabytes)
        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id="bench",
                              aws_secret_access_key="bench", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        for f in sorted(corpus.iterdir()):
            client.upload_file(str(f), BUCKET, f"corpus/{f.name}")
        stats: dict[str, dict[str, Any]] = {}

        def run(name: str, source: str) -> Any:
            return lambda: stats.__setitem__(name, _prepare(source, tmp / name, env))

        # A corpus of a few documents: what a run costs before its first byte, where the two differ.
        tiny = tmp / "tiny" / "tiny.jsonl"
        tiny.parent.mkdir()
        with open(sorted(corpus.iterdir())[0], "rb") as f:
            tiny.write_bytes(b"".join(itertools.islice(f, 20)))
        client.upload_file(str(tiny), BUCKET, "tiny/tiny.jsonl")
        runs = {"local": run("local", str(corpus)), "s3": run("s3", f"s3://{BUCKET}/corpus/"),
                "local, 20 documents": run("tiny-local", str(tiny)),
                "s3, 20 documents": run("tiny-s3", f"s3://{BUCKET}/tiny/tiny.jsonl")}
        times = interleaved(runs, rounds)
        same = all((tmp / "local" / n).read_bytes() == (tmp / "s3" / n).read_bytes()
                   for n in ("train.bin", "val.bin", "train.idx", "val.idx"))
        training = _training(client, corpus, tmp, env, rounds)
        publishing = _publishing(corpus, tmp, env, rounds)
    finally:
        server.stop()
    rows = [{"run": name, "seconds": statistics.median(times[name]), "peak RSS MB": stats[key]["peak_rss_mb"]}
            for name, key in zip(runs, ("local", "s3", "tiny-local", "tiny-s3"))]
    print(table(rows, ["run", "seconds", "peak RSS MB"]))
    speed = ratio(times, "s3", "local")
    print(f"prepare from moto's S3 server: {speed:.2f}x the local speed (rounds {ratio_range(times, 's3', 'local')}); "
          f"outputs byte-identical: {same}")
    return {"remote_vs_local": round(speed, 3), "rounds": ratio_range(times, "s3", "local"), "identical": same,
            "peak_rss_mb": {name: stats[name]["peak_rss_mb"] for name in ("local", "s3")}, "megabytes": megabytes,
            "fixed_start_s": {name: round(statistics.median(times[f"{name}, 20 documents"]), 3)
                              for name in ("local", "s3")}, **training,
            **publishing}


def _range_reads(folder: Path, split: Any, windows: int = 200) -> float:
    """Windows of T + 1 = 1025 tokens read as one range request each from the store, the way a
    loader without a cache would: windows a second."""
    import numpy as np
    from ..storage.folder import as_folder

    folder = as_folder(f"s3://{BUCKET}/published")
    name, tokens = split.files[0].path.name, split.files[0].tokens
    starts = np.random.default_rng(0).integers(0, tokens - 1025, windows) * split.dtype.itemsize
    started = time.perf_counter()
    for start in starts.tolist():
        folder.read(name, start, start + 1025 * split.dtype.itemsize)
    return windows / (time.perf_counter() - started)


def _publishing(corpus: Path, tmp: Path, env: dict[str, str], rounds: int) -> dict[str, Any]:
    """Prepare into the store against the same command into a local folder: flat (the whole token
    files made in the spool, then uploaded) and sharded (units of ``UNIT_MB`` uploaded as they
    finish), each with its peak RSS and the spool's peak disk use, sampled while it runs."""
    spool = tmp / "spool"
    spool.mkdir()
    peaks: dict[str, list[float]] = {"flat": [0, 0], "sharded": [0, 0]}  # spool bytes, peak RSS MB

    def publish(kind: str) -> Any:
        def go() -> None:
            done = threading.Event()

            def watch() -> None:
                while not done.wait(0.005):
                    peaks[kind][0] = max(peaks[kind][0], _disk(spool))

            watcher = threading.Thread(target=watch)
            watcher.start()
            try:
                stats = _prepare(str(corpus), f"s3://{BUCKET}/{kind}", env, spool, SHARD_TOKENS * (kind == "sharded"))
                peaks[kind][1] = max(peaks[kind][1], stats["peak_rss_mb"])
            finally:
                done.set()
                watcher.join()
        return go

    times = interleaved({"local flat": lambda: _prepare(str(corpus), tmp / "flat", env),
                         "local sharded": lambda: _prepare(str(corpus), tmp / "sharded", env, None, SHARD_TOKENS),
                         "s3 flat": publish("flat"), "s3 sharded": publish("sharded")}, rounds)
    out: dict[str, Any] = {}
    for kind in ("flat", "sharded"):
        speed = ratio(times, f"s3 {kind}", f"local {kind}")
        units = f" (units of {UNIT_MB:g} MB of text)" if kind == "sharded" else ""
        print(f"prepare into s3:// ({kind}) against into a local folder: {speed:.2f}x the speed (rounds "
              f"{ratio_range(times, f's3 {kind}', f'local {kind}')}); peak RSS {peaks[kind][1]:.0f} MB; the spool's "
              f"peak {peaks[kind][0] / 1e6:.1f} MB on disk{units}")
        out[f"publish_{kind}"] = {"vs_local": round(speed, 3), "peak_rss_mb": round(peaks[kind][1], 1),
                                  "spool_peak_mb": round(peaks[kind][0] / 1e6, 1)}
    return out


def _disk(folder: Path) -> int:
    """Bytes in the files under ``folder`` now (one that goes while it is summed counts nothing)."""
    total = 0
    for f in folder.rglob("*"):
        with contextlib.suppress(FileNotFoundError):
            total += f.stat().st_size if f.is_file() else 0
    return total


def _published(client: Any, corpus: Path, folder: Path, env: dict[str, str]) -> str:
    """``corpus`` prepared into ``folder`` in shards and uploaded as a publish does, meta.json last."""
    _prepare(str(corpus), folder, env, shard_tokens=SHARD_TOKENS)
    for f in sorted(folder.iterdir()):
        if f.name != "meta.json" and not f.name.startswith("."):
            client.upload_file(str(f), BUCKET, f"published/{f.name}")
    client.upload_file(str(folder / "meta.json"), BUCKET, "published/meta.json")  # the commit, last
    os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
    return f"s3://{BUCKET}/published"


def _training(client: Any, corpus: Path, tmp: Path, env: dict[str, str], rounds: int) -> dict[str, Any]:
    """The prepared folder published to the store, read back through the cache: a loader's
    batches/s from a cold cache (a fresh folder each round: the fetch included), a warm one, and
    in order through a cache limited to half the split, each against the local folder's."""
    from ..data.loader import build_loader
    from ..data.windows import TokenWindows
    from ..split import open_split

    folder = tmp / "sharded"
    url, caches = _published(client, corpus, folder, env), itertools.count()
    started = time.perf_counter()
    warm = open_split(url, "train", cache_dir=tmp / "cache")
    warm.open()[0]
    warm.cache.wait()  # the first file read, the rest fetched behind it
    cold = time.perf_counter() - started
    disk = _disk(tmp / "cache")
    local = open_split(folder, "train")
    half = disk // 2
    figures = {"cold_fetch_s": round(cold, 3), "cold_mb_per_s": round(disk / 1e6 / cold, 1),
               "cache_disk_mb": round(disk / 1e6, 1)}
    rows, peak = [], [0]

    def batches(split: Any, workers: int, stride: int | None = None, n: int = 200) -> Any:
        return lambda: list(itertools.islice(build_loader(TokenWindows(split, 1024, stride=stride), 8, seed=0,
                                                          num_workers=workers), n))

    def fresh(workers: int) -> Any:
        return lambda: batches(open_split(url, "train", cache_dir=tmp / f"cold-{next(caches)}"), workers)()

    def limited(workers: int) -> Any:
        def walk() -> None:
            cache = tmp / f"limited-{next(caches)}"
            split = open_split(url, "train", cache_dir=cache, cache_limit=half)
            for _ in build_loader(TokenWindows(split, 1024, stride=1024), 8, num_workers=workers):
                peak[0] = max(peak[0], _disk(cache))
        return walk

    for workers in (0, 2):
        times = interleaved({"local": batches(local, workers), "warm": batches(warm, workers),
                             "cold": fresh(workers)}, rounds)
        walks = interleaved({"local": lambda: list(build_loader(TokenWindows(local, 1024, stride=1024), 8,
                                                                num_workers=workers)),
                             "limited": limited(workers)}, rounds)
        for name, runs in (("warm", times), ("cold", times), ("limited", walks)):
            figures[f"{name}_vs_local_{workers}_workers"] = round(ratio(runs, name, "local"), 3)
        rows.append({"workers": workers, "local batches/s": 200 / statistics.median(times["local"]),
                     **{column: f"{ratio(runs, name, 'local'):.3g} ({ratio_range(runs, name, 'local')})"
                        for column, name, runs in (("warm", "warm", times), ("cold", "cold", times),
                                                   ("in order, half the split", "limited", walks))}})
    figures["limited_peak_disk_mb"] = round(peak[0] / 1e6, 1)
    figures["range_read_windows_per_s"] = round(_range_reads(folder, local), 1)
    print(f"a folder in the store: its train split fetched cold in {cold:.2f} s ({disk / 1e6 / cold:.0f} MB/s, "
          f"{disk / 1e6:.1f} MB in the cache); through a limit of half of it, the cache peaked at "
          f"{peak[0] / 1e6:.1f} MB; the alternative, a range read a window: "
          f"{figures['range_read_windows_per_s']:,.0f} windows/s")
    print(table(rows, ["workers", "local batches/s", "warm", "cold", "in order, half the split"]))
    return figures
