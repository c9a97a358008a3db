"""What a process that prepares sets and measures of itself: glibc's mmap threshold, kept at its
default so that its peak memory stays flat, and that peak. Every process of a run uses them: the
command's, each of ``--processes``' tasks, the benches' children.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import resource
from collections.abc import Iterator
from contextlib import contextmanager


M_MMAP_THRESHOLD = -3  # mallopt's parameter number, from glibc's malloc.h
_FIXED = 128 * 1024
_fixed = False  # whether this process fixed the threshold (the command does)


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB."""
    # VmHWM starts afresh at exec; ru_maxrss would count the memory of the process that forked us.
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def children_peak_rss_mb() -> float:
    """The largest peak resident memory of the child processes this one has waited for, in MB."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def fix_mmap_threshold() -> None:
    """Keep glibc's mmap threshold at its 128 KiB default for the rest of the process.

    glibc raises the threshold whenever a large block is freed; from then on the pieces of text
    and the token arrays (a few MB each, every size) are carved from the heap arenas of the worker
    threads, where they fragment, and peak memory grew with the input (+20 MB at 300 MB of one
    document). With the threshold fixed, each large block is mapped and goes back when freed, so
    the peak stays flat. The ``tokpack.prepare`` command calls it; ``prepare()`` does not, since
    it would also make every later large allocation of the caller's process (a training loop's
    tensors) a fresh mapping: call it yourself in a process that only prepares. Elsewhere than
    glibc this does nothing.
    """
    global _fixed
    _fixed = _mallopt(_FIXED) or _fixed


@contextmanager
def roomy_heap() -> Iterator[None]:
    """Blocks up to 32 MB from the heap for a while, where the threshold is fixed: a guarded run's
    signing makes numpy temporaries of a few MB by the thousand, and mapping each afresh (and
    faulting it in page by page) made signing 2-3x slower. After, the fixed threshold is back and
    the heap's free memory is given back (malloc_trim), so the peak stays flat."""
    if not _fixed:
        yield
        return
    _mallopt(32 << 20)
    try:
        yield
    finally:
        _mallopt(_FIXED)
        _libc().malloc_trim(0)  # what the heap holds freed goes back


def _mallopt(threshold: int) -> bool:
    try:
        return bool(_libc().mallopt(M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):
        return False


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")  # find_library runs ldconfig: once
