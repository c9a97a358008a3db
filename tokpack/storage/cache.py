"""Prepared folders in object storage, read through a bounded local cache, a file at a time.

    from tokpack import TokenWindows, open_split
    train = TokenWindows("s3://bucket/edu", 1024, split="train")            # cache: $TOKPACK_CACHE_DIR
    val = open_split("s3://bucket/edu", "val", cache_dir="/nvme/tokpack", cache_limit=200 << 30)

The contract: a folder is read only once its meta.json stands; each token file is fetched whole
when a process first touches it, checked against meta.json's sha256, renamed into place and
memory-mapped, so batches, resume states and fingerprints are the local folder's; a copy found
in the cache is hashed once a process before it is served (the cache folder vouches for
nothing); the cache holds at most ``cache_limit`` bytes, evicting the least recently used files
no live process leases; processes share it under file locks. Cost: O(split bytes) fetched once
where the split fits, once per pass in order through a smaller limit, and one hash of each file
a process opens. See docs/loading.md ("Prepared folders in object storage").
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import queue
import stat
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..format import (CACHE_LOCK_NAME, FETCHED_NAME, FETCHING_SUFFIX, LEASE_PREFIX, META_NAME, MIRROR_HEX, MIRROR_NAME,
                      TMP_SUFFIX, load_json, meta_files, split_files)
from . import BLOCK_BYTES
from .folder import published
from .local import open_new, replacing, tmp_path
from .remote import RemoteFolder

CACHE_ENV, LIMIT_ENV = "TOKPACK_CACHE_DIR", "TOKPACK_CACHE_LIMIT"


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "tokpack")


def _limit(cache_limit: int | None) -> int | None:
    if cache_limit is None and os.environ.get(LIMIT_ENV):
        try:
            cache_limit = int(os.environ[LIMIT_ENV])
        except ValueError:
            raise ValueError(f"{LIMIT_ENV}={os.environ[LIMIT_ENV]!r} is not a number of bytes; fix or unset it") \
                from None
    if cache_limit is not None and (type(cache_limit) is not int or cache_limit < 1):
        raise ValueError(f"cache_limit {cache_limit!r} is not a positive number of bytes")
    return cache_limit


@contextlib.contextmanager
def _flocked(path: Path, what: str) -> Iterator[None]:
    """``path`` (created if need be, never through a link) locked against other processes and
    threads for the block. Unlocked explicitly: a worker forked meanwhile shares the descriptor,
    and closing alone would leave the lock with it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise ValueError(f"the cache folder {what} is not writable ({exc.strerror}); give cache_dir= or "
                         f"{CACHE_ENV} a writable folder") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


# Files held by readers the garbage collector let go, released at the next hold (release_later).
_DROPPED: list[tuple[CachedFolder, Sequence[str]]] = []
os.register_at_fork(after_in_child=_DROPPED.clear)  # the parent's to release, not a worker's


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes() if path.is_file() and not path.is_symlink() else None
    except OSError:
        return None


def _read_json(path: Path) -> Any:
    try:
        return load_json(_read_bytes(path) or b"null", str(path), "")
    except ValueError:
        return None  # unreadable: as if absent (a record's files are fetched again, a lease is void)


def _write(path: Path, data: bytes) -> None:
    with replacing(path) as f:
        f.write(data)


class _Mirror:
    """What one mirror folder in the cache holds, read under the cache's lock: its files (sizes
    and last use), the files live processes lease, and fetches in progress at their final size."""

    def __init__(self, folder: Path):
        self.folder = folder
        record = _read_json(folder / FETCHED_NAME)
        self.record: dict[str, str] = record if isinstance(record, dict) else {}
        meta = _read_json(folder / META_NAME)
        self.sizes = {e["file"]: e["bytes"] for e in meta_files(meta.get("splits", {}))} if isinstance(meta, dict) else {}
        self.leased: set[str] = set()
        self.files: dict[str, os.stat_result] = {}
        self.held = 0  # bytes on disk, with fetches in progress at their final size
        for path in folder.iterdir():
            try:
                info = path.lstat()
            except FileNotFoundError:  # a fetch's temporary file, gone since the listing
                continue
            if not stat.S_ISREG(info.st_mode):
                continue
            if path.name.startswith(LEASE_PREFIX):
                pid = path.name[len(LEASE_PREFIX):]
                names = _read_json(path)
                if pid.isdigit() and _alive(int(pid)) and isinstance(names, list):
                    self.leased.update(n for n in names if isinstance(n, str))
                else:
                    path.unlink(missing_ok=True)  # its process is gone
                continue
            if path.name.endswith(TMP_SUFFIX):
                name, _, pid = path.name[1:-len(TMP_SUFFIX)].rpartition(".")
                if not (pid.isdigit() and _alive(int(pid))):
                    path.unlink(missing_ok=True)  # a fetch whose process died
                    continue
                self.held += max(info.st_size, self.sizes.get(name, 0))
                continue
            self.held += info.st_size
            if path.name in self.record:
                self.files[path.name] = info

    def evictable(self) -> list[tuple[float, str, int]]:
        """(last use, name, bytes) of the files no live process holds, least recently used first."""
        return sorted((info.st_mtime, name, info.st_size) for name, info in self.files.items()
                      if name not in self.leased)


