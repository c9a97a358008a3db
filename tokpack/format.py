"""On-disk format: flat token files, document indexes, meta.json, and llm.c shards.

    python -c "from tokpack.format import read_meta; print(read_meta('data/sample'))"

A prepared folder holds ``train.bin`` / ``val.bin`` (flat token ids, no header, nanoGPT's
format), ``train.idx`` / ``val.idx`` (little-endian uint64 start offset of every document) and
``meta.json``, which names the dtype so no reader guesses it. ``meta.json`` is written last, so a
folder without it is incomplete.
"""

from __future__ import annotations

import array
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

FORMAT_VERSION = 1
META_NAME = "meta.json"
SPLITS = ("train", "val")
INDEX_DTYPE = np.dtype("<u8")
TMP_SUFFIX = ".tokpack-tmp"

# llm.c / modded-nanogpt shards: 256 int32 header words (magic, version, token count), then uint16.
SHARD_MAGIC = 20240520
SHARD_HEADER_BYTES = 256 * 4
SPILL_TOKENS = 1 << 23  # a document's tokens beyond this wait on disk until its split is known
INDEX_FLUSH = 1 << 16  # document starts held before they are appended to the .idx


def tmp_path(path: Path) -> Path:
    """Where ``path`` is written before the rename that publishes it."""
    return path.with_name(f".{path.name}{TMP_SUFFIX}")


class HashingWriter:
    """Appends bytes to a temporary file, hashing them on the way."""

    def __init__(self, path: Path):
        self.path = path
        self.tmp = tmp_path(path)
        self.sha256 = hashlib.sha256()
        self.nbytes = 0
        self._file: BinaryIO = open(self.tmp, "wb")

    def write(self, data: bytes | np.ndarray) -> None:
        view = memoryview(data).cast("B")
        self._file.write(view)
        self.sha256.update(view)
        self.nbytes += len(view)

    def close(self) -> dict[str, Any]:
        """Flush to disk and describe the file for meta.json; the caller renames it."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return {"file": self.path.name, "bytes": self.nbytes, "sha256": self.sha256.hexdigest()}

    def discard(self) -> None:
        self._file.close()
        self.tmp.unlink(missing_ok=True)


@dataclass
class SplitWriter:
    """One split's .bin and .idx, written to temporary names."""

    folder: Path
    split: str
    dtype: np.dtype
    eot: str
    eot_id: int
    tokens: int = 0
    documents: int = 0

    def __post_init__(self) -> None:
        self.bin = HashingWriter(self.folder / f"{self.split}.bin")
        self.idx = HashingWriter(self.folder / f"{self.split}.idx")
        self._eot = np.array([self.eot_id], dtype=self.dtype)
        self._starts = array.array("Q")  # flushed to .idx in blocks, so memory stays flat

    def start_document(self) -> None:
        self._starts.append(self.tokens)
        self.documents += 1
        if len(self._starts) >= INDEX_FLUSH:
            self._flush_starts()
        if self.eot == "prepend":
            self.write(self._eot)

    def _flush_starts(self) -> None:
        self.idx.write(np.frombuffer(self._starts, dtype=np.uint64).astype(INDEX_DTYPE))
        self._starts = array.array("Q")

    def write(self, tokens: np.ndarray) -> None:
        self.bin.write(tokens)
        self.tokens += len(tokens)

    def end_document(self) -> None:
        if self.eot == "append":
            self.write(self._eot)

    def close(self) -> dict[str, Any]:
        self._flush_starts()
        return {"tokens": self.tokens, "documents": self.documents,
                "bin": self.bin.close(), "idx": self.idx.close()}

    def publish(self) -> None:
        for writer in (self.bin, self.idx):
            os.replace(writer.tmp, writer.path)

    def discard(self) -> None:
        self.bin.discard()
        self.idx.discard()


