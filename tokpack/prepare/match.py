"""The match stage of a guarded run: the pairs of near-duplicates and of copies among every
unit's signatures, with memory bounded by disk rather than by the number of documents.

Each document's text hash, then each document's band hashes (but a later copy's, which are its
first copy's), are routed to spill files by band and hash range (the hashes are uniform, so each
file holds an even share; a file over 8 MB is routed again, by finer ranges); then one file at a
time is sorted, and in each bucket of equal hashes every document is compared with the bucket's
first and with the one before it (``clusters.pairs_of``), a text hash's pair joined as a copy, a
band's pair joined where enough of its fingerprints agree. In memory at once: one spill file's
entries and the joined pairs (a few per duplicated document), never an array a document.

Cost: O(documents x bands) written and read once, 18 bytes an entry on disk while matching
(594 bytes a document at 32 bands), removed when done; O(pairs) to join them into clusters.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..dedup.clusters import components, lookup, pairs_of, similar
from ..format import MATCH
from ..storage.local import open_new, remove_own, tmp_path

ENTRY = np.dtype([("hash", "<u8"), ("doc", "<i8"), ("band", "<u2")])
_SPILL_BYTES = 8 << 20  # a spill file matched at once; a larger one is routed again, by finer ranges
_FANOUT = 64  # spill files a routing writes at once
_ROWS = 1 << 12  # documents, or entries of a spill file, routed at a time


class Rows(Protocol):
    """Rows of an array too large to hold, fetched by their index (a slice, or an array of them)."""

    shape: tuple[int, ...]

    def __getitem__(self, rows: Any) -> np.ndarray: ...


def matched(folder: Path, bands: list[Rows], hashes: list[Rows], prints: Rows | None,
            threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """The joined pairs, as keys ``earlier * documents + later``: near-duplicates (copies among
    them), and copies (the same text hash) alone.

    Copies are matched first, and a later copy's bands are not routed at all: its first copy's
    are the same, so a corpus of a line copied 500,000 times costs a pass over its text hashes,
    not 500,000 documents compared in every band.

    Args:
        folder: where the spill files are written (and removed).
        bands: each unit's (documents, bands) band hashes; (documents, 0) without near-duplicates.
        hashes: each unit's text hashes, a document.
        prints: the fingerprints of every document by its index in the run, or None: copies only.
        threshold: the least share of agreeing fingerprints that joins a band's pair.
    """
    offsets = np.cumsum([0] + [len(h) for h in hashes])
    count = int(offsets[-1])
    copies = _matched(folder, _documents([_Column(h) for h in hashes], offsets, None), 1, count, lambda keys: keys)
    if prints is None:
        return copies, copies
    width = bands[0].shape[1] if bands else 0
    later = np.unique(copies % count) if count else np.empty(0, np.int64)
    near = _matched(folder, _documents(bands, offsets, later), width, count,
                    lambda keys: keys[similar(prints, keys // count, keys % count, threshold)])
    return np.union1d(near, copies), copies


class _Column:
    """A unit's text hashes as one band: (documents, 1)."""

    def __init__(self, rows: Rows):
        self.rows, self.shape = rows, (rows.shape[0], 1)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, at: Any) -> np.ndarray:
        return np.asarray(self.rows[at])[:, None]


def _matched(folder: Path, blocks: Iterator[np.ndarray], width: int, count: int,
             joined: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The pairs of documents that share a band's hash, routed through spill files (``_route``),
    those that ``joined`` keeps."""
    found = np.empty(0, np.int64)
    written: list[Path] = []
    try:
        pending = _route(folder, blocks, 0, max(width, 1) << 32, count * width * ENTRY.itemsize / _SPILL_BYTES,
                         written)
        while pending:
            path, lo, hi = pending.pop()
            size = path.stat().st_size
            if size > _SPILL_BYTES and hi - lo > 1:
                pending += _route(folder, _read(path), lo, hi, size / _SPILL_BYTES, written)
                remove_own(path)
                continue
            entries = np.concatenate([np.empty(0, ENTRY), *_read(path)])
            remove_own(path)
            entries = entries[np.lexsort((entries["doc"], entries["hash"], entries["band"]))]
            same = (entries["hash"][1:] == entries["hash"][:-1]) & (entries["band"][1:] == entries["band"][:-1])
            found = np.union1d(found, joined(pairs_of(entries["doc"], same, count)))
    finally:
        for path in written:
            remove_own(path)
    return found


def _documents(bands: list[Rows], offsets: np.ndarray, skipped: np.ndarray | None) -> Iterator[np.ndarray]:
    """Every document's entries, a block of documents at a time, in document order; none of the
    documents ``skipped`` (ascending)."""
    for unit, band in enumerate(bands):
        width = band.shape[1]
        for lo in range(0, len(band), _ROWS):
            hi = min(lo + _ROWS, len(band))
            docs = np.arange(offsets[unit] + lo, offsets[unit] + hi)
            keep = slice(None) if skipped is None or not len(skipped) else ~lookup(skipped, docs)[1]
            values = np.asarray(band[lo:hi])[keep]
            entries = np.empty(values.size, dtype=ENTRY)
            entries["hash"] = values.ravel()
            entries["doc"] = np.repeat(docs[keep], width)
            entries["band"] = np.tile(np.arange(width, dtype=np.uint16), len(values))
            yield entries


def _read(path: Path) -> Iterator[np.ndarray]:
    """A spill file's entries, a block at a time."""
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as f:
        while len(entries := np.fromfile(f, dtype=ENTRY, count=_ROWS)):
            yield entries


def _route(folder: Path, blocks: Iterator[np.ndarray], lo: int, hi: int, parts: float,
           written: list[Path]) -> list[tuple[Path, int, int]]:
    """Entries whose cell (band, then the hash's top 32 bits) lies in [lo, hi) into spill files
    of even shares of that range, in the order given: each file with its range."""
    k = int(min(_FANOUT, max(1, math.ceil(parts)), hi - lo))
    cuts = [lo + (hi - lo) * g // k for g in range(k + 1)]
    paths = [tmp_path(folder / MATCH.format(len(written) + g)) for g in range(k)]
    files: list[Any] = []
    try:
        for path in paths:
            files.append(open_new(path))
            written.append(path)
        for entries in blocks:
            cell = (entries["band"].astype(np.uint64) << np.uint64(32)) | (entries["hash"] >> np.uint64(32))
            group = np.searchsorted(np.array(cuts[1:-1], dtype=np.uint64), cell, side="right")
            order = np.argsort(group, kind="stable")
            bounds = np.searchsorted(group[order], np.arange(k + 1))
            for g in np.flatnonzero(np.diff(bounds)):
                files[g].write(entries[order[bounds[g]:bounds[g + 1]]].tobytes())
    finally:
        for f in files:
            f.close()
    return [(path, cuts[g], cuts[g + 1]) for g, path in enumerate(paths)]


def firsts(keys: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The documents the joined pairs ``keys`` name (ascending) and each one's first document:
    the smallest of its cluster, the connected component of the pairs."""
    left, right = keys // count, keys % count
    nodes, inverse = np.unique(np.concatenate([left, right]), return_inverse=True)
    labels = components(len(nodes), inverse[:len(left)], inverse[len(left):])
    return nodes, nodes[labels]
