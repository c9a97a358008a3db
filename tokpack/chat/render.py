"""What every rendering hands the prepare pipeline: a conversation as pieces of text to encode,
led by special tokens placed by id, and the one way a batch of conversations becomes their ids
and loss masks (``encode_conversations``: O(batch) time and memory).

See docs/chat.md.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable, Iterator
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from ..format import MASK_DTYPE
from ..tokenizer.specials import with_leads

if TYPE_CHECKING:
    from ..tokenizer import Encoder


class Renderer(StrEnum):
    """How a conversation becomes tokens."""

    NONE = "none"  #: the inputs are text, not conversations
    NANOCHAT = "nanochat"  #: nanochat's rendering, with its nine special tokens
    TEMPLATE = "template"  #: the tokenizer's own chat template, as transformers renders it


class PieceMask(NamedTuple):
    """How a rendering masks one text of a conversation and the special tokens before it: ``lead``
    a value each; the text's tokens ``value``, or, where ``spans`` is given, 1 on each token whose
    bytes overlap one of these byte ranges of the text and 0 elsewhere."""

    lead: list[int]
    value: int
    spans: tuple[tuple[int, int], ...] | None = None


class ChatPieces(NamedTuple):
    """A conversation as the pipeline encodes it: its texts, each encoded as ordinary text and led
    by special tokens placed by id (``leads``, their ids); or, ``marked``, one text with its
    special tokens written in it (``leads[0]``: their ids in order), for ``Encoder.encode_marked``.
    ``masks``: a ``PieceMask`` a text, or None where the renderer masks from the ids alone."""

    texts: list[str]
    leads: list[list[int]]
    masks: list[PieceMask] | None = None
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

    def pieces(self, found: list[dict[str, Any]], where: str, tools: list[Any] | None = None) -> ChatPieces:
        """One conversation's checked messages, and its tools where it has some, rendered
        (``where`` names it in errors)."""
        ...

    def encode(self, enc: Encoder, dtype: np.dtype, batch: list[ChatPieces]) -> Encoded:
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
    normal_form: str | None

    def token_bytes(self, token: int) -> bytes:
        ...


# A batch's masks, from its ids laid end to end, where each text's lead, text and end are in them
# (one row a text, the conversations' texts in order), and the conversations.
Masks = Callable[[np.ndarray, np.ndarray, list["ChatPieces"]], np.ndarray]
_EMPTY = (np.zeros(0, dtype=np.uint32), np.zeros(0, dtype=MASK_DTYPE), np.zeros(1, dtype=np.int64))


def encode_conversations(enc: Encoder, dtype: np.dtype, batch: list[ChatPieces], marks: frozenset[str],
                         masks: Masks, max_tokens: int) -> Encoded:
    """A batch of conversations encoded, in order, and each cut to ``max_tokens`` (0: none cut):
    the marked ones in one ``encode_marked`` call, every text of the others in one
    ``encode_flat`` call with the special tokens placed between by id (an encoding thread takes
    the GIL back once a batch, not once a conversation); ``masks`` masks them."""
    kinds = [conversation.marked for conversation in batch]
    marked = _encode_marked(enc, [c for c, m in zip(batch, kinds) if m], marks, masks)
    plain = _encode_pieces(enc, [c for c, m in zip(batch, kinds) if not m], masks)
    ids, mask, bounds, cut = crop(*_in_order(kinds, marked, plain), max_tokens)
    lengths = np.diff(bounds)
    trained = np.zeros(len(batch), dtype=bool)
    filled = lengths > 0
    if filled.any():
        trained[filled] = np.logical_or.reduceat(mask.view(bool), bounds[:-1][filled])
    # Cast once a batch, here: a cast a conversation in the writing thread would let other threads
    # take the GIL, and taking it back waits out their turn.
    return Encoded(ids.astype(dtype, copy=False), mask, bounds, cut, trained)


def _encode_marked(enc: Encoder, marked: list[ChatPieces], marks: frozenset[str],
                   masks: Masks) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ids, masks and offsets of whole conversations written with their marks. Their special
    tokens must come out as their ``leads`` list them, or nothing is written (``specials_apart``
    vouches for it: a difference is a bug)."""
    if not marked:
        return _EMPTY
    texts = [c.texts[0] for c in marked]
    if sum(map(len, texts)) > CHUNK_CHARS:
        # Every special token's text in a marked conversation is the template's, and the text
        # after a special token is encoded apart from what comes before it: a cut right before one
        # leaves the tokens as they are (a million short turns in one call took 3.6 GB).
        from ..tokenizer import safe_cut

        written = re.compile("|".join(map(re.escape, sorted(marks, key=len, reverse=True))))

        def before_special(text: str, lo: int, hi: int) -> int:  # else inside a long message, where one can
            found = written.search(text, lo, hi)
            return found.start() if found else safe_cut(text, lo, hi) if enc.can_cut else -1

        ids, bounds = _in_chunks(enc, texts, lambda chunks: enc.encode_marked(chunks, marks), before_special)
    else:
        ids, bounds = enc.encode_marked(texts, marks, [len(c.leads[0]) for c in marked])
    written = np.fromiter(itertools.chain.from_iterable(c.leads[0] for c in marked), dtype=np.int64)
    at = np.flatnonzero(looked_up(_table(frozenset(enc.specials[m] for m in marks)), ids, clip=True))
    if not np.array_equal(ids[at], written):
        raise ValueError(f"{enc.name} read the special tokens of a batch of conversations otherwise than they were "
                         "written; this is a bug: report it, with the tokenizer")
    layout = np.stack([bounds[:-1], bounds[:-1], bounds[1:]], axis=1)
    return ids, masks(ids, layout, marked).view(MASK_DTYPE), bounds


