"""Packed documents: rows that start at a document start, with the document structure alongside.

    from tokpack import PackedDocuments, build_loader
    train = PackedDocuments("data/sample", 256, split="train", packing="bestfit")
    x, y, position_ids, cu_seqlens, max_seqlen = next(iter(build_loader(train, 8, seed=1337)))
    val = PackedDocuments("data/sample", 256, split="val", stride=128)   # every target once, per document

A row is T + 1 tokens (x = row[:-1], y = row[1:]) made of segments, each the head of one document
(or with ``split_long`` one piece of it) led by the encoding's end-of-text token as BOS (already
there with ``--eot prepend``, inserted otherwise). The packings:

- ``"aligned"``: documents in order, each cut to ``max_doc_len`` tokens, concatenated; the document
  that reaches a row's end is cut there and the next row starts at the next document.
- ``"bestfit"``: from a buffer of ``buffer_size`` documents, the longest that fits the row's space,
  again and again; when none fits, the shortest is cropped to fill the row. No padding.
- ``stride=S`` (evaluation): every document whole, a document longer than T + 1 as windows at
  stride S within it (targets an earlier window scored masked), packed in order and padded, so
  that with a document mask every target is scored exactly once, as if each document were scored
  alone.

Packing is a pure function of (seed, rank, position) over the document lengths alone. The sampler
hands out batches by their place in the row stream; the dataset packs them where it reads them
(in each worker) and sends stored-width tokens and position ids with the segment starts; the
training process only widens them. Resume replays the packing arithmetic up to the position
(O(documents before it), no token read); the packing holds O(buffer_size) at any corpus size,
beside the document index. A batch's structure costs O(B * T).
"""

from __future__ import annotations

import bisect
import copy
import itertools
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset

from ..format import LLMC_DOCUMENT_START
from ..split import Split, open_split
from .documents import DocumentIndex
from .permutation import Shuffle
from .runtime import to_device
from .samplers import CHUNK, Batch, ResumableBatchSampler
from .windows import IGNORE_INDEX, _whole

PACKINGS = ("aligned", "bestfit")
FORMS = ("rows", "flat", "hf")

# A segment: (document, first token within its BOS-led tokens, tokens, leading targets to mask).
# Document -1 is evaluation padding. A row is a tuple of segments that tile its T + 1 tokens.
Segment = tuple[int, int, int, int]
Row = tuple[Segment, ...]


def aligned_rows(docs: Iterator[tuple[int, int]], capacity: int, max_doc_len: int) -> Iterator[Row]:
    """Rows of ``capacity`` tokens from (document, length) pairs in order, each document cut to
    ``max_doc_len``, the one reaching a row's end cut there (the rest of it is dropped)."""
    row: list[Segment] = []
    room = capacity
    for doc, n in docs:
        take = min(n, max_doc_len, room)
        row.append((doc, 0, take, 0))
        room -= take
        if room == 0:
            yield tuple(row)
            row, room = [], capacity


def bestfit_rows(docs: Iterator[tuple[int, int]], capacity: int, buffer_size: int,
                 max_doc_len: int | None = None) -> Iterator[Row]:
    """Rows of ``capacity`` tokens by best fit over a buffer refilled to ``buffer_size`` documents
    before every choice: the longest document that fits whole, again and again; when none fits,
    the shortest is cropped to fill the row (its rest is dropped). Ties go to the document that
    entered the buffer first. O(log buffer_size) a choice, O(buffer_size) memory.
    """
    # Each entry one int, (length, earliest first, document) in bit fields: ints compare faster than tuples.
    buffer: list[int] = []
    insort, bisect_right = bisect.insort, bisect.bisect_right
    cap = math.inf if max_doc_len is None else max_doc_len
    docs = iter(docs)
    order = (1 << 48) - 1  # counts down with each arrival
    low = (1 << 96) - 1  # the order and document fields at their largest
    row: list[Segment] = []
    pos = 0
    while True:
        for doc, n in docs:
            insort(buffer, (n if n < cap else cap) << 96 | order << 48 | doc)
            order -= 1
            if len(buffer) >= buffer_size:
                break
        if not buffer:
            return
        room = capacity - pos
        # The last entry of a length is its earliest arrival, so these pick the first-come among equals.
        fits = bisect_right(buffer, room << 96 | low) - 1
        key = buffer.pop(fits if fits >= 0 else bisect_right(buffer, buffer[0] | low) - 1)
        n = key >> 96
        take = n if n < room else room
        row.append((key & 0xFFFFFFFFFFFF, 0, take, 0))
        pos += take
        if pos == capacity:
            yield tuple(row)
            row, pos = [], 0


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


