"""Prepare from an S3-compatible store against prepare from the same files on the local disk.

    pip install "tokpack[remote]" "moto[server]"
    python -m tokpack.bench remote [--mb 32] [--rounds 3]

moto's S3 server is started on 127.0.0.1 (its own thread, sharing this machine's cores), the
synthetic corpus uploaded, and the two prepares take turns; each runs in a fresh process, whose
peak RSS is read. The remote run reads every object once, in ranges: O(corpus) bytes over the
network, O(block) memory per open input, so its memory ceiling is the local one's.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..cli import table
from .prepare import synthetic_corpus
from .timing import interleaved, ratio, ratio_range

BUCKET = "tokpack-bench"


def _prepare(source: str, out: Path, env: dict[str, str]) -> dict[str, Any]:
    code = ("import json, sys; from tokpack.prepare import PrepareConfig, prepare; "
            "r = prepare(PrepareConfig(inputs=(sys.argv[1],), out_dir=sys.argv[2], quiet=True, force=True)); "
            "print(json.dumps(r['stats']))")
    done = subprocess.run([sys.executable, "-c", code, source, str(out)], check=True, capture_output=True, text=True,
                          env=env)
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

        runs = {"local": run("local", str(corpus)), "s3": run("s3", f"s3://{BUCKET}/corpus/")}
        times = interleaved(runs, rounds)
        same = all((tmp / "local" / n).read_bytes() == (tmp / "s3" / n).read_bytes()
                   for n in ("train.bin", "val.bin", "train.idx", "val.idx"))
    finally:
        server.stop()
    rows = [{"run": name, "seconds": min(times[name]), "MB/s": megabytes / min(times[name]),
             "peak RSS MB": stats[name]["peak_rss_mb"]} for name in runs]
    print(table(rows, ["run", "seconds", "MB/s", "peak RSS MB"]))
    speed = ratio(times, "s3", "local")
    print(f"prepare from moto's S3 server: {speed:.2f}x the local speed (rounds {ratio_range(times, 's3', 'local')}); "
          f"outputs byte-identical: {same}")
    return {"remote_vs_local": round(speed, 3), "rounds": ratio_range(times, "s3", "local"), "identical": same,
            "peak_rss_mb": {name: stats[name]["peak_rss_mb"] for name in runs}, "megabytes": megabytes}

