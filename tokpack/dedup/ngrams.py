"""Evaluation texts' word n-grams, and the texts that share one (decontamination).

    index = NgramIndex.of([(0, mmlu_texts), (1, hellaswag_texts)], ngram=13)
    hits = index.hits(train_texts)          # hits[i]: the evaluation sets text i shares an n-gram with

Words are ``minhash.words``' (case-folded runs of letters and digits of any script), so the rule is GPT-3's: a
training text is contaminated when it holds 13 consecutive words of an evaluation text. An
evaluation text shorter than the n-gram is matched whole: its words, all of them, in a row. The
index is a sorted array of 8 bytes an n-gram (with the set each came from, 2 bytes more) and a
table of their top bits (8 to 16 bytes an n-gram, at most 128 MB); a text is checked by hashing
its own n-grams, ruling out most of them by the table and searching for the rest: O(words).

See docs/dedup.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import numpy as np

from ..batching import batches
from .minhash import Words, grams, words

_BATCH_CHARS = 1 << 22


class NgramIndex:
    """The n-grams of evaluation sets, each with the lowest number of a set that holds it."""

    def __init__(self, hashes: np.ndarray, sets: np.ndarray, ngram: int, shorter: tuple[int, ...]):
        self.hashes, self.sets, self.ngram, self.shorter = hashes, sets, ngram, shorter
        # A table of the hashes' top bits, 8 slots a hash or more: most of a text's n-grams are
        # ruled out by one lookup there, and only the rest are searched for in the sorted hashes.
        bits = min(max(int(len(hashes) * 8).bit_length(), 16), 27)
        self._shift = np.uint64(64 - bits)
        self._table = np.zeros(1 << bits, dtype=bool)
        self._table[hashes >> self._shift] = True

    @classmethod
    def of(cls, sets: Iterable[tuple[int, Iterable[str]]], ngram: int) -> NgramIndex:
        """The index of the texts of each numbered evaluation set.

        Args:
            sets: (number, texts) of each set; a set's texts may come lazily.
            ngram: the words of a matched run (13: GPT-3's rule).
        """
        found_hashes, found_sets, shorter = [], [], set()
        for number, texts in sets:
            for batch in batches(texts, _BATCH_CHARS, len):
                found = words(batch)
                lengths = {int(c) for c in found.count if 0 < c < ngram}
                shorter.update(lengths)
                parts = [_runs(found, ngram)[0]]
                for k in lengths:  # a short text is the one run of its own length it holds
                    hashes, owner = _runs(found, k)
                    parts.append(hashes[found.count[owner] == k])
                hashes = np.concatenate(parts)
                found_hashes.append(hashes)
                found_sets.append(np.full(len(hashes), number, dtype=np.uint16))
        hashes = np.concatenate(found_hashes) if found_hashes else np.empty(0, np.uint64)
        sets_of = np.concatenate(found_sets) if found_sets else np.empty(0, np.uint16)
        order = np.lexsort((sets_of, hashes))  # a hash held by several sets keeps the lowest number
        hashes, sets_of = hashes[order], sets_of[order]
        first = np.concatenate([[True], hashes[1:] != hashes[:-1]]) if len(hashes) else np.empty(0, bool)
        return cls(hashes[first], sets_of[first], ngram, tuple(sorted(shorter)))

    def digest(self) -> str:
        """A hash of the index: of the evaluation sets' n-grams, whatever files they came from."""
        return hashlib.sha256(self.hashes.tobytes() + self.sets.tobytes() + repr(self.shorter).encode()).hexdigest()

    def __len__(self) -> int:
        return len(self.hashes)

    def hits(self, texts: Sequence[str], found: Words | None = None) -> list[frozenset[int]]:
        """For each text, the numbers of the sets it shares an n-gram (or a whole short text) with.

        Args:
            texts: the texts.
            found: their ``words``, where the caller has them already.
        """
        out: list[frozenset[int]] = [frozenset()] * len(texts)
        if not len(self.hashes):
            return out
        found = words(texts) if found is None else found
        pairs = []
        for n in (self.ngram, *self.shorter):
            hashes, owner = _runs(found, n)
            maybe = self._table[hashes >> self._shift]
            hashes, owner = hashes[maybe], owner[maybe]
            at = np.minimum(np.searchsorted(self.hashes, hashes), len(self.hashes) - 1)
            match = self.hashes[at] == hashes
            pairs.append(owner[match] * 65536 + self.sets[at[match]])
        joined = np.unique(np.concatenate(pairs))  # (text, set) pairs, sorted by text
        held, starts = np.unique(joined // 65536, return_index=True)
        for text, a, b in zip(held.tolist(), starts.tolist(), [*starts[1:].tolist(), len(joined)]):
            out[text] = frozenset((joined[a:b] % 65536).tolist())
        return out


def _runs(found: Words, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every run of ``n`` words inside a text, with its text: ``grams`` without the whole texts of
    fewer words, which it lists last."""
    hashes, owner = grams(found, n)
    runs = len(hashes) - np.count_nonzero((found.count > 0) & (found.count < n))
    return hashes[:runs], owner[:runs]
