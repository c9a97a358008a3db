"""Where input files live: the local disk, or any store fsspec reaches (``s3://``, ``gs://``,
``https://``, ``hf://``), behind one small interface.

    pip install "tokpack[remote]"
    python -m tokpack.prepare 's3://bucket/fineweb-edu/*.parquet' --out-dir data/edu

An input file is an ``InputFile``: a name and suffix (which decide how it is read), its size, a
``pin`` (None for a local file, whose bytes are hashed; a remote object's version, ETag or
generation, which the store changes when the object changes), an identity (a local file's device
and inode; a remote object's URL) and ``open_stream()``, a seekable binary stream. A remote stream
is read in ranges, never downloaded whole, and a transient failure (5xx, throttling, a connection
reset, a read cut short, a timeout) is retried with backoff a bounded number of times, resuming at
the byte it had reached; a missing object, a denied request or bad credentials fail at once, one
line naming the URL and the fix. Every range is read from the version the object was listed as
(``RemoteFile``). Credentials come as each library takes them (environment, profiles,
``AWS_ENDPOINT_URL``), or as ``--storage-options JSON``; a URL is shown and recorded without its
user information (a web URL without its query and fragment too), and no message shows them
(``scrub``); credentials in a store's URL are refused (``check_url``).

See docs/prepare.md.
"""

from __future__ import annotations

import functools
import io
import os
import re
import shutil
import stat
import time
import urllib.parse
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, Protocol

RETRIES = 6  # attempts at one request, the first included (storage option "retries")
BACKOFF_S = 0.2  # doubled after each failed attempt, up to MAX_BACKOFF_S
MAX_BACKOFF_S = 5.0
READ_BUFFER_BYTES = 1 << 20  # an input stream's buffer at most (see read_buffer_bytes)
BLOCK_BYTES = 3 << 20  # a remote stream's range: two in memory per open input (in use, fetched ahead)
GLOB_CHARS = "*?["
TIMEOUT_S = 60.0  # a connection or a read that waits longer is retried


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


def is_url(raw: str) -> bool:
    """Whether an input names a remote store (``scheme://``) rather than a local path."""
    scheme, sep, _ = raw.partition("://")
    return bool(sep) and scheme.replace("+", "").isalnum() and scheme != "file"


WEB = ("http", "https")  # URLs whose "?" starts a query and "#" a fragment; elsewhere both are a key's characters
# A URL's user information wherever it stands in a text: what no message may carry.
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/?#@]*@")
_SECRETS: set[str] = set()  # the user information of every URL opened, scrubbed from every message


def _split_userinfo(url: str) -> tuple[str, str, str]:
    """(scheme, user information, the rest) of a URL; user information "" where it has none. Only
    a web URL's host may hold ":" (a port), so elsewhere a ":" before the first "/" starts a secret
    that may itself hold "/" (AWS secret keys do)."""
    scheme, _, rest = url.partition("://")
    netloc = rest.split("/", 1)[0]
    if "@" in netloc or (":" in netloc and scheme not in WEB and "@" in rest):
        userinfo, _, host_on = rest.rpartition("@") if "@" not in netloc else rest.partition("@")
        return scheme, userinfo, host_on
    return scheme, "", rest


def redact(url: str) -> str:
    """``url`` as tokpack shows and records it: without user information, and a web URL without
    its query and fragment (where signed URLs carry their keys). An object's key stays whole:
    ``s3://b/a#b.jsonl`` and ``s3://b/a?b.jsonl`` are two objects."""
    if "://" not in url:
        return url
    scheme, _, rest = _split_userinfo(url)
    if scheme in WEB:
        rest = rest.split("#", 1)[0].split("?", 1)[0]
    return f"{scheme}://{rest}"


def scrub(text: str) -> str:
    """``text`` (a message, whoever wrote it) without the user information of any URL in it, nor
    of any URL tokpack opened (a library may quote a part of one: a bucket name, a host)."""
    text = _USERINFO.sub(r"\1", text)
    for secret in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def check_url(raw: str) -> str:
    """``raw`` as tokpack opens it: a web URL's user information (HTTP basic authentication) is
    remembered so that no message shows it; any other store's credentials in a URL are refused,
    since its library would quote them in its errors."""
    scheme, userinfo, _ = _split_userinfo(raw)
    if userinfo:
        # The whole and its password: a user name alone is no secret, and may be a common word.
        _SECRETS.update(part for part in (userinfo, userinfo.partition(":")[2]) if len(part) >= 4)
        if scheme not in WEB:
            raise ValueError(f"{redact(raw)} carries credentials in the URL, where they would show in messages and "
                             "records; drop them from the URL and give them in --storage-options (key, secret, "
                             "token) or the environment (AWS_ACCESS_KEY_ID, GOOGLE_APPLICATION_CREDENTIALS, ...)")
    return raw


