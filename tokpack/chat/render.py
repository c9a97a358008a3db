"""What every rendering hands the prepare pipeline: a conversation as pieces of text to encode,
led by special tokens placed by id, and the one way a batch of conversations becomes their ids
and loss masks (``encode_conversations``: O(batch) time and memory).

See docs/chat.md.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from ..format import MASK_DTYPE

if TYPE_CHECKING:
    from ..tokenizer import Encoder


class Renderer(StrEnum):
    """How a conversation becomes tokens."""

    NONE = "none"  #: the inputs are text, not conversations
    NANOCHAT = "nanochat"  #: nanochat's rendering, with its nine special tokens
    TEMPLATE = "template"  #: the tokenizer's own chat template, as transformers renders it


class ChatPiece(NamedTuple):
    """One text of a conversation to encode, led by special tokens (``lead``, with their masks); a
    conversation is a list of them. Its tokens' mask is ``mask``, or, where ``spans`` is given, 1
    on each token whose bytes overlap one of these byte ranges of the text and 0 elsewhere. A
    ``marked`` piece is a whole conversation with its special tokens written in its text, for
    ``Encoder.encode_marked``: ``lead`` lists their ids in order, and its renderer masks it."""

    text: str
    mask: int
    lead: list[int]
    lead_mask: list[int]
    spans: tuple[tuple[int, int], ...] | None = None
    marked: bool = False


class Encoded(NamedTuple):
    """A batch of conversations as tokens: their ids (of the split's dtype) and masks laid end to
    end, where each starts (``len + 1`` offsets, the last their end), whether each was cut to the
    renderer's ``max_tokens``, and whether each has a token to train on."""

    ids: np.ndarray
    mask: np.ndarray
    bounds: np.ndarray
    cut: np.ndarray
    trained: np.ndarray


class ChatRenderer(Protocol):
    """A rendering: a checked conversation's pieces, and a batch of conversations' ids and masks."""

    def pieces(self, found: list[dict[str, Any]], where: str) -> list[ChatPiece]:
        """The pieces of one conversation's checked messages (``where`` names it in errors)."""
        ...

    def encode(self, enc: Encoder, dtype: np.dtype, batch: list[list[ChatPiece]]) -> Encoded:
        """Many conversations' ids (as ``dtype``) and masks, in order, each cut to the renderer's
        ``max_tokens``; called in the pipeline's encoding threads."""
        ...

    def describe(self) -> dict[str, Any]:
        """What meta.json records of the rendering."""
        ...


class Vocabulary(Protocol):
    """What a rendering asks of a tokenizer: its special tokens, and each token's bytes."""

    n_vocab: int
    specials: dict[str, int]

    def token_bytes(self, token: int) -> bytes:
        ...


def encode_pieces(enc: Encoder, pieces: list[ChatPiece]) -> list[list[int]]:
    """Each piece's text encoded as ordinary text, as lists: a conversation in pieces is
    assembled from a handful of short texts, cheaper as lists."""
    if enc.parallel:
        return [ids.tolist() for ids in enc.encode_batch([p.text for p in pieces])]
    return [enc.encode_ordinary(p.text) for p in pieces]


Masks = Callable[[np.ndarray, list[tuple[int, int]], list["ChatPiece"]], np.ndarray]
Assemble = Callable[[list[tuple["ChatPiece", list[int]]]], tuple[np.ndarray, np.ndarray]]


def encode_conversations(enc: Encoder, dtype: np.dtype, batch: list[list[ChatPiece]], marks: frozenset[str],
                         masks: Masks, assemble: Assemble, max_tokens: int) -> Encoded:
    """A batch of conversations encoded, in order, and each cut to ``max_tokens`` (0: none cut).
    The marked ones all in one ``encode_marked`` call (an encoding thread takes the GIL back once
    a batch, not once a conversation); ``masks`` gives the mask of their ids laid end to end, from
    each piece's range of them. Their special tokens must come out as their ``lead`` lists them, or
    nothing is written (``Marks`` vouches for it: a difference is a bug). The others' pieces are
    encoded by ``encode_pieces`` and made a conversation each by ``assemble``."""
    marked = [conversation[0] for conversation in batch if conversation[0].marked]
    ids, mask, bounds = _encode_marked(enc, marked, marks, masks)
    if len(marked) < len(batch):
        ids, mask, bounds = _with_pieces(enc, batch, ids, mask, bounds, assemble)
    ids, mask, bounds, cut = crop(ids, mask, bounds, max_tokens)
    lengths = np.diff(bounds)
    trained = np.zeros(len(batch), dtype=bool)
    filled = lengths > 0
    if filled.any():
        trained[filled] = np.logical_or.reduceat(mask.view(bool), bounds[:-1][filled])
    # Cast once a batch, here: a cast a conversation in the writing thread would let other threads
    # take the GIL, and taking it back waits out their turn.
    return Encoded(ids.astype(dtype, copy=False), mask, bounds, cut, trained)


def _encode_marked(enc: Encoder, marked: list[ChatPiece], marks: frozenset[str],
                   masks: Masks) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ids, masks and offsets of whole conversations written with their marks."""
    if not marked:
        return np.zeros(0, dtype=np.uint32), np.zeros(0, dtype=MASK_DTYPE), np.zeros(1, dtype=np.int64)
    ids, bounds = enc.encode_marked([p.text for p in marked], marks, [len(p.lead) for p in marked])
    written = np.fromiter(itertools.chain.from_iterable(p.lead for p in marked), dtype=np.int64)
    at = np.flatnonzero(_table(frozenset(enc.specials[m] for m in marks)).take(ids, mode="clip"))
    if not np.array_equal(ids[at], written):
        raise ValueError(f"{enc.name} read the special tokens of a batch of conversations otherwise than they were "
                         "written; this is a bug: report it, with the tokenizer")
    mask = masks(ids, list(zip(bounds[:-1].tolist(), bounds[1:].tolist())), marked)
    return ids, mask.view(MASK_DTYPE), bounds


def _with_pieces(enc: Encoder, batch: list[list[ChatPiece]], ids: np.ndarray, mask: np.ndarray, bounds: np.ndarray,
                 assemble: Assemble) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The batch laid end to end: its marked conversations from ``ids``, ``mask`` and ``bounds``,
    the others made of their pieces."""
    plain = iter(encode_pieces(enc, [piece for conversation in batch if not conversation[0].marked
                                     for piece in conversation]))
    parts, marked = [], 0
    for conversation in batch:
        if conversation[0].marked:
            a, b = int(bounds[marked]), int(bounds[marked + 1])
            parts.append((ids[a:b], mask[a:b]))
            marked += 1
        else:
            parts.append(assemble([(piece, next(plain)) for piece in conversation]))
    out = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(i) for i, _ in parts], out=out[1:])
    return (np.concatenate([i.astype(np.int64, copy=False) for i, _ in parts]),
            np.concatenate([m.astype(MASK_DTYPE, copy=False) for _, m in parts]), out)


