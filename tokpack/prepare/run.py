"""The prepare run: one plan, this rank's units, then the leader publishes the folder.

    python -m tokpack.prepare docs/ --out-dir data/web

``prepare(config)`` decides everything once (``make_plan``), tokenizes this process's units, and
has the leader (rank 0, or the only process) merge and publish them, meta.json last, verified.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..version import __version__
from ..cli import USER_ERRORS
from ..corpus import is_parquet, parquet_row_groups
from ..distributed import launched_world, process_group
from ..format import (FORMAT_VERSION, GUARD_REPORT, SPLITS, UNIT_RECORD, FileEntry, Meta, SplitInfo, UnitRecord,
                      every_file)
from ..storage import is_url, redact
from . import holdout, tasks, units
from .cluster import Ranks, share_of
from .config import Plan, PrepareConfig
from .executors import Here, TaskLost, choose
from .folder import OutputFolder, check_out_dir, flattened, merged_indexes, mixed, publish_parts, retire
from .guard import Guard
from .chats import CHAT_COUNTS
from .input_hash import input_sha256
from .plan import default_workers, input_folders, make_plan, processes_plan
from .process import children_peak_rss_mb, peak_rss_mb
from .remote import Publisher, Spool, spooled
from .writers import HashingWriter, remove_temporaries

LISTING_S = 2.0  # how often a run on Ray lists its remote folder for the units uploaded
SHORT_SPLIT = 256  # a split with fewer tokens is shorter than any useful training or evaluation window


def prepare(config: PrepareConfig) -> dict[str, Any]:
    """Run the whole preparation; returns meta.json's content plus a ``stats`` entry.

    On one process, under torchrun on every rank of its group (joined here, gloo), as one of
    independent tasks (``--tasks``, ``tokpack.prepare.tasks``), or as ``--processes`` of this
    machine (``tokpack.prepare.executors``).
    """
    started = time.perf_counter()
    config = _on_the_cores(config)
    shared = tasks.place(config) if config.processes == 1 and config.ray is None else None
    if config.out_dir is not None and is_url(config.out_dir):
        if shared is not None or launched_world() > 1:
            raise ValueError(f"--out-dir {redact(config.out_dir)} is written by one process; run it without --tasks "
                             "and torchrun, or prepare into a shared folder")
        return _prepare_remote(config, started)
    if config.processes > 1 or config.ray is not None:
        meta, plan = _prepare_processes(config, started)
        return _processes_result(meta, plan, started)
    if shared is not None:
        return _prepare_task(config, *shared, started)
    with process_group() as dist:
        ranks = Ranks(dist)
        plans: list[Plan] = []
        # On every rank, so that an input one rank cannot read fails them all, not just that one.
        ranks.together(lambda: plans.append(make_plan(config, ranks.world, started)))
        plan = plans[0]
        ranks.check_same_inputs(plan.files)
        meta = _run(plan, ranks)
    return _result(meta, plan, started, ranks.leader)


def _on_the_cores(config: PrepareConfig) -> PrepareConfig:
    """``config`` with no more processes of this machine than it has cores: more would only take
    memory and start-up (the folder is the same for any number)."""
    cores = default_workers()
    if config.ray is not None or config.processes <= cores:
        return config
    warnings.warn(f"--processes {config.processes:,} is more than this machine's {cores} cores: running {cores} "
                  "(the folder is the same for any number)", stacklevel=3)
    return dataclasses.replace(config, processes=cores)


def _prepare_task(config: PrepareConfig, task: int, count: int, started: float) -> dict[str, Any]:
    """One independent task of a run (``tokpack.prepare.tasks``): its units, and meta.json once
    every unit is done; the result's ``splits`` are absent while units are missing."""
    plan = make_plan(config, count, started, independent=True)
    meta = tasks.run(plan, task, count, config.finalize, _meta)
    if meta is None:
        done = len(units.recorded(plan.out, plan.fingerprint))
        return {"stats": {"seconds": time.perf_counter() - started, "out_dir": str(plan.out), "leader": True,
                          "units_done": done, "units": plan.units, "task": task, "tasks": count}}
    return _result(meta, plan, started, True)


