"""--processes N: the run's tasks as N processes of this machine, finished into one process's
folder byte for byte (text and conversations; flat, llm.c, Megatron), a failing task one line,
Ctrl-C and a killed task leaving no process and a folder the same command finishes; and the
pattern of a user's unguarded script. Whole commands stopped and damaged mid-run are end-to-end
tests (-m e2e)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from helpers import (cli_run, make_chats, make_docs, prepare_cmd, signals_as_a_terminal_leaves_them, write_jsonl,
                     write_nanochat_spec)
from tokpack.format import UNIT_RECORD_GLOB
from tokpack.prepare.__main__ import main
from tokpack.verify import verify_folder


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("processes")
    return write_jsonl(root / "docs.jsonl", [{"text": doc} for doc in make_docs(300, seed=4, words=120)])


def _files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if not p.name.startswith(".")}


def _same_as_one_process(capsys, tmp_path, source, *options, counts=(2, 3)):
    one = tmp_path / "one" / "data"  # llm.c's shards are named after their folder
    assert main([str(source), "--out-dir", str(one), "--quiet", *map(str, options)]) == 0
    for n in counts:
        out = tmp_path / f"p{n}" / "data"
        code, err = cli_run(main, capsys, source, "--out-dir", out, "--quiet", "--processes", n, *options)
        assert code == 0, err
        assert _files(out) == _files(one), n
        assert not [p.name for p in out.iterdir() if p.name.startswith(".") and p.name != ".tokpack.lock"]
    return one


@pytest.mark.parametrize("options", [(), ("--format", "llmc", "--shard-tokens", "20000", "--unit-mb", "0.03"),
                                     ("--format", "megatron")],
                         ids=["flat", "llmc", "megatron"])
def test_text_is_one_processs_folder_for_any_count(corpus, tmp_path, capsys, options):
    counts = (2, 3) if not options else (2,)
    one = _same_as_one_process(capsys, tmp_path, corpus, *options, counts=counts)
    assert verify_folder(one)


def test_an_absurd_process_count_runs_as_many_as_the_machine_has_cores(corpus, tmp_path, capsys):
    from tokpack.prepare import LaunchOptions, PrepareConfig, prepare
    from tokpack.prepare.config.launch import MAX_TASKS, cores

    one = tmp_path / "one"
    assert main([str(corpus), "--out-dir", str(one), "--quiet"]) == 0
    code, err = cli_run(main, capsys, corpus, "--out-dir", tmp_path / "absurd", "--quiet", "--processes", "1000000")
    assert code == 2 and f"--processes 1,000,000 must lie in 1..{MAX_TASKS:,}" in err and "Traceback" not in err
    assert not (tmp_path / "absurd").exists()
    code, err = cli_run(main, capsys, corpus, "--out-dir", tmp_path / "many", "--quiet", "--processes", str(MAX_TASKS))
    assert code == 0 and f"--processes {MAX_TASKS:,} is more than this machine's {cores()} cores: running {cores()}" in err
    assert _files(tmp_path / "many") == _files(one)
    with pytest.warns(UserWarning, match="more than this machine's"):
        stats = prepare(PrepareConfig(inputs=(str(corpus),), out_dir=str(tmp_path / "api"), quiet=True,
                                      launch=LaunchOptions(processes=cores() + 1)))["stats"]
    assert stats["processes"] == cores()


def test_shards_follow_one_processs_units_even_when_fewer_than_the_processes(corpus, tmp_path, capsys):
    # --format llmc at the default --unit-mb: one unit, so one process has work, and says so.
    one = tmp_path / "one" / "data"
    assert main([str(corpus), "--out-dir", str(one), "--quiet", "--format", "llmc"]) == 0
    out = tmp_path / "two" / "data"
    code, err = cli_run(main, capsys, corpus, "--out-dir", out, "--quiet", "--format", "llmc", "--processes", "2")
    assert code == 0 and "only 1 of --processes 2 have work; pass --unit-mb" in err, err
    assert _files(out) == _files(one)
    from tokpack.prepare import LaunchOptions, PrepareConfig, prepare

    with pytest.warns(UserWarning, match="only 1 of --processes 2 have work"):
        stats = prepare(PrepareConfig(inputs=(str(corpus),), out_dir=str(tmp_path / "api" / "data"), quiet=True,
                                      format="llmc", launch=LaunchOptions(processes=2)))["stats"]
    assert stats["processes"] == 1 and _files(tmp_path / "api" / "data") == _files(one)  # the other never ran


@pytest.mark.parametrize("options,masks", [((), {"train.mask", "val.mask"}),
                                           (("--format", "llmc", "--shard-tokens", "4000", "--unit-mb", "0.02"),
                                            {"data_train_00001_000000.mask", "data_val_00000_000000.mask"})],
                         ids=["flat", "llmc"])
def test_conversations_are_one_processs_folder(tmp_path, capsys, options, masks):
    spec = write_nanochat_spec(tmp_path / "tok")
    source = write_jsonl(tmp_path / "chats.jsonl", make_chats(160, seed=9))
    one = _same_as_one_process(capsys, tmp_path, source, "--chat", "nanochat", "--encoding", spec, *options)
    assert masks <= set(_files(one))


def test_a_failing_task_is_its_one_line_and_leaves_nothing(tmp_path, capsys):
    spec = write_nanochat_spec(tmp_path / "tok")
    chats = make_chats(60, seed=2)
    lines = [json.dumps(c) for c in chats]
    lines[50] = json.dumps({"messages": [{"role": "robot", "content": "hi"}]})  # in the second task's half
    source = tmp_path / "chats.jsonl"
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    code, err = cli_run(main, capsys, source, "--chat", "nanochat", "--encoding", spec, "--out-dir", out, "--quiet",
                        "--processes", "2")
    # A task that starts mid-file names the record by its byte (its line number would cost a read).
    assert code == 2 and f"{source} (the line at byte" in err and "of role 'robot'" in err, err
    assert len(err.splitlines()) == 1, err
    assert not out.exists() or not [p for p in out.iterdir() if p.name != ".tokpack.lock"]


@pytest.mark.parametrize("given,reason", [
    (("--processes", "0"), "--processes 0 must lie in 1..65,536"),
    (("--processes", "2", "--tasks", "2", "--task", "0"), "does not take --tasks, --task"),
    (("--processes", "2", "--ray", "local", "--out-dir", "s3://bucket/x"), "the run must be sharded"),
])
def test_bad_processes_options_are_one_line(corpus, tmp_path, capsys, given, reason):
    code, err = cli_run(main, capsys, corpus, "--out-dir", tmp_path / "o", *given)
    assert code == 2 and reason in err and "\n" not in err, err


def _children(pid):
    """The processes whose parent is ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == str(pid):
            found.append(int(entry))
    return found


