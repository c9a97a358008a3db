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
from pathlib import Path

import numpy as np

from .cli import parser, run_cli
from .format import INDEX_DTYPE, read_meta, split_files
from .split import open_splits

CHUNK_BYTES = 1 << 24


class VerifyError(Exception):
    """A prepared folder that is not whole; the message says what and where."""


def _check_file(path: Path, info: dict) -> None:
    if not path.is_file():
        raise VerifyError(f"{path} is missing")
    size = path.stat().st_size
    if size != info["bytes"]:
        raise VerifyError(f"{path} is {size} bytes, meta.json says {info['bytes']}")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    if digest.hexdigest() != info["sha256"]:
        raise VerifyError(f"{path} has sha256 {digest.hexdigest()}, meta.json says {info['sha256']}")


def verify_folder(folder: str | Path) -> dict[str, int]:
    """Raise VerifyError (or FileNotFoundError) unless ``folder`` is whole; returns tokens per split."""
    folder = Path(folder)
    meta = read_meta(folder)
    dtype = np.dtype(meta["dtype"])
    n_vocab = meta["encoding"]["n_vocab"]
    if n_vocab > np.iinfo(dtype).max + 1:
        raise VerifyError(f"dtype {dtype} in meta.json cannot hold n_vocab {n_vocab}")
    for info in meta["splits"].values():
        for entry in (info["idx"], *split_files(info)):
            _check_file(folder / entry["file"], entry)
    try:
        splits = open_splits(folder, meta)
    except ValueError as exc:
        raise VerifyError(str(exc)) from None
    counts = {}
    for name, info in meta["splits"].items():
        split, idx_path = splits[name], folder / info["idx"]["file"]
        for entry, file in zip(split_files(info), split.files):
            if "tokens" in entry and file.tokens != entry["tokens"]:
                raise VerifyError(f"{file.path} holds {file.tokens} tokens, meta.json says {entry['tokens']}")
            tokens = file.memmap()
            step = CHUNK_BYTES // dtype.itemsize
            for start in range(0, len(tokens), step):
                top = int(tokens[start:start + step].max())
                if top >= n_vocab:
                    raise VerifyError(f"{file.path} holds id {top} near token {start}, n_vocab is {n_vocab}")
        total = int(split.lengths.sum())
        if total != info["tokens"]:
            raise VerifyError(f"{name} should hold {info['tokens']} {dtype} tokens, its files hold {total}")
        starts = np.fromfile(idx_path, dtype=INDEX_DTYPE)
        if len(starts) != info["documents"]:
            raise VerifyError(f"{idx_path} lists {len(starts)} documents, meta.json says {info['documents']}")
        if len(starts) and (starts[0] != 0 or (np.diff(starts.astype(np.int64)) <= 0).any()
                            or starts[-1] >= info["tokens"]):
            raise VerifyError(f"{idx_path} is not a strictly increasing list of offsets inside {split.describe()}")
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
        return 0

    return run_cli(body)


if __name__ == "__main__":
    raise SystemExit(main())
