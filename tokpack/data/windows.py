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

See docs/loading.md.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from ..split import OpenedFiles, Split, open_split
from .protocol import compact_copy
from .runtime import mix_seed
from .samplers import RandomStartSampler, ResumableBatchSampler, index_sampler

IGNORE_INDEX = -100


class WindowBatch(NamedTuple):
    """A batch read in one vectorised gather: x and y of shape (B, T), int64, each contiguous."""

    x: torch.Tensor
    y: torch.Tensor


class CompactWindows(NamedTuple):
    """B windows of T + 1 tokens as stored (uint16 or uint32): what a worker sends, 2 or 4 bytes a
    token instead of the 16 of int64 x and y, as numpy arrays, which cross the process boundary
    as plain bytes (cheaper than torch's shared-memory tensors at these sizes). ``widen()``, here
    or after ``to(device)`` on the device, gives the WindowBatch.

    In evaluation mode ``valid`` counts each row's real tokens (the rest is padding) and
    ``later`` marks rows whose first ``overlap`` targets an earlier window already scored.
    """

    tokens: np.ndarray | torch.Tensor
    valid: np.ndarray | torch.Tensor | None
    later: np.ndarray | torch.Tensor | None
    overlap: int
    mask: np.ndarray | torch.Tensor | None = None  # a split of conversations: each token's loss mask
    ignore_index: int = IGNORE_INDEX

    def widen(self) -> WindowBatch:
        t, ignore = self.tokens, self.ignore_index
        if isinstance(t, np.ndarray):  # numpy widens a strided view faster than torch does
            x, y = torch.from_numpy(t[:, :-1].astype(np.int64)), torch.from_numpy(t[:, 1:].astype(np.int64))
        else:
            x, y = t[:, :-1].to(torch.int64), t[:, 1:].to(torch.int64)  # each a contiguous copy
        if self.mask is not None:  # a target nobody trains on is ignored
            y.masked_fill_(torch.as_tensor(self.mask, device=y.device)[:, 1:] == 0, ignore)
        if self.valid is not None:
            valid, later = torch.as_tensor(self.valid, device=x.device), torch.as_tensor(self.later, device=x.device)
            position = torch.arange(x.shape[1], device=x.device)
            x.masked_fill_(position >= valid[:, None], 0)
            y.masked_fill_(position + 1 >= valid[:, None], ignore)
            if self.overlap:
                y[:, : self.overlap].masked_fill_(later[:, None], ignore)
        return WindowBatch(x, y)

    def to(self, device: torch.device | str) -> CompactWindows:
        """The same windows on ``device``, still in their stored width: the smallest copy."""
        move = lambda a: None if a is None else torch.as_tensor(a).to(device, non_blocking=True)  # noqa: E731
        return CompactWindows(move(self.tokens), move(self.valid), move(self.later), self.overlap, move(self.mask),
                              self.ignore_index)


def _whole(name: str, value: Any) -> int:
    try:
        if isinstance(value, bool):  # an int to Python: True would be taken as 1
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}={value!r} is not an int; pass a whole number of tokens") from None


def ignore_label(value: Any) -> int:
    """``ignore_index`` checked: a negative whole number, since every token id is 0 or more and a
    label equal to one would leave that token's real targets untrained."""
    label = _whole("ignore_index", value)
    if label >= 0:
        raise ValueError(f"ignore_index={label} could be a token's id (ids are 0 and up), so real targets would be "
                         "ignored; pass a negative number: -100 (PyTorch's), or -1 (nanochat's)")
    return label


def collate_windows(batch: Any) -> Any:
    """The loader's collate step: batches from ``__getitems__`` pass through, samples stack."""
    if isinstance(batch, (WindowBatch, CompactWindows)):
        return batch
    return default_collate(batch)


