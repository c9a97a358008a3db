"""Units of a prepare run: each tokenized on its own; in a sharded run each finished one leaves a
record, and a rerun keeps it.

    python -m tokpack.prepare big/ --shard-tokens 100000000 --out-dir D    # killed at 90 %
    python -m tokpack.prepare big/ --shard-tokens 100000000 --out-dir D    # redoes the last 10 %

A unit is a consecutive byte range of the input (``--unit-mb``). When its shards are written it
first writes ``.tokpack-unit-NNNNN.json`` (a fingerprint of the inputs and every option that
changes the output, the sha256 of the unit's input bytes, and the size and sha256 of each file),
then renames its shards to their final names and keeps its document index as a hidden part: a
kill between the two leaves a record whose files do not verify, never a final name that no
record claims. A rerun keeps every unit whose record has the same fingerprint, whose input
hashes the same (a read, no tokenizing) and whose files still have those sizes and hashes;
records of other inputs or options are dropped, with their files, in one warning, and a record
that cannot be read takes only its own unit with it. The records go once meta.json is written.
Every name a record gives is checked against the names a unit writes before it is used.

See docs/cluster.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ..corpus import Piece, documents, pieces, split_runs
from ..format import (IDX_NAME, MASK_SHARD_NAME, MEGATRON_NAME, SHARD_HEADER_BYTES, SHARD_NAME, SPLITS, UNIT_INDEX,
                      UNIT_INDEX_GLOB, UNIT_INDEX_NAME, UNIT_RECORD, UNIT_RECORD_GLOB, UNIT_RECORD_NAME, UnitPart, UnitRecord,
                      load_json)
from ..format.megatron import write_index
from ..storage.local import LocalFolder, remove_own
from ..tokenizer import encode_in_order, safe_cut
from ..verify import VerifyError, check_index, check_mask, check_tokens
from . import signatures
from .cluster import Entry, share_of
from .chats import CHAT_COUNTS, chat_counts, write_chats
from .config import LLMC_SHARD_TOKENS, Plan
from .guard import Verdicts
from .input_hash import InputTap, input_sha256
from .writers import DocumentBuffer, HashingWriter, ShardLayout, SplitWriter, split_writers, write_json_atomic


def fingerprint(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


# The names a unit writes: its shards (NAME_train_00003_000000.bin, train_000000.bin, ...) and its
# hidden index part. A record is data on disk and may be forged: any other name in it is refused.
_UNIT_FILE = re.compile(rf"{SHARD_NAME}|{MASK_SHARD_NAME}|{UNIT_INDEX_NAME.pattern}")


def record_files(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The files a record names, each checked to be a plain name of a unit's pattern."""
    entries = [f for part in record["splits"].values()
               for f in (*part["info"]["shards"], *part["info"].get("mask_shards", []), part["idx"])]
    for entry in entries:
        name = entry["file"]
        if not isinstance(name, str) or not _UNIT_FILE.fullmatch(name):
            raise ValueError(f"a unit record names {name!r}, which is not a file a unit writes")
    return entries


def load(plan: Plan, unit: int, proven: bool = False) -> UnitRecord | None:
    """The record of ``unit`` if it belongs to this run, its input is unchanged and its files are
    intact, else None. ``proven``: a task of this run wrote or checked the unit just now, under
    the folder's lock, so its input and files are not read again, only named and sized."""
    try:
        record = this_run(plan, unit, (plan.out / UNIT_RECORD.format(unit)).read_bytes(), str(plan.out), proven)
        if record is not None and proven:
            for entry in record_files(record):
                found = os.lstat(plan.out / entry["file"])  # a link is no unit's file
                if not stat.S_ISREG(found.st_mode) or found.st_size != entry["bytes"]:
                    return None
        elif record is not None:
            _check_files(plan, record)
    except (OSError, ValueError, VerifyError):
        return None
    return record