def _in_order(lengths: np.ndarray) -> Iterator[tuple[int, int]]:
    for lo in range(0, len(lengths), CHUNK):
        yield from zip(range(lo, lo + CHUNK), lengths[lo:lo + CHUNK].tolist())


def document_stream(lengths: np.ndarray, seed: int, rank: int, world_size: int,
                    shuffle: bool) -> Iterator[tuple[int, int]]:
    """One rank's endless (document, length) stream: epoch after epoch, the documents at positions
    rank, rank + world_size, ... of the epoch's order (a seeded shuffle per epoch, or the stored
    order), trimmed to a multiple of world_size so that shares are disjoint and equal."""
    n = len(lengths)
    per_rank = n // world_size
    for epoch in itertools.count():
        order = Shuffle(n, "packing", seed, epoch) if shuffle else None
        for lo in range(0, per_rank, CHUNK):
            positions = np.arange(lo, min(lo + CHUNK, per_rank), dtype=np.uint64) * np.uint64(world_size)
            positions += np.uint64(rank)
            docs = order(positions) if order is not None else positions.astype(np.int64)
            yield from zip(docs.tolist(), lengths[docs].tolist())


class PackedBatch(NamedTuple):
    """Packed rows with their documents: x, y and position_ids (B, T) int64 (-100 in y where a target
    is masked); ``cu_seqlens`` (int32) the segment boundaries over the flattened B * T tokens, as
    flash-attention's variable-length functions and FlexAttention document masks take them, and
    ``max_seqlen`` the longest segment. The flat form is the same with B * T as one (1, N) row."""

    x: torch.Tensor
    y: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int


class PackedRows(NamedTuple):
    """Rows as stored (uint16 or uint32, B x (T + 1)) with their position ids in as narrow a type and
    their segment starts: what a worker sends, under twice the bytes of plain windows. ``widen()``
    makes the int64 batch in the training process, which does no more than widen."""

    tokens: np.ndarray
    positions: np.ndarray  # uint16 or uint32, B * T
    cu_seqlens: np.ndarray  # int32, segment starts over the flattened B * T tokens, then B * T
    masked: np.ndarray  # flat positions of y set to -100
    max_seqlen: int
    form: str
    max_docs: int | None

    def widen(self) -> PackedBatch | dict[str, torch.Tensor]:
        B, width = self.tokens.shape
        T = width - 1
        x, y = self.tokens[:, :-1].astype(np.int64).reshape(-1), self.tokens[:, 1:].astype(np.int64).reshape(-1)
        if len(self.masked):
            y[self.masked] = IGNORE_INDEX
        cu_seqlens, position_ids = self.cu_seqlens, self.positions.astype(np.int64)
        if self.form == "hf":
            labels = x.copy()
            labels[1:][y[:-1] == IGNORE_INDEX] = IGNORE_INDEX
            labels[cu_seqlens[:-1]] = IGNORE_INDEX  # as DataCollatorWithFlattening: no target across a boundary
            return {name: torch.from_numpy(a.reshape(1, -1))
                    for name, a in (("input_ids", x), ("labels", labels), ("position_ids", position_ids))}
        if self.max_docs is not None:
            if len(cu_seqlens) - 1 > self.max_docs:
                raise ValueError(f"a batch holds {len(cu_seqlens) - 1} documents, more than max_docs={self.max_docs}; "
                                 "raise max_docs (modded-nanogpt sizes it at about one per 300 tokens)")
            cu_seqlens = np.append(cu_seqlens, np.full(self.max_docs + 1 - len(cu_seqlens), B * T, np.int32))
        shape = (1, B * T) if self.form == "flat" else (B, T)
        return PackedBatch(*(torch.from_numpy(a.reshape(shape)) for a in (x, y, position_ids)),
                           torch.from_numpy(cu_seqlens), self.max_seqlen)


