"""The match stage of a guarded run: the pairs of near-duplicates and of copies among every
unit's signatures, shared out among the run's tasks, with memory bounded by disk rather than by
the number of documents.

The entries to match are cut into parts when they are signed (``routed``): the text hashes by
hash range (``Kind.COPIES``), the band hashes by band range (``Kind.NEAR``), ``PARTS`` each, so
that a part reads only its own entries of every unit. A task matches the parts from its own
share of them on, then any that no task is matching (a claim, an advisory lock on the part, shows
which are), then waits for the rest, and matches one whose task died; each part's pairs go to a
file with a record (``.tokpack-sign-pairs-near07.bin`` and ``.json``: the signatures it was matched from,
its pairs' count and sha256, the unit of the task that matched it), which every later task, and
a rerun, reads instead of matching it again. Copies are matched first, and a later copy's bands
are passed over: its first copy's are the same, so a corpus of a line copied 500,000 times costs
a pass over its text hashes, not 500,000 documents compared in every band.

Within a part, its entries are sorted in memory where they fit in one spill file (8 MB), else
routed to spill files by finer hash ranges (the hashes are uniform, so each file holds an even
share; a file over 8 MB is routed again) and one file at a time is sorted; in each bucket of
equal hashes every document is compared with the bucket's first and with the one before it
(``clusters.pairs_of``), a text hash's pair joined as a copy, a band's pair joined where enough of
its fingerprints agree. In memory at once: one spill file's entries and the joined pairs (a few
per duplicated document), never an array a document.

Cost, for the run whatever its task count: O(documents x bands) written when signed and read
once when matched, and, for a part larger than a spill file, as much again through the spill
files; O(pairs) to join them into
clusters. Tasks that run at once share it; a task that comes later reads the parts' pairs.
"""

from __future__ import annotations

import enum
import hashlib
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from ...dedup.clusters import components, lookup, pairs_of, similar
from ...format import MATCH, PAIRS, load_json
from ...storage.local import claimed, named_errors, open_new, read_own, remove_own, tmp_path, write_json_atomic

ENTRY = np.dtype([("hash", "<u8"), ("doc", "<i8"), ("band", "<u2")])
PARTS = 16  # parts of each kind: the most tasks that can share a match
_SPILL_BYTES = 8 << 20  # a spill file matched at once; a larger one is routed again, by finer ranges
_FANOUT = 64  # spill files a routing writes at once
_ROWS = 1 << 12  # documents, or entries of a spill file, routed at a time


class Stale(ValueError):
    """A unit's part of the entries does not hash as signed (its file written but not on disk when
    the machine stopped): the unit is signed again."""

    def __init__(self, unit: int, path: Path):
        super().__init__(f"{path} changed since it was signed; run the same command again")
        self.unit = unit


class Kind(enum.StrEnum):
    """What a part matches: text hashes (copies of the same text) or band hashes (near-duplicates)."""

    COPIES = "copies"
    NEAR = "near"


class Part(NamedTuple):
    """A part of the match: the entries of ``kind`` whose cell (band, then the hash's top 32
    bits) lies in [lo, hi)."""

    kind: Kind
    number: int
    lo: int
    hi: int

    @property
    def name(self) -> str:
        return f"{self.kind}{self.number:02d}"


