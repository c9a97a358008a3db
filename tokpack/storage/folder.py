"""One interface for a folder of tokpack's files, wherever it lives: ``as_folder(path_or_url)``.

    from tokpack.storage.folder import as_folder, published
    folder = as_folder("data/sample")                 # or "s3://bucket/edu"
    meta, _ = published(folder)                       # its meta.json, checked
    head = folder.read("train.bin", 0, 1024)

A ``LocalFolder`` and a ``RemoteFolder`` speak the same verbs, with the same typed errors
(``Missing``, ``Denied``, ``Unavailable``, user errors of ``tokpack.storage``), so verify,
inspect, the cache and a remote publish are written once for both. Every name is a plain file
name inside the folder (anything else is refused before a request); a local folder follows no
link. See docs/design.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from ..format import JSON_LIMIT, META_NAME, Meta, parse_meta
from . import Missing, is_url
from .local import LocalFolder
from .remote import RemoteFolder


class Folder(Protocol):
    """A folder of files, each named by a plain name inside it; ``where`` names it in messages."""

    where: str

    def read(self, name: str, start: int = 0, end: int | None = None) -> bytes:
        """The bytes of ``name`` from ``start`` to ``end`` (None: its end)."""
        ...

    def open(self, name: str) -> BinaryIO:
        """``name`` as a stream (a remote one read in ranges, each retried where it failed)."""
        ...

    def size(self, name: str) -> int:
        ...

    def names(self) -> list[str]:
        """The names of the files in the folder, sorted."""
        ...

    def write(self, name: str, data: bytes) -> None:
        """``name`` written whole with ``data``, replacing what was there at once."""
        ...

    def create(self, name: str, data: bytes) -> bool:
        """``name`` written with ``data`` if it is not there: whether this call made it (a lock)."""
        ...

    def put(self, local: Path, name: str) -> None:
        """The local file ``local`` copied in as ``name``."""
        ...

    def get(self, name: str, local: Path) -> None:
        """``name`` copied out to the local path ``local``, which appears whole or not at all."""
        ...

    def remove(self, name: str) -> None:
        """Remove ``name`` if it is there (a store says nothing of a name that was not)."""
        ...


def as_folder(where: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> Folder:
    """The folder ``where`` names: a URL's (``s3://``, ``gs://``, ``https://``: ``tokpack[remote]``),
    else a local path's.

    Args:
        where: a local folder or a remote folder's URL.
        storage_options: for a URL, the store's options, as for remote inputs.
    """
    if isinstance(where, str) and is_url(where):
        return RemoteFolder(where, storage_options)
    if storage_options is not None:
        raise ValueError(f"storage_options apply to a folder's URL, and {where} is local: drop them")
    return LocalFolder(where)


def published(folder: Folder) -> tuple[Meta, bytes]:
    """A prepared folder's meta.json, checked, and its bytes; refused in one line where there is
    none (prepare writes it last, so a folder still being written is refused too)."""
    try:
        size = folder.size(META_NAME)
        if size > JSON_LIMIT:
            raise ValueError(f"{folder.where}/{META_NAME} is {size:,} bytes, more than the {JSON_LIMIT:,} a meta.json "
                             "may have; rerun python -m tokpack.prepare --force")
        raw = folder.read(META_NAME)
    except Missing:
        raise Missing(f"{folder.where}/{META_NAME} is missing: {folder.where} is not a complete prepared folder "
                      f"(prepare writes {META_NAME} last, so one being written is refused too); run python -m "
                      "tokpack.prepare to (re)create it, or wait for the run that writes it") from None
    return parse_meta(raw, f"{folder.where}/{META_NAME}"), raw
