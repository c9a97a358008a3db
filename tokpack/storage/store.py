"""A store fsspec reaches, opened once with the user's options, and its requests retried: a
transient failure with backoff, a permanent one at once, as one line naming the URL and the fix."""

from __future__ import annotations

import functools
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from .urls import check_url, redact, scrub

RETRIES = 6  # attempts at one request, the first included (storage option "retries")
BACKOFF_S = 0.2  # doubled after each failed attempt, up to MAX_BACKOFF_S
MAX_BACKOFF_S = 5.0
TIMEOUT_S = 60.0  # a connection or a read that waits longer is retried


class Changed(Exception):
    """An object read in ranges is no longer the version it was listed as."""



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


# A response to a conditional request must carry the validator the request named: a server that
# ignores If-Match (or If-Unmodified-Since) would otherwise splice another version's bytes in.
_CONDITIONS = (("If-Match", "ETag"), ("If-Unmodified-Since", "Last-Modified"))


async def _check_validators(session: Any, context: Any, params: Any) -> None:
    if params.response.status not in (200, 206):
        return
    for condition, validator in _CONDITIONS:
        pinned, answered = params.headers.get(condition), params.response.headers.get(validator)
        if pinned is not None and answered is not None and answered != pinned:
            params.response.release()
            raise Changed(f"{validator} {answered} where {pinned} was listed")


@functools.cache
def _validators_trace() -> Any:
    """One aiohttp trace for every web filesystem (fsspec keys its instances by their options)."""
    import aiohttp

    trace = aiohttp.TraceConfig()
    trace.on_request_end.append(_check_validators)
    trace.freeze()
    return trace


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
    if protocol in ("http", "https"):
        import aiohttp

        client = dict(options.get("client_kwargs", {}))
        client.setdefault("timeout", aiohttp.ClientTimeout(sock_connect=timeout, sock_read=timeout))
        client["trace_configs"] = [*client.get("trace_configs", ()), _validators_trace()]
        options["client_kwargs"] = client
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
    scheme = raw.partition("://")[0]
    if scheme not in fsspec.available_protocols():
        raise ValueError(f"{redact(raw)} names a {scheme}:// store, which no installed fsspec library reads; pass "
                         "an s3://, gs://, http(s)://, hf:// URL or a local path")
    library, attempts = _library_options(scheme, options or {})
    try:
        fs, path = fsspec.core.url_to_fs(raw, **library)
    except OSError as exc:  # a store that connects as it opens (ftp, sftp): its host unknown or closed
        raise ValueError(scrub(f"{redact(raw)} cannot be reached ({exc.strerror or exc}); check the URL's host and "
                               "port, and the network")) from None
    except ImportError as exc:  # the protocol's own library (s3fs, gcsfs, huggingface_hub, aiohttp)
        raise ValueError(f'reading {redact(raw)} needs {exc.name or "its fsspec library"}; pip install '
                         '"tokpack[remote]"') from None
    except (ValueError, TypeError) as exc:
        raise ValueError(scrub(f"{redact(raw)} cannot be opened with these storage options ({exc}); fix "
                               "--storage-options")) from None
    fs.invalidate_cache()
    return Store(fs, path.rstrip("/"), attempts, redact(raw).rstrip("/"), raw.partition("://")[0])
