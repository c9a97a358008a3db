"""A unit of conversations (``--chat``): records read, checked, rendered, encoded and written
with their loss masks, each conversation to the split its messages' hash chooses.

    python -m tokpack.prepare chats.jsonl --chat nanochat --encoding tok/tokenizer.json

Conversations go through a batch at a time: the run's threads encode a batch, in order, as its
renderer asks (``ChatRenderer.encode``: ids and masks laid end to end), and the writing thread
writes each run of neighbours of one split in one write a file; no text a message holds ever
becomes a special token. O(batch) memory. A record that is not a valid conversation stops the
run with one line naming it, or with ``--skip-bad`` is left out and counted.

See docs/chat.md.
"""

from __future__ import annotations

import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ...chat import ChatPieces, ChatRenderer, Encoded, messages, tools
from ...corpus import parse_record, records
from ...format import MASK_DTYPE
from ...tokenizer import encoded_batches
from ..guard import Verdicts
from ..plan import Plan, Read
from ..plan.holdout import conversation_hash, document_key
from ..plan.mixture import Mixture
from ..plan.shares import Share
from .writers import SplitWriter, split_writers


class Conversation(NamedTuple):
    """A conversation on its way through the pipeline: its pieces, the split it goes to, the input
    it is of (in a mixture), and its characters (a batch's measure)."""

    pieces: ChatPieces
    split: str
    source: int
    chars: int


def _records(plan: Plan, entries: list[Share]) -> Iterator[tuple[int, str, Any]]:
    """(input, where, record) of every record: the input its file is of, in a mixture, else 0."""
    for entry in entries:
        source = plan.mixture.source_of(entry.file) if plan.mixture is not None else 0
        for where, value in records([entry]):
            yield source, where, value


def _conversations(plan: Plan, renderer: ChatRenderer, entries: list[Share], only: str | None,
                   counts: dict[str, int], read: int, verdicts: Verdicts | None) -> Iterator[Conversation]:
    """Each conversation, rendered, with its split: ``only``, or by the hash of its messages'
    roles and contents, so the same whatever the tokenizer or rendering; where the guard moves or
    drops it (``verdicts``, by ``read``, the run's read this is, and its record's number), as it says."""
    key = document_key(plan.config.seed)
    for number, (source, where, value) in enumerate(_records(plan, entries)):
        try:
            record = parse_record(value, where, plan.read.errors)
            found, functions = messages(record, where), tools(record, where)
            pieces = renderer.pieces(found, where, functions)
        except ValueError:
            if not plan.config.skip_bad:
                raise
            counts["skipped"] += 1
            continue
        split: str | None = only
        if split is None:
            split = "val" if plan.holdout.is_val(conversation_hash(key, found)) else "train"
        if verdicts is not None and (split := verdicts.split(read, number, split)) is None:
            continue
        counts["conversations"] += 1
        yield Conversation(pieces, split, source, sum(map(len, pieces.texts)))


def tokenize_chats(plan: Plan, entries: list[Share], writers: dict[str, SplitWriter], only: str | None,
                   counts: dict[str, int], read: int, verdicts: Verdicts | None,
                   kinds: dict[str, array.array] | None = None) -> None:
    """Every conversation of ``entries`` into its split's writer (``only``: all into that split);
    ``counts`` gains the conversations read, skipped as bad, cut to ``max_tokens``, and left out
    for having nothing to train on once cut; ``kinds``, the input of each one written."""
    renderer = plan.chat
    assert renderer is not None
    workers, in_flight = plan.encoding_threads()

    def encode(batch: list[Conversation]) -> Encoded:
        return renderer.encode(plan.enc, plan.dtype, [conversation.pieces for conversation in batch])

    stream = _conversations(plan, renderer, entries, only, counts, read, verdicts)
    for batch, encoded in encoded_batches(stream, encode, workers, plan.config.piece_chars, in_flight,
                                          size=lambda conversation: conversation.chars):
        counts["cropped"] += int(np.count_nonzero(encoded.cut))
        # Cut before its first trained token, a row of it would have no loss.
        trained = encoded.trained.tolist()
        counts["unsupervised"] += trained.count(False)
        _write(batch, encoded, [c.split if t else None for c, t in zip(batch, trained)], writers, kinds)


def _write(batch: list[Conversation], encoded: Encoded, splits: list[str | None], writers: dict[str, SplitWriter],
           kinds: dict[str, array.array] | None) -> None:
    """A batch's conversations into their splits' writers (None: into none), a run of neighbours
    of one split at a time: slices of the batch's arrays, never a copy."""
    bounds, start = encoded.bounds, 0
    for end in range(1, len(batch) + 1):
        if end < len(batch) and splits[end] == splits[start]:
            continue
        split = splits[start]
        if split is not None:
            a, b = int(bounds[start]), int(bounds[end])
            writers[split].write_documents(encoded.ids[a:b], encoded.mask[a:b], bounds[start:end + 1] - a)
            if kinds is not None:
                kinds[split].extend(c.source for c in batch[start:end])
        start = end