class Changed(Exception):
    """An object read in ranges is no longer the version it was listed as."""


class RemoteFile:
    """An object in a store fsspec reaches, found by ``expand``. Its ``version`` (a version id,
    generation, ETag or modification time) pins it; every range is read from that version or
    refused: a web object's ranges carry ``If-Match`` with its strong ETag (or
    ``If-Unmodified-Since`` with its Last-Modified), and another store's file is compared with the
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


class StoreError(ValueError):
    """A store's answer as one line naming the object and the fix: a user error (``cli.USER_ERRORS``)."""


class Missing(StoreError):
    """The object does not exist (a 404, or gone since it was listed)."""


class Denied(StoreError):
    """The credentials may not do this (a 401 or 403)."""


class Unavailable(StoreError):
    """The store did not answer, after every retry."""


def _kind(fix: str) -> type[StoreError]:
    """The error a fix from ``_permanent`` is raised as: callers tell them apart by type, never by wording."""
    return Missing if fix.startswith("it does not exist") else Denied if fix.startswith("access is denied") \
        else StoreError


def _permanent(exc: BaseException) -> str | None:
    """The fix for an error retrying cannot cure, or None for a transient one."""
    status = _status(exc)
    if type(exc).__name__ == "FileExpired" or isinstance(exc, Changed) or status == 412:
        # fsspec's, tokpack's own and a web server's word for another version than the one listed
        return "it changed while being read, so nothing read from it is used: rerun when it is stable"
    if isinstance(status, int) and (status >= 500 and status != 501 or status in (408, 429)):
        return None  # a passing fault, fsspec's web "not found" for a 503 too; 501 says the verb is not served
    if status in (401, 403) or isinstance(exc, PermissionError):
        where = f" (HTTP {status})" if status else ""
        return f"access is denied{where}: check the credentials (environment, profile or --storage-options)"
    if isinstance(exc, FileNotFoundError) or status == 404:
        return "it does not exist: check the URL"
    if isinstance(status, int) and (400 <= status < 500 or status == 501) and status not in (408, 429):
        return f"the store answered {status}: check the URL and the options"
    if isinstance(exc, (ValueError, TypeError, NotImplementedError)):
        return f"{exc}; check the URL and --storage-options"
    return None


def _status(exc: BaseException) -> int | None:
    """The HTTP status behind an error: its own, or that of the response fsspec's web filesystem
    turned into a FileNotFoundError (it does so for a 403, a 412 or a 503 alike)."""
    for error in (exc, exc.__cause__):
        status = getattr(error, "status", None) or getattr(error, "status_code", None)
        if isinstance(status, int):
            return status
    return None


def retried(fn: Callable[[], Any], what: str, attempts: int, reset: Callable[[], None] = lambda: None) -> Any:
    """``fn()``, tried ``attempts`` times with backoff on transient errors; a permanent one, or
    the last transient one, as one line naming ``what``."""
    delay = BACKOFF_S
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as exc:
            fix = _permanent(exc)
            if fix is not None:
                raise _kind(fix)(scrub(f"{what}: {fix} ({type(exc).__name__})")) from None
            reset()
            if attempt == attempts:
                raise Unavailable(scrub(f"{what} failed {attempts} times ({type(exc).__name__}: {exc}); check the "
                                        "endpoint and the network, and rerun: finished units are kept")) from None
            time.sleep(delay)
            delay = min(2 * delay, MAX_BACKOFF_S)


def _number(options: dict[str, Any], key: str, default: float, kind: Any) -> Any:
    value = options.pop(key, default)
    if not isinstance(value, kind) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"storage option {key} {value!r} is not a positive number; fix --storage-options")
    return value


