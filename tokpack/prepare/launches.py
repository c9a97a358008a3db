"""How each launcher runs a prepare run's stages (``tokpack.prepare.run``), into a destination
decided once (``destination``): the local folder, or a local spool published to a URL, with
the ``Sink`` that takes the units and the finished folder. This process or every rank of
torchrun's group (``_prepare_ranks``), one of independent tasks (``tasks.run``), and the tasks
of ``--processes`` or Ray started from here (``_ProcessesRun``: it holds the folder while they
work, and finishes it). Each makes the plan, holds the folder once, runs its units through
``tasks.work`` (the guard stage, then the units) and ends in the one ``folder.finish``.

See docs/cluster.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

from tqdm import tqdm

from ..cli import USER_ERRORS
from ..distributed import process_group
from ..format import Meta, UnitRecord
from ..storage import is_url, redact
from . import guard, tasks
from .config import Launch, PrepareConfig
from .executors import Ready, TaskLost, choose
from .executors.torchrun import Ranks
from .guard import Verdicts
from .memory import children_peak_rss_mb, peak_rss_mb
from .plan import Plan, make_plan, processes_plan
from .plan.input_hash import input_sha256
from .plan.shares import share_of
from .publish import ledger
from .publish.folder import LocalSink, OutputFolder, finish
from .publish.remote import Publisher, Spool, spooled
from .publish.sink import Sink
from .tokenize.writers import remove_temporaries

SHORT_SPLIT = 256  # a split with fewer tokens is shorter than any useful training or evaluation window


class Where(NamedTuple):
    """Where a run writes, decided once: ``config`` as this process runs it (into the local
    folder, or the spool of a URL), ``sink`` for its units and its finished folder, ``units``
    where the tasks it starts leave theirs, and ``tasks``, the config those tasks are given."""

    config: PrepareConfig
    sink: Sink
    units: Sink
    tasks: PrepareConfig


@contextlib.contextmanager
def destination(config: PrepareConfig, launch: Launch) -> Iterator[Where]:
    """The run's destination: its local folder; or, for a URL ``--out-dir``, a local folder of
    the URL's last name in a spool, published by a ``Publisher`` that holds the remote folder's
    lock for the run (``tokpack.prepare.publish.remote``). The tasks of ``--processes`` make the
    folder in this spool; Ray's, whose workers share no disk, each upload their own units."""
    if config.out_dir is None or not is_url(config.out_dir):
        yield Where(config, LocalSink(), LocalSink(), config)
        return
    if launch in (Launch.TASKS, Launch.TORCHRUN):
        raise ValueError(f"--out-dir {redact(config.out_dir)} is written by one process; run it without --tasks "
                         "and torchrun, or prepare into a shared folder")
    if config.format == "megatron":
        raise ValueError("--format megatron writes one .bin/.idx pair a split on one disk; publish flat or llmc "
                         "folders to a URL, or prepare locally and copy")
    folder = Publisher(config.out_dir, config.storage_options, config.force)
    with Spool(config.spool_dir) as spool:
        local = spooled(config, spool, folder)
        folder.begin()
        try:
            yield (Where(local, folder, folder, config) if launch == Launch.RAY else
                   Where(local, folder, LocalSink(), local))
        finally:
            folder.release()


def _prepare_ranks(where: Where, started: float) -> dict[str, Any]:
    """This process, or every rank of torchrun's group, each its share of the units."""
    with process_group() as dist:
        ranks = Ranks(dist)
        plans: list[Plan] = []
        # On every rank, so that an input one rank cannot read fails them all, not just that one.
        ranks.together(lambda: plans.append(make_plan(where.config, ranks.world, started)))
        plan = plans[0]
        ranks.check_same_inputs(plan.files)
        meta = _run(plan, ranks, where.sink)
    return _result(meta, plan, started, ranks.leader)