@functools.lru_cache(maxsize=8)
def _table(ids: frozenset[int]) -> np.ndarray:
    """Whether each id up to the highest of ``ids`` is one of them, and a last place (False) for
    every id past them: one lookup an id, where a set test costs a sort."""
    table = np.zeros(max(ids) + 2, dtype=bool)
    table[list(ids)] = True
    return table


def token_sizes(vocab: Vocabulary) -> np.ndarray:
    """Each token's length in bytes (0 for an id the vocabulary leaves unused); a special
    token's is its text's, as a rendered conversation spells it."""
    sizes = np.zeros(vocab.n_vocab, dtype=np.int64)
    for token in range(vocab.n_vocab):
        try:
            sizes[token] = len(vocab.token_bytes(token))
        except KeyError:
            pass
    for name, token in vocab.specials.items():
        sizes[token] = len(name.encode("utf-8"))
    return sizes


def overlapping(ids: Any, ranges: list[tuple[int, int]], pieces: list[ChatPiece], sizes: np.ndarray) -> np.ndarray:
    """Whether each of ``ids`` (pieces' tokens laid end to end, piece i's at ``ranges[i]``)
    overlaps one of its piece's ``spans`` (byte ranges of its text, in order, apart): every
    piece's spans moved to where its bytes start, found in one pass. The tokens must spell each
    piece's text byte for byte."""
    size = sizes[np.asarray(ids, dtype=np.int64)]
    ends = np.cumsum(size)
    starts = ends - size
    spans = []
    for (a, b), piece in zip(ranges, pieces):
        first, spelled = (int(starts[a]), int(ends[b - 1] - starts[a])) if a < b else (0, 0)
        if spelled != len(piece.text.encode("utf-8", "surrogatepass")):
            raise ValueError("--chat template needs a tokenizer whose tokens spell their text byte for byte (a "
                             f"byte-level BPE) to find the assistant's tokens; this one spells {piece.text[:40]!r} "
                             "otherwise")
        spans += [(lo + first, hi + first) for lo, hi in piece.spans or ()]
    lo, hi = np.array(spans, dtype=np.int64).reshape(-1, 2).T
    after = np.searchsorted(hi, starts, side="right")  # the first span ending after each token starts
    inside = after < len(hi)
    inside[inside] = lo[after[inside]] < ends[inside]
    return inside


