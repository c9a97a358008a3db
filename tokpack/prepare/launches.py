"""How each launcher runs a prepare run's stages (``tokpack.prepare.run``): this process or every
rank of torchrun's group (``_run``), one of independent tasks (``tasks.run``), the tasks of
``--processes`` or Ray started from here (``_ProcessesRun``: it holds the folder while they work,
and finishes it), and a run published to a URL from a local spool. Each makes the plan, holds
the folder once, runs its units through ``tasks.work`` (the guard stage, then the units) and
ends in ``folder.finish``; only the remote one of several tasks (Ray's, whose workers share no
disk) finishes from the records they uploaded.

See docs/cluster.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..cli import USER_ERRORS
from ..distributed import process_group
from ..format import UNIT_RECORD, Meta, UnitRecord, meta_files
from ..storage import redact
from . import guard, tasks
from .config import Launch, PrepareConfig
from .executors import Ready, TaskLost, choose
from .executors.torchrun import Ranks
from .guard import Verdicts
from .memory import children_peak_rss_mb, peak_rss_mb
from .plan import Join, Plan, make_plan, processes_plan
from .plan.input_hash import input_sha256
from .plan.shares import share_of
from .publish import ledger
from .publish.folder import OutputFolder, finish, merged_indexes
from .publish.meta import meta_of
from .publish.remote import Publisher, Spool, spooled
from .tokenize.writers import remove_temporaries

LISTING_S = 2.0  # how often a run on Ray lists its remote folder for the units uploaded
SHORT_SPLIT = 256  # a split with fewer tokens is shorter than any useful training or evaluation window


def _prepare_ranks(config: PrepareConfig, started: float) -> dict[str, Any]:
    """This process, or every rank of torchrun's group, each its share of the units."""
    with process_group() as dist:
        ranks = Ranks(dist)
        plans: list[Plan] = []
        # On every rank, so that an input one rank cannot read fails them all, not just that one.
        ranks.together(lambda: plans.append(make_plan(config, ranks.world, started)))
        plan = plans[0]
        ranks.check_same_inputs(plan.files)
        meta = _run(plan, ranks)
    return _result(meta, plan, started, ranks.leader)


def _prepare_task(config: PrepareConfig, started: float) -> dict[str, Any]:
    """One independent task of a run (``tokpack.prepare.tasks``): its units, and meta.json once
    every unit is done; the result's ``splits`` are absent while units are missing."""
    place = config.launch.place()
    assert place is not None
    plan = make_plan(config, place.tasks, started, independent=True)
    meta = tasks.run(plan, place.task, place.tasks, config.launch.finalize)
    if meta is None:
        done = len(ledger.recorded(plan.out, plan.fingerprint))
        return {"stats": {"seconds": time.perf_counter() - started, "out_dir": str(plan.out), "leader": True,
                          "units_done": done, "units": plan.units, "task": place.task, "tasks": place.tasks}}
    return _result(meta, plan, started, True)


def _prepare_started(config: PrepareConfig, started: float) -> dict[str, Any]:
    """The tasks of ``--processes`` or Ray, started here, and the folder finished here."""
    meta, plan = _prepare_processes(config, started)
    return _processes_result(meta, plan, started)


LOCAL: dict[Launch, Callable[[PrepareConfig, float], dict[str, Any]]] = {
    Launch.HERE: _prepare_ranks, Launch.TORCHRUN: _prepare_ranks, Launch.TASKS: _prepare_task,
    Launch.PROCESSES: _prepare_started, Launch.RAY: _prepare_started}


def _prepare_processes(config: PrepareConfig, started: float) -> tuple[Meta, Plan]:
    """A run as ``--processes`` tasks (``executors``), this process holding the folder: while
    the tasks start it makes the plan and clears the folder as one process would, keeping the
    units a killed run recorded; it finishes the folder as one process writes it: a flat run's
    units joined into its flat files, the whole input's sha256 taken in a thread while the tasks
    run (a read at disk speed beside N encoders)."""
    run = _ProcessesRun(config, started)
    with contextlib.ExitStack() as held:
        try:
            choose(config).run(config, config.launch.processes, lambda: run.ready(held), run.tick)
            meta = run.finish()
            assert run.plan is not None
            return meta, run.plan
        except BaseException as exc:
            run.failed(exc)
            raise