def _in_group(pgid):
    return [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if _pgid(pid) == pgid]


def _pgid(pid):
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _started_with_a_unit_done(cmd, out):
    """``cmd`` started in a process group of its own, returned once a unit is recorded and its
    files renamed (a unit writes its record first), with units still to do; a run that ends first
    is started again, three times at most."""
    for _ in range(3):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                preexec_fn=signals_as_a_terminal_leaves_them)
        while proc.poll() is None and not (out.is_dir() and any(map(_renamed, out.glob(UNIT_RECORD_GLOB)))):
            time.sleep(0.002)
        if proc.poll() is None and len(list(out.glob(UNIT_RECORD_GLOB))) < 8:
            return proc
        proc.communicate()
    pytest.fail(f"{' '.join(cmd)} never stood with a unit done and others to do")


def _renamed(record) -> bool:
    """Whether a unit record's shards stand at their names."""
    try:
        parts = json.loads(record.read_text())["splits"].values()
    except (OSError, ValueError):
        return False
    return all((record.parent / shard["file"]).is_file() for part in parts for shard in part["info"]["shards"])


@pytest.mark.e2e
@pytest.mark.parametrize("how", ["ctrl-c", "kill -9 of a task"])
def test_a_stopped_run_leaves_no_process_and_the_same_command_finishes_it(corpus, tmp_path, how):
    options = ("--unit-mb", "0.02", "--format", "llmc", "--shard-tokens", "5000")
    one, out = tmp_path / "one" / "data", tmp_path / "run" / "data"
    assert main([str(corpus), "--out-dir", str(one), "--quiet", *options]) == 0
    cmd = prepare_cmd(corpus, out, *options, "--processes", "2")
    proc = _started_with_a_unit_done(cmd, out)
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: to the whole foreground group
        expected, said = 130, "interrupted"
    else:
        os.kill(_children(proc.pid)[0], signal.SIGKILL)
        expected, said = 2, "was killed by signal 9; run the same command again"
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == expected and said in err, err
    assert not _in_group(proc.pid)  # no task outlived the run
    assert not list(out.glob(".*.tokpack-tmp"))
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("*.bin")}
    assert kept and not (out / "meta.json").exists()
    assert subprocess.run(cmd, capture_output=True, timeout=120).returncode == 0
    assert _files(out) == _files(one)
    assert all(p.stat().st_mtime_ns == kept[p.name] for p in out.glob("*.bin") if p.name in kept)  # not redone