def parts(bands: int) -> list[Part]:
    """The run's parts: ``PARTS`` hash ranges of the text hashes, and (with near-duplicates, of
    ``bands`` bands) the bands cut into ``PARTS`` ranges, or one a band where there are fewer."""
    found = [Part(Kind.COPIES, p, (p << 32) // PARTS, ((p + 1) << 32) // PARTS) for p in range(PARTS)]
    if bands:
        count = min(PARTS, bands)
        found += [Part(Kind.NEAR, p, (p * bands // count) << 32, ((p + 1) * bands // count) << 32)
                  for p in range(count)]
    return found


def _cells(entries: np.ndarray) -> np.ndarray:
    return (entries["band"].astype(np.uint64) << np.uint64(32)) | (entries["hash"] >> np.uint64(32))


def routed(kind: Kind, values: np.ndarray, docs: np.ndarray) -> Iterator[tuple[Part, np.ndarray]]:
    """The entries of ``values`` (documents ``docs``, a row each: their text hash, or their band
    hashes), cut into the parts of ``kind``."""
    width = values.shape[1]
    entries = np.empty(values.size, dtype=ENTRY)
    entries["hash"] = values.ravel()
    entries["doc"] = np.repeat(docs, width)
    entries["band"] = np.tile(np.arange(width, dtype=np.uint16), len(values))
    own = [p for p in parts(width if kind == Kind.NEAR else 0) if p.kind == kind]
    group = np.searchsorted(np.array([p.lo for p in own[1:]], dtype=np.uint64), _cells(entries), side="right")
    order = np.argsort(group, kind="stable")
    bounds = np.searchsorted(group[order], np.arange(len(own) + 1))
    for p, part in enumerate(own):
        yield part, entries[order[bounds[p]:bounds[p + 1]]]


class Rows(Protocol):
    """Rows of an array too large to hold, fetched by their index (a slice, or an array of them)."""

    shape: tuple[int, ...]

    def __getitem__(self, rows: Any) -> np.ndarray: ...


def matched(folder: Path, routed_files: list[dict[str, tuple[Path, str]]], counts: list[int], prints: Rows | None,
            threshold: float, bands: int, signed: str, first: int) -> tuple[np.ndarray, np.ndarray]:
    """The joined pairs, as keys ``earlier * documents + later``: near-duplicates (copies among
    them), and copies (the same text hash) alone.

    Args:
        folder: where the parts' pairs, and the spill files while matching, are written.
        routed_files: each unit's file of each part (``Part.name``), and its sha256 as signed.
        counts: each unit's documents.
        prints: the fingerprints of every document by its index in the run, or None: copies only.
        threshold: the least share of agreeing fingerprints that joins a band's pair.
        bands: the signatures' bands, or 0: copies only.
        signed: a digest of every unit's signatures and the run's options: a part's pairs are
            kept where they were matched from the same.
        first: the first unit of the task: its share of the parts is matched first.
    """
    offsets = np.cumsum([0] + counts)
    count = int(offsets[-1])
    every = parts(bands)

    def shared(kind: Kind, joined: Callable[[np.ndarray], np.ndarray], skipped: np.ndarray | None) -> np.ndarray:
        own = [p for p in every if p.kind == kind]
        start = first * len(own) // max(len(counts), 1)
        found: dict[int, np.ndarray] = {}
        # Its own share first, then any part no task is matching; then it waits for the parts
        # other tasks are matching, and matches a part whose task died (its claim released).
        for waits in (False, True):
            for part in own[start:] + own[:start]:
                if part.number in found:
                    continue
                pairs = _kept(folder, part, signed, count)
                if pairs is None:
                    with claimed(folder / PAIRS.format(part.kind, part.number, "lock"), waits) as mine:
                        if not mine:
                            continue
                        pairs = _kept(folder, part, signed, count)  # matched while this task waited
                        if pairs is None:
                            files = [unit[part.name] for unit in routed_files]
                            size = sum(path.stat().st_size for path, _ in files)
                            pairs = _matched(folder, _entries(files, offsets, skipped, part), part,
                                             size / _SPILL_BYTES, count, joined)
                            _keep(folder, part, signed, pairs, first)
                found[part.number] = pairs
        return np.unique(np.concatenate([np.empty(0, np.int64), *found.values()]))

    copies = shared(Kind.COPIES, lambda keys: keys, None)
    if prints is None:
        return copies, copies
    later = np.unique(copies % count) if count else np.empty(0, np.int64)
    near = shared(Kind.NEAR, lambda keys: keys[similar(prints, keys // count, keys % count, threshold)], later)
    return np.union1d(near, copies), copies


def _entries(files: list[tuple[Path, str]], offsets: np.ndarray, skipped: np.ndarray | None,
             part: Part) -> Iterator[np.ndarray]:
    """Each unit's entries of ``part``, a block at a time, its documents numbered as the run's;
    none of the documents ``skipped`` (ascending). An entry outside the part or its unit, or a
    file that does not hash as signed, raises ``Stale``."""
    for unit, (path, sha256) in enumerate(files):
        digest = hashlib.sha256()
        for entries in _read(path):
            digest.update(entries.tobytes())
            cells = _cells(entries)
            if not ((entries["doc"] >= 0) & (entries["doc"] < offsets[unit + 1] - offsets[unit])
                    & (cells >= part.lo) & (cells < part.hi)).all():
                raise Stale(unit, path)
            entries["doc"] += offsets[unit]
            if skipped is not None and len(skipped):
                entries = entries[~lookup(skipped, entries["doc"])[1]]
            yield entries
        if digest.hexdigest() != sha256:
            raise Stale(unit, path)


def _kept(folder: Path, part: Part, signed: str, count: int) -> np.ndarray | None:
    """The pairs of ``part`` a task matched from the same signatures, if they are whole, else None."""
    try:
        record = load_json(read_own(folder / PAIRS.format(part.kind, part.number, "json")),
                           f"{folder}'s pairs of {part.name}", "they are matched again")
        if not (isinstance(record, dict) and record.get("signed") == signed and type(record.get("pairs")) is int
                and isinstance(record.get("sha256"), str)):
            return None
        fd = os.open(folder / PAIRS.format(part.kind, part.number, "bin"), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            raw = f.read(record["pairs"] * 8 + 1)
    except (OSError, ValueError):
        return None
    pairs = np.frombuffer(raw, dtype="<i8") if len(raw) == record["pairs"] * 8 else None
    if pairs is None or hashlib.sha256(raw).hexdigest() != record["sha256"]:
        return None
    earlier, later = pairs // max(count, 1), pairs % max(count, 1)
    if not ((pairs >= 0).all() and (earlier < later).all() and (np.diff(pairs) > 0).all()):
        return None
    return pairs.astype(np.int64)


def _keep(folder: Path, part: Part, signed: str, pairs: np.ndarray, first: int) -> None:
    """``part``'s pairs and their record, the record last: a killed task leaves none, or both."""
    path = folder / PAIRS.format(part.kind, part.number, "bin")
    tmp = tmp_path(path)
    raw = np.ascontiguousarray(pairs, dtype="<i8").tobytes()
    try:
        with named_errors(path), open_new(tmp) as f:
            f.write(raw)
    except BaseException:
        remove_own(tmp)
        raise
    os.replace(tmp, path)
    write_json_atomic(folder / PAIRS.format(part.kind, part.number, "json"),
                      {"signed": signed, "part": part.name, "pairs": len(pairs),
                       "sha256": hashlib.sha256(raw).hexdigest(), "by": first}, durable=False)


def _matched(folder: Path, blocks: Iterator[np.ndarray], part: Part, parts: float, count: int,
             joined: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The pairs of documents that share a band's hash among ``part``'s entries (``parts``: their
    size in spill files), those that ``joined`` keeps: sorted in memory where they fit in one
    spill file, else routed through spill files (``_route``) and sorted one file at a time."""

    def pairs(entries: np.ndarray) -> np.ndarray:
        entries = entries[np.lexsort((entries["doc"], entries["hash"], entries["band"]))]
        same = (entries["hash"][1:] == entries["hash"][:-1]) & (entries["band"][1:] == entries["band"][:-1])
        return joined(pairs_of(entries["doc"], same, count))

    if parts <= 1:
        return np.unique(pairs(np.concatenate([np.empty(0, ENTRY), *blocks])))
    found = np.empty(0, np.int64)
    written: list[Path] = []
    try:
        pending = _route(folder, blocks, part.lo, part.hi, parts, written, part.name)
        while pending:
            path, lo, hi = pending.pop()
            size = path.stat().st_size
            if size > _SPILL_BYTES and hi - lo > 1:
                pending += _route(folder, _read(path), lo, hi, size / _SPILL_BYTES, written, part.name)
                remove_own(path)
                continue
            entries = np.concatenate([np.empty(0, ENTRY), *_read(path)])
            remove_own(path)
            found = np.union1d(found, pairs(entries))
    finally:
        for path in written:
            remove_own(path)
    return found


def _read(path: Path) -> Iterator[np.ndarray]:
    """A spill file's entries, a block at a time."""
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as f:
        while len(entries := np.fromfile(f, dtype=ENTRY, count=_ROWS)):
            yield entries


def _route(folder: Path, blocks: Iterator[np.ndarray], lo: int, hi: int, parts: float,
           written: list[Path], name: str) -> list[tuple[Path, int, int]]:
    """Entries whose cell (band, then the hash's top 32 bits) lies in [lo, hi) into spill files
    of even shares of that range, named after the part ``name``, in the order given: each file
    with its range."""
    k = int(min(_FANOUT, max(1, math.ceil(parts)), hi - lo))
    cuts = [lo + (hi - lo) * g // k for g in range(k + 1)]
    paths = [tmp_path(folder / MATCH.format(name, len(written) + g)) for g in range(k)]
    files: list[Any] = []
    try:
        for path in paths:
            files.append(open_new(path))
            written.append(path)
        for entries in blocks:
            group = np.searchsorted(np.array(cuts[1:-1], dtype=np.uint64), _cells(entries), side="right")
            order = np.argsort(group, kind="stable")
            bounds = np.searchsorted(group[order], np.arange(k + 1))
            for g in np.flatnonzero(np.diff(bounds)):
                with named_errors(paths[g]):
                    files[g].write(entries[order[bounds[g]:bounds[g + 1]]].tobytes())
    finally:
        for path, f in zip(paths, files):
            with named_errors(path):
                f.close()
    return [(path, cuts[g], cuts[g + 1]) for g, path in enumerate(paths)]


def firsts(keys: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The documents the joined pairs ``keys`` name (ascending) and each one's first document:
    the smallest of its cluster, the connected component of the pairs."""
    left, right = keys // count, keys % count
    nodes, inverse = np.unique(np.concatenate([left, right]), return_inverse=True)
    labels = components(len(nodes), inverse[:len(left)], inverse[len(left):])
    return nodes, nodes[labels]
