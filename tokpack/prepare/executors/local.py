"""``--processes N``: the tasks of a run on this machine: task 0 in the run's own process, which
has the plan already, and each other one a process, ``python -m tokpack.prepare.executors.local``
with its task on its standard input.

Fresh interpreters, not forks: a fork of a process that holds threads (the encoders', a
tokenizer's pool) can inherit a lock held by a thread that is not there, and a spawned
``multiprocessing`` child would re-run a caller's unguarded script. Each process starts in about
half a second and holds one process's flat memory; each task gets its share of the cores for its
encoding threads. A task that fails stops the others and its one line is raised; one that is
killed raises ``TaskLost``; Ctrl-C, SIGTERM or an error in the caller stops every task before
``run`` returns, and a process whose caller died stops by itself.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from typing import IO, Any

from ...cli import run_cli
from ...options import from_dict
from ..config import PrepareConfig
from ..config.launch import cores
from ..memory import fix_mmap_threshold
from ..tasks import run_task
from .base import Ready, TaskLost

POLL_S = 0.2  # how often the processes are looked at, and the caller ticked
STOP_S = 10.0  # how long a stopped process may take to clean up before it is killed
WARNING = "tokpack: warning: "  # how the CLIs print a warning, a task's among them

Started = tuple[int, subprocess.Popen[bytes], IO[bytes]]  # a task, its process and the log of its stderr


class LocalProcesses:
    """Every task that has work at once on this machine: task 0 in the caller's own process where
    it offers one (``ready``'s ``Here``), every other a process of its own."""

    def run(self, config: PrepareConfig, tasks: int, ready: Callable[[], Ready],
            tick: Callable[[], None]) -> None:
        threads = _threads_each(config, tasks)
        # Rust thread pools (splintr's, tokenizers') too: N processes share the cores.
        env = {**os.environ, "RAYON_NUM_THREADS": str(threads)}
        started: list[Started] = []
        idle: list[Started] = []  # started before the run knew they would have no work
        try:
            # Each starts and makes its plan while the caller readies the folder; task 0 waits to
            # run on the caller's plan, unless the caller cannot run a task itself.
            for task in range(1, tasks):
                started.append(_start(config, task, threads, env))
            here, tasks = ready()
            started, idle = started[:tasks - 1], started[tasks - 1:]
            for _, process, _ in idle:  # they end without writing anything
                _go(process, False)
            if here is None:
                started.insert(0, _start(config, 0, threads, env))
            for _, process, _ in started:
                _go(process, True)
            _alongside(None if here is None else lambda: here(0, threads), started, tasks, tick)
        finally:
            _stop([process for _, process, _ in started + idle])
            for _, _, log in started + idle:
                _forward_warnings(log)
                log.close()


def _start(config: PrepareConfig, task: int, threads: int, env: dict[str, str]) -> Started:
    """Task ``task``'s process, started, its task on its standard input."""
    log = tempfile.TemporaryFile()
    process = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               stderr=log, env=env)
    assert process.stdin is not None
    process.stdin.write(json.dumps({"config": _plain(config), "task": task, "workers": threads}).encode() + b"\n")
    process.stdin.flush()
    return task, process, log


class _Stopped(BaseException):
    """Raised in the run's own thread, as Ctrl-C is, to stop its task when a process's task failed."""


def _alongside(task: Callable[[], None] | None, started: list[Started], tasks: int, tick: Callable[[], None]) -> None:
    """``task`` (if any) in this thread while another watches the processes to their end; the first
    that fails stops it (``_Stopped``, raised in this thread: its writers clean up as on Ctrl-C)
    and is raised."""
    thread, lock, stop = threading.get_ident(), threading.Lock(), threading.Event()
    failure: list[BaseException] = []
    running = True

    def watch() -> None:
        try:
            _wait(started, tasks, tick, stop)
        except BaseException as exc:
            failure.append(exc)
            with lock:
                if running:
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(_Stopped))

    watcher = threading.Thread(target=watch, name="tokpack-processes", daemon=True)
    watcher.start()
    try:
        try:
            if task is not None:
                task()
        finally:
            with lock:
                running = False
        watcher.join()  # a _Stopped sent just before is raised here at the latest
    except _Stopped:
        pass
    finally:
        stop.set()  # the task failed or was interrupted: the processes are the caller's to stop
        watcher.join()
    if failure:
        raise failure[0]


def _go(process: subprocess.Popen[bytes], work: bool) -> None:
    """The folder is ready: the task may write (a task that already ended is reported by
    ``_wait``), or, without ``work``, it ends as it is."""
    assert process.stdin is not None
    try:
        process.stdin.write(b"go\n" if work else b"")
        process.stdin.close()
    except BrokenPipeError:
        pass


def _threads_each(config: PrepareConfig, tasks: int) -> int:
    """A process's encoding threads: ``--workers`` as asked, else its share of the cores."""
    return config.workers or max(1, cores() // tasks)


def _plain(config: PrepareConfig) -> dict[str, Any]:
    """The config as JSON, for the task's process to rebuild and check as the caller did."""
    return dataclasses.asdict(config)  # a group of options (the [guard] table) as a table


def _wait(started: list[Started], tasks: int, tick: Callable[[], None], stop: threading.Event | None = None) -> None:
    """Until every process has ended well (or ``stop`` is set); the first that did not is raised."""
    running = {task: (process, log) for task, process, log in started}
    while running and not (stop is not None and stop.is_set()):
        try:  # back as soon as one ends: where it was the last, the finish starts at once
            next(iter(running.values()))[0].wait(POLL_S)
        except subprocess.TimeoutExpired:
            pass
        tick()
        for task, (process, log) in list(running.items()):
            code = process.poll()
            if code is None:
                continue
            del running[task]
            if code != 0:
                raise _failure(task, tasks, code, log)


def _failure(task: int, tasks: int, code: int, log: IO[bytes]) -> Exception:
    """The error of a task's process that ended with ``code``: its own one line, or ``TaskLost``."""
    lines = [line for line in _lines(log) if line.startswith("tokpack: ") and not line.startswith(WARNING)]
    if code == 2 and lines:
        return ValueError(lines[-1].removeprefix("tokpack: "))
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return TaskLost(f"the process of task {task} of {tasks} {how}; run the same command again: the units done are "
                    "kept")


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """Every process ended: asked to stop (SIGTERM: each cleans up its temporary files), then killed."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_S
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _forward_warnings(log: IO[bytes]) -> None:
    """A task's warnings, each once, as the caller's own."""
    for line in dict.fromkeys(line for line in _lines(log) if line.startswith(WARNING)):
        warnings.warn(line.removeprefix(WARNING), stacklevel=4)


def _lines(log: IO[bytes]) -> list[str]:
    """What a task's process wrote to its stderr."""
    log.seek(0)
    return log.read().decode("utf-8", "replace").splitlines()


def _orphaned(parent: int) -> None:
    """Stop this task, as SIGTERM would, once the process that started it is gone."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> int:
    """A task's process: its task from standard input, run as ``tasks.run_task`` runs it."""
    threading.Thread(target=_orphaned, args=(os.getppid(),), daemon=True).start()
    asked = json.loads(sys.stdin.readline())

    def body() -> int:
        config = from_dict(PrepareConfig, asked["config"], "a task of --processes")
        fix_mmap_threshold()  # a process that only prepares: its peak stays flat
        run_task(dataclasses.replace(config, workers=asked["workers"], quiet=True), asked["task"],
                 lambda: sys.stdin.readline() == "go\n")  # end of input: the run was given up
        return 0

    return run_cli(body)


if __name__ == "__main__":
    raise SystemExit(main())