def _prepare_processes(config: PrepareConfig, started: float) -> tuple[Meta, Plan]:
    """A run as ``config.processes`` tasks (``executors``), this process holding the folder: while
    the tasks start it makes the plan and clears the folder as one process would, keeping the
    units a killed run recorded; it finishes the folder as one process writes it: a flat run's
    units joined into its flat files, the whole input's sha256 taken in a thread while the tasks
    run (a read at disk speed beside N encoders)."""
    if launched_world() > 1:
        raise ValueError(f"--processes {config.processes} starts its own processes; run it without torchrun")
    run = _ProcessesRun(config, started)
    with contextlib.ExitStack() as held:
        try:
            choose(config).run(config, config.processes, lambda: run.ready(held), run.tick)
            return run.finish(), run.plan
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

    def ready(self, held: contextlib.ExitStack) -> Here:
        """The plan, the folder locked (``held`` until the run ends) and cleared, and the whole
        input's hash under way for a flat run; a task of the run may then run here (``here``)."""
        plan = self.plan = processes_plan(self.config, self.started)
        out = plan.out
        held.enter_context(OutputFolder(out))
        check_out_dir(out, self.config.force, plan.files, input_folders(self.config), ours=units.recorded_files(out))
        units.drop_foreign(out, plan.fingerprint)
        retire(out, keep=units.recorded_files(out))
        if self.config.one_file_a_split():
            hashing = held.enter_context(ThreadPoolExecutor(1, thread_name_prefix="tokpack-input-hash"))
            self.whole = hashing.submit(input_sha256, share_of(plan.files, plan.sizes, 0, 1), self.stop)
        self.shares = [sum((plan.sizes[f] if hi is None else hi) - lo for f, lo, hi in
                           share_of(plan.files, plan.sizes, unit, plan.units)) for unit in range(plan.units)]
        self.bar = held.enter_context(tqdm(total=sum(self.shares), unit="B", unit_scale=True, file=sys.stderr,
                                           disable=self.config.quiet or None,
                                           desc=f"tokpack.prepare ({self.config.processes} processes)"))
        return self.here

    def here(self, task: int, workers: int) -> None:
        """Task ``task`` in this process, on the run's plan, as quiet as a task's own process."""
        assert self.plan is not None
        config = dataclasses.replace(self.plan.config, workers=workers, quiet=True)
        tasks.work(dataclasses.replace(self.plan, config=config, workers=workers), task, self.config.processes)

    def tick(self) -> None:
        """The bar at the input bytes of the units recorded, read from the records' names alone."""
        if self.plan is not None:
            done = sum(self.shares[u] for u in units.numbered(self.plan.out) if u < len(self.shares))
            self.bar.update(done - self.bar.n)

    def finish(self) -> Meta:
        plan = self.plan
        assert plan is not None
        self.tick()
        parts = [units.load(plan, unit, proven=True) for unit in range(plan.units)]
        lost = [unit for unit, part in enumerate(parts) if part is None]
        if lost:
            raise TaskLost(f"units {lost[:8]} of {plan.out} are not as their tasks recorded them; run the same "
                           "command again: it redoes them")
        if self.whole is None:
            meta = _meta(plan, parts)  # type: ignore[arg-type]
            publish_parts(plan.out, meta, parts, merge=True)  # type: ignore[arg-type]
            return meta
        if plan.mixture is not None:  # the units' conversations in mixture order, as one process writes them
            part = mixed(plan, parts, self.whole.result())  # type: ignore[arg-type]
        else:
            part = flattened(plan.out, parts, self.whole.result(), plan.dtype,  # type: ignore[arg-type]
                             self.config.format == "megatron")
        meta = _meta(plan, [part])  # type: ignore[list-item]
        publish_parts(plan.out, meta, [part], merge=False)
        units.drop_own(plan.out, plan.fingerprint)  # the units' files, joined now
        return meta

    def failed(self, exc: BaseException) -> None:
        """Every task has ended: their temporaries are leftovers; after a user error the run's
        units go, as one process's do (the fix changes the run anyway), a lost task's stay."""
        self.stop.set()
        if self.plan is None:
            return
        remove_temporaries(self.plan.out, every_run=True)
        if isinstance(exc, USER_ERRORS) and not isinstance(exc, TaskLost):
            units.drop_own(self.plan.out, self.plan.fingerprint)


def _processes_result(meta: Meta, plan: Plan, started: float) -> dict[str, Any]:
    result = _result(meta, plan, started, True)  # type: ignore[arg-type]
    if plan.config.ray is None:  # Ray's workers are its own children, not this process's
        result["stats"]["task_peak_rss_mb"] = children_peak_rss_mb()
    return result


