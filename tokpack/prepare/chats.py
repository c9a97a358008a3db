"""A unit of conversations (``--chat``): records read, checked, rendered, encoded and written
with their loss masks, each conversation to the split its messages' hash chooses.

    python -m tokpack.prepare chats.jsonl --chat nanochat --encoding tok/tokenizer.json

The texts of many conversations are encoded together, in order, by the run's threads (as
documents are); special tokens are placed by id, so no text becomes one. A conversation is held
whole while it is assembled: O(conversation) memory beside the pipeline's batches. A record that
is not a valid conversation stops the run with one line naming it, or with ``--skip-bad`` is
left out and counted.

See docs/chat.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from ..chat import ChatPiece, ChatRenderer, messages
from ..corpus import parse_record, records
from ..tokenizer import encode_in_order
from .cluster import Entry
from .config import Plan
from .holdout import document_hash, document_key
from .writers import SplitWriter


def _pieces(plan: Plan, renderer: ChatRenderer, entries: list[Entry], counts: dict[str, int],
            splits: dict[int, str]) -> Iterator[ChatPiece]:
    """Each conversation's pieces; ``splits`` gains its split, by the hash of its messages (so the
    same whatever the tokenizer or rendering)."""
    key = document_key(plan.config.seed)
    for where, value in records(entries):
        try:
            found = messages(parse_record(value, where, plan.read.errors), where)
            pieces = renderer.pieces(found, counts["conversations"], where)
        except ValueError:
            if not plan.config.skip_bad:
                raise
            counts["skipped"] += 1
            continue
        digest = document_hash(key)
        digest.update(json.dumps(found, ensure_ascii=False, sort_keys=True).encode("utf-8", "surrogatepass"))
        splits[counts["conversations"]] = "val" if plan.holdout.is_val(digest.digest()) else "train"
        yield from pieces
        counts["conversations"] += 1


def tokenize_chats(plan: Plan, entries: list[Entry], writers: dict[str, SplitWriter], only: str | None,
                   counts: dict[str, int]) -> None:
    """Every conversation of ``entries`` into its split's writer (``only``: all into that split);
    ``counts`` gains the conversations read, skipped as bad, cut to ``max_tokens``, and left out
    for having nothing to train on once cut."""
    renderer = plan.chat
    assert renderer is not None
    enc = plan.enc

    def encode(texts: list[str]) -> list[list[int]]:
        # Lists: a conversation is assembled from a handful of short texts, cheaper as lists.
        if enc.parallel:
            return [ids.tolist() for ids in enc.encode_batch(texts)]
        return [enc.encode_ordinary(text) for text in texts]

    workers, in_flight = plan.encoding_threads()
    splits: dict[int, str] = {}
    held: list[tuple[ChatPiece, list[int]]] = []
    for piece, tokens in encode_in_order(_pieces(plan, renderer, entries, counts, splits), encode, workers,
                                         plan.config.piece_chars, in_flight):
        held.append((piece, tokens))
        if not piece.last:
            continue
        ids, mask, cut = renderer.assemble(held, plan.dtype)
        split = only or splits.pop(piece.doc)
        held = []
        counts["cropped"] += cut
        if not mask.any():  # cut before its first trained token: a row of it would have no loss
            counts["unsupervised"] += 1
            continue
        writer = writers[split]
        writer.start_document(len(ids))
        writer.write(ids, mask)
        writer.end_document()


CHAT_COUNTS = ("conversations", "skipped", "cropped", "unsupervised")


def chat_counts() -> dict[str, Any]:
    """A unit's counts of conversations, as its record and meta.json keep them."""
    return dict.fromkeys(CHAT_COUNTS, 0)
