"""A prepared folder published to object storage: ``--out-dir s3://bucket/prefix``.

    python -m tokpack.prepare corpus/ --out-dir s3://bucket/edu --spool-dir /nvme/spool

The run is the one the same command makes into a local folder named as the URL's last part
(so the bucket holds the same files, bytes and names: llm.c shards are named after their
folder), made in a local spool (``--spool-dir``, default the system's temporary folder; a fresh
folder inside it, removed at the end, and one a killed run left is removed by the next run there).
A flat run is made whole in the spool (its token files: about 2 bytes a token), verified, and
uploaded; like a local flat run it is not resumed. A sharded run (``--shard-tokens``, ``--format
llmc``) uploads each unit as it finishes, while the next unit is tokenized, then its record (the
unit's commit), and its shards leave the spool: the spool holds two units' shards at most (about
2 bytes a token of ``--unit-mb`` MB of text each, 0.6 GB at the default) plus the document index
parts. At the end the merged indexes are uploaded, then meta.json, the folder's commit: readers
refuse the folder until it stands, and a sharded run killed before it leaves the uploaded units,
which the rerun keeps (each unit's record, input and uploaded sizes checked, as a local rerun
checks its files).

Before any work: a probe object is written and removed (credentials that can read but not write
fail here, in one line), the folder is locked with ``.tokpack.lock`` created only if absent
(``If-None-Match: *`` on S3 and stores that honour it; elsewhere the lock is written, read back
and must be this run's, which narrows but cannot close the race: the docs say so), and a folder
holding a published corpus or files tokpack did not write is refused without ``--force``. A lock
left by a killed run of this host (its pid gone) is taken over; one from elsewhere needs
``--force``. One process writes a remote folder: torchrun and ``--tasks`` refuse a remote
``--out-dir``.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import socket
import tempfile
import uuid
from pathlib import Path
from typing import Any

from ..format import (DATA_FILE, LOCK_NAME, META_NAME, UNIT_INDEX_NAME, UNIT_RECORD, UNIT_RECORD_NAME, UnitRecord,
                      every_file, parse_meta)
from ..storage import Missing, open_store
from . import units
from .config import Plan
from .writers import json_bytes

LOCK = LOCK_NAME  # the same lock file as a local folder's, by name: a store has no flock
_OWN = re.compile(rf"{DATA_FILE.pattern}|{re.escape(META_NAME)}|{re.escape(LOCK)}|{UNIT_RECORD_NAME.pattern}|"
                  rf"{UNIT_INDEX_NAME.pattern}|\.tokpack-probe-[0-9a-f]{{32}}")
# A lock as a run writes it: pid@host and a random token. Anything else is shown as foreign, not echoed.
_HOLDER = re.compile(rb"(\d{1,10})@([A-Za-z0-9._-]{1,253}) [0-9a-f]{32}")
SPOOL_PREFIX = "tokpack-spool-"
SPOOL_MARK = ".tokpack-spool"  # locked by the run that made the spool: one that is unlocked was a killed run's


def _holder(held: bytes | None) -> tuple[int, str] | None:
    """(pid, host) of a lock a run wrote, or None for any other bytes."""
    found = _HOLDER.fullmatch(held or b"")
    return (int(found.group(1)), found.group(2).decode()) if found else None


def _dead_here(held: bytes | None) -> bool:
    """Whether a lock was taken by a process of this host that is gone (a killed run)."""
    who = _holder(held)
    if who is None or who[1] != socket.gethostname():
        return False
    try:
        os.kill(who[0], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class RemoteFolder:
    """The remote output folder of one run: its checks, lock, uploads and commit."""

    def __init__(self, url: str, options: dict[str, Any] | None, force: bool):
        self.store = open_store(url, options)
        self.fs, self.root, self.where, self.force = self.store.fs, self.store.path, self.store.where, force
        self.stale: set[str] = set()
        self.token = f"{os.getpid()}@{socket.gethostname()} {uuid.uuid4().hex}"
        self.locked = False
        # The local run is made in a folder of this name, so that llm.c shards, named after their
        # folder, have the names a local run into a folder of that name gives them.
        last = self.root.rsplit("/", 1)[-1]
        self.name = last if last not in ("", ".", "..") else "tokpack"

    def _key(self, name: str) -> str:
        return self.store.key(name)

    def _call(self, what: str, fn: Any) -> Any:
        return self.store.call(what, fn)

    def begin(self) -> None:
        """The checks and the lock, before any work."""
        probe = f".tokpack-probe-{uuid.uuid4().hex}"
        try:
            self._call(probe, lambda: self.fs.pipe_file(self._key(probe), b""))
            self._call(probe, lambda: self.fs.rm_file(self._key(probe)))
        except (ValueError, NotImplementedError) as exc:
            raise ValueError(f"--out-dir {self.where} cannot be written ({exc}); check the credentials' write "
                             "permission, or publish elsewhere") from None
        self._lock()
        try:
            self._check_contents()
        except BaseException:
            self.release()
            raise

    def _lock(self) -> None:
        key = self._key(LOCK)
        try:
            self.fs.pipe_file(key, self.token.encode(), mode="create")
        except Exception:  # a store's own types for "it exists"; read it to tell
            pass
        held = self._read(LOCK)
        if held != self.token.encode():
            if not self.force and not _dead_here(held):
                who = _holder(held)
                holder = (f"another tokpack.prepare (pid {who[0]} on {who[1]})" if who else
                          f"a {LOCK} that tokpack did not write ({len(held or b''):,} bytes)")
                raise ValueError(f"{self.where} is being written by {holder}; wait for it, or if that run is dead, "
                                 "pass --force to take the folder over")
            self._call(LOCK, lambda: self.fs.pipe_file(key, self.token.encode()))
        self.locked = True

    def _read(self, name: str) -> bytes | None:
        try:
            return self._call(name, lambda: self.fs.cat_file(self._key(name)))
        except Missing:
            return None

    def _names(self) -> list[str]:
        found = self._call("", lambda: self.fs.find(self.root))
        return [name[len(self.root) + 1:] for name in found]

    def _check_contents(self) -> None:
        names = self._names()
        theirs = sorted(n for n in names if not _OWN.fullmatch(n))
        if theirs and not self.force:
            raise ValueError(f"{self.where} holds files tokpack did not write ({', '.join(theirs[:3])}"
                             f"{' ...' if len(theirs) > 3 else ''}); pass --force to publish beside them or choose "
                             "another --out-dir")
        if META_NAME in names:
            if not self.force:
                raise ValueError(f"{self.where} already holds a prepared corpus; pass --force to overwrite it or "
                                 "choose another --out-dir")
            old = parse_meta(self._read(META_NAME) or b"{}", f"{self.where}/{META_NAME}")
            self.stale = {f["file"] for info in old["splits"].values() for f in every_file(info)}
            self._call(META_NAME, lambda: self.fs.rm_file(self._key(META_NAME)))  # incomplete from here on

    def kept(self, plan: Plan, unit: int) -> UnitRecord | None:
        """The unit's uploaded record if it is this run's, its input unchanged and its files there
        at their sizes; its index part is fetched into the spool for the merge."""
        record = units.this_run(plan, unit, self._read(UNIT_RECORD.format(unit)), self.where)
        if record is None:
            return None
        entries = units.record_files(record)  # type: ignore[arg-type]
        for entry in entries:
            try:
                size = self._call(entry["file"], lambda: self.fs.info(self._key(entry["file"])))["size"]
            except Missing:
                return None
            if size != entry["bytes"]:
                return None
        for part in record["splits"].values():
            name = part["idx"]["file"]
            self._call(name, lambda: self.fs.get_file(self._key(name), str(plan.out / name)))
        return record

    def upload(self, plan: Plan, record: UnitRecord) -> None:
        """A finished unit's files, then its record; its shards then leave the spool."""
        for entry in units.record_files(record):  # type: ignore[arg-type]
            local = plan.out / entry["file"]
            self.store.put(local, entry["file"])
            if not entry["file"].startswith("."):  # a shard; the index parts stay for the merge
                local.unlink()
        name = UNIT_RECORD.format(record["unit"])  # type: ignore[typeddict-item]
        self.store.put(plan.out / name, name)

    def publish(self, spool: Path, meta: dict[str, Any], uploads: list[str], leftovers: list[str]) -> None:
        """The files ``uploads`` from ``spool``, then meta.json (the commit); then ``leftovers``
        (a sharded run's records and index parts), and an older corpus's files this one does not
        list, go."""
        for name in uploads:
            self.store.put(spool / name, name)
        body = json_bytes(meta)
        self._call(META_NAME, lambda: self.fs.pipe_file(self._key(META_NAME), body))
        new = {f["file"] for info in meta["splits"].values() for f in every_file(info)}
        for name in leftovers + sorted(self.stale - new):
            try:
                self._call(name, lambda: self.fs.rm_file(self._key(name)))
            except Missing:
                pass  # gone already

    def release(self) -> None:
        if self.locked and self._read(LOCK) == self.token.encode():
            self._call(LOCK, lambda: self.fs.rm_file(self._key(LOCK)))
        self.locked = False



