"""Resuming a killed sharded prepare: finished units are kept, verified by size and hash, the
rest redone, and the result is the uninterrupted run's, byte for byte."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import kill, make_docs, paused_at, write_docs
from tokpack.format import read_meta
from tokpack.prepare.__main__ import main
from tokpack.verify import verify_folder

OPTIONS = ["--shard-tokens", "3000", "--unit-mb", "0.15", "--quiet", "--workers", "1"]


@pytest.fixture
def corpus(tmp_path):
    folder = write_docs(tmp_path / "corpus", make_docs(20, words=300))
    docs = make_docs(1500, seed=5, words=120)
    (folder / "web.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return folder


def _cmd(corpus, out, *extra):
    return [sys.executable, "-m", "tokpack.prepare", str(corpus), "--out-dir", str(out), *OPTIONS, *extra]


def _kill_after_units(cmd, out, units):
    """Kill ``cmd`` once ``units`` unit records exist (paused there first)."""
    kill(paused_at(cmd, lambda: len(list(out.glob(".tokpack-unit-*.json"))) >= units))


def _files(folder):
    meta = read_meta(folder)
    return {split: [s["file"] for s in info["shards"]] for split, info in meta["splits"].items()}


def test_a_killed_run_resumes_keeping_finished_units(tmp_path, corpus):
    reference = tmp_path / "reference"
    assert subprocess.run(_cmd(corpus, reference), capture_output=True).returncode == 0
    out = tmp_path / "out"
    _kill_after_units(_cmd(corpus, out), out, 2)
    assert not (out / "meta.json").exists()
    kept = {}
    for record in out.glob(".tokpack-unit-*.json"):
        parts = json.loads(record.read_text())["splits"].values()
        shards = [shard for part in parts for shard in part["info"]["shards"]]
        # A unit is finished once its files, index part included, stand as recorded (the kill may
        # fall between the record and its renames).
        if all((out / s["file"]).is_file() and (out / s["file"]).stat().st_size == s["bytes"]
               for s in (*shards, *(part["idx"] for part in parts))):
            kept.update({s["file"]: ((out / s["file"]).stat().st_ino, (out / s["file"]).stat().st_mtime_ns)
                         for s in shards})
    assert kept
    done = subprocess.run(_cmd(corpus, out), capture_output=True, text=True)  # no --force needed
    assert done.returncode == 0, done.stderr
    verify_folder(out)
    assert _files(out) == _files(reference) and len(_files(out)["train"]) > 3
    for split, names in _files(reference).items():
        for name in names:
            assert (out / name).read_bytes() == (reference / name).read_bytes(), name
        assert (out / f"{split}.idx").read_bytes() == (reference / f"{split}.idx").read_bytes()
    for name, (inode, mtime) in kept.items():  # the finished units were kept, not redone
        stat = (out / name).stat()
        assert (stat.st_ino, stat.st_mtime_ns) == (inode, mtime), name
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_other_options_drop_a_killed_runs_units_in_one_warning(tmp_path, corpus):
    out = tmp_path / "out"
    _kill_after_units(_cmd(corpus, out), out, 1)
    done = subprocess.run(_cmd(corpus, out, "--seed", "7"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    warning = [line for line in done.stderr.splitlines() if "unit records" in line]
    assert len(warning) == 1 and "other inputs or options" in warning[0] and "starts over" in warning[0]
    verify_folder(out)
    assert read_meta(out)["options"]["seed"] == 7
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_a_user_error_leaves_no_units_behind(tmp_path, corpus):
    (corpus / "zz.txt").write_bytes(b"broken \xff utf-8")  # last in input order: after finished units
    out = tmp_path / "out"
    done = subprocess.run(_cmd(corpus, out), capture_output=True, text=True)
    assert done.returncode == 2 and "zz.txt is not valid UTF-8" in done.stderr
    assert not out.exists()


def test_a_flat_run_after_a_killed_sharded_one_leaves_no_stray_shards(tmp_path, corpus):
    out = tmp_path / "out"
    _kill_after_units(_cmd(corpus, out), out, 1)
    done = subprocess.run([sys.executable, "-m", "tokpack.prepare", str(corpus), "--out-dir", str(out), "--quiet"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "train.idx", "val.bin", "val.idx"]


@pytest.mark.parametrize("sharded", [True, False])
def test_a_forged_unit_record_deletes_nothing_outside_the_folder_nor_another_tools_file(tmp_path, corpus, sharded,
                                                                                         capsys):
    out = tmp_path / "out"
    out.mkdir()
    outside = tmp_path / "notes.txt"
    outside.write_text("keep me")
    (out / "train.bin").write_bytes(b"\0" * 64)  # nanoGPT's, not tokpack's
    (out / "val_000000.bin").symlink_to(outside)  # a unit's name, but a link out of the folder
    names = [str(outside), "../notes.txt", "train.bin", "val_000000.bin"]
    shard = {"file": names[0], "bytes": 1, "sha256": "0" * 64, "tokens": 1}
    record = {"fingerprint": "forged", "unit": 0, "splits": {
        "train": {"info": {"shards": [shard, *({**shard, "file": n} for n in names[1:])]},
                  "idx": {**shard, "file": ".train.idx.u00000"}},
        "val": {"info": {"shards": []}, "idx": {**shard, "file": ".val.idx.u00000"}}}}
    (out / ".tokpack-unit-00000.json").write_text(json.dumps(record))
    argv = _cmd(corpus, out, *([] if sharded else ["--shard-tokens", "0", "--unit-mb", "1024"]))[3:]
    with pytest.raises(SystemExit):
        main(argv)
    err = capsys.readouterr().err
    assert "train.bin" in err and "--force" in err  # not tokpack's, whatever the record says
    assert outside.read_text() == "keep me" and (out / "train.bin").read_bytes() == b"\0" * 64
    (out / "train.bin").unlink()  # the user moves the files the run named away
    (out / "val_000000.bin").unlink()
    assert main(argv) == 0
    assert outside.read_text() == "keep me" and not (out / ".tokpack-unit-00000.json").exists()
    verify_folder(out)
