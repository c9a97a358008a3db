"""A seeded shuffle of 0..n-1 computed position by position: no permutation array, at any n.

    from tokpack.data.permutation import Shuffle
    order = Shuffle(9_000_000_000, 1337, 0)       # epoch 0 of nine billion windows
    order(np.arange(5, dtype=np.uint64))            # where positions 0..4 of the shuffle point

A 4-round Feistel network over the smallest even-bit domain that holds n is a bijection of that
domain; cycle-walking (re-applying it to results >= n, at most a few times on average, since the
domain is under 4n) turns it into a bijection of 0..n-1. So position p of an epoch's order is
computed on its own: memory O(batch) and resume O(1) whatever n is.

See docs/loading.md.
"""

from __future__ import annotations

import numpy as np

from .runtime import mix_seed

ROUNDS = 4
_M1 = np.uint64(0xBF58476D1CE4E5B9)  # splitmix64's mixing constants
_M2 = np.uint64(0x94D049BB133111EB)


class Shuffle:
    """The bijection of 0..n-1 for one (seed, epoch, ...); call it on uint64 positions."""

    def __init__(self, n: int, *seed_parts: int | str):
        if n < 1:
            raise ValueError(f"cannot shuffle {n} items; there must be at least one")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        self.half = (bits + 1) // 2
        self.mask = np.uint64((1 << self.half) - 1)
        self.keys = [np.uint64(mix_seed("feistel", *seed_parts, r)) for r in range(ROUNDS)]

    def _round(self, right: np.ndarray, key: np.uint64) -> np.ndarray:
        z = (right + key) * _M1  # uint64 arithmetic wraps, as the mix intends
        z ^= z >> np.uint64(31)
        z *= _M2
        z ^= z >> np.uint64(29)
        return z & self.mask

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        half = np.uint64(self.half)
        left, right = x >> half, x & self.mask
        for key in self.keys:
            left, right = right, left ^ self._round(right, key)
        return (left << half) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            out = self._encrypt(positions.astype(np.uint64))
            outside = out >= np.uint64(self.n)
            while outside.any():  # cycle-walk back into 0..n-1
                out[outside] = self._encrypt(out[outside])
                outside = out >= np.uint64(self.n)
        return out.astype(np.int64)
