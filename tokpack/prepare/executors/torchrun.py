"""The processes of a prepare run under torchrun, joined by a gloo process group: each rank takes a
contiguous range of the run's units.

    torchrun --nnodes=2 --nproc-per-node=8 --node-rank=0 --master-addr=HOST -m tokpack.prepare corpus/ --out-dir D

What the ranks exchange is small (counts, hashes, file names, error lines), so gloo is enough.

See docs/cluster.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from ...cli import USER_ERRORS, error_line
from ...distributed import Distributed
from ...storage import InputFile


class Ranks:
    """This process's place among the run's processes, and the few collectives a run needs."""

    def __init__(self, place: Distributed) -> None:
        self.place, self.rank, self.world = place, place.rank, place.world_size

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def gather(self, obj: Any) -> list[Any]:
        """``obj`` from every rank, in rank order, on every rank."""
        return self.place.all_gather(obj)

    def together(self, fn: Callable[[], Any], leader_only: bool = False) -> None:
        """Run ``fn`` (on the leader alone with ``leader_only``, the others waiting for it); a user
        error on any rank is raised on every rank, so all fail together with its one line, or none.
        On one process ``fn`` just runs."""
        if self.world == 1:
            fn()
            return
        error = None
        if self.leader or not leader_only:
            try:
                fn()
            except USER_ERRORS as exc:
                error = f"rank {self.rank}: {error_line(exc)}"
        failed = [e for e in self.gather(error) if e]
        if failed:
            raise ValueError(failed[0])

    def check_same_inputs(self, files: Sequence[InputFile]) -> None:
        """Refuse, on every rank and before anything is written, a run whose ranks see other inputs
        than rank 0 (a glob that matched more files on one, a node whose copy differs): each rank
        would tokenize its share of its own view. Sizes and mtimes are compared, and rank 0's listing
        is sent only when the hashes of the views differ."""
        if self.world == 1:
            return
        mine = []
        for f in files:
            local = f.local_path()
            mine.append((str(f), f.size(), f.pin() if local is None else local.stat().st_mtime_ns))
        digests = self.gather(hashlib.sha256(repr(mine).encode("utf-8", "surrogateescape")).hexdigest())
        if len(set(digests)) == 1:
            return
        rank = next(r for r, d in enumerate(digests) if d != digests[0])
        listings = self.gather(mine if self.rank in (0, rank) else None)
        reference, other = listings[0], listings[rank]
        raise ValueError(f"rank {rank} sees other inputs than rank 0 ({_first_difference(reference, other)}); "
                         "give every rank the same files: shared storage, or copies made with their mtimes "
                         "(cp -p, rsync -t)")

    def units(self, count: int) -> range:
        """This rank's contiguous range of ``count`` units of work."""
        return range(self.rank * count // self.world, (self.rank + 1) * count // self.world)


def _first_difference(reference: list[tuple[str, int, int]], other: list[tuple[str, int, int]]) -> str:
    for (name, size, mtime), (name2, size2, mtime2) in zip(reference, other):
        if name != name2:
            return f"input {name} on rank 0, {name2} there"
        if size != size2:
            return f"{name} is {size} bytes on rank 0, {size2} there"
        if mtime != mtime2:
            return f"{name} was modified at another time"
    return f"{len(reference)} input files on rank 0, {len(other)} there"