class Spool:
    """The local folder a remote run is made in: a fresh folder in ``spool_dir`` (None: the
    system's temporary folder), removed at the end. One that a killed run left behind (its marker
    no longer locked) is removed by the next run that spools there."""

    def __init__(self, spool_dir: str | None):
        self.base = Path(spool_dir or tempfile.gettempdir())

    def __enter__(self) -> Spool:
        self._sweep()
        try:
            self.path = Path(tempfile.mkdtemp(prefix=SPOOL_PREFIX, dir=self.base))
            self._mark = os.open(self.path / SPOOL_MARK, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            fcntl.flock(self._mark, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            raise ValueError(f"--spool-dir {self.base} cannot hold a spool ({exc.strerror}); give a writable "
                             "folder") from None
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        shutil.rmtree(self.path, ignore_errors=True)  # the run's own folder
        os.close(self._mark)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ValueError(f"the spool folder {self.base} is full ({exc.strerror}): a remote run is made there "
                             "before it is uploaded (a flat run's whole token files, a sharded run's two units); "
                             "give --spool-dir a folder on a disk with room") from None

    def _sweep(self) -> None:
        """Remove the spools of killed runs: folders of the spool's name whose marker no process holds."""
        try:
            found = [e for e in os.scandir(self.base) if e.name.startswith(SPOOL_PREFIX)
                     and e.is_dir(follow_symlinks=False)]
        except OSError:
            return  # the spool's own creation says what is wrong
        for entry in found:
            try:
                fd = os.open(os.path.join(entry.path, SPOOL_MARK), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue  # no marker: not a spool tokpack can prove it made
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live run's
            finally:
                os.close(fd)
            shutil.rmtree(entry.path, ignore_errors=True)
