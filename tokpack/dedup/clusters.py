"""Near-duplicate clusters from signatures: candidates by shared bands, kept where the estimated
similarity reaches the threshold, joined into clusters labelled by their first text.

    first = clusters(fingerprints, bands, threshold=0.8)    # first[i]: the first text of i's cluster

Two texts are candidates when they share a band's hash (the usual LSH banding: with b bands of r
bins, a pair of similarity s shares one with probability 1 - (1 - s**r)**b). A candidate pair is
joined when the share of its bins that agree (an estimate of its Jaccard similarity with a
standard error of sqrt(s (1 - s) / hashes)) is at least the threshold, so banding decides which
pairs are compared and the estimate decides which are joined. Within a band's bucket each text is
compared with the bucket's first text and with the text before it, so a bucket of m texts costs
2m comparisons, never m**2 / 2. Clusters are the connected components of the joined pairs.

Memory, in this in-memory form: one band's hashes and order at a time (16 bytes a text), the
cluster labels (8 bytes a text) and the joined pairs. A prepare run matches through spill files
instead (``tokpack.prepare.guard.match``), with ``pairs_of``, ``similar`` and ``components``.

See docs/dedup.md.
"""

from __future__ import annotations

import numpy as np

# Candidate pairs are compared in blocks of this many, to bound the fingerprints held at once.
_BLOCK = 1 << 11


def candidates(band: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs (earlier, later) of texts to compare for one band's hashes: in each bucket of
    equal hashes, every text with the bucket's first and with the one before it."""
    order = np.argsort(band, kind="stable")  # within a bucket, texts stay in their order
    ranked = band[order]
    keys = pairs_of(order, ranked[1:] == ranked[:-1], len(band))
    return keys // len(band), keys % len(band)


def pairs_of(ordered: np.ndarray, same: np.ndarray, count: int) -> np.ndarray:
    """The candidate pairs of texts in bucket order, as keys ``earlier * count + later``.

    Args:
        ordered: text indices, bucket by bucket, each bucket's in ascending order.
        same: whether ``ordered[i + 1]`` is in the bucket of ``ordered[i]``.
        count: more than the largest index.
    """
    if not same.any():
        return np.empty(0, np.int64)
    start = np.concatenate([[True], ~same])
    head = ordered[np.flatnonzero(start)[np.cumsum(start) - 1]]
    later = ordered[1:][same]
    return np.unique(np.concatenate([ordered[:-1][same], head[1:][same]]) * count + np.concatenate([later, later]))


def lookup(sorted_keys: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of ``keys`` would stand in ``sorted_keys`` (ascending), and whether it is there:
    O(keys x log sorted_keys), whatever their sizes."""
    if not len(sorted_keys):
        return np.zeros(len(keys), dtype=np.int64), np.zeros(len(keys), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return at, sorted_keys[at] == keys


def similar(fingerprints: np.ndarray, left: np.ndarray, right: np.ndarray, threshold: float) -> np.ndarray:
    """Which of the pairs (left[i], right[i]) agree on at least ``threshold`` of their bins."""
    need = int(np.ceil(threshold * fingerprints.shape[1] - 1e-9))
    keep = np.zeros(len(left), dtype=bool)
    for at in range(0, len(left), _BLOCK):
        a, b = left[at:at + _BLOCK], right[at:at + _BLOCK]
        keep[at:at + _BLOCK] = (fingerprints[a] == fingerprints[b]).sum(axis=1) >= need
    return keep


def components(count: int, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Each of ``count`` texts' smallest index in its connected component of the pairs: labels
    lowered along the pairs and shortcut (label of label) until nothing changes."""
    labels = np.arange(count)
    if not len(left):
        return labels
    while True:
        lowest = np.minimum(labels[left], labels[right])
        lowered = labels.copy()
        np.minimum.at(lowered, left, lowest)
        np.minimum.at(lowered, right, lowest)
        while not np.array_equal(shortcut := lowered[lowered], lowered):
            lowered = shortcut
        if np.array_equal(lowered, labels):
            return labels
        labels = lowered


def clusters(fingerprints: np.ndarray, bands: np.ndarray, threshold: float) -> np.ndarray:
    """The first (smallest) index of each text's cluster of near-duplicates: its own where it has none.

    Args:
        fingerprints: (texts, hashes) uint16, a text's bin fingerprints (``minhash.sign``).
        bands: (texts, bands) uint64, a text's band hashes.
        threshold: the least share of agreeing bins that joins a candidate pair, in (0, 1].
    """
    pairs = []
    for b in range(bands.shape[1]):
        left, right = candidates(np.ascontiguousarray(bands[:, b]))
        keep = similar(fingerprints, left, right, threshold)
        pairs.append(left[keep] * len(bands) + right[keep])
    joined = np.unique(np.concatenate(pairs) if pairs else np.empty(0, np.int64))
    return components(len(bands), joined // len(bands), joined % len(bands))
