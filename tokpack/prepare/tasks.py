"""A prepare run shared by independent tasks: no process group, any scheduler.

    python -m tokpack.prepare 's3://b/edu/*.parquet' --out-dir /shared/edu --tasks 64 --task 7
    sbatch --array=0-63 --wrap "python -m tokpack.prepare ... --out-dir /shared/edu"   # reads SLURM_ARRAY_*
    python -m tokpack.prepare ... --out-dir /shared/edu --tasks 64 --finalize

Each task runs its contiguous share of the run's units (as a torchrun rank would) into the same
folder, at any time, in any order, killed and rerun at will: a unit that is recorded, whose
input is unchanged and whose files verify, is kept. The folder lock is held only while a task
checks the folder, and while meta.json is written; the task that finds every unit recorded
writes meta.json (as ``--finalize`` does), so the folder reads as whole only once all are done.
Tasks must share every option and the inputs (checked: a unit recorded under others refuses
the task). The units are those of one process with the same ``--unit-mb`` (at least ``--tasks``),
so the folder is byte-identical to it.

See docs/cluster.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

from ..distributed import launched_world
from ..format import META_NAME, Meta, UnitRecord, read_meta
from ..storage import is_url
from . import units
from .config import Plan, PrepareConfig
from .folder import OutputFolder, check_out_dir, publish_parts, retire
from .plan import processes_plan
from .remote import Publisher, Spool, spooled


def place(config: PrepareConfig, environ: dict[str, str] | None = None) -> tuple[int, int] | None:
    """(task, tasks) from the options, else from a Slurm array's environment; None for a run of
    one process or of torchrun's."""
    env = os.environ if environ is None else environ
    task, tasks = config.task, config.tasks
    if tasks is None and "SLURM_ARRAY_TASK_ID" in env and "SLURM_ARRAY_TASK_COUNT" in env:
        try:
            first = int(env.get("SLURM_ARRAY_TASK_MIN", "0"))
            task, tasks = int(env["SLURM_ARRAY_TASK_ID"]) - first, int(env["SLURM_ARRAY_TASK_COUNT"])
        except ValueError:
            raise ValueError("SLURM_ARRAY_TASK_ID, _MIN and _COUNT in the environment are not whole numbers; "
                             "pass --task and --tasks") from None
        if not 0 <= task < tasks:
            raise ValueError(f"the Slurm array gives task {task} of {tasks} (a stepped --array?); pass --task and "
                             "--tasks")
    if tasks is None:
        if config.finalize:
            raise ValueError("--finalize writes meta.json of a run of independent tasks; give its --tasks N too")
        return None
    if launched_world() > 1:
        raise ValueError("--tasks runs without a process group; launch the tasks without torchrun")
    if task is None and not config.finalize:
        raise ValueError(f"--tasks {tasks} needs this task's --task (0..{tasks - 1}), or --finalize")
    return (-1 if task is None else task), tasks


def finished(plan: Plan) -> dict[str, Any] | None:
    """meta.json of the folder if this very run wrote it (its options, inputs and units)."""
    try:
        meta = read_meta(plan.out)
    except (OSError, ValueError):
        return None
    same = (meta.get("options") == json.loads(json.dumps(plan.config.output_options()))
            and meta.get("inputs", {}).get("listing_sha256") == plan.inputs["listing_sha256"]
            and len(meta.get("inputs", {}).get("units_sha256", [])) == plan.units)
    return meta if same else None


def _ready(plan: Plan) -> None:
    """Check the folder and clear what an older run published; another run's units refuse the task."""
    out, config = plan.out, plan.config
    with OutputFolder(out, clean=False):  # other tasks' files in the making stay
        check_out_dir(out, config.force, plan.files, [], ours=units.recorded_files(out))
        foreign = units.foreign(out, plan.fingerprint)
        if foreign:
            raise ValueError(f"{out} holds {len(foreign)} units of a run with other options or inputs (its tasks "
                             "must share every option and see the same inputs); use the same options, or "
                             "another --out-dir")
        if (out / META_NAME).exists():
            retire(out, keep=units.recorded_files(out))


