"""Publishing a prepared folder to moto's S3 server (``--out-dir s3://...``): the same command's
local folder, files, names, bytes and batches (flat, one unit and many; llm.c shards), meta.json
last, a sharded run killed mid-upload rerun to the same bytes, the lock, the spool, and the
folders and destinations it refuses."""

from __future__ import annotations

import json

import pytest

import numpy as np

from helpers import RangeServer, cli_run, kill, make_docs, paused_at, prepare_cmd, write_docs
from tokpack import TokenWindows, build_loader
from tokpack.prepare import tokenize
from tokpack.prepare.__main__ import main
from tokpack.format import SPOOL_MARK, SPOOL_PREFIX
from tokpack.split import open_split

BUCKET = "published"
OPTIONS = ["--unit-mb", "0.01", "--quiet"]
SHARDED = [*OPTIONS, "--shard-tokens", "3000"]


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


def _local(corpus, folder, *options):
    """The same command into a local folder."""
    assert main([str(corpus), "--out-dir", str(folder), *options]) == 0
    return {p.name: p.read_bytes() for p in folder.iterdir() if not p.name.startswith(".")}


def _batches(folder, stride=None) -> list[np.ndarray]:
    windows = TokenWindows(folder, 64, split="train", stride=stride)
    return [x.numpy() for x, _ in build_loader(windows, 4, seed=5, num_samples=40 if stride is None else None)]


@pytest.mark.parametrize("options", [["--quiet"], OPTIONS, ["--format", "llmc", *OPTIONS]],
                         ids=["flat-default", "flat-many-units", "llmc"])
def test_a_folder_published_to_s3_is_the_same_commands_local_folder(bucket, corpus, tmp_path, monkeypatch, capsys,
                                                                    options):
    name = f"same-{len(options)}"
    spool = tmp_path / "spool"
    spool.mkdir()
    assert _run(capsys, corpus, "--out-dir", f"s3://{BUCKET}/{name}", "--spool-dir", spool, *options)[0] == 0
    local = _local(corpus, tmp_path / name, *options)  # a folder of the URL's last name: llm.c names its shards so
    assert _objects(bucket, name) == local  # the same files, names and bytes
    assert not list(spool.iterdir())  # the spool went with the run
    monkeypatch.setenv("TOKPACK_CACHE_DIR", str(tmp_path / "cache"))
    url = f"s3://{BUCKET}/{name}"
    for stride in (None, 64):  # random windows and stride windows: batch for batch
        assert all(np.array_equal(a, b) for a, b in zip(_batches(url, stride), _batches(tmp_path / name, stride),
                                                         strict=True))


@pytest.mark.parametrize("options", [["--quiet"], ["--format", "llmc", *OPTIONS]], ids=["flat", "llmc"])
def test_processes_publish_the_same_commands_local_folder(bucket, corpus, tmp_path, capsys, options):
    name = f"processes-{len(options)}"
    code, err = _run(capsys, corpus, "--out-dir", f"s3://{BUCKET}/{name}", "--processes", "2", *options)
    assert code == 0, err
    assert _objects(bucket, name) == _local(corpus, tmp_path / name, *options)


def test_a_publish_that_exists_needs_force(bucket, corpus, tmp_path, capsys):
    assert _run(capsys, corpus, "--out-dir", f"s3://{BUCKET}/one", *OPTIONS)[0] == 0
    code, err = _run(capsys, corpus, "--out-dir", f"s3://{BUCKET}/one", *OPTIONS)
    assert code == 2 and "already holds a prepared corpus; pass --force" in err and "\n" not in err, err
    assert _run(capsys, corpus, "--out-dir", f"s3://{BUCKET}/one", "--force", *OPTIONS)[0] == 0


def test_a_publish_killed_mid_upload_is_refused_by_readers_and_rerun_to_the_same_bytes(bucket, corpus, tmp_path,
                                                                                      monkeypatch):
    url = f"s3://{BUCKET}/killed"

    def uploaded() -> bool:  # a unit's record is up: its files are
        listed = bucket.list_objects_v2(Bucket=BUCKET, Prefix="killed/.tokpack-unit-").get("Contents", [])
        return bool(listed)

    kill(paused_at(prepare_cmd(corpus, url, *SHARDED[:2], *SHARDED[3:]), uploaded))
    partial = _objects(bucket, "killed")
    assert "meta.json" not in partial and any(k.endswith(".bin") for k in partial)
    with pytest.raises(ValueError, match="meta.json is missing"):
        open_split(url, "train", cache_dir=tmp_path / "cache")
    recorded = len(bucket.list_objects_v2(Bucket=BUCKET, Prefix="killed/.tokpack-unit-")["Contents"])
    done = []
    real = tokenize.run_unit
    monkeypatch.setattr(tokenize, "run_unit", lambda plan, unit, verdicts: done.append(unit) or real(plan, unit, verdicts))
    assert main([str(corpus), "--out-dir", url, *SHARDED]) == 0  # the killed run's lock: its pid is gone
    redone = len(done)
    published = _objects(bucket, "killed")
    assert recorded >= 1 and redone == len(json.loads(published["meta.json"])["inputs"]["units_sha256"]) - recorded
    assert published == _local(corpus, tmp_path / "killed", *SHARDED)  # the uploaded units kept, the bytes the same