def write_chats(plan: Plan, passes: list[Read], writers: dict[str, SplitWriter],
                counts: dict[str, Any], first_read: int, verdicts: Verdicts | None) -> None:
    """A unit's conversations into ``writers``, in input order, or, in a mixture, rendered into
    temporary files first and copied out in mixture order (``counts["mixture"]`` its report).
    ``first_read``: the run's number of the unit's first read."""
    if plan.mixture is None or plan.sharded:
        # A unit of a --processes mixture: its conversations in input order, the input of each run of
        # them recorded, and the run's process mixes every unit's at the finish (folder.mixed).
        kinds = None if plan.mixture is None else {s: array.array("I") for s in writers}
        for i, (only, entries) in enumerate(passes):
            tokenize_chats(plan, entries, writers, only, counts, first_read + i, verdicts, kinds)
        if kinds is not None:
            counts["sources"] = {split: runs(kind) for split, kind in kinds.items()}
        return
    mixture = plan.mixture
    assert mixture is not None
    staged = staging_writers(plan.out, plan.dtype, plan.enc.eot_token)
    try:
        kinds = {s: array.array("I") for s in staged}
        for i, (only, entries) in enumerate(passes):
            tokenize_chats(plan, entries, staged, only, counts, first_read + i, verdicts, kinds)
        counts["mixture"] = mix(mixture, plan.dtype, staged, kinds, writers)
    finally:
        for writer in staged.values():
            writer.discard()


def runs(kinds: array.array) -> list[list[int]]:
    """Each conversation's input, as [input, conversations] runs: a unit reads its inputs in order,
    so a run a file, whatever the conversations."""
    out: list[list[int]] = []
    for kind in kinds:
        if out and out[-1][0] == kind:
            out[-1][1] += 1
        else:
            out.append([kind, 1])
    return out


CHAT_COUNTS = ("conversations", "skipped", "cropped", "unsupervised")


def chat_counts() -> dict[str, Any]:
    """A unit's counts of conversations, as its record and meta.json keep them."""
    return dict.fromkeys(CHAT_COUNTS, 0)


UNMIXED = "{split}.unmixed"  # the name the rendered conversations are held at, temporary


def staging_writers(out: Path, dtype: np.dtype, eot_token: int) -> dict[str, SplitWriter]:
    """A writer a split in ``out`` for the conversations before they are mixed, at temporary names
    only."""
    def staged(split: str) -> SplitWriter:
        held = UNMIXED.format(split=split)
        return SplitWriter(out, split, dtype, "none", eot_token, None, f"{held}.idx", f"{held}.bin", masked=True,
                           mask_name=f"{held}.mask")

    return split_writers(staged)


def _read(writer: SplitWriter, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A closed staging writer's tokens and mask (mapped) and its conversations' starts and ends."""
    if not writer.tokens:
        empty = np.zeros(0, np.int64)
        return np.zeros(0, dtype), np.zeros(0, MASK_DTYPE), np.stack([empty, empty])
    tokens = np.memmap(writer.bin.tmp, dtype=dtype, mode="r")  # type: ignore[union-attr]
    mask = np.memmap(writer.mask.tmp, dtype=MASK_DTYPE, mode="r")  # type: ignore[union-attr]
    starts = np.fromfile(writer.idx.tmp, dtype="<u8").astype(np.int64)
    return tokens, mask, np.stack([starts, np.append(starts[1:], len(tokens))])


def mix(mixture: Mixture, dtype: np.dtype, staged: dict[str, SplitWriter], kinds: dict[str, array.array],
        writers: dict[str, SplitWriter]) -> dict[str, Any]:
    """Each split's staged conversations (tokens of ``dtype``) into its writer in mixture order;
    meta.json's report: each input's epochs and, split by split, its conversations, tokens and
    supervised tokens written, and its share of the supervised tokens."""
    report: dict[str, Any] = {"seed": mixture.seed, "inputs": [{"input": n, "epochs": e} for n, e in
                                                                 zip(mixture.names, mixture.epochs)]}
    for split, held in staged.items():
        held.close()
        tokens, mask, (starts, ends) = _read(held, dtype)
        source = np.frombuffer(kinds[split], dtype=np.uint32) if len(kinds[split]) else np.zeros(0, np.uint32)
        tally = np.zeros((len(mixture.names), 3), dtype=np.int64)  # conversations, tokens, supervised
        out = writers[split]
        for doc in mixture.order(source):
            a, b = starts[doc], ends[doc]
            out.start_document(int(b - a))
            out.write(tokens[a:b], mask[a:b])
            out.end_document()
            tally[source[doc]] += (1, b - a, np.count_nonzero(mask[a:b]))
        total = max(1, int(tally[:, 2].sum()))
        for entry, (conversations, count, supervised) in zip(report["inputs"], tally.tolist()):
            entry[split] = {"conversations": conversations, "tokens": count, "supervised": supervised,
                            "supervised_share": round(supervised / total, 6)}
    return report
