"""The output folder: one run at a time, no leftovers on any exit path, whole or without meta.json."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from helpers import kill, make_docs, paused_at, prepare_cmd, write_docs
from tokpack.prepare.publish import folder as folder_module
from tokpack.prepare import PrepareConfig, prepare
from tokpack.prepare.__main__ import main
from tokpack.verify import verify_folder


def _temporaries(out):
    return list(out.glob(".*.tokpack-tmp")) if out.exists() else []


def test_a_second_run_into_a_locked_folder_fails_at_once_naming_the_holder(tmp_path):
    corpus = write_docs(tmp_path / "c", make_docs(200, words=3000))
    out = tmp_path / "out"
    first = paused_at(prepare_cmd(corpus, out, "--force"), lambda: bool(_temporaries(out)))
    try:
        second = subprocess.run(prepare_cmd(corpus, out, "--force"), capture_output=True, text=True, timeout=300)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert second.returncode == 2
    assert f"being written by another tokpack.prepare (pid {first.pid})" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1
    assert first.wait(timeout=300) == 0
    verify_folder(out)
    assert not [p for p in os.listdir(out) if p.startswith(".")]  # no lock file, no temporaries


def test_a_killed_runs_lock_and_temporaries_do_not_block_the_next_run(tmp_path):
    corpus = write_docs(tmp_path / "c", make_docs(200, words=3000))
    out = tmp_path / "out"
    kill(paused_at(prepare_cmd(corpus, out), lambda: len(_temporaries(out)) >= 2))
    assert (out / ".tokpack.lock").exists() and _temporaries(out)
    (out / ".spill999999.tokpack-tmp").write_bytes(b"\0" * 1000)  # a spill a killed run left
    assert main([str(corpus), "--out-dir", str(out), "--quiet"]) == 0
    verify_folder(out)
    assert not [p for p in os.listdir(out) if p.startswith(".")]


def test_sigterm_cleans_up_like_ctrl_c_and_exits_143(tmp_path):
    corpus = write_docs(tmp_path / "c", make_docs(200, words=3000))
    out = tmp_path / "a" / "b" / "out"
    proc = paused_at(prepare_cmd(corpus, out), lambda: bool(_temporaries(out)))
    proc.send_signal(signal.SIGTERM)  # delivered when it continues, mid-run
    os.kill(proc.pid, signal.SIGCONT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143 and err.strip().splitlines()[-1] == "tokpack: terminated"
    assert not (tmp_path / "a").exists()  # the folders it created, parents included, are gone


def test_a_failed_run_removes_the_folders_it_created_and_keeps_others(tmp_path, capsys):
    corpus = write_docs(tmp_path / "c", make_docs(20))
    (tmp_path / "kept").mkdir()
    with pytest.raises(SystemExit):
        main([str(corpus), "--out-dir", str(tmp_path / "kept" / "x" / "y"), "--val-fraction", "0.0001", "--quiet"])
    assert "val split would be empty" in capsys.readouterr().err
    assert (tmp_path / "kept").is_dir() and not (tmp_path / "kept" / "x").exists()


def test_disk_full_at_meta_json_leaves_no_token_files(tmp_path, monkeypatch):
    corpus = write_docs(tmp_path / "c", make_docs(20))
    out = tmp_path / "out"

    def full(path, obj):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(folder_module, "write_json_atomic", full)
    with pytest.raises(OSError, match="No space left"):
        prepare(PrepareConfig(inputs=(str(corpus),), out_dir=str(out), quiet=True))
    assert not out.exists()


def test_a_run_over_an_old_folder_that_fails_at_publish_leaves_no_mixed_folder(tmp_path, monkeypatch):
    corpus = write_docs(tmp_path / "c", make_docs(20))
    out = tmp_path / "out"
    prepare(PrepareConfig(inputs=(str(corpus),), out_dir=str(out), quiet=True))
    monkeypatch.setattr(folder_module, "write_json_atomic", lambda path, obj: (_ for _ in ()).throw(OSError(28, "full")))
    with pytest.raises(OSError):
        prepare(PrepareConfig(inputs=(str(corpus),), out_dir=str(out), quiet=True, force=True, seed=5))
    assert not (out / "meta.json").exists() and not list(out.glob("*.bin"))
