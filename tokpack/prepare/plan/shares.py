"""Shares of the input: the run's units are consecutive byte ranges of the inputs laid end to end
(files whole, uncompressed ``.jsonl`` cut at line starts), so the units' outputs, concatenated,
are one process's, byte for byte.

See docs/cluster.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ...corpus import COMPRESSED, is_jsonl
from ...storage import InputFile


class Share(NamedTuple):
    """A file of a unit's share: whole (``lo`` 0, ``hi`` None), or of a jsonl file the lines
    starting in [lo, hi)."""

    file: InputFile
    lo: int
    hi: int | None


def share_of(files: Sequence[InputFile], sizes: dict[InputFile, int], index: int, count: int) -> list[Share]:
    """Part ``index`` of ``count`` of the inputs as (file, lo, hi): the documents of the file whose
    first byte lies in [lo, hi), hi None for the rest of it. Parts are consecutive byte ranges of
    the inputs laid end to end; a file that cannot be cut goes to the part owning its first byte."""
    total = sum(sizes[f] for f in files)
    lo, hi = index * total // count, (index + 1) * total // count
    last = index == count - 1
    out: list[Share] = []
    start = 0
    for f in files:
        end = start + sizes[f]
        if count > 1 and splittable(f) and sizes[f]:
            a, b = max(lo, start), min(hi, end)
            if a < b:
                out.append(Share(f, a - start, b - start))
        elif lo <= start < hi or (last and start >= hi):
            out.append(Share(f, 0, None))
        start = end
    return out


def splittable(path: InputFile) -> bool:
    """Whether a file can be cut at a byte offset: uncompressed jsonl, at line starts."""
    return is_jsonl(path) and path.suffix not in COMPRESSED