def _prepare_remote(config: PrepareConfig, started: float) -> dict[str, Any]:
    """A run published to a remote folder (``tokpack.prepare.remote``): the same run as into a
    local folder of the URL's last name, in a local spool, then uploaded; a sharded run of one
    process uploads each unit as it finishes, one of ``--processes`` its finished folder, and one
    on Ray has each task upload its units from its own worker's spool."""
    assert config.out_dir is not None
    if config.format == "megatron":
        raise ValueError("--format megatron writes one .bin/.idx pair a split on one disk; publish flat or llmc "
                         "folders to a URL, or prepare locally and copy")
    folder = Publisher(config.out_dir, config.storage_options, config.force)
    with Spool(config.spool_dir) as spool:
        local = spooled(config, spool, folder)
        # --processes here: its plan is made, and checked, once the folder is locked.
        processes, on_ray = config.processes > 1 and config.ray is None, config.ray is not None
        plan = None if processes else processes_plan(local, started) if on_ray else make_plan(local, 1, started)
        folder.begin()
        try:
            if processes:  # the whole folder in the spool, then uploaded
                meta, plan = _prepare_processes(local, started)
                folder.publish(plan.out, meta, [f["file"] for info in meta["splits"].values()  # type: ignore
                                                for f in every_file(info)], [])
            else:
                assert plan is not None
                meta = (_publish_tasks(config, plan, folder) if on_ray else
                        _publish_units(plan, folder) if plan.sharded else _publish_flat(plan, folder))
        finally:
            folder.release()
    result = _processes_result(meta, plan, started) if processes or on_ray else _result(meta, plan, started, True)
    result["stats"]["out_dir"] = redact(config.out_dir)
    return result


def _publish_flat(plan: Plan, folder: Publisher) -> dict[str, Any]:
    """A flat run made whole in the spool, as a local run makes it, then its files uploaded."""
    with process_group() as dist:
        meta = _run(plan, Ranks(dist))
    folder.publish(plan.out, meta, [f["file"] for info in meta["splits"].values() for f in every_file(info)], [])
    return meta


def _publish_units(plan: Plan, folder: Publisher) -> dict[str, Any]:
    """A sharded run's units, each uploaded while the next is tokenized (at most two units' shards
    in the spool), those a killed run uploaded kept; then the merged indexes and meta.json."""
    with OutputFolder(plan.out):
        return _finish_units(plan, folder, folder.made(plan, range(plan.units)))


def _publish_tasks(config: PrepareConfig, plan: Plan, folder: Publisher) -> dict[str, Any]:
    """A sharded run's tasks on workers that share no disk, each uploading its units
    (``tasks.publish_task``); then the units' records and index parts fetched from the folder,
    and the merged indexes and meta.json."""
    bar = tqdm(total=plan.units, unit="unit", file=sys.stderr, disable=config.quiet or None,
               desc=f"tokpack.prepare ({config.processes} tasks on Ray)")
    listed = 0.0

    def tick() -> None:  # a listing of the folder every few seconds: the records uploaded
        nonlocal listed
        if time.monotonic() - listed >= LISTING_S:
            listed = time.monotonic()
            bar.update(folder.uploaded() - bar.n)

    with bar:
        choose(config).run(config, config.processes, lambda: None, tick)
        folder.refresh()
        with OutputFolder(plan.out):
            parts = [folder.kept(plan, unit) for unit in range(plan.units)]
            lost = [unit for unit, part in enumerate(parts) if part is None]
            if lost:
                raise TaskLost(f"units {lost[:8]} of {redact(folder.where)} were not uploaded as their tasks recorded "
                               "them; run the same command again: it redoes them")
            bar.update(plan.units - bar.n)
            return _finish_units(plan, folder, parts)  # type: ignore[arg-type]


def _finish_units(plan: Plan, folder: Publisher, parts: list[UnitRecord]) -> dict[str, Any]:
    """meta.json of a sharded run's uploaded units, the indexes merged from their parts (in the
    spool), and both published; the units' records and parts then go."""
    meta = _meta(plan, parts)
    indexes = []
    for tmp, final in merged_indexes(plan.out, meta, parts):  # type: ignore[arg-type]
        os.replace(tmp, final)
        indexes.append(Path(final).name)
    indexes += [info["guard"]["file"] for info in meta["splits"].values() if "guard" in info]
    leftovers = [UNIT_RECORD.format(unit) for unit in range(len(parts))]
    leftovers += [part["idx"]["file"] for record in parts for part in record["splits"].values()]
    folder.publish(plan.out, meta, indexes, leftovers)
    return meta  # type: ignore[return-value]


