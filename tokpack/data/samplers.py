"""Resumable batch samplers: random starts, shuffled epochs, in order, weighted, buckets, mixtures.

    from tokpack.data.samplers import RandomStartSampler
    sampler = RandomStartSampler(len(train), batch_size=64, seed=1337, num_samples=64 * 5000)

Every sampler yields lists of indices, one list a batch, and can begin at any batch of any epoch
without producing the batches before it: resume is exact and O(1). Each speaks the protocol
``torch.utils.data`` loaders and torchdata's ``StatefulDataLoader`` look for: ``state_dict()`` /
``load_state_dict()`` on the sampler and on its iterators, and an epoch that advances with each
new pass (a pass that has handed out a batch), with no ``set_epoch`` call. Every random choice
comes from a ``torch.Generator`` seeded from (seed, rank, epoch, ...), never the global RNG.
``rank``/``world_size`` default to torch.distributed's.

See docs/loading.md.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from .permutation import Shuffle
from .runtime import generator, mix_seed, rank_world

CHUNK = 8192  # random draws are made this many at a time, each chunk from its own seed
STATE_VERSION = 3
# A state claims the batches handed out before it: its epochs (each begun with a batch at least)
# and its batch in the last. More than this is more than any run hands out (at 10,000 batches a
# second, 80 days without a pause): such a state is forged.
MAX_BATCHES = 2**36


class Batch(list):
    """A batch of indices that knows its place, so a dataset can seed its per-batch randomness
    from (seed, rank, epoch, batch) wherever, and in whichever worker, the batch is read. The seed
    is hashed from the place only when a dataset asks for it: most batches draw nothing."""

    place: tuple[int, int, int, int] | None = None  # (seed, rank, epoch, batch)

    @property
    def seed(self) -> int | None:
        return None if self.place is None else mix_seed("batch", *self.place)


def _checked_int(state: dict[str, Any], key: str, low: int, high: float) -> int:
    value = state.get(key) if isinstance(state, dict) else None
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"state has {key}={value!r}; expected an int in {low}..{high}. "
                         "Pass a state_dict() taken from the same settings")
    return value


def check_state(state: Any, what: str, settings: dict[str, Any], last_batch: float) -> tuple[int, int]:
    """(epoch, batch) of a ``what`` state, after checking its type, version, every setting (a
    mismatch names both values) and that the position is in range."""
    if not isinstance(state, dict):
        raise TypeError(f"a {what} state is the dict from state_dict(), not {type(state).__name__}")
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"{what} state has version {state.get('version')!r}, this tokpack reads {STATE_VERSION}")
    for key, value in settings.items():
        if key not in state or type(state[key]) is not type(value) or state[key] != value:
            taken = f"{key}={state[key]!r}" if key in state else f"no {key}"
            raise ValueError(f"{what} state was taken with {taken} but this {what} has {key}={value!r}; build the "
                             f"{what} with the same {key} (and data) to resume")
    return _checked_int(state, "epoch", 0, _most_epochs(last_batch)), _checked_int(state, "batch", 0, last_batch)


def _most_epochs(last_batch: float) -> int:
    """The most epochs a state may claim whose epochs end at ``last_batch`` (inf: endless)."""
    return MAX_BATCHES if math.isinf(last_batch) else MAX_BATCHES // max(1, int(last_batch))


class ResumableBatchSampler(Sampler[list[int]], abc.ABC):
    """The protocol every tokpack sampler shares.

    Subclasses give ``batches(epoch, start)``, this rank's batches of ``epoch`` from batch
    ``start`` on, and ``batches_per_epoch()`` (``math.inf`` for an endless stream). The base keeps
    the position: ``epoch`` (of the next pass) and ``start_batch``, and the state protocol.
    """

    kind = "base"

    def __init__(self, num_items: int, batch_size: int, seed: int = 0, rank: int | None = None,
                 world_size: int | None = None, drop_last: bool = False):
        if type(batch_size) is not int or batch_size < 1:
            raise ValueError(f"batch_size {batch_size!r} must be an int of at least 1")
        if num_items < 1:
            raise ValueError(f"there are {num_items} items to sample; use a smaller block_size or more data")
        self.num_items, self.batch_size, self.seed, self.drop_last = num_items, batch_size, seed, drop_last
        self.rank, self.world_size = rank_world(rank, world_size)
        self.epoch = 0
        self.start_batch = 0

    def stream_state(self, batch: int) -> dict[str, Any]:
        """What a loader's state holds beyond (epoch, batch) to resume this sampler's stream after
        ``batch`` batches; none here."""
        return {}

    def load_stream_state(self, state: dict[str, Any], batch: int) -> None:
        """Take what ``stream_state`` gave, checked, for a resume at ``batch``."""

    @abc.abstractmethod
    def batches(self, epoch: int, start: int) -> Iterator[list[int]]:
        """This rank's batches of ``epoch`` from batch ``start`` on."""

    @abc.abstractmethod
    def batches_per_epoch(self) -> float:
        """Batches this rank yields in one epoch; ``math.inf`` when endless."""

    def __len__(self) -> int:
        n = self.batches_per_epoch()
        if math.isinf(n):
            raise TypeError(f"{type(self).__name__} without num_samples is endless and has no length")
        return int(n)

    def __iter__(self) -> SamplerIterator:
        return SamplerIterator(self, self.epoch, self.start_batch)

    def settings(self) -> dict[str, Any]:
        """What a position depends on; a state taken under other settings is refused."""
        return {"kind": self.kind, "seed": self.seed, "batch_size": self.batch_size, "rank": self.rank,
                "world_size": self.world_size, "num_items": self.num_items, "drop_last": self.drop_last,
                "num_samples": getattr(self, "num_samples", None)}

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, **self.settings(), "epoch": self.epoch, "batch": self.start_batch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; refused, naming both values, if taken under other settings."""
        self.set_position(*check_state(state, "sampler", self.settings(), self.batches_per_epoch()))

    def set_position(self, epoch: int, batch: int) -> None:
        """Make the next pass start at ``batch`` of ``epoch``; past the end it starts the next epoch."""
        if batch >= self.batches_per_epoch():
            epoch, batch = epoch + 1, 0
        self.epoch, self.start_batch = epoch, batch

    def batch_seed(self, epoch: int, batch: int) -> int:
        return mix_seed("batch", self.seed, self.rank, epoch, batch)

    def batch_place(self, epoch: int, batch: int) -> tuple[int, int, int, int]:
        """What ``batch_seed`` hashes: a batch carries it, and is seeded only if it is asked."""
        return self.seed, self.rank, epoch, batch


class SamplerIterator(Iterator[list[int]]):
    """One pass of a sampler. It claims its epoch with its first batch: the sampler's next pass is
    then the next epoch, however this one ends. Stateful, for torchdata's StatefulDataLoader."""

    def __init__(self, sampler: ResumableBatchSampler, epoch: int, start: int):
        self.sampler = sampler
        self._restart(epoch, start)

    def _restart(self, epoch: int, start: int) -> None:
        self.epoch, self.batch, self.claimed = epoch, start, False
        self._batches = self.sampler.batches(epoch, start)

    def __iter__(self) -> SamplerIterator:
        return self

    def __next__(self) -> list[int]:
        if not self.claimed:
            self.claimed = True
            self.sampler.epoch, self.sampler.start_batch = self.epoch + 1, 0
        batch = next(self._batches)
        indices = batch if isinstance(batch, Batch) else Batch(batch)
        indices.place = self.sampler.batch_place(self.epoch, self.batch)
        self.batch += 1
        return indices

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batch": self.batch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._restart(_checked_int(state, "epoch", 0, _most_epochs(self.sampler.batches_per_epoch())),
                      _checked_int(state, "batch", 0, self.sampler.batches_per_epoch()))
        self.claimed = True  # a restored pass is under way: the pass after it is the next epoch
        self.sampler.epoch, self.sampler.start_batch = self.epoch + 1, 0


