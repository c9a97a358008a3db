"""The packing arithmetic of ``PackedDocuments``: rows from document lengths alone, no token read.

    python -m tokpack.bench resume      # resuming a row stream at batch 10^3, 10^5 and 10^7

A segment is (document, first token within its BOS-led tokens, tokens, leading targets to mask);
document -1 is evaluation padding; a row is a tuple of segments that tile its T + 1 tokens.
Training rows come from one rank's endless document stream, and their packer has a state at every
row boundary (``PackerState``: rows made, documents taken, best fit's buffer) from which it goes
on exactly as it would have, in O(buffer_size): a resume at any step costs the same.

See docs/packing.md.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

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




class Runs:
    """Consecutive runs of stored documents that make one rank's epoch: each run's first document
    and size, and where each ends in the epoch's positions."""

    def __init__(self, firsts: np.ndarray, counts: np.ndarray):
        self.firsts, self.counts = firsts, counts.astype(np.int64)
        self.ends = np.cumsum(self.counts)
        self.share = int(self.ends[-1]) if len(self.ends) else 0

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The run of each epoch position, and the position within it."""
        run = np.searchsorted(self.ends, positions, side="right")
        return run, positions - self.ends[run] + self.counts[run]


class Stream(NamedTuple):
    """One rank's row stream of a packing: rows are a pure function of it and the document lengths."""

    seed: int
    rank: int
    world_size: int
    shuffle: bool


def file_room(files: np.ndarray, lengths: np.ndarray, cap: float) -> int:
    """The most tokens rows can take from one token file's documents, each cut to ``cap``: a step
    that needs more is dropped at every file's end (``shard_end="drop"``). O(documents)."""
    return int(np.bincount(files, weights=np.minimum(lengths, cap)).max(initial=0))