class DocumentBuffer:
    """A document's tokens held until its split is known; large ones spill to disk."""

    def __init__(self, folder: Path, seed: int):
        self.spill_path = folder / f".spill{os.getpid()}.tokpack-tmp"
        self.key = seed.to_bytes(8, "little", signed=True)
        self.reset()

    def reset(self) -> None:
        """Empty, for the next document; its split hash is keyed by the seed."""
        self.parts: list[np.ndarray] = []
        self.held = self.spilled = 0
        self.hash = hashlib.blake2b(digest_size=8, key=self.key)

    def add(self, text: bytes, tokens: np.ndarray) -> None:
        self.hash.update(text)
        self.parts.append(tokens)
        self.held += len(tokens)
        if self.held > SPILL_TOKENS:
            with open(self.spill_path, "ab" if self.spilled else "wb") as f:
                for part in self.parts:
                    f.write(memoryview(part).cast("B"))
            self.spilled += self.held
            self.parts, self.held = [], 0

    def drain_into(self, writer: SplitWriter) -> None:
        writer.start_document()
        if self.spilled:
            dtype = writer.dtype
            with open(self.spill_path, "rb") as f:
                while chunk := f.read(SPILL_TOKENS * dtype.itemsize):
                    writer.write(np.frombuffer(chunk, dtype=dtype))
        for part in self.parts:
            writer.write(part)
        writer.end_document()

    def discard(self) -> None:
        self.spill_path.unlink(missing_ok=True)


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = tmp_path(path)
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_meta(folder: str | Path) -> dict[str, Any]:
    """The meta.json of a prepared folder, checked for a format this version reads."""
    path = Path(folder) / META_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: {folder} is not a complete prepared folder; "
            "run python -m tokpack.prepare to (re)create it"
        )
    try:
        meta = json.loads(path.read_text("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); rerun python -m tokpack.prepare --force") from None
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{path} has format_version {version!r}, this tokpack reads {FORMAT_VERSION}; "
            "rerun python -m tokpack.prepare --force or upgrade tokpack"
        )
    return meta


def shard_token_count(path: Path) -> int | None:
    """Token count from an llm.c shard header, or None if ``path`` has no such header."""
    with open(path, "rb") as f:
        head = f.read(SHARD_HEADER_BYTES)
    if len(head) < SHARD_HEADER_BYTES:
        return None
    header = np.frombuffer(head, dtype="<i4")
    if header[0] != SHARD_MAGIC:
        return None
    if header[1] != 1:
        raise ValueError(f"{path} is an llm.c shard of version {header[1]}; only version 1 (uint16) is read")
    return int(header[2])


def open_tokens(path: str | Path, dtype: str | np.dtype | None = None) -> np.memmap:
    """Memory-map a token file: a prepared split, an llm.c shard, or a bare file with ``dtype``.

    The dtype comes from meta.json beside the file, then from an llm.c header, then from
    ``dtype``; a file whose size does not fit it is refused.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"token file {path} does not exist; run python -m tokpack.prepare first")
    size = path.stat().st_size
    offset = 0
    meta_path = path.parent / META_NAME
    shard_tokens = shard_token_count(path)
    if shard_tokens is not None:
        found, offset = np.dtype("<u2"), SHARD_HEADER_BYTES
        expected = SHARD_HEADER_BYTES + 2 * shard_tokens
        if size != expected:
            raise ValueError(
                f"{path} is {size} bytes but its llm.c header promises {shard_tokens} tokens "
                f"({expected} bytes); the shard is truncated, re-create it"
            )
    elif meta_path.is_file():
        found = np.dtype(read_meta(path.parent)["dtype"])
    elif dtype is not None:
        found = np.dtype(dtype)
    else:
        raise ValueError(
            f"cannot tell the dtype of {path}: no meta.json beside it and no llm.c header; "
            "pass dtype='uint16' (or the dtype it was written with)"
        )
    if dtype is not None and np.dtype(dtype) != found:
        raise ValueError(f"{path} holds {found} tokens, not the dtype={np.dtype(dtype)} asked for; drop dtype=")
    if (size - offset) % found.itemsize:
        raise ValueError(
            f"{path} is {size} bytes, not a whole number of {found} tokens "
            f"({found.itemsize} bytes each); the file is truncated, re-create it"
        )
    if size == offset:
        raise ValueError(f"{path} holds no tokens; prepare a non-empty corpus")
    return np.memmap(path, dtype=found, mode="r", offset=offset)
