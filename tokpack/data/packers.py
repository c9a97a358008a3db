"""The packing arithmetic of ``PackedDocuments``: rows from document lengths alone, no token read.

    python -m tokpack.bench resume      # resuming a row stream at batch 10^3, 10^5 and 10^7

A segment is (document, first token within its BOS-led tokens, tokens, leading targets to mask);
document -1 is evaluation padding; a row is a tuple of segments that tile its T + 1 tokens.
Training rows come from one rank's endless document stream, and their packer has a state at every
row boundary (``PackerState``: rows made, documents taken, best fit's buffer) from which it goes
on exactly as it would have, in O(buffer_size): a resume at any step costs the same.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from .permutation import Shuffle
from .samplers import CHUNK

Segment = tuple[int, int, int, int]
Row = tuple[Segment, ...]

# Best fit keeps its buffer as ints, (length, arrival, document) in bit fields: ints compare faster
# than tuples. Arrival counts down, so that among equal lengths the earliest sorts last.
_FIELD = 48
_MASK = (1 << _FIELD) - 1
_LOW = (1 << 2 * _FIELD) - 1  # the arrival and document fields at their largest
MAX_TAKEN = _MASK  # documents a stream can take before the arrival field runs out


@dataclass
class PackerState:
    """Where a training row stream stands at a row boundary: ``row`` rows made, ``taken``
    documents taken from the rank's document stream, and best fit's ``buffer`` (sorted keys)."""

    row: int = 0
    taken: int = 0
    buffer: list[int] = field(default_factory=list)


def per_rank(documents: int, world_size: int) -> int:
    """Documents each rank takes an epoch: equal, disjoint shares."""
    return documents // world_size


def stream_documents(n: int, positions: np.ndarray, seed: int, rank: int, world_size: int, shuffle: bool,
                     epoch: int) -> np.ndarray:
    """The documents at ``positions`` of one rank's share of ``epoch``: positions rank, rank +
    world_size, ... of the epoch's order (a seeded shuffle, or the stored order)."""
    places = positions.astype(np.uint64) * np.uint64(world_size) + np.uint64(rank)
    return Shuffle(n, "packing", seed, epoch)(places) if shuffle else places.astype(np.int64)


def document_stream(lengths: np.ndarray, seed: int, rank: int, world_size: int, shuffle: bool,
                    start: int = 0) -> Iterator[tuple[int, int]]:
    """One rank's endless (document, length) stream from its ``start``-th document: epoch after
    epoch, the rank's share of each epoch's order, trimmed to a multiple of world_size."""
    share = per_rank(len(lengths), world_size)
    first_epoch, skip = divmod(start, share)
    for epoch in itertools.count(first_epoch):
        for lo in range(skip if epoch == first_epoch else 0, share, CHUNK):
            docs = stream_documents(len(lengths), np.arange(lo, min(lo + CHUNK, share)), seed, rank, world_size,
                                    shuffle, epoch)
            yield from zip(docs.tolist(), lengths[docs].tolist())


def buffer_key(doc: int, length: int, arrival: int, max_doc_len: int | None) -> int:
    """Best fit's buffer entry for ``doc`` of ``length`` tokens, the ``arrival``-th of its stream."""
    cap = length if max_doc_len is None else min(length, max_doc_len)
    return cap << 2 * _FIELD | (_MASK - arrival) << _FIELD | doc


def buffer_entries(buffer: list[int]) -> list[list[int]]:
    """[arrival, document] of each buffer entry: what a saved state holds (its lengths are the corpus's)."""
    return [[_MASK - (key >> _FIELD & _MASK), key & _MASK] for key in buffer]


class TrainingRows:
    """One rank's endless training rows, ``packing`` "aligned" or "bestfit", from ``state`` on.

    aligned: documents in order, each cut to ``max_doc_len``; the one reaching a row's end is cut
    there (its rest dropped). bestfit: from a buffer refilled to ``buffer_size`` documents before
    every choice, the longest that fits whole (the earliest among equals); when none fits, the
    shortest is cropped to fill the row. O(log buffer_size) a choice, O(buffer_size) memory.
    """

    def __init__(self, lengths: np.ndarray, stream: tuple[int, int, int, bool], packing: str, capacity: int,
                 max_doc_len: int | None, buffer_size: int, state: PackerState | None = None):
        start = state or PackerState()
        self.buffer = list(start.buffer)  # its own: the state it started from stays as it was
        self.row, self.taken = start.row, start.taken
        docs = document_stream(lengths, *stream, start=self.taken)
        cap = math.inf if max_doc_len is None else max_doc_len
        self._rows = (self._aligned(docs, capacity, cap) if packing == "aligned" else
                      self._bestfit(docs, capacity, cap, buffer_size))

    def __iter__(self) -> Iterator[Row]:
        return self

    def __next__(self) -> Row:
        return next(self._rows)

    def position(self) -> PackerState:
        """The state at the current row boundary (after the last row handed out)."""
        return PackerState(self.row, self.taken, list(self.buffer))

    def _aligned(self, docs: Iterator[tuple[int, int]], capacity: int, cap: float) -> Iterator[Row]:
        row: list[Segment] = []
        room = capacity
        for doc, n in docs:
            take = int(min(n, cap, room))
            row.append((doc, 0, take, 0))
            room -= take
            if room == 0:
                self.taken += len(row)
                self.row += 1
                yield tuple(row)
                row, room = [], capacity

    def _bestfit(self, docs: Iterator[tuple[int, int]], capacity: int, cap: float, size: int) -> Iterator[Row]:
        buffer, taken = self.buffer, self.taken
        insort, bisect_right = bisect.insort, bisect.bisect_right
        row: list[Segment] = []
        pos = 0
        while True:
            if len(buffer) < size:
                for doc, n in docs:
                    insort(buffer, (n if n < cap else cap) << 2 * _FIELD | (_MASK - taken) << _FIELD | doc)
                    taken += 1
                    if len(buffer) >= size:
                        break
            if not buffer:
                return
            room = capacity - pos
            # The last entry of a length is its earliest arrival, so these pick the first-come among equals.
            fits = bisect_right(buffer, room << 2 * _FIELD | _LOW) - 1
            key = buffer.pop(fits if fits >= 0 else bisect_right(buffer, buffer[0] | _LOW) - 1)
            n = key >> 2 * _FIELD
            take = n if n < room else room
            row.append((key & _MASK, 0, take, 0))
            pos += take
            if pos == capacity:
                self.taken = taken
                self.row += 1
                yield tuple(row)
                row, pos = [], 0