def collate_packed(batch: Any) -> Any:
    """The loader's collate step for packed rows: a batch is already whole."""
    return batch


class RowRequest(Batch):
    """A batch of packed rows by its place: rows ``first`` .. ``first + count`` of a row stream
    (``stream``: seed, rank, world size and shuffle of training rows; None: evaluation rows). The
    dataset packs them where it reads them, in a worker when there are workers."""

    stream: tuple[int, int, int, bool] | None


class PackingSampler(ResumableBatchSampler):
    """Batches of rows of a ``PackedDocuments``: training rows endless (each rank its own document
    stream), evaluation rows once, each rank a contiguous block of them."""

    kind = "packed"

    def __init__(self, dataset: PackedDocuments, batch_size: int, seed: int, shuffle: bool,
                 rank: int | None = None, world_size: int | None = None):
        super().__init__(len(dataset.lengths), batch_size, seed, rank, world_size)
        self.dataset, self.shuffle = dataset, shuffle
        self.bounds: tuple[int, int] | None = None
        if dataset.stride is not None:
            total = sum(1 for _ in dataset.rows())
            self.bounds = (self.rank * total // self.world_size, (self.rank + 1) * total // self.world_size)
        elif self.num_items < self.world_size:
            raise ValueError(f"{self.num_items} documents cannot be shared by {self.world_size} ranks; use more data")

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "shuffle": self.shuffle, "packing": self.dataset.describe_packing()}

    def batches_per_epoch(self) -> float:
        if self.bounds is None:
            return math.inf
        return math.ceil((self.bounds[1] - self.bounds[0]) / self.batch_size)

    def _request(self, stream: tuple[int, int, int, bool] | None, first: int, count: int) -> RowRequest:
        request = RowRequest([first, count])
        request.stream = stream
        return request

    def batches(self, epoch: int, start: int) -> Iterator[list[int]]:
        B = self.batch_size
        if self.bounds is None:
            stream = (self.seed, self.rank, self.world_size, self.shuffle)
            for batch in itertools.count(start):
                yield self._request(stream, batch * B, B)
        else:
            lo, hi = self.bounds
            for first in range(lo + start * B, hi, B):
                yield self._request(None, first, min(B, hi - first))


def _check_parameters(T: int, packing: str, form: str, stride: int | None, buffer_size: int,
                      max_doc_len: int | None, split_long: bool, max_docs: int | None) -> None:
    if T < 1:
        raise ValueError(f"block_size {T} must be at least 1")
    if packing not in PACKINGS:
        raise ValueError(f"packing {packing!r} is not one of {', '.join(PACKINGS)}")
    if form not in FORMS:
        raise ValueError(f"form {form!r} is not one of {', '.join(FORMS)}")
    if stride is not None and not 1 <= _whole("stride", stride) <= T:
        raise ValueError(f"stride {stride} must lie in 1..block_size ({T}); use stride=block_size for no overlap")
    if buffer_size < 1:
        raise ValueError(f"buffer_size {buffer_size} must be at least 1")
    if max_doc_len is not None and max_doc_len < 1:
        raise ValueError(f"max_doc_len {max_doc_len} must be at least 1")
    if split_long and stride is not None:
        raise ValueError("split_long applies to training rows; evaluation scores each document whole")
    if max_docs is not None and form != "flat":
        raise ValueError("max_docs pads the flat form's cu_seqlens; pass form='flat' or drop max_docs")


