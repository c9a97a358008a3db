"""Publishing a prepared folder to moto's S3 server (``--out-dir s3://...``): the local run's
bytes, meta.json last, a run killed mid-upload rerun to the same bytes, the lock, and the folders
and destinations it refuses."""

from __future__ import annotations

import json

import pytest

from helpers import RangeServer, cli_run, kill, make_docs, paused_at, prepare_cmd, write_docs
from tokpack.prepare import units
from tokpack.prepare.__main__ import main
from tokpack.split import open_split

BUCKET = "published"
OPTIONS = ["--unit-mb", "0.01", "--quiet"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_docs(tmp_path_factory.mktemp("out") / "c", make_docs(120, words=150))


@pytest.fixture(scope="module")
def bucket(s3_server):
    s3_server.create_bucket(Bucket=BUCKET)
    return s3_server


def _objects(client, prefix: str) -> dict[str, bytes]:
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/").get("Contents", [])
    return {o["Key"][len(prefix) + 1:]: client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in listed}


def _run(capsys, *argv) -> tuple[int, str]:
    return cli_run(main, capsys, *argv)


def _local(corpus, folder):
    """The same run into a local folder: the units of one task of one."""
    assert main([str(corpus), "--out-dir", str(folder), *OPTIONS, "--tasks", "1", "--task", "0"]) == 0
    return {p.name: p.read_bytes() for p in folder.iterdir() if not p.name.startswith(".")}


def test_a_folder_published_to_s3_is_the_local_runs_bytes(bucket, corpus, tmp_path, monkeypatch, capsys):
    spool = tmp_path / "spool"
    spool.mkdir()
    assert _run(capsys, corpus, "--out-dir", f"s3://{BUCKET}/one", "--spool-dir", spool, *OPTIONS)[0] == 0
    assert _objects(bucket, "one") == _local(corpus, tmp_path / "local")
    assert not list(spool.iterdir())  # the spool went with the run
    monkeypatch.setenv("TOKPACK_CACHE_DIR", str(tmp_path / "cache"))
    assert open_split(f"s3://{BUCKET}/one", "train").lengths.sum() > 0
    code, err = _run(capsys, corpus, "--out-dir", f"s3://{BUCKET}/one", *OPTIONS)
    assert code == 2 and "already holds a prepared corpus; pass --force" in err and "\n" not in err, err
    assert _run(capsys, corpus, "--out-dir", f"s3://{BUCKET}/one", "--force", *OPTIONS)[0] == 0


def test_a_publish_killed_mid_upload_is_refused_by_readers_and_rerun_to_the_same_bytes(bucket, corpus, tmp_path,
                                                                                      monkeypatch):
    url = f"s3://{BUCKET}/killed"

    def uploaded() -> bool:  # a unit's record is up: its files are
        listed = bucket.list_objects_v2(Bucket=BUCKET, Prefix="killed/.tokpack-unit-").get("Contents", [])
        return bool(listed)

    kill(paused_at(prepare_cmd(corpus, url, *OPTIONS[:-1]), uploaded))
    partial = _objects(bucket, "killed")
    assert "meta.json" not in partial and any(k.endswith(".bin") for k in partial)
    with pytest.raises(ValueError, match="has no meta.json"):
        open_split(url, "train", cache_dir=tmp_path / "cache")
    recorded = len(bucket.list_objects_v2(Bucket=BUCKET, Prefix="killed/.tokpack-unit-")["Contents"])
    done = []
    real = units.run_unit
    monkeypatch.setattr(units, "run_unit", lambda plan, unit: done.append(unit) or real(plan, unit))
    assert main([str(corpus), "--out-dir", url, *OPTIONS]) == 0  # the killed run's lock: its pid is gone
    redone = len(done)
    published = _objects(bucket, "killed")
    assert recorded >= 1 and redone == len(json.loads(published["meta.json"])["inputs"]["units_sha256"]) - recorded
    assert published == _local(corpus, tmp_path / "local")  # the uploaded units kept, the bytes the same


def test_the_lock_and_foreign_files_refuse_a_publish_before_any_work(bucket, corpus, tmp_path, capsys):
    bucket.put_object(Bucket=BUCKET, Key="locked/.tokpack.lock", Body=b"4242@elsewhere run")
    code, err = _run(capsys, corpus, "--out-dir", f"s3://{BUCKET}/locked", *OPTIONS)
    assert code == 2 and "is being written by another tokpack.prepare (4242@elsewhere run)" in err, err
    assert set(_objects(bucket, "locked")) == {".tokpack.lock"}  # nothing written
    bucket.put_object(Bucket=BUCKET, Key="theirs/notes.csv", Body=b"a,b")
    code, err = _run(capsys, corpus, "--out-dir", f"s3://{BUCKET}/theirs", *OPTIONS)
    assert code == 2 and "holds files tokpack did not write (notes.csv)" in err and "\n" not in err, err
    assert set(_objects(bucket, "theirs")) == {"notes.csv"}
    assert _run(capsys, corpus, "--out-dir", f"s3://{BUCKET}/theirs", "--force", *OPTIONS)[0] == 0
    assert _objects(bucket, "theirs")["notes.csv"] == b"a,b"  # beside them, never over them


def test_destinations_that_cannot_be_written_are_one_line(bucket, corpus, tmp_path, capsys):
    with RangeServer({}) as server:  # a web server takes no uploads: credentials that can read, not write
        code, err = _run(capsys, corpus, "--out-dir", f"{server.url}/folder", "--spool-dir", tmp_path, *OPTIONS)
    assert code == 2 and "cannot be written" in err and "\n" not in err, err
    assert not list(tmp_path.iterdir())
    code, err = _run(capsys, corpus, "--out-dir", f"s3://{BUCKET}/t", "--tasks", "2", "--task", "0", *OPTIONS)
    assert code == 2 and "is written by one process" in err, err
    code, err = _run(capsys, corpus, "--out-dir", f"s3://{BUCKET}/m", "--format", "megatron", *OPTIONS)
    assert code == 2 and "--format megatron" in err, err
    for option, fragment in (("--spool-dir", "this run writes a local folder: drop --spool-dir"),
                             ("--storage-options", "no input or --out-dir is a URL: drop --storage-options")):
        value = str(tmp_path) if option == "--spool-dir" else '{"anon": true}'
        code, err = _run(capsys, corpus, "--out-dir", tmp_path / "local", option, value, *OPTIONS)
        assert code == 2 and fragment in err and "\n" not in err, err  # an option that would do nothing
    assert not (tmp_path / "local").exists()