class _ProcessesRun:
    """The run's own process's part in a ``--processes`` run: ready, progress, finish."""

    def __init__(self, config: PrepareConfig, started: float):
        self.config, self.started = config, started
        self.plan: Plan | None = None
        self.stop = threading.Event()
        self.whole: Future[str] | None = None
        self.bar: Any = None
        self.shares: list[int] = []
        self.verdicts: Verdicts | None = None  # the guard's, where a task ran here

    def ready(self, held: contextlib.ExitStack) -> Ready:
        """The plan, the folder locked (``held`` until the run ends) and cleared, and the whole
        input's hash under way for a flat run; a task of the run may then run here (``here``), and
        as many as have work run."""
        plan = self.plan = processes_plan(self.config, self.started)
        held.enter_context(OutputFolder(plan.out))
        tasks.ready(plan)
        if self.config.one_file_a_split():
            hashing = held.enter_context(ThreadPoolExecutor(1, thread_name_prefix="tokpack-input-hash"))
            self.whole = hashing.submit(input_sha256, share_of(plan.files, plan.sizes, 0, 1), self.stop)
        self.shares = [sum((plan.sizes[f] if hi is None else hi) - lo for f, lo, hi in plan.share(unit))
                       for unit in range(plan.units)]
        self.bar = held.enter_context(tqdm(total=sum(self.shares), unit="B", unit_scale=True, file=sys.stderr,
                                           disable=self.config.quiet or None,
                                           desc=f"tokpack.prepare ({tasks.started(plan)} processes)"))
        return Ready(self.here, tasks.started(plan))

    def here(self, task: int, workers: int) -> None:
        """Task ``task`` in this process, on the run's plan, as quiet as a task's own process."""
        assert self.plan is not None
        config = dataclasses.replace(self.plan.config, workers=workers, quiet=True)
        _, self.verdicts = tasks.work(dataclasses.replace(self.plan, config=config, workers=workers),
                                      tasks.units_of(self.plan, task, tasks.started(self.plan)))

    def tick(self) -> None:
        """The bar at the input bytes of the units recorded, read from the records' names alone."""
        if self.plan is not None:
            done = sum(self.shares[u] for u in ledger.numbered(self.plan.out) if u < len(self.shares))
            self.bar.update(done - self.bar.n)

    def finish(self) -> Meta:
        plan = self.plan
        assert plan is not None
        self.tick()
        verdicts = self.verdicts if self.verdicts is not None else guard.stage(plan)
        kept, lost = ledger.every([ledger.load(plan, unit, verdicts, proven=True) for unit in range(plan.units)])
        if lost:
            raise TaskLost(f"units {lost[:8]} of {plan.out} are not as their tasks recorded them; run the same "
                           "command again: it redoes them")
        return finish(plan, kept, verdicts, self.whole.result if self.whole is not None else None)

    def failed(self, exc: BaseException) -> None:
        """Every task has ended: their temporaries are leftovers; after a user error the run's
        units go, as one process's do (the fix changes the run anyway), a lost task's stay."""
        self.stop.set()
        if self.plan is None:
            return
        remove_temporaries(self.plan.out, every_run=True)
        if isinstance(exc, USER_ERRORS) and not isinstance(exc, TaskLost):
            ledger.drop_own(self.plan.out, self.plan.fingerprint)


def _processes_result(meta: Meta, plan: Plan, started: float) -> dict[str, Any]:
    result = _result(meta, plan, started, True)
    result["stats"]["processes"] = tasks.started(plan)
    if plan.config.launch.ray is None:  # Ray's workers are its own children, not this process's
        result["stats"]["task_peak_rss_mb"] = children_peak_rss_mb()
    return result


def remote(config: PrepareConfig, launch: Launch, started: float) -> dict[str, Any]:
    """A run published to a remote folder (``tokpack.prepare.publish.remote``): the same run as into a
    local folder of the URL's last name, in a local spool, then uploaded; a sharded run of one
    process uploads each unit as it finishes, one of ``--processes`` its finished folder, and one
    on Ray has each task upload its units from its own worker's spool."""
    assert config.out_dir is not None
    if launch in (Launch.TASKS, Launch.TORCHRUN):
        raise ValueError(f"--out-dir {redact(config.out_dir)} is written by one process; run it without --tasks "
                         "and torchrun, or prepare into a shared folder")
    if config.format == "megatron":
        raise ValueError("--format megatron writes one .bin/.idx pair a split on one disk; publish flat or llmc "
                         "folders to a URL, or prepare locally and copy")
    folder = Publisher(config.out_dir, config.storage_options, config.force)
    with Spool(config.spool_dir) as spool:
        local = spooled(config, spool, folder)
        # --processes here: its plan is made, and checked, once the folder is locked.
        plan = (None if launch == Launch.PROCESSES else processes_plan(local, started) if launch == Launch.RAY
                else make_plan(local, 1, started))
        folder.begin()
        try:
            if plan is None:  # the whole folder in the spool, then uploaded
                meta, plan = _prepare_processes(local, started)
                folder.publish(plan.out, meta, [f["file"] for f in meta_files(meta["splits"])], [])
            else:
                meta = (_publish_tasks(config, plan, folder) if launch == Launch.RAY else
                        _publish_units(plan, folder) if plan.join is Join.MERGE else _publish_flat(plan, folder))
        finally:
            folder.release()
    started_here = launch in (Launch.PROCESSES, Launch.RAY)
    result = _processes_result(meta, plan, started) if started_here else _result(meta, plan, started, True)
    result["stats"]["out_dir"] = redact(config.out_dir)
    return result


