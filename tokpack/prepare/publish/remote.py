"""A prepared folder published to object storage: ``--out-dir s3://bucket/prefix``.

    python -m tokpack.prepare corpus/ --out-dir s3://bucket/edu --spool-dir /nvme/spool

The contract: the bucket gets the files, names and bytes the same command writes into a local
folder named as the URL's last part; the run is made in a local ``Spool`` (a flat run whole, a
sharded run two units at a time, each uploaded with its record as it finishes, so a rerun keeps
it; on Ray, each task so from its own worker's spool: ``tasks.publish_task``); meta.json goes
up last. Before any work a probe proves the credentials may write, the folder is locked
(``.tokpack.lock``, created only if absent) and a folder holding a corpus or others' files is
refused without ``--force``. Everything goes through the folder's verbs
(``tokpack.storage.folder``). See docs/prepare.md ("Publishing to object storage").
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from ...format import DATA_FILE, LOCK_NAME, META_NAME, PROBE, PROBE_NAME, SIGN_NAME, SPOOL_MARK, SPOOL_PREFIX, UNIT_INDEX_NAME, UNIT_RECORD, UNIT_RECORD_NAME, UnitRecord, meta_files, parse_meta
from ...storage import Missing, is_url
from ...storage.folder import Folder, as_folder
from ...storage.local import json_bytes
from ..config import PrepareConfig
from ..guard.placement import Placement
from ..plan import Plan
from . import ledger
from .folder import publish as local_publish

# A run's own files while it is made, gone once meta.json stands.
_LEFTOVER = re.compile(rf"{UNIT_RECORD_NAME.pattern}|{UNIT_INDEX_NAME.pattern}|{SIGN_NAME.pattern}")
_OWN = re.compile(rf"{DATA_FILE.pattern}|{re.escape(META_NAME)}|{re.escape(LOCK_NAME)}|{_LEFTOVER.pattern}|"
                  rf"{PROBE_NAME.pattern}")
LISTING_S = 2.0  # how often a run on Ray lists its remote folder for the units uploaded
# A lock as a run writes it: pid@host and a random token. Anything else is shown as foreign, not echoed.
_HOLDER = re.compile(rb"(\d{1,10})@([A-Za-z0-9._-]{1,253}) [0-9a-f]{32}")


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


class Publisher:
    """The remote output folder of one run: its checks, lock, uploads and commit, all through the
    folder's verbs (``tokpack.storage.folder``).

    Args:
        url: the folder's URL.
        options: the store's options (``--storage-options``).
        force: take over a folder that holds a corpus, another tool's files or a dead run's lock.
    """

    def __init__(self, url: str, options: dict[str, Any] | None, force: bool):
        self._url, self._options = url, options
        self.folder: Folder = as_folder(url, options)
        self.where, self.force = self.folder.where, force
        self.stale: set[str] = set()
        self.token = f"{os.getpid()}@{socket.gethostname()} {uuid.uuid4().hex}".encode()
        self.locked = False
        self._uploader = ThreadPoolExecutor(1, thread_name_prefix="tokpack-upload")
        self._uploading: Future[None] | None = None
        self._listed, self._numbered = -LISTING_S, set[int]()
        # The local run is made in a folder of this name, so that llm.c shards, named after their
        # folder, have the names a local run into a folder of that name gives them.
        last = self.where.rstrip("/").rsplit("/", 1)[-1]
        self.name = last if last not in ("", ".", "..") and "://" not in last else "tokpack"

    def begin(self) -> None:
        """The checks and the lock, before any work."""
        probe = PROBE.format(uuid.uuid4().hex)
        try:
            self.folder.write(probe, b"")
            self.folder.remove(probe)
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
        if not self.folder.create(LOCK_NAME, self.token):
            held = self._read(LOCK_NAME)
            if not self.force and not _dead_here(held):
                who = _holder(held)
                holder = (f"another tokpack.prepare (pid {who[0]} on {who[1]})" if who else
                          f"a {LOCK_NAME} that tokpack did not write ({len(held or b''):,} bytes)")
                raise ValueError(f"{self.where} is being written by {holder}; wait for it, or if that run is dead, "
                                 "pass --force to take the folder over")
            self.folder.write(LOCK_NAME, self.token)
        self.locked = True

    def refresh(self) -> None:
        """The folder seen afresh: other machines' tasks have written to it since it was listed
        (a store keeps its listings)."""
        self.folder = as_folder(self._url, self._options)

    def _read(self, name: str) -> bytes | None:
        try:
            return self.folder.read(name)
        except Missing:
            return None

    def _check_contents(self) -> None:
        names = self.folder.names()
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
            self.stale = {f["file"] for f in meta_files(old["splits"])}
            self.folder.remove(META_NAME)  # incomplete from here on

    apart = True  # Ray's workers each make their units in a spool of their own

    def kept(self, plan: Plan, unit: int, placement: Placement | None) -> UnitRecord | None:
        """The unit's uploaded record if it is this run's (written by the guard's ``placement``),
        its input unchanged and its files there at their sizes; its index part is fetched into the
        spool for the merge. A flat run's one unit is never kept: it is published whole."""
        if not plan.sharded:
            return None
        record = ledger.this_run(plan, unit, self._read(UNIT_RECORD.format(unit)), self.where, placement)
        if record is None:
            return None
        for entry in ledger.record_files(record):
            try:
                if self.folder.size(entry["file"]) != entry["bytes"]:
                    return None
            except Missing:
                return None
        for part in record["splits"].values():
            self.folder.get(part["idx"]["file"], plan.out / part["idx"]["file"])
        return record

    def upload(self, plan: Plan, record: UnitRecord) -> None:
        """A finished unit's files, then its record; its shards then leave the spool."""
        for entry in ledger.record_files(record):
            local = plan.out / entry["file"]
            self.folder.put(local, entry["file"])
            if not entry["file"].startswith("."):  # a shard; the index parts stay for the merge
                local.unlink()
        name = UNIT_RECORD.format(record["unit"])
        self.folder.put(plan.out / name, name)

    def keep(self, plan: Plan, record: UnitRecord) -> UnitRecord:
        """A finished unit kept in the spool, then uploaded while the next one is tokenized (two
        units' shards in the spool at most); a flat run's one unit waits in the spool for the finish."""
        if not plan.sharded:
            return record
        kept = ledger.keep(plan, record)
        self.done()
        self._uploading = self._uploader.submit(self.upload, plan, kept)
        return kept

    def done(self) -> None:
        """The last unit given to ``keep`` uploaded."""
        if self._uploading is not None:
            uploading, self._uploading = self._uploading, None
            uploading.result()

    def numbered(self, plan: Plan) -> set[int]:
        """The units whose records the folder holds, listed again every ``LISTING_S`` at most."""
        if time.monotonic() - self._listed >= LISTING_S:
            self._listed = time.monotonic()
            self.refresh()
            self._numbered = ledger.numbered_in(self.folder.names())
        return self._numbered

    def recorded(self, plan: Plan, placement: Placement | None) -> tuple[list[UnitRecord], list[int]]:
        self.refresh()  # the tasks uploaded their units from other machines
        return ledger.every([self.kept(plan, unit, placement) for unit in range(plan.units)])

    def share(self, plan: Plan, names: list[str]) -> None:
        for name in names:
            self.folder.put(plan.out / name, name)

    def fetch(self, plan: Plan, names: list[str]) -> None:
        """The files ``names`` that the run's own process shared (``share``), into the spool where
        the folder holds them."""
        for name in names:
            try:
                self.folder.get(name, plan.out / name)
            except Missing:
                pass

    def publish(self, plan: Plan, meta: Mapping[str, Any], renames: list[tuple[str, str]]) -> None:
        """The files of meta.json made in the spool (a folder made whole there is first published
        and verified there, as a local one is), then meta.json (the commit); then the run's
        records, index parts and signatures, and an older corpus's files this one does not list, go."""
        listed = [f["file"] for f in meta_files(meta["splits"])]
        made = {Path(final).name for _, final in renames}
        if all(name in made or (plan.out / name).exists() for name in listed):
            local_publish(plan.out, meta, renames)
        else:  # a sharded run's units are up already
            for tmp, final in renames:
                os.replace(tmp, final)
        for name in listed:
            if (plan.out / name).exists():
                self.folder.put(plan.out / name, name)
        self.folder.write(META_NAME, json_bytes(meta))
        self.refresh()
        leftovers = [name for name in self.folder.names() if _LEFTOVER.fullmatch(name)]
        for name in leftovers + sorted(self.stale - set(listed)):
            self.folder.remove(name)  # or gone already

    def release(self) -> None:
        if self.locked and self._read(LOCK_NAME) == self.token:
            self.folder.remove(LOCK_NAME)
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


def spooled(config: PrepareConfig, spool: Spool, folder: Publisher) -> PrepareConfig:
    """``config`` as the run that writes the local ``spool`` takes it: into a folder of the URL's
    last name there, with the store's options only where an input needs them."""
    remote_inputs = any(map(is_url, (*config.inputs, *config.val_inputs)))
    return dataclasses.replace(config, out_dir=str(spool.path / folder.name), force=False, spool_dir=None,
                               storage_options=config.storage_options if remote_inputs else None)