def _encode_pieces(enc: Encoder, conversations: list[ChatPieces],
                   masks: Masks) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ids, masks and offsets of conversations in pieces: every text encoded as ordinary
    text, its lead's ids before it."""
    texts = list(itertools.chain.from_iterable(conversation.texts for conversation in conversations))
    if not texts:
        return _EMPTY
    leads = list(itertools.chain.from_iterable(conversation.leads for conversation in conversations))
    long = sum(map(len, texts)) > CHUNK_CHARS
    ids, layout = with_leads(*(_in_chunks(enc, texts, enc.encode_flat) if long else enc.encode_flat(texts)), leads)
    mask = masks(ids, layout, conversations).view(MASK_DTYPE)
    last = np.cumsum(np.fromiter((len(c.texts) for c in conversations), dtype=np.int64, count=len(conversations)))
    return ids, mask, np.concatenate(([0], layout[last - 1, 2]))


def _in_order(kinds: list[bool], marked: tuple[np.ndarray, np.ndarray, np.ndarray],
              plain: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The batch's conversations in order, from its marked ones (where ``kinds``) and its others."""
    if all(kinds) or not any(kinds):
        return marked if kinds and kinds[0] else plain
    ids, mask, bounds, taken = [], [], [0], [0, 0]
    for kind in kinds:
        source, i = (marked, 0) if kind else (plain, 1)
        a, b = int(source[2][taken[i]]), int(source[2][taken[i] + 1])
        taken[i] += 1
        ids.append(source[0][a:b])
        mask.append(source[1][a:b])
        bounds.append(bounds[-1] + b - a)
    return np.concatenate(ids), np.concatenate(mask), np.array(bounds, dtype=np.int64)


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


LOOKUP = 1 << 20  # tokens looked up at a time, and characters encoded at a time to count their bytes


def utf8_size(text: str, lo: int = 0, hi: int | None = None) -> int:
    """The UTF-8 bytes of ``text[lo:hi]`` (lone surrogates as 3 bytes), counted a slice at a time:
    a message of hundreds of MB is not copied and encoded whole."""
    hi = len(text) if hi is None else hi
    if text.isascii():
        return max(0, hi - lo)
    return sum(len(text[a:min(a + LOOKUP, hi)].encode("utf-8", "surrogatepass")) for a in range(lo, hi, LOOKUP))


def looked_up(table: np.ndarray, ids: np.ndarray, clip: bool = False) -> np.ndarray:
    """``table[ids]`` (past its end the last place, where ``clip``), a slice of ids at a time:
    numpy copies an index array to int64 first, and a text of hundreds of MB is millions of
    tokens."""
    out = np.empty(len(ids), dtype=table.dtype)
    for a in range(0, len(ids), LOOKUP):
        np.take(table, ids[a:a + LOOKUP], out=out[a:a + LOOKUP], mode="clip" if clip else "raise")
    return out


def overlapping(ids: Any, ranges: list[tuple[int, int]], texts: list[str],
                spans: list[tuple[tuple[int, int], ...] | None], sizes: np.ndarray) -> np.ndarray:
    """Whether each of ``ids`` (texts' tokens laid end to end, text i's at ``ranges[i]``)
    overlaps one of its text's ``spans`` (byte ranges of it, in order, apart): every text's spans
    moved to where its bytes start, and each span's first and last token found by bisection in
    the tokens' ends. One int32 array of the ids' length (int64 past 2 GB of bytes); O(tokens +
    spans x log tokens). The tokens of a text with spans must spell it byte for
    byte."""
    # int32 where the bytes allow, looked up a slice at a time (an index array is copied to
    # int64 first): a text of hundreds of MB is millions of tokens
    ids = np.asarray(ids)
    ends = looked_up(sizes.astype(np.int32 if int(sizes.max(initial=0)) * len(ids) < 2 ** 31 else np.int64,
                                  copy=False), ids)
    np.cumsum(ends, out=ends)  # token j's bytes are [ends[j - 1], ends[j])
    found = []
    for (a, b), text, inside in zip(ranges, texts, spans):
        if not inside:
            continue
        first = int(ends[a - 1]) if a else 0
        spelled = int(ends[b - 1]) - first if a < b else 0
        if spelled != utf8_size(text):
            raise ValueError("--chat template needs a tokenizer whose tokens spell their text byte for byte (a "
                             f"byte-level BPE) to find the assistant's tokens; this one spells {text[:40]!r} "
                             "otherwise")
        found += [(lo + first, hi + first) for lo, hi in inside]
    mask = np.zeros(len(ends) + 1, dtype=np.int8)
    if found:
        lo, hi = np.array(found, dtype=ends.dtype).reshape(-1, 2).T  # of one type: searchsorted copies to one
        # A token overlaps [lo, hi) when it ends past lo and starts before hi: both bounds rise
        # with the spans, so touching runs of tokens join into runs apart, marked +1 and -1.
        first, stop = np.searchsorted(ends, lo, side="right"), np.searchsorted(ends, hi, side="left") + 1
        apart = np.concatenate(([True], first[1:] > stop[:-1]))
        mask[first[apart]] = 1
        mask[stop[np.concatenate((np.flatnonzero(apart)[1:] - 1, [len(stop) - 1]))]] = -1
    del ends
    return np.cumsum(mask[:-1], dtype=np.int8).view(bool)


# Texts are encoded this many characters a call at most, a text longer than this cut where the
# tokens stay the same: a tokenizer library's own objects for a message of hundreds of MB, or for
# a million messages of one record, take tens of times their size.
CHUNK_CHARS = 1 << 20


def _in_chunks(enc: Encoder, texts: list[str], encode: Callable[[list[str]], tuple[np.ndarray, np.ndarray]],
               cutting: Callable[[str, int, int], int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``encode(texts)`` (ids laid end to end, and each text's offsets) about ``CHUNK_CHARS`` at a
    time: the same ids, in memory bounded by a call's. A text longer than ``CHUNK_CHARS`` is cut
    at the points ``cutting`` finds (a place in [lo, hi) where a cut leaves the tokens as they
    are, or -1), by default ``safe_cut``'s where the encoder can cut (``Encoder.can_cut``); else
    it is one call."""
    from ..tokenizer import safe_cut

    cut_at = cutting if cutting is not None else safe_cut if enc.can_cut else None

    def pieces() -> Iterator[tuple[int, str]]:
        """(text, chunk) in order, each chunk cut as it is reached: a text's chunks are never all
        held at once beside it."""
        for i, text in enumerate(texts):
            at = 0
            while cut_at is not None and len(text) - at > CHUNK_CHARS:
                cut = cut_at(text, at + CHUNK_CHARS // 2, at + CHUNK_CHARS)
                if cut <= at:  # no safe point in reach: the rest whole
                    break
                yield i, text[at:cut]
                at = cut
            yield i, text[at:] if at else text

    parts, owner, sizes, group, size = [], [], [], [], 0
    for i, chunk in itertools.chain(pieces(), [(-1, None)]):  # groups of about CHUNK_CHARS, each one call
        if chunk is None or (group and size + len(chunk) > CHUNK_CHARS):
            ids, bounds = encode(group)
            parts.append(ids)
            sizes.append(np.diff(bounds))
            group, size = [], 0
        if chunk is not None:
            group.append(chunk)
            owner.append(i)
            size += len(chunk)
    lengths = np.bincount(np.array(owner), weights=np.concatenate(sizes), minlength=len(texts)).astype(np.int64)
    return np.concatenate(parts), np.concatenate(([0], np.cumsum(lengths)))


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
