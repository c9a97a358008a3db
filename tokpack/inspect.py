"""Summarise a prepared folder and decode a peek of its tokens.

    python -m tokpack.inspect data/sample                       # summary + the first 64 tokens of train
    python -m tokpack.inspect data/sample --split val --at 1000 --count 32
    python -m tokpack.inspect data/sample --lengths --block-size 1024          # document lengths as text
    python -m tokpack.inspect data/sample --lengths lengths.png               # and as a figure (tokpack[plot])
    python -m tokpack.inspect s3://bucket/edu --split val --at 5000           # a remote folder: the peek alone
    python -m tokpack.inspect data/corpus --guard --split val                 # what the guard moved or removed
    python -m tokpack.inspect data/corpus --guard val:12                      # document 12 of val's near copies

See docs/formats.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .cli import parser, run_cli
from .format import (GUARD_ROW_LIMIT, MASK_DTYPE, FileEntry, Meta, describe_guard, mask_files, parse_guard_row,
                     split_files, token_offset)
from .storage.folder import Folder, as_folder, published
from .tokenizer import folder_encoding


Reader = Callable[[int, int], list[int]]  # (first item, count) -> the values of one file
Files = list[tuple[int, Reader]]  # each file's length in items, and its reader


def _readers(where: Folder, entries: list[FileEntry], dtype: np.dtype, offset: int) -> Files:
    """A reader of each file of ``entries``, items of ``dtype`` after ``offset`` header bytes."""
    def reader(name: str) -> Reader:
        def read(lo: int, n: int) -> list[int]:
            start = offset + lo * dtype.itemsize
            data = where.read(name, start, start + n * dtype.itemsize)
            if len(data) != n * dtype.itemsize:
                raise ValueError(f"{where.where}/{name} ends before the {n} items at {lo} that meta.json records; "
                                 f"python -m tokpack.verify {where.where} says more")
            return np.frombuffer(data, dtype=dtype).tolist()
        return read

    return [((entry["bytes"] - offset) // dtype.itemsize, reader(entry["file"])) for entry in entries]


def _files(where: Folder, split: str) -> tuple[Meta, Files, Files]:
    """A folder's meta.json and a reader of each of ``split``'s token files and of its mask files
    (none for a split without a mask): a peek reads the peek's bytes alone, from a local file or
    in one range request, once every file is found at its size (O(files) stats or requests)."""
    meta, _ = published(where)
    if split not in meta["splits"]:
        raise ValueError(f"split {split!r} is not in {where.where}; choose one of {', '.join(meta['splits'])}")
    for info in meta["splits"].values():  # every file where meta.json says, its own (no link), at its size
        for entry in [*split_files(info), *mask_files(info)]:
            if where.size(entry["file"]) != entry["bytes"]:
                raise ValueError(f"{where.where}/{entry['file']} is not the {entry['bytes']:,} bytes meta.json "
                                 f"records; python -m tokpack.verify {where.where} says more")
    info = meta["splits"][split]
    return (meta, _readers(where, split_files(info), np.dtype(meta["dtype"]), token_offset(meta)),
            _readers(where, mask_files(info), MASK_DTYPE, 0))


def _peek(files: Files, at: int, count: int) -> list[int]:
    """``count`` values from ``at`` of files read as one, concatenated."""
    values: list[int] = []
    skip = at
    for length, read in files:
        if skip >= length:
            skip -= length
            continue
        values += read(skip, min(count - len(values), length - skip))
        skip = 0
        if len(values) == count:
            break
    return values


def describe(folder: str | Path, split: str = "train", at: int = 0, count: int = 64) -> str:
    """The summary and a decoded peek of ``count`` tokens from offset ``at`` of ``split``, of a
    local folder or a remote one (its URL): meta.json and the peek's bytes alone are read."""
    where = as_folder(folder)
    meta, files, masks = _files(where, split)
    enc_info = meta["encoding"]
    lines = [
        f"{folder}: {enc_info['name']} (n_vocab {enc_info['n_vocab']:,}, eot {enc_info['eot_id']}), "
        f"{meta['dtype']}, eot {meta['eot']}, tokpack {meta['tokpack_version']}"
    ]
    for name, info in meta["splits"].items():
        per_doc = info["tokens"] / max(info["documents"], 1)
        lines.append(f"  {name:5s} {info['tokens']:>13,} tokens {info['documents']:>9,} documents "
                     f"({per_doc:,.0f} tokens/document)  {len(split_files(info))} file(s)")
    if count < 1:
        raise ValueError(f"--count {count} must be at least 1")
    n = sum(length for length, _ in files)
    if not 0 <= at < n:
        raise ValueError(f"--at {at} is outside {split} (0..{n - 1}); pick an offset inside it")
    ids = _peek(files, at, count)  # the split's tokens are its files' tokens, concatenated
    lines.append(f"{split}[{at}:{at + len(ids)}] ids: {ids}")
    enc = folder_encoding(meta)
    lines.append(f"decoded: {enc.decode(ids)!r}")
    info = meta["splits"][split]
    if masks:  # a split of conversations: which of the peek's tokens are trained on
        mask = _peek(masks, at, len(ids))  # a mask file a token file, one byte a token
        trained = "".join(enc.decode([i]) if m else "\u2591" for i, m in zip(ids, mask))
        lines.append(f"trained on ({info['supervised']:,} of {info['tokens']:,} tokens of {split}; \u2591 = not): "
                     f"{trained!r}")
    return "\n".join(lines)


