"""Packed documents: rows that start at a document start, with the document structure alongside.

    from tokpack import PackedDocuments, build_loader
    train = PackedDocuments("data/sample", 256, split="train", rows="bestfit")
    x, y, position_ids, cu_seqlens, max_seqlen = next(iter(build_loader(train, 8, seed=1337)))
    val = PackedDocuments("data/sample", 256, split="val", rows=EvalRows(128))   # every target once, per document

The contract: a row is T + 1 tokens of segments, each the head (or a piece) of one document led
by BOS; which rows (``TrainRows``: aligned or best fit; ``EvalRows``: every target scored once) and
in what form (``Rows``, ``Flat``, ``HF``, ``MegatronSFT``) are values of ``tokpack.data.layouts``.
Packing is a pure function of (seed, rank, position) over the document lengths; a loader's state
holds the packer's state, so a resume at any step costs O(buffer_size) and every batch is the one
an unbroken run gives. Memory: O(buffer_size) beside the document index; a batch's structure
O(B * T). See docs/packing.md.
"""

from __future__ import annotations

import collections
import hashlib
import json
import itertools
import math
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset

from ..format import LLMC_DOCUMENT_START
from ..split import OpenedFiles, Split, open_split
from .documents import DocumentIndex
from .layouts import BUFFER_SIZE, EvalRows, Flat, Form, HF, LongDocuments, Packing, TrainRows, resolve
from .packers import (Order, Packer, PackerState, Row, Stream, TrainingRows, buffer_entries, buffer_key, check_state,
                      evaluation_rows, file_room, in_order)
from .protocol import compact_copy
from .runtime import to_device
from .samplers import Batch, ResumableBatchSampler
from .windows import IGNORE_INDEX, _whole, ignore_label