def _prepare_task(where: Where, started: float) -> dict[str, Any]:
    """One independent task of a run (``tokpack.prepare.tasks``): its units, and meta.json once
    every unit is done; the result's ``splits`` are absent while units are missing."""
    config = where.config
    place = config.launch.place()
    assert place is not None
    plan = make_plan(config, place.tasks, started, independent=True)
    meta = tasks.run(plan, place.task, place.tasks, config.launch.finalize)
    if meta is None:
        done = len(ledger.recorded(plan.out, plan.fingerprint))
        return {"stats": {"seconds": time.perf_counter() - started, "out_dir": str(plan.out), "leader": True,
                          "units_done": done, "units": plan.units, "task": place.task, "tasks": place.tasks}}
    return _result(meta, plan, started, True)


def _prepare_started(where: Where, started: float) -> dict[str, Any]:
    """The tasks of ``--processes`` or Ray, started here, this process holding the folder: while
    the tasks start it makes the plan and clears the folder as one process would, keeping the
    units a killed run recorded; it finishes the folder as one process writes it: a flat run's
    units joined into its flat files, the whole input's sha256 taken in a thread while the tasks
    run (a read at disk speed beside N encoders)."""
    config = where.config
    run = _ProcessesRun(where, started)
    with contextlib.ExitStack() as held:
        try:
            choose(config).run(where.tasks, config.launch.processes, lambda: run.ready(held), run.tick)
            meta = run.finish()
        except BaseException as exc:
            run.failed(exc)
            raise
    assert run.plan is not None
    result = _result(meta, run.plan, started, True)
    result["stats"]["processes"] = tasks.started(run.plan)
    if config.launch.ray is None:  # Ray's workers are its own children, not this process's
        result["stats"]["task_peak_rss_mb"] = children_peak_rss_mb()
    return result


LAUNCHERS: dict[Launch, Callable[[Where, float], dict[str, Any]]] = {
    Launch.HERE: _prepare_ranks, Launch.TORCHRUN: _prepare_ranks, Launch.TASKS: _prepare_task,
    Launch.PROCESSES: _prepare_started, Launch.RAY: _prepare_started}


class _ProcessesRun:
    """The run's own process's part in a ``--processes`` or Ray run: ready, progress, finish."""

    def __init__(self, where: Where, started: float):
        self.where, self.started = where, started
        self.plan: Plan | None = None
        self.stop = threading.Event()
        self.whole: Future[str] | None = None
        self.bar: Any = None
        self.shares: list[int] = []
        self.verdicts: Verdicts | None = None  # the guard's, where this process decided them

    def ready(self, held: contextlib.ExitStack) -> Ready:
        """The plan, the folder locked (``held`` until the run ends) and cleared, and the whole
        input's hash under way for a flat run; where the tasks share no disk with this process,
        the guard stage run here and its placement shared with them. A task of the run may then
        run here (``here``), and as many as have work run."""
        config = self.where.config
        plan = self.plan = processes_plan(config, self.started)
        held.enter_context(OutputFolder(plan.out))
        tasks.ready(plan)
        if self.where.units.apart:
            self.verdicts = guard.stage(plan)
            if self.verdicts is not None:
                self.where.units.share(plan, guard.SHARED)
        if config.one_file_a_split():
            hashing = held.enter_context(ThreadPoolExecutor(1, thread_name_prefix="tokpack-input-hash"))
            self.whole = hashing.submit(input_sha256, share_of(plan.files, plan.sizes, 0, 1), self.stop)
        self.shares = [sum((plan.sizes[f] if hi is None else hi) - lo for f, lo, hi in plan.share(unit))
                       for unit in range(plan.units)]
        on = "on Ray" if config.launch.ray is not None else "processes"
        self.bar = held.enter_context(tqdm(total=sum(self.shares), unit="B", unit_scale=True, file=sys.stderr,
                                           disable=config.quiet or None,
                                           desc=f"tokpack.prepare ({tasks.started(plan)} {on})"))
        return Ready(None if self.where.units.apart else self.here, tasks.started(plan))

    def here(self, task: int, workers: int) -> None:
        """Task ``task`` in this process, on the run's plan, as quiet as a task's own process."""
        assert self.plan is not None
        config = dataclasses.replace(self.plan.config, workers=workers, quiet=True)
        tasks.work(dataclasses.replace(self.plan, config=config, workers=workers),
                   tasks.units_of(self.plan, task, tasks.started(self.plan)), self.where.units)

    def tick(self) -> None:
        """The bar at the input bytes of the units recorded, read from the records' names alone."""
        if self.plan is not None:
            done = sum(self.shares[u] for u in self.where.units.numbered(self.plan) if u < len(self.shares))
            self.bar.update(done - self.bar.n)

    def finish(self) -> Meta:
        plan = self.plan
        assert plan is not None
        # Every task has ended: a temporary file still here is a lost one's (a worker Ray killed
        # mid-match, whose task ran again elsewhere), and must not stay in the published folder.
        remove_temporaries(plan.out, every_run=True)
        verdicts = self.verdicts if self.verdicts is not None else guard.stage(plan)
        kept, lost = self.where.units.recorded(plan, verdicts.placement if verdicts is not None else None)
        if lost:
            raise TaskLost(f"units {lost[:8]} of the run are not as their tasks recorded them; run the same command "
                           "again: it redoes them")
        self.tick()
        return finish(plan, kept, verdicts, self.where.sink, self.whole.result if self.whole is not None else None)

    def failed(self, exc: BaseException) -> None:
        """Every task has ended: their temporaries are leftovers; after a user error the run's
        units go, as one process's do (the fix changes the run anyway), a lost task's stay."""
        self.stop.set()
        if self.plan is None:
            return
        remove_temporaries(self.plan.out, every_run=True)
        if isinstance(exc, USER_ERRORS) and not isinstance(exc, TaskLost):
            ledger.drop_own(self.plan.out, self.plan.fingerprint)