def run(plan: Plan, task: int, tasks: int, finalize: bool,
        meta_of: Callable[[Plan, list[UnitRecord]], Meta]) -> dict[str, Any] | None:
    """This task's units (task -1: none), then meta.json (``meta_of`` the units' records) if every
    unit is done; the folder's meta.json, or None while units are missing (``finalize``: one line
    naming them)."""
    done = finished(plan)
    if done is not None:
        return done
    if task >= 0:
        _ready(plan)
        work(plan, task, tasks)
    return _finalize(plan, finalize, meta_of)


def run_task(config: PrepareConfig, task: int, cleared: Callable[[], bool] = lambda: True) -> None:
    """Task ``task`` of a ``--processes`` run, as an executor runs it: its units, those recorded
    and intact kept. The process that runs the run holds the folder and finishes it. ``cleared``
    is asked once the task's plan is made: it writes nothing unless the run's process says the
    folder is ready (False: the run was given up), so a task may start while the folder is readied.
    A run published to a URL by workers that share no disk (Ray's) has each task upload its units
    (``publish_task``)."""
    if config.out_dir is not None and is_url(config.out_dir):
        publish_task(config, task)
        return
    plan = quiet_plan(config)
    if cleared():
        work(plan, task, config.processes)


def quiet_plan(config: PrepareConfig) -> Plan:
    """A task's plan, without the warnings the run's own process gave when it made the same one."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return processes_plan(config, time.perf_counter())


def publish_task(config: PrepareConfig, task: int) -> None:
    """Task ``task`` of a sharded ``--processes`` run published to a URL by workers that share no
    disk (``--ray``): its share of the units made in a spool of this machine, each uploaded with its
    record while the next is tokenized, its shards then dropped; a unit uploaded already (a retried
    task) is kept. The run's own process holds the folder's lock and finishes it."""
    assert config.out_dir is not None
    folder = Publisher(config.out_dir, config.storage_options, config.force)
    with Spool(config.spool_dir) as spool:
        plan = quiet_plan(spooled(config, spool, folder))
        with OutputFolder(plan.out):
            folder.made(plan, units_of(plan, task, config.processes))


def units_of(plan: Plan, task: int, tasks: int) -> range:
    """Task ``task``'s contiguous share of the run's units."""
    return range(task * plan.units // tasks, (task + 1) * plan.units // tasks)


def work(plan: Plan, task: int, tasks: int) -> None:
    """Task ``task``'s units, each kept if recorded and intact."""
    for unit in units_of(plan, task, tasks):
        if units.load(plan, unit) is None:
            units.run_unit(plan, unit)


def _finalize(plan: Plan, explicit: bool, meta_of: Callable[[Plan, list[UnitRecord]], Meta]) -> dict[str, Any] | None:
    if not explicit and not units.all_recorded(plan.out, plan.fingerprint, plan.units):
        return None
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(OutputFolder(plan.out))
        except ValueError:
            if explicit:
                raise
            return None  # another task is writing meta.json now
        done = finished(plan)
        if done is not None:
            return done
        parts = [units.load(plan, unit) for unit in range(plan.units)]
        missing = [unit for unit, part in enumerate(parts) if part is None]
        if missing and not explicit:
            return None  # a recorded unit whose input changed since: its task does it again
        if missing:
            shown = ", ".join(map(str, missing[:8])) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            raise ValueError(f"{plan.out} lacks units {shown} of {plan.units} (not run yet, killed, or their input "
                             "changed): run the tasks that hold them, then --finalize")
        meta = meta_of(plan, parts)  # type: ignore[arg-type]
        publish_parts(plan.out, meta, parts, merge=True)  # type: ignore[arg-type]
        return meta