@pytest.mark.e2e
def test_a_unit_damaged_while_the_run_goes_on_is_one_line_and_redone(corpus, tmp_path):
    options = ("--unit-mb", "0.02")
    one, out = tmp_path / "one" / "data", tmp_path / "run" / "data"
    assert main([str(corpus), "--out-dir", str(one), "--quiet", *options]) == 0
    cmd = prepare_cmd(corpus, out, *options, "--processes", "2")
    proc = _started_with_a_unit_done(cmd, out)
    os.killpg(proc.pid, signal.SIGSTOP)  # the whole run held while a finished unit's file is cut short
    record = json.loads(next(filter(_renamed, out.glob(UNIT_RECORD_GLOB))).read_text())
    shard = out / record["splits"]["train"]["info"]["shards"][0]["file"]
    shard.write_bytes(shard.read_bytes()[:-2])
    os.killpg(proc.pid, signal.SIGCONT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "are not as their tasks recorded them; run the same command again" in err, err
    assert not (out / "meta.json").exists()
    assert subprocess.run(cmd, capture_output=True, timeout=120).returncode == 0
    assert _files(out) == _files(one)


@pytest.mark.e2e
def test_an_unguarded_script_runs_processes(corpus, tmp_path):
    # A user's script, no __main__ guard: the tasks are fresh interpreters that never import it.
    script = tmp_path / "make_data.py"
    script.write_text(textwrap.dedent(f"""
        from tokpack.prepare import LaunchOptions, PrepareConfig, prepare
        result = prepare(PrepareConfig(inputs=({str(corpus)!r},), out_dir={str(tmp_path / 'out')!r}, quiet=True,
                                       launch=LaunchOptions(processes=2)))
        print(result["splits"]["train"]["documents"])
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip().isdigit(), done.stderr
    assert verify_folder(tmp_path / "out")


def test_stopping_asks_each_task_to_clean_up_before_it_kills(monkeypatch):
    # SIGTERM first (a task removes its temporary files on it), SIGKILL only for one that ignores it.
    from tokpack.prepare.executors import local

    monkeypatch.setattr(local, "STOP_S", 1.0)

    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, sys, time; "
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)"],
                                stdout=subprocess.PIPE)
    stubborn.stdout.readline()  # its handler is set
    local._stop([polite, stubborn])
    assert polite.returncode == -signal.SIGTERM and stubborn.returncode == -signal.SIGKILL


def _process(code):
    """A task's process, running ``code``, its stderr in a log as the executor keeps it."""
    import tempfile

    log = tempfile.TemporaryFile()
    return subprocess.Popen([sys.executable, "-c", code], stderr=log), log


def test_a_failed_process_stops_the_task_the_run_runs_itself():
    from tokpack.prepare.executors import local

    process, log = _process("import sys; print('tokpack: line 3 of x.jsonl is bad', file=sys.stderr); sys.exit(2)")
    steps = []

    def task():  # twenty seconds, were it not stopped
        for _ in range(2_000):
            time.sleep(0.01)
            steps.append(1)
        steps.append("finished")

    with log, pytest.raises(ValueError, match="^line 3 of x.jsonl is bad$"):
        local._alongside(task, [(1, process, log)], 2, lambda: None)
    assert steps and "finished" not in steps


def test_the_runs_own_task_failing_stops_the_watch_and_is_raised():
    from tokpack.prepare.executors import local

    process, log = _process("import time; time.sleep(60)")
    ticks = []

    def task():
        while not ticks:  # the watch has begun
            time.sleep(0.01)
        raise ValueError("the run's own task failed")

    try:
        with pytest.raises(ValueError, match="own task failed"):
            local._alongside(task, [(1, process, log)], 2, lambda: ticks.append(1))
        assert process.poll() is None  # stopping the processes is the caller's
        assert not [t for t in threading.enumerate() if t.name == "tokpack-processes"]
    finally:
        local._stop([process])
        log.close()


def test_without_a_task_here_the_watch_waits_for_every_process():
    from tokpack.prepare.executors import local

    quick, quick_log = _process("pass")
    lost, lost_log = _process("import os, signal, time; time.sleep(0.3); os.kill(os.getpid(), signal.SIGKILL)")
    with quick_log, lost_log, pytest.raises(local.TaskLost, match="task 1 of 2 was killed by signal 9"):
        local._alongside(None, [(0, quick, quick_log), (1, lost, lost_log)], 2, lambda: None)


def test_a_tasks_warnings_reach_the_command_once_each_and_its_other_lines_do_not():
    import tempfile
    import warnings

    from tokpack.prepare.executors import local

    with tempfile.TemporaryFile() as log:
        log.write(b"tokpack: warning: document 3 holds over 1 characters\nsome library's own line\n"
                  b"tokpack: warning: document 3 holds over 1 characters\ntokpack: warning: another\n"
                  b"tokpack: a task's error line\n")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            local._forward_warnings(log)
    assert [str(w.message) for w in seen] == ["document 3 holds over 1 characters", "another"]


def test_one_progress_bar_follows_the_whole_run_on_a_terminal(corpus, tmp_path):
    # On a terminal (a pty, as a user's shell gives), the run draws one bar for all its tasks, in
    # input bytes, up to the whole input; the tasks draw none of their own.
    import fcntl
    import pty
    import struct
    import termios

    from tqdm import tqdm

    main_end, task_end = pty.openpty()
    fcntl.ioctl(task_end, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal of 120 columns
    cmd = [sys.executable, "-m", "tokpack.prepare", str(corpus), "--out-dir", str(tmp_path / "out"), "--processes",
           "2", "--unit-mb", "0.02", "--format", "llmc", "--shard-tokens", "5000"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=task_end, stderr=task_end, close_fds=True)
    os.close(task_end)
    shown = b""
    while True:
        try:
            chunk = os.read(main_end, 1 << 16)
        except OSError:  # the terminal closed: every process that held it has ended
            break
        if not chunk:
            break
        shown += chunk
    os.close(main_end)
    assert proc.wait(timeout=120) == 0, shown
    drawn = [line for line in shown.decode(errors="replace").replace("\r", "\n").split("\n") if "%|" in line]
    assert drawn and all(line.startswith("tokpack.prepare (2 processes):") for line in drawn), shown
    size = tqdm.format_sizeof(corpus.stat().st_size)  # the whole input, as the bar writes bytes
    assert "100%|" in drawn[-1] and f"| {size}/{size} [" in drawn[-1], drawn[-1]
    assert "  0%|" in drawn[0]
