"""The prepare run: one plan, this rank's units, then the leader publishes the folder.

    python -m tokpack.prepare docs/ --out-dir data/web

``prepare(config)`` decides everything once (``make_plan``), tokenizes this process's units, and
has the leader (rank 0, or the only process) merge and publish them, meta.json last, verified.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import hashlib
import math
import os
import resource
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..version import __version__
from ..cli import USER_ERRORS
from ..options import default_of
from ..chat import ChatRenderer, Nanochat, Renderer
from ..corpus import is_jsonl, is_parquet, is_records, is_single_document, parquet_row_groups
from ..distributed import launched_world, process_group
from ..format import FORMAT_VERSION, SPLITS, UNIT_RECORD, InputsInfo, Meta, SplitInfo, UnitRecord, every_file
from ..inputs import resolve_groups
from ..storage import InputFile, is_url, redact
from ..storage.local import remove_leftovers
from ..tokenizer import Encoder, load_encoding, token_dtype
from . import holdout, tasks, units
from .cluster import Ranks
from .config import Plan, PrepareConfig
from .mixture import Mixture
from .folder import OutputFolder, check_out_dir, merged_indexes, publish_parts, retire
from .chats import CHAT_COUNTS
from .remote import Publisher, Spool
from .writers import remove_temporaries

SHORT_SPLIT = 256  # a split with fewer tokens is shorter than any useful training or evaluation window
SAMPLE_CORPUS = Path("data/sample-corpus")


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB."""
    # VmHWM starts afresh at exec; ru_maxrss would count the memory of the process that forked us.
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


M_MMAP_THRESHOLD = -3  # mallopt's parameter number, from glibc's malloc.h