def _result(meta: dict[str, Any], plan: Plan, started: float, leader: bool) -> dict[str, Any]:
    for split, info in meta["splits"].items():
        if info["tokens"] < SHORT_SPLIT:
            warnings.warn(f"the {split} split holds only {info['tokens']} tokens, shorter than most useful windows; "
                          "give it more (--val-fraction, --val-tokens, --val-inputs) or add documents", stacklevel=2)
    elapsed = time.perf_counter() - started
    tokens = sum(s["tokens"] for s in meta["splits"].values())
    return {**meta, "stats": {"seconds": elapsed, "tokens_per_s": tokens / elapsed, "peak_rss_mb": peak_rss_mb(),
                              "workers": plan.workers, "processes": plan.config.processes, "out_dir": str(plan.out),
                              "leader": leader}}


def _run(plan: Plan, ranks: Ranks) -> dict[str, Any]:
    """Tokenize this rank's units; the leader then publishes every unit's files, meta.json last."""
    out, config = plan.out, plan.config

    def make_ready() -> None:
        check_out_dir(out, config.force, plan.files, input_folders(config), ours=units.recorded_files(out))
        units.drop_foreign(out, plan.fingerprint)  # a killed run of other options: its shards must not stay
        if plan.sharded:
            # Units publish their shards as they finish: from the first one on, the folder is
            # being rewritten, so an older meta.json and its files must not describe it.
            retire(out, keep=units.recorded_files(out))

    with OutputFolder(out) if ranks.leader else contextlib.nullcontext():
        # Every rank waits until the leader holds the folder and has checked and cleared it.
        ranks.together(make_ready, leader_only=True)
        done: dict[int, dict[str, Any]] = {}

        def work() -> None:
            for unit in ranks.units(plan.units):
                kept = units.load(plan, unit) if plan.sharded else None
                done[unit] = kept or units.run_unit(plan, unit)

        try:
            ranks.together(work)
            every = {unit: part for parts in ranks.gather(done) for unit, part in parts.items()}
            parts = [every[unit] for unit in range(plan.units)]
            meta = _meta(plan, parts) if ranks.leader else None
            ranks.together(lambda: publish_parts(out, meta, parts, merge=plan.sharded), leader_only=True)
            meta = ranks.gather(meta)[0]
        except USER_ERRORS:
            remove_temporaries(out)
            if ranks.leader:  # its units and signatures: a killed or terminated run keeps them instead
                units.drop_own(out, plan.fingerprint)
            raise
        except BaseException:
            remove_temporaries(out)  # the leader's folder does it too; the other ranks' files are theirs
            raise
    return meta


def _meta(plan: Plan, parts: list[UnitRecord]) -> Meta:
    counts = {key: sum(part["chat"][key] for part in parts) for key in CHAT_COUNTS} if plan.chat is not None else {}
    if counts and not any(part["splits"][split]["info"]["documents"] for part in parts for split in SPLITS):
        raise ValueError(_nothing_trained(counts, plan.config.max_tokens))
    meta: Meta = {
        "format_version": FORMAT_VERSION,
        "tokpack_version": __version__,
        "encoding": plan.enc.describe(),  # type: ignore[typeddict-item]
        "dtype": plan.dtype.name,
        "eot": plan.eot,
        "single_document": plan.single,
        "val": plan.holdout.describe(),
        "text_newlines": "universal",  # \r\n and \r in text files are read as \n; jsonl as is
        "splits": _with_row_groups(plan, _combined(parts, plan.holdout, plan.guard)),
        "inputs": {**plan.inputs, "units_sha256": [part["input_sha256"] for part in parts]},
        "options": plan.config.output_options(),
    }
    if plan.guard is not None:
        meta["guard"] = plan.guard.record()
        for split in SPLITS:
            meta["splits"][split]["guard"] = _write_report(plan.out / GUARD_REPORT.format(split=split),
                                                           plan.guard.report(split))
    if plan.chat is not None:
        meta["chat"] = {**plan.chat.describe(), **counts}  # type: ignore[typeddict-item]
        if plan.mixture is not None:  # a mixture is one unit's: conversations are written flat
            meta["chat"]["mixture"] = parts[0]["chat"]["mixture"]  # type: ignore[typeddict-item]
    return meta


