"""Timing for ``python -m tokpack.bench``: best-of runs, and runs that take turns in rounds.

    python -m tokpack.bench loader      # every table there is made of these

Absolute times are noise on a shared machine; ratios of runs interleaved in the same rounds are
the result, since a noisy stretch falls on all of them alike.

See docs/benchmarks.md.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any


def timed(fn: Callable[[], Any], repeat: int = 1) -> tuple[Any, float]:
    """``fn``'s result and its best wall time over ``repeat`` runs (the least disturbed one)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return result, best


def least_cpu_and_wall(fn: Callable[[], Any], repeat: int = 3) -> tuple[float, float]:
    """``fn``'s least CPU seconds (this process, every thread) and least wall seconds over ``repeat`` runs."""
    cpu = wall = float("inf")
    for _ in range(repeat):
        start, started = time.process_time(), time.perf_counter()
        fn()
        cpu, wall = min(cpu, time.process_time() - start), min(wall, time.perf_counter() - started)
    return cpu, wall


def per_second(fn: Callable[[], Any], count: int, repeat: int = 1) -> float:
    """``count`` items over ``fn``'s best wall time."""
    return count / timed(fn, repeat)[1]


def interleaved(runs: dict[str, Callable[[], Any]], rounds: int, warmup: bool = False) -> dict[str, list[float]]:
    """Each run's wall times over ``rounds`` rounds, the runs taking turns within a round; with
    ``warmup``, after one untimed round (runs of milliseconds, whose first round pays for caches
    and allocations the others find ready)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for fn in runs.values() if warmup else ():
        fn()
    for _ in range(rounds):
        for name, fn in runs.items():
            times[name].append(timed(fn)[1])
    return times


def ratio(times: dict[str, list[float]], ours: str, other: str) -> float:
    """Median over rounds of other's time / ours: above 1, ours is faster."""
    return statistics.median(o / t for t, o in zip(times[ours], times[other]))


def ratio_range(times: dict[str, list[float]], ours: str, other: str, inverse: bool = False) -> str:
    """The lowest and highest round's ``ratio`` (or its inverse), so a noisy run shows."""
    rounds = [o / t for t, o in zip(times[ours], times[other])]
    if inverse:
        rounds = [1 / r for r in rounds]
    return f"{min(rounds):.2f}-{max(rounds):.2f}"


def machine() -> dict[str, Any]:
    """The cores this process may use and the load average: a loaded machine makes noisy figures."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cores": cores, "load_average": [round(x, 2) for x in os.getloadavg()]}
