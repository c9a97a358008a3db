"""The split guard, dedup and decontamination options: the ``[guard]`` table of a prepare config.

See docs/dedup.md.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from ...dedup.minhash import Shingling
from ...format import split_threshold
from ...options import default_of, option

# The largest standard error of the similarity estimate at the threshold: 256 bins at 0.8 err by
# 0.025, 64 by 0.05; fewer cannot tell 0.8 from 0.7.
MAX_ERROR = 0.05


class Dedup(enum.StrEnum):
    """Which duplicates are written once: ``NONE``, every document kept; ``EXACT``, copies of the
    same text; ``NEAR``, near-duplicates too (``--threshold``)."""

    NONE = "none"
    EXACT = "exact"
    NEAR = "near"


@dataclass(frozen=True)
class GuardOptions:
    """The split guard, dedup and decontamination options (the ``[guard]`` table of a config)."""

    near_split: bool = option(True, "keep near-duplicates on one side of the split: each cluster goes where its "
                              "first document does, so val holds no near-copy of a train document (with "
                              "--val-inputs, a val document's train near-copies are removed); a corpus of one "
                              "document has none")
    dedup: str = option("none", "write duplicates once, the first in stored order: exact, copies of the same text; "
                        "near, near-duplicates too (default: none, keep all)", tuple(Dedup))
    threshold: float = option(0.8, "the estimated Jaccard similarity of word n-grams from which two documents are "
                              "near-duplicates, in (0, 1]")
    ngram: int = option(5, "words a shingle of the near-duplicate signatures (FineWeb's 5)")
    hashes: int = option(256, "MinHash bins a document's signature")
    bands: int = option(32, "LSH bands the bins are cut into: candidates share a band")
    decontaminate: tuple[str, ...] = option((), "evaluation files (text, .jsonl, .parquet, local or URLs) whose word "
                                            "n-grams no train document may hold; such a document is dropped")
    decontaminate_key: str = option("text", "the text field (.jsonl) or column (.parquet) of --decontaminate's files")
    decontaminate_ngram: int = option(13, "words of a matched run (GPT-3's 13); a shorter evaluation text is "
                                      "matched whole")
    decontaminate_min_words: int = option(3, "the fewest words of an evaluation text that is matched; a shorter "
                                          "one (an answer such as 'Yes' or '4') is counted in meta.json, not matched")
    decontaminate_max_share: float = option(0.2, "the largest share of train documents --decontaminate may remove; "
                                            "a run that would remove more stops, naming the evaluation file and "
                                            "its shortest texts, in (0, 1]")
    report_only: bool = option(False, "with --decontaminate, count the train documents that hold an evaluation "
                               "n-gram in meta.json and keep them")

    def __post_init__(self) -> None:
        if self.dedup not in tuple(Dedup):
            raise ValueError(f"--dedup {self.dedup!r} is not one of {', '.join(Dedup)}")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"--threshold {self.threshold} must lie in (0, 1]; try 0.8")
        for flag, n, usual in (("--ngram", self.ngram, 5), ("--decontaminate-ngram", self.decontaminate_ngram, 13),
                               ("--decontaminate-min-words", self.decontaminate_min_words, 3)):
            if not 1 <= n <= 64:
                raise ValueError(f"{flag} {n} must lie in 1..64 words; try {usual}")
        if not 0.0 < self.decontaminate_max_share <= 1.0:
            raise ValueError(f"--decontaminate-max-share {self.decontaminate_max_share} must lie in (0, 1]; try "
                             "0.2, or 1 to remove whatever the evaluation sets match")
        self.shingling()  # hashes and bands checked
        self._used()
        error = math.sqrt(self.threshold * (1 - self.threshold) / self.hashes)
        if error > MAX_ERROR:  # the estimate's standard error at the threshold, where it decides
            enough = math.ceil(self.threshold * (1 - self.threshold) / MAX_ERROR ** 2 / self.bands) * self.bands
            raise ValueError(f"--hashes {self.hashes} estimates a similarity of {self.threshold:g} with a standard "
                             f"error of {error:.2f}, too coarse to tell near-duplicates from others; pass --hashes "
                             f"{enough} or more (256, the default, errs by {math.sqrt(0.16 / 256):.3f} at 0.8)")

    def _used(self) -> None:
        """Refuse a setting that this combination of options would not read."""
        for needs, names, given in (
                ("--near-split or --dedup near", ("threshold", "ngram", "hashes", "bands"), self.near),
                ("--decontaminate FILE", ("decontaminate_key", "decontaminate_ngram", "decontaminate_min_words",
                                          "decontaminate_max_share", "report_only"), bool(self.decontaminate))):
            unused = [f"--{name.replace('_', '-')}" for name in names
                      if getattr(self, name) != default_of(GuardOptions, name)]
            if unused and not given:
                raise ValueError(f"{' and '.join(unused)} {'applies' if len(unused) == 1 else 'apply'} only with "
                                 f"{needs}, which this run does not ask for: pass it, or drop {' and '.join(unused)}")

    @property
    def active(self) -> bool:
        return self.near_split or self.dedup != Dedup.NONE or bool(self.decontaminate)

    @property
    def near(self) -> bool:
        return self.near_split or self.dedup == Dedup.NEAR

    def joined_at(self) -> float:
        """The estimated similarity from which two documents are joined: lower for the split
        (``format.split_threshold``), where missing a pair leaks and joining one too many does not."""
        return split_threshold(self.threshold, self.hashes) if self.near_split else self.threshold

    def shingling(self) -> Shingling:
        try:
            return Shingling(self.ngram, self.hashes, self.bands)
        except ValueError as exc:
            raise ValueError(f"--hashes {self.hashes} --bands {self.bands}: {exc}") from None