def this_run(plan: Plan, unit: int, raw: bytes | None, where: str, proven: bool = False) -> UnitRecord | None:
    """The record ``raw`` of ``unit`` (kept in ``where``) if it is this run's, names only a unit's
    files and was made from the input as it is now (``proven``: not read again; else None, with a
    warning if the input changed): what a rerun keeps, once the files it names are found as
    recorded."""
    try:
        record = load_json(raw or b"null", where, "it is redone")
        if not isinstance(record, dict) or record.get("fingerprint") != plan.fingerprint or record.get("unit") != unit:
            return None
        record_files(record)
        recorded = record["input_sha256"]
        counts = record.get("chat")
        if (plan.chat is not None) != isinstance(counts, dict) or (counts is not None and not all(
                type(counts.get(key)) is int and counts[key] >= 0 for key in CHAT_COUNTS)):
            return None
        if plan.mixture is not None and plan.sharded and not _sources_fit(record, len(plan.mixture.names)):
            return None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not proven and recorded != input_sha256(share_of(plan.files, plan.sizes, unit, plan.units)):
        warnings.warn(f"the input of unit {unit} changed since it was recorded in {where}; it is redone",
                      stacklevel=3)
        return None
    return record  # type: ignore[return-value]


def _sources_fit(record: dict[str, Any], inputs: int) -> bool:
    """Whether a --processes mixture unit's record gives each conversation of each split its input:
    [input, conversations] runs, as many as the split holds."""
    sources = record["chat"].get("sources")

    def run(found: Any) -> bool:
        return isinstance(found, list) and len(found) == 2 and all(type(n) is int for n in found) \
            and 0 <= found[0] < inputs and found[1] > 0

    return isinstance(sources, dict) and sources.keys() == record["splits"].keys() and all(
        isinstance(found, list) and all(map(run, found))
        and sum(n for _, n in found) == record["splits"][split]["info"]["documents"] for split, found in sources.items())


def _check_files(plan: Plan, record: UnitRecord) -> None:
    """A kept unit's files as verify checks a folder's: each size and sha256 as recorded, every id
    below n_vocab, and its index part a strictly increasing list of its documents' starts, so a
    broken unit is redone here rather than failing the whole run when it is published."""
    folder = LocalFolder(plan.out)
    record_files(record)  # every name of a unit's own pattern
    offset = SHARD_HEADER_BYTES if plan.config.format == "llmc" else 0
    for part in record["splits"].values():
        for entry in part["info"]["shards"]:
            check_tokens(folder, entry, plan.dtype, offset, plan.enc.n_vocab)
        if (plan.chat is not None) != ("mask_shards" in part["info"]):
            raise VerifyError(f"unit {record['unit']} {'lacks' if plan.chat else 'has'} masks")
        if plan.chat is not None:
            masks, shards = part["info"]["mask_shards"], part["info"]["shards"]
            if len(masks) != len(shards) or any(m["bytes"] != s["tokens"] for m, s in zip(masks, shards)) or \
                    sum(check_mask(folder, entry) for entry in masks) != part["info"]["supervised"]:
                raise VerifyError(f"unit {record['unit']}'s masks are not one byte a token of its shards, as "
                                  "recorded")
        check_index(folder, part["idx"], part["info"]["documents"], part["info"]["tokens"], f"unit {record['unit']}")


def save(out: Path, unit: int, expected: str, digest: str, splits: dict[str, UnitPart],
         chat: dict[str, Any] | None = None) -> UnitRecord:
    record: UnitRecord = {"fingerprint": expected, "unit": unit, "input_sha256": digest, "splits": splits}
    if chat is not None:
        record["chat"] = chat
    write_json_atomic(out / UNIT_RECORD.format(unit), record)
    return record


_READ_ERRORS = (OSError, ValueError, KeyError, TypeError, AttributeError)


def _records(out: Path) -> list[tuple[Path, dict[str, Any] | None, list[str]]]:
    """Every unit record in ``out``: (path, the record or None when it cannot be read or names a
    file no unit writes, the files it claims). A broken record claims its unit's files by name."""
    found = []
    for path in sorted(out.glob(UNIT_RECORD_GLOB)):
        named = UNIT_RECORD_NAME.fullmatch(path.name)
        if not named:
            continue
        try:
            record = load_json(path.read_bytes(), str(path), "it is redone")
            names = [entry["file"] for entry in record_files(record)]
            if not isinstance(record.get("fingerprint"), str):
                raise ValueError("no fingerprint")
        except _READ_ERRORS:
            record, names = None, _claimed(out, int(named.group(1)))
        found.append((path, record, names))
    return found