def _result(meta: Mapping[str, Any], plan: Plan, started: float, leader: bool) -> dict[str, Any]:
    for split, info in meta["splits"].items():
        if info["tokens"] < SHORT_SPLIT:
            warnings.warn(f"the {split} split holds only {info['tokens']} tokens, shorter than most useful windows; "
                          "give it more (--val-fraction, --val-tokens, --val-inputs) or add documents", stacklevel=2)
    elapsed = time.perf_counter() - started
    tokens = sum(s["tokens"] for s in meta["splits"].values())
    return {**meta, "stats": {"seconds": elapsed, "tokens_per_s": tokens / elapsed, "peak_rss_mb": peak_rss_mb(),
                              "workers": plan.workers, "processes": plan.config.launch.processes, "out_dir": str(plan.out),
                              "leader": leader}}


def _run(plan: Plan, ranks: Ranks, sink: Sink) -> Meta:
    """Tokenize this rank's units; the leader then publishes every unit's files, meta.json last."""
    with OutputFolder(plan.out) if ranks.leader else contextlib.nullcontext():
        # Every rank waits until the leader holds the folder and has checked and cleared it.
        ranks.together(lambda: tasks.ready(plan), leader_only=True)
        done: dict[int, UnitRecord] = {}
        units = ranks.units(plan.units)
        decided: list[Verdicts | None] = []

        def work() -> None:
            if ranks.leader:  # the verdicts whole, for its finish; the other ranks read their placement
                decided.append(guard.stage(plan, units.start if units else 0))
            done.update(tasks.work(plan, units, sink, decided[0].placement if decided and decided[0] else None))

        try:
            ranks.together(work)
            every = {unit: part for parts in ranks.gather(done) for unit, part in parts.items()}
            parts = [every[unit] for unit in range(plan.units)]
            finished: list[Meta] = []  # on the leader, whose meta.json it is
            ranks.together(lambda: finished.append(finish(plan, parts, guard.fresh(plan, decided[0]), sink)),
                           leader_only=True)
            meta = ranks.gather(finished[0] if finished else None)[0]
        except USER_ERRORS:
            remove_temporaries(plan.out)
            if ranks.leader:  # its units and signatures: a killed or terminated run keeps them instead
                ledger.drop_own(plan.out, plan.fingerprint)
            raise
        except BaseException:
            remove_temporaries(plan.out)  # the leader's folder does it too; the other ranks' files are theirs
            if ranks.leader and not plan.sharded:  # a flat run resumes nothing: its signatures go with it
                ledger.drop_own(plan.out, plan.fingerprint)
            raise
    return meta