def fix_mmap_threshold() -> None:
    """Keep glibc's mmap threshold at its 128 KiB default for the rest of the process.

    glibc raises the threshold whenever a large block is freed; from then on the pieces of text
    and the token arrays (a few MB each, every size) are carved from the heap arenas of the worker
    threads, where they fragment, and peak memory grew with the input (+20 MB at 300 MB of one
    document). With the threshold fixed, each large block is mapped and goes back when freed, so
    the peak stays flat. The ``tokpack.prepare`` command calls it; ``prepare()`` does not, since
    it would also make every later large allocation of the caller's process (a training loop's
    tensors) a fresh mapping: call it yourself in a process that only prepares. Elsewhere than
    glibc this does nothing.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, 128 * 1024)
    except (OSError, AttributeError):
        pass


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def write_sample_corpus(folder: Path = SAMPLE_CORPUS) -> Path:
    """The built-in sample: the Python documentation topics, one file per topic."""
    from pydoc_data.topics import topics

    folder.mkdir(parents=True, exist_ok=True)
    for name, text in sorted(topics.items()):
        path = folder / f"{name}.txt"
        if not path.is_file() or path.read_text("utf-8") != text:
            path.write_text(text, "utf-8")
    return folder


def _describe_inputs(groups: list[tuple[str, list[InputFile]]], sizes: dict[InputFile, int]) -> InputsInfo:
    """Each input as given, with its file count and bytes, and a hash of the whole file listing.

    Per-file entries would make meta.json grow with the number of files; the hash still pins them.
    """
    listing = hashlib.sha256()
    for _, found in groups:
        for f in found:
            listing.update(f"{f}\t{sizes[f]}\n".encode("utf-8", "surrogateescape"))
    return {
        "given": [{"path": redact(raw) if is_url(raw) else raw, "files": len(found), "bytes": sum(sizes[f] for f in found)}
                  for raw, found in groups],
        "files": len(sizes),
        "bytes": sum(sizes.values()),
        "listing_sha256": listing.hexdigest(),
    }


def prepare(config: PrepareConfig) -> dict[str, Any]:
    """Run the whole preparation; returns meta.json's content plus a ``stats`` entry.

    On one process, under torchrun on every rank of its group (joined here, gloo), or as one of
    independent tasks (``--tasks``, ``tokpack.prepare.tasks``).
    """
    started = time.perf_counter()
    shared = tasks.place(config)
    if config.out_dir is not None and is_url(config.out_dir):
        if shared is not None or launched_world() > 1:
            raise ValueError(f"--out-dir {redact(config.out_dir)} is written by one process; run it without --tasks "
                             "and torchrun, or prepare into a shared folder")
        return _prepare_remote(config, started)
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


def _prepare_remote(config: PrepareConfig, started: float) -> dict[str, Any]:
    """A run published to a remote folder (``tokpack.prepare.remote``): the same run as into a
    local folder of the URL's last name, in a local spool, then uploaded; a sharded run uploads
    each unit as it finishes."""
    assert config.out_dir is not None
    if config.format == "megatron":
        raise ValueError("--format megatron writes one .bin/.idx pair a split on one disk; publish flat or llmc "
                         "folders to a URL, or prepare locally and copy")
    folder = Publisher(config.out_dir, config.storage_options, config.force)
    with Spool(config.spool_dir) as spool:
        # The run itself writes the local spool: the options of the remote folder are not its own.
        remote_inputs = any(map(is_url, (*config.inputs, *config.val_inputs)))
        local = dataclasses.replace(config, out_dir=str(spool.path / folder.name), force=False, spool_dir=None,
                                    storage_options=config.storage_options if remote_inputs else None)
        plan = make_plan(local, 1, started)
        folder.begin()
        try:
            meta = _publish_units(plan, folder) if plan.sharded else _publish_flat(plan, folder)
        finally:
            folder.release()
    result = _result(meta, plan, started, True)
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
    with OutputFolder(plan.out), ThreadPoolExecutor(1, thread_name_prefix="tokpack-upload") as uploader:
        parts: list[UnitRecord] = []
        uploading: Future[None] | None = None
        for unit in range(plan.units):
            part = folder.kept(plan, unit)
            if part is None:
                part = units.run_unit(plan, unit)
                if uploading is not None:
                    uploading.result()
                uploading = uploader.submit(folder.upload, plan, part)
            parts.append(part)
        if uploading is not None:
            uploading.result()
        meta = _meta(plan, parts)
        indexes = []
        for tmp, final in merged_indexes(plan.out, meta, parts):  # type: ignore[arg-type]
            os.replace(tmp, final)
            indexes.append(Path(final).name)
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
                              "workers": plan.workers, "out_dir": str(plan.out), "leader": leader}}


def make_plan(config: PrepareConfig, world: int, started: float, independent: bool = False) -> Plan:
    """Every decision of the run, once: encoding, dtype, inputs, end of text, output folder, units.

    The input is cut into units in input order, so the units' outputs, concatenated, are the one
    process's, byte for byte, for any number of units and ranks. A flat run is one unit written
    straight to train.bin / val.bin. A sharded run (``--shard-tokens``, ``--format llmc`` or
    torchrun) publishes each unit's shards as it finishes, with a record, so a rerun keeps them.
    """
    groups, val_files = _input_groups(config)
    files = tuple(f for _, found in groups for f in found)
    single = not config.val_inputs and is_single_document(files, config.doc_sep)
    if single and config.val_tokens:
        raise ValueError(f"--val-tokens chooses whole documents, but {files[0]} is one document; "
                         "use --val-fraction, or --doc-sep to cut it into documents")
    _warn_unused(config, files)
    # llm.c's convention is an <|endoftext|> before every document; a conversation brings its own BOS.
    eot = config.eot if config.eot != "auto" else ("none" if single or config.chat != "none" else
                                                   "prepend" if config.format == "llmc" else "append")
    # Documents led by the token take a Hugging Face config's BOS token, where it names one.
    enc = load_encoding(config.encoding, config.eot_token, config.special_text, eot == "prepend")
    dtype = token_dtype(enc, config.dtype)
    out = Path(config.out_dir or ("data/sample" if not config.inputs else f"data/{files[0].name.split('.')[0]}"))
    remove_leftovers(out)  # of a run killed after its meta.json: they would hold the folder back
    # Fail fast, before the corpus is read; checked again once the folder is locked (an independent
    # task first looks whether its run is finished already: then there is nothing to refuse).
    if not independent:
        check_out_dir(out, config.force, files, _input_folders(config),
                      ours=units.recorded_files(out) if out.is_dir() else set())
    sizes = {p: p.size() for p in files}
    total = sum(sizes.values())
    if world > max(total, 1):  # a unit is a byte range of the input: more than one a byte leaves some empty
        what = f"--tasks {world:,}" if independent else f"{world:,} processes"
        raise ValueError(f"{what} is more than the {total:,} bytes of input, so some would have nothing to do; "
                         f"give at most {max(total, 1):,}")
    sharded = config.format == "llmc" or bool(config.shard_tokens) or world > 1 or independent
    if config.mixture and sharded:
        raise ValueError("--mixture writes each split in one order, so one process writes it, flat; drop --tasks, "
                         "--shard-tokens, --format llmc or torchrun")
    if config.format == "megatron" and sharded:
        raise ValueError(f"--format megatron writes one .bin/.idx pair a split, which one process writes; run it "
                         f"without torchrun (this is {world} processes), or use --format flat or llmc")
    count = max(world, math.ceil(total / (config.unit_mb * 1e6))) if sharded else 1
    inputs = _describe_inputs(groups, sizes)
    chat = _renderer(config, enc)
    # A rendering's own facts (a template's sha256, whatever file it came from) decide a unit's bytes too.
    fingerprint = units.fingerprint({"options": config.output_options(), "units": count, "eot": eot,
                                     "inputs": inputs["listing_sha256"], "val_files": sorted(map(str, val_files)),
                                     **({"chat": chat.describe()} if chat is not None else {})})
    return Plan(config=config, enc=enc.with_backend(config.backend, config.check_fraction, config.seed),
                dtype=dtype, eot=eot, single=single, files=files, sizes=sizes, inputs=inputs, out=out,
                sharded=sharded, units=count, fingerprint=fingerprint, workers=_workers(config.workers),
                started=started, holdout=_holdout(config, files, val_files, enc, eot), read=config.read_options(),
                chat=chat, mixture=Mixture.of(config.mixture, groups, config.seed))


def _renderer(config: PrepareConfig, enc: Encoder) -> ChatRenderer | None:
    """How conversations are rendered (``--chat``), or None for text."""
    if config.chat == Renderer.NANOCHAT:
        return Nanochat(enc.specials, config.max_tokens)
    if config.chat != Renderer.TEMPLATE:
        return None
    from ..chat.template import Template, read_template  # jinja2 only where a template is used

    own = enc.chat_template()
    if config.chat_template is not None:
        source, origin = read_template(Path(config.chat_template)), config.chat_template
    elif own is not None:
        source, origin = own[0], own[1]
    else:
        raise ValueError(f"--chat template needs a chat template, and {config.encoding} has none beside it (no "
                         "chat_template.jinja, no chat_template in tokenizer_config.json); pass --chat-template FILE")
    return Template(source, origin, enc, config.max_tokens, own[2] if own is not None else {}, config.special_text)


def _input_groups(config: PrepareConfig) -> tuple[list[tuple[str, list[InputFile]]], list[InputFile]]:
    """The inputs as given with the files each names, val inputs among them; and the val files."""
    options = config.storage_options
    groups = resolve_groups(config.inputs or [str(write_sample_corpus())], options)
    if not config.val_inputs:
        return groups, []
    val_files = [f for _, found in resolve_groups(config.val_inputs, options) for f in found]
    # A file is one file however it is reached: among the inputs, a val file goes by its val path.
    val_ids = {f.identity(): f for f in val_files}
    respelled = [(f, val_ids[f.identity()]) for _, found in groups for f in found
                 if f.identity() in val_ids and val_ids[f.identity()] != f]
    if respelled:
        swap = dict(respelled)
        groups = [(raw, [swap.get(f, f) for f in found]) for raw, found in groups]
        warnings.warn(f"{len(respelled)} input file(s) are --val-inputs reached by another path ({respelled[0][0]} is "
                      f"{respelled[0][1]}); they go to val only", stacklevel=4)
    listed = {f.identity() for _, found in groups for f in found}
    groups += [(str(f), [f]) for f in val_files if f.identity() not in listed]  # val inputs not among the inputs
    if all(f in set(val_files) for _, found in groups for f in found):
        raise ValueError(f"--val-inputs names every input ({len(val_files)} files), which leaves train empty; "
                         "name only the val files")
    return groups, val_files


def _warn_unused(config: PrepareConfig, files: tuple[Path, ...]) -> None:
    """A warning for each reading option no input uses."""
    if config.doc_sep and all(map(is_records, files)):
        warnings.warn("--doc-sep has no effect: every input is .jsonl or .parquet, whose records are the documents",
                      stacklevel=4)
    for option, of_kind, kind in (("jsonl_key", is_jsonl, ".jsonl"), ("text_column", is_parquet, ".parquet")):
        value = getattr(config, option)
        if value != default_of(PrepareConfig, option) and not any(map(of_kind, files)):
            warnings.warn(f"--{option.replace('_', '-')} {value!r} has no effect: no input is {kind}", stacklevel=4)


def _workers(asked: int) -> int:
    cores = default_workers()
    if asked > cores:
        # Each worker holds pieces in flight: beyond the cores they cost memory and add no speed.
        warnings.warn(f"--workers {asked} is more than the {cores} cores this process may use; using {cores}",
                      stacklevel=4)
    return min(asked or cores, cores)


def _holdout(config: PrepareConfig, files: tuple[InputFile, ...], val_files: list[InputFile], enc: Encoder,
             eot: str) -> holdout.Holdout:
    if config.val_inputs:
        return holdout.by_inputs(val_files, config.val_inputs)
    if config.val_tokens:
        return holdout.by_tokens(config.val_tokens, files, enc, eot, config.seed, config.read_options())
    return holdout.by_fraction(config.val_fraction)


def _run(plan: Plan, ranks: Ranks) -> dict[str, Any]:
    """Tokenize this rank's units; the leader then publishes every unit's files, meta.json last."""
    out, config = plan.out, plan.config

    def make_ready() -> None:
        check_out_dir(out, config.force, plan.files, _input_folders(config), ours=units.recorded_files(out))
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
            if plan.sharded and ranks.leader:
                units.drop_own(out, plan.fingerprint)  # a killed or terminated run keeps its units instead
            raise
        except BaseException:
            remove_temporaries(out)  # the leader's folder does it too; the other ranks' files are theirs
            raise
    return meta


def _meta(plan: Plan, parts: list[UnitRecord]) -> Meta:
    meta: Meta = {
        "format_version": FORMAT_VERSION,
        "tokpack_version": __version__,
        "encoding": plan.enc.describe(),  # type: ignore[typeddict-item]
        "dtype": plan.dtype.name,
        "eot": plan.eot,
        "single_document": plan.single,
        "val": plan.holdout.describe(),
        "text_newlines": "universal",  # \r\n and \r in text files are read as \n; jsonl as is
        "splits": _with_row_groups(plan, _combined(parts, plan.holdout)),
        "inputs": {**plan.inputs, "units_sha256": [part["input_sha256"] for part in parts]},
        "options": plan.config.output_options(),
    }
    if plan.chat is not None:
        counts = {key: sum(part["chat"][key] for part in parts) for key in CHAT_COUNTS}
        meta["chat"] = {**plan.chat.describe(), **counts}  # type: ignore[typeddict-item]
        if plan.mixture is not None:  # a mixture is one unit's: conversations are written flat
            meta["chat"]["mixture"] = parts[0]["chat"]["mixture"]  # type: ignore[typeddict-item]
    return meta


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


def _input_folders(config: PrepareConfig) -> list[Path]:
    return [Path(i) for i in config.inputs if not is_url(i) and Path(i).is_dir()]


def _combined(parts: list[UnitRecord], rule: holdout.Holdout) -> dict[str, SplitInfo]:
    """meta.json's splits from every unit's part, in input order (the index comes at publishing)."""
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
        if not info["documents"]:
            option = {"fraction": "--val-fraction", "tokens": "--val-tokens", "inputs": "--val-inputs"}[rule.kind]
            raise ValueError(f"the {split} split would be empty: all {seen} documents went to the other split with "
                             f"{option} {rule.value}; add documents or change {option}")
    return splits
