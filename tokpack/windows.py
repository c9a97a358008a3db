"""``TokenWindows``: a lazily memory-mapped dataset of (x, y) next-token windows.

    from tokpack import TokenWindows
    train = TokenWindows("data/sample/train.bin", block_size=256)             # every start position
    val = TokenWindows("data/sample/val.bin", block_size=256, stride=256)      # evaluation windows

A window is one read of T + 1 tokens: x = tokens[s:s+T], y = tokens[s+1:s+T+1], widened to int64
per window, never the whole corpus. Training mode (no stride) has a window at every start
0..n-T-1. Evaluation mode (stride S <= T) starts windows at 0, S, 2S, ... and scores every target
token of the file exactly once: targets that the previous window already scored, and the padding of
the last, partial window, carry the label -100 (``F.cross_entropy``'s ignore_index).

Several files (a list, a glob, a prepared folder's split, or a folder of llm.c shards, read per
split) are served as one corpus whose windows never span two files: each file's windows are its
own, so a shard boundary is never read across.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from .format import META_NAME, open_tokens, read_meta, split_files, token_files
from .samplers import RandomStartSampler, ResumableBatchSampler, index_sampler

IGNORE_INDEX = -100


class WindowBatch(NamedTuple):
    """A batch read in one vectorised gather: x and y of shape (B, T), int64."""

    x: torch.Tensor
    y: torch.Tensor


def collate_windows(batch: Any) -> Any:
    """The loader's collate step: batches from ``__getitems__`` pass through, samples stack."""
    if isinstance(batch, WindowBatch):
        return batch
    return default_collate(batch)


