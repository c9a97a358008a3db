"""Units of a prepare run: each tokenized on its own; in a sharded run each finished one leaves a
record, and a rerun keeps it.

    python -m tokpack.prepare big/ --shard-tokens 100000000 --out-dir D    # killed at 90 %
    python -m tokpack.prepare big/ --shard-tokens 100000000 --out-dir D    # redoes the last 10 %

A unit is a consecutive byte range of the input (``--unit-mb``). When its shards are written it
publishes them under their final names, keeps its document index as a hidden part, and writes
``.tokpack-unit-NNNNN.json``: a fingerprint of the inputs and every option that changes the
output, and the size and sha256 of each file. A rerun keeps every unit whose record has the same
fingerprint and whose files still have those sizes and hashes; records of other inputs or
options are dropped, with their files, in one warning. The records go once meta.json is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from .cluster import share_of
from .corpus import Piece, count_chars, documents, pieces, split_runs
from .format import SPLITS
from .tokenizer import can_cut, encode_in_order
from .writers import DocumentBuffer, ShardLayout, SplitWriter, in_val, write_json_atomic

if TYPE_CHECKING:
    from .preparation import PrepareConfig

LLMC_SHARD_TOKENS = 100_000_000  # llm.c's shard size

RECORD = ".tokpack-unit-{:05d}.json"
RECORD_GLOB = ".tokpack-unit-*.json"


def fingerprint(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def _files(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for part in record["splits"].values() for f in (*part["info"]["shards"], part["idx"])]


def load(out: Path, unit: int, expected: str) -> dict[str, Any] | None:
    """The record of ``unit`` if it belongs to this run and its files are intact, else None."""
    path = out / RECORD.format(unit)
    try:
        record = json.loads(path.read_text("utf-8"))
        if record.get("fingerprint") != expected or record.get("unit") != unit:
            return None
        for entry in _files(record):
            file = out / entry["file"]
            if not file.is_file() or file.stat().st_size != entry["bytes"] or _sha256(file) != entry["sha256"]:
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record


def save(out: Path, unit: int, expected: str, splits: dict[str, Any]) -> dict[str, Any]:
    record = {"fingerprint": expected, "unit": unit, "splits": splits}
    write_json_atomic(out / RECORD.format(unit), record)
    return record


def recorded_files(out: Path) -> set[str]:
    """Every file that unit records in ``out`` name (tokpack's own, whatever their fingerprint)."""
    names: set[str] = set()
    for path in out.glob(RECORD_GLOB):
        try:
            names |= {entry["file"] for entry in _files(json.loads(path.read_text("utf-8")))}
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return names


def _records(out: Path, mine: bool, expected: str) -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for path in sorted(out.glob(RECORD_GLOB)):
        try:
            record = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError):
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
        except (KeyError, TypeError):
            names = []
        for name in names:
            (out / name).unlink(missing_ok=True)
        path.unlink(missing_ok=True)


def clear(out: Path) -> None:
    """The records and index parts of a folder whose meta.json now stands."""
    for path in out.glob(RECORD_GLOB):
        path.unlink(missing_ok=True)
    for path in out.glob(".*.idx.u*"):
        path.unlink(missing_ok=True)


def layout(config: PrepareConfig, out: Path, split: str, unit: int, count: int) -> ShardLayout | None:
    """How a unit's tokens of a split are cut into files: llm.c shards, bare shards, or one flat
    file. Of several units, each names its shards after itself, so that they sort in input order."""
    tag = f"{unit:05d}_" if count > 1 else ""
    if config.format == "llmc":
        # llm.c's names and numbering: NAME_val_000000.bin, NAME_train_000001.bin, ...
        return ShardLayout(f"{out.resolve().name}_{split}_{tag}", 0 if split == "val" or tag else 1,
                           config.shard_tokens or LLMC_SHARD_TOKENS, header=True)
    if config.shard_tokens or tag:
        return ShardLayout(f"{split}_{tag}", 0, config.shard_tokens or None, header=False)
    return None


def run_unit(config: PrepareConfig, enc: Any, dtype: np.dtype, eot: str, single: bool, files: list[Path],
          sizes: dict[Path, int], out: Path, unit: int, count: int, record: str | None, workers: int,
          started: float) -> dict[str, Any]:
    """Tokenize one unit of the input. With ``record`` (a fingerprint) its shards are published at
    once, its index kept as a hidden part and its record written; else its files stay temporary
    for the leader to rename."""
    share = share_of(files, sizes, unit, count)
    docs: Iterator[Iterator[str]] = documents(share, config.errors, config.doc_sep, config.jsonl_key,
                                              config.text_column)
    if single and share:
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
                             lambda text: enc.encode_to_numpy(text, disallowed_special=()).astype(dtype),
                             workers, config.piece_chars)
    writers: dict[str, SplitWriter] = {}
    try:
        for s in SPLITS:
            writers[s] = SplitWriter(out, s, dtype, eot, enc.eot_token, layout(config, out, s, unit, count),
                                     f"{s}.idx.u{unit:05d}" if record else f"{s}.idx")
        tokenize(stream, writers, DocumentBuffer(out, config.seed), single, config, started,
                  sum(sizes[f] for f, _, _ in share))
        splits = {}
        for s, writer in writers.items():
            info = writer.close()
            idx = info.pop("idx")
            if record:
                idx["file"] = f".{idx['file']}"
                splits[s] = {"info": info, "idx": idx}
            else:
                splits[s] = {"info": info, "idx": idx, "renames": writer.renames()}
        if not record:
            return {"splits": splits}
        # The record first, then the renames: a run killed between them leaves a record whose files
        # do not verify (the unit is redone) and no final name that no record claims.
        saved = save(out, unit, record, splits)
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
              single: bool, config: PrepareConfig, started: float, total_bytes: int) -> None:
    """Every piece into its split's writer: a lone document by its cut, others by their hash."""
    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, disable=config.quiet or None,
               desc="tokpack.prepare", file=sys.stderr, smoothing=0.1)
    try:
        for count, (piece, tokens) in enumerate(stream):
            raw = piece.text.encode("utf-8", "surrogatepass")
            bar.update(len(raw))
            if count % 64 == 0 and not bar.disable:
                done = sum(w.tokens for w in writers.values()) + buffer.held + buffer.spilled
                bar.set_postfix_str(f"{done / (time.perf_counter() - started):,.0f} tokens/s", refresh=False)
            if single:
                writer = writers[SPLITS[piece.doc]]
                if not writer.documents:  # each split holds one part of the lone document
                    writer.start_document()
                writer.write(tokens)
                if piece.last:
                    writer.end_document()
                continue
            buffer.add(raw, tokens)
            if piece.last:
                split = "val" if in_val(buffer.hash.digest(), config.val_fraction) else "train"
                buffer.drain_into(writers[split])
                buffer.reset()
    finally:
        bar.close()
        buffer.discard()
