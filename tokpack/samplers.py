"""Batch samplers over window indices: random starts, shuffled epochs, in-order evaluation.

    from tokpack.samplers import RandomStartSampler
    sampler = RandomStartSampler(len(train), batch_size=64, seed=1337, num_samples=64 * 5000)

Each yields lists of indices, one list a batch, and can begin at any batch of any epoch without
producing the batches before it: that is what makes a loader's resume exact and cheap. Every
random choice comes from a ``torch.Generator`` seeded from (seed, rank, epoch, ...), never from
the global RNG. Under distributed training each rank builds its own sampler; ``rank`` and
``world_size`` default to torch.distributed's, or torchrun's RANK / WORLD_SIZE.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

CHUNK = 8192  # random starts are drawn this many at a time, each chunk from its own seed


def mix_seed(*parts: int | str) -> int:
    """A 63-bit seed from several parts, so (seed, rank, epoch) streams never collide."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def generator(*parts: int | str) -> torch.Generator:
    return torch.Generator().manual_seed(mix_seed(*parts))


def distributed_rank_world() -> tuple[int, int]:
    """(rank, world size) from torch.distributed if initialised, else torchrun's RANK/WORLD_SIZE."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class WindowBatchSampler(Sampler[list[int]]):
    """Shared bookkeeping: the epoch and the batch that the next iteration starts from.

    ``rank`` and ``world_size`` default to torch.distributed's, or torchrun's RANK / WORLD_SIZE.
    """

    kind = "base"

    def __init__(self, num_windows: int, batch_size: int, rank: int | None = None, world_size: int | None = None):
        found_rank, found_world = distributed_rank_world()
        rank = found_rank if rank is None else rank
        world_size = found_world if world_size is None else world_size
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size} must be at least 1")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} must lie in 0..world_size-1 (world_size {world_size})")
        if num_windows < 1:
            raise ValueError(f"there are {num_windows} windows to sample; use a smaller block_size or more data")
        self.num_windows, self.batch_size = num_windows, batch_size
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self.start_batch = 0

    def indices(self, epoch: int, start: int) -> Iterator[int]:  # pragma: no cover - abstract
        raise NotImplementedError

    def batches_per_epoch(self) -> float:
        raise NotImplementedError  # pragma: no cover - abstract

    def __len__(self) -> int:
        n = self.batches_per_epoch()
        if math.isinf(n):
            raise TypeError(f"{type(self).__name__} without num_samples is endless and has no length")
        return int(n)

    def __iter__(self) -> Iterator[list[int]]:
        batch: list[int] = []
        for index in self.indices(self.epoch, self.start_batch * self.batch_size):
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    drop_last = False


class DrawSampler(WindowBatchSampler):
    """Draws with replacement, ``CHUNK`` at a time, chunk c of epoch e from its own seeded generator.

    So a resume at any position regenerates one chunk, not the stream before it, and memory stays
    O(CHUNK) however large the corpus. ``num_samples`` per epoch and rank; None is endless.
    """

    def __init__(self, num_windows: int, batch_size: int, seed: int, num_samples: int | None,
                 rank: int | None, world_size: int | None, drop_last: bool):
        super().__init__(num_windows, batch_size, rank, world_size)
        if num_samples is not None and num_samples < 1:
            raise ValueError(f"num_samples {num_samples} must be positive, or None for an endless stream")
        self.seed, self.num_samples, self.drop_last = seed, num_samples, drop_last

    def draw(self, g: torch.Generator) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def batches_per_epoch(self) -> float:
        if self.num_samples is None:
            return math.inf
        whole, rest = divmod(self.num_samples, self.batch_size)
        return whole + (1 if rest and not self.drop_last else 0)

    def indices(self, epoch: int, start: int) -> Iterator[int]:
        end = self.num_samples if self.num_samples is not None else math.inf
        chunk, offset = divmod(start, CHUNK)
        position = start
        while position < end:
            for index in self.draw(generator(self.kind, self.seed, self.rank, epoch, chunk)).tolist()[offset:]:
                if position >= end:
                    return
                yield index
                position += 1
            chunk, offset = chunk + 1, 0


class RandomStartSampler(DrawSampler):
    """Uniform random windows with replacement (nanoGPT's get_batch), O(batch) memory.

    Each epoch and each rank draws its own stream. Never builds a permutation, so a corpus of
    billions of tokens works.
    """

    kind = "random"

    def __init__(self, num_windows: int, batch_size: int, seed: int, num_samples: int | None = None,
                 rank: int | None = None, world_size: int | None = None, drop_last: bool = True):
        super().__init__(num_windows, batch_size, seed, num_samples, rank, world_size, drop_last)

    def draw(self, g: torch.Generator) -> torch.Tensor:
        return torch.randint(self.num_windows, (CHUNK,), generator=g)


class EpochSampler(WindowBatchSampler):
    """A seeded shuffle of all windows, reshuffled every epoch without a set_epoch call.

    Distributed, each rank takes every world-th window of the shuffle after trimming it to a
    multiple of the world size: equal-length, disjoint shares (DistributedSampler's
    drop_last=True), so no rank waits for another in an all-reduce.
    """

    kind = "epoch"

    def __init__(self, num_windows: int, batch_size: int, seed: int, rank: int | None = None,
                 world_size: int | None = None, drop_last: bool = False):
        super().__init__(num_windows, batch_size, rank, world_size)
        if num_windows < self.world_size:
            raise ValueError(f"{num_windows} windows cannot be shared by {self.world_size} ranks; use more data")
        self.seed, self.drop_last = seed, drop_last
        self.per_rank = num_windows // self.world_size

    def batches_per_epoch(self) -> float:
        whole, rest = divmod(self.per_rank, self.batch_size)
        return whole + (1 if rest and not self.drop_last else 0)

    def indices(self, epoch: int, start: int) -> Iterator[int]:
        order = torch.randperm(self.num_windows, generator=generator("epoch", self.seed, epoch))
        share = order[: self.per_rank * self.world_size][self.rank::self.world_size]
        return iter(share[start:].tolist())


class SequentialSampler(WindowBatchSampler):
    """Every window once, in order; distributed, each rank a contiguous block with no padding.

    Shares may differ by one window, so sums over ranks equal the single-process sums exactly.
    """

    kind = "sequential"

    def batches_per_epoch(self) -> float:
        lo, hi = self.bounds()
        return math.ceil((hi - lo) / self.batch_size)

    def bounds(self) -> tuple[int, int]:
        n, w, r = self.num_windows, self.world_size, self.rank
        return r * n // w, (r + 1) * n // w

    def indices(self, epoch: int, start: int) -> Iterator[int]:
        lo, hi = self.bounds()
        return iter(range(lo + start, hi))