class TokenWindows(Dataset):
    """Next-token windows over one or more token files, opened lazily in each process."""

    def __init__(
        self,
        path: str | Path | Sequence[str | Path],
        block_size: int,
        stride: int | None = None,
        dtype: str | np.dtype | None = None,
        split: str | None = None,
    ):
        self.paths = token_files(path, split)
        if block_size < 1:
            raise ValueError(f"block_size {block_size} must be at least 1")
        if stride is not None and not 1 <= stride <= block_size:
            raise ValueError(f"stride {stride} must lie in 1..block_size ({block_size}); "
                             "use stride=block_size for non-overlapping windows")
        self.block_size, self.stride, self.dtype_arg = block_size, stride, dtype
        maps = [open_tokens(p, dtype) for p in self.paths]  # validates size and dtype now, not in a worker
        self.dtype = maps[0].dtype
        self.lengths = np.array([len(m) for m in maps], dtype=np.int64)
        del maps
        T = block_size
        if stride is None:
            counts = np.maximum(self.lengths - T, 0)
        else:
            counts = np.where(self.lengths >= 2, -(-np.maximum(self.lengths - 1 - T, 0) // stride) + 1, 0)
        if stride is not None and T >= self.lengths.max():
            raise ValueError(
                f"block_size {T} is longer than the {int(self.lengths.max()) - 1} targets of {self._names()}, so "
                f"every window would be mostly padding; use a block_size below {int(self.lengths.max())}"
            )
        if counts.sum() == 0:
            raise ValueError(
                f"block_size {T} needs more than {T} tokens, but {self._names()} holds "
                f"{int(self.lengths.max())} at most; use a smaller block_size or more data"
            )
        self.first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        # Reseeded for every batch from the batch's place (seed, rank, epoch, batch), so any
        # randomness a subclass draws from it is the same in any worker, and after any resume.
        self.rng = np.random.default_rng(0)
        self._tokens: list[np.ndarray] | None = None
        self._max_id: int | None = None

    def default_sampler(self, batch_size: int, seed: int, *, shuffle: bool | None = None,
                        num_samples: int | None = None, drop_last: bool | None = None, rank: int | None = None,
                        world_size: int | None = None) -> ResumableBatchSampler:
        """Random starts for training windows; strided windows in order, or shuffled per epoch."""
        if self.stride is None:
            if shuffle is False:
                raise ValueError("windows at every start position are only sampled at random; "
                                 "pass stride=block_size to TokenWindows for in-order windows")
            return RandomStartSampler(len(self), batch_size, seed, num_samples, rank, world_size,
                                      drop_last=True if drop_last is None else drop_last)
        if num_samples is not None:
            raise ValueError("num_samples applies to random-start windows; strided windows are used once per epoch")
        return index_sampler(len(self), batch_size, seed, shuffle, drop_last, rank, world_size)

    def max_id(self) -> int:
        """The largest token id in the files (read once, then kept), to check a model's vocabulary."""
        if self._max_id is None:
            self._max_id = max(int(t.max()) for t in self.tokens())
        return self._max_id

    def fingerprint(self) -> list[Any]:
        """Each file's name, size and (for prepared files) sha256 from meta.json, so that a resume
        state taken on other data with the same window count is refused."""
        out = []
        for p in self.paths:
            recorded = None
            if (p.parent / META_NAME).is_file():
                files = [f for info in read_meta(p.parent)["splits"].values() for f in split_files(info)]
                recorded = next((f["sha256"] for f in files if f["file"] == p.name), None)
            out.append([p.name, p.stat().st_size, recorded])
        return out

    def _names(self) -> str:
        return str(self.paths[0]) if len(self.paths) == 1 else f"{len(self.paths)} files in {self.paths[0].parent}"

    def __getstate__(self) -> dict[str, Any]:
        # Pickling an open memmap copies the corpus into the pickle; workers reopen it instead.
        return {**self.__dict__, "_tokens": None}

    def tokens(self) -> list[np.ndarray]:
        """The memory-mapped files, opened on first use in this process."""
        if self._tokens is None:
            # Plain ndarray views of the maps: np.memmap's own __getitem__ costs more than the gather.
            self._tokens = [np.asarray(open_tokens(p, self.dtype_arg)) for p in self.paths]
        return self._tokens

    def _read(self, f: int, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Windows of T + 1 tokens from file ``f``; in evaluation mode also where they run past its end."""
        pos = starts[:, None] + np.arange(self.block_size + 1)
        if self.stride is None:
            return self.tokens()[f][pos], None
        n = int(self.lengths[f])
        return self.tokens()[f][np.minimum(pos, n - 1)], pos >= n

    @property
    def scored_tokens(self) -> int:
        """Labels that are not -100 over all windows: every target of every file, n - 1 each."""
        if self.stride is None:
            return int((self.first[1:] - self.first[:-1]).sum() * self.block_size)
        return int(np.maximum(self.lengths - 1, 0).sum())

    def __len__(self) -> int:
        return int(self.first[-1])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.__getitems__([index])
        return batch.x[0], batch.y[0]

    def __getitems__(self, indices: Sequence[int]) -> WindowBatch:
        """B windows in one vectorised gather per file."""
        seed = getattr(indices, "seed", None)
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"window index out of range 0..{len(self) - 1}")
        T = self.block_size
        file_of = np.searchsorted(self.first, idx, side="right") - 1
        local = idx - self.first[file_of]
        starts = local * (self.stride or 1)
        files = np.unique(file_of)
        if len(files) == 1:  # the usual case: one gather, no per-file copy
            gathered, pad = self._read(int(files[0]), starts)
        else:
            gathered = np.empty((len(idx), T + 1), dtype=self.dtype)
            pad = np.zeros(gathered.shape, dtype=bool) if self.stride is not None else None
            for f in files:
                rows = file_of == f
                gathered[rows], file_pad = self._read(int(f), starts[rows])
                if pad is not None:
                    pad[rows] = file_pad
        # Widen x and y separately: both come out contiguous, with no copy beyond the widening.
        x = torch.from_numpy(gathered[:, :-1].astype(np.int64))
        y = torch.from_numpy(gathered[:, 1:].astype(np.int64))
        if self.stride is not None:
            x[torch.from_numpy(pad[:, :-1])] = 0
            y[torch.from_numpy(pad[:, 1:])] = IGNORE_INDEX
            overlap = T - self.stride
            if overlap:
                y[torch.from_numpy(local > 0), :overlap] = IGNORE_INDEX
        return WindowBatch(x, y)

    def __repr__(self) -> str:
        mode = f"stride={self.stride}" if self.stride else "every start"
        return f"TokenWindows({self._names()}, block_size={self.block_size}, {mode}, {len(self):,} windows)"

