"""Prepared folders in object storage, read through a bounded local cache.

    from tokpack import TokenWindows, open_split
    train = TokenWindows("s3://bucket/edu", 1024, split="train")            # cache: $TOKPACK_CACHE_DIR
    val = open_split("s3://bucket/edu", "val", cache_dir="/nvme/tokpack", cache_limit=200 << 30)
    python -m tokpack.evaluate s3://bucket/edu --checkpoint out/ckpt.pt     # verify, inspect too

A remote folder (any URL ``tokpack[remote]`` reaches) is read only once its meta.json is there:
prepare writes it last, so a folder still being published is refused, as a local one is. The
files of the splits asked for are then fetched whole into a mirror of the folder in the cache
(each checked against meta.json's sha256, so an object replaced after publishing is refused),
and the readers open the mirror as a local folder: batches, resume states and fingerprints are
the local folder's. Why whole splits: tokpack's samplers draw windows and documents from the
whole split every few batches, so a cache smaller than a split would fetch continually; fetched
once, the training loop never waits on the network again.

The cache (``cache_dir``, default ``$TOKPACK_CACHE_DIR`` or ``~/.cache/tokpack``) holds at most
``cache_limit`` bytes (default ``$TOKPACK_CACHE_LIMIT``, else no limit): to make room, the least
recently used mirrors go whole, except those a running process holds (a lease file with its
pid). A split larger than the limit is refused. Processes share a cache folder safely: fetching
and evicting happen under a file lock, files arrive by rename, and a mirror in use is never
evicted. Cost: O(split bytes) fetched once; then nothing but the local folder's.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..format import META_NAME, Meta, every_file, open_new, parse_meta, tmp_path
from . import BLOCK_BYTES, Store, is_url, open_store

CACHE_ENV, LIMIT_ENV = "TOKPACK_CACHE_DIR", "TOKPACK_CACHE_LIMIT"
LOCK_NAME = ".tokpack-cache.lock"
FETCHED = ".tokpack-fetched.json"  # a mirror's record: each fetched file's sha256, and when it was last used
LEASE_PREFIX = ".tokpack-lease-"


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
def _locked(cache: Path) -> Iterator[None]:
    """The cache folder, created if need be, locked against other processes for the block."""
    try:
        cache.mkdir(parents=True, exist_ok=True)
        fd = os.open(cache / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise ValueError(f"the cache folder {cache} is not writable ({exc.strerror}); give cache_dir= or "
                         f"{CACHE_ENV} a writable folder") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _alive(lease: Path) -> bool:
    try:
        os.kill(int(lease.name[len(LEASE_PREFIX):]), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _mirrors(cache: Path) -> list[tuple[float, Path, int, bool]]:
    """Every mirror in the cache: (last use, folder, bytes, in use by a live process)."""
    out = []
    for mirror in cache.iterdir():
        record = mirror / FETCHED
        if mirror.is_symlink() or not mirror.is_dir() or not record.is_file():
            continue
        size = sum(f.stat().st_size for f in mirror.iterdir() if f.is_file() and not f.is_symlink())
        out.append((record.stat().st_mtime, mirror, size, any(_alive(p) for p in mirror.glob(LEASE_PREFIX + "*"))))
    return sorted(out, key=lambda m: m[0])


def _make_room(cache: Path, keep: Path, needed: int, limit: int | None, url: str) -> None:
    """Evict the least recently used mirrors (not ``keep``, none in use) until ``needed`` more
    bytes fit under ``limit``."""
    if limit is None:
        return
    mirrors = _mirrors(cache)
    total = sum(size for _, _, size, _ in mirrors)
    for _, mirror, size, in_use in mirrors:
        if total + needed <= limit:
            return
        if mirror != keep and not in_use:
            shutil.rmtree(mirror)  # tokpack's own: a cache folder with its record
            total -= size
    if total + needed > limit:
        raise ValueError(f"the cache {cache} cannot make room for {url} ({needed:,} bytes more): its limit is "
                         f"{limit:,} bytes and {total:,} are held by folders in use; raise cache_limit or use "
                         "another cache_dir")


def _fetch(store: Store, target: Path, entry: dict[str, Any]) -> None:
    """One file, streamed to a temporary name, hashed on the way, renamed once it is the one
    meta.json records."""
    tmp = tmp_path(target)
    try:
        with open_new(tmp) as out:
            def copy() -> str:
                if out.tell():  # a retry starts the file over
                    out.seek(0)
                    out.truncate()
                digest = hashlib.sha256()
                with store.fs.open(store.key(entry["file"]), "rb", block_size=BLOCK_BYTES) as src:
                    while chunk := src.read(BLOCK_BYTES):
                        digest.update(chunk)
                        out.write(chunk)
                return digest.hexdigest()

            found = store.call(entry["file"], copy)
        if found != entry["sha256"] or tmp.stat().st_size != entry["bytes"]:
            raise ValueError(f"{store.where}/{entry['file']} does not match meta.json (sha256 {found[:12]}..., "
                             f"recorded {entry['sha256'][:12]}...): it was replaced after the folder was published; "
                             "publish the folder again")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def published(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Store, Meta, bytes]:
    """A remote folder's store, its meta.json checked and as bytes, refused in one line when there
    is none (not published yet, or not tokpack's)."""
    store = open_store(url, storage_options)
    try:
        raw = store.call(META_NAME, lambda: store.fs.cat_file(store.key(META_NAME)))
    except ValueError as exc:
        if "does not exist" not in str(exc):
            raise
        raise ValueError(f"{store.where} has no meta.json: it is not a published tokpack folder (prepare writes "
                         "meta.json last, so one being published is refused too); wait for it, or check the URL") \
            from None
    return store, parse_meta(raw, f"{store.where}/{META_NAME}"), raw


def cached_folder(url: str, splits: Sequence[str] | None = None, cache_dir: str | Path | None = None,
                  cache_limit: int | None = None, storage_options: dict[str, Any] | None = None) -> Path:
    """The local mirror of the remote prepared folder ``url``, holding its meta.json and the files
    of ``splits`` (None: every split), fetched if need be; leased to this process.

    Args:
        url: the folder's URL (``s3://bucket/prefix``, ``gs://...``, ``https://...``).
        splits: the splits to fetch.
        cache_dir: the cache folder (default ``$TOKPACK_CACHE_DIR`` or ``~/.cache/tokpack``).
        cache_limit: the most bytes the cache may hold (default ``$TOKPACK_CACHE_LIMIT``, else none).
        storage_options: as for remote inputs (``--storage-options``).
    """
    store, meta, raw = published(url, storage_options)
    where = store.where
    names = list(meta["splits"]) if splits is None else list(splits)
    unknown = [s for s in names if s not in meta["splits"]]
    if unknown:
        raise ValueError(f"{where} has splits {', '.join(meta['splits'])}; pass split= one of them (got {unknown[0]!r})")
    entries = [e for s in names for e in every_file(meta["splits"][s])]
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    mirror = cache / hashlib.sha256(where.encode()).hexdigest()[:24]
    limit = _limit(cache_limit)
    needed = sum(e["bytes"] for e in entries)
    if limit is not None and needed > limit:
        raise ValueError(f"cache_limit {limit:,} bytes is smaller than {where}'s {', '.join(names)} ({needed:,} bytes), "
                         "which are fetched whole; raise cache_limit")
    with _locked(cache):
        if mirror.is_symlink() or (mirror.exists() and not mirror.is_dir()):
            raise ValueError(f"{mirror} in the cache is not a folder of tokpack's (a link or a file); remove it")
        mirror.mkdir(exist_ok=True)
        record_path = mirror / FETCHED
        try:
            record = json.loads(record_path.read_text()) if record_path.is_file() else {}
        except (OSError, ValueError):
            record = {}  # unreadable: every file is fetched again
        if not isinstance(record, dict):
            record = {}
        missing = [e for e in entries if record.get(e["file"]) != e["sha256"] or not (mirror / e["file"]).is_file()]
        _make_room(cache, mirror, sum(e["bytes"] for e in missing), limit, where)
        for lease in mirror.glob(LEASE_PREFIX + "*"):
            if not _alive(lease):
                lease.unlink()  # a process gone: its lease with it
        (mirror / f"{LEASE_PREFIX}{os.getpid()}").touch()
        for entry in missing:
            _fetch(store, mirror / entry["file"], entry)
            record[entry["file"]] = entry["sha256"]
            _write(record_path, json.dumps(record).encode())
        _write(mirror / META_NAME, raw)
        _write(record_path, json.dumps(record).encode())  # its time is the mirror's last use
    return mirror


def _write(path: Path, data: bytes) -> None:
    tmp = tmp_path(path)
    try:
        with open_new(tmp) as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def local_folder(folder: str | Path, splits: Sequence[str] | None = None, **cache: Any) -> Path:
    """``folder`` itself, or the cached mirror of a remote one (``cached_folder``)."""
    if isinstance(folder, str) and is_url(folder):
        return cached_folder(folder, splits, **cache)
    return Path(folder)
