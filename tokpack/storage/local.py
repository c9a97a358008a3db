"""A local folder behind tokpack's folder verbs, and the file operations every writer uses:
a new file under a temporary name, renamed into place when whole; nothing opened for writing
through a link; nothing removed that tokpack cannot prove it wrote.

    from tokpack.storage.folder import as_folder
    folder = as_folder("data/sample")          # a LocalFolder; a URL gives a RemoteFolder
    meta = folder.read("meta.json")

See docs/design.md for the folder interface and docs/bad-input.md for what is refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from ..format import LOCK_NAME, META_NAME, SIGN_GLOB, SIGN_NAME, TMP_SUFFIX, UNIT_INDEX_GLOB, UNIT_RECORD_GLOB, plain_name
from . import Missing


@contextlib.contextmanager
def named_errors(path: Path) -> Iterator[None]:
    """A write's OSError (a full disk) with the file it was writing, which Python leaves out."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from None


def read_own(path: Path) -> bytes:
    """A file of tokpack's own in a folder, read whole, opened without following a link (a link
    planted at one of its names is an OSError, as a missing file is)."""
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as f:
        return f.read()


def tmp_path(path: Path) -> Path:
    """Where ``path`` is written before the rename that publishes it: unique to this process."""
    return path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")


def open_new(path: Path) -> BinaryIO:
    """A file this process creates to write (a temporary name, renamed when complete): never
    through a link and never onto a file that is there already, so tokpack truncates nothing it
    did not create."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        raise ValueError(f"{path} is already there, where tokpack writes a temporary file of its own; "
                         "if no other run is writing into this folder, remove it and rerun") from None
    return os.fdopen(fd, "w+b")


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[BinaryIO]:
    """A new file (``open_new``) under ``path``'s temporary name, put in its place by rename when
    the block ends; if the block fails, the temporary file goes and ``path`` is as it was."""
    tmp = tmp_path(path)
    try:
        with open_new(tmp) as f:
            yield f
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def json_bytes(obj: Any) -> bytes:
    """meta.json's and a record's bytes: one spelling, so a published folder is the local one."""
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8")


def write_json_atomic(path: Path, obj: Any, durable: bool = True) -> None:
    """``obj`` as JSON in place of ``path``, whole or not at all; ``durable``: on the disk before
    the rename (a record that names what must survive a crash). Without it, a crash may leave the
    file torn or its old self, which suits a record that holds the sha256 of what it describes:
    its reader then does that work again."""
    with named_errors(path), replacing(path) as f:
        f.write(json_bytes(obj))
        if durable:
            f.flush()
            os.fsync(f.fileno())


def remove_own(path: Path) -> bool:
    """Remove a file that tokpack wrote (the caller has matched its name to tokpack's pattern): a
    regular file only, never a link nor what it points to. Whether it was removed."""
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            path.unlink()
            return True
    except FileNotFoundError:
        pass
    return False


@contextlib.contextmanager
def claimed(path: Path, waits: bool) -> Iterator[bool]:
    """Whether this process holds the claim ``path`` (an advisory lock on a file of tokpack's,
    which the kernel releases if the process dies): taken at once, or, with ``waits``, once the
    process that holds it lets go. Tasks of a run claim a piece of shared work so that each does
    a piece once, and a dead task's piece is done by the next one that asks."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if waits else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def remove_leftovers(folder: Path) -> list[str]:
    """What a run killed after publishing meta.json left in a whole folder: unit records, index
    parts, temporaries and its lock. Only while no run holds the lock: a running prepare's
    records are its work. Returns the names removed."""
    if not (folder / META_NAME).is_file():
        return []
    lock = folder / LOCK_NAME
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EACCES):
            return []  # not tokpack's lock, or not ours to take: leave the folder as it is
        raise
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return []
        found = [*folder.glob(UNIT_RECORD_GLOB), *folder.glob(UNIT_INDEX_GLOB), *folder.glob(f".*{TMP_SUFFIX}"),
                 *(p for p in folder.glob(SIGN_GLOB) if SIGN_NAME.fullmatch(p.name))]
        if fd is not None and stat.S_ISREG(os.fstat(fd).st_mode):
            found.append(lock)
        return sorted(p.name for p in found if remove_own(p))
    finally:
        if fd is not None:
            os.close(fd)


class LocalFolder:
    """A folder on this machine's disks: every name a plain file name in it, no link followed.

    Args:
        path: the folder.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.where = str(path)

    def _file(self, name: str) -> Path:
        return self.path / plain_name(name, self.where)

    def _open(self, name: str) -> BinaryIO:
        """``name`` opened to read: a regular file, not a link, not waited on (a FIFO)."""
        path = self._file(name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise Missing(f"{path} does not exist") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ValueError(f"{path} is a link, and a folder's files are its own; remove the link") from None
            raise
        f = os.fdopen(fd, "rb")
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            f.close()
            raise ValueError(f"{path} is not a regular file")
        return f

    def read(self, name: str, start: int = 0, end: int | None = None) -> bytes:
        with self._open(name) as f:
            f.seek(start)
            return f.read() if end is None else f.read(max(end - start, 0))

    def open(self, name: str) -> BinaryIO:
        return self._open(name)

    def size(self, name: str) -> int:
        path = self._file(name)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            raise Missing(f"{path} does not exist") from None
        if stat.S_ISLNK(info.st_mode):
            raise ValueError(f"{path} is a link, and a folder's files are its own; remove the link")
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path} is not a regular file")
        return info.st_size

    def names(self) -> list[str]:
        try:
            entries = list(os.scandir(self.path))
        except FileNotFoundError:
            raise Missing(f"{self.where} does not exist") from None
        return sorted(e.name for e in entries if e.is_file(follow_symlinks=False))

    def write(self, name: str, data: bytes) -> None:
        with replacing(self._file(name)) as f:
            f.write(data)

    def create(self, name: str, data: bytes) -> bool:
        path = self._file(name)
        try:
            with open_new(path) as f:
                f.write(data)
        except ValueError:
            return False  # open_new's word for "it is there already"
        return True

    def put(self, local: Path, name: str) -> None:
        with open(local, "rb") as src, replacing(self._file(name)) as out:
            shutil.copyfileobj(src, out, 1 << 20)

    def get(self, name: str, local: Path) -> None:
        with self._open(name) as src, replacing(local) as out:
            shutil.copyfileobj(src, out, 1 << 20)

    def remove(self, name: str) -> None:
        remove_own(self._file(name))

    def __repr__(self) -> str:
        return f"LocalFolder({self.where})"
