"""Writers of a prepared folder: hashed files under temporary names, the split rule, meta.json.

    python -m tokpack.prepare corpus.txt      # uses these to write train/val .bin, .idx, meta.json

Every file is written under a temporary name and renamed only when complete; a document's
tokens wait (in memory, or on disk past ``SPILL_TOKENS``) until its split is known from a seeded
hash of its text.

See docs/prepare.md.
"""

from __future__ import annotations

import array
import hashlib
import os
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ...format import (BIN_NAME, IDX_NAME, INDEX_DTYPE, MASK_DTYPE, MASK_NAME, SHARD_DTYPE_VERSION, SHARD_HEADER_BYTES,
                       SHARD_VERSIONS, SPLITS, TMP_SUFFIX, FileEntry)
from ...storage.local import named_errors, open_new, remove_own, tmp_path
from ..plan.holdout import document_hash, document_key

SPILL_TOKENS = 1 << 23  # a document's tokens beyond this wait on disk until its split is known
INDEX_FLUSH = 1 << 16  # document starts held before they are appended to the .idx
WRITEBACK_BYTES = 1 << 20  # a token file's bytes between the starts of its write-backs to disk
_datasync = getattr(os, "fdatasync", os.fsync)  # fdatasync is POSIX; elsewhere, fsync


def _close_quietly(f: BinaryIO) -> None:
    """Close a file being discarded: its unwritten buffer must not raise over the error that
    discards it (a full disk fails the flush again)."""
    try:
        f.close()
    except OSError:
        pass


def remove_temporaries(folder: Path, every_run: bool = False) -> None:
    """This process's temporary files in ``folder``, whatever state its writers were left in; with
    ``every_run``, those that killed runs left too."""
    for tmp in folder.glob(f".*{TMP_SUFFIX}" if every_run else f".*.{os.getpid()}{TMP_SUFFIX}"):
        remove_own(tmp)


class WriteBack:
    """Starts a file's write-back to disk (``fdatasync``) in a thread every ``every`` bytes written,
    one at a time, none queued, while tokenizing goes on: the fsync that publishes the file then
    waits for the last MiB or so, not for all of it (at the end of a run, or mid-run as a shard
    finishes, where the encoders would wait with it). A failed write-back (a disk error) raises in
    the writer, at its next one or at ``wait``."""

    def __init__(self, every: int | None):
        self.every = every  # None: none, the fsync does all
        self._unsynced = 0
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tokpack-writeback")  # its thread starts on use
        self._syncing: tuple[Future[None], Path] | None = None

    def wrote(self, f: BinaryIO, nbytes: int, path: Path) -> None:
        """``nbytes`` more were written to ``f`` (named ``path`` in errors)."""
        self._unsynced += nbytes
        busy = self._syncing is not None and not self._syncing[0].done()
        if self.every is not None and self._unsynced >= self.every and not busy:
            self.start(f, path)

    def start(self, f: BinaryIO, path: Path) -> None:
        """Start ``f``'s write-back now, after the one under way: a file just filled, before the next."""
        if self.every is None:
            return
        self.wait()
        self._unsynced = 0
        self._syncing = self._pool.submit(_datasync, f.fileno()), path

    def wait(self) -> None:
        """Until the write-back under way is done: before its file is closed."""
        syncing, self._syncing = self._syncing, None
        if syncing is not None:
            with named_errors(syncing[1]):
                syncing[0].result()

    def close(self) -> None:
        """No write-back runs after this; one under way is waited for (its error dropped: for discards)."""
        self._pool.shutdown()


