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

from .files import BLOCK_BYTES, InputFile, LocalFile, RemoteFile, as_input, expand, object_version, range_conditions, \
    read_buffer_bytes
from .store import PART_BYTES, Changed, Denied, Missing, Store, StoreError, Unavailable, open_store, retried
from .urls import check_url, is_url, redact, scrub

__all__ = ["BLOCK_BYTES", "PART_BYTES", "Changed", "Denied", "InputFile", "LocalFile", "Missing", "RemoteFile", "Store",
           "StoreError", "Unavailable", "as_input", "check_url", "expand", "is_url", "object_version", "open_store",
           "range_conditions", "read_buffer_bytes", "redact", "retried", "scrub"]