class CachedFolder:
    """A published folder seen through the cache: its meta.json fetched and checked, its files
    leased to the processes that read them (``hold``, ``release``) and fetched one at a time
    (``path``, and ``prefetch`` in the background).

    Args:
        url: the folder's URL (``s3://bucket/prefix``, ``gs://...``, ``https://...``).
        cache_dir: the cache folder (default ``$TOKPACK_CACHE_DIR`` or ``~/.cache/tokpack``).
        cache_limit: the most bytes the cache may hold (default ``$TOKPACK_CACHE_LIMIT``, else none).
        storage_options: as for remote inputs (``--storage-options``).
    """

    def __init__(self, url: str, cache_dir: str | Path | None = None, cache_limit: int | None = None,
                 storage_options: dict[str, Any] | None = None):
        folder = RemoteFolder(url, storage_options)
        self.meta, raw = published(folder)
        self.meta_bytes = len(raw)
        self.url, self.storage_options, self.where = url, storage_options, folder.where
        self.limit = _limit(cache_limit)
        self.cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.mirror = self.cache / hashlib.sha256(self.where.encode()).hexdigest()[:MIRROR_HEX]
        self.entries = {e["file"]: e for e in meta_files(self.meta["splits"])}
        self._verified: dict[str, tuple[int, int, int] | None] = {}  # name: the copy hashed, by identity
        self._reset(folder)
        with self._locked():
            if self.mirror.is_symlink() or (self.mirror.exists() and not self.mirror.is_dir()):
                raise ValueError(f"{self.mirror} in the cache is not a folder of tokpack's (a link or a file); "
                                 "remove it")
            self.mirror.mkdir(exist_ok=True)
            if _read_bytes(self.mirror / META_NAME) != raw:  # a folder published again: its files are too
                _write(self.mirror / META_NAME, raw)
            self._make_room(None, 0, strict=False)  # a cache over a limit lowered since is trimmed to it

    def _reset(self, folder: RemoteFolder | None = None) -> None:
        """This process's own state: a forked or unpickled copy starts afresh."""
        self._pid, self._folder = os.getpid(), folder
        self._held: dict[str, int] = {}  # name: how many readers of this process hold it
        self._here: set[str] = set()  # held files found fetched: read with no lock
        self._parsed: tuple[Any, dict[str, str]] = (None, {})  # the record as last read: (its stat, it)
        self._guard = threading.Lock()
        self._wanted: queue.Queue[str | None] = queue.Queue()
        self._fetcher: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_folder", "_held", "_here", "_parsed", "_guard", "_wanted", "_fetcher", "_verified"):
            state.pop(key)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._verified = {}  # a process that unpickles it hashes what it serves itself
        self._reset()

    def _own(self) -> None:
        if self._pid != os.getpid():
            self._reset()

    @property
    def folder(self) -> RemoteFolder:
        """The remote folder, opened once a process."""
        self._own()
        if self._folder is None:
            self._folder = RemoteFolder(self.url, self.storage_options)
        return self._folder

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return _flocked(self.cache / CACHE_LOCK_NAME, str(self.cache))

    def check_split(self, split: str) -> bool:
        """Refuse a limit that cannot hold ``split``'s largest file with its index and meta.json;
        say whether the whole split fits (then its files are fetched ahead and kept)."""
        if split not in self.meta["splits"]:
            raise ValueError(f"{self.where} has splits {', '.join(self.meta['splits'])}; pass split= one of them "
                             f"(got {split!r})")
        info = self.meta["splits"][split]
        fixed = info["idx"]["bytes"] + self.meta_bytes + 4096  # the index, meta.json, the records
        largest = max(split_files(info), key=lambda e: e["bytes"])
        if self.limit is not None and self.limit < largest["bytes"] + fixed:
            raise ValueError(f"cache_limit {self.limit:,} bytes is smaller than {self.where}/{largest['file']} "
                             f"({largest['bytes']:,} bytes) with the split's index, the least the cache must hold; "
                             "raise cache_limit")
        return self.limit is None or self.limit >= sum(e["bytes"] for e in split_files(info)) + fixed

    def hold(self, names: Sequence[str]) -> None:
        """Lease ``names`` to this process (one reader more for each), so that no process evicts
        them until ``release``; they are fetched by ``path``."""
        self._own()
        while _DROPPED:
            folder, dropped = _DROPPED.pop()
            folder.release(dropped)
        with self._guard:
            for name in names:
                self._held[name] = self._held.get(name, 0) + 1
        with self._locked():
            _Mirror(self.mirror)  # which sweeps the leases and fetches of processes gone
            self._write_lease()

    def release(self, names: Sequence[str]) -> None:
        """One reader of this process is done with ``names``: once none holds one, it may be evicted,
        least recently released first."""
        self._own()
        with self._guard:
            for name in names:
                left = self._held.get(name, 0) - 1
                if left > 0:
                    self._held[name] = left
                else:
                    self._held.pop(name, None)
                    self._here.discard(name)
        with self._locked():
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    os.utime(self.mirror / name)  # its last use
            self._write_lease()

    def release_later(self, names: Sequence[str]) -> None:
        """``release`` at this process's next ``hold`` of any folder: for a reader let go by the
        garbage collector, which may run in any thread at any point, even one holding a lock."""
        if self._pid == os.getpid():
            _DROPPED.append((self, names))

    def path(self, name: str) -> Path:
        """The local copy of ``name``, which this process holds (``hold``), fetched if need be."""
        self._own()
        if name in self._here:  # held since it was found here: no process can have evicted it
            return self.mirror / name
        found = self._obtain(name)
        with self._guard:
            if name in self._held:
                self._here.add(name)
        return found

    def prefetch(self, names: Sequence[str]) -> None:
        """Fetch ``names`` in this order in a background thread of this process (replacing what it
        had still to fetch), as far as room allows; a failure is left for the reader to meet."""
        self._own()
        with self._guard:
            while not self._wanted.empty():
                self._wanted.get_nowait()
                self._wanted.task_done()
            for name in names:
                if name not in self._here:
                    self._wanted.put(name)
            if self._fetcher is None:
                self._fetcher = threading.Thread(target=self._fetch_ahead, name="tokpack-cache-fetch", daemon=True)
                self._fetcher.start()

    def wait(self) -> None:
        """Until the background thread has fetched what it was given (the cold-cache bench, tests)."""
        self._own()
        self._wanted.join()

    def _fetch_ahead(self) -> None:
        while True:
            name = self._wanted.get()
            try:
                self._obtain(name)
            except (ValueError, OSError):
                pass  # no room, or the store failed: the reader that needs the file says so
            finally:
                self._wanted.task_done()

    def _write_lease(self) -> None:
        """Under the lock: this process's lease, naming the files it holds."""
        lease = self.mirror / f"{LEASE_PREFIX}{os.getpid()}"
        with self._guard:
            held = sorted(self._held)
        if held:
            _write(lease, json.dumps(held).encode())
        else:
            lease.unlink(missing_ok=True)

    def _record(self) -> dict[str, str]:
        """Under the lock: the mirror's record (not to be changed in place), parsed again only when
        the file changed: it lists every file fetched, and is asked about each one."""
        path = self.mirror / FETCHED_NAME
        try:
            info = path.lstat()
            key = (info.st_ino, info.st_mtime_ns, info.st_size)
        except FileNotFoundError:
            return {}
        if self._parsed[0] != key:
            record = _read_json(path)
            self._parsed = (key, record if isinstance(record, dict) else {})
        return self._parsed[1]

    def _present(self, name: str, record: Any = None) -> bool:
        """Under the lock: whether ``name`` is fetched, the file meta.json records (``record``: the
        mirror's record, read once for many names)."""
        target = self.mirror / name
        record = self._record() if record is None else record
        return (isinstance(record, dict) and record.get(name) == self.entries[name]["sha256"]
                and target.is_file() and not target.is_symlink())

    def _matches(self, name: str) -> bool:
        """Whether the mirror's copy of ``name`` holds the bytes meta.json records: hashed once a
        process (its inode and size remembered, and handed to forked workers), since the cache
        folder may be written by anyone who can write it, and its record vouches for nothing."""
        try:
            fd = os.open(self.mirror / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        digest = hashlib.sha256()
        with os.fdopen(fd, "rb", buffering=0) as f:
            info = os.fstat(fd)
            key = (info.st_dev, info.st_ino, info.st_size)
            if self._verified.get(name) == key:
                return True
            while block := f.read(BLOCK_BYTES):
                digest.update(block)
        if digest.hexdigest() != self.entries[name]["sha256"]:
            return False
        self._verified[name] = key
        return True

    def _found(self, name: str) -> bool:
        """Whether ``name`` is fetched and holds its bytes: looked up under the lock, hashed outside
        it (a file this process leases is evicted by none meanwhile; one it fetches ahead may be,
        and is then fetched again)."""
        with self._locked():
            present = self._present(name)
        return present and self._matches(name)

    def _obtain(self, name: str) -> Path:
        entry, target = self.entries[name], self.mirror / name
        if self._found(name):
            return target
        # One process fetches a file; another that wants it waits here, then finds it fetched.
        with _flocked(self.mirror / f".{name}{FETCHING_SUFFIX}", str(self.cache)):
            if self._found(name):
                return target
            with self._locked():
                self._make_room(name, entry["bytes"])
                tmp = tmp_path(target)
                out = open_new(tmp)  # under the lock: other processes count it at its final size
            try:
                try:
                    with out:
                        digest = self._copy(name, out)
                except OSError as exc:
                    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    raise ValueError(f"{self.where}/{name}: the local disk is full: free space, or "
                                     "give the cache a cache_limit that fits or another cache_dir") from None
                if digest != entry["sha256"] or tmp.stat().st_size != entry["bytes"]:
                    raise ValueError(f"{self.where}/{name} does not match meta.json (sha256 {digest[:12]}..., "
                                     f"recorded {entry['sha256'][:12]}...): it was replaced after the folder was "
                                     "published; publish the folder again")
                with self._locked():
                    record = {n: sha for n, sha in self._record().items() if (self.mirror / n).is_file()}
                    record[name] = entry["sha256"]
                    os.replace(tmp, target)  # over a copy that did not match, if any: the mirror is tokpack's
                    _write(self.mirror / FETCHED_NAME, json.dumps(record).encode())
                    self._verified[name] = _identity(target)  # hashed on its way in
                return target
            finally:
                tmp.unlink(missing_ok=True)

    def _copy(self, name: str, out: Any) -> str:
        """The object streamed into ``out`` (in ranges, each retried where it failed), hashed on the way."""
        digest = hashlib.sha256()
        with self.folder.open(name) as src:
            while chunk := src.read(BLOCK_BYTES):
                digest.update(chunk)
                out.write(chunk)
        return digest.hexdigest()

    def _make_room(self, name: str | None, needed: int, strict: bool = True) -> None:
        """Under the lock: evict the least recently used files no live process holds, in any
        mirror of the cache (but ``name``, the file to be fetched), until ``needed`` more bytes fit
        under the limit; ``strict``: refuse when they cannot."""
        if self.limit is None:
            return
        mirrors = [_Mirror(m) for m in self.cache.iterdir()
                   if MIRROR_NAME.fullmatch(m.name) and m.is_dir() and not m.is_symlink()]
        total = sum(m.held for m in mirrors)
        candidates = sorted((used, m, n, size) for m in mirrors for used, n, size in m.evictable()
                            if (m.folder, n) != (self.mirror, name))
        for _, mirror, evicted, size in candidates:
            if total + needed <= self.limit:
                break
            (mirror.folder / evicted).unlink(missing_ok=True)  # recorded in tokpack's own mirror: ours
            total -= size
        if strict and total + needed > self.limit:
            raise ValueError(f"the cache {self.cache} cannot make room for {self.where}/{name} ({needed:,} bytes): "
                             f"its limit is {self.limit:,} bytes and {total:,} are held by files in use; raise "
                             "cache_limit (below the split, each loader worker holds a file), or use another "
                             "cache_dir")


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    return info.st_dev, info.st_ino, info.st_size