def _write_report(path: Path, rows: Iterable[dict[str, Any]]) -> FileEntry:
    """A split's guard report, one JSON object a line, put in place before meta.json names it with
    its row count."""
    writer = HashingWriter(path)
    count = 0
    try:
        for count, row in enumerate(rows, 1):
            writer.write(json.dumps(row, ensure_ascii=False).encode() + b"\n")
        entry = writer.close()
    except BaseException:
        writer.discard()
        raise
    os.replace(writer.tmp, path)
    return {**entry, "rows": count}  # type: ignore[typeddict-item]


def _nothing_trained(counts: dict[str, int], max_tokens: int) -> str:
    """Why no conversation was written: every record bad, or none with a token to train on."""
    if not counts["conversations"]:
        return (f"all {counts['skipped']:,} records are bad and were skipped (--skip-bad): no conversation is left"
                if counts["skipped"] else "the corpus holds no conversation; pass files of chat records")
    why = []
    if counts["cropped"]:
        why.append(f"{counts['cropped']:,} cut to --max-tokens {max_tokens} before their first trained token (raise "
                   "--max-tokens)")
    if counts["conversations"] > counts["cropped"]:
        why.append(f"{counts['conversations'] - counts['cropped']:,} rendered with no token to train on (the chat "
                   "template writes no assistant text, or its {% generation %} blocks are empty)")
    return f"none of the {counts['conversations']:,} conversations has a token to train on: {'; '.join(why)}"


def _with_row_groups(plan: Plan, splits: dict[str, SplitInfo]) -> dict[str, SplitInfo]:
    """Each split that holds whole parquet files (--val-inputs) with their row group sizes, in
    documents, so that readers can share row groups among ranks as nanochat does."""
    if plan.holdout.kind != "inputs":
        return splits
    for split, info in splits.items():
        files = [f for f in plan.files if (f in plan.holdout.files) == (split == "val")]
        if not all(map(is_parquet, files)):
            continue
        groups = [parquet_row_groups(f) for f in files]
        if sum(map(sum, groups)) == info["documents"]:  # every row a document, as the reader makes them
            info["row_groups"] = groups
    return splits


def _combined(parts: list[UnitRecord], rule: holdout.Holdout, guard: Guard | None) -> dict[str, SplitInfo]:
    """meta.json's splits from every unit's part, in input order (the index comes at publishing);
    a split left empty is refused, naming what emptied it."""
    splits = {}
    for split in SPLITS:
        infos = [part["splits"][split]["info"] for part in parts]
        info: SplitInfo = {"tokens": sum(i["tokens"] for i in infos), "documents": sum(i["documents"] for i in infos)}
        if "bin" in infos[0]:
            info["bin"] = infos[0]["bin"]
            for key in ("megatron_idx", "mask", "supervised"):
                if key in infos[0]:
                    info[key] = infos[0][key]  # type: ignore[literal-required]
        else:
            info["shards"] = [shard for i in infos for shard in i["shards"]]
            if "mask_shards" in infos[0]:
                info["mask_shards"] = [mask for i in infos for mask in i["mask_shards"]]
                info["supervised"] = sum(i["supervised"] for i in infos)
        splits[split] = info
    seen = sum(info["documents"] for info in splits.values())
    if not seen:
        raise ValueError("the corpus holds no text; pass non-empty files")
    for split, info in splits.items():
        removed = guard.removed(split) if guard is not None and not info["documents"] else {}
        if removed:
            said = ", ".join(f"{n:,} {'as ' + why if why == 'evaluation' else why}" for why, n in removed.items())
            raise ValueError(f"the {split} split would be empty: the guard removed all {sum(removed.values()):,} of "
                             f"its documents ({said}); drop or loosen the option that removed them (--dedup, "
                             "--decontaminate), or add documents")
        if not info["documents"]:
            option = {"fraction": "--val-fraction", "tokens": "--val-tokens", "inputs": "--val-inputs"}[rule.kind]
            gone = sum(guard.removed("train").values()) + sum(guard.removed("val").values()) if guard else 0
            raise ValueError(f"the {split} split would be empty: all {seen} documents went to the other split with "
                             f"{option} {rule.value}" + (f" (the guard removed {gone:,} others)" if gone else "")
                             + f"; add documents or change {option}")
    return splits