class HashingWriter:
    """Appends bytes to a temporary file, hashing them on the way. Small writes (a document's
    tokens, its end-of-text) gather in a buffer, written and hashed a block at a time: per
    write, that costs a copy instead of a call to the file and the hash each. Its write-back to
    disk starts as it goes (``WriteBack``)."""

    BUFFER_BYTES = 1 << 18

    def __init__(self, path: Path, writeback_bytes: int | None = WRITEBACK_BYTES):
        """Args:
            path: the file's final name; it is written at a temporary name beside it.
            writeback_bytes: bytes between write-backs; None starts none (the fsync at close does all).
        """
        self.path = path
        self.tmp = tmp_path(path)
        self.sha256 = hashlib.sha256()
        self.nbytes = 0
        self._file: BinaryIO = open_new(self.tmp)
        self._buffer = bytearray(self.BUFFER_BYTES)
        self._used = 0
        self._writeback = WriteBack(writeback_bytes)

    def write(self, data: bytes | np.ndarray) -> None:
        view = memoryview(data).cast("B")
        n = len(view)
        self.nbytes += n
        if self._used + n > self.BUFFER_BYTES:
            self._drain()
            if n >= self.BUFFER_BYTES:
                self._put(view)
                return
        self._buffer[self._used:self._used + n] = view
        self._used += n

    def _drain(self) -> None:
        if self._used:
            self._put(memoryview(self._buffer)[:self._used])
            self._used = 0

    def _put(self, view: memoryview) -> None:
        with named_errors(self.path):
            self._file.write(view)
        self.sha256.update(view)
        self._writeback.wrote(self._file, len(view), self.path)

    def close(self) -> FileEntry:
        """Flush to disk and describe the file for meta.json; the caller renames it."""
        self._drain()
        self._writeback.wait()
        self._writeback.close()
        with named_errors(self.path):
            self._file.flush()
            os.fsync(self._file.fileno())
        self._file.close()
        return {"file": self.path.name, "bytes": self.nbytes, "sha256": self.sha256.hexdigest()}

    def start_document(self, tokens: int) -> None:
        """A flat file keeps no document boundaries of its own (the index does)."""

    def write_documents(self, data: np.ndarray, bounds: np.ndarray) -> None:
        """Documents laid end to end (the i-th at ``bounds[i]:bounds[i + 1]``): one write."""
        self.write(data)

    def renames(self) -> list[tuple[str, str]]:
        """(temporary, final) path of the file, for the publishing rename."""
        return [(str(self.tmp), str(self.path))]

    def discard(self) -> None:
        self._writeback.close()  # the file is not closed under its write-back
        _close_quietly(self._file)
        remove_own(self.tmp)


@dataclass(frozen=True)
class ShardLayout:
    """How a split is cut into files: ``{prefix}{k:06d}.bin`` from k = ``first``, at most
    ``max_tokens`` tokens each (None: no limit), with llm.c's header or with none. With
    ``at_documents`` a shard ends before a document that would not fit it (one longer than a shard
    runs on across shards); ``min_shards`` 2 splits a lone shard of two or more documents in two."""

    prefix: str
    first: int
    max_tokens: int | None
    header: bool
    at_documents: bool = False
    min_shards: int = 1
    suffix: str = ".bin"  # ".mask": a conversation shard's loss mask, cut as its tokens are


