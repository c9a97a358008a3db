"""The task contract of a prepare run: the one loop over a task's units (``work``, whoever
launches it), the folder readied once (``ready``), a task of ``--processes`` or Ray
(``run_task``), and a run shared by independent tasks: no process group, any scheduler.

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
import time
import warnings
from collections.abc import Callable

from ..format import Meta, UnitRecord, read_meta
from ..storage import is_url
from . import guard, tokenize
from .config import PrepareConfig
from .guard.placement import InputChanged, Placement
from .plan import Plan, input_folders, processes_plan
from .publish import ledger
from .publish.folder import LocalSink, OutputFolder, check_out_dir, finish, retire
from .publish.remote import Publisher, Spool, spooled
from .publish.sink import Sink


def finished(plan: Plan) -> Meta | None:
    """meta.json of the folder if this very run wrote it (its options, inputs and units)."""
    try:
        meta = read_meta(plan.out)
    except (OSError, ValueError):
        return None
    same = (meta.get("options") == json.loads(json.dumps(plan.config.output_options()))
            and meta.get("inputs", {}).get("listing_sha256") == plan.inputs["listing_sha256"]
            and len(meta.get("inputs", {}).get("units_sha256", [])) == plan.units)
    return meta if same else None


def ready(plan: Plan, shared: bool = False) -> None:
    """The folder readied, once, by the process that holds it (``OutputFolder``): it is checked;
    units of another run are dropped (or, where other tasks of this run may be at work in it,
    ``shared``, refused); and before a run whose units publish their files as they finish, an
    older meta.json and its files go."""
    out, config = plan.out, plan.config
    check_out_dir(out, config.force, plan.files, input_folders(config), ours=ledger.recorded_files(out))
    if shared and (foreign := ledger.foreign(out, plan.fingerprint)):
        raise ValueError(f"{out} holds {len(foreign)} units of a run with other options or inputs (its tasks "
                         "must share every option and see the same inputs); use the same options, or "
                         "another --out-dir")
    ledger.drop_foreign(out, plan.fingerprint)  # a killed run of other options: its shards must not stay
    if plan.sharded:
        # From the first unit on, the folder is being rewritten: an older meta.json and its files
        # must not describe it.
        retire(out, keep=ledger.recorded_files(out))


def run(plan: Plan, task: int, tasks: int, finalize: bool) -> Meta | None:
    """This task's units (task -1: none), then meta.json if every unit is done; the folder's
    meta.json, or None while units are missing (``finalize``: one line naming them)."""
    done = finished(plan)
    if done is not None:
        return done
    if task >= 0:
        with OutputFolder(plan.out, clean=False):  # other tasks' files in the making stay
            ready(plan, shared=True)
        work(plan, units_of(plan, task, tasks), LocalSink())
    return _finalize(plan, finalize)


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
        work(plan, units_of(plan, task, started(plan)), LocalSink())


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
            folder.fetch(plan, guard.SHARED)  # the guard's placement, decided by the run's own process
            work(plan, units_of(plan, task, started(plan)), folder, guard.shared(plan), signs=False)


def started(plan: Plan) -> int:
    """How many of a ``--processes`` run's tasks have work: one a unit at most."""
    return min(plan.config.launch.processes, plan.units)


def units_of(plan: Plan, task: int, tasks: int) -> range:
    """Task ``task``'s contiguous share of the run's units."""
    return range(task * plan.units // tasks, (task + 1) * plan.units // tasks)


def work(plan: Plan, wanted: range, sink: Sink, placement: Placement | None = None,
         signs: bool = True) -> dict[int, UnitRecord]:
    """The units ``wanted`` of the run, the one loop whoever launches it: the guard stage first
    (where each moved or dropped document goes, from the first unit's share of the work on;
    ``placement`` where the caller has it already), then each unit kept if ``sink`` holds it
    intact, else tokenized into it. A unit whose input changed since it was signed is signed
    again and the verdicts decided anew (``signs``: where this process holds the run's
    signatures). Their records."""
    if placement is None:
        placement = guard.placed(plan, wanted.start if wanted else 0)
    done = {}
    try:
        for unit in wanted:
            record = sink.kept(plan, unit, placement)
            if record is None:
                try:
                    record = tokenize.run_unit(plan, unit, placement)
                except InputChanged as changed:
                    if not signs:
                        raise
                    # Edited since another task signed it: signed again, matched and decided anew.
                    warnings.warn(f"the input of unit {changed.unit} changed since it was signed in {plan.out}; it is "
                                  "signed again", stacklevel=2)
                    placement = guard.placed(plan, unit)
                    record = tokenize.run_unit(plan, unit, placement)
                record = sink.keep(plan, record)
            done[unit] = record
    finally:
        sink.done()
    return done


def _finalize(plan: Plan, explicit: bool) -> Meta | None:
    if not explicit and not ledger.all_recorded(plan.out, plan.fingerprint, plan.units):
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
        # Decided again, not this task's: another task may have signed a changed input since.
        verdicts = guard.stage(plan)
        placement = verdicts.placement if verdicts is not None else None
        parts, missing = ledger.every([ledger.load(plan, unit, placement) for unit in range(plan.units)])
        if missing and not explicit:
            return None  # a recorded unit whose input changed since: its task does it again
        if missing:
            shown = ", ".join(map(str, missing[:8])) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            raise ValueError(f"{plan.out} lacks units {shown} of {plan.units} (not run yet, killed, or their input "
                             "changed): run the tasks that hold them, then --finalize")
        return finish(plan, parts, verdicts, LocalSink())
