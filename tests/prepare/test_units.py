"""Resuming a killed sharded prepare: finished units are kept, verified by size and hash, the
rest redone, and the result is the uninterrupted run's, byte for byte."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import kill, make_docs, paused_at, write_docs
from tokpack.format import read_meta
from tokpack.prepare import tokenize
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
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "train.guard.jsonl", "train.idx",
                                                     "val.bin", "val.guard.jsonl", "val.idx"]


def _interrupted_after(monkeypatch, finished):
    """Make the next in-process run stop like a kill once ``finished`` units are done."""
    real, calls = tokenize.run_unit, []

    def run_unit(plan, unit, verdicts):
        if len(calls) == finished:
            raise KeyboardInterrupt
        calls.append(unit)
        return real(plan, unit, verdicts)

    monkeypatch.setattr(tokenize, "run_unit", run_unit)
    return calls


def _tokens(folder):
    return {split: b"".join((folder / name).read_bytes() for name in names) for split, names in _files(folder).items()}


def test_an_input_edited_in_place_is_redone_even_with_its_old_mtime(tmp_path, corpus, monkeypatch):
    out = tmp_path / "out"
    argv = _cmd(corpus, out)[3:]
    calls = _interrupted_after(monkeypatch, 2)
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 130 and calls == [0, 1]
    recorded = [json.loads((out / f".tokpack-unit-{u:05d}.json").read_text())["input_sha256"] for u in (0, 1)]
    first = sorted(corpus.iterdir())[0]  # unit 0's input: the same length, the old mtime
    before = first.stat()
    text = first.read_text()
    first.write_text(text.replace("the", "thx", 1))
    os.utime(first, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert first.stat().st_size == before.st_size and first.read_text() != text
    monkeypatch.undo()
    assert main(argv) == 0
    assert main(_cmd(corpus, tmp_path / "fresh")[3:]) == 0
    assert _tokens(out) == _tokens(tmp_path / "fresh")
    hashes = read_meta(out)["inputs"]["units_sha256"]
    assert hashes == read_meta(tmp_path / "fresh")["inputs"]["units_sha256"]
    assert hashes[0] != recorded[0] and hashes[1] == recorded[1]  # unit 0 redone, unit 1 kept


def _stopped_after_three_units(tmp_path, corpus, monkeypatch):
    out = tmp_path / "out"
    argv = _cmd(corpus, out)[3:]
    _interrupted_after(monkeypatch, 3)
    with pytest.raises(SystemExit):
        main(argv)
    monkeypatch.undo()
    return out, argv


def _rerun_redoes_unit_1_alone(tmp_path, corpus, monkeypatch, out, argv):
    kept = {p.name: p.stat().st_ino for p in out.glob("*_0000[02]_*.bin")}
    assert kept and list(out.glob("*_00001_*.bin"))
    calls = _interrupted_after(monkeypatch, 99)
    assert main(argv) == 0
    assert 1 in calls and 0 not in calls and 2 not in calls  # only the broken unit was tokenized again
    assert {name: (out / name).stat().st_ino for name in kept} == kept
    assert main(_cmd(corpus, tmp_path / "fresh")[3:]) == 0
    assert _tokens(out) == _tokens(tmp_path / "fresh")


def test_a_broken_unit_record_redoes_its_unit_and_keeps_the_others(tmp_path, corpus, monkeypatch, capsys):
    out, argv = _stopped_after_three_units(tmp_path, corpus, monkeypatch)
    record = out / ".tokpack-unit-00001.json"
    record.write_text(record.read_text()[:50])  # cut short: a disk that lost the record's tail
    capsys.readouterr()
    _rerun_redoes_unit_1_alone(tmp_path, corpus, monkeypatch, out, argv)
    err = capsys.readouterr().err
    assert ".tokpack-unit-00001.json" in err and "those units are redone and the others kept" in err


@pytest.mark.parametrize("damage", ["index out of order", "id beyond the vocabulary"])
def test_a_kept_unit_whose_content_is_broken_is_redone_and_the_others_kept(tmp_path, corpus, monkeypatch, damage):
    # The record and its hashes agree with the files (rewritten together, as a forger or a buggy
    # copy would), yet the content is wrong: verify would refuse the folder at the end.
    import hashlib

    out, argv = _stopped_after_three_units(tmp_path, corpus, monkeypatch)
    path = out / ".tokpack-unit-00001.json"
    record = json.loads(path.read_text())
    part = record["splits"]["train"]
    entry = part["idx"] if damage == "index out of order" else part["info"]["shards"][0]
    file = out / entry["file"]
    data = np.fromfile(file, dtype=np.uint64 if damage == "index out of order" else np.uint16)
    if damage == "index out of order":
        data[1], data[2] = data[2], data[1]
    else:
        data[5] = 60000
    data.tofile(file)
    entry["sha256"] = hashlib.sha256(file.read_bytes()).hexdigest()
    path.write_text(json.dumps(record))
    _rerun_redoes_unit_1_alone(tmp_path, corpus, monkeypatch, out, argv)