class ShardWriter:
    """A split as shard files (llm.c's: 256 int32 header words, magic, version, token count, then
    the tokens; or bare tokens). The shards' tokens, concatenated, are the flat split: documents
    run on across shard boundaries, or with ``at_documents`` each shard ends at a document's end.

    A full shard is held open until the next one fills too: if the writer closes with a last shard
    under half of the held one, the two share their tokens evenly (at the document start nearest
    the middle with ``at_documents``), so no shard of a writer falls below half (llm.c's loader
    aborts on a shard shorter than processes x B x T + 1 tokens, and modded-nanogpt's on a short
    validation shard); modded-nanogpt also needs two train shards, which ``min_shards`` gives.
    Costs one extra pass over one shard, in blocks; O(documents of two shards) memory for their
    starts with ``at_documents``.
    """

    def __init__(self, folder: Path, layout: ShardLayout, dtype: np.dtype):
        self.folder, self.dtype, self.layout = folder, dtype, layout
        self.shard_tokens = layout.max_tokens or np.iinfo(np.int64).max
        if layout.header:
            self.magic, self.version = SHARD_VERSIONS[dtype.name], SHARD_DTYPE_VERSION[dtype.name]
        self.prefix, self.next_index = layout.prefix, layout.first
        self.shards: list[dict[str, Any]] = []
        self.paths: list[Path] = []
        self._file: BinaryIO | None = None
        self._count = 0
        self._starts = array.array("Q")  # document starts in the open shard
        self._pending = False  # a document starts with the next shard
        self._held: tuple[BinaryIO, int, int, array.array] | None = None  # a full shard: file, index, count, starts
        self._writeback = WriteBack(WRITEBACK_BYTES)

    def _open(self) -> None:
        path = self.folder / f"{self.prefix}{self.next_index:06d}{self.layout.suffix}"
        self.next_index += 1
        self.paths.append(path)
        self._file = open_new(tmp_path(path))
        if self.layout.header:
            self._file.write(bytes(SHARD_HEADER_BYTES))  # filled in when the count is known
        self._count = 0
        self._starts = array.array("Q", [0] if self._pending else [])
        self._pending = False

    def start_document(self, tokens: int) -> None:
        """A document of ``tokens`` tokens comes next: with ``at_documents`` it starts a new shard
        unless it fits the open one."""
        if self.layout.at_documents and self._file is not None and self._count + tokens > self.shard_tokens:
            self._hold()
        if self._file is None:
            self._pending = True
        elif self.layout.at_documents or self.layout.min_shards > 1:
            self._starts.append(self._count)

    def write_documents(self, data: np.ndarray, bounds: np.ndarray) -> None:
        """Documents laid end to end (the i-th at ``bounds[i]:bounds[i + 1]``), each started as a
        document: shards cut at documents need every start."""
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            self.start_document(b - a)
            self.write(data[a:b])

    def _hold(self) -> None:
        """The open shard is done: it waits as the held one, and the one held before is finished."""
        if self._held is not None:
            self._finish(*self._held[:3])
        self._writeback.start(self._file, self.paths[-1])  # type: ignore[arg-type]
        self._held, self._file = (self._file, len(self.paths) - 1, self._count, self._starts), None  # type: ignore

    def write(self, data: np.ndarray) -> None:
        while len(data):
            if self._file is None:
                self._open()
            n = min(self.shard_tokens - self._count, len(data))
            with named_errors(self.paths[-1]):
                self._file.write(memoryview(data[:n]).cast("B"))  # type: ignore[union-attr]
            self._writeback.wrote(self._file, n * self.dtype.itemsize, self.paths[-1])  # type: ignore[arg-type]
            self._count += n
            data = data[n:]
            if self._count == self.shard_tokens:
                self._hold()

    def _balance(self, at_documents: bool) -> None:
        """Move the held shard's last tokens to the front of the open, short one: half of both
        shards' tokens, or ``at_documents``, from the document start nearest it (none: the held
        shard is one document, and stays whole)."""
        assert self._held is not None and self._file is not None
        held, index, count, starts = self._held
        keep = (count + self._count + 1) // 2
        if at_documents:
            inside = [s for s in starts if 0 < s]
            if not inside:
                return
            keep = min(inside, key=lambda s: (abs(s - keep), s))
        f, head, size = self._file, SHARD_HEADER_BYTES if self.layout.header else 0, self.dtype.itemsize
        moved = (count - keep) * size
        with named_errors(self.paths[-1]):
            pos = head + self._count * size
            while pos > head:  # shift the open shard's tokens up by `moved`, from the end backwards
                n = min(1 << 22, pos - head)
                pos -= n
                f.seek(pos)
                chunk = f.read(n)
                f.seek(pos + moved)
                f.write(chunk)
            held.seek(head + keep * size)
            f.seek(head)
            while chunk := held.read(1 << 22):
                f.write(chunk)
            held.truncate(head + keep * size)
        self._count += count - keep
        self._held = None
        self._finish(held, index, keep)

    def _finish(self, f: BinaryIO, index: int, count: int) -> None:
        if self.layout.header:
            header = np.zeros(SHARD_HEADER_BYTES // 4, dtype="<i4")
            header[:3] = (self.magic, self.version, count)
            f.seek(0)
            f.write(header.tobytes())
        self._writeback.wait()  # none runs on the file as it is finished and closed
        with named_errors(self.paths[index]):
            f.flush()
            os.fsync(f.fileno())
        f.seek(0)
        digest = hashlib.sha256()
        while chunk := f.read(1 << 22):
            digest.update(chunk)
        self.shards.append({"file": self.paths[index].name, "bytes": f.tell(), "sha256": digest.hexdigest(),
                            "tokens": count})
        f.close()

    def close(self) -> list[dict[str, Any]]:
        if self.layout.min_shards > 1 and not self.shards and self._held is None and any(self._starts[1:]):
            self._hold()  # a lone shard of two documents or more: its second half becomes a shard of its own
            self._open()
            self._balance(at_documents=True)
        if self._held is not None and self._file is not None and 2 * self._count < self._held[2]:
            self._balance(self.layout.at_documents)
        if self._held is not None:
            self._finish(*self._held[:3])
            self._held = None
        if self._file is not None:
            self._finish(self._file, len(self.paths) - 1, self._count)
            self._file = None
        if len(self.shards) == 1 < self.layout.min_shards and self.layout.suffix == ".bin":  # not again for a mask
            warnings.warn(f"{self.prefix.rstrip('_')} is one document, so one shard: modded-nanogpt's loader reads two "
                          "train shards at least; add documents", stacklevel=2)
        self._writeback.close()
        return self.shards

    def renames(self) -> list[tuple[str, str]]:
        return [(str(tmp_path(path)), str(path)) for path in self.paths]

    def discard(self) -> None:
        self._writeback.close()
        for f in (self._file, self._held[0] if self._held else None):
            if f is not None:
                _close_quietly(f)
        for path in self.paths:
            remove_own(tmp_path(path))


def _trained(mask: np.ndarray) -> int:
    """How many tokens a mask trains on, counted in bytes: numpy's count lets other threads take
    the GIL, and the writing thread would wait out their turn to go on."""
    return len(mask) - mask.tobytes().count(0)


@dataclass
class SplitWriter:
    """One split's tokens (one flat .bin, or shards by ``layout``), its document index (at
    ``idx_name``, default ``SPLIT.idx``) and a conversation split's mask, written to temporary names."""

    folder: Path
    split: str
    dtype: np.dtype
    eot: str
    eot_id: int
    layout: ShardLayout | None = None
    idx_name: str = ""
    bin_name: str = ""
    masked: bool = False  # a loss mask beside the tokens, one byte a token: SPLIT.mask, or one a shard
    mask_name: str = ""  # a flat mask's name, default SPLIT.mask
    tokens: int = 0
    documents: int = 0
    supervised: int = 0  # tokens whose mask is 1

    def __post_init__(self) -> None:
        self.bin: HashingWriter | ShardWriter
        if self.layout is not None:
            self.bin = ShardWriter(self.folder, self.layout, self.dtype)
        else:
            self.bin = HashingWriter(self.folder / (self.bin_name or BIN_NAME.format(split=self.split)))
        self.idx = HashingWriter(self.folder / (self.idx_name or IDX_NAME.format(split=self.split)))
        self.mask: HashingWriter | ShardWriter | None = None
        if self.masked and self.layout is not None:  # a mask a shard, cut where the tokens are
            self.mask = ShardWriter(self.folder, replace(self.layout, header=False, suffix=".mask"),
                                    MASK_DTYPE)
        elif self.masked:
            self.mask = HashingWriter(self.folder / (self.mask_name or MASK_NAME.format(split=self.split)))
        self._eot = np.array([self.eot_id], dtype=self.dtype)
        self._starts = array.array("Q")  # flushed to .idx in blocks, so memory stays flat

    def start_document(self, tokens: int = 0) -> None:
        """A document of ``tokens`` tokens (its end-of-text included; 0 where unknown) starts."""
        self.bin.start_document(tokens)
        if self.mask is not None:
            self.mask.start_document(tokens)
        self._starts.append(self.tokens)
        self.documents += 1
        if len(self._starts) >= INDEX_FLUSH:
            self._flush_starts()
        if self.eot == "prepend":
            self.write(self._eot)

    def _flush_starts(self) -> None:
        self.idx.write(np.frombuffer(self._starts, dtype=np.uint64).astype(INDEX_DTYPE))
        self._starts = array.array("Q")

    def write(self, tokens: np.ndarray, mask: np.ndarray | None = None) -> None:
        """``tokens``, and with a mask file their ``mask`` (None: 0, trained on none)."""
        self.bin.write(tokens)
        self.tokens += len(tokens)
        if self.mask is not None:
            self.mask.write(mask if mask is not None else np.zeros(len(tokens), MASK_DTYPE))
            self.supervised += _trained(mask) if mask is not None else 0

    def write_documents(self, tokens: np.ndarray, mask: np.ndarray, bounds: np.ndarray) -> None:
        """Documents laid end to end (the i-th at ``bounds[i]:bounds[i + 1]``, ``bounds[0]`` 0) and
        their masks, as ``start_document``, ``write`` and ``end_document`` of each would write them:
        a write a file for the lot where the files need no document's start."""
        if self.eot != "none":  # an end-of-text goes between them
            for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
                self.start_document(b - a + 1)
                self.write(tokens[a:b], mask[a:b])
                self.end_document()
            return
        self.bin.write_documents(tokens, bounds)
        if self.mask is not None:
            self.mask.write_documents(mask, bounds)
            self.supervised += _trained(mask)
        self._starts.frombytes((bounds[:-1] + self.tokens).astype(np.uint64).tobytes())
        self.tokens += len(tokens)
        self.documents += len(bounds) - 1
        if len(self._starts) >= INDEX_FLUSH:
            self._flush_starts()

    def end_document(self) -> None:
        if self.eot == "append":
            self.write(self._eot)

    def close(self) -> dict[str, Any]:
        self._flush_starts()
        key = "shards" if isinstance(self.bin, ShardWriter) else "bin"
        info = {"tokens": self.tokens, "documents": self.documents, key: self.bin.close(), "idx": self.idx.close()}
        if self.mask is not None:
            info.update({"mask_shards" if self.layout is not None else "mask": self.mask.close(),
                         "supervised": self.supervised})
        return info

    def renames(self) -> list[tuple[str, str]]:
        """(temporary, final) paths of the split's token files, index and mask, once closed."""
        return self.bin.renames() + self.idx.renames() + (self.mask.renames() if self.mask is not None else [])

    def discard(self) -> None:
        self.bin.discard()
        self.idx.discard()
        if self.mask is not None:
            self.mask.discard()


def split_writers(make: Callable[[str], SplitWriter]) -> dict[str, SplitWriter]:
    """A writer a split, each made by ``make``; if one cannot be made, those made are discarded."""
    writers: dict[str, SplitWriter] = {}
    try:
        for split in SPLITS:
            writers[split] = make(split)
    except BaseException:
        for writer in writers.values():
            writer.discard()
        raise
    return writers


class DocumentBuffer:
    """A document's tokens held until its split is known; large ones spill to disk."""

    def __init__(self, folder: Path, seed: int):
        self.spill_path = tmp_path(folder / "spill")
        self.key = document_key(seed)
        self._spill: BinaryIO | None = None
        self.reset()

    def reset(self) -> None:
        """Empty, for the next document; its split hash is keyed by the seed."""
        self.parts: list[np.ndarray] = []
        self.held = self.spilled = 0
        self.hash = document_hash(self.key)
        if self._spill is not None:
            self._spill.seek(0)
            self._spill.truncate()

    def add(self, text: bytes, tokens: np.ndarray) -> None:
        self.hash.update(text)
        self.parts.append(tokens)
        self.held += len(tokens)
        if self.held > SPILL_TOKENS:
            if self._spill is None:
                self._spill = open_new(self.spill_path)
            with named_errors(self.spill_path):
                for part in self.parts:
                    self._spill.write(memoryview(part).cast("B"))
            self.spilled += self.held
            self.parts, self.held = [], 0

    def drain_into(self, writer: SplitWriter) -> None:
        writer.start_document(self.held + self.spilled + (writer.eot != "none"))
        if self.spilled:
            f = self._spill
            assert f is not None
            f.seek(0)
            while chunk := f.read(SPILL_TOKENS * writer.dtype.itemsize):
                writer.write(np.frombuffer(chunk, dtype=writer.dtype))
        for part in self.parts:
            writer.write(part)
        writer.end_document()

    def discard(self) -> None:
        if self._spill is not None:
            _close_quietly(self._spill)
            self._spill = None
            remove_own(self.spill_path)