def assemble(encoded: list[tuple[ChatPiece, list[int]]],
             sizes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A conversation's ids and mask from its pieces and their tokens; ``sizes`` (each token's
    bytes) places a piece's spans."""
    ids: list[int] = []
    mask: list[int] = []
    for piece, tokens in encoded:
        ids += piece.lead
        ids += tokens
        mask += piece.lead_mask
        if piece.spans is None:
            mask += [piece.mask] * len(tokens)
        else:
            assert sizes is not None
            mask += overlapping(tokens, [(0, len(tokens))], [piece], sizes).tolist()
    return np.array(ids, dtype=np.int64), np.array(mask, dtype=MASK_DTYPE)


def crop(ids: np.ndarray, mask: np.ndarray, bounds: np.ndarray,
         max_tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Conversations laid end to end (the i-th at ``bounds[i]:bounds[i + 1]``) each cut to
    ``max_tokens`` (0: none cut): their ids, masks and offsets, and whether each was cut."""
    lengths = np.diff(bounds)
    cut = lengths > max_tokens if max_tokens else np.zeros(len(lengths), dtype=bool)
    if not cut.any():
        return ids, mask, bounds, cut
    keep = np.ones(len(ids), dtype=bool)
    for i in np.flatnonzero(cut).tolist():
        keep[bounds[i] + max_tokens:bounds[i + 1]] = False
    out = np.zeros(len(bounds), dtype=np.int64)
    np.cumsum(np.minimum(lengths, max_tokens), out=out[1:])
    return ids[keep], mask[keep], out, cut


class Marks:
    """Whether texts may stand between marked special tokens without changing how they are read:
    the check before a conversation is encoded by ``Encoder.encode_marked``.

    A text is safe when it holds no special token's text and does not end with the start of one
    (which would run on into the mark after it); the tokenizer's special tokens must not start
    one another (else one could be read where the other was meant). O(text) per check: one
    regex search, in C, of the texts joined by a character no special token holds.

    Args:
        specials: every special token of the tokenizer, by text.
    """

    def __init__(self, specials: dict[str, int]):
        names = sorted(specials, key=len, reverse=True)
        self.usable = bool(names) and not any(a != b and b.startswith(a) for a in names for b in names)
        self._gap = next(chr(c) for c in range(0x110000) if not any(chr(c) in name for name in names))
        starts = sorted({name[:k] for name in names for k in range(1, len(name))}, key=len, reverse=True)
        # A special token anywhere, or the start of one just before a text's end (the gap after it).
        # A text holding the gap character may be found unsafe where it is not: it is then encoded
        # in pieces, which is never wrong, only slower.
        self._unsafe = re.compile("|".join(map(re.escape, names)) + (
            f"|(?:{'|'.join(map(re.escape, starts))})(?={re.escape(self._gap)})" if starts else "")) if names else None

    def safe(self, texts: list[str]) -> bool:
        """Whether every one of ``texts`` may stand between marks."""
        if not self.usable:
            return False
        assert self._unsafe is not None
        return self._unsafe.search(self._gap.join(texts) + self._gap) is None
