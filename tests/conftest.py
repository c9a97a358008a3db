"""Fixtures: prepared folders made once per session and shared read-only, or fresh per test."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# The suite's two processes (pytest -n 2) share the two cores: one compute thread each for torch,
# and for the processes their tests start, where two each crowded the cores (a fifth of the run).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from helpers import make_docs, prepare_docs  # noqa: E402


@pytest.fixture(scope="session")
def shared_prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small prepared folder of 60 documents, made once; tests that only read it share it."""
    return prepare_docs(tmp_path_factory.mktemp("shared"), make_docs(60, words=200), val_fraction=0.3)


@pytest.fixture
def prepared(shared_prepared: Path, tmp_path: Path) -> Path:
    """A copy of the shared folder of this test's own, free to change."""
    return Path(shutil.copytree(shared_prepared, tmp_path / "prepared"))


def pytest_addoption(parser):
    parser.addoption("--differential-examples", type=int, default=300,
                     help="texts the accelerated backend is compared with tiktoken on (default: 300; try 20000)")


@pytest.fixture(autouse=True, scope="session")
def _keep_the_test_process_allocator():
    """The prepare command pins glibc's mmap threshold for its process; called in this process it
    would slow every later test's large allocations, so here it does nothing (the memory test runs
    the command in a fresh process, where it does)."""
    import tokpack.prepare.__main__ as command

    real, command.fix_mmap_threshold = command.fix_mmap_threshold, lambda: None
    yield
    command.fix_mmap_threshold = real


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on 127.0.0.1 (a free port), for the whole session, with the environment
    pointing boto at it (AWS_ENDPOINT_URL and test credentials); yields a boto3 client."""
    moto_server = pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    import logging

    from helpers import free_port

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        import boto3

        yield boto3.client("s3")
    server.stop()
