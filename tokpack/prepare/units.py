"""Units of a prepare run: each tokenized on its own; in a sharded run each finished one leaves a
record, and a rerun keeps it.

    python -m tokpack.prepare big/ --shard-tokens 100000000 --out-dir D    # killed at 90 %
    python -m tokpack.prepare big/ --shard-tokens 100000000 --out-dir D    # redoes the last 10 %

A unit is a consecutive byte range of the input (``--unit-mb``). When its shards are written it
first writes ``.tokpack-unit-NNNNN.json`` (a fingerprint of the inputs and every option that
changes the output, and the size and sha256 of each file), then renames its shards to their
final names and keeps its document index as a hidden part: a kill between the two leaves a
record whose files do not verify, never a final name that no record claims. A rerun keeps every
unit whose record has the same fingerprint and whose files still have those sizes and hashes;
records of other inputs or options are dropped, with their files, in one warning. The records go
once meta.json is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ..corpus import Piece, count_chars, documents, pieces, split_runs
from ..format import SPLITS, UNIT_RECORD, UNIT_RECORD_GLOB
from ..tokenizer import can_cut, encode_in_order
from .cluster import share_of
from .config import LLMC_SHARD_TOKENS, Plan
from .writers import DocumentBuffer, ShardLayout, SplitWriter, in_val, write_json_atomic


def fingerprint(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


# The names a unit writes: its shards (NAME_train_00003_000000.bin, train_000000.bin, ...) and its
# hidden index part. A record is data on disk and may be forged: any other name in it is refused.
_UNIT_FILE = re.compile(r"(?:[^/\\\x00]+_)?(?:train|val)_(?:\d{5}_)?\d{6}\.bin|\.(?:train|val)\.idx\.u\d{5}")


def _files(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The files a record names, each checked to be a plain name of a unit's pattern."""
    entries = [f for part in record["splits"].values() for f in (*part["info"]["shards"], part["idx"])]
    for entry in entries:
        name = entry["file"]
        if not isinstance(name, str) or not _UNIT_FILE.fullmatch(name):
            raise ValueError(f"a unit record names {name!r}, which is not a file a unit writes")
    return entries


def _unlink_own(path: Path) -> None:
    """Remove a file tokpack wrote: a regular file, never a link (nor what it points to)."""
    if path.is_file() and not path.is_symlink():
        path.unlink(missing_ok=True)


def load(out: Path, unit: int, expected: str) -> dict[str, Any] | None:
    """The record of ``unit`` if it belongs to this run and its files are intact, else None."""
    path = out / UNIT_RECORD.format(unit)
    try:
        record = json.loads(path.read_text("utf-8"))
        if record.get("fingerprint") != expected or record.get("unit") != unit:
            return None
        for entry in _files(record):
            file = out / entry["file"]
            if (file.is_symlink() or not file.is_file() or file.stat().st_size != entry["bytes"]
                    or _sha256(file) != entry["sha256"]):
                return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return record


def save(out: Path, unit: int, expected: str, splits: dict[str, Any]) -> dict[str, Any]:
    record = {"fingerprint": expected, "unit": unit, "splits": splits}
    write_json_atomic(out / UNIT_RECORD.format(unit), record)
    return record


def recorded_files(out: Path) -> set[str]:
    """Every file that unit records in ``out`` name (tokpack's own, whatever their fingerprint)."""
    names: set[str] = set()
    for path in out.glob(UNIT_RECORD_GLOB):
        try:
            names |= {entry["file"] for entry in _files(json.loads(path.read_text("utf-8")))}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return names


def _records(out: Path, mine: bool, expected: str) -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for path in sorted(out.glob(UNIT_RECORD_GLOB)):
        try:
            record = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError):
            record = {}
        if not isinstance(record, dict):
            record = {}
        if (record.get("fingerprint") == expected) == mine:
            found.append((path, record))
    return found


def drop_foreign(out: Path, expected: str) -> None:
    """Remove the records of other inputs or options, and their files, with one warning."""
    foreign = _records(out, False, expected)
    if foreign:
        warnings.warn(f"{len(foreign)} unit records in {out} come from a run with other inputs or options; "
                      "that run's work is dropped and this one starts over", stacklevel=3)
    _remove(out, foreign)


def drop_own(out: Path, expected: str) -> None:
    """Remove this run's records and their files: after a user error nothing is left behind
    (the fix changes the inputs, and so the fingerprint, anyway)."""
    _remove(out, _records(out, True, expected))


