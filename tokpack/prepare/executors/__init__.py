"""Who runs the tasks of a prepare run that ``--processes`` shares out: processes on this machine
(``local``), or a Ray cluster (``ray``). An executor knows the task model alone: it runs
``tasks.run_task(config, i)`` for every task i (or, on the run's own machine, one of them through
the run's ``Here``), in any order, at once or not, and raises the first task's error; the run
itself (the folder's lock, what is kept, the finish) is ``prepare()``'s.

    python -m tokpack.prepare corpus/ --out-dir data/web --processes 8

See docs/cluster.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Executor, Here, Ready, TaskLost

if TYPE_CHECKING:
    from ..config import PrepareConfig

__all__ = ["Executor", "Here", "Ready", "TaskLost", "choose"]


def choose(config: PrepareConfig) -> Executor:
    """The executor ``config`` asks for: Ray's with ``--ray``, else this machine's processes."""
    if config.launch.ray is not None:
        from .ray import RayTasks

        return RayTasks(config.launch.ray)
    from .local import LocalProcesses

    return LocalProcesses()