class PackedDocuments(Dataset):
    """A prepared split's documents packed into BOS-aligned rows of T + 1 tokens (see the module)."""

    def __init__(self, path: str | Path | Split, block_size: int, split: str | None = None, packing: str = "aligned",
                 *, stride: int | None = None, max_doc_len: int | None = None, buffer_size: int = 1000,
                 split_long: bool = False, mask_boundary: bool = False, form: str = "rows",
                 max_docs: int | None = None, bos_id: int | None = None):
        """Args:
            path: a split's ``.bin``, a prepared folder (with ``split``), llm.c shards, a Megatron
                ``.bin``, or a ``Split`` already opened.
            block_size: T, the tokens of x (and of y) in a row.
            split: the split of a folder.
            packing: ``"aligned"`` or ``"bestfit"`` for training rows.
            stride: S in 1..T for evaluation rows (every target once, per document); None for training.
            max_doc_len: the most tokens of one document in a row (aligned, or with ``split_long``:
                T + 1; bestfit: no cut).
            buffer_size: the documents best fit chooses from.
            split_long: serve a document longer than ``max_doc_len`` as consecutive pieces of
                max_doc_len tokens, each led by a BOS, instead of cutting it (for corpora of long
                documents, where cutting drops most tokens).
            mask_boundary: y = -100 on the target across each document boundary (evaluation always).
            form: ``"rows"`` (B, T); ``"flat"``, one (1, B * T) row; ``"hf"``, a dict of input_ids,
                labels and position_ids as Hugging Face's ``DataCollatorWithFlattening`` gives.
            max_docs: with ``form="flat"``, cu_seqlens padded to max_docs + 1 entries (a fixed shape
                for compiled models); a batch with more documents is refused.
            bos_id: the id that leads every document; None: the encoding's end-of-text from meta.json
                (llm.c shards: their document-start token).
        """
        T = _whole("block_size", block_size)
        _check_parameters(T, packing, form, stride, buffer_size, max_doc_len, split_long, max_docs)
        self.index = DocumentIndex(open_split(path, split))
        self.split = self.index.split
        self.bos_id, lead = self._bos(bos_id)
        self.insert_bos = bool(lead.any())
        self.block_size, self.stride, self.packing, self.form = T, stride, packing, form
        cut = max_doc_len is not None or packing == "aligned" or split_long
        self.max_doc_len = (T + 1 if max_doc_len is None else max_doc_len) if cut else None
        if split_long and self.max_doc_len < 2:
            raise ValueError(f"max_doc_len {self.max_doc_len} leaves no room after a piece's BOS; use 2 or more")
        self.buffer_size, self.mask_boundary, self.max_docs = buffer_size, mask_boundary, max_docs
        self.split_long = split_long
        self.unit_starts, self.unit_bos, self.lengths = self._units(lead)
        self.default_collate_fn = collate_packed
        self.compact = False  # set on the copy a loader's workers read: they send PackedRows
        self._cursor: tuple[Any, Iterator[Row], int] | None = None  # (stream, its rows, the next row's number)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cursor": None}  # each worker packs its own way forward

    def _units(self, lead: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The units rows are made of: documents, or with split_long their pieces. Each is its first
        stored token, whether a BOS is inserted before it, and its length with that BOS."""
        stored = self.index.ends - self.index.starts
        if not self.split_long:
            return self.index.starts, lead, stored + lead
        cap = self.max_doc_len
        head = cap - lead  # stored tokens of a document's first piece
        counts = 1 + -(-np.maximum(stored - head, 0) // (cap - 1))
        doc = np.repeat(np.arange(len(stored)), counts)
        k = np.arange(len(doc)) - np.repeat(np.cumsum(counts) - counts, counts)
        skip = np.where(k == 0, 0, head[doc] + (k - 1) * (cap - 1))
        bos = (k > 0) | lead[doc]
        lengths = np.minimum(stored[doc] - skip, np.where(k == 0, head[doc], cap - 1)) + bos
        return self.index.starts[doc] + skip, bos, lengths

    def _bos(self, bos_id: int | None) -> tuple[int, np.ndarray]:
        """The BOS id, and for each document whether the dataset inserts it: a prepared folder says
        (``--eot prepend`` has it first); elsewhere each document's first token is read (O(documents))."""
        meta, starts = self.split.meta, self.index.starts
        if bos_id is None and meta is not None:
            return int(meta["encoding"]["eot_id"]), np.full(len(starts), meta["eot"] != "prepend")
        if bos_id is None:
            if not all(f.offset for f in self.split.files):
                raise ValueError(f"{self.split.describe()} has no meta.json to name its BOS token; pass bos_id= "
                                 "(the end-of-text id of its encoding)")
            bos_id = LLMC_DOCUMENT_START[self.split.dtype.name]
        files, offsets = self.index.tokens(), self.index.offsets
        file_of = np.searchsorted(offsets, starts, side="right") - 1
        firsts = np.empty(len(starts), dtype=np.int64)
        for f in np.unique(file_of):
            firsts[file_of == f] = files[f][starts[file_of == f] - offsets[f]]
        return bos_id, firsts != bos_id

    def describe_packing(self) -> str:
        """The settings rows depend on: a resume state taken under others is refused."""
        mode = f"stride={self.stride}" if self.stride is not None else self.packing
        return (f"{mode} T={self.block_size} max_doc_len={self.max_doc_len}{' split' if self.split_long else ''} "
                f"buffer={self.buffer_size} "
                f"bos={self.bos_id}{'+' if self.insert_bos else ''} mask={self.mask_boundary} {self.form} "
                f"{self.max_docs}")

    def fingerprint(self) -> str:
        return self.split.fingerprint

    def rows(self, seed: int = 0, rank: int = 0, world_size: int = 1, shuffle: bool = False) -> Iterator[Row]:
        """The rows in order: evaluation rows once; training rows of one rank, endless."""
        width = self.block_size + 1
        if self.stride is not None:
            return evaluation_rows(_in_order(self.lengths), width, self.stride)
        docs = document_stream(self.lengths, seed, rank, world_size, shuffle)
        if self.packing == "aligned":
            return aligned_rows(docs, width, self.max_doc_len)
        return bestfit_rows(docs, width, self.buffer_size, self.max_doc_len)

    def stats(self, rows: int, seed: int = 0, shuffle: bool = True) -> dict[str, float]:
        """Over the first ``rows`` rows: the share of row tokens that are document tokens
        (utilisation), and the share of the placed documents' tokens cut off (cropped)."""
        placed = served = count = 0
        for row in itertools.islice(self.rows(seed, 0, 1, shuffle), rows):
            count += 1
            for doc, offset, n, _ in row:
                if doc >= 0:
                    served += n
                    placed += n if self.stride is not None else int(self.lengths[doc])
        return {"rows": count, "utilisation": served / max(1, count * (self.block_size + 1)),
                "cropped": 1 - served / max(1, placed)}

    def default_sampler(self, batch_size: int, seed: int, *, shuffle: bool | None = None,
                        num_samples: int | None = None, drop_last: bool | None = None, rank: int | None = None,
                        world_size: int | None = None) -> PackingSampler:
        """Training rows endless, shuffled by document per epoch unless ``shuffle=False``; evaluation
        rows once, in order."""
        if num_samples is not None:
            raise ValueError("packed training rows are an endless stream; stop after the steps you want instead "
                             "of passing num_samples")
        if drop_last:
            raise ValueError("drop_last does not apply to packed rows; leave it off")
        if self.stride is not None and shuffle:
            raise ValueError("evaluation rows are read in order; drop shuffle=")
        return PackingSampler(self, batch_size, seed, self.stride is None and shuffle is not False, rank, world_size)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, row: Row) -> Any:
        return self.__getitems__([row])

    def worker_copy(self) -> PackedDocuments | None:
        """The copy a loader's workers read: it sends PackedRows. None for a subclass with its own
        ``__getitems__``, whose batches pass unchanged."""
        if type(self).__getitems__ is not PackedDocuments.__getitems__:
            return None
        read = copy.copy(self)
        read.compact = True
        return read

    def finish_batch(self, batch: PackedRows, device: torch.device | str | None) -> Any:
        """A worker's rows widened, with their document structure, in the training process."""
        whole = batch.widen()
        return whole if device is None else to_device(whole, device)

    def __getitems__(self, rows: Sequence[Row] | RowRequest) -> PackedBatch | PackedRows | dict[str, torch.Tensor]:
        """Rows given as segments, or by their place in a row stream (the sampler's requests)."""
        request = isinstance(rows, RowRequest)
        batch = self.gather(self._rows_at(rows) if request else rows, checked=request)
        return batch if self.compact else batch.widen()

    def _rows_at(self, request: RowRequest) -> list[Row]:
        """The requested rows, packed on from where this process's last request ended (a worker
        that serves every n-th batch packs the ones between too); a request behind it starts over."""
        first, count = request
        if self._cursor is None or self._cursor[0] != request.stream or first < self._cursor[2]:
            rows = self.rows() if request.stream is None else self.rows(*request.stream)
            self._cursor = (request.stream, rows, 0)
        stream, rows, at = self._cursor
        taken = list(itertools.islice(rows, first - at, first - at + count))
        self._cursor = (stream, rows, first + len(taken))
        return taken

    def gather(self, rows: Sequence[Row], checked: bool = False) -> PackedRows:
        """The rows' tokens as stored, BOS inserted, one (B, T + 1) array, with their position ids,
        segment starts and masked targets: one slice copy and a few integer operations a segment (a
        handful a row), then a fixed number of array operations. Rows from elsewhere than this
        dataset's own packing (``checked`` False) are first checked to lie inside its units and to
        fill their rows."""
        T, width, B = self.block_size, self.block_size + 1, len(rows)
        if not checked:
            self._check_rows(rows)
        files = self.index.tokens()
        single = files[0] if len(files) == 1 else None
        unit_starts, unit_bos, bos_id = self.unit_starts, self.unit_bos, self.bos_id
        boundary = self.stride is not None or self.mask_boundary  # a segment's last target is the next one's first token
        out = np.empty(B * width, dtype=self.split.dtype)
        starts: list[int] = []
        spans: list[int] = []
        skipped: list[np.ndarray] = []  # evaluation: targets an earlier window scored, and padding
        last: list[int] = []  # with boundary masking: each segment's last target, the next one's first token
        at = 0  # in the flattened rows
        for r, row in enumerate(rows):
            for unit, offset, n, skip in row:
                if unit < 0:  # padding: all BOS
                    out[at:at + n] = bos_id
                else:
                    source, lead = unit_starts.item(unit) + offset, 0
                    if unit_bos.item(unit):  # its BOS is inserted: the stored tokens begin one later
                        if offset == 0:
                            out[at], lead = bos_id, 1
                        else:
                            source -= 1
                    if single is not None:
                        out[at + lead:at + n] = single[source:source + n - lead]
                    else:
                        out[at + lead:at + n] = self.index.span(source, source + n - lead)
                col = at - r * width
                if col < T:  # one starting at a row's last token is in y only
                    first, span = at - r, min(col + n, T) - col  # its place in the flattened x
                    starts.append(first)
                    spans.append(span)
                    if skip:
                        skipped.append(np.arange(first, first + min(skip, span)))
                    if boundary and col + n - 1 < T:
                        last.append(first + n - 1)
                at += n
        tokens = self.split.check_ids(out.reshape(B, width))
        cu_seqlens = np.array(starts + [B * T], dtype=np.int32)
        # Every row starts a segment, so the starts alone give the positions.
        positions = np.arange(B * T, dtype=np.int32) - np.repeat(cu_seqlens[:-1], np.diff(cu_seqlens))
        flat = np.concatenate([*skipped, np.array(last, dtype=np.int64)])
        return PackedRows(tokens, positions.astype(np.uint16 if T <= 2**16 else np.uint32), cu_seqlens, flat,
                          max(spans), self.form, self.max_docs)

    def _check_rows(self, rows: Sequence[Row]) -> None:
        count, width = len(self.lengths), self.block_size + 1
        try:
            seg = np.array([s for row in rows for s in row], dtype=np.int64).reshape(-1, 4)
        except (TypeError, ValueError):
            seg = None
        if seg is not None:
            unit, offset, n, _ = seg.T
            row_of = np.repeat(np.arange(len(rows)), [len(row) for row in rows])
            inside = np.where(unit >= 0, self.lengths[np.clip(unit, 0, count - 1)], n)
        if (seg is None or not rows or (unit < -1).any() or (unit >= count).any() or (n < 1).any()
                or (offset < 0).any() or (offset + n > inside).any()
                or (np.bincount(row_of, weights=n, minlength=len(rows)) != width).any()):
            raise ValueError(f"packed rows must be tuples of (unit, offset, tokens, masked) segments inside this "
                             f"split's {count} units that fill {width} tokens each; pass rows from the dataset's "
                             "sampler")

    def __repr__(self) -> str:
        pieces = f" ({len(self):,} pieces)" if self.split_long else ""
        return (f"PackedDocuments({self.split.describe()}, {self.describe_packing()}, "
                f"{len(self.index):,} documents{pieces})")