@dataclass(frozen=True)
class Order:
    """Which documents one rank's packer takes, in what order, and how many at a time.

    ``ranks``: ``"documents"``, each rank every world_size-th document of the epoch's order (a
    seeded shuffle, or the stored order), equal shares; ``"rows"``, one stream for all ranks packed
    into steps of world_size rows, rank r taking the r-th row of each (modded-nanogpt's layout);
    ``"groups"``, each rank the row groups r, r + world_size, ... of every input parquet file, in
    stored order (nanochat's); ``"cursor"``, the stored order round and round, document i of the
    endless sequence to rank i mod world_size (nanochat's SFT cursor). ``refill``: the documents
    best fit adds at a time when its buffer
    runs short (nanochat: 128, its tokenizer batch); a batch never crosses a row group.
    ``groups``: for "groups", each input file's row group sizes in documents, in the split's order.
    ``files``: with ``drop``, the token file of each document: a step that would take a document
    of a later file than its first is dropped, and the next starts at that document (modded's rule
    at a shard's end).
    """

    ranks: str = "documents"
    refill: int = 1
    groups: tuple[tuple[int, ...], ...] = ()
    files: np.ndarray | None = field(default=None, compare=False)

    def ranges(self, n: int, stream: Stream) -> Runs:
        """The runs of one epoch a rank takes in stored order: its row groups ("groups"), else one
        run of its whole share, whose documents ``documents_at`` places. O(row groups)."""
        _, rank, world, _ = stream
        if self.ranks != "groups":
            return Runs(np.zeros(1, dtype=np.int64), np.array([n if self.ranks in ("rows", "cursor") else n // world]))
        firsts, counts, at = [], [], 0
        for sizes in self.groups:
            offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
            firsts.append(at + offsets[rank:-1:world])
            counts.append(np.asarray(sizes, dtype=np.int64)[rank::world])
            at += int(offsets[-1])
        return Runs(np.concatenate([np.zeros(0, np.int64), *firsts]), np.concatenate([np.zeros(0, np.int64), *counts]))

    def documents_at(self, n: int, positions: np.ndarray, stream: Stream, epoch: int,
                     runs: Runs) -> np.ndarray:
        """The documents at ``positions`` of a rank's ``epoch``."""
        seed, rank, world, shuffle = stream
        if self.ranks == "groups":
            run, within = runs.locate(positions)
            return runs.firsts[run] + within
        if self.ranks == "cursor":  # a rank's epoch is n of its places, wherever they fall in the split
            return ((epoch * n + positions) * world + rank) % n
        if self.ranks == "rows":
            rank, world = 0, 1
        places = positions.astype(np.uint64) * np.uint64(world) + np.uint64(rank)
        return Shuffle(n, "packing", seed, epoch)(places) if shuffle else places.astype(np.int64)

    def breaks(self, positions: np.ndarray, runs: Runs) -> np.ndarray:
        """Whether each epoch position starts a refill batch: at every run's start, then every ``refill``."""
        return runs.locate(positions)[1] % self.refill == 0

    def _chunks(self, lengths: np.ndarray, stream: Stream,
                start: int) -> Iterator[tuple[np.ndarray, np.ndarray, bool]]:
        """A rank's endless stream from its ``start``-th document as (positions in the epoch,
        documents, last chunk of an epoch), a chunk at a time."""
        runs = self.ranges(len(lengths), stream)
        share = runs.share
        first_epoch, skip = divmod(start, share)
        for epoch in itertools.count(first_epoch):
            for lo in range(skip if epoch == first_epoch else 0, share, CHUNK):
                positions = np.arange(lo, min(lo + CHUNK, share))
                yield positions, self.documents_at(len(lengths), positions, stream, epoch, runs), lo + CHUNK >= share

    def pairs(self, lengths: np.ndarray, stream: Stream,
              start: int = 0) -> Iterator[tuple[int, int]]:
        """A rank's endless (document, length) stream from its ``start``-th document."""
        for _, docs, _ in self._chunks(lengths, stream, start):
            yield from zip(docs.tolist(), lengths[docs].tolist())

    def batches(self, lengths: np.ndarray, stream: Stream,
                start: int = 0) -> Iterator[list[tuple[int, int]]]:
        """The same stream in refill batches (from a ``start`` that begins one)."""
        runs = self.ranges(len(lengths), stream)
        batch: list[tuple[int, int]] = []
        for positions, docs, last in self._chunks(lengths, stream, start):
            for doc, n, first in zip(docs.tolist(), lengths[docs].tolist(), self.breaks(positions, runs).tolist()):
                if first and batch:
                    yield batch
                    batch = []
                batch.append((doc, n))
            if last:
                yield batch
                batch = []

    def check_world(self, n: int, world: int) -> None:
        """Refuse a world size under which some rank would take no document."""
        if self.ranks == "documents" and n < world:
            raise ValueError(f"{n} documents cannot be shared by {world} ranks; use more data")
        if self.ranks == "groups" and not any(len(sizes) >= world for sizes in self.groups):
            most = max(map(len, self.groups))
            raise ValueError(f"ranks='groups' gives each of {world} ranks whole parquet row groups, and no input file "
                             f"has more than {most}; use {most} ranks or fewer, or ranks='documents'")


def buffer_key(doc: int, length: int, arrival: int, max_doc_len: int | None) -> int:
    """Best fit's buffer entry for ``doc`` of ``length`` tokens, the ``arrival``-th of its stream."""
    cap = length if max_doc_len is None else min(length, max_doc_len)
    return cap << 2 * _FIELD | (_MASK - arrival) << _FIELD | doc


def buffer_entries(buffer: list[int]) -> list[list[int]]:
    """[arrival, document] of each buffer entry: what a saved state holds (its lengths are the corpus's)."""
    return [[_MASK - (key >> _FIELD & _MASK), key & _MASK] for key in buffer]


@dataclass(frozen=True)
class Packer:
    """What training rows depend on beside the stream: ``packing`` ("aligned" or "bestfit"), the
    row's ``capacity`` (T + 1), ``max_doc_len``, best fit's ``buffer_size`` and the ``order``."""

    packing: str
    capacity: int
    max_doc_len: int | None
    buffer_size: int
    order: Order = Order()
    # bestfit-pad: documents never taken (longer than a row with long_documents="drop", or cropped
    # to a row they would keep nothing to train on)
    skip: frozenset[int] = frozenset()


class TrainingRows:
    """One rank's endless training rows, from ``state`` on.

    aligned: documents in order, each cut to ``max_doc_len``; the one reaching a row's end is cut
    there (its rest dropped). bestfit: from a buffer refilled to at least ``buffer_size`` documents
    before every choice, the longest that fits whole (the earliest among equals); when none fits,
    the shortest is cropped to fill the row. bestfit-pad: the same, but when none fits the row is
    padded (a segment of document -1, every target masked); a document longer than a row is
    cropped to it, or left out (``skip``). O(log buffer_size) a choice, O(buffer_size) memory.
    With ranks="rows" every rank packs each step's rows and keeps its own: O(world_size) the cost.
    """

    def __init__(self, lengths: np.ndarray, stream: Stream, packer: Packer,
                 state: PackerState | None = None):
        start = state or PackerState()
        self.buffer = list(start.buffer)  # its own: the state it started from stays as it was
        self.row, self.taken = start.row, start.taken
        order = packer.order
        seed, rank, world, shuffle = stream
        cap = math.inf if packer.max_doc_len is None else packer.max_doc_len
        step = world if order.ranks == "rows" else 1
        if order.files is not None and step * packer.capacity > file_room(order.files, lengths, cap):
            raise ValueError(f"shard_end='drop' needs a step of {step} rows of {packer.capacity} tokens inside one "
                             f"token file, and the largest holds {file_room(order.files, lengths, cap):,}: no step "
                             "would ever be served; use fewer ranks, a smaller block_size, or shard_end='continue'")
        if packer.packing == "aligned":
            steps = self._aligned(order.pairs(lengths, stream, self.taken), packer.capacity, cap, step, order.files)
            self._rows = (rows[rank if step > 1 else 0] for rows in steps)
        else:
            # One document at a time unless the refills come in batches: the common case stays lean.
            single = order.refill == 1 and order.ranks != "groups"
            source = order.pairs(lengths, stream, self.taken) if single else order.batches(lengths, stream, self.taken)
            pad = packer.packing == "bestfit-pad"
            rows = self._bestfit(source, single, packer.capacity, cap, packer.buffer_size, pad, packer.skip)
            self._rows = rows if step == 1 else self._rank_of_steps(rows, step, rank)

    def __iter__(self) -> Iterator[Row]:
        return self

    def __next__(self) -> Row:
        row = next(self._rows)
        self.row += 1
        return row

    def position(self) -> PackerState:
        """The state at the current row boundary (after the last row handed out)."""
        return PackerState(self.row, self.taken, list(self.buffer))

    @staticmethod
    def _rank_of_steps(rows: Iterator[Row], step: int, rank: int) -> Iterator[Row]:
        """Row ``rank`` of each step of ``step`` rows, each step packed whole before it is handed out."""
        while True:
            yield [next(rows) for _ in range(step)][rank]

    def _aligned(self, docs: Iterator[tuple[int, int]], capacity: int, cap: float, step: int,
                 files: np.ndarray | None) -> Iterator[list[Row]]:
        rows: list[Row] = []
        row: list[Segment] = []
        room, used, file = capacity, 0, -1
        for doc, n in docs:
            if files is not None:
                if used and files[doc] != file:  # the step would run past its file's end: dropped
                    self.taken += used
                    rows, row, room, used = [], [], capacity, 0
                file = files[doc]
            take = int(min(n, cap, room))
            row.append((doc, 0, take, 0))
            room -= take
            used += 1
            if room == 0:
                rows.append(tuple(row))
                row, room = [], capacity
                if len(rows) == step:
                    self.taken += used
                    yield rows
                    rows, used = [], 0

    def _bestfit(self, source: Iterator[Any], single: bool, capacity: int, cap: float, size: int,
                 pad: bool = False, skip: frozenset[int] = frozenset()) -> Iterator[Row]:
        """Best fit over ``source``: (document, length) pairs when ``single``, else refill batches of
        them; with ``pad``, a row nothing fits is padded; a document in ``skip`` is left out."""
        buffer, taken = self.buffer, self.taken
        insort, bisect_right = bisect.insort, bisect.bisect_right
        row: list[Segment] = []
        pos = 0
        while True:
            while len(buffer) < size:
                for doc, n in source if single else next(source):
                    if doc not in skip:
                        insort(buffer, (n if n < cap else cap) << 2 * _FIELD | (_MASK - taken) << _FIELD | doc)
                    taken += 1
                    if single and len(buffer) >= size:
                        break
            room = capacity - pos
            # The last entry of a length is its earliest arrival, so these pick the first-come among equals.
            fits = bisect_right(buffer, room << 2 * _FIELD | _LOW) - 1
            if fits < 0 and pad:
                row.append((-1, 0, room, room))
                self.taken = taken
                yield tuple(row)
                row, pos = [], 0
                continue
            key = buffer.pop(fits if fits >= 0 else bisect_right(buffer, buffer[0] | _LOW) - 1)
            n = key >> 2 * _FIELD
            take = n if n < room else room
            row.append((key & _MASK, 0, take, 0))
            pos += take
            if pos == capacity:
                self.taken = taken
                yield tuple(row)
                row, pos = [], 0


def check_state(state: PackerState, lengths: np.ndarray, stream: Stream, packer: Packer) -> None:
    """Refuse a state this stream could not have reached, in O(buffer_size): every buffer entry must be
    the document the stream holds at its arrival, with its length, not yet placed, sorted; the
    rows made and documents taken must agree (each row holds 1 to ``capacity`` documents), and
    the documents taken must end a refill batch."""
    order, buffer = packer.order, state.buffer
    runs = order.ranges(len(lengths), stream)
    share = runs.share
    if not 0 <= state.taken <= MAX_TAKEN or not 0 <= state.row <= 2**62:
        raise ValueError(f"a packing state at row {state.row} with {state.taken} documents taken is out of range")
    placed = state.taken - len(buffer)
    # The stream never ends, so best fit's buffer is short of full by one at most after its refill
    # (bestfit-pad's is full after a padded row).
    padded = packer.packing == "bestfit-pad"
    low, high = ((0, 0) if packer.packing == "aligned" or state.row == 0 else
                 (packer.buffer_size - 1, packer.buffer_size + order.refill - 2 + padded))
    if not low <= len(buffer) <= high or buffer != sorted(set(buffer)):
        raise ValueError(f"a packing state's buffer holds {len(buffer)} entries where this packing keeps {low} to "
                         f"{high} (sorted and distinct); it is forged or from another packing")
    rows = state.row * (stream.world_size if order.ranks == "rows" else 1)
    most = math.inf if order.files is not None else rows * packer.capacity
    if not rows <= placed <= most:
        raise ValueError(f"a packing state claims {state.row} rows from {placed} placed documents, which no packing "
                         f"makes (each row holds 1 to {packer.capacity}); it is forged or from another stream")
    if not order.breaks(np.array([state.taken % share]), runs)[0]:
        raise ValueError(f"a packing state took {state.taken} documents, which does not end a refill batch of "
                         f"{order.refill}; it is forged or from another stream")
    entries = np.array(buffer_entries(buffer), dtype=np.int64).reshape(-1, 2)  # [arrival, document]
    arrivals = entries[:, 0]
    if (arrivals >= state.taken).any() or len(np.unique(arrivals)) < len(buffer):
        raise ValueError("a packing state's buffer holds documents that did not arrive where it says")
    for epoch in np.unique(arrivals // share).tolist():
        here = arrivals // share == epoch
        held = order.documents_at(len(lengths), arrivals[here] % share, stream, epoch, runs)
        if not np.array_equal(held, entries[here, 1]) or any(
                key != buffer_key(doc, int(lengths[doc]), arrival, packer.max_doc_len)
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
