"""What an executor is (``Executor``), and the error of a task that was lost rather than failed."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from ..config import PrepareConfig


# Runs a task (the first argument) in the caller's own process, on the plan it has made, with
# that many encoding threads (the second): one interpreter's start-up and plan fewer.
Here = Callable[[int, int], None]


class Ready(NamedTuple):
    """The caller's answer once the folder is ready: where it runs a task itself (``here``, or
    None), and how many of the tasks asked for have work (the run's units may be fewer)."""

    here: Here | None
    tasks: int


class Executor(Protocol):
    """Runs every task of a run to its end."""

    def run(self, config: PrepareConfig, tasks: int, ready: Callable[[], Ready],
            tick: Callable[[], None]) -> None:
        """Tasks 0 to ``tasks`` - 1 of ``config``'s run, each to its end, but those ``ready`` says
        have no work, which never run. ``ready`` (the caller readying the folder) is called once,
        as early as the tasks' start-up allows, and no task writes before it returns; where it
        offers a ``Here``, an executor whose tasks share the caller's machine and disk may run one
        of them through it. ``tick`` is called now and then
        while they run (the caller's progress). Raises ``ready``'s error or the first failed
        task's, the others stopped; on KeyboardInterrupt or SIGTERM every task is stopped before it
        returns."""
        ...


class TaskLost(ChildProcessError):
    """A task's process ended without its result (killed, out of memory): not the input's fault, so
    the units the run finished are kept for a rerun. An OSError: the CLIs make it one line."""
