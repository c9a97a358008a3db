"""--ray ADDRESS: the tasks of --processes N on a real Ray cluster (``ray start --head`` on the
loopback address, started here): one process's folder byte for byte, a task whose worker is killed
mid-run retried by Ray, and an address where no cluster answers one line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from helpers import cli_run, make_chats, make_docs, prepare_cmd, write_jsonl, write_nanochat_spec
from tokpack.format import UNIT_RECORD_GLOB
from tokpack.prepare.__main__ import main

ray = pytest.importorskip("ray")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, s3_server):
    """A head node of two CPUs on 127.0.0.1, its address; stopped at the end. Its workers see the
    S3 server as this process does (its endpoint and credentials in their environment)."""
    ray_cli = shutil.which("ray", path=os.path.dirname(sys.executable))
    port = _free_port()
    # A cluster of the test's own, on the loopback address: no token to hand around.
    saved = {key: os.environ.get(key) for key in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED")}
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    env = dict(os.environ)
    temp = tmp_path_factory.mktemp("ray")
    subprocess.run([ray_cli, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
                    "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"],
                   check=True, capture_output=True, env=env, timeout=180)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([ray_cli, "stop", "--force"], capture_output=True, env=env, timeout=120)
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.update({key: value})


def _files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if not p.name.startswith(".")}


@pytest.mark.e2e
def test_a_ray_run_is_one_processs_folder_even_with_a_worker_killed(cluster, tmp_path):
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in make_docs(600, seed=6, words=150)])
    options = ("--unit-mb", "0.02")
    one, out = tmp_path / "one", tmp_path / "out"
    assert main([str(source), "--out-dir", str(one), "--quiet", *options]) == 0
    # A worker killed while its task runs: Ray runs the task again, and it keeps its finished units.
    _killing_a_worker(prepare_cmd(source, out, *options, "--processes", "2", "--ray", cluster),
                      lambda: out.is_dir() and any(out.glob(UNIT_RECORD_GLOB)))
    assert _files(out) == _files(one)


def _killing_a_worker(cmd, unit_done):
    """``cmd`` run to its end, a Ray worker running a task killed once ``unit_done()``."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = None
    while proc.poll() is None and killed is None:
        if unit_done():
            killed = next(iter(_running_tasks()), None)
            if killed is not None:
                os.kill(killed, signal.SIGKILL)
        time.sleep(0.01)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert killed is not None, "the run ended before a worker could be killed"


@pytest.mark.e2e
def test_conversations_on_ray_are_one_processs_folder(cluster, tmp_path, capsys):
    spec = write_nanochat_spec(tmp_path / "tok")
    source = write_jsonl(tmp_path / "chats.jsonl", make_chats(120, seed=3))
    chat = ("--chat", "nanochat", "--encoding", str(spec), "--quiet")
    assert main([str(source), "--out-dir", str(tmp_path / "one"), *chat]) == 0
    code, err = cli_run(main, capsys, source, "--out-dir", tmp_path / "ray", *chat, "--processes", "2", "--ray",
                        cluster)
    assert code == 0, err
    assert _files(tmp_path / "ray") == _files(tmp_path / "one")


@pytest.mark.e2e
def test_a_guarded_run_on_ray_is_one_processs_folder(cluster, tmp_path, capsys):
    docs = make_docs(300, seed=8, words=150)
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in docs + docs[:40]])
    guarded = ("--near-split", "--dedup", "near", "--unit-mb", "0.02", "--quiet")
    assert main([str(source), "--out-dir", str(tmp_path / "one"), *guarded]) == 0
    code, err = cli_run(main, capsys, source, "--out-dir", tmp_path / "ray", *guarded, "--processes", "2", "--ray",
                        cluster)
    assert code == 0, err
    assert _files(tmp_path / "ray") == _files(tmp_path / "one") and "train.guard.jsonl" in _files(tmp_path / "one")


@pytest.mark.e2e
def test_a_ray_run_publishes_to_object_storage_what_one_process_writes(cluster, s3_server, tmp_path):
    # Workers that share no disk with the run: each task uploads its units from its own spool,
    # and the run merges their indexes and writes meta.json.
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in make_docs(400, seed=9, words=120)])
    options = ("--format", "llmc", "--shard-tokens", "20000", "--unit-mb", "0.02", "--quiet")
    assert main([str(source), "--out-dir", str(tmp_path / "one" / "data"), *options]) == 0
    s3_server.create_bucket(Bucket="rayout")
    # A worker killed once a unit is uploaded: Ray runs its task again, which keeps what it uploaded.
    def uploaded():
        listed = s3_server.list_objects_v2(Bucket="rayout", Prefix="data/").get("Contents", [])
        return any(o["Key"].startswith("data/.tokpack-unit-") for o in listed)

    _killing_a_worker(prepare_cmd(source, "s3://rayout/data", *options, "--processes", "2", "--ray", cluster),
                      uploaded)
    listed = s3_server.list_objects_v2(Bucket="rayout", Prefix="data/").get("Contents", [])
    published = {o["Key"].removeprefix("data/"): s3_server.get_object(Bucket="rayout", Key=o["Key"])["Body"].read()
                 for o in listed}
    assert published == _files(tmp_path / "one" / "data")  # no unit record, index part or lock left either
    assert len([name for name in published if name.endswith(".bin")]) > 4


@pytest.mark.e2e
def test_a_guarded_ray_run_publishes_to_object_storage_what_one_process_writes(cluster, s3_server, tmp_path, capsys):
    # Workers that share no disk: the run's own process decides the guard's verdicts and shares
    # them through the folder; each task reads them, uploads its units, and nothing of the guard's
    # stays in the published folder.
    docs = make_docs(300, seed=8, words=150)
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in docs + docs[:40]])
    options = ("--format", "llmc", "--shard-tokens", "20000", "--unit-mb", "0.02", "--near-split", "--dedup", "near",
               "--quiet")
    assert main([str(source), "--out-dir", str(tmp_path / "one" / "data"), *options]) == 0
    s3_server.create_bucket(Bucket="guarded")
    code, err = cli_run(main, capsys, source, "--out-dir", "s3://guarded/data", *options, "--processes", "2", "--ray",
                        cluster)
    assert code == 0, err
    listed = s3_server.list_objects_v2(Bucket="guarded", Prefix="data/").get("Contents", [])
    published = {o["Key"].removeprefix("data/"): s3_server.get_object(Bucket="guarded", Key=o["Key"])["Body"].read()
                 for o in listed}
    assert published == _files(tmp_path / "one" / "data") and "train.guard.jsonl" in published
    assert json.loads(published["meta.json"])["guard"]["dedup"]["removed"] != [0]


def _running_tasks():
    """The pids of Ray workers running a prepare task now (Ray names them after the function)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if f.read().startswith(b"ray::run_task"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def test_an_address_where_no_cluster_answers_is_one_line(tmp_path, capsys):
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in make_docs(20)])
    port = _free_port()  # closed again: nothing listens there
    for address, reason in ((f"127.0.0.1:{port}", f"no Ray cluster answers at --ray 127.0.0.1:{port}"),
                            ("nowhere", "is not HOST:PORT")):
        started = time.monotonic()
        code, err = cli_run(main, capsys, source, "--out-dir", tmp_path / "out", "--processes", "2", "--ray", address)
        assert code == 2 and reason in err and "\n" not in err, err
        assert time.monotonic() - started < 60  # refused, not retried for minutes
    assert not (tmp_path / "out" / "meta.json").exists()