def test_the_lock_and_foreign_files_refuse_a_publish_before_any_work(bucket, corpus, tmp_path, capsys):
    bucket.put_object(Bucket=BUCKET, Key="locked/.tokpack.lock", Body=b"4242@elsewhere " + b"ab" * 16)
    code, err = _run(capsys, corpus, "--out-dir", f"s3://{BUCKET}/locked", *OPTIONS)
    assert code == 2 and "is being written by another tokpack.prepare (pid 4242 on elsewhere)" in err, err
    assert set(_objects(bucket, "locked")) == {".tokpack.lock"}  # nothing written
    planted = b"\x1b]0;owned\x07\x1b[2J\nrm -rf ~"  # a terminal's escape sequences: never echoed
    bucket.put_object(Bucket=BUCKET, Key="planted/.tokpack.lock", Body=planted)
    code, err = _run(capsys, corpus, "--out-dir", f"s3://{BUCKET}/planted", *OPTIONS)
    assert code == 2 and "a .tokpack.lock that tokpack did not write (23 bytes)" in err, err
    assert "\x1b" not in err and "rm -rf" not in err and "\n" not in err
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


def test_a_killed_runs_spool_is_removed_by_the_next_run_and_no_other_folder_is(bucket, corpus, tmp_path, capsys):
    spool = tmp_path / "spool"
    dead = spool / f"{SPOOL_PREFIX}dead1234"  # what a SIGKILLed run leaves: its marker, held by no one
    (dead / "run").mkdir(parents=True)
    (dead / SPOOL_MARK).touch()
    (dead / "run" / "train.bin").write_bytes(b"x" * 100)
    theirs = spool / f"{SPOOL_PREFIX}nomarker"  # no marker: nothing shows tokpack made it
    theirs.mkdir()
    (spool / f"{SPOOL_PREFIX}link").symlink_to(theirs)
    assert _run(capsys, corpus, "--out-dir", f"s3://{BUCKET}/swept", "--spool-dir", spool, *OPTIONS)[0] == 0
    assert sorted(p.name for p in spool.iterdir()) == [f"{SPOOL_PREFIX}link", f"{SPOOL_PREFIX}nomarker"]


def test_a_full_spool_disk_names_the_spool(bucket, corpus, tmp_path, capsys, monkeypatch):
    import errno
    import os

    def full(fd):  # the disk as it fills: the kernel's answer to a write-back
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fdatasync", full)
    monkeypatch.setattr(os, "fsync", full)
    code, err = _run(capsys, corpus, "--out-dir", f"s3://{BUCKET}/full", "--spool-dir", tmp_path, *OPTIONS)
    assert code == 2 and f"the spool folder {tmp_path} is full" in err and "give --spool-dir" in err, err
    assert "--out-dir" not in err and not list(tmp_path.iterdir())
    assert not _objects(bucket, "full").get("meta.json")


@pytest.mark.parametrize("options", [["--quiet"], SHARDED], ids=["flat", "sharded"])
def test_a_guarded_run_reads_its_evaluation_set_and_publishes_as_a_local_one(bucket, tmp_path, capsys, options):
    docs = make_docs(150, words=150)
    docs += docs[:20]  # copies, to be written once
    source = write_docs(tmp_path / "c", docs)
    questions = "".join(" ".join(doc.split()[:20]) + "\n" for doc in docs[:10] if len(doc.split()) > 20)
    bucket.put_object(Bucket=BUCKET, Key="eval/set.txt", Body=questions.encode())
    guard = ["--near-split", "--dedup", "near", "--decontaminate", f"s3://{BUCKET}/eval/set.txt"]
    name = f"guarded-{len(options)}"
    code, err = _run(capsys, source, "--out-dir", f"s3://{BUCKET}/{name}", *guard, *options)
    assert code == 0, err
    local = _local(source, tmp_path / name, *guard, *options)
    assert _objects(bucket, name) == local
    record = json.loads(local["meta.json"])["guard"]
    assert record["dedup"]["removed"] == [20] and record["decontaminate"]["removed"] >= 1


def test_a_guarded_run_of_remote_inputs_is_the_local_inputs_run(bucket, tmp_path, capsys):
    docs = make_docs(120, words=150)
    docs += docs[:15]
    source = write_docs(tmp_path / "c", docs)
    for path in source.iterdir():
        bucket.put_object(Bucket=BUCKET, Key=f"inputs/{path.name}", Body=path.read_bytes())
    guard = ["--near-split", "--dedup", "exact", *SHARDED]
    assert main([f"s3://{BUCKET}/inputs/", "--out-dir", str(tmp_path / "remote"), *guard]) == 0
    assert main([str(source), "--out-dir", str(tmp_path / "local"), *guard]) == 0
    remote, local = ({p.name: p.read_bytes() for p in (tmp_path / f).iterdir()} for f in ("remote", "local"))
    # The reports name each file as it was given; the same files, by either name, the same rows.
    named = {"remote": f"s3://{BUCKET}/inputs/".encode(), "local": f"{source}/".encode()}
    for side, files in (("remote", remote), ("local", local)):
        for split in ("train", "val"):
            assert named[side] in files[f"{split}.guard.jsonl"]
            files[f"{split}.guard.jsonl"] = files[f"{split}.guard.jsonl"].replace(named[side], b"")
    assert {k: v for k, v in remote.items() if k != "meta.json"} == {k: v for k, v in local.items() if k != "meta.json"}
    assert json.loads(remote["meta.json"])["guard"] == json.loads(local["meta.json"])["guard"]
