"""The guard stage of a prepare run (the split guard, dedup and decontamination): decided before
any unit is tokenized, since a unit's shards are final once written.

    python -m tokpack.prepare corpus.jsonl --near-split                    # near-copies on one side
    python -m tokpack.prepare corpus.jsonl --dedup near                    # and written once
    python -m tokpack.prepare corpus.jsonl --decontaminate mmlu.jsonl      # no 13-gram of it in train

Every unit's documents are read once more (no tokenizer: the same verdicts whatever the
tokenizer, thread count or task count) and signed into files of the unit (``signatures``), and
the match is done in parts (``match``: each part's entries of every unit, sorted a spill file at
a time, never an array of all documents in memory); each unit and each part is done once, by
whichever task claims it first, and read by the others. One task then decides the verdict of
each document that is moved to the other split or dropped, and keeps it (``placement``); the
other tasks read it, and the finish decides once more, whole. A unit looks up its documents'
verdicts by their number in its reads (``Plan.reads``), as it writes them.

A cluster of near-duplicates goes to the split of its first document (in stored order), so val
never holds a near-copy of a train document (where val is the user's, ``--val-inputs``, the
cluster's train documents are removed instead); ``--dedup`` keeps that first one and drops the rest
(``exact``: only copies of the same text); ``--decontaminate`` drops a train document that shares a
word n-gram with an evaluation file. The cost: O(corpus) read and signed, O(documents x bands)
routed to disk and matched, and in memory O(documents in clusters or holding evaluation n-grams).

See docs/dedup.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, TypeVar

import numpy as np

from ...dedup.clusters import similar
from ...dedup.minhash import Shingling
from ...format import GUARD_REMOVED, PLACED, SIGN, Removed
from ...storage.local import claimed, remove_own
from ..config import Dedup, GuardOptions
from ..memory import roomy_heap
from ..plan import Plan
from ..plan.holdout import Rule
from . import placement
from .match import Stale, firsts, matched
from .placement import Placement, Verdict
from .signatures import HIT, Reading, Signed, load_unit, sign_unit

_T = TypeVar("_T")
# What tasks that share no disk with the run's own process (Ray's, with a URL --out-dir) read of
# the stage, which that process decides for them: the placement, its record last.
SHARED = [PLACED.format("bin"), PLACED.format("json")]


def stage(plan: Plan, first: int = 0) -> Verdicts | None:
    """The guard stage of a run whole, for its finish: its verdicts (``Guard.run`` from unit
    ``first`` on), or None for a run without a guard."""
    return Guard(plan).run(first) if plan.guard is not None else None


def placed(plan: Plan, first: int = 0) -> Placement | None:
    """What a task's units need of the guard stage (``Guard.placement``), or None for a run
    without a guard."""
    return Guard(plan).placement(first) if plan.guard is not None else None


def fresh(plan: Plan, verdicts: Verdicts | None) -> Verdicts | None:
    """``verdicts``, or decided again where a task of the run has decided others since (it found
    an input changed and signed it again)."""
    if verdicts is None:
        return None
    guard = verdicts.guard
    return verdicts if placement.signed(guard.out, guard.fingerprint, len(guard.units), guard.reads) == \
        verdicts.signed else guard.run()


def shared(plan: Plan) -> Placement | None:
    """The placement the run's own process decided and shared (``SHARED``), for a task that
    shares no disk with it, or None for a run without a guard."""
    if plan.guard is None:
        return None
    kept = Guard(plan).kept()
    if kept is None:
        raise ValueError("the guard's placement, which the run's own process uploads to the --out-dir before its "
                         "tasks start, is missing there or not this run's; run the same command again")
    return kept


class Guard:
    """A guarded run's stage before its first unit: every unit signed and matched (whichever
    task gets to a unit or a part of the match first does it, the others read it), and the
    verdicts decided: where each moved or dropped document goes, by the run's read and its
    number in the read. The plan holds the rules; the stage's ``run`` gives the verdicts.

    Args:
        plan: the run's plan, whose ``guard`` holds the rules.
    """

    def __init__(self, plan: Plan):
        rules = plan.guard
        assert rules is not None, "a plan with a guard"
        self.options, self.out, self.fingerprint, self.workers = rules.options, plan.out, plan.fingerprint, plan.workers
        shares = [plan.share(unit) for unit in range(plan.units)]
        self.units = [(share, plan.reads(share)) for share in shares]
        self.reads = 1 + sum(len(reads) for _, reads in self.units)  # a placement's starts: each read's, and the end
        self.reading = Reading(plan.read, plan.config.seed, plan.holdout, plan.chat is not None,
                               {f: i for i, f in enumerate(plan.files)})
        self.index, self.sets, self.files, self.groups, self.inputs = (rules.ngrams, rules.sets, rules.files,
                                                                      rules.groups, rules.inputs)

    @property
    def shingling(self) -> Shingling | None:
        return self.options.shingling() if self.options.near else None

    def run(self, first: int = 0) -> Verdicts:
        """Every unit signed (``first`` first, then those after it, so tasks of consecutive units
        each start with their own), matched (from ``first``'s share of the parts on) and decided."""
        return self._decided(first, lambda signed: self._decide(signed, first))

    def placement(self, first: int = 0) -> Placement:
        """Where each moved or dropped document goes: kept by the task that decided it, or signed,
        matched and decided as ``run`` does, by one task at a time (the others then read it)."""
        kept = self.kept()
        return kept if kept is not None else self._decided(
            first, lambda signed: self.kept() or self._decide(signed, first).placement)

    def kept(self) -> Placement | None:
        """The placement a task of the run decided, kept in the folder, if it is this run's."""
        return placement.load(self.out, self.fingerprint, len(self.units), self.reads)

    def _decided(self, first: int, decide: Callable[[list[Signed]], _T], again: bool = True) -> _T:
        """``decide`` on every unit's signatures, with the claim to decide held; a unit whose
        entries turn out not as signed is signed again (``again``: once)."""
        try:
            signed = self._signed(first)
            with claimed(self.out / PLACED.format("lock"), True):
                return decide(signed)
        except Stale as stale:
            if not again:
                raise
            remove_own(self.out / SIGN.format(stale.unit, "json"))
            return self._decided(first, decide, again=False)

    def _signed(self, first: int) -> list[Signed]:
        count = len(self.units)
        signed: dict[int, Signed] = {}
        with roomy_heap():
            # Its own units first, then any no task is signing; then those others are signing.
            for waits in (False, True):
                for u in [*range(first, count), *range(first)]:
                    if u in signed:
                        continue
                    found = self._load(u)
                    if found is None:
                        with claimed(self.out / SIGN.format(u, "lock"), waits) as mine:
                            if not mine:
                                continue
                            found = self._load(u)  # signed while this task waited
                            if found is None:
                                share, reads = self.units[u]
                                sign_unit(self.out, u, share, reads, self.reading, self.shingling, self.index,
                                          self.workers, self.fingerprint)
                                found = self._load(u)
                    if found is None:
                        raise ValueError(f"the signatures of {self.out} changed while the run read them; run the "
                                         "same command again")
                    signed[u] = found
        return [signed[u] for u in range(count)]

    def _load(self, unit: int) -> Signed | None:
        share = self.units[unit][0]
        return load_unit(self.out, unit, self.fingerprint, self.shingling, {self.reading.files[e.file] for e in share},
                         len(self.sets))

    def _decide(self, units: list[Signed], first: int) -> Verdicts:
        docs = _Rows([s.docs for s in units])
        prints = _Rows([s.prints for s in units]) if self.options.near else None
        joined_at = self.options.joined_at()
        digest = hashlib.sha256("".join([self.fingerprint, *(s.digest for s in units)]).encode()).hexdigest()
        near, copies = matched(self.out, [s.routed for s in units], [len(s.docs) for s in units], prints, joined_at,
                               self.options.bands if self.options.near else 0, digest, first)
        dedup = near  # --dedup near removes at the threshold itself, whatever the split joined
        if prints is not None and self.options.dedup == Dedup.NEAR and joined_at < self.options.threshold:
            dedup = near[similar(prints, near // docs.count, near % docs.count, self.options.threshold)]
        hits = np.concatenate([np.empty(0, HIT), *(s.hits for s in units)])
        hits["doc"] += np.repeat(docs.offsets[:-1], [len(s.hits) for s in units])  # each unit's to the run's
        found = _found(docs.count, near, dedup, copies, hits)
        info = docs[found.members]
        starts = np.concatenate([[0], np.cumsum([n for s in units for n in s.slots], dtype=np.int64)])
        reads_before = np.cumsum([0] + [len(s.slots) for s in units])
        unit_of = np.searchsorted(docs.offsets, found.members, side="right") - 1
        number = starts[reads_before[unit_of] + info["read"]] + info["number"]
        verdicts, why, val, record = decide(self.options, info, found, self.sets,
                                            np.array(self.groups, dtype=np.int64), self.inputs,
                                            self.reading.holdout.kind == Rule.INPUTS)
        if self.index is not None:
            for at, entry in enumerate(record["decontaminate"]["files"]):
                entry["too_short"] = self.index.skipped.get(at, 0)
            self._bounded(docs, info["val"].astype(bool), val, why, record["decontaminate"]["files"])
        moved = np.flatnonzero(verdicts)
        placed = Placement(starts.tolist(), number[moved], verdicts[moved].astype(np.uint8),
                           [s.input_sha256 for s in units],
                           _placed(unit_of[moved], info[moved], verdicts[moved], len(units)), self.out)
        placed.save(self.fingerprint, digest)
        return Verdicts(placed, record, _Outcome(found, info, why, val), docs, prints, not self.reading.chat, self,
                        digest)

    def _bounded(self, docs: _Rows, own_val: np.ndarray, val: np.ndarray, why: np.ndarray,
                 files: list[dict[str, Any]]) -> None:
        """Refuse a decontamination that would remove more than its share of train: evaluation
        texts that match most documents are an answer column, not questions."""
        removed = int(np.count_nonzero(why == Removed.EVALUATION))
        if not removed:
            return
        in_val = docs.holding("val", True)
        train = docs.count - in_val - int(np.count_nonzero(val & ~own_val)) + int(np.count_nonzero(~val & own_val))
        limit = self.options.decontaminate_max_share
        if removed <= limit * train:
            return
        worst = max(range(len(files)), key=lambda i: files[i].get("removed", 0))
        shortest = ", ".join(repr(t) for t in self.index.shortest.get(worst, [])) if self.index is not None else ""
        raise ValueError(f"--decontaminate would remove {removed:,} of the {train:,} train documents "
                         f"({removed / train:.0%}), more than --decontaminate-max-share {limit:g}: "
                         f"{files[worst]['path']} matches {files[worst].get('removed', 0):,} of them (its shortest "
                         f"texts matched: {shortest}); raise --decontaminate-min-words, take the answers out of "
                         "that file, or pass --decontaminate-max-share 1 to remove them all")


def _placed(units: np.ndarray, info: np.ndarray, verdicts: np.ndarray, count: int) -> list[str]:
    """Each of ``count`` units' digest of the verdicts of its documents (``units``, ascending, the
    unit of each moved or dropped document; ``info`` their records): by their read and number in
    the unit, so that it changes only where the unit's own documents go elsewhere."""
    rows = np.zeros(len(units), dtype=[("read", "<i8"), ("number", "<i8"), ("verdict", "u1")])
    rows["read"], rows["number"], rows["verdict"] = info["read"], info["number"], verdicts
    bounds = np.searchsorted(units, np.arange(count + 1))
    return [hashlib.sha256(rows[bounds[u]:bounds[u + 1]].tobytes()).hexdigest() for u in range(count)]


class _Found(NamedTuple):
    """The documents the match names (``members``, ascending, by their index in the run): those
    in a cluster of near-duplicates (or copies) and those holding evaluation n-grams."""

    members: np.ndarray
    first: np.ndarray  # each member's first document of its cluster: its own where it has none
    dedup_first: np.ndarray  # the same, of the clusters --dedup near removes from (joined at the threshold)
    copy: np.ndarray  # a member whose text is a later copy of an earlier one
    clustered: np.ndarray
    hits: np.ndarray  # HIT: (a member's place in ``members``, an evaluation set it holds n-grams of), in order
    held: np.ndarray  # a member that holds evaluation n-grams


def _found(count: int, near: np.ndarray, dedup: np.ndarray, copies: np.ndarray, hits: np.ndarray) -> _Found:
    nodes, first = firsts(near, count)  # the near pairs hold the copies too, and dedup's pairs
    copied, original = firsts(copies, count)
    members = np.union1d(nodes, hits["doc"])
    at = np.searchsorted(members, nodes)
    firsts_of, clustered, copy = members.copy(), np.zeros(len(members), bool), np.zeros(len(members), bool)
    firsts_of[at], clustered[at] = first, True
    deduped, kept = firsts(dedup, count)
    dedup_first = members.copy()
    dedup_first[np.searchsorted(members, deduped)] = kept
    copy[np.searchsorted(members, copied)] = original != copied
    hits = hits.copy()
    hits["doc"] = np.searchsorted(members, hits["doc"])
    hits = hits[np.lexsort((hits["set"], hits["doc"]))]
    held = np.zeros(len(members), bool)
    held[hits["doc"]] = True
    return _Found(members, firsts_of, dedup_first, copy, clustered, hits, held)


class _Outcome(NamedTuple):
    """What the decision says of each member: its document record (``signatures.DOC``), the code
    of why it is removed (``format.Removed``), and whether it ends in val."""

    found: _Found
    info: np.ndarray
    why: np.ndarray
    val: np.ndarray


class Verdicts:
    """The guard stage's outcome: where each moved or dropped document goes (``placement``), the
    record for meta.json, and what the reports are made of."""

    def __init__(self, placement: Placement, record: dict[str, Any], outcome: _Outcome, docs: _Rows,
                 prints: _Rows | None, indexed: bool, guard: Guard, signed: str):
        self.placement, self.record, self.outcome, self.docs, self.prints = placement, record, outcome, docs, prints
        self.guard, self.signed = guard, signed  # signed: the digest of the signatures they were decided from
        self.indexed = indexed  # text: a document's index in its split follows from the verdicts

    def report(self, split: str) -> Iterator[dict[str, Any]]:
        """The report of ``split``: each document the guard moved into it or removed from it, or
        found near copies (or copies) of, or evaluation n-grams in, in stored order."""
        return self.rows(split, self.guard.files, self.guard.sets)

    def removed(self, split: str) -> dict[str, int]:
        """How many documents the guard removed from ``split``, by why (``format.Removed``'s labels)."""
        _, _, why, val = self.outcome
        counts = np.bincount(why[val == (split == "val")], minlength=len(Removed))
        return {str(Removed(code).label): int(n) for code, n in enumerate(counts.tolist()) if code and n}

    def rows(self, split: str, files: list[str], sets: list[str]) -> Iterator[dict[str, Any]]:
        found, info, why, val = self.outcome
        listed = np.flatnonzero((val == (split == "val")) & (found.clustered | found.held))
        index = self._indexes(split) if self.indexed else None
        bounds = np.searchsorted(found.hits["doc"], np.arange(len(val) + 1))  # each member's hits
        for at in range(0, len(listed), _ROWS_AT_ONCE):  # a block at a time: rows are Python objects
            some = listed[at:at + _ROWS_AT_ONCE]
            similar = np.ones(len(some))
            if self.prints is not None:
                similar = (self.prints[found.members[some]] == self.prints[found.first[some]]).mean(axis=1)
            for d, sim in zip(some.tolist(), similar.tolist()):
                yield {"document": int(found.members[d]), "file": files[info["file"][d]],
                       "own_split": "val" if info["val"][d] else "train",
                       "index": int(index[d]) if index is not None and not why[d] else None,
                       "cluster": int(found.first[d]) if found.clustered[d] else None,
                       "similarity": round(float(sim), 4) if found.clustered[d] else None,
                       "removed": GUARD_REMOVED[why[d]],
                       **({"evaluation": [sets[i] for i in found.hits["set"][bounds[d]:bounds[d + 1]]]}
                          if found.held[d] else {})}

    def _indexes(self, split: str) -> np.ndarray:
        """Each member's index among the documents written to ``split`` (where it is written
        there): the documents of ``split`` before it, less the members before it that left or
        were dropped, plus those before it that came."""
        found, info, why, val = self.outcome
        own = info["val"].astype(bool) == (split == "val")
        kept = (val == (split == "val")) & (why == 0)
        left, came = np.cumsum(own & ~kept) - (own & ~kept), np.cumsum(~own & kept) - (~own & kept)
        return self.docs.before(found.members, "val", split == "val") - left + came


class _Rows:
    """The arrays of every unit (``signatures.Stored``) as one array of rows, read by index."""

    def __init__(self, parts: list[np.ndarray]):
        self.parts = parts
        self.offsets = np.cumsum([0] + [len(p) for p in parts])
        self.count = int(self.offsets[-1])
        self.shape = (self.count, *parts[0].shape[1:])  # a run has a unit at least

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        out = np.empty((len(rows), *self.shape[1:]), dtype=self.parts[0].dtype)
        unit = np.searchsorted(self.offsets, rows, side="right") - 1
        for u in np.unique(unit):
            at = unit == u
            out[at] = self.parts[u][rows[at] - self.offsets[u]]
        return out

    def holding(self, field: str, value: Any) -> int:
        """How many rows hold ``value`` in ``field``: read a block at a time."""
        return sum(int(np.count_nonzero(part[lo:lo + _BLOCK][field] == value))
                   for part in self.parts for lo in range(0, len(part), _BLOCK))

    def before(self, rows: np.ndarray, field: str, value: Any) -> np.ndarray:
        """For each of ``rows`` (ascending), how many rows before it hold ``value`` in ``field``:
        read a block at a time."""
        out = np.empty(len(rows), dtype=np.int64)
        base = 0
        for u, part in enumerate(self.parts):
            for lo in range(0, len(part), _BLOCK):
                hi = min(lo + _BLOCK, len(part))
                held = np.concatenate([[0], np.cumsum(part[lo:hi][field] == value)])
                a, b = np.searchsorted(rows, [self.offsets[u] + lo, self.offsets[u] + hi])
                out[a:b] = base + held[rows[a:b] - self.offsets[u] - lo]
                base += int(held[-1])
        return out


_BLOCK = 1 << 18  # documents counted at a time
_ROWS_AT_ONCE = 1 << 11  # fingerprints compared at a time


def decide(options: GuardOptions, info: np.ndarray, found: _Found, sets: list[str], groups: np.ndarray,
           inputs: int, fixed: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """Each member's verdict (0: its own split), the code of why it is removed (see
    ``format.Removed``), whether it ends in val, and meta.json's record: from the members'
    records ``info`` (``signatures.DOC``) and what the match ``found``. ``groups``: each input
    file's input as given. ``fixed``: val is the user's (``--val-inputs``), so no document moves, none
    of val is removed, and ``--near-split`` removes the train members of a cluster that holds a val
    document instead. Every other document stays where its hash put it."""
    own_val = info["val"].astype(bool)
    cluster = np.searchsorted(found.members, found.first)
    val = own_val[cluster] if options.near_split and not fixed else own_val
    why = np.zeros(len(own_val), dtype=np.int64)
    record = _settings(options)
    later = found.first != found.members
    if options.near:
        record["near"]["clusters"] = int(len(np.unique(found.first[later])))
    if options.dedup != Dedup.NONE:
        why[found.dedup_first != found.members if options.dedup == Dedup.NEAR else found.copy] = \
            Removed.NEAR_COPY if options.dedup == Dedup.NEAR else Removed.COPY
        why[found.copy & (why > 0)] = Removed.COPY  # the same text is a copy, whatever else it is
        if fixed:  # the user's val stays as given, copies and all
            why[own_val] = Removed.KEPT
        record["dedup"]["removed"] = np.bincount(groups[info["file"][why > 0]], minlength=inputs).tolist()
    if options.near_split and fixed:  # a train near-copy of a val document, not removed already
        with_val = np.zeros(len(own_val), dtype=bool)
        np.logical_or.at(with_val, cluster, own_val)
        why[with_val[cluster] & ~own_val & (why == 0)] = Removed.NEAR_COPY_OF_VAL
    if options.decontaminate:
        record["decontaminate"].update(_contaminated(found, val, why > 0, sets, options.report_only))
        if not options.report_only:
            why[found.held & ~val & (why == 0)] = Removed.EVALUATION
    drop = why > 0
    if options.near_split:  # the documents written into the other split
        record["near"].update(moved_to_val=int(np.count_nonzero(val & ~own_val & ~drop)),
                              moved_to_train=int(np.count_nonzero(~val & own_val & ~drop)))
        if fixed:
            record["near"]["removed_from_train"] = int(np.count_nonzero(why == Removed.NEAR_COPY_OF_VAL))
    verdicts = np.where(drop, Verdict.DROP, np.where(val == own_val, 0, np.where(val, Verdict.VAL, Verdict.TRAIN)))
    return verdicts, why, val, record


def _contaminated(found: _Found, val: np.ndarray, drop: np.ndarray, sets: list[str],
                  report_only: bool) -> dict[str, Any]:
    """meta.json's count, for each evaluation file, of the train documents that hold its n-grams
    (and are not dropped as duplicates already)."""
    counted = found.held & ~val & ~drop
    per_set = np.bincount(found.hits["set"][counted[found.hits["doc"]]], minlength=len(sets))
    word = "found" if report_only else "removed"
    return {"files": [{"path": path, word: int(n)} for path, n in zip(sets, per_set)],
            word: int(np.count_nonzero(counted))}


def _settings(options: GuardOptions) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if options.near:
        out["near"] = {"ngram": options.ngram, "hashes": options.hashes, "bands": options.bands,
                       "threshold": options.threshold, "split": options.near_split,
                       **({"split_threshold": options.joined_at()} if options.near_split else {})}
    if options.dedup != Dedup.NONE:
        out["dedup"] = {"mode": options.dedup}
    if options.decontaminate:
        out["decontaminate"] = {"ngram": options.decontaminate_ngram, "min_words": options.decontaminate_min_words,
                                "report_only": options.report_only}
    return out
