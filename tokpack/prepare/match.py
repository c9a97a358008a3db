"""The match stage of a guarded run: the pairs of near-duplicates and of copies among every
unit's signatures, with memory bounded by disk rather than by the number of documents.

Each document's band hashes, and its text's hash as one more band (copies), are routed to spill
files by band and hash range (the hashes are uniform, so each file holds an even share, about
64 MB); then one file at a time is sorted, and in each bucket of equal hashes every document is
compared with the bucket's first and with the one before it (``clusters.candidates``), a band's
pair joined where enough of its fingerprints agree, a text hash's pair joined as a copy. In memory
at once: one spill file's entries and the joined pairs (a few per duplicated document), never an
array a document.

Cost: O(documents x bands) written and read once, 18 bytes an entry on disk while matching
(594 bytes a document at 32 bands), removed when done; O(pairs) to join them into clusters.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..dedup.clusters import components, pairs_of, similar
from ..format import MATCH
from ..storage.local import open_new, remove_own, tmp_path

ENTRY = np.dtype([("hash", "<u8"), ("doc", "<i8"), ("band", "<u2")])
_SPILL_BYTES = 64 << 20
_MAX_SPILLS = 512  # files open at once while routing; past it a file grows beyond _SPILL_BYTES
_ROWS = 1 << 14  # documents routed at a time


class Rows(Protocol):
    """Rows of an array too large to hold, fetched by their index."""

    shape: tuple[int, ...]

    def __getitem__(self, rows: np.ndarray) -> np.ndarray: ...


def matched(folder: Path, bands: list[np.ndarray], hashes: list[np.ndarray], prints: Rows | None,
            threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """The joined pairs, as keys ``earlier * documents + later``: near-duplicates (copies among
    them), and copies (the same text hash) alone.

    Args:
        folder: where the spill files are written (and removed).
        bands: each unit's (documents, bands) band hashes; (documents, 0) without near-duplicates.
        hashes: each unit's text hashes, a document.
        prints: the fingerprints of every document by its index in the run, or None: copies only.
        threshold: the least share of agreeing fingerprints that joins a band's pair.
    """
    offsets = np.cumsum([0] + [len(h) for h in hashes])
    count = int(offsets[-1])
    width = (bands[0].shape[1] if bands else 0) + 1  # the text hash is the last band
    groups = min(_MAX_SPILLS, max(1, math.ceil(count * width * ENTRY.itemsize / _SPILL_BYTES)))
    paths = [tmp_path(folder / MATCH.format(g)) for g in range(groups)]
    near = copies = np.empty(0, np.int64)
    try:
        _route(paths, bands, hashes, offsets, width)
        for path in paths:
            entries = np.fromfile(path, dtype=ENTRY)
            remove_own(path)
            entries = entries[np.lexsort((entries["doc"], entries["hash"], entries["band"]))]
            same = (entries["hash"][1:] == entries["hash"][:-1]) & (entries["band"][1:] == entries["band"][:-1])
            text = entries["band"][1:] == width - 1
            copies = np.union1d(copies, pairs_of(entries["doc"], same & text, count))
            if prints is not None:  # a copy shares every band, and every fingerprint, with its first
                keys = pairs_of(entries["doc"], same & ~text, count)
                near = np.union1d(near, keys[similar(prints, keys // count, keys % count, threshold)])
    finally:
        for path in paths:
            remove_own(path)
    return (near if prints is not None else copies), copies


def _route(paths: list[Path], bands: list[np.ndarray], hashes: list[np.ndarray], offsets: np.ndarray,
           width: int) -> None:
    """Every document's entries into the spill file of its band and hash range, in document order."""
    files: list[Any] = []
    try:
        files = [open_new(path) for path in paths]
        span = np.uint64(width) << np.uint64(32)
        for unit, (band, text) in enumerate(zip(bands, hashes)):
            for lo in range(0, len(text), _ROWS):
                hi = min(lo + _ROWS, len(text))
                entries = np.empty((hi - lo) * width, dtype=ENTRY)
                entries["hash"] = np.concatenate([band[lo:hi], text[lo:hi, None]], axis=1).ravel()
                entries["doc"] = np.repeat(np.arange(offsets[unit] + lo, offsets[unit] + hi), width)
                entries["band"] = np.tile(np.arange(width, dtype=np.uint16), hi - lo)
                cell = (entries["band"].astype(np.uint64) << np.uint64(32)) | (entries["hash"] >> np.uint64(32))
                group = (cell * np.uint64(len(files)) // span).astype(np.int64)
                order = np.argsort(group, kind="stable")
                bounds = np.searchsorted(group[order], np.arange(len(files) + 1))
                for g in np.flatnonzero(np.diff(bounds)):
                    files[g].write(entries[order[bounds[g]:bounds[g + 1]]].tobytes())
    finally:
        for f in files:
            f.close()


def firsts(keys: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The documents the joined pairs ``keys`` name (ascending) and each one's first document:
    the smallest of its cluster, the connected component of the pairs."""
    left, right = keys // count, keys % count
    nodes, inverse = np.unique(np.concatenate([left, right]), return_inverse=True)
    labels = components(len(nodes), inverse[:len(left)], inverse[len(left):])
    return nodes, nodes[labels]
