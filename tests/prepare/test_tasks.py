"""Independent tasks (--task/--tasks, a Slurm array's environment, --finalize): any order, one
killed mid-unit and rerun, byte-identical to one process; the bad inputs of such runs."""

from __future__ import annotations

import fcntl
import random

import numpy as np
import pytest

from helpers import cli_run, kill, make_docs, paused_at, prepare_cmd, write_docs
from tokpack.format import LOCK_NAME, read_meta
from tokpack.prepare import PrepareConfig
from tokpack.prepare.__main__ import main
from tokpack.split import open_split
from tokpack.verify import verify_folder

OPTIONS = ["--unit-mb", "0.01", "--shard-tokens", "100000", "--quiet"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_docs(tmp_path_factory.mktemp("tasks") / "c", make_docs(120, words=150))


def _run(capsys, *argv) -> tuple[int, str]:
    return cli_run(main, capsys, *argv)


def _files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if not p.name.startswith(".")}


def test_tasks_in_any_order_one_killed_and_rerun_give_one_processs_folder(corpus, tmp_path, capsys):
    one = tmp_path / "one"
    assert main([str(corpus), "--out-dir", str(one), *OPTIONS]) == 0
    assert len(read_meta(one)["inputs"]["units_sha256"]) >= 4
    out = tmp_path / "tasks"
    order = [2, 0, 3, 1]
    random.Random(5).shuffle(order)
    # A task killed while it writes a unit (a temporary file of its own stands): it is simply rerun.
    victim = order.pop(1)
    cmd = prepare_cmd(corpus, out, *OPTIONS[:-1], "--tasks", "4", "--task", str(victim))
    kill(paused_at(cmd, lambda: out.is_dir() and any(p.name.endswith(".tokpack-tmp") for p in out.iterdir())))
    for task in order:
        assert main([str(corpus), "--out-dir", str(out), *OPTIONS, "--tasks", "4", "--task", str(task)]) == 0
        assert not (out / "meta.json").exists()  # a unit is still missing: the folder is not whole
    with pytest.raises(ValueError, match="is an unfinished tokpack.prepare run"):
        open_split(out, "train")
    code, err = _run(capsys, corpus, "--out-dir", out, *OPTIONS, "--tasks", "4", "--finalize")
    assert code == 2 and "lacks units" in err and "then --finalize" in err and "\n" not in err, err
    assert main([str(corpus), "--out-dir", str(out), *OPTIONS, "--tasks", "4", "--task", str(victim)]) == 0
    assert (out / "meta.json").exists()  # the task that did the last unit wrote it
    assert _files(out) == _files(one)
    verify_folder(out)
    for _ in range(2):  # finalizing again, or rerunning a task, changes nothing
        assert main([str(corpus), "--out-dir", str(out), *OPTIONS, "--tasks", "4", "--finalize"]) == 0
        assert main([str(corpus), "--out-dir", str(out), *OPTIONS, "--tasks", "4", "--task", "0"]) == 0
    assert _files(out) == _files(one)
    flat = tmp_path / "flat"  # and the shards, concatenated, are the one-process flat file
    assert main([str(corpus), "--out-dir", str(flat), "--quiet"]) == 0
    shards = sorted(out.glob("train_*.bin"))
    assert np.concatenate([np.fromfile(p, dtype=np.uint16) for p in shards]).tobytes() == (flat / "train.bin").read_bytes()


def test_a_slurm_array_gives_the_task_and_a_changed_input_redoes_its_unit(corpus, tmp_path, capsys, monkeypatch):
    own = write_docs(tmp_path / "c", make_docs(40, words=150))
    out = tmp_path / "out"
    args = [str(own), "--out-dir", str(out), "--unit-mb", "0.01", "--shard-tokens", "100000", "--quiet"]
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "1")  # --array=1-2
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "2")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    assert PrepareConfig(inputs=(str(own),)).launch.place() == (0, 2)
    assert main(args) == 0 and not (out / "meta.json").exists()
    first = sorted(own.iterdir())[0]
    text = first.read_text()
    first.write_text(("X" if text[0] != "X" else "Y") + text[1:])  # task 0's first unit's input, the same size
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    capsys.readouterr()
    assert main(args) == 0  # task 1 finds unit 0 changed: not done, no meta.json
    assert "warning: the input of unit 0 changed since it was recorded" in capsys.readouterr().err
    assert not (out / "meta.json").exists()
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    assert main(args) == 0 and (out / "meta.json").exists()
    fresh = tmp_path / "fresh"
    assert main([*args[:2], str(fresh), *args[3:], "--tasks", "1", "--task", "0"]) == 0
    assert (out / "train.idx").read_bytes() == (fresh / "train.idx").read_bytes()


BAD = {  # the fragment of the one line -> the extra options
    "--tasks 0 must lie in 1..65,536": ["--tasks", "0", "--task", "0"],
    "--task 4 must lie in 0..3": ["--tasks", "4", "--task", "4"],
    "--task 1 must lie in 0..--tasks - 1; give --tasks N too": ["--task", "1"],
    "--finalize writes meta.json of a run of independent tasks": ["--finalize"],
    "needs this task's --task (0..3)": ["--tasks", "4"],
    "--tasks 1,000,000,000 must lie in 1..65,536": ["--tasks", "1000000000", "--task", "7"],  # no O(tasks) scan first
    "--tasks 60,000 is more than the": ["--tasks", "60000", "--task", "7"],
}


@pytest.mark.parametrize("fragment", list(BAD))
def test_bad_task_options_are_one_line(corpus, tmp_path, capsys, fragment):
    code, err = _run(capsys, corpus, "--out-dir", tmp_path / "o", *OPTIONS, *BAD[fragment])
    assert code == 2 and fragment in err and "\n" not in err, err
    assert not (tmp_path / "o").exists()


def test_tasks_with_other_options_and_two_finalizers_are_refused(corpus, tmp_path, capsys):
    out = tmp_path / "o"
    assert main([str(corpus), "--out-dir", str(out), *OPTIONS, "--tasks", "4", "--task", "0"]) == 0
    before = _files(out)
    code, err = _run(capsys, corpus, "--out-dir", out, *OPTIONS, "--tasks", "4", "--task", "1", "--seed", "7")
    assert code == 2 and "units of a run with other options or inputs" in err and "\n" not in err, err
    assert _files(out) == before
    for task in (1, 2):
        assert main([str(corpus), "--out-dir", str(out), *OPTIONS, "--tasks", "4", "--task", str(task)]) == 0
    with open(out / LOCK_NAME, "a+b") as held:  # another finalizer holds the folder
        held.write(b"4242")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        code, err = _run(capsys, corpus, "--out-dir", out, *OPTIONS, "--tasks", "4", "--finalize")
        assert code == 2 and "is being written by another tokpack.prepare" in err, err
    assert main([str(corpus), "--out-dir", str(out), *OPTIONS, "--tasks", "4", "--task", "3"]) == 0
    verify_folder(out)
