"""Evaluation texts' word n-grams, and the texts that share one (decontamination).

    index = NgramIndex.of([(0, mmlu_texts), (1, hellaswag_texts)], ngram=13, min_words=3)
    hits = index.hits(train_texts)          # hits[i]: the evaluation sets text i shares an n-gram with

Words are ``minhash.words``' (case-folded runs of letters and digits of any script), so the rule
is GPT-3's: a training text is contaminated when it holds 13 consecutive words of an evaluation
text. An evaluation text shorter than the n-gram is matched whole (its words, all of them, in a
row), and one of fewer than ``min_words`` words is not matched at all, only counted: an answer
column ("Yes", "4", "Paris") would otherwise match most of a corpus.

The index is a sorted array of 8 bytes an n-gram (with the set each came from, 2 bytes more) and
a table of their top bits (8 to 16 bytes an n-gram, at most 128 MB); a text is checked by hashing
its own n-grams, ruling out most of them by the table and searching for the rest. The short
texts are found in the same pass whatever their lengths: their first ``min_words`` words are
looked up at every place of a text, and only where they are is a whole short text tried, so a
text costs O(words), not O(words x the short texts' lengths).

See docs/dedup.md.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from ..batching import batches
from .clusters import lookup
from .minhash import U64, WEIGHTS, Words, long_words, run_sums, salted, words

_BATCH_CHARS = 1 << 22
_RUNS = 1 << 20  # runs of words hashed at a time
_LONG_TEXT = 1 << 22  # characters from which an evaluation text is indexed a piece at a time
_SHOWN = 3  # the shortest texts matched, kept a set, to name in a refusal
_SHOWN_CHARS = 40


class NgramIndex:
    """The n-grams of evaluation sets, each with the lowest number of a set that holds it; the
    sets' short texts whole, and their first ``min_words`` words (``heads``); how many texts each
    set had too short to match, and its shortest texts matched."""

    def __init__(self, long: tuple[np.ndarray, np.ndarray], short: tuple[np.ndarray, np.ndarray], heads: np.ndarray,
                 lengths: tuple[int, ...], ngram: int, min_words: int, skipped: dict[int, int],
                 shortest: dict[int, list[str]]):
        (self.hashes, self.sets), self.short, self.heads, self.lengths = long, short, heads, lengths
        self.ngram, self.min_words, self.skipped, self.shortest = ngram, min_words, skipped, shortest
        # A table of the hashes' top bits, 8 slots a hash or more: most of a text's n-grams are
        # ruled out by one lookup there, and only the rest are searched for in the sorted hashes.
        bits = min(max(int(len(self.hashes) * 8).bit_length(), 16), 27)
        self._shift = np.uint64(64 - bits)
        self._table = np.zeros(1 << bits, dtype=bool)
        self._table[self.hashes >> self._shift] = True

    @classmethod
    def of(cls, sets: Iterable[tuple[int, Iterable[str]]], ngram: int, min_words: int = 1) -> NgramIndex:
        """The index of the texts of each numbered evaluation set.

        Args:
            sets: (number, texts) of each set; a set's texts may come lazily.
            ngram: the words of a matched run (13: GPT-3's rule).
            min_words: the fewest words of a text that is matched (whole, where it has fewer
                than ``ngram``); a text of fewer is counted in ``skipped``.
        """
        long, short, heads, lengths = _Parts(), _Parts(), [], set()
        skipped: dict[int, int] = {}
        shortest: dict[int, list[tuple[int, str]]] = {}
        for number, texts in sets:

            def regular(texts: Iterable[str] = texts, number: int = number) -> Iterator[str]:
                """The texts but a long one, whose runs are indexed a piece at a time here; one of
                too few words for a run goes on, to be counted or matched whole."""
                for text in texts:
                    if len(text) < _LONG_TEXT:
                        yield text
                        continue
                    held = 0
                    for found in long_words(text, ngram - 1):
                        long.add(salted(run_sums(found, ngram)[0], ngram), number)
                        held = max(held, len(found.hashes))
                    if held < ngram:
                        yield text

            for batch in batches(regular(), _BATCH_CHARS, len):
                found = words(batch)
                for lo in range(0, len(found.hashes), _RUNS):  # a block of runs at a time: a long text's too
                    long.add(salted(run_sums(found, ngram, lo, lo + _RUNS)[0], ngram), number)
                skipped[number] = skipped.get(number, 0) + int(np.count_nonzero(found.count < min_words))
                kept = np.flatnonzero((found.count >= min_words) & (found.count < ngram))
                if len(kept):
                    whole, head = _wholes(found, kept, min_words)
                    short.add(whole, number)
                    heads.append(head)
                    lengths.update(found.count[kept].tolist())
                    held = shortest.setdefault(number, [])
                    held += [(int(found.count[i]), batch[i][:_SHOWN_CHARS]) for i in kept.tolist()]
                    held[:] = heapq.nsmallest(_SHOWN, held, key=lambda entry: entry[0])
        return cls(long.sorted(), short.sorted(), np.unique(np.concatenate([np.empty(0, U64), *heads])),
                   tuple(sorted(lengths)), ngram, min_words, skipped,
                   {n: [text for _, text in held] for n, held in shortest.items()})

    def digest(self) -> str:
        """A hash of the index: of the evaluation sets' n-grams, whatever files they came from."""
        return hashlib.sha256(b"".join(a.tobytes() for a in (self.hashes, self.sets, *self.short))
                              + repr((self.ngram, self.min_words)).encode()).hexdigest()

    def __len__(self) -> int:
        return len(self.hashes) + len(self.short[0])

    def hits(self, texts: Sequence[str], found: Words | None = None) -> list[frozenset[int]]:
        """For each text, the numbers of the sets it shares an n-gram (or a whole short text) with.

        Args:
            texts: the texts.
            found: their ``words``, where the caller has them already.
        """
        out: list[frozenset[int]] = [frozenset()] * len(texts)
        if not len(self):
            return out
        found = words(texts) if found is None else found
        joined = np.unique(np.concatenate([self._long(found), self._short(found)]))  # (text, set), by text
        held, starts = np.unique(joined // 65536, return_index=True)
        for text, a, b in zip(held.tolist(), starts.tolist(), [*starts[1:].tolist(), len(joined)]):
            out[text] = frozenset((joined[a:b] % 65536).tolist())
        return out

    def _long(self, found: Words) -> np.ndarray:
        """(text, set) keys of the n-grams the texts hold."""
        if not len(self.hashes):
            return np.empty(0, np.int64)
        keys = [np.empty(0, np.int64)]
        for lo in range(0, len(found.hashes), _RUNS):  # a block of runs at a time: a long text's too
            sums, at = run_sums(found, self.ngram, lo, lo + _RUNS)
            hashes, owner = salted(sums, self.ngram), found.text[at]
            maybe = self._table[hashes >> self._shift]
            hashes, owner = hashes[maybe], owner[maybe]
            found_at, match = lookup(self.hashes, hashes)
            keys.append(owner[match] * 65536 + self.sets[found_at[match]])
        return np.concatenate(keys)

    def _short(self, found: Words) -> np.ndarray:
        """(text, set) keys of the short texts the texts hold whole: tried only where a short
        text's first ``min_words`` words stand, one length after another along the same sums."""
        known, sets = self.short
        if not len(known):
            return np.empty(0, np.int64)
        m = self.min_words
        sums, start = run_sums(found, m)
        maybe = lookup(self.heads, salted(sums, m))[1]
        start, total = start[maybe], sums[maybe]
        owner, keys = found.text[start], []
        for k in range(m, self.lengths[-1] + 1):  # total: the sum of the k words from each start
            whole = start + k - 1 < len(found.text)
            whole[whole] = found.text[start[whole] + k - 1] == owner[whole]
            if k in self.lengths:
                found_at, match = lookup(known, salted(total[whole], k))
                keys.append(owner[whole][match] * 65536 + sets[found_at[match]])
            more = start + k < len(found.hashes)
            total[more] += found.hashes[start[more] + k] * WEIGHTS[k]
        return np.concatenate([np.empty(0, np.int64), *keys])


class _Parts:
    """Hashes gathered with the set each came from, then sorted, each kept once (the lowest set)."""

    def __init__(self) -> None:
        self.hashes: list[np.ndarray] = []
        self.sets: list[np.ndarray] = []

    def add(self, hashes: np.ndarray, number: int) -> None:
        self.hashes.append(hashes)
        self.sets.append(np.full(len(hashes), number, dtype=np.uint16))

    def sorted(self) -> tuple[np.ndarray, np.ndarray]:
        hashes = np.concatenate([np.empty(0, U64), *self.hashes])
        sets = np.concatenate([np.empty(0, np.uint16), *self.sets])
        order = np.lexsort((sets, hashes))  # a hash held by several sets keeps the lowest number
        hashes, sets = hashes[order], sets[order]
        first = np.concatenate([[True], hashes[1:] != hashes[:-1]]) if len(hashes) else np.empty(0, bool)
        return hashes[first], sets[first]


def _wholes(found: Words, kept: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The hash of each text ``kept`` (of ``m`` words or more) as one run of all its words, and of
    its first ``m`` words."""
    first, count = np.searchsorted(found.text, kept), found.count[kept]
    total = np.zeros(len(kept), dtype=U64)
    head = total
    for k in range(int(count.max())):
        has = count > k
        total[has] += found.hashes[first[has] + k] * WEIGHTS[k]
        if k + 1 == m:
            head = salted(total, m)
    return salted(total, count), head