def check_state(state: PackerState, lengths: np.ndarray, stream: tuple[int, int, int, bool], packing: str,
                capacity: int, max_doc_len: int | None, buffer_size: int) -> None:
    """Refuse a state this stream could not have reached, in O(buffer_size): every buffer entry must be
    the document the stream holds at its arrival, with its length, not yet placed, sorted; the
    rows made and documents taken must agree (each row holds 1 to ``capacity`` documents)."""
    seed, rank, world_size, shuffle = stream
    buffer, share = state.buffer, per_rank(len(lengths), world_size)
    if not 0 <= state.taken <= MAX_TAKEN or not 0 <= state.row <= 2**62:
        raise ValueError(f"a packing state at row {state.row} with {state.taken} documents taken is out of range")
    placed = state.taken - len(buffer)
    # The stream never ends, so best fit's buffer is one short of full at every row boundary.
    kept = 0 if packing == "aligned" or state.row == 0 else buffer_size - 1
    if len(buffer) != kept or buffer != sorted(set(buffer)):
        raise ValueError(f"a packing state's buffer holds {len(buffer)} entries where this packing keeps {kept} "
                         "(sorted and distinct); it is forged or from another packing")
    if not state.row <= placed <= state.row * capacity:
        raise ValueError(f"a packing state claims {state.row} rows from {placed} placed documents, which no packing "
                         f"makes (each row holds 1 to {capacity}); it is forged or from another stream")
    entries = np.array(buffer_entries(buffer), dtype=np.int64).reshape(-1, 2)  # [arrival, document]
    arrivals = entries[:, 0]
    if (arrivals >= state.taken).any() or len(np.unique(arrivals)) < len(buffer):
        raise ValueError("a packing state's buffer holds documents that did not arrive where it says")
    for epoch in np.unique(arrivals // share).tolist():
        here = arrivals // share == epoch
        held = stream_documents(len(lengths), arrivals[here] % share, seed, rank, world_size, shuffle, epoch)
        if not np.array_equal(held, entries[here, 1]) or any(
                key != buffer_key(doc, int(lengths[doc]), arrival, max_doc_len)
                for key, (arrival, doc) in zip(np.array(buffer, dtype=object)[here].tolist(), entries[here].tolist())):
            raise ValueError("a packing state's buffer holds a document the stream does not hold at that "
                             "place; it is forged or from another corpus")


def evaluation_rows(docs: Iterator[tuple[int, int]], capacity: int, stride: int) -> Iterator[Row]:
    """Every document's targets once: a document of up to ``capacity`` tokens whole, a longer one as
    windows of ``capacity`` tokens at ``stride`` (each later window's first capacity - 1 - stride
    targets masked, an earlier window scored them), placed in order; a piece that does not fit
    the row's space starts the next row, and the space left is padding (document -1, all masked)."""
    overlap = capacity - 1 - stride
    row: list[Segment] = []
    pos = 0
    for doc, n in docs:
        start = 0
        while n >= 2:  # a lone BOS has no target
            take = min(capacity, n - start)
            if pos + take > capacity:
                row.append((-1, 0, capacity - pos, capacity - pos))
                yield tuple(row)
                row, pos = [], 0
            row.append((doc, start, take, overlap if start else 0))
            pos += take
            if pos == capacity:
                yield tuple(row)
                row, pos = [], 0
            if start + capacity >= n:
                break
            start += stride
    if row:
        row.append((-1, 0, capacity - pos, capacity - pos))
        yield tuple(row)


def in_order(lengths: np.ndarray) -> Iterator[tuple[int, int]]:
    """(document, length) of every document, in stored order."""
    for lo in range(0, len(lengths), CHUNK):
        yield from zip(range(lo, lo + CHUNK), lengths[lo:lo + CHUNK].tolist())