def _remove(out: Path, records: list[tuple[Path, dict[str, Any]]]) -> None:
    for path, record in records:
        try:
            names = [entry["file"] for entry in _files(record)]
        except (KeyError, TypeError, ValueError, AttributeError):
            names = []  # a broken or forged record: only the record itself is ours to remove
        for name in names:
            _unlink_own(out / name)
        _unlink_own(path)


def clear(out: Path) -> None:
    """The records and index parts of a folder whose meta.json now stands."""
    for path in [*out.glob(UNIT_RECORD_GLOB), *out.glob(".*.idx.u*")]:
        _unlink_own(path)


def layout(plan: Plan, split: str, unit: int) -> ShardLayout | None:
    """How a unit's tokens of a split are cut into files: llm.c shards, bare shards, or one flat
    file. Of several units, each names its shards after itself, so that they sort in input order."""
    config = plan.config
    tag = f"{unit:05d}_" if plan.units > 1 else ""
    if config.format == "llmc":
        # llm.c's names and numbering: NAME_val_000000.bin, NAME_train_000001.bin, ...
        return ShardLayout(f"{plan.out.resolve().name}_{split}_{tag}", 0 if split == "val" or tag else 1,
                           config.shard_tokens or LLMC_SHARD_TOKENS, header=True)
    if config.shard_tokens or tag:
        return ShardLayout(f"{split}_{tag}", 0, config.shard_tokens or None, header=False)
    return None


def run_unit(plan: Plan, unit: int) -> dict[str, Any]:
    """Tokenize one unit of the input. In a sharded run its record is written and its shards
    published at once, its index kept as a hidden part; else its files stay temporary for the
    leader to rename."""
    config, enc, out, files = plan.config, plan.enc, plan.out, plan.files
    share = share_of(files, plan.sizes, unit, plan.units)
    docs: Iterator[Iterator[str]] = documents(share, config.errors, config.doc_sep, config.jsonl_key,
                                              config.text_column)
    if plan.single and share:
        n = count_chars(files[0], config.errors)
        if n == 0:
            raise ValueError(f"the corpus {files[0]} holds no text; pass a non-empty file")
        cut = int(n * (1 - config.val_fraction))
        if not 0 < cut < n:
            raise ValueError(
                f"{files[0]} has {n} characters: cutting at {cut} for --val-fraction "
                f"{config.val_fraction} leaves a split empty; use a larger corpus or another fraction"
            )
        docs = iter(split_runs(next(docs), cut))
    stream = encode_in_order(pieces(docs, config.piece_chars, can_cut(enc)),
                             lambda text: enc.encode_to_numpy(text, disallowed_special=()).astype(plan.dtype),
                             plan.workers, config.piece_chars)
    writers: dict[str, SplitWriter] = {}
    try:
        for s in SPLITS:
            writers[s] = SplitWriter(out, s, plan.dtype, plan.eot, enc.eot_token, layout(plan, s, unit),
                                     f"{s}.idx.u{unit:05d}" if plan.sharded else f"{s}.idx")
        tokenize(stream, writers, DocumentBuffer(out, config.seed), plan, sum(plan.sizes[f] for f, _, _ in share))
        splits = {}
        for s, writer in writers.items():
            info = writer.close()
            idx = info.pop("idx")
            if plan.sharded:
                idx["file"] = f".{idx['file']}"
                splits[s] = {"info": info, "idx": idx}
            else:
                splits[s] = {"info": info, "idx": idx, "renames": writer.renames()}
        if not plan.sharded:
            return {"splits": splits}
        # The record first, then the renames: a run killed between them leaves a record whose files
        # do not verify (the unit is redone) and no final name that no record claims.
        saved = save(out, unit, plan.fingerprint, splits)
        for s, writer in writers.items():
            for tmp, final in writer.bin.renames():
                os.replace(tmp, final)
            os.replace(writer.idx.tmp, out / splits[s]["idx"]["file"])
        return saved
    except BaseException:
        for writer in writers.values():
            writer.discard()
        raise


def tokenize(stream: Iterator[tuple[Piece, np.ndarray]], writers: dict[str, SplitWriter], buffer: DocumentBuffer,
             plan: Plan, total_bytes: int) -> None:
    """Every piece into its split's writer: a lone document by its cut, others by their hash."""
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
                split = "val" if in_val(buffer.hash.digest(), plan.config.val_fraction) else "train"
                buffer.drain_into(writers[split])
                buffer.reset()
    finally:
        bar.close()
        buffer.discard()
