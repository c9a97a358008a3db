"""Input files behind one interface: a local file, or an object in a store read in ranges from
the version it was listed as."""

from __future__ import annotations

import functools
import io
import os
import stat
import urllib.parse
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from .store import RETRIES, Changed, open_store, retried
from .urls import _split_userinfo, redact

READ_BUFFER_BYTES = 1 << 20  # an input stream's buffer at most (see read_buffer_bytes)
BLOCK_BYTES = 3 << 20  # a remote stream's range: two in memory per open input (in use, fetched ahead)
GLOB_CHARS = "*?["


class InputFile(Protocol):
    """What a prepare run needs of one input file, wherever it lives."""

    name: str
    suffix: str

    def size(self) -> int: ...

    def pin(self) -> str | None: ...

    def identity(self) -> tuple[Any, ...]: ...

    def local_path(self) -> Path | None: ...

    def open_stream(self) -> BinaryIO: ...


def read_buffer_bytes(size: int) -> int:
    """The read buffer of an input of ``size`` bytes: larger than io's 8 KB, since a jsonl line
    longer than the buffer is read in pieces and joined (a tenth of a fast backend's run), but no
    larger than the file, since a folder of small files would allocate one a file for nothing."""
    return max(io.DEFAULT_BUFFER_SIZE, min(size, READ_BUFFER_BYTES))


class LocalFile(type(Path())):  # type: ignore[misc]
    """A local input file: a ``Path`` with the ``InputFile`` interface. What a run asks of it
    (kind, size, identity) comes from one stat, taken when first asked: a folder of many small
    files pays one a file."""

    @functools.cached_property
    def _info(self) -> os.stat_result:
        return os.stat(self)

    @classmethod
    def listed(cls, folder: LocalFile, entry: os.DirEntry) -> LocalFile:
        """The file ``entry`` of a listing of ``folder``, with the stat it took (a link's
        target's); one that fails (a broken link) is taken again when asked, and fails then."""
        path = folder / entry.name
        try:
            path.__dict__["_info"] = entry.stat()
        except OSError:
            pass
        return path

    def is_regular(self) -> bool:
        """A regular file (not a folder, pipe, socket or device), or False if it cannot be stat'ed."""
        try:
            return stat.S_ISREG(self._info.st_mode)
        except OSError:
            return False

    def size(self) -> int:
        return self._info.st_size

    def pin(self) -> str | None:
        return None  # its bytes are hashed instead

    def identity(self) -> tuple[Any, ...]:
        """Device and inode: links and other spellings of one file agree."""
        return self._info.st_dev, self._info.st_ino

    def local_path(self) -> Path | None:
        return self

    def open_stream(self) -> BinaryIO:
        return open(self, "rb", buffering=read_buffer_bytes(self.size()))


def as_input(f: InputFile | str | os.PathLike) -> InputFile:
    """An ``InputFile`` as it is, a local path as a ``LocalFile``: what the readers accept."""
    return f if hasattr(f, "open_stream") else LocalFile(f)  # type: ignore[return-value]


class RemoteFile:
    """An object in a store fsspec reaches, found by ``expand``. Its ``version`` (a version id,
    generation, ETag or modification time) pins it; every range is read from that version or
    refused: a web object's ranges carry ``If-Match`` with its strong ETag (or
    ``If-Unmodified-Since`` with its Last-Modified) and every answer's validator must be that one
    (a server may ignore the condition), and another store's file is compared with the
    version listed when it is opened (s3fs then sends its ETag with every range). An object with
    no version at all (a plain web server's) is pinned by its bytes instead."""

    def __init__(self, fs: Any, path: str, url: str, size: int, version: str, retries: int = RETRIES,
                 conditions: dict[str, str] | None = None):
        self.fs, self.path, self.url, self._size, self.version = fs, path, url, size, version
        self.retries, self.conditions = retries, conditions or {}
        key = urllib.parse.urlsplit(path).path if "://" in path else path  # a web URL's query is no part of it
        self.name = key.rstrip("/").rsplit("/", 1)[-1]
        self.suffix = os.path.splitext(self.name)[1]

    def size(self) -> int:
        return self._size

    def pin(self) -> str | None:
        return f"{self._size}:{self.version}" if self.version else None  # None: its bytes are hashed

    def identity(self) -> tuple[Any, ...]:
        """The whole URL but its user information: a key's "#" or "?", a web URL's query, tell objects apart."""
        scheme, _, rest = _split_userinfo(self.url)
        return ("url", f"{scheme}://{rest}")

    def local_path(self) -> Path | None:
        return None

    def open_stream(self) -> BinaryIO:
        return io.BufferedReader(RetryingReader(self), read_buffer_bytes(self._size))  # type: ignore[return-value]

    def __str__(self) -> str:
        return redact(self.url)

    __repr__ = __str__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemoteFile) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)