class IndexSampler(ResumableBatchSampler):
    """A sampler defined by a stream of single indices per epoch, cut into batches."""

    @abc.abstractmethod
    def indices(self, epoch: int, start: int) -> Iterator[int]:
        """This rank's indices of ``epoch`` from position ``start`` on."""

    def batches(self, epoch: int, start: int) -> Iterator[list[int]]:
        batch: list[int] = []
        for index in self.indices(epoch, start * self.batch_size):
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch


class DrawSampler(IndexSampler):
    """Draws with replacement, ``CHUNK`` at a time, chunk c of epoch e from its own seeded generator.

    So a resume at any position regenerates one chunk, not the stream before it, and memory stays
    O(CHUNK) however large the corpus. ``num_samples`` per epoch and rank; None is endless.
    """

    def __init__(self, num_items: int, batch_size: int, seed: int, num_samples: int | None,
                 rank: int | None, world_size: int | None, drop_last: bool):
        super().__init__(num_items, batch_size, seed, rank, world_size, drop_last)
        if num_samples is not None and num_samples < 1:
            raise ValueError(f"num_samples {num_samples} must be positive, or None for an endless stream")
        self.num_samples = num_samples

    @abc.abstractmethod
    def draw(self, g: torch.Generator) -> torch.Tensor:
        """CHUNK indices from ``g``."""

    def batches_per_epoch(self) -> float:
        if self.num_samples is None:
            return math.inf
        whole, rest = divmod(self.num_samples, self.batch_size)
        return whole + (1 if rest and not self.drop_last else 0)

    def indices(self, epoch: int, start: int) -> Iterator[int]:
        for values in self._chunks(epoch, start):
            yield from values

    def _chunks(self, epoch: int, start: int) -> Iterator[list[int]]:
        """The draws from position ``start`` on, a chunk's list at a time, cut at ``num_samples``."""
        end = self.num_samples if self.num_samples is not None else math.inf
        chunk, offset = divmod(start, CHUNK)
        position = start
        while position < end:
            values = self.draw(generator(self.kind, self.seed, self.rank, epoch, chunk)).tolist()[offset:]
            if end - position < len(values):
                values = values[:int(end - position)]
            position += len(values)
            yield values
            chunk, offset = chunk + 1, 0

    def batches(self, epoch: int, start: int) -> Iterator[list[int]]:
        # The batches of IndexSampler.batches, sliced a chunk at a time instead of index by index.
        B = self.batch_size
        pending: list[int] = []
        for values in self._chunks(epoch, start * B):
            if pending:
                take = B - len(pending)
                pending += values[:take]
                values = values[take:]
                if len(pending) < B:
                    continue
                yield Batch(pending)
            full = len(values) - len(values) % B
            for i in range(0, full, B):
                yield Batch(values[i:i + B])
            pending = values[full:]
        if pending and not self.drop_last:
            yield Batch(pending)