def _claimed(out: Path, unit: int) -> list[str]:
    """The files that unit ``unit`` writes, found by their names: its tag (unit 0 of a one-unit
    run has none)."""
    shard = rf"(?:train|val)_{unit:05d}_\d{{6}}\.bin" + (r"|(?:train|val)_\d{6}\.bin" if unit == 0 else "")
    own = re.compile(rf"(?:.*_)?(?:{shard})|\.(?:train|val)\.idx\.u{unit:05d}")
    return sorted(p.name for p in out.iterdir() if _UNIT_FILE.fullmatch(p.name) and own.fullmatch(p.name))


def numbered(out: Path) -> set[int]:
    """The units whose records stand in ``out``, from their names alone (none is read)."""
    return {int(m.group(1)) for m in map(UNIT_RECORD_NAME.fullmatch, os.listdir(out)) if m}


def recorded_files(out: Path) -> set[str]:
    """Every file that unit records in ``out`` claim (tokpack's own, whatever their fingerprint)."""
    return {name for _, _, names in _records(out) for name in names}


def recorded(out: Path, expected: str) -> set[int]:
    """The units that have a record of this run (not yet checked as ``load`` checks them), from one
    listing: O(records), whatever the count of units."""
    return {record["unit"] for _, record, _ in _records(out) if record is not None
            and record["fingerprint"] == expected and type(record.get("unit")) is int}


def all_recorded(out: Path, expected: str, count: int) -> bool:
    """Whether every one of ``count`` units has a record of this run: a listing of names, and the
    records read only once there are as many as units (every task asks when it ends)."""
    return len(list(out.glob(UNIT_RECORD_GLOB))) >= count and recorded(out, expected) >= set(range(count))


def foreign(out: Path, expected: str) -> list[Path]:
    """The records in ``out`` of a run with other inputs or options."""
    return [path for path, record, _ in _records(out) if record is not None and record["fingerprint"] != expected]


def drop_foreign(out: Path, expected: str) -> None:
    """Remove the records of other inputs or options, and their files, with one warning; a record
    that cannot be read goes with its unit's files, and only that unit is redone."""
    records = _records(out)
    broken = [(path, names) for path, record, names in records if record is None]
    foreign = [(path, names) for path, record, names in records if record is not None
               and record["fingerprint"] != expected]
    if broken:
        warnings.warn(f"unit record{'s' * (len(broken) > 1)} {', '.join(p.name for p, _ in broken)} in {out} "
                      "cannot be read; those units are redone and the others kept", stacklevel=3)
    if foreign:
        warnings.warn(f"{len(foreign)} unit records in {out} come from a run with other inputs or options; "
                      "that run's work is dropped and this one starts over", stacklevel=3)
    _remove(out, broken + foreign)


def drop_own(out: Path, expected: str) -> None:
    """Remove this run's records and their files, and the units' signatures: after a user error
    nothing is left behind (the fix changes the inputs, and so the fingerprint, anyway)."""
    _remove(out, [(path, names) for path, record, names in _records(out)
                  if record is not None and record["fingerprint"] == expected])
    signatures.clear(out)


def _remove(out: Path, records: list[tuple[Path, list[str]]]) -> None:
    for path, names in records:
        for name in names:
            remove_own(out / name)
        remove_own(path)


def clear(out: Path) -> None:
    """The records, index parts and signatures of a folder whose meta.json now stands."""
    for path in [*out.glob(UNIT_RECORD_GLOB), *out.glob(UNIT_INDEX_GLOB)]:
        remove_own(path)
    signatures.clear(out)