class RetryingReader(io.RawIOBase):
    """A remote object read in ranges, the next range fetched in the background while this one
    is used (so the network overlaps the tokenizer); a transient failure reopens the object at the
    byte reached, after a backoff, at most ``retries`` times a range. The object must keep its size."""

    def __init__(self, file: RemoteFile):
        self.file, self.pos, self._f = file, 0, None
        self._block: tuple[int, bytes] = (0, b"")  # the range in use: (its position, its bytes)
        self._ahead: tuple[int, Future[bytes]] | None = None  # (position, the range fetched from it)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tokpack-fetch")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.file.size()}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        if self.pos >= self.file.size():
            return 0
        start, block = self._block
        if not start <= self.pos < start + len(block):
            start, block = self.pos, self._take(self.pos)
            self._block = (start, block)
            end = start + len(block)
            if end < self.file.size():  # the next range comes while this one is used
                self._ahead = (end, self._pool.submit(self._fetch, end))
        data = memoryview(block)[self.pos - start:self.pos - start + len(buffer)]
        buffer[:len(data)] = data
        self.pos += len(data)
        return len(data)

    def _take(self, pos: int) -> bytes:
        """The range from ``pos``: fetched ahead already, or now."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == pos:
            block = ahead[1].result()
        else:
            if ahead is not None:
                ahead[1].result()  # the handle is free again (a failed guess raises here, as it would have)
            block = self._fetch(pos)
        if not block:  # the object ended before its size: it was cut or replaced mid-read
            raise ValueError(f"{self.file} ended at byte {pos} of {self.file.size()}: it changed while being "
                             "read; rerun when it is stable")
        return block

    def _fetch(self, pos: int) -> bytes:
        def read() -> bytes:
            if self._f is None:
                options = {"headers": self.file.conditions} if self.file.conditions else {}
                self._f = self.file.fs.open(self.file.path, "rb", block_size=BLOCK_BYTES, cache_type="none", **options)
                opened = object_version(getattr(self._f, "details", None) or {})
                if self.file.version and opened and opened != self.file.version:
                    raise Changed(f"version {opened} where {self.file.version} was listed")
            self._f.seek(pos)
            return self._f.read(BLOCK_BYTES)

        return retried(read, str(self.file), self.file.retries, self._reset)

    def _reset(self) -> None:
        if self._f is not None:
            try:
                self._f.close()
            except Exception:  # a connection already broken may fail to close too
                pass
            self._f = None

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead[1].cancel()
            try:
                self._ahead[1].result()
            except Exception:  # a fetch nobody waits for
                pass
            self._ahead = None
        self._pool.shutdown(wait=True)
        self._reset()
        super().close()


def object_version(info: dict[str, Any]) -> str:
    """The version a listing gives an object (a version id, generation, ETag or time), or "" if none."""
    for key in ("VersionId", "version_id", "generation", "ETag", "etag", "mtime", "LastModified", "last_modified",
                "Last-Modified"):
        if info.get(key):
            return str(info[key]).strip('"')
    return ""


def expand(raw: str, options: dict[str, Any]) -> list[RemoteFile]:
    """The objects a URL names, sorted: one object, every object below a prefix (hidden names
    skipped, as in local folders), or a glob's matches."""
    store = open_store(raw, options)
    fs, path, where = store.fs, store.path, store.where
    web = raw.partition("://")[0] in ("http", "https")  # a URL, whose "?" starts its query: one object
    if not web and any(ch in path for ch in GLOB_CHARS):
        found = store.call("", lambda: fs.glob(path, detail=True))
        infos = [info for info in found.values() if info.get("type") != "directory"]
        if not infos:
            raise FileNotFoundError(f"glob {where!r} matches no object; check the pattern")
    else:
        info = store.call("", lambda: fs.info(path))
        if info.get("type") == "directory" and not web:
            infos = [i for i in store.call("", lambda: fs.find(path, detail=True)).values()
                     if not any(_hidden(part) for part in i["name"][len(path):].split("/"))]
            if not infos:
                raise ValueError(f"{where} holds no objects; put .txt/.jsonl/.parquet files under it")
        else:
            infos = [{**info, "name": info.get("name", path)}]
    out = []
    for info in sorted(infos, key=lambda i: i["name"]):
        url = raw if len(infos) == 1 and info["name"] == path else fs.unstrip_protocol(info["name"])
        if info.get("size") is None:
            raise ValueError(f"{redact(url)} came without a size (sent with a Content-Encoding such as gzip, or with "
                             "no Content-Length), and tokpack reads objects in ranges of a known size; serve it as "
                             "it is stored (a .gz file as application/gzip, with no Content-Encoding)")
        out.append(RemoteFile(fs, info["name"], url, int(info["size"]), object_version(info), store.attempts,
                              range_conditions(info) if web else None))
    unpinned = [f for f in out if not f.version]
    if unpinned:
        warnings.warn(f"{unpinned[0]}{f' and {len(unpinned) - 1} more' if len(unpinned) > 1 else ''} has no ETag or "
                      "Last-Modified, so a change of it cannot be told from its headers: its bytes are hashed "
                      "instead, and a rerun reads it again to see whether its units still hold", stacklevel=3)
    return out


def _hidden(part: str) -> bool:
    """A key's part that names a hidden file, as a local listing skips them; "." and ".." are no
    names in a store, whose keys are plain strings, so ``in/../a.jsonl`` is an object like any."""
    return part.startswith(".") and part not in (".", "..")


def range_conditions(info: dict[str, Any]) -> dict[str, str]:
    """The headers that make a web server answer 412 once the object is another than ``info``
    describes: a strong ETag (a weak one never matches ``If-Match``), else Last-Modified."""
    etag = info.get("ETag") or info.get("etag")
    if isinstance(etag, str) and etag.startswith('"'):
        return {"If-Match": etag}
    modified = info.get("Last-Modified")
    return {"If-Unmodified-Since": modified} if isinstance(modified, str) else {}
