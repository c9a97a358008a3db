"""The processes of a prepare run, one or torchrun's, joined by a gloo process group, and the
parts of the input they share out.

    torchrun --nnodes=2 --nproc-per-node=8 --node-rank=0 --master-addr=HOST -m tokpack.prepare corpus/ --out-dir D

The input is cut into units, consecutive byte ranges in input order (files whole, uncompressed
``.jsonl`` cut at line starts); under torchrun (``WORLD_SIZE`` > 1) each rank takes a contiguous
range of them. What the ranks exchange is small (counts, hashes, file names, error lines), so
gloo is enough.

See docs/cluster.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from ..cli import USER_ERRORS, error_line
from ..corpus import COMPRESSED, is_jsonl
from ..distributed import Distributed
from ..storage import InputFile


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


# A file of a unit's share: whole (0, None), or of a jsonl file the lines starting in [lo, hi).
Entry = tuple[InputFile, int, "int | None"]


def share_of(files: Sequence[InputFile], sizes: dict[InputFile, int], index: int, count: int) -> list[Entry]:
    """Part ``index`` of ``count`` of the inputs as (file, lo, hi): the documents of the file whose
    first byte lies in [lo, hi), hi None for the rest of it. Parts are consecutive byte ranges of
    the inputs laid end to end; a file that cannot be cut goes to the part owning its first byte."""
    total = sum(sizes[f] for f in files)
    lo, hi = index * total // count, (index + 1) * total // count
    last = index == count - 1
    out: list[Entry] = []
    start = 0
    for f in files:
        end = start + sizes[f]
        if count > 1 and splittable(f) and sizes[f]:
            a, b = max(lo, start), min(hi, end)
            if a < b:
                out.append((f, a - start, b - start))
        elif lo <= start < hi or (last and start >= hi):
            out.append((f, 0, None))
        start = end
    return out


def splittable(path: InputFile) -> bool:
    """Whether a file can be cut at a byte offset: uncompressed jsonl, at line starts."""
    return is_jsonl(path) and path.suffix not in COMPRESSED