def _publish_flat(plan: Plan, folder: Publisher) -> Meta:
    """A flat run made whole in the spool, as a local run makes it, then its files uploaded."""
    with process_group() as dist:
        meta = _run(plan, Ranks(dist))
    folder.publish(plan.out, meta, [f["file"] for f in meta_files(meta["splits"])], [])
    return meta


def _publish_units(plan: Plan, folder: Publisher) -> Meta:
    """A sharded run's units, each uploaded while the next is tokenized (at most two units' shards
    in the spool), those a killed run uploaded kept; then the merged indexes and meta.json."""
    with OutputFolder(plan.out):
        done, verdicts = tasks.work(plan, range(plan.units), folder)
        return _finish_units(plan, folder, [done[unit] for unit in range(plan.units)], verdicts)


def _publish_tasks(config: PrepareConfig, plan: Plan, folder: Publisher) -> Meta:
    """A sharded, unguarded run's tasks on workers that share no disk, each uploading its units
    (``tasks.publish_task``); then the units' records and index parts fetched from the folder,
    and the merged indexes and meta.json."""
    bar = tqdm(total=plan.units, unit="unit", file=sys.stderr, disable=config.quiet or None,
               desc=f"tokpack.prepare ({config.launch.processes} tasks on Ray)")
    listed = 0.0

    def tick() -> None:  # a listing of the folder every few seconds: the records uploaded
        nonlocal listed
        if time.monotonic() - listed >= LISTING_S:
            listed = time.monotonic()
            bar.update(folder.uploaded() - bar.n)

    with bar:
        choose(config).run(config, config.launch.processes, lambda: Ready(None, tasks.started(plan)), tick)
        folder.refresh()
        with OutputFolder(plan.out):
            kept, lost = ledger.every([folder.kept(plan, unit, None)  # unguarded: see config
                                       for unit in range(plan.units)])
            if lost:
                raise TaskLost(f"units {lost[:8]} of {redact(folder.where)} were not uploaded as their tasks recorded "
                               "them; run the same command again: it redoes them")
            bar.update(plan.units - bar.n)
            return _finish_units(plan, folder, kept, None)  # signatures are matched on one disk: refused


def _finish_units(plan: Plan, folder: Publisher, parts: list[UnitRecord], verdicts: Verdicts | None) -> Meta:
    """meta.json of a sharded run's uploaded units, the indexes merged from their parts (in the
    spool), and both published; the units' records and parts then go."""
    meta = meta_of(plan, parts, verdicts)
    indexes = []
    for tmp, final in merged_indexes(plan.out, meta, parts):
        os.replace(tmp, final)
        indexes.append(Path(final).name)
    indexes += [info["guard"]["file"] for info in meta["splits"].values() if "guard" in info]
    leftovers = [UNIT_RECORD.format(unit) for unit in range(len(parts))]
    leftovers += [part["idx"]["file"] for record in parts for part in record["splits"].values()]
    folder.publish(plan.out, meta, indexes, leftovers)
    return meta


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


def _run(plan: Plan, ranks: Ranks) -> Meta:
    """Tokenize this rank's units; the leader then publishes every unit's files, meta.json last."""
    with OutputFolder(plan.out) if ranks.leader else contextlib.nullcontext():
        # Every rank waits until the leader holds the folder and has checked and cleared it.
        ranks.together(lambda: tasks.ready(plan), leader_only=True)
        done: dict[int, UnitRecord] = {}
        decided: list[Verdicts | None] = []

        def work() -> None:
            found, verdicts = tasks.work(plan, ranks.units(plan.units))
            done.update(found)
            decided.append(verdicts)

        try:
            ranks.together(work)
            every = {unit: part for parts in ranks.gather(done) for unit, part in parts.items()}
            parts = [every[unit] for unit in range(plan.units)]
            finished: list[Meta] = []  # on the leader, whose meta.json it is
            ranks.together(lambda: finished.append(finish(plan, parts, decided[0])), leader_only=True)
            meta = ranks.gather(finished[0] if finished else None)[0]
        except USER_ERRORS:
            remove_temporaries(plan.out)
            if ranks.leader:  # its units and signatures: a killed or terminated run keeps them instead
                ledger.drop_own(plan.out, plan.fingerprint)
            raise
        except BaseException:
            remove_temporaries(plan.out)  # the leader's folder does it too; the other ranks' files are theirs
            raise
    return meta