class RandomStartSampler(DrawSampler):
    """Uniform random windows with replacement (nanoGPT's get_batch), O(batch) memory.

    Each epoch and each rank draws its own stream. Never builds a permutation, so a corpus of
    billions of tokens works.
    """

    kind = "random"

    def __init__(self, num_items: int, batch_size: int, seed: int, num_samples: int | None = None,
                 rank: int | None = None, world_size: int | None = None, drop_last: bool = True):
        super().__init__(num_items, batch_size, seed, num_samples, rank, world_size, drop_last)

    def draw(self, g: torch.Generator) -> torch.Tensor:
        return torch.randint(self.num_items, (CHUNK,), generator=g)


class WeightedSampler(DrawSampler):
    """Items drawn with replacement in proportion to ``weights``: the resumable, distributed
    counterpart of WeightedRandomSampler (each rank and epoch draws its own stream)."""

    kind = "weighted"

    def __init__(self, weights: Sequence[float] | torch.Tensor, batch_size: int, seed: int, num_samples: int,
                 rank: int | None = None, world_size: int | None = None, drop_last: bool = False):
        self.weights = torch.as_tensor(weights, dtype=torch.double)
        if not (self.weights >= 0).all() or self.weights.sum() <= 0:
            raise ValueError("weights must be non-negative with a positive sum")
        super().__init__(len(self.weights), batch_size, seed, num_samples, rank, world_size, drop_last)

    def draw(self, g: torch.Generator) -> torch.Tensor:
        return torch.multinomial(self.weights, CHUNK, True, generator=g)


def inverse_frequency_weights(labels: Sequence[int]) -> torch.Tensor:
    """Per-item weights 1 / count(label): balanced classes when drawn with replacement."""
    labels = torch.as_tensor(np.asarray(labels), dtype=torch.long)
    return (1.0 / torch.bincount(labels).double())[labels]


class MixtureSampler(DrawSampler):
    """A source by ``weights``, then a uniform item in it; index = ``offsets[source]`` + item.

    ``sizes[s]`` items in source s; ``num_samples`` per epoch and rank (None: endless).
    """

    kind = "mixture"

    def __init__(self, weights: Sequence[float], sizes: Sequence[int], batch_size: int, seed: int,
                 num_samples: int | None = None, rank: int | None = None, world_size: int | None = None):
        self.weights = torch.as_tensor(weights, dtype=torch.double)
        self.sizes = torch.as_tensor(sizes, dtype=torch.double)
        self.offsets = np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64))])
        super().__init__(int(self.offsets[-1]), batch_size, seed, num_samples, rank, world_size, drop_last=True)

    def draw(self, g: torch.Generator) -> torch.Tensor:
        source = torch.multinomial(self.weights, CHUNK, True, generator=g)
        local = (torch.rand(CHUNK, generator=g, dtype=torch.double) * self.sizes[source]).long()
        return torch.from_numpy(self.offsets[source.numpy()]) + local


