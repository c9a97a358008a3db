"""Writers of a prepared folder: hashed files under temporary names, the split rule, meta.json.

    python -m tokpack.prepare corpus.txt      # uses these to write train/val .bin, .idx, meta.json

Every file is written under a temporary name and renamed only when complete; a document's
tokens wait (in memory, or on disk past ``SPILL_TOKENS``) until its split is known from a seeded
hash of its text.
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

from .format import INDEX_DTYPE

TMP_SUFFIX = ".tokpack-tmp"
SPILL_TOKENS = 1 << 23  # a document's tokens beyond this wait on disk until its split is known
INDEX_FLUSH = 1 << 16  # document starts held before they are appended to the .idx


def in_val(text_hash: bytes, val_fraction: float) -> bool:
    """The split rule: a document goes to val when its seeded hash falls under the fraction."""
    return int.from_bytes(text_hash, "big") < val_fraction * 2**64


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
