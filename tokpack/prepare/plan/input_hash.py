"""The sha256 of a unit's input bytes, which a rerun compares to keep the unit's files.

A share of whole local files is hashed from the bytes its reader takes, as it takes them
(``InputTap``): each file is opened and read once, where a second open and read (in a thread of
its own, as any other share is hashed) cost a folder of small files about a tenth of its run.

See docs/prepare.md.
"""

from __future__ import annotations

import hashlib
import io
import threading
from pathlib import Path
from typing import Any, BinaryIO

from ...corpus import is_parquet
from ...storage import InputFile, read_buffer_bytes
from .shares import Share

_BLOCK = 1 << 20


def input_sha256(share: list[Share], stop: threading.Event | None = None) -> str:
    """sha256 of the input bytes a unit's documents come from: whole files, or a jsonl range from
    the byte before ``lo`` (which decides where the first line starts) to the end of the last line
    starting before ``hi``. A read, not a tokenization: a rerun re-reads it to prove a kept unit's
    input unchanged, even by an edit of the same length under the old mtime. A remote object is
    pinned by its size and version instead (``InputFile.pin``), which its store changes with its
    bytes: reading it again would cost a second download. Once ``stop`` is set, it gives up (and
    returns no hash)."""
    digest = hashlib.sha256()
    for path, lo, hi in share:
        digest.update(_header(path, lo, hi))
        pin = path.pin()
        if pin is not None:
            digest.update(f"pinned\t{pin}\n".encode())
            continue
        if not _read_into(digest, path, lo, hi, stop):
            return ""
    return digest.hexdigest()


def _read_into(digest: Any, path: InputFile, lo: int, hi: int | None, stop: threading.Event | None) -> bool:
    """Hash the entry's bytes from its file; False if ``stop`` came first."""
    with path.open_stream() as f:
        f.seek(max(lo - 1, 0))
        left = None if hi is None else hi - max(lo - 1, 0)
        last = b""
        while left is None or left > 0:
            if stop is not None and stop.is_set():
                return False
            block = f.read(_BLOCK if left is None else min(_BLOCK, left))
            if not block:
                break
            digest.update(block)
            last = block[-1:]
            left = None if left is None else left - len(block)
        while hi is not None and last not in (b"\n", b""):  # on to the end of the line running past hi
            block = f.read(_BLOCK)
            end = block.find(b"\n")
            digest.update(block if end < 0 else block[:end + 1])
            last = b"\n" if end >= 0 else block[-1:]
    return True


class InputTap:
    """A unit's input hash taken from the bytes its reader takes, as it takes them.

    For a share of whole local files (not parquet, which pyarrow reads by its path) that the
    reader opens once each, in order: ``share`` is what it reads instead. Where the reader did
    anything else (a seek, a file closed before its end, out of order), ``hexdigest()`` reads the
    share again, so the digest is always ``input_sha256(share)``'s.
    """

    def __init__(self, share: list[Share]):
        self.entries = share
        self.share: list[Share] = [Share(_TappedFile(f, i, self), lo, hi) for i, (f, lo, hi) in enumerate(share)]
        self.digest = hashlib.sha256()
        self.next = 0  # the file the reader should open next
        self.broken = False

    @staticmethod
    def fits(share: list[Share]) -> bool:
        return all(lo == 0 and hi is None and f.pin() is None and not is_parquet(f) for f, lo, hi in share)

    def opened(self, index: int) -> bool:
        """Whether the first read of file ``index`` is the one the hash takes."""
        if index != self.next:
            self.broken = True
        if self.broken:
            return False
        f, lo, hi = self.entries[index]
        self.digest.update(_header(f, lo, hi))
        return True

    def hexdigest(self) -> str:
        if self.broken or self.next != len(self.entries):
            return input_sha256(self.entries)
        return self.digest.hexdigest()


def _header(f: InputFile, lo: int, hi: int | None) -> bytes:
    return f"{f}\t{lo}\t{hi}\n".encode("utf-8", "surrogateescape")


class _TappedFile:
    """An ``InputFile`` whose first stream is read into its tap's digest."""

    def __init__(self, file: InputFile, index: int, tap: InputTap):
        self.file, self.index, self.tap = file, index, tap
        self.name, self.suffix = file.name, file.suffix
        self.opened = False

    def size(self) -> int:
        return self.file.size()

    def pin(self) -> str | None:
        return self.file.pin()

    def identity(self) -> tuple[Any, ...]:
        return self.file.identity()

    def local_path(self) -> Path | None:
        return self.file.local_path()

    def open_stream(self) -> BinaryIO:
        stream = self.file.open_stream()
        first, self.opened = not self.opened, True
        if not (first and self.tap.opened(self.index)):
            return stream
        return io.BufferedReader(_TapReader(stream, self.index, self.tap),
                                 read_buffer_bytes(self.size()))

    def __str__(self) -> str:
        return str(self.file)


class _TapReader(io.RawIOBase):
    """A stream whose bytes go into the tap's digest while it reads its file from the start, in order."""

    def __init__(self, stream: BinaryIO, index: int, tap: InputTap):
        self.stream, self.index, self.tap = stream, index, tap
        self.at: int | None = 0  # bytes hashed so far; None once the file is hashed or lost

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self.stream.seekable()

    def tell(self) -> int:
        return self.stream.tell()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        at = self.stream.seek(offset, whence)
        if self.at is not None and at != self.at:
            self._lose()
        return at

    def readinto(self, buffer: Any) -> int:
        n = self.stream.readinto(buffer)
        if self.at is not None and not self.tap.broken:
            if n:
                self.tap.digest.update(memoryview(buffer)[:n])
                self.at += n
            else:
                self.tap.next, self.at = self.index + 1, None
        return n

    def _lose(self) -> None:
        self.tap.broken, self.at = True, None

    def close(self) -> None:
        if not self.closed:
            if self.at is not None:
                self._lose()
            self.stream.close()
        super().close()