# The keywords of tokpack 0.2, which build rows= and form= until 0.3, with a DeprecationWarning.
OLD_KEYWORDS = ("packing", "stride", "max_doc_len", "buffer_size", "split_long", "mask_boundary", "ranks", "refill",
                "shard_end", "max_docs", "return_flash_attn_kwargs", "return_seq_idx")

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
    hf_extras: tuple[str, ...] = ()  # the hf form's optional keys, as DataCollatorWithFlattening names them
    ignore_index: int = IGNORE_INDEX

    def _hf(self, x: np.ndarray, labels: np.ndarray, position_ids: np.ndarray) -> dict[str, Any]:
        """The hf form: the keys, shapes and dtypes Hugging Face's ``DataCollatorWithFlattening``
        gives, its optional ones (flash-attention's and ``seq_idx``) when asked for."""
        out: dict[str, Any] = {name: torch.from_numpy(a.reshape(1, -1))
                               for name, a in (("input_ids", x), ("labels", labels), ("position_ids", position_ids))}
        if "flash_attn_kwargs" in self.hf_extras:
            out["cu_seq_lens_q"] = out["cu_seq_lens_k"] = torch.from_numpy(self.cu_seqlens.astype(np.int32))
            out["max_length_q"] = out["max_length_k"] = int(self.max_seqlen)
        if "seq_idx" in self.hf_extras:
            segments = np.repeat(np.arange(len(self.cu_seqlens) - 1, dtype=np.int32), np.diff(self.cu_seqlens))
            out["seq_idx"] = torch.from_numpy(segments.reshape(1, -1))
        return out

    def widen(self) -> PackedBatch | dict[str, torch.Tensor]:
        B, width = self.tokens.shape
        T = width - 1
        x, y = self.tokens[:, :-1].astype(np.int64).reshape(-1), self.tokens[:, 1:].astype(np.int64).reshape(-1)
        ignore = self.ignore_index
        if len(self.masked):
            y[self.masked] = ignore
        cu_seqlens, position_ids = self.cu_seqlens, self.positions.astype(np.int64)
        if self.form == "hf":
            labels = x.copy()
            labels[1:][y[:-1] == ignore] = ignore
            labels[cu_seqlens[:-1]] = ignore  # as DataCollatorWithFlattening: no target across a boundary
            return self._hf(x, labels, position_ids)
        if self.form == "megatron":
            out = {name: torch.from_numpy(a.reshape(B, T)) for name, a in
                   (("tokens", x), ("labels", y), ("loss_mask", (y != ignore).astype(np.float32)),
                    ("position_ids", position_ids))}
            return {**out, "cu_seqlens": torch.from_numpy(cu_seqlens), "max_seqlen": self.max_seqlen}
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
    dataset packs them where it reads them, in a worker when there are workers. After a resume,
    ``resume`` carries the packer's state to start from instead of the stream's beginning."""

    stream: Stream | None
    resume: PackerState | None = None


# Requests after a resume that carry the packer's state: enough for every worker's first one.
RESUME_REQUESTS = 256


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
        else:
            dataset.packer.order.check_world(self.num_items, self.world_size)
        self.resume: PackerState | None = None  # where a restored stream's packer starts
        # The packing arithmetic (lengths only, no token read) kept in the training process, moved on
        # only when a state is taken: O(rows since the last state), O(buffer_size) memory.
        self._anchor: TrainingRows | None = None

    @property
    def stream(self) -> Stream:
        return Stream(self.seed, self.rank, self.world_size, self.shuffle)

    def stream_state(self, batch: int) -> dict[str, Any]:
        """The packer's state after ``batch`` batches: a resume starts there in O(buffer_size)
        instead of packing every row before it again."""
        row = batch * self.batch_size
        if self.bounds is not None or row == 0:
            return {}
        anchor = self._anchor
        if anchor is None or anchor.row > row:
            base = self.resume if self.resume is not None and self.resume.row <= row else None
            anchor = self.dataset.rows(*self.stream, state=base)  # type: ignore[assignment]
        collections.deque(itertools.islice(anchor, row - anchor.row), maxlen=0)
        self._anchor = anchor
        return {"packer": self.dataset.save_state(self.stream, anchor.position())}

    def load_stream_state(self, state: dict[str, Any], batch: int) -> None:
        self.resume, self._anchor = None, None
        if self.bounds is not None or (batch == 0 and "packer" not in state):
            return  # evaluation rows are replayed: a split's worth at most
        self.resume = self.dataset.load_state(self.stream, state.get("packer"), batch * self.batch_size)

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "shuffle": self.shuffle, "packing": self.dataset.describe_packing()}

    def batches_per_epoch(self) -> float:
        if self.bounds is None:
            return math.inf
        return math.ceil((self.bounds[1] - self.bounds[0]) / self.batch_size)

    def _request(self, stream: Stream | None, first: int, count: int,
                 resume: PackerState | None = None) -> RowRequest:
        request = RowRequest([first, count])
        request.stream, request.resume = stream, resume
        return request

    def batches(self, epoch: int, start: int) -> Iterator[list[int]]:
        B = self.batch_size
        if self.bounds is None:
            for i, batch in enumerate(itertools.count(start)):
                resume = self.resume if i < RESUME_REQUESTS else None  # every worker's first request carries it
                yield self._request(self.stream, batch * B, B, resume)
        else:
            lo, hi = self.bounds
            for first in range(lo + start * B, hi, B):
                yield self._request(None, first, min(B, hi - first))


def _old_keywords(rows: Any, form: Any, given: dict[str, Any]) -> tuple[TrainRows | EvalRows, Form | str | None]:
    """The rows and form that tokpack 0.2's keywords ask for, with a DeprecationWarning; a keyword
    that would do nothing in the combination is refused, as 0.2 refused it."""
    unknown = sorted(set(given) - set(OLD_KEYWORDS))
    if unknown:
        raise TypeError(f"PackedDocuments() got an unexpected keyword argument {unknown[0]!r}")
    warnings.warn(f"PackedDocuments({', '.join(f'{k}=' for k in given)}) is tokpack 0.2's spelling and goes in 0.3: "
                  "pass rows=TrainRows(...) or EvalRows(stride), a preset name, and form=Rows(), Flat(...) or HF(...)",
                  DeprecationWarning, stacklevel=3)
    if rows != TrainRows() and not isinstance(rows, str):
        raise ValueError(f"rows= and the keywords {', '.join(given)} both describe the rows; give rows= alone")
    packing = given.pop("packing", rows if isinstance(rows, str) else Packing.ALIGNED)
    name = form if isinstance(form, str) else "rows" if form is None else form.name
    extras = {key: given.pop(f"return_{key}", False) for key in ("flash_attn_kwargs", "seq_idx")}
    if any(extras.values()) and name != "hf":
        raise ValueError("return_flash_attn_kwargs and return_seq_idx add keys to the hf form; pass form='hf'")
    if "max_docs" in given and name != "flat":
        raise ValueError("max_docs pads the flat form's cu_seqlens; pass form='flat' or drop max_docs")
    if name == "hf":
        form = HF(**extras)
    elif name == "flat":
        form = Flat(given.pop("max_docs", None))
    stride = given.pop("stride", None)
    if stride is None:
        return TrainRows(packing, **given), form
    if given.get("split_long"):
        raise ValueError("split_long applies to training rows; evaluation scores each document whole")
    if any(key in given for key in ("ranks", "refill", "shard_end")):
        raise ValueError("ranks, refill and shard_end shape training rows; evaluation rows are read in order: drop "
                         "them")
    return EvalRows(_whole("stride", stride)), form


class PackedDocuments(Dataset):
    """A prepared split's documents packed into BOS-aligned rows of T + 1 tokens (see the module)."""

    def __init__(self, path: str | Path | Split, block_size: int, split: str | None = None,
                 rows: TrainRows | EvalRows | str = TrainRows(), *, form: Form | str | None = None,
                 bos_id: int | None = None, ignore_index: int = IGNORE_INDEX, **old: Any):
        """Args:
            path: a split's ``.bin``, a prepared folder (with ``split``), llm.c shards, a Megatron
                ``.bin``, or a ``Split`` already opened.
            block_size: T, the tokens of x (and of y) in a row.
            split: the split of a folder.
            rows: ``TrainRows(...)`` (training rows, endless), ``EvalRows(stride)`` (every target
                once, per document), a packing's name (``"aligned"``, ``"bestfit"``), or a preset's
                (``"nanochat"``, ``"modded"``, ``"hf"``: ``tokpack.data.layouts.PRESETS``).
            form: ``Rows()`` (B, T), ``Flat(max_docs)`` one (1, B * T) row, ``MegatronSFT()`` a
                dict as Megatron-LM's SFT dataset names them, ``HF(...)`` a dict as
                Hugging Face's ``DataCollatorWithFlattening`` gives it, or one's name; None: the
                preset's, else Rows().
            bos_id: the id that leads every document; None: the encoding's end-of-text from meta.json
                (llm.c shards: their document-start token).
            ignore_index: the label of a target not trained on (padding, a masked boundary, and in
                a split of conversations every target its loss mask leaves out); -1 for nanochat.
            old: tokpack 0.2's keywords (packing=, stride=, buffer_size=, ...), until 0.3.
        """
        if old:
            rows, form = _old_keywords(rows, form, old)
        self.layout, self.output = resolve(rows, form)
        self.stride: int | None = getattr(self.layout, "stride", None)
        train = self.layout if self.stride is None else TrainRows()  # evaluation rows: the defaults describe them
        T = _whole("block_size", block_size)
        if T < 1:
            raise ValueError(f"block_size {T} must be at least 1")
        if self.stride is not None and self.stride > T:
            raise ValueError(f"stride {self.stride} must lie in 1..block_size ({T}); use stride=block_size for no "
                             "overlap")
        self.form, self.hf_extras = self.output.name, getattr(self.output, "extras", tuple)()
        self.ignore_index = ignore_label(ignore_index)
        self.max_docs: int | None = getattr(self.output, "max_docs", None)
        self.index = DocumentIndex(open_split(path, split))
        self.split = self.index.split
        self.bos_id, lead = self._bos(bos_id)
        self.packing, self.ranks, self.refill = train.packing, train.ranks, train.refill
        self.shard_end = train.shard_end
        self._check_fits(T, train.buffer_size)
        self.insert_bos = bool(lead.any())
        self.block_size = T
        crop = train.packing == Packing.BESTFIT_PAD and train.long_documents == LongDocuments.CROP
        cut = train.max_doc_len is not None or train.packing == Packing.ALIGNED or train.split_long or crop
        self.max_doc_len = (T + 1 if train.max_doc_len is None else train.max_doc_len) if cut else None
        if train.split_long and self.max_doc_len < 2:
            raise ValueError(f"max_doc_len {self.max_doc_len} leaves no room after a piece's BOS; use 2 or more")
        self.buffer_size, self.mask_boundary, self.split_long = train.buffer_size, train.mask_boundary, train.split_long
        self.unit_starts, self.unit_bos, lengths = self._units(lead)
        order, self.lengths = self._order(lengths)
        self._mask_files: OpenedFiles | None = None
        self.long_policy = train.long_documents
        long = np.flatnonzero(self.lengths > T + 1)
        self.long_documents = len(long)  # what bestfit-pad crops or drops
        skip = self._check_long(train, long)
        self.packer = Packer(self.packing, T + 1, self.max_doc_len, self.buffer_size, order, skip)
        self.default_collate_fn = collate_packed
        self.compact = False  # set on the copy a loader's workers read: they send PackedRows
        self._cursor: tuple[Any, Iterator[Row], int] | None = None  # (stream, its rows, the next row's number)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cursor": None, "_mask_files": None}  # each worker packs and maps its own

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

    def _order(self, lengths: np.ndarray) -> tuple[Order, np.ndarray]:
        """The document order of ``ranks``, ``refill`` and ``shard_end`` from the split's facts (its
        row groups, recorded at prepare; the file each document starts in), with the units'
        ``lengths`` cut at their file's end where the order drops a shard's end, as modded-nanogpt's
        loader cuts them."""
        groups: tuple[tuple[int, ...], ...] = ()
        if self.ranks == "groups":
            info = self.split.meta["splits"].get(self.split.name or "", {}) if self.split.meta else {}
            recorded = info.get("row_groups")
            if recorded is None:
                raise ValueError(f"ranks='groups' needs the parquet row groups of {self.split.describe()}, which "
                                 "prepare records when a split holds whole parquet files with no empty text: "
                                 "prepare again with --val-inputs (nanochat's last file), or use ranks='documents'")
            groups = tuple(tuple(sizes) for sizes in recorded)
            if sum(map(sum, groups)) != len(lengths):
                raise ValueError(f"meta.json's row groups of {self.split.describe()} hold {sum(map(sum, groups))} "
                                 f"documents, its index {len(lengths)}; the folder is damaged: prepare again")
        files = None
        if self.shard_end == "drop":
            offsets = self.index.offsets
            files = np.searchsorted(offsets, self.unit_starts, side="right") - 1
            lengths = np.minimum(lengths, offsets[files + 1] - self.unit_starts + self.unit_bos)
            room = file_room(files, lengths, self.max_doc_len or np.inf)
            if room < self.block_size + 1:
                raise ValueError(f"shard_end='drop' serves no row that runs past a token file's end, and the largest "
                                 f"file of {self.split.describe()} gives {room:,} tokens, fewer than a row's "
                                 f"{self.block_size + 1}: none would ever be served; use a block_size below {room} "
                                 "or shard_end='continue'")
        return Order(self.ranks, self.refill, groups, files), lengths

    def _check_long(self, train: TrainRows, long: np.ndarray) -> frozenset[int]:
        """Say how many documents (``long``, those longer than a row) bestfit-pad crops or drops,
        and return those it leaves out although cropping: a conversation whose first row of tokens
        trains on nothing (its mask read for those alone, O(their tokens)), which would make a row
        with no loss. Refuse to leave every document out."""
        if train.packing != Packing.BESTFIT_PAD or not len(long):
            return frozenset()
        width, mask, skip = self.block_size + 1, self._masks(), frozenset()
        if train.long_documents == LongDocuments.DROP:
            skip = frozenset(long.tolist())
        elif mask is not None:
            starts = self.unit_starts
            skip = frozenset(d for d in long.tolist() if not mask.span(starts[d], starts[d] + width).any())
        if len(skip) == len(self.lengths):
            raise ValueError(f"every document of {self.split.describe()} is longer than a row of {width} tokens "
                             "(or trains on nothing in one), and none would be left; raise block_size")
        unsupervised = f", {len(skip):,} of them left out for training on nothing in a row" \
            if train.long_documents == LongDocuments.CROP and skip else ""
        warnings.warn(f"{len(long):,} of the {len(self.lengths):,} documents of {self.split.describe()} are longer "
                      f"than a row of {width} tokens: each is {train.long_documents.value}ped (long_documents)"
                      f"{unsupervised}; raise block_size to keep them whole", stacklevel=3)
        return skip

    def _check_fits(self, T: int, buffer_size: int) -> None:
        """Parameters that must fit the data: a row inside the split's tokens, a buffer inside its
        documents, a BOS id inside its vocabulary and its dtype."""
        tokens, documents = int(self.index.ends[-1] - self.index.starts[0]), len(self.index)
        if T + 1 > tokens + documents:  # its tokens, and at most a BOS inserted before each document
            raise ValueError(f"block_size {T} needs rows of {T + 1} tokens, more than {self.split.describe()} holds "
                             f"({tokens:,}); use a block_size below {tokens}")
        most = max(documents, BUFFER_SIZE)  # a buffer past both would hold the corpus many times over
        for name, value in (("buffer_size", buffer_size), ("refill", self.refill)):
            if self.packing in (Packing.BESTFIT, Packing.BESTFIT_PAD) and value > most:
                raise ValueError(f"{name} {value:,} is more than the {documents:,} documents of "
                                 f"{self.split.describe()} and than the default {BUFFER_SIZE:,}; use 1..{most}")
        meta = self.split.meta
        limit = min(np.iinfo(self.split.dtype).max + 1, meta["encoding"]["n_vocab"] if meta else 2**63)
        if not 0 <= self.bos_id < limit:
            raise ValueError(f"bos_id {self.bos_id} is not a token id of {self.split.describe()}; give one in "
                             f"0..{limit - 1}")

    def _bos(self, bos_id: int | None) -> tuple[int, np.ndarray]:
        """The BOS id, and for each document whether the dataset inserts it: a prepared folder says
        (``--eot prepend`` has it first); elsewhere each document's first token is read (O(documents))."""
        meta, starts = self.split.meta, self.index.starts
        bos_id = None if bos_id is None else _whole("bos_id", bos_id)
        if bos_id is None and meta is not None:  # conversations come with their own BOS, as --eot prepend does
            inserted = meta["eot"] != "prepend" and "chat" not in meta
            return int(meta["encoding"]["eot_id"]), np.full(len(starts), inserted)
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
        order = f" ranks={self.ranks} refill={self.refill} shard_end={self.shard_end}" if self.stride is None else ""
        return (f"{mode} T={self.block_size} max_doc_len={self.max_doc_len}{' split' if self.split_long else ''} "
                f"buffer={self.buffer_size}{order} "
                f"bos={self.bos_id}{'+' if self.insert_bos else ''} mask={self.mask_boundary} {self.form} "
                f"{self.max_docs}{''.join(f' {name}' for name in self.hf_extras)}"
                + (f" long={self.long_policy}" if self.packing == Packing.BESTFIT_PAD else ""))

    def fingerprint(self) -> str:
        return self.split.fingerprint

    def rows(self, seed: int = 0, rank: int = 0, world_size: int = 1, shuffle: bool = False,
             state: PackerState | None = None) -> Iterator[Row]:
        """The rows in order: evaluation rows once; training rows of one rank, endless, from ``state``."""
        width = self.block_size + 1
        if self.stride is not None:
            return evaluation_rows(in_order(self.lengths), width, self.stride)
        return TrainingRows(self.lengths, Stream(seed, rank, world_size, shuffle), self.packer, state)

    def save_state(self, stream: Stream, state: PackerState) -> dict[str, Any]:
        """A packer state as a loader's state holds it: plain integers and a checksum of the stream,
        the packing and the data it belongs to."""
        saved = {"row": state.row, "taken": state.taken, "buffer": buffer_entries(state.buffer)}
        return {**saved, "checksum": self._checksum(stream, saved)}

    def load_state(self, stream: Stream, saved: Any, row: int) -> PackerState:
        """The packer state of a loader's state, refused unless it is this stream's at ``row``."""
        fields = {"row", "taken", "buffer", "checksum"}
        if not isinstance(saved, dict) or set(saved) != fields:
            raise ValueError(f"a packed loader's state needs its packer state ({', '.join(sorted(fields))}); this one "
                             "has none or another shape: resume from a state of this tokpack's loader")
        plain = {key: saved[key] for key in ("row", "taken", "buffer")}
        pairs = plain["buffer"]
        if (type(plain["row"]) is not int or type(plain["taken"]) is not int or not isinstance(pairs, list)
                or not all(isinstance(p, list) and len(p) == 2 and all(type(v) is int and v >= 0 for v in p)
                           for p in pairs)):
            raise ValueError("a packed loader's packer state holds something other than whole numbers; it is forged")
        if saved["checksum"] != self._checksum(stream, plain):
            raise ValueError("a packed loader's packer state does not match its checksum (it was edited, or taken on "
                             "another stream, packing or corpus); resume from an unedited state of this run")
        if plain["row"] != row:
            raise ValueError(f"a packed loader's state is at row {row} but its packer state at row {plain['row']}; "
                             "it is forged")
        if any(doc >= len(self.lengths) for _, doc in pairs):
            raise ValueError("a packed loader's packer state names a document this split does not hold")
        keys = sorted(buffer_key(doc, int(self.lengths[doc]), arrival, self.max_doc_len) for arrival, doc in pairs)
        state = PackerState(plain["row"], plain["taken"], keys)
        check_state(state, self.lengths, stream, self.packer)
        return state

    def _checksum(self, stream: Stream, plain: dict[str, Any]) -> str:
        text = json.dumps([self.describe_packing(), self.fingerprint(), list(stream), plain], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]

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
        ordered = self.ranks in ("groups", "cursor") or self.shard_end == "drop"
        if ordered and shuffle:
            raise ValueError(f"ranks='{self.ranks}' and shard_end='{self.shard_end}' read the documents in stored "
                             "order, as nanochat and modded-nanogpt do; drop shuffle=")
        return PackingSampler(self, batch_size, seed, self.stride is None and not ordered and shuffle is not False,
                              rank, world_size)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, row: Row) -> Any:
        return self.__getitems__([row])

    def worker_copy(self) -> PackedDocuments | None:
        """The copy a loader's workers read: it sends PackedRows (``compact_copy``)."""
        return compact_copy(self, PackedDocuments)

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
        cursor, resume = self._cursor, request.resume
        jump = resume is not None and resume.row <= first and (cursor is None or cursor[2] < resume.row)
        if jump or cursor is None or cursor[0] != request.stream or first < cursor[2]:
            if request.stream is None:
                cursor = (None, self.rows(), 0)
            elif resume is not None and resume.row <= first:  # a resumed stream: from the saved state
                cursor = (request.stream, self.rows(*request.stream, state=resume), resume.row)
            else:
                cursor = (request.stream, self.rows(*request.stream), 0)
        stream, rows, at = cursor
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
        mask = self._masks()  # a split of conversations: each token's loss mask
        kept = np.zeros(B * width, dtype=np.uint8) if mask is not None else None  # inserted BOS, padding: 0
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
                    stop = source + n - lead
                    if single is not None:
                        out[at + lead:at + n] = single[source:stop]
                        if kept is not None:
                            kept[at + lead:at + n] = mask[0][source:stop]  # type: ignore[index]
                    else:
                        out[at + lead:at + n] = self.index.span(source, stop)
                        if kept is not None:
                            kept[at + lead:at + n] = mask.span(source, stop)  # type: ignore[union-attr]
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
        if kept is not None:
            flat = self._untrained(flat, kept.reshape(B, width))
        return PackedRows(tokens, positions.astype(np.uint16 if T <= 2**16 else np.uint32), cu_seqlens, flat,
                          max(spans), self.form, self.max_docs, self.hf_extras, self.ignore_index)

    def _untrained(self, masked: np.ndarray, kept: np.ndarray) -> np.ndarray:
        """``masked`` (flat x positions whose target is ignored) with every target the loss mask
        ``kept`` (B, T + 1) leaves out: x position p predicts the row's token p + 1. A batch left
        with no target at all is refused: its loss would be NaN."""
        B, T = kept.shape[0], kept.shape[1] - 1
        self.split.mask.check_mask(kept)  # type: ignore[union-attr]
        ignored = kept[:, 1:].reshape(-1) == 0  # a boolean pass, where a set union sorted B * T positions
        ignored[masked] = True
        masked = np.flatnonzero(ignored)
        if len(masked) == B * T:
            raise ValueError(f"a batch of {B} rows of {self.split.describe()} holds no target to train on (its "
                             "conversations' masks are 0 throughout), so its loss would be NaN; prepare the "
                             "conversations again, which leaves out any with nothing to train on")
        return masked

    def _masks(self) -> OpenedFiles | None:
        """The loss mask of a split of conversations, mapped on first use in this process."""
        if self.split.mask is None:
            return None
        if self._mask_files is None:
            self._mask_files = self.split.mask.open()
        return self._mask_files

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
