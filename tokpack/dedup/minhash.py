"""MinHash signatures of texts over normalised word n-grams, for a batch of texts at once.

    sign(["The MIT License ...", ...], Shingling(ngram=5, hashes=256, bands=32))   # -> Signatures

A text's words are its maximal runs of letters, marks and digits of any script, after NFKC and
case folding, with format characters (zero-width ones, the soft hyphen, the BOM) dropped; every
other character (Unicode spaces, punctuation, symbols) only separates them, so that case,
spacing, quoting and compatibility forms do not tell copies apart; in scripts written without
spaces (Han, Hiragana, Katakana, Thai, Lao, Khmer, Myanmar) each character is a word. Its
shingles are its word n-grams (a text of fewer than n words: all its words as one; a text with
no word: its bytes). An ASCII text is read a byte at a time (it is its own normal form); any other
a code point at a time through a table of what each folds to alone and its class, and a text
holding a character that folds only beside its neighbours is folded whole first. Each shingle is
hashed once to 64 bits (one permutation hashing): the top bits choose one of ``hashes`` bins and
the low 32 bits are its value; a bin keeps its minimum, and an empty bin takes the next non-empty
bin's value to its right (circularly), offset by the distance (rotation densification), so that
two texts agree on a bin with the probability of their Jaccard similarity whatever their lengths.
The cost is O(bytes + shingles), not O(shingles x hashes) as a hash a permutation is: a text is
read by numpy a few times, and no Python runs per word.

What is kept of a text: a 16-bit fingerprint a bin (to estimate the similarity of a candidate
pair) and a 64-bit hash a band of ``hashes / bands`` bins (texts that share a band are candidates).

See docs/dedup.md.
"""

from __future__ import annotations

import functools
import itertools
import hashlib
import re
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import regex

U64 = np.uint64
_EMPTY = U64(1 << 32)  # above every bin's 32-bit value
_SALT = U64(0x9E3779B97F4A7C15)
_BASE = 0x100000001B3  # odd, so it has an inverse modulo 2**64 and a word's hash needs no division
_BASE_INVERSE = pow(_BASE, -1, 1 << 64)
# Word k of an n-gram is weighed by multiplier k, so the order of words counts.
WEIGHTS = np.array([(0x9E3779B97F4A7C15 * (2 * k + 1)) % (1 << 64) | 1 for k in range(64)], dtype=U64)


# Which words a text has is decided by this rule, named in the fingerprint of a guarded run, so
# that signatures made by another rule are made again.
WORD_RULE = "unicode-1"
# A byte of an ASCII word, letters lowercased; every other byte, 0.
_WORD_BYTES = bytes((b + 32 if 65 <= b <= 90 else b) if chr(b).isascii() and chr(b).isalnum() else 0
                    for b in range(256))
# A code point's class: it separates words, is part of one, or is a word alone (scripts written
# without spaces).
_APART, _WORD, _ALONE = 0, 1, 2
_ALONE_SCRIPTS = regex.compile(r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}]")
_FORMAT = regex.compile(r"\p{Cf}+")
_ASTRAL = regex.compile(r"[\U00010000-\U0010FFFF]")
_CUT = regex.compile(r"[^\p{L}\p{M}\p{N}]")  # where a chunk may end: after a character no word holds
_JAMO = ((0x1100, 0x11FF), (0xA960, 0xA97F), (0xD7B0, 0xD7FF))  # Hangul's conjoining letters compose with neighbours


def _class(ch: str) -> int:
    if _ALONE_SCRIPTS.match(ch):
        return _ALONE
    return _WORD if unicodedata.category(ch)[0] in "LMN" else _APART


def folded(text: str) -> str:
    """``text`` as its words are read: format characters dropped, NFKC, case folded (and NFKC
    again where folding undid it)."""
    text = unicodedata.normalize("NFKC", _FORMAT.sub("", text)).casefold()
    return text if unicodedata.is_normalized("NFKC", text) else unicodedata.normalize("NFKC", text)


def _alone(c: int, seconds: frozenset[int]) -> int | None:
    """What code point ``c`` folds to, by itself, with its class in the top byte; None where that
    is not one character, or depends on its neighbours (a combining mark, a character that
    composes with the one before it, Hangul's conjoining letters, a format character dropped)."""
    ch = chr(c)
    if unicodedata.category(ch) in ("Cf", "Cs") or unicodedata.combining(ch) or c in seconds:
        return None
    s = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", ch).casefold())
    if len(s) > 1 and not any(_class(part) != _APART or unicodedata.combining(part) for part in s):
        s = s[0]  # "…" is "...": only separators, which separate as one does
    if len(s) != 1 or unicodedata.combining(s) or ord(s) in seconds or any(a <= ord(s) <= b for a, b in _JAMO):
        return None
    return _class(s) << 24 | ord(s)