class EpochSampler(IndexSampler):
    """A seeded shuffle of all items, reshuffled every epoch without a set_epoch call.

    The shuffle is computed position by position (``tokpack.data.permutation.Shuffle``), never built:
    O(batch) memory and O(1) resume at any number of items. Distributed, each rank takes every
    world-th item of the shuffle after trimming it to a multiple of the world size: equal-length,
    disjoint shares (DistributedSampler's drop_last=True), so no rank waits for another.
    """

    kind = "epoch"

    def __init__(self, num_items: int, batch_size: int, seed: int, rank: int | None = None,
                 world_size: int | None = None, drop_last: bool = False):
        super().__init__(num_items, batch_size, seed, rank, world_size, drop_last)
        if num_items < self.world_size:
            raise ValueError(f"{num_items} items cannot be shared by {self.world_size} ranks; use more data")
        self.per_rank = num_items // self.world_size

    def batches_per_epoch(self) -> float:
        whole, rest = divmod(self.per_rank, self.batch_size)
        return whole + (1 if rest and not self.drop_last else 0)

    def indices(self, epoch: int, start: int) -> Iterator[int]:
        shuffle = Shuffle(self.num_items, "epoch", self.seed, epoch)
        for lo in range(start, self.per_rank, CHUNK):
            mine = np.arange(lo, min(lo + CHUNK, self.per_rank), dtype=np.uint64) * self.world_size + self.rank
            yield from shuffle(mine).tolist()


class InOrderSampler(IndexSampler):
    """Every item once, in order; distributed, each rank a contiguous block with no padding.

    Shares may differ by one item, so sums over ranks equal the single-process sums exactly.
    """

    kind = "in-order"

    def batches_per_epoch(self) -> float:
        lo, hi = self.bounds()
        return math.ceil((hi - lo) / self.batch_size)

    def bounds(self) -> tuple[int, int]:
        n, w, r = self.num_items, self.world_size, self.rank
        return r * n // w, (r + 1) * n // w

    def indices(self, epoch: int, start: int) -> Iterator[int]:
        lo, hi = self.bounds()
        return iter(range(lo + start, hi))


def index_sampler(num_items: int, batch_size: int, seed: int, shuffle: bool | None, drop_last: bool | None,
                  rank: int | None, world_size: int | None) -> ResumableBatchSampler:
    """Every item once per epoch: shuffled per epoch with ``shuffle``, else in order."""
    if shuffle:
        return EpochSampler(num_items, batch_size, seed, rank, world_size, drop_last=bool(drop_last))
    if drop_last:
        raise ValueError("drop_last=True would skip up to batch_size-1 evaluation items; leave it off")
    return InOrderSampler(num_items, batch_size, seed, rank, world_size)


class BucketBatchSampler(ResumableBatchSampler):
    """Batches of similar lengths: shuffle, cut into pools of ``pool_batches`` batches, sort each
    pool by length, slice into batches, shuffle the batch order; reshuffled every epoch.

    Distributed, every rank builds the same batch list and takes every world-th batch after
    trimming it to a multiple of the world size: equal batch counts, disjoint documents.
    """

    kind = "bucket"

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int, pool_batches: int = 50,
                 rank: int | None = None, world_size: int | None = None, drop_last: bool = False):
        self.lengths = torch.as_tensor(np.asarray(lengths), dtype=torch.long)
        super().__init__(len(self.lengths), batch_size, seed, rank, world_size, drop_last)
        self.pool_batches = pool_batches

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches for ``epoch``."""
        g = generator("bucket", self.seed, epoch)
        order = torch.randperm(self.num_items, generator=g)
        pool = self.pool_batches * self.batch_size
        out: list[list[int]] = []
        for lo in range(0, len(order), pool):
            chunk = order[lo:lo + pool]
            chunk = chunk[torch.argsort(self.lengths[chunk], stable=True)].tolist()
            out += [chunk[i:i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
        if self.drop_last:
            out = [b for b in out if len(b) == self.batch_size]
        out = [out[i] for i in torch.randperm(len(out), generator=g).tolist()]
        return out[: len(out) // self.world_size * self.world_size][self.rank::self.world_size]

    def batches(self, epoch: int, start: int) -> Iterator[list[int]]:
        return iter(self.epoch_batches(epoch)[start:])

    def batches_per_epoch(self) -> float:
        # Counted from the sizes alone: building an epoch's batches just to count them would
        # repeat the shuffle and sorts that every iteration already does.
        pool = self.pool_batches * self.batch_size
        whole_pools, rest = divmod(self.num_items, pool)
        last = rest // self.batch_size if self.drop_last else -(-rest // self.batch_size)
        return (whole_pools * self.pool_batches + last) // self.world_size