def layout(plan: Plan, split: str, unit: int) -> ShardLayout | None:
    """How a unit's tokens of a split are cut into files: llm.c shards, bare shards, or one flat
    file. Of several units, each names its shards after itself, so that they sort in input order."""
    config = plan.config
    tag = f"{unit:05d}_" if plan.units > 1 else ""
    at_documents = config.shard_boundary == "document" or (config.shard_boundary == "auto" and config.format == "llmc")
    if config.format == "llmc":
        # llm.c's names and numbering: NAME_val_000000.bin, NAME_train_000001.bin, ...; modded-nanogpt
        # reads two train shards at least.
        return ShardLayout(f"{plan.out.resolve().name}_{split}_{tag}", 0 if split == "val" or tag else 1,
                           config.shard_tokens or LLMC_SHARD_TOKENS, header=True, at_documents=at_documents,
                           min_shards=2 if split == "train" and plan.units == 1 else 1)
    if config.shard_tokens or plan.sharded:  # a sharded run's one unit too: its records name shards
        return ShardLayout(f"{split}_{tag}", 0, config.shard_tokens or None, header=False, at_documents=at_documents)
    return None


def run_unit(plan: Plan, unit: int, verdicts: Verdicts | None) -> UnitRecord:
    """Tokenize one unit of the input, each document where the guard's ``verdicts`` send it (a
    guarded run's). In a sharded run its record is written and its shards published at once, its
    index kept as a hidden part; else its files stay temporary for the leader to rename."""
    share = share_of(plan.files, plan.sizes, unit, plan.units)
    passes = reads(plan, share)
    # Where the unit reads its input once, in order, and all of it whole files, the reader hashes
    # what it reads. Anything else is hashed in a thread of its own while the unit is tokenized,
    # where it fills the pipeline's idle start and end instead of coming before it.
    tap = InputTap(share) if len(passes) == 1 and not plan.single and InputTap.fits(share) else None
    stop = threading.Event()  # a failed unit does not wait for its input to be hashed
    with ThreadPoolExecutor(1, thread_name_prefix="tokpack-input-hash") as hashing:
        digest = tap.hexdigest if tap else hashing.submit(input_sha256, share, stop).result
        writers: dict[str, SplitWriter] = {}
        counts = chat_counts()
        try:
            writers = open_writers(plan, unit)
            if plan.chat is not None:
                write_chats(plan, [(only, tap.share if tap else entries) for only, entries in passes], writers, counts,
                            unit * len(passes), verdicts)
            for i, (only, entries) in enumerate(passes if plan.chat is None else ()):
                tokenize(_encoded(plan, tap.share if tap else entries), writers,
                         DocumentBuffer(plan.out, plan.config.seed), plan, sum(plan.sizes[f] for f, _, _ in entries),
                         only, unit * len(passes) + i, verdicts)
            plan.enc.flush()  # every check of the unit's ids passed before anything of it is published
            read = digest()
            if verdicts is not None:
                verdicts.check_input(unit, read)
            return finish(plan, unit, read, writers, counts if plan.chat is not None else None)
        except BaseException:
            stop.set()
            for writer in writers.values():
                writer.discard()
            raise


def open_writers(plan: Plan, unit: int) -> dict[str, SplitWriter]:
    """A writer a split, to temporary names: tokens, tokpack's index, and Megatron's ``.bin``."""
    megatron = plan.config.format == "megatron"
    return split_writers(lambda s: SplitWriter(
        plan.out, s, plan.dtype, plan.eot, plan.enc.eot_token, layout(plan, s, unit),
        UNIT_INDEX.format(split=s, unit=unit) if plan.sharded else IDX_NAME.format(split=s),
        f"{MEGATRON_NAME.format(split=s)}.bin" if megatron else "", masked=plan.chat is not None))


def reads(plan: Plan, share: list[Entry]) -> list[tuple[str | None, list[Entry]]]:
    """The reads of a unit: all its input at once, or, by file, the val inputs' documents into
    val and the others into train, each in input order."""
    if plan.holdout.kind != "inputs":
        return [(None, share)]
    val = plan.holdout.files
    return [("val", [e for e in share if e[0] in val]), ("train", [e for e in share if e[0] not in val])]


def _documents(plan: Plan, entries: list[Entry]) -> Iterator[Iterator[str]]:
    """The documents of ``entries``; a lone document as two, cut where val begins."""
    docs = documents(entries, plan.read)
    if not (plan.single and entries):
        return docs
    return iter(split_runs(next(docs), plan.holdout.lone_cut(plan.files[0], plan.read.errors)))