def _library_options(protocol: str, options: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The options as the protocol's library takes them, with ``timeout`` (seconds a connection or
    a read may wait; default ``TIMEOUT_S``) translated, and tokpack's own ``retries`` apart."""
    options = dict(options)
    attempts = _number(options, "retries", RETRIES, int)
    timeout = _number(options, "timeout", TIMEOUT_S, (int, float))
    if protocol in ("http", "https") and "client_kwargs" not in options:
        import aiohttp

        options["client_kwargs"] = {"timeout": aiohttp.ClientTimeout(sock_connect=timeout, sock_read=timeout)}
    elif protocol in ("s3", "s3a"):
        config = dict(options.get("config_kwargs", {}))
        config.setdefault("connect_timeout", timeout)
        config.setdefault("read_timeout", timeout)
        options["config_kwargs"] = config
    return options, attempts


# An upload's part, the least S3 takes: what memory holds of a file going up. Each store's own
# uploader is told so (s3fs's reads ten parts of 50 MB at once by default); any other is written
# through a buffered file of parts this size.
PART_BYTES = 5 << 20
_PUT_OPTIONS = {"s3": {"chunksize": PART_BYTES, "max_concurrency": 1}, "gs": {"chunksize": PART_BYTES}}
_PUT_OPTIONS.update(s3a=_PUT_OPTIONS["s3"], gcs=_PUT_OPTIONS["gs"])


class Store(NamedTuple):
    """A URL's store as the options open it, once: fsspec's filesystem, the path the URL names in
    it (no trailing slash), the attempts a request gets, the URL as shown, and its protocol."""

    fs: Any
    path: str
    attempts: int
    where: str
    protocol: str

    def key(self, name: str) -> str:
        """The path of ``name`` below the URL's path."""
        return f"{self.path}/{name}"

    def call(self, what: str, fn: Callable[[], Any], reset: Callable[[], None] = lambda: None) -> Any:
        """``fn()`` with this store's retries; errors name ``what`` below the URL."""
        return retried(fn, f"{self.where}/{what}" if what else self.where, self.attempts, reset)

    def put(self, local: Path, name: str) -> None:
        """``local`` uploaded as ``name``, one part of ``PART_BYTES`` in memory at a time, whatever
        the file's size; a retry starts it over."""
        options = _PUT_OPTIONS.get(self.protocol)

        def stream() -> None:
            with open(local, "rb") as src, self.fs.open(self.key(name), "wb", block_size=PART_BYTES) as out:
                shutil.copyfileobj(src, out, 1 << 20)

        self.call(name, stream if options is None else lambda: self.fs.put_file(str(local), self.key(name), **options))


def open_store(raw: str, options: dict[str, Any] | None = None) -> Store:
    """The store ``raw`` names, opened with ``options`` (``--storage-options``); its listings are
    read afresh (fsspec keeps them per filesystem, and a second run must see the store as it is)."""
    check_url(raw)
    try:
        import fsspec
    except ImportError:
        raise ValueError(f'reading {redact(raw)} needs fsspec; pip install "tokpack[remote]"') from None
    library, attempts = _library_options(raw.partition("://")[0], options or {})
    try:
        fs, path = fsspec.core.url_to_fs(raw, **library)
    except ImportError as exc:  # the protocol's own library (s3fs, gcsfs, huggingface_hub, aiohttp)
        raise ValueError(f'reading {redact(raw)} needs {exc.name or "its fsspec library"}; pip install '
                         '"tokpack[remote]"') from None
    except (ValueError, TypeError) as exc:
        raise ValueError(scrub(f"{redact(raw)} cannot be opened with these storage options ({exc}); fix "
                               "--storage-options")) from None
    fs.invalidate_cache()
    return Store(fs, path.rstrip("/"), attempts, redact(raw).rstrip("/"), raw.partition("://")[0])


def object_version(info: dict[str, Any]) -> str:
    """The version a listing gives an object (a version id, generation, ETag or time), or "" if none."""
    for key in ("VersionId", "version_id", "generation", "ETag", "etag", "mtime", "LastModified", "last_modified"):
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
                     if not any(part.startswith(".") for part in i["name"][len(path):].split("/"))]
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


def range_conditions(info: dict[str, Any]) -> dict[str, str]:
    """The headers that make a web server answer 412 once the object is another than ``info``
    describes: a strong ETag (a weak one never matches ``If-Match``), else Last-Modified."""
    etag = info.get("ETag") or info.get("etag")
    if isinstance(etag, str) and etag.startswith('"'):
        return {"If-Match": etag}
    modified = info.get("Last-Modified")
    return {"If-Unmodified-Since": modified} if isinstance(modified, str) else {}
