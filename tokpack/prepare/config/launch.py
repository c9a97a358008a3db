"""How a prepare run is launched: its options as one checked group (the ``[launch]`` table), and
which of the five ways this process runs, decided once.

    python -m tokpack.prepare corpus/ --processes 8                    # Launch.PROCESSES
    python -m tokpack.prepare corpus/ --processes 8 --ray auto         # Launch.RAY
    python -m tokpack.prepare corpus/ --tasks 64 --task 7              # Launch.TASKS (or a Slurm array)
    torchrun --nproc-per-node 8 -m tokpack.prepare corpus/             # Launch.TORCHRUN
    python -m tokpack.prepare corpus/                                  # Launch.HERE

See docs/cluster.md.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from ...distributed import launched_world
from ...options import option

# More tasks than this is a typo, not a run: each is a process or a scheduler's job.
MAX_TASKS = 1 << 16


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class Launch(enum.Enum):
    """Who runs the run's units: this process; every rank of torchrun's group; this task of
    independent ones; ``--processes`` of this machine, or Ray's tasks, started by this process."""

    HERE = "here"
    TORCHRUN = "torchrun"
    TASKS = "tasks"
    PROCESSES = "processes"
    RAY = "ray"


class Place(NamedTuple):
    """This process's part of a run of independent tasks: ``task`` (-1 for ``--finalize`` alone)
    of ``tasks``."""

    task: int
    tasks: int


@dataclass(frozen=True)
class LaunchOptions:
    """How the run is launched (the ``[launch]`` table of a config); the flags keep their names."""

    processes: int = option(1, "run as N tasks, each a process of this machine (a Ray task with --ray), and "
                            "finish the folder: the same files as one process; where the cost is Python "
                            "(conversations) every core (1: one process, its threads)")
    ray: str | None = option(None, "run the --processes tasks on a Ray cluster (tokpack[ray]): HOST:PORT, its head's "
                             "GCS address; auto, the one this machine belongs to; local, one started here for the run "
                             "(default: none, this machine's processes)")
    tasks: int | None = option(None, "how many independent tasks share the run, each any time, in any order, "
                               "rerun at will (default: SLURM_ARRAY_TASK_COUNT in a Slurm array)")
    task: int | None = option(None, "this task's number, 0 to --tasks - 1, of a run shared by independent tasks "
                              "(default: SLURM_ARRAY_TASK_ID less SLURM_ARRAY_TASK_MIN in a Slurm array)")
    finalize: bool = option(False, "write meta.json of a run of --tasks once every unit is done (the task that "
                            "finishes the last unit does it too)")

    def __post_init__(self) -> None:
        for flag, n in (("--processes", self.processes), ("--tasks", self.tasks)):
            if n is not None and not 1 <= n <= MAX_TASKS:
                raise ValueError(f"{flag} {n:,} must lie in 1..{MAX_TASKS:,}; give the number of processes or "
                                 "tasks that run at once")
        if self.task is not None and (self.tasks is None or not 0 <= self.task < self.tasks):
            raise ValueError(f"--task {self.task} must lie in 0..{'--tasks - 1' if self.tasks is None else self.tasks - 1}"
                             f"{'; give --tasks N too' if self.tasks is None else ''}")
        host, _, port = (self.ray or "").rpartition(":")
        if self.ray is not None and self.ray not in ("auto", "local") and not (host and port.isascii() and port.isdigit()):
            raise ValueError(f"--ray {self.ray!r} is not HOST:PORT (the head's GCS address, as ray start --head "
                             "prints it), auto or local")
        if not self.starts_tasks:
            return
        given = [flag for flag, used in (("--tasks", self.tasks is not None), ("--task", self.task is not None),
                                         ("--finalize", self.finalize)) if used]
        if given:
            raise ValueError(f"--processes {self.processes} runs every task of the run and finishes the folder itself; "
                             f"it does not take {', '.join(given)}: drop one")

    @property
    def starts_tasks(self) -> bool:
        """Whether this process starts the run's tasks (``--processes`` or ``--ray``)."""
        return self.processes > 1 or self.ray is not None

    def on_the_cores(self) -> LaunchOptions:
        """These options with no more processes of this machine than it has cores: more would only
        take memory and start-up (the folder is the same for any number)."""
        if self.ray is not None or self.processes <= cores():
            return self
        warnings.warn(f"--processes {self.processes:,} is more than this machine's {cores()} cores: running "
                      f"{cores()} (the folder is the same for any number)", stacklevel=4)
        return dataclasses.replace(self, processes=cores())

    def place(self, environ: Mapping[str, str] | None = None) -> Place | None:
        """This task's place among independent tasks, from the options, else from a Slurm array's
        environment; None where the run is not one of independent tasks."""
        env = os.environ if environ is None else environ
        task, tasks = self.task, self.tasks
        if tasks is None and not self.starts_tasks and "SLURM_ARRAY_TASK_ID" in env \
                and "SLURM_ARRAY_TASK_COUNT" in env:
            try:
                first = int(env.get("SLURM_ARRAY_TASK_MIN", "0"))
                task, tasks = int(env["SLURM_ARRAY_TASK_ID"]) - first, int(env["SLURM_ARRAY_TASK_COUNT"])
            except ValueError:
                raise ValueError("SLURM_ARRAY_TASK_ID, _MIN and _COUNT in the environment are not whole numbers; "
                                 "pass --task and --tasks") from None
            if not 0 <= task < tasks:
                raise ValueError(f"the Slurm array gives task {task} of {tasks} (a stepped --array?); pass --task "
                                 "and --tasks")
        if tasks is None:
            if self.finalize:
                raise ValueError("--finalize writes meta.json of a run of independent tasks; give its --tasks N too")
            return None
        if task is None and not self.finalize:
            raise ValueError(f"--tasks {tasks} needs this task's --task (0..{tasks - 1}), or --finalize")
        return Place(-1 if task is None else task, tasks)

    def kind(self, environ: Mapping[str, str] | None = None) -> Launch:
        """Which way this process runs the run, decided once: the options, then the environment."""
        if self.starts_tasks:
            if launched_world() > 1:
                raise ValueError(f"--processes {self.processes} starts its own processes; run it without torchrun")
            return Launch.RAY if self.ray is not None else Launch.PROCESSES
        if self.place(environ) is not None:
            if launched_world() > 1:
                raise ValueError("--tasks runs without a process group; launch the tasks without torchrun")
            return Launch.TASKS
        return Launch.TORCHRUN if launched_world() > 1 else Launch.HERE
