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
from typing import Any, NamedTuple

import numpy as np

from ...chat import ChatPieces, ChatRenderer, Encoded, messages, tools
from ...corpus import parse_record, records
from ...tokenizer import encoded_batches
from ..guard.placement import Placement
from ..plan import Plan, Read
from ..plan.holdout import conversation_hash, document_key
from ..plan.shares import Share
from .writers import SplitWriter


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
                   counts: dict[str, int], read: int, placement: Placement | None) -> Iterator[Conversation]:
    """Each conversation, rendered, with its split: ``only``, or by the hash of its messages'
    roles and contents, so the same whatever the tokenizer or rendering; where the guard moves or
    drops it (``placement``, by ``read``, the run's read this is, and its record's number), as it says."""
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
        if placement is not None and (split := placement.split(read, number, split)) is None:
            continue
        counts["conversations"] += 1
        yield Conversation(pieces, split, source, sum(map(len, pieces.texts)))


def tokenize_chats(plan: Plan, entries: list[Share], writers: dict[str, SplitWriter], only: str | None,
                   counts: dict[str, int], read: int, placement: Placement | None,
                   kinds: dict[str, array.array] | None = None) -> None:
    """Every conversation of ``entries`` into its split's writer (``only``: all into that split);
    ``counts`` gains the conversations read, skipped as bad, cut to ``max_tokens``, and left out
    for having nothing to train on once cut; ``kinds``, the input of each one written."""
    renderer = plan.chat
    assert renderer is not None
    workers, in_flight = plan.encoding_threads()

    def encode(batch: list[Conversation]) -> Encoded:
        return renderer.encode(plan.enc, plan.dtype, [conversation.pieces for conversation in batch])

    stream = _conversations(plan, renderer, entries, only, counts, read, placement)
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


def write_chats(plan: Plan, passes: list[Read], writers: dict[str, SplitWriter], counts: dict[str, Any],
                first_read: int, placement: Placement | None) -> None:
    """A unit's conversations into ``writers``, in input order; in a mixture, the input of each
    run of them in ``counts["sources"]``: the finish copies them out in mixture order
    (``publish.folder.mixed``). ``first_read``: the run's number of the unit's first read."""
    kinds = None if plan.mixture is None else {s: array.array("I") for s in writers}
    for i, (only, entries) in enumerate(passes):
        tokenize_chats(plan, entries, writers, only, counts, first_read + i, placement, kinds)
    if kinds is not None:
        counts["sources"] = {split: runs(kind) for split, kind in kinds.items()}


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
