"""What every rendering hands the prepare pipeline: a conversation as pieces of text to encode,
led by special tokens placed by id, and the one way pieces and their tokens become a
conversation's ids and loss mask.

See docs/chat.md.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, NamedTuple, Protocol

import numpy as np

from ..format import MASK_DTYPE


class Renderer(StrEnum):
    """How a conversation becomes tokens."""

    NONE = "none"  #: the inputs are text, not conversations
    NANOCHAT = "nanochat"  #: nanochat's rendering, with its nine special tokens
    TEMPLATE = "template"  #: the tokenizer's own chat template, as transformers renders it


class ChatPiece(NamedTuple):
    """One text of a conversation to encode, led by special tokens (``lead``, with their masks);
    ``last`` ends the conversation ``doc``. Its tokens' mask is ``mask``, or, where ``spans`` is
    given, 1 on each token whose bytes overlap one of these byte ranges of the text and 0 elsewhere."""

    doc: int
    text: str
    mask: int
    lead: list[int]
    lead_mask: list[int]
    last: bool = False
    spans: tuple[tuple[int, int], ...] | None = None


class ChatRenderer(Protocol):
    """A rendering: a checked conversation's pieces, and its ids and mask from their tokens."""

    def pieces(self, found: list[dict[str, Any]], doc: int, where: str) -> list[ChatPiece]:
        """The pieces of one conversation's checked messages (``where`` names it in errors)."""
        ...

    def assemble(self, encoded: list[tuple[ChatPiece, list[int]]],
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


def token_sizes(vocab: Vocabulary) -> np.ndarray:
    """Each token's length in bytes (0 for an id the vocabulary leaves unused)."""
    sizes = np.zeros(vocab.n_vocab, dtype=np.int64)
    for token in range(vocab.n_vocab):
        try:
            sizes[token] = len(vocab.token_bytes(token))
        except KeyError:
            pass
    return sizes


def _overlapping(tokens: list[int], spans: tuple[tuple[int, int], ...], sizes: np.ndarray, text: str) -> list[int]:
    """1 for each token whose bytes overlap a span (in order, apart), else 0: the tokens must spell the text."""
    size = sizes[np.asarray(tokens, dtype=np.int64)]
    ends = np.cumsum(size)
    if (int(ends[-1]) if len(ends) else 0) != len(text.encode("utf-8", "surrogatepass")):
        raise ValueError("--chat template needs a tokenizer whose tokens spell their text byte for byte (a byte-level "
                         f"BPE) to find the assistant's tokens; this one spells {text[:40]!r} otherwise")
    lo, hi = np.array(spans, dtype=np.int64).reshape(-1, 2).T
    first = np.searchsorted(hi, ends - size, side="right")  # the first span ending after each token starts
    inside = first < len(hi)
    inside[inside] = lo[first[inside]] < ends[inside]
    return inside.astype(int).tolist()


def assemble(encoded: list[tuple[ChatPiece, list[int]]], dtype: np.dtype, max_tokens: int,
             sizes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, bool]:
    """A conversation's ids and mask from its pieces and their tokens, cut to ``max_tokens`` (0:
    none cut), and whether it was cut; ``sizes`` (each token's bytes) places a piece's spans."""
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
            mask += _overlapping(tokens, piece.spans, sizes, piece.text)
    cut = bool(max_tokens) and len(ids) > max_tokens
    if cut:
        ids, mask = ids[:max_tokens], mask[:max_tokens]
    return np.array(ids, dtype=dtype), np.array(mask, dtype=MASK_DTYPE), cut