def _rows(where: Folder, meta: Meta) -> Iterator[tuple[str, dict[str, Any]]]:
    """(split, row) of every line of the folder's guard reports, each read to its bound and
    checked to be a row (``format.parse_guard_row``)."""
    for split, info in meta["splits"].items():
        if "guard" in info:
            name = info["guard"]["file"]
            with where.open(name) as f:
                for number, line in enumerate(iter(lambda: f.readline(GUARD_ROW_LIMIT + 1), b""), 1):
                    yield split, parse_guard_row(line, f"{where.where}/{name}:{number}")


def guard_report(folder: str | Path, split: str, which: str | None, count: int) -> str:
    """The guard's summary and the first ``count`` rows of ``split``'s report; or, with ``which``
    (a document's number in the report, or SPLIT:INDEX, the INDEX-th document written to SPLIT),
    that document and the others of its cluster."""
    where = as_folder(folder)
    meta, _ = published(where)
    if "guard" not in meta:
        raise ValueError(f"{folder} was prepared without --near-split, --dedup or --decontaminate: it has no guard "
                         "report")
    lines = [describe_guard(meta), f"meta.json: {json.dumps(meta['guard'])}"]  # type: ignore[typeddict-item]
    if which is None:
        rows = [row for s, row in _rows(where, meta) if s == split]
        lines += [_row(row) for row in rows[:count]]
        lines.append(f"({len(rows):,} documents in {split}'s report)")
        return "\n".join(lines)
    target = _target(which)
    rows = list(_rows(where, meta))
    found = next((row for s, row in rows if target in (row["document"], (s, row["index"]))), None)
    if found is None:
        return "\n".join(lines + [f"{which}: no near copy, copy or evaluation n-gram was found for it"])
    cluster = found["cluster"]
    lines += [f"{s}: {_row(row)}" for s, row in rows if row is found or (cluster is not None and row["cluster"] == cluster)]
    return "\n".join(lines)


def _target(which: str) -> int | tuple[str, int]:
    split, _, index = which.rpartition(":")
    try:
        return (split, int(index)) if split else int(index)
    except ValueError:
        raise ValueError(f"--guard {which!r} is not a document number nor SPLIT:INDEX (val:12)") from None


def _row(row: dict[str, Any]) -> str:
    written = f"index {row['index']}" if row["index"] is not None else "not written" if row["removed"] else "written"
    why = f", removed as {row['removed']}" if row["removed"] else ""
    cluster = (f", cluster of document {row['cluster']} (similarity {row['similarity']})"
               if row["cluster"] is not None else "")
    held = f", holds n-grams of {', '.join(row['evaluation'])}" if row.get("evaluation") else ""
    return f"document {row['document']} of {row['file']} ({row['own_split']} by its hash; {written}{why}{cluster}{held})"


def main(argv: Sequence[str] | None = None) -> int:
    p = parser("inspect", __doc__)
    p.add_argument("folder", help="a folder written by python -m tokpack.prepare")
    p.add_argument("--split", default="train", help="split to peek into (default: train)")
    p.add_argument("--at", type=int, default=0, help="token offset of the peek (default: 0)")
    p.add_argument("--count", type=int, default=64, help="tokens to decode (default: 64)")
    p.add_argument("--lengths", nargs="?", const="", metavar="PNG",
                   help="print document-length statistics per split; with a PNG, also draw their histogram")
    p.add_argument("--block-size", type=int, default=1024,
                   help="the block size the long-document share is counted against (default: 1024)")
    p.add_argument("--guard", nargs="?", const="", metavar="DOCUMENT",
                   help="what the guard (--near-split, --dedup, --decontaminate) moved, removed and found in --split; "
                        "with a document (its number in the report, or SPLIT:INDEX), it and its near copies")
    args = p.parse_args(argv)

    def body() -> None:
        if args.guard is not None:
            print(guard_report(args.folder, args.split, args.guard or None, args.count))
            return
        if args.lengths is None:
            print(describe(args.folder, args.split, args.at, args.count))
            return
        if args.block_size < 1:
            raise ValueError(f"--block-size {args.block_size} must be at least 1")
        from .plot import describe_lengths, plot_lengths, png_path

        if args.lengths:
            png_path(args.lengths)  # a missing extra or a bad name is one line before the work
        text, stats = describe_lengths(args.folder, args.block_size)
        print(text)
        if args.lengths:
            print(f"tokpack.inspect: {plot_lengths(stats, args.lengths)}")

    return run_cli(body)


if __name__ == "__main__":
    raise SystemExit(main())
