"""Several prepared corpora served as one training stream with given weights.

    from tokpack import MixedWindows, build_loader
    mix = MixedWindows({"web": "data/web/train.bin", "code": "data/code/train.bin"},
                       weights={"web": 0.7, "code": 0.3}, block_size=256)
    loader = build_loader(mix, 32, seed=0, num_samples=32 * 1000)
    print(mix.realised(loader))   # {"web": 0.70..., "code": 0.29...} of the batches handed out

Each sample first picks a corpus with probability ``weights``, then a uniform random window in it
(nanoGPT's random starts), all drawn chunk by chunk from seeded generators: reproducible from the
seed, resumable from any batch, O(batch) memory whatever the corpus sizes.

See docs/loading.md.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from .samplers import MixtureSampler
from .windows import TokenWindows, WindowBatch


class MixedWindows(Dataset):
    """Random-start windows of several token files; index = offset of its corpus + window."""

    def __init__(self, paths: Mapping[str, str | Path | TokenWindows], weights: Mapping[str, float], block_size: int):
        if set(paths) != set(weights):
            raise ValueError(f"weights name {sorted(weights)} but corpora are {sorted(paths)}; give one weight each")
        if not all(isinstance(w, (int, float)) and not isinstance(w, bool) and 0 <= w < math.inf
                   for w in weights.values()) or sum(weights.values()) <= 0:
            raise ValueError(f"weights {dict(weights)} must be finite non-negative numbers with a positive sum")
        self.names = list(paths)
        self.parts = [TokenWindows.of(p, block_size) for p in paths.values()]
        total = sum(weights.values())
        self.weights = torch.tensor([weights[n] / total for n in self.names], dtype=torch.double)
        self.offsets = np.cumsum([0] + [len(p) for p in self.parts])
        self.block_size = block_size
        self._tally: tuple[int, int, np.ndarray] = (-1, 0, np.zeros(len(self.names), dtype=np.int64))

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def fingerprint(self) -> list[Any]:
        """Each corpus's name, weight and data fingerprint: a resume state of another mixture is refused."""
        return [[n, float(w), p.fingerprint()] for n, w, p in zip(self.names, self.weights, self.parts)]

    def source_of(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        return np.searchsorted(self.offsets, np.asarray(indices), side="right") - 1

    def __getitems__(self, indices: Sequence[int]) -> WindowBatch:
        idx = np.asarray(indices, dtype=np.int64)
        source = self.source_of(idx)
        x = torch.empty(len(idx), self.block_size, dtype=torch.long)
        y = torch.empty_like(x)
        for s in np.unique(source):
            rows = np.flatnonzero(source == s)
            part = self.parts[s].__getitems__(idx[rows] - self.offsets[s])
            x[rows], y[rows] = part.x, part.y
        return WindowBatch(x, y)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.__getitems__([index])
        return batch.x[0], batch.y[0]

    def default_sampler(self, batch_size: int, seed: int, *, num_samples: int | None = None,
                        rank: int | None = None, world_size: int | None = None, **ignored: Any) -> MixtureSampler:
        """A corpus by weight, then a uniform window in it; ``num_samples`` per epoch and rank."""
        given = [name for name, value in ignored.items() if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)} has no effect on a mixture, which always draws at random")
        return MixtureSampler(self.weights, [len(p) for p in self.parts], batch_size, seed, num_samples, rank,
                              world_size)

    def realised(self, loader: Any) -> dict[str, float]:
        """Share of each corpus among the windows the loader has handed out so far in its epoch.

        Counted from the sampler's draws up to the loader's position, extending the last count,
        so it costs only the batches handed out since the previous call, endless sampler or not.
        """
        sampler: MixtureSampler = loader.sampler
        end = loader.batch * sampler.batch_size
        epoch, done, counts = self._tally
        if epoch != loader.epoch or done > end:
            done, counts = 0, np.zeros(len(self.names), dtype=np.int64)
        drawn = np.fromiter(itertools.islice(sampler.indices(loader.epoch, done), end - done), dtype=np.int64)
        counts = counts + np.bincount(self.source_of(drawn), minlength=len(self.names))
        self._tally = (loader.epoch, end, counts)
        total = max(int(counts.sum()), 1)
        return {name: float(c) / total for name, c in zip(self.names, counts)}
