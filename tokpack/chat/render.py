"""What every rendering hands the prepare pipeline: a conversation as pieces of text to encode,
led by special tokens placed by id, and the one way pieces and their tokens become a
conversation's ids and loss mask.

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
    """One text of a conversation to encode, led by special tokens (``lead``, with their masks);
    ``last`` ends the conversation ``doc``. Its tokens' mask is ``mask``, or, where ``spans`` is
    given, 1 on each token whose bytes overlap one of these byte ranges of the text and 0 elsewhere.
    A ``marked`` piece is a whole conversation with its special tokens written in its text, for
    ``Encoder.encode_marked``: ``lead`` lists their ids in order, and its renderer masks it."""

    doc: int
    text: str
    mask: int
    lead: list[int]
    lead_mask: list[int]
    last: bool = False
    spans: tuple[tuple[int, int], ...] | None = None
    marked: bool = False


class ChatRenderer(Protocol):
    """A rendering: a checked conversation's pieces, their tokens, and its ids and mask from them."""

    def pieces(self, found: list[dict[str, Any]], doc: int, where: str) -> list[ChatPiece]:
        """The pieces of one conversation's checked messages (``where`` names it in errors)."""
        ...

    def encode(self, enc: Encoder, dtype: np.dtype, batch: list[ChatPiece]) -> list[Any]:
        """The tokens of each piece of ``batch`` (many conversations' pieces, in order), as
        ``assemble`` takes them (as ``dtype`` where it can); called in the pipeline's encoding
        threads."""
        ...

    def assemble(self, encoded: list[tuple[ChatPiece, Any]],
                 dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, bool]:
        """A conversation's ids (of ``dtype``) and mask from its pieces and their tokens, cut to
        its ``max_tokens``; and whether it was cut."""
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


def encode_conversations(enc: Encoder, dtype: np.dtype, batch: list[ChatPiece], marks: frozenset[str],
                         masks: Masks) -> list[Any]:
    """A batch's pieces encoded, in order: plain ones by ``encode_pieces``; marked ones as (ids
    of ``dtype``, mask), all in one ``encode_marked`` call (an encoding thread takes the GIL back
    once a batch, not once a conversation); ``masks`` gives the mask of their ids laid end to
    end, from each piece's range of them. Their special tokens must come out as their ``lead``
    lists them, or nothing is written (``Marks`` vouches for it: a difference is a bug)."""
    marked = [p for p in batch if p.marked]
    plain = iter(encode_pieces(enc, [p for p in batch if not p.marked]))
    if not marked:
        return list(plain)
    ids, bounds = enc.encode_marked([p.text for p in marked], marks, [len(p.lead) for p in marked])
    written = np.fromiter(itertools.chain.from_iterable(p.lead for p in marked), dtype=np.int64)
    at = np.flatnonzero(_table(frozenset(enc.specials[m] for m in marks)).take(ids, mode="clip"))
    if not np.array_equal(ids[at], written):
        raise ValueError(f"{enc.name} read the special tokens of a batch of conversations otherwise than they were "
                         "written; this is a bug: report it, with the tokenizer")
    ranges = list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
    mask, spans = masks(ids, ranges, marked), iter(ranges)
    # Cast once a batch, here: a cast a conversation in the writing thread lets other threads take
    # the GIL, and taking it back waits out their turn.
    ids = ids.astype(dtype, copy=False)
    out = []
    for piece in batch:
        if piece.marked:
            a, b = next(spans)
            out.append((ids[a:b], mask[a:b]))
        else:
            out.append(next(plain))
    return out


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


def assemble(encoded: list[tuple[ChatPiece, Any]], dtype: np.dtype, max_tokens: int,
             sizes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, bool]:
    """A conversation's ids and mask from its pieces and their tokens (a marked piece's: its ids
    and mask), cut to ``max_tokens`` (0: none cut), and whether it was cut; ``sizes`` (each
    token's bytes) places a piece's spans."""
    if len(encoded) == 1 and encoded[0][0].marked:
        return crop(*encoded[0][1], max_tokens, dtype)
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
    return crop(np.array(ids, dtype=dtype), np.array(mask, dtype=MASK_DTYPE), max_tokens, dtype)


def crop(ids: np.ndarray, mask: np.ndarray, max_tokens: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, bool]:
    """A conversation's ids (as ``dtype``) and mask cut to ``max_tokens`` (0: none cut), and whether it was."""
    cut = bool(max_tokens) and len(ids) > max_tokens
    if cut:
        ids, mask = ids[:max_tokens], mask[:max_tokens]
    return ids.astype(dtype, copy=False), mask.astype(MASK_DTYPE, copy=False), cut


class Marks:
    """Whether texts may stand between marked special tokens without changing how they are read:
    the check before a conversation is encoded by ``Encoder.encode_marked``.

    A text is safe when it holds no special token's text and does not end with the start of one
    (which would run on into the mark after it); the tokenizer's special tokens must not start
    one another (else one could be read where the other was meant). O(text) per check, in C but
    for the few places near a text's end where a special token's first character stands.

    Args:
        specials: every special token of the tokenizer, by text.
    """

    def __init__(self, specials: dict[str, int]):
        names = sorted(specials, key=len, reverse=True)
        self.usable = bool(names) and not any(a != b and b.startswith(a) for a in names for b in names)
        # Texts are searched joined by a character no special token holds, so no match spans two.
        self._gap = next(chr(c) for c in range(0x110000) if not any(chr(c) in name for name in names))
        self._inside = re.compile("|".join(map(re.escape, names))) if names else None
        self._starts = frozenset(name[:k] for name in names for k in range(1, len(name)))
        self._firsts = "".join(sorted({name[0] for name in names}))
        self._tail = max(map(len, names), default=1) - 1

    def safe(self, texts: list[str]) -> bool:
        """Whether every one of ``texts`` may stand between marks."""
        if not self.usable:
            return False
        assert self._inside is not None
        if self._inside.search(self._gap.join(texts)):
            return False
        starts = self._starts
        for text in texts:
            tail = text[-self._tail:] if self._tail else ""
            for first in self._firsts:
                at = tail.find(first)
                while at >= 0:
                    if tail[at:] in starts:
                        return False
                    at = tail.find(first, at + 1)
        return True
