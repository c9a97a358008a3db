"""Prove that a prepared folder is whole and consistent with its meta.json.

    python -m tokpack.verify data/sample      # exit 0 when whole, 1 with the reason otherwise

Checks, per split: every token file's size and sha256 against meta.json (a flat .bin, or llm.c
shards with their headers), the token counts, every id below n_vocab, and the document index
(count, first offset 0, strictly increasing, inside the split).
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .cli import parser, run_cli
from .format import (INDEX_DTYPE, megatron_document_starts, read_meta, token_offset,
                     remove_leftovers, split_files)
from .split import open_splits
from .storage import is_url
from .storage.cache import published

CHUNK_BYTES = 1 << 22  # verify streams: memory is two of these, not the size of a file


class VerifyError(Exception):
    """A prepared folder that is not whole; the message says what and where."""


def check_file(path: Path, info: dict, dtype: np.dtype | None = None, offset: int = 0, n_vocab: int = 0) -> None:
    """The file's size and sha256 against meta.json and, for a token file (``dtype`` given), every
    id below ``n_vocab``: one streaming read in fixed blocks, so memory does not grow with the file."""
    if not path.is_file():
        raise VerifyError(f"{path} is missing")
    size = path.stat().st_size
    if size != info["bytes"]:
        raise VerifyError(f"{path} is {size} bytes, meta.json says {info['bytes']}")
    with open(path, "rb") as f:
        check_stream(f, str(path), info, dtype, offset, n_vocab)


def check_stream(f: BinaryIO, where: str, info: dict, dtype: np.dtype | None = None, offset: int = 0,
                 n_vocab: int = 0) -> None:
    """``check_file`` of an open stream (a local file, or a remote object read in ranges). A block
    is hashed in a thread while the next is read and its ids checked: sha256 is the slow part, and
    it lets go of the GIL."""
    digest = hashlib.sha256()
    done = 0
    with ThreadPoolExecutor(1, thread_name_prefix="tokpack-verify") as hashing:
        hashed: Future[None] | None = None
        while chunk := f.read(CHUNK_BYTES):
            if hashed is not None:
                hashed.result()
                hashed = None
            if len(chunk) < CHUNK_BYTES:  # the last block: hashed here (a small file starts no thread)
                digest.update(chunk)
            else:
                hashed = hashing.submit(digest.update, chunk)
            body = chunk[max(offset - done, 0):]
            if dtype is not None and body:
                top = int(np.frombuffer(body, dtype=dtype).max())
                if top >= n_vocab:
                    raise VerifyError(f"{where} holds id {top} near byte {done}, n_vocab is {n_vocab}")
            done += len(chunk)
        if hashed is not None:
            hashed.result()
    if done != info["bytes"]:
        raise VerifyError(f"{where} is {done} bytes, meta.json says {info['bytes']}")
    if digest.hexdigest() != info["sha256"]:
        raise VerifyError(f"{where} has sha256 {digest.hexdigest()}, meta.json says {info['sha256']}")


def check_index(path: Path, documents: int, tokens: int, where: str) -> None:
    """The document index, streamed: ``documents`` starts, from 0, strictly increasing, below ``tokens``."""
    with open(path, "rb") as f:
        check_index_stream(f, str(path), documents, tokens, where)


def check_index_stream(f: BinaryIO, path: str, documents: int, tokens: int, where: str) -> None:
    """``check_index`` of an open stream."""
    count, last = 0, -1
    while chunk := f.read(CHUNK_BYTES):
        starts = np.frombuffer(chunk, dtype=INDEX_DTYPE).astype(np.int64)
        if (count == 0 and starts[0] != 0) or starts[0] <= last or (np.diff(starts) <= 0).any():
            raise VerifyError(f"{path} is not a strictly increasing list of offsets inside {where}")
        count, last = count + len(starts), int(starts[-1])
    if count != documents:
        raise VerifyError(f"{path} lists {count} documents, meta.json says {documents}")
    if last >= tokens:
        raise VerifyError(f"{path} is not a strictly increasing list of offsets inside {where}")


def verify_folder(folder: str | Path) -> dict[str, int]:
    """Raise VerifyError (or FileNotFoundError) unless ``folder`` (a local folder, or a remote
    one's URL: ``verify_remote``) is whole; returns tokens per split."""
    if isinstance(folder, str) and is_url(folder):
        return verify_remote(folder)
    folder = Path(folder)
    meta = read_meta(folder)
    dtype = np.dtype(meta["dtype"])
    n_vocab = meta["encoding"]["n_vocab"]
    if n_vocab > np.iinfo(dtype).max + 1:
        raise VerifyError(f"dtype {dtype} in meta.json cannot hold n_vocab {n_vocab}")
    try:
        splits = open_splits(folder, meta)  # sizes, headers and the folder's own files, before any read
    except ValueError as exc:
        raise VerifyError(str(exc)) from None
    counts = {}
    for name, info in meta["splits"].items():
        split, idx_path = splits[name], folder / info["idx"]["file"]
        for entry, file in zip(split_files(info), split.files):
            if "tokens" in entry and file.tokens != entry["tokens"]:
                raise VerifyError(f"{file.path} holds {file.tokens} tokens, meta.json says {entry['tokens']}")
            check_file(file.path, entry, dtype, file.offset, n_vocab)
        total = int(split.lengths.sum())
        if total != info["tokens"]:
            raise VerifyError(f"{name} should hold {info['tokens']} {dtype} tokens, its files hold {total}")
        check_file(idx_path, info["idx"])
        check_index(idx_path, info["documents"], info["tokens"], split.describe())
        if "megatron_idx" in info:  # Megatron's index must name the very same documents
            megatron = folder / info["megatron_idx"]["file"]
            check_file(megatron, info["megatron_idx"])
            try:
                starts = megatron_document_starts(megatron, info["tokens"], dtype.itemsize)
            except ValueError as exc:
                raise VerifyError(str(exc)) from None
            if not np.array_equal(starts, np.fromfile(idx_path, dtype=INDEX_DTYPE).astype(np.int64)):
                raise VerifyError(f"{megatron} names other documents than {idx_path}")
        counts[name] = info["tokens"]
    return counts


def verify_remote(url: str, storage_options: dict | None = None) -> dict[str, int]:
    """``verify_folder`` of a remote folder, streamed: each listed object read once in ranges
    (its size, sha256 and ids checked as a local file's), nothing stored. A Megatron index is
    checked by its hash alone (the local check also compares its documents with tokpack's)."""
    try:
        store, meta, _ = published(url, storage_options)
    except ValueError as exc:
        raise VerifyError(str(exc)) from None
    fs, key, where = store.fs, store.key, store.where
    dtype, n_vocab = np.dtype(meta["dtype"]), meta["encoding"]["n_vocab"]
    offset = token_offset(meta)
    counts = {}
    for name, info in meta["splits"].items():
        files = split_files(info)
        total = sum((entry["bytes"] - offset) // dtype.itemsize for entry in files)
        if total != info["tokens"] or any(entry.get("tokens", total) * dtype.itemsize + offset != entry["bytes"]
                                          for entry in files):
            raise VerifyError(f"{where}: the {name} files' sizes hold {total} {dtype} tokens, meta.json says "
                              f"{info['tokens']}")
        for entry in files:
            with fs.open(key(entry["file"]), "rb", block_size=CHUNK_BYTES) as f:
                check_stream(f, f"{where}/{entry['file']}", entry, dtype, offset, n_vocab)
        if "megatron_idx" in info:
            with fs.open(key(info["megatron_idx"]["file"]), "rb") as f:
                check_stream(f, f"{where}/{info['megatron_idx']['file']}", info["megatron_idx"])
        idx = info["idx"]
        with fs.open(key(idx["file"]), "rb") as f:
            check_stream(f, f"{where}/{idx['file']}", idx)
        with fs.open(key(idx["file"]), "rb") as f:
            check_index_stream(f, f"{where}/{idx['file']}", info["documents"], info["tokens"], f"{where} ({name})")
        counts[name] = info["tokens"]
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    p = parser("verify", __doc__)
    p.add_argument("folder", help="a folder written by python -m tokpack.prepare")
    args = p.parse_args(argv)

    def body() -> int:
        try:
            counts = verify_folder(args.folder)
        except (VerifyError, FileNotFoundError, ValueError) as exc:
            print(f"tokpack.verify: {args.folder} is NOT whole: {exc}", file=sys.stderr)
            return 1
        parts = ", ".join(f"{split} {n:,} tokens" for split, n in counts.items())
        print(f"tokpack.verify: {args.folder} is whole ({parts})")
        removed = [] if is_url(args.folder) else remove_leftovers(Path(args.folder))
        if removed:
            print(f"tokpack.verify: removed {len(removed)} leftovers of a run killed after it finished "
                  f"({', '.join(removed[:3])}{', ...' if len(removed) > 3 else ''})")
        return 0

    return run_cli(body)


if __name__ == "__main__":
    raise SystemExit(main())
