"""A folder in object storage behind tokpack's folder verbs: ``s3://bucket/prefix``, ``gs://``,
``https://``, ``hf://``, any store fsspec reaches (``tokpack[remote]``).

    from tokpack.storage.folder import as_folder
    folder = as_folder("s3://bucket/edu", {"endpoint_url": "http://localhost:9000"})
    with folder.open("train.bin") as f: ...     # ranges, retried, pinned to one version

Every request is retried on a transient failure and fails at once, typed, on a permanent one
(``Missing``, ``Denied``, ``Unavailable``: ``tokpack.storage``); messages name the object without
credentials. See docs/loading.md (reading) and docs/prepare.md (publishing).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, BinaryIO

from ..format import plain_name
from . import Missing, RemoteFile, Store, object_version, open_store, range_conditions
from .local import replacing


class RemoteFolder:
    """A folder under a store's URL: every name a plain file name below it.

    Args:
        url: the folder's URL.
        storage_options: the store's options, as for remote inputs (``--storage-options``).
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None):
        self.url, self.storage_options = url, storage_options
        self.store: Store = open_store(url, storage_options)
        self.where = self.store.where

    def _key(self, name: str) -> str:
        return self.store.key(plain_name(name, self.where))

    def read(self, name: str, start: int = 0, end: int | None = None) -> bytes:
        key, fs = self._key(name), self.store.fs
        return self.store.call(name, lambda: fs.cat_file(key, start=start or None, end=end))

    def open(self, name: str) -> BinaryIO:
        """``name`` read in ranges of the version it has now, each retried where it failed."""
        key, fs = self._key(name), self.store.fs
        info = self.store.call(name, lambda: fs.info(key))
        web = self.store.protocol in ("http", "https")
        return RemoteFile(fs, key, f"{self.url.rstrip('/')}/{name}", int(info["size"]), object_version(info),
                          self.store.attempts, range_conditions(info) if web else None).open_stream()

    def size(self, name: str) -> int:
        key, fs = self._key(name), self.store.fs
        return int(self.store.call(name, lambda: fs.info(key))["size"])

    def names(self) -> list[str]:
        root, fs = self.store.path, self.store.fs
        return sorted(found[len(root) + 1:] for found in self.store.call("", lambda: fs.find(root)))

    def write(self, name: str, data: bytes) -> None:
        key, fs = self._key(name), self.store.fs
        self.store.call(name, lambda: fs.pipe_file(key, data))

    def create(self, name: str, data: bytes) -> bool:
        """Write ``name`` only if it is not there (``If-None-Match: *`` on S3 and the stores that
        honour it; elsewhere it is written, then read back: the race narrows but stays open)."""
        key, fs = self._key(name), self.store.fs
        try:
            fs.pipe_file(key, data, mode="create")
        except Exception:  # each store's own type for "it exists"; reading it back tells
            pass
        try:
            return self.read(name) == data
        except Missing:
            return False

    def put(self, local: Path, name: str) -> None:
        self.store.put(local, plain_name(name, self.where))

    def get(self, name: str, local: Path) -> None:
        with self.open(name) as src, replacing(local) as out:
            shutil.copyfileobj(src, out, 1 << 20)

    def remove(self, name: str) -> None:
        key, fs = self._key(name), self.store.fs
        try:
            self.store.call(name, lambda: fs.rm_file(key))
        except Missing:
            pass

    def __repr__(self) -> str:
        return f"RemoteFolder({self.where})"