class TokenWindows(Dataset):
    """Next-token windows over one or more token files, opened lazily in each process."""

    def __init__(
        self,
        path: str | Path | Sequence[str | Path] | Split,
        block_size: int,
        stride: int | None = None,
        dtype: str | np.dtype | None = None,
        split: str | None = None,
        ignore_index: int = IGNORE_INDEX,
    ):
        """Args:
            path: token files (see ``tokpack.split.open_split``), or a ``Split`` already opened.
            block_size: T, the tokens of x (and of y) in a window.
            stride: None for training windows at every start; S <= T for evaluation windows.
            dtype: the dtype of bare token files that say nothing of theirs.
            split: the split of a folder.
            ignore_index: the label of a target not scored (padding, an earlier window's, and in a
                split of conversations every target its mask leaves out); -1 for nanochat's loss.
        """
        block_size = _whole("block_size", block_size)
        stride = None if stride is None else _whole("stride", stride)
        if block_size < 1:
            raise ValueError(f"block_size {block_size} must be at least 1")
        if stride is not None and not 1 <= stride <= block_size:
            raise ValueError(f"stride {stride} must lie in 1..block_size ({block_size}); "
                             "use stride=block_size for non-overlapping windows")
        self.split = open_split(path, split, dtype)  # validated now, in this process, not in a worker
        self.block_size, self.stride = block_size, stride
        self.dtype, self.lengths = self.split.dtype, self.split.lengths
        T = block_size
        counts = _window_counts(self.lengths, T, stride, self.split.describe())
        self.first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.ignore_index = ignore_label(ignore_index)
        # The loss mask's windows, read beside the tokens' (the same files' shapes, one byte a token).
        self.masks = None if self.split.mask is None else TokenWindows(self.split.mask, block_size, stride)
        # A window whose every target the mask leaves out would make a mean loss NaN: only windows
        # with a trained target are served, as (first window, end) runs of the windows' numbers.
        self._trained = None if self.masks is None else _trained_windows(self.masks.tokens(), counts, T, stride)
        self.untrained_windows = 0 if self._trained is None else int(self.first[-1]) - len(self)
        if len(self) == 0:
            raise ValueError(f"no window of {T} tokens of {self.split.describe()} holds a target its loss mask trains "
                             "on; use a larger block_size, or prepare conversations that train on something")
        # Set on the copy a loader's workers read: they send CompactWindows, widened in the main process.
        self.compact = False
        self._rng_seed = 0
        self._rng: np.random.Generator | None = None
        self._tokens: OpenedFiles | None = None
        self._windows: list[tuple[np.ndarray, np.ndarray | None] | None] | None = None
        self._windows_version = 0
        self._max_id: int | None = None

    @property
    def rng(self) -> np.random.Generator:
        """A numpy Generator for augmentation in subclasses, seeded afresh for every batch from the
        batch's place (seed, rank, epoch, batch): the same draws in any worker, after any resume.
        Made on first use in a batch, so batches that draw nothing pay nothing."""
        if self._rng is None:
            seed = mix_seed("batch", *self._rng_seed) if isinstance(self._rng_seed, tuple) else self._rng_seed
            self._rng = np.random.default_rng(seed)
        return self._rng

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

    @property
    def paths(self) -> list[Path]:
        return self.split.paths

    def fingerprint(self) -> str:
        """The split's fingerprint (each file's name, size and recorded sha256, hashed when it was
        opened), so that a resume state taken on other data with the same window count is refused."""
        return self.split.fingerprint

    def __getstate__(self) -> dict[str, Any]:
        # Pickling an open memmap copies the corpus into the pickle; workers reopen it instead.
        return {**self.__dict__, "_tokens": None, "_windows": None}

    def tokens(self) -> OpenedFiles:
        """The memory-mapped files, opened on first use in this process."""
        if self._tokens is None:
            self._tokens = self.split.open()
        return self._tokens

    def _view(self, f: int) -> tuple[np.ndarray, np.ndarray | None]:
        """File ``f``'s tokens and their sliding windows of T + 1 (None if shorter), made once
        while the file stays open."""
        tokens = self.tokens()
        if self._windows is None or self._windows_version != tokens.version:
            self._windows, self._windows_version = [None] * len(tokens), tokens.version
        view = self._windows[f]
        if view is None:
            width = self.block_size + 1
            array = tokens[f]
            view = self._windows[f] = (array, np.lib.stride_tricks.sliding_window_view(array, width)
                                       if len(array) >= width else None)
        return view

    def _read(self, f: int, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Windows of T + 1 tokens from file ``f``; in evaluation mode also each row's real tokens.

        Rows come from a sliding-window view of the file, one contiguous copy each with no index
        array; only evaluation windows that run past the file's end are gathered position by
        position (clamped, the overhang later masked).
        """
        tokens, windows = self._view(f)
        if self.stride is None:
            return windows[starts], None
        n, width = len(tokens), self.block_size + 1
        full = starts + width <= n
        if full.all():
            return windows[starts], n - starts
        out = np.empty((len(starts), width), dtype=tokens.dtype)
        if windows is not None:
            out[full] = windows[starts[full]]
        out[~full] = tokens[np.minimum(starts[~full, None] + np.arange(width), n - 1)]
        return out, n - starts

    @property
    def scored_tokens(self) -> int:
        """Labels that are not ignored over all windows: every target of every file, n - 1 each (of
        a split of conversations in evaluation mode, every target its mask keeps, read once)."""
        if self.stride is None:
            return int((self.first[1:] - self.first[:-1]).sum() * self.block_size)
        if self.masks is not None:
            return sum(int(np.count_nonzero(m[1:])) for m in self.masks.tokens())
        return int(np.maximum(self.lengths - 1, 0).sum())

    def __len__(self) -> int:
        return int(self.first[-1] if self._trained is None else self._trained[2][-1])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.__getitems__([index])
        return batch.x[0], batch.y[0]

    @classmethod
    def of(cls, source: str | Path | Split | TokenWindows, block_size: int) -> TokenWindows:
        """``source`` itself if it is already windows, else training windows of it."""
        return source if isinstance(source, TokenWindows) else cls(source, block_size)

    def worker_copy(self) -> TokenWindows | None:
        """The copy a loader's workers read: it sends CompactWindows (``compact_copy``)."""
        return compact_copy(self, TokenWindows)

    def finish_batch(self, batch: CompactWindows, device: torch.device | str | None) -> WindowBatch:
        """A worker's batch widened in the training process, after the copy to ``device``."""
        return (batch if device is None else batch.to(device)).widen()

    def __getitems__(self, indices: Sequence[int]) -> WindowBatch | CompactWindows:
        """B windows in one vectorised gather per file: int64 (x, y), or with ``compact`` the
        stored tokens, which the loader widens in the main process (or on the device)."""
        place = getattr(indices, "place", None)
        if place is not None:
            self._rng_seed, self._rng = place, None
        batch = self.gather(indices)
        return batch if self.compact else batch.widen()

    def gather(self, indices: Sequence[int]) -> CompactWindows:
        """The windows' T + 1 tokens as stored, one (B, T + 1) array, with what widening needs."""
        try:  # as unsigned, a negative index wraps past the end: one comparison checks both bounds
            idx = np.asarray(indices, dtype=np.int64)
            inside = not idx.size or (idx.view(np.uint64) < np.uint64(len(self))).all()
        except OverflowError:  # beyond int64
            inside = False
        if not inside:
            raise IndexError(f"window index out of range 0..{len(self) - 1}")
        if self._trained is not None:  # the i-th trained window's number among all windows
            lo, hi, ends = self._trained
            run = np.searchsorted(ends, idx, side="right") - 1
            idx = lo[run] + idx - ends[run]
        if len(self.split.files) == 1:  # the usual case: one file, one gather, no per-file copy
            gathered, valid = self._read(0, idx if self.stride is None else idx * self.stride)
            return self._compact(gathered, valid, idx, idx)
        file_of = np.searchsorted(self.first, idx, side="right") - 1
        local = idx - self.first[file_of]
        starts = local * (self.stride or 1)
        files = np.unique(file_of)
        if len(files) == 1:
            gathered, valid = self._read(int(files[0]), starts)
        else:
            gathered = np.empty((len(idx), self.block_size + 1), dtype=self.dtype)
            valid = np.empty(len(idx), dtype=np.int64) if self.stride is not None else None
            for f in files:
                rows = file_of == f
                gathered[rows], file_valid = self._read(int(f), starts[rows])
                if valid is not None:
                    valid[rows] = file_valid
        return self._compact(gathered, valid, local, idx)

    def _compact(self, gathered: np.ndarray, valid: np.ndarray | None, local: np.ndarray,
                 idx: np.ndarray) -> CompactWindows:
        self.split.check_ids(gathered)
        mask = None if self.masks is None else self.masks.split.check_mask(self.masks.gather(idx).tokens)
        if self.stride is None:
            return CompactWindows(gathered, None, None, 0, mask, self.ignore_index)
        return CompactWindows(gathered, valid, local > 0, self.block_size - self.stride, mask, self.ignore_index)

    def __repr__(self) -> str:
        mode = f"stride={self.stride}" if self.stride else "every start"
        untrained = f", {self.untrained_windows:,} with nothing to train on left out" if self.untrained_windows else ""
        return (f"TokenWindows({self.split.describe()}, block_size={self.block_size}, {mode}, {len(self):,} "
                f"windows{untrained})")


def _window_counts(lengths: np.ndarray, T: int, stride: int | None, where: str) -> np.ndarray:
    """Each file's windows: a training window at every start with T + 1 tokens, or an
    evaluation window every ``stride`` tokens while a target is left; refused where none is."""
    if stride is None:
        counts = np.maximum(lengths - T, 0)
    else:
        counts = np.where(lengths >= 2, -(-np.maximum(lengths - 1 - T, 0) // stride) + 1, 0)
    if stride is not None and T >= lengths.max():
        raise ValueError(f"block_size {T} is longer than the {int(lengths.max()) - 1} targets of {where}, so every "
                         f"window would be mostly padding; use a block_size below {int(lengths.max())}")
    if counts.sum() == 0:
        raise ValueError(f"block_size {T} needs more than {T} tokens, but {where} holds {int(lengths.max())} at "
                         "most; use a smaller block_size or more data")
    return counts


def _trained_windows(masks: OpenedFiles, counts: np.ndarray, T: int, stride: int | None,
                     chunk: int = 1 << 24) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The windows that score a trained target, as runs over all files' windows: (first window,
    end, trained windows before the run), the last with the total appended. A training window at s
    scores targets s+1..s+T; an evaluation window k scores 1..T (k = 0) or the S targets up to
    kS + T (k > 0, the earlier ones being its predecessor's). One pass over the masks, ``chunk``
    bytes at a time; memory O(runs of trained tokens)."""
    first = np.concatenate([[0], np.cumsum(counts)])
    los, his = [], []
    for f, mask in enumerate(masks):
        if counts[f] == 0:
            continue
        starts, ends = [], []
        before = False
        for at in range(0, len(mask), chunk):
            part = np.asarray(mask[at:at + chunk]) != 0
            step = np.diff(part.astype(np.int8), prepend=np.int8(before))
            starts.append(np.flatnonzero(step == 1) + at)
            ends.append(np.flatnonzero(step == -1) + at)
            before = bool(part[-1])
        a = np.concatenate(starts).astype(np.int64)
        b = np.concatenate([*ends, [len(mask)] if before else []]).astype(np.int64) - 1  # each run's last
        a, b = np.maximum(a, 1)[b >= 1], b[b >= 1]  # position 0 is no target
        if stride is None:
            lo, hi = np.maximum(a - T, 0), np.minimum(b, counts[f])
        else:
            lo = np.where(a <= T, 0, -(-(a - T) // stride))
            hi = np.where(b <= T, 0, -(-(b - T) // stride)) + 1
        keep = lo < hi
        lo, hi = lo[keep], hi[keep]
        if len(lo):  # runs that touch or overlap merge (both ends only grow)
            cut = np.flatnonzero(lo[1:] > hi[:-1]) + 1
            los.append(lo[np.concatenate([[0], cut])] + first[f])
            his.append(hi[np.concatenate([cut - 1, [len(hi) - 1]])] + first[f])
    lo = np.concatenate(los).astype(np.int64) if los else np.zeros(0, np.int64)
    hi = np.concatenate(his).astype(np.int64) if his else np.zeros(0, np.int64)
    return lo, hi, np.concatenate([[0], np.cumsum(hi - lo)]).astype(np.int64)