def _encoded(plan: Plan, entries: list[Entry]) -> Iterator[tuple[Piece, np.ndarray]]:
    """Every piece of ``entries`` with its tokens, in order, in ``plan.encoding_threads()``."""
    enc = plan.enc
    workers, in_flight = plan.encoding_threads()

    def encode(batch: list[Piece]) -> list[np.ndarray]:
        # Ids already of the stored width (uint32 ones) are written as they come: a copy of each
        # was 4 bytes a token more of the memory traffic a CPU-bound run shares with its encoder.
        return [ids.astype(plan.dtype, copy=False) for ids in enc.encode_batch([piece.text for piece in batch])]

    cut = safe_cut if enc.can_cut else None
    piece_chars = plan.config.piece_chars  # the batches too: see Plan.encoding_threads
    return encode_in_order(pieces(_documents(plan, entries), piece_chars, cut), encode, workers, piece_chars, in_flight)


def finish(plan: Plan, unit: int, digest: str, writers: dict[str, SplitWriter],
           chat: dict[str, Any] | None = None) -> UnitRecord:
    """Close the writers. A sharded run writes the unit's record (with its ``chat`` counts), then
    renames its files: a run killed between the two leaves a record whose files do not verify (the
    unit is redone) and no final name that no record claims."""
    splits = {s: closed(plan, writer) for s, writer in writers.items()}
    if not plan.sharded:
        return {"input_sha256": digest, "splits": splits, **({"chat": chat} if chat is not None else {})}
    saved = save(plan.out, unit, plan.fingerprint, digest, splits, chat)
    for writer in writers.values():  # its shards, index part and masks
        for tmp, final in writer.renames():
            os.replace(tmp, final)
    return saved


def closed(plan: Plan, writer: SplitWriter) -> UnitPart:
    """A split's part of the unit: its counts and files, its index, the renames left to make."""
    info = writer.close()
    idx = info.pop("idx")
    if plan.sharded:
        return {"info": info, "idx": idx}
    part: UnitPart = {"info": info, "idx": idx, "renames": writer.renames()}
    if plan.config.format == "megatron":  # Megatron's own index beside tokpack's, from the starts just written
        index = HashingWriter(plan.out / f"{MEGATRON_NAME.format(split=writer.split)}.idx")
        write_index(index.write, writer.idx.tmp, info["documents"], info["tokens"], plan.dtype)
        info["megatron_idx"] = index.close()
        part["renames"] += index.renames()
    return part


def tokenize(stream: Iterator[tuple[Piece, np.ndarray]], writers: dict[str, SplitWriter], buffer: DocumentBuffer,
             plan: Plan, total_bytes: int, only: str | None, read: int, verdicts: Verdicts | None) -> None:
    """Every piece into its split's writer: a lone document by its cut, others by their hash, or
    all into split ``only``; where the guard's ``verdicts`` move or drop a document (looked up by
    ``read``, the run's read this is, and the document's number), as they say."""
    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, disable=plan.config.quiet or None,
               desc="tokpack.prepare", file=sys.stderr, smoothing=0.1)
    try:
        for count, (piece, tokens) in enumerate(stream):
            raw = piece.text.encode("utf-8", "surrogatepass")
            bar.update(len(raw))
            if count % 64 == 0 and not bar.disable:
                done = sum(w.tokens for w in writers.values()) + buffer.held + buffer.spilled
                bar.set_postfix_str(f"{done / (time.perf_counter() - plan.started):,.0f} tokens/s", refresh=False)
            if plan.single:
                writer = writers[SPLITS[piece.doc]]
                if not writer.documents:  # each split holds one part of the lone document
                    writer.start_document()
                writer.write(tokens)
                if piece.last:
                    writer.end_document()
                continue
            buffer.add(raw, tokens)
            if piece.last:
                split: str | None = only or ("val" if plan.holdout.is_val(buffer.hash.digest()) else "train")
                if verdicts is not None:
                    split = verdicts.split(read, piece.doc, split)
                if split is not None:
                    buffer.drain_into(writers[split])
                buffer.reset()
    finally:
        bar.close()
        buffer.discard()