@functools.cache
def _table() -> tuple[np.ndarray, re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    """Each code point of the Basic Multilingual Plane folded, its class in the top byte (one
    that folds only in context maps to itself, read from an already folded text); a pattern of
    those, which send a text to ``folded`` whole; and one of the characters beyond ASCII that
    only separate words (curly quotes, dashes, no-break spaces), which a space may stand for,
    and one of every other character beyond ASCII.
    About 80 ms, once a process."""
    seconds = frozenset(int(d.split()[1], 16) for d in map(unicodedata.decomposition, map(chr, range(0x10000)))
                        if d and not d.startswith("<") and len(d.split()) == 2)
    packed = np.empty(0x10000, dtype=np.uint32)
    context, apart = [], []
    for c in range(0x10000):
        value = _alone(c, seconds)
        if value is None:
            value = _class(chr(c)) << 24 | c
            if not 0xD800 <= c <= 0xDFFF:
                context.append(c)
        elif c >= 0x80 and value >> 24 == _APART:
            apart.append(c)
        packed[c] = value
    return packed, _ranges(context), _ranges(apart), _ranges(apart, but=True)


def _ranges(codes: list[int], but: bool = False) -> re.Pattern[str]:
    """A pattern of one of ``codes`` (ascending), or with ``but`` of any character beyond ASCII
    but those: re's own sets of ranges are bitmaps, 400 MB/s."""
    ranges, start = ["\\x00-\\x7f"] if but else [], None
    for at, c in enumerate(codes):
        if start is None:
            start = c
        if at + 1 == len(codes) or codes[at + 1] != c + 1:
            ranges.append(f"\\U{start:08x}-\\U{c:08x}")
            start = None
    return re.compile(f"[{'^' if but else ''}{''.join(ranges)}]")


def _read(text: str) -> str:
    """``text`` ready for the word pass: ASCII as it is (the pass lowercases it); a text holding a
    character that folds only beside its neighbours ``folded`` first; then, where its only
    characters beyond ASCII separate words, a space for each (read as ASCII), else as it is (the
    pass folds it a code point at a time, by table)."""
    if text.isascii():
        return text
    _, context, apart, wordy = _table()
    if not wordy.search(text):  # the common case: quotes, dashes and spaces of typesetting
        return apart.sub(" ", text)
    if context.search(text) or (_ASTRAL.search(text) and any(
            _class(ch) != _ALONE and unicodedata.category(ch)[0] in "LMN" for ch in set(_ASTRAL.findall(text)))):
        text = folded(text)
    return text if wordy.search(text) else apart.sub(" ", text)


def mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every bit of the result depends on every bit of ``z``."""
    z = z ^ (z >> U64(30))
    z = z * U64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> U64(27))
    z = z * U64(0x94D049BB133111EB)
    return z ^ (z >> U64(31))


@dataclass(frozen=True)
class Shingling:
    """How texts are signed: word ``ngram``-grams, ``hashes`` bins, in ``bands`` bands of
    ``hashes // bands`` bins each."""

    ngram: int = 5
    hashes: int = 256
    bands: int = 32

    def __post_init__(self) -> None:
        if not 1 <= self.ngram <= len(WEIGHTS):
            raise ValueError(f"an n-gram of {self.ngram} words is outside 1..{len(WEIGHTS)}; try 5")
        if self.bands < 1 or self.hashes < self.bands or self.hashes % self.bands or self.hashes > 4096:
            raise ValueError(f"{self.hashes} hashes in {self.bands} bands: the bands must split the hashes "
                             "evenly, at most 4096 of them; try 256 in 32")

    @property
    def rows(self) -> int:
        return self.hashes // self.bands


class Words(NamedTuple):
    """The words of a batch of texts: each word's 64-bit hash and the text it is in, in order;
    and, for a text with no word, a hash of its bytes."""

    hashes: np.ndarray  # uint64, a word
    text: np.ndarray  # int64, a word
    count: np.ndarray  # int64, a text: how many words it has
    bare: np.ndarray  # uint64, a text: the hash of its whole bytes (used where it has no word)


# Texts are hashed in chunks of about this many characters, cut after a character no word holds
# (a word longer than two chunks is cut), so the powers below are bounded whatever a text's length.
_CHUNK = 1 << 18


@functools.cache
def _powers() -> tuple[np.ndarray, np.ndarray]:
    """BASE**i and its inverse's, modulo 2**64, for i up to two chunks."""
    found = []
    for base in (_BASE, _BASE_INVERSE):
        powers = np.full(2 * _CHUNK + 1, base, dtype=U64)
        powers[0] = 1
        found.append(np.cumprod(powers, dtype=U64))  # wraps modulo 2**64, as wanted
    return found[0], found[1]


def words(texts: Sequence[str]) -> Words:
    """The words of ``texts``, hashed by a polynomial over their code points (lowercased bytes, for
    ASCII): the prefix sums of code x BASE**position, so a word's hash is a difference times the
    inverse of its start's power (no division, no Python per word)."""
    texts = [_read(t) for t in texts]
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    ends = np.cumsum(lengths + 1) - 1  # where each text's NUL falls, as if they were joined
    firsts, hashes = [], []
    for at, piece in _pieces(texts):
        first, found = _hashed(piece)
        hashes.append(found)
        firsts.append(first + at)
    found = np.concatenate(hashes) if hashes else np.empty(0, U64)
    # Texts are few and words many: each text's count of words from where its end falls among them.
    count = np.diff(np.searchsorted(np.concatenate(firsts) if firsts else np.empty(0, np.int64), ends), prepend=0)
    text = np.repeat(np.arange(len(texts)), count)
    bare = np.zeros(len(texts), dtype=U64)  # a text with no word is known by all its bytes
    for i in np.flatnonzero(count == 0):
        bare[i] = int.from_bytes(hashlib.blake2b(texts[i].encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                                 "little")
    return Words(found, text, count, bare)


def long_words(text: str, keep: int) -> Iterator[Words]:
    """The words of one long ``text`` a piece at a time (cut where no word is, as ``words`` cuts
    it), each piece's led by the last ``keep`` words before it, so that every run of up to
    ``keep + 1`` words lies whole in one piece and in only one: memory a piece's, whatever the
    text's length."""
    tail = np.empty(0, U64)
    for _, piece in _pieces([_read(text)]):
        hashes = np.concatenate([tail, words([piece]).hashes])
        yield Words(hashes, np.zeros(len(hashes), np.int64), np.array([len(hashes)]), np.zeros(1, U64))
        tail = hashes[max(len(hashes) - keep, 0):]


def _pieces(texts: list[str]) -> Iterator[tuple[int, str]]:
    """The texts as if joined, each ended by a NUL (no word's), in pieces of about ``_CHUNK``
    characters with their places: short texts joined, a long one cut after a character no word
    holds (a word longer than two chunks is cut), never copied whole."""
    group: list[str] = []
    at = size = 0  # where the next text begins; the characters in ``group``
    for text in texts:
        if len(text) < _CHUNK:
            group += (text, "\0")
            size += len(text) + 1
            at += len(text) + 1
            if size >= _CHUNK:
                yield at - size, "".join(group)
                group, size = [], 0
            continue
        if group:
            yield at - size, "".join(group)
            group, size = [], 0
        lo = 0
        while lo < len(text):
            cut = _CUT.search(text, lo + _CHUNK, lo + 2 * _CHUNK)
            hi = cut.end() if cut else min(lo + 2 * _CHUNK, len(text))
            yield at + lo, text[lo:hi]  # a piece's end ends its last word
            lo = hi
        at += len(text) + 1
    if group:
        yield at - size, "".join(group)


def _hashed(piece: str) -> tuple[np.ndarray, np.ndarray]:
    """Each word's start in ``piece`` (folded already, but for ASCII case) and its hash."""
    if piece.isascii():
        codes = np.frombuffer(piece.encode("ascii").translate(_WORD_BYTES), dtype=np.uint8)
        inside = np.concatenate([[False], codes != 0, [False]])
        edges = np.flatnonzero(inside[1:] != inside[:-1])
        first, last = edges[0::2], edges[1::2]
    else:
        codes = np.frombuffer(piece.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        packed = _table()[0][np.minimum(codes, 0xFFFF)]
        beyond = np.flatnonzero(codes > 0xFFFF)
        if len(beyond):  # folded already (``_read``): only their class is looked up
            met, where = np.unique(codes[beyond], return_inverse=True)
            packed[beyond] = np.array([_class(chr(c)) << 24 | c for c in met.tolist()], dtype=np.uint32)[where]
        kind, codes = packed >> 24, packed & 0xFFFFFF
        word, alone = kind == _WORD, kind == _ALONE
        after = np.concatenate([word[1:], [False]])
        before = np.concatenate([[False], word[:-1]])
        first = np.flatnonzero((word & ~before) | alone)
        last = np.flatnonzero((word & ~after) | alone) + 1
    power, inverse = _powers()
    prefix = np.zeros(len(codes) + 1, dtype=U64)
    np.cumsum(np.multiply(codes, power[:len(codes)], dtype=U64), out=prefix[1:])
    return first, mix((prefix[last] - prefix[first]) * inverse[first])


def run_sums(found: Words, n: int, lo: int = 0, hi: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The weighted sum of every run of ``n`` words inside one text (word k of a run weighed by
    ``WEIGHTS[k]``, before ``salted``), and where it starts among the words: n passes of
    vectorised work, whatever the number of texts. Only the runs starting in [``lo``, ``hi``)
    where given (a block of a long text's, so that its arrays are a block's, not a text's)."""
    hashes, text = found.hashes, found.text
    runs = max(len(hashes) - n + 1, 0)
    total = np.zeros(max((runs if hi is None else min(hi, runs)) - lo, 0), dtype=U64)
    for k in range(n):
        total += hashes[lo + k:lo + k + len(total)] * WEIGHTS[k]
    inside = text[lo:lo + len(total)] == text[lo + n - 1:lo + n - 1 + len(total)]
    return total[inside], lo + np.flatnonzero(inside)


def salted(sums: np.ndarray, n: int | np.ndarray) -> np.ndarray:
    """Runs' hashes from their sums, salted by their length (``n`` words each, or a length each)."""
    return mix(sums + np.asarray(n, dtype=U64) * _SALT)


def grams(found: Words, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The hash of every run of ``n`` words inside one text, with its text, in order; and of each
    text of fewer words, all its words (the hash tells how many). A text with no word has none."""
    blocks = list(gram_blocks(found, n))
    return (np.concatenate([np.empty(0, U64), *(h for h, _ in blocks)]),
            np.concatenate([np.empty(0, np.int64), *(t for _, t in blocks)]))


def gram_blocks(found: Words, n: int, block: int = 1 << 20) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``grams`` a block of ``block`` runs at a time (then the texts of fewer words): memory a
    block's, whatever the length of a text."""
    hashes, text, count, _ = found
    for lo in range(0, max(len(hashes) - n + 1, 0), block):
        sums, at = run_sums(found, n, lo, lo + block)
        yield salted(sums, n), text[at]
    short = np.flatnonzero((count > 0) & (count < n))
    if len(short):
        first = np.searchsorted(text, short)
        whole = np.zeros(len(short), dtype=U64)
        for k in range(n - 1):
            has = count[short] > k
            whole[has] += hashes[first[has] + k] * WEIGHTS[k]
        yield salted(whole + count[short].astype(U64), n), short


class Signatures(NamedTuple):
    """A batch's signatures: a 16-bit fingerprint a bin and a 64-bit hash a band, a row a text."""

    fingerprints: np.ndarray  # uint16 (texts, hashes)
    bands: np.ndarray  # uint64 (texts, bands)


def sign(texts: Sequence[str], shingling: Shingling, found: Words | None = None) -> Signatures:
    """The signatures of ``texts`` (see the module's docstring).

    Args:
        texts: the texts.
        shingling: the n-gram, the number of hashes and of bands.
        found: the texts' ``words``, where the caller has them already.
    """
    found = words(texts) if found is None else found
    k = shingling.hashes
    bins = np.full(len(texts) * k, _EMPTY, dtype=U64)
    bare = np.flatnonzero(found.count == 0)
    for hashes, owner in itertools.chain(gram_blocks(found, shingling.ngram), [(found.bare[bare], bare)]):
        np.minimum.at(bins, owner * k + ((hashes >> U64(32)) * U64(k) >> U64(32)).astype(np.int64),
                      hashes & U64(0xFFFFFFFF))
    values = _densified(bins.reshape(len(texts), k))
    fingerprints = (values >> U64(48)).astype(np.uint16)
    rows = values.reshape(len(texts), shingling.bands, shingling.rows) * WEIGHTS[:shingling.rows]
    return Signatures(fingerprints, mix(rows.sum(axis=2, dtype=U64)))


def _densified(bins: np.ndarray) -> np.ndarray:
    """Every bin's value mixed to 64 bits, an empty one taking its next non-empty neighbour's to
    the right (circularly) plus the distance to it."""
    k = bins.shape[1]
    filled = bins != _EMPTY
    at = np.where(np.concatenate([filled, filled], axis=1), np.arange(2 * k), 2 * k)
    nearest = np.minimum.accumulate(at[:, ::-1], axis=1)[:, ::-1][:, :k]  # every text has a filled bin
    taken = np.take_along_axis(bins, nearest % k, axis=1)
    return mix(taken + ((nearest - np.arange(k)).astype(U64) << U64(32)) + _SALT)
