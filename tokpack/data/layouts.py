"""What a ``PackedDocuments`` makes, as values: which rows (training or evaluation) and in what
form, each checked where it is made, so that a combination that means nothing cannot be written.

    from tokpack import PackedDocuments, TrainRows, EvalRows, Flat
    train = PackedDocuments("data/web", 1024, split="train", rows=TrainRows("bestfit", buffer_size=500))
    val = PackedDocuments("data/web", 1024, split="val", rows=EvalRows(stride=512))
    modded = PackedDocuments("data/fineweb", 2048, split="train", rows="modded", form=Flat(max_docs=63))

A string names a packing (``"aligned"``, ``"bestfit"``) or a preset, the settings a stack's own
loader uses (``PRESETS``: ``"nanochat"``, ``"modded"``, ``"hf"``); ``preset(name, **changes)``
gives a preset's rows with some settings changed. The rules, and why: docs/packing.md.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, NamedTuple

from .windows import _whole

BUFFER_SIZE = 1000  # nanochat's best-fit buffer


class Packing(enum.StrEnum):
    """How training rows are filled: ``ALIGNED``, documents in order, each cut to ``max_doc_len``
    and the one reaching a row's end cut there; ``BESTFIT``, nanochat's rule, from a buffer the
    longest document that fits, the shortest cropped when none does; ``BESTFIT_PAD``, nanochat's
    SFT rule, the same but a row that nothing fits is padded (BOS, its targets ignored), so no
    document is ever cut."""

    ALIGNED = "aligned"
    BESTFIT = "bestfit"
    BESTFIT_PAD = "bestfit-pad"


class LongDocuments(enum.StrEnum):
    """What ``bestfit-pad`` does with a document longer than a row, which no row could take whole
    (nanochat's loader keeps it in its buffer for ever, and pads every row after): ``CROP`` it to
    the row, or ``DROP`` it; either way it is counted (``PackedDocuments.long_documents``)."""

    CROP = "crop"
    DROP = "drop"


class RankShare(enum.StrEnum):
    """How ranks share training documents: ``DOCUMENTS``, every world_size-th of a shuffled epoch;
    ``ROWS``, one stream whose steps of world_size rows give rank r the r-th (modded-nanogpt's);
    ``GROUPS``, each rank its parquet row groups of every input file, in order (nanochat's);
    ``CURSOR``, the stored order dealt as nanochat's SFT cursor deals it, document i to rank i mod
    world_size, round and round the split."""

    DOCUMENTS = "documents"
    ROWS = "rows"
    GROUPS = "groups"
    CURSOR = "cursor"


class ShardEnd(enum.StrEnum):
    """What a step does at a token file's end: ``CONTINUE`` into the next file; ``DROP`` the step
    that would run past it, with the file's rest (modded-nanogpt's rule, aligned packing only)."""

    CONTINUE = "continue"
    DROP = "drop"


def _choice(kind: type[enum.StrEnum], name: str, value: Any) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{name} {value!r} is not one of {', '.join(m.value for m in kind)}") from None


def _at_least(name: str, value: Any, least: int, why: str = "") -> None:
    if _whole(name, value) < least:
        raise ValueError(f"{name} {value} must be at least {least}{why}")


@dataclasses.dataclass(frozen=True)
class TrainRows:
    """Training rows: an endless stream a rank, packed by ``packing``.

    Args:
        packing: aligned or best-fit rows.
        max_doc_len: the most tokens of one document in a row (None: T + 1 aligned or with
            ``split_long``; best fit cuts nothing).
        buffer_size: the documents best fit chooses from.
        refill: documents best fit adds at a time when its buffer falls below buffer_size
            (nanochat: 128), never across a row group.
        split_long: serve a document longer than ``max_doc_len`` as consecutive pieces, each led
            by a BOS, instead of cutting it.
        mask_boundary: y = -100 on the target across each document boundary.
        ranks: how ranks share the documents.
        shard_end: what a step does at a token file's end.
        long_documents: what bestfit-pad does with a document longer than a row.
    """

    packing: Packing = Packing.ALIGNED
    max_doc_len: int | None = None
    buffer_size: int = BUFFER_SIZE
    refill: int = 1
    split_long: bool = False
    mask_boundary: bool = False
    ranks: RankShare = RankShare.DOCUMENTS
    shard_end: ShardEnd = ShardEnd.CONTINUE
    long_documents: LongDocuments = LongDocuments.CROP

    def __post_init__(self) -> None:
        for name, kind in (("packing", Packing), ("ranks", RankShare), ("shard_end", ShardEnd),
                           ("long_documents", LongDocuments)):
            object.__setattr__(self, name, _choice(kind, name, getattr(self, name)))
        _at_least("buffer_size", self.buffer_size, 1)
        _at_least("refill", self.refill, 1, " (the documents best fit adds to its buffer at a time)")
        if self.max_doc_len is not None:
            _at_least("max_doc_len", self.max_doc_len, 1)
        if self.packing == Packing.BESTFIT_PAD and (self.max_doc_len is not None or self.split_long):
            raise ValueError("packing='bestfit-pad' never cuts a document (long_documents says what it does with "
                             "one longer than a row); drop max_doc_len and split_long")
        if self.long_documents != LongDocuments.CROP and self.packing != Packing.BESTFIT_PAD:
            raise ValueError(f"long_documents={self.long_documents.value!r} applies to packing='bestfit-pad'; drop it")
        if self.refill > 1 and self.packing != Packing.BESTFIT:
            raise ValueError(f"refill {self.refill} sizes best fit's buffer refills; packing={self.packing.value!r} "
                             "has no buffer: drop it")
        if self.ranks == RankShare.GROUPS and self.split_long:
            raise ValueError("ranks='groups' shares whole documents by row group; split_long cuts them into pieces: "
                             "drop one")
        if self.shard_end == ShardEnd.DROP and (self.packing != Packing.ALIGNED or self.split_long):
            raise ValueError("shard_end='drop' is modded-nanogpt's rule for packing='aligned' without split_long; use "
                             "those or drop shard_end")


@dataclasses.dataclass(frozen=True)
class EvalRows:
    """Evaluation rows, read once in order: every document whole, one longer than T + 1 as windows
    at ``stride`` within it (targets an earlier window scored masked), so that with a document mask
    every target is scored exactly once.

    Args:
        stride: S in 1..T (block_size: no overlap).
    """

    stride: int

    def __post_init__(self) -> None:
        _at_least("stride", self.stride, 1)


@dataclasses.dataclass(frozen=True)
class Rows:
    """Batches of (B, T) rows: x, y, position_ids, cu_seqlens, max_seqlen."""

    name = "rows"


@dataclasses.dataclass(frozen=True)
class Flat:
    """One (1, B * T) row, as modded-nanogpt's loader gives it.

    Args:
        max_docs: cu_seqlens padded to max_docs + 1 entries (a fixed shape for compiled models); a
            batch with more documents is refused. None: as many as it holds.
    """

    max_docs: int | None = None
    name = "flat"

    def __post_init__(self) -> None:
        if self.max_docs is not None:
            _at_least("max_docs", self.max_docs, 1, " (the documents a flat batch may hold)")


@dataclasses.dataclass(frozen=True)
class HF:
    """A dict of input_ids, labels and position_ids, as Hugging Face's
    ``DataCollatorWithFlattening`` gives them.

    Args:
        flash_attn_kwargs: also ``cu_seq_lens_q/k`` (int32) and ``max_length_q/k`` (ints).
        seq_idx: also ``seq_idx`` (int32, each token's segment).
    """

    flash_attn_kwargs: bool = False
    seq_idx: bool = False
    name = "hf"

    def extras(self) -> tuple[str, ...]:
        """The optional keys asked for, as DataCollatorWithFlattening names its options."""
        return tuple(name for name, asked in (("flash_attn_kwargs", self.flash_attn_kwargs),
                                              ("seq_idx", self.seq_idx)) if asked)


@dataclasses.dataclass(frozen=True)
class MegatronSFT:
    """A dict as Megatron-LM's SFT dataset gives a packed sample, batched: ``tokens``, ``labels``
    (the ignore label where a target is not trained on), ``loss_mask`` (float32, 0 there),
    ``position_ids`` (B, T), ``cu_seqlens`` (int32, over the flattened B * T) and ``max_seqlen``."""

    name = "megatron"


Form = Rows | Flat | HF | MegatronSFT
FORMS = {"rows": Rows, "flat": Flat, "hf": HF, "megatron": MegatronSFT}


class Preset(NamedTuple):
    """A stack's own rows and form."""

    rows: TrainRows
    form: Form


# Today's settings of each stack's own loader: nanochat's SFT/base best fit (buffer 1000, refills
# of 128 never across a row group, each rank its row groups); modded-nanogpt's (BOS-aligned rows,
# one stream dealt in steps of world_size rows, a step dropped at a shard's end, one flat row);
# Hugging Face's packing-free collator (best fit, the hf form).
PRESETS: dict[str, Preset] = {
    "nanochat": Preset(TrainRows(Packing.BESTFIT, refill=128, ranks=RankShare.GROUPS), Rows()),
    "modded": Preset(TrainRows(Packing.ALIGNED, ranks=RankShare.ROWS, shard_end=ShardEnd.DROP), Flat()),
    "hf": Preset(TrainRows(Packing.BESTFIT), HF()),
    # nanochat's SFT loader (sft_data_generator_bos_bestfit): bestfit-pad from a buffer of 100
    # conversations, dealt to ranks by its cursor.
    "nanochat-sft": Preset(TrainRows(Packing.BESTFIT_PAD, buffer_size=100, ranks=RankShare.CURSOR), Rows()),
}


def preset(name: str, **changes: Any) -> TrainRows:
    """The rows of preset ``name`` with ``changes`` (``preset("modded", max_doc_len=2048)``).

    Args:
        name: one of ``PRESETS``.
        changes: TrainRows fields to set.
    """
    if name not in PRESETS:
        raise ValueError(f"preset {name!r} is not one of {', '.join(PRESETS)}")
    return dataclasses.replace(PRESETS[name].rows, **changes)


def resolve(rows: TrainRows | EvalRows | str, form: Form | str | None) -> tuple[TrainRows | EvalRows, Form]:
    """The rows and form a ``PackedDocuments`` is given: a string names a packing or a preset (whose
    form applies unless ``form`` is given); a form's name stands for its defaults."""
    if isinstance(rows, str):
        if rows in PRESETS:
            rows, form = PRESETS[rows].rows, PRESETS[rows].form if form is None else form
        else:
            rows = TrainRows(_choice(Packing, "rows", rows))
    if isinstance(form, str):
        if form not in FORMS:
            raise ValueError(f"form {form!r} is not one of {', '.join(FORMS)}")
        form = FORMS[form]()
    if not isinstance(rows, (TrainRows, EvalRows)):
        raise TypeError(f"rows={rows!r} is not TrainRows, EvalRows, a packing or a preset ({', '.join(PRESETS)})")
    if form is None:
        form = Rows()
    if not isinstance(form, (Rows, Flat, HF, MegatronSFT)):
        raise TypeError(f"form={form!r} is not Rows(), Flat(), HF(), MegatronSFT() or one of their names")
    return rows, form
