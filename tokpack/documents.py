"""Whole documents: a dataset over a prepared split's document index, padding, bucketing, balancing.

    from tokpack import DocumentDataset, BucketBatchSampler, build_loader, pad_collate
    docs = DocumentDataset("data/sample/train.bin", max_length=512)
    loader = build_loader(docs, 16, seed=0, sampler=BucketBatchSampler(docs.lengths, 16, seed=0))
    batch = next(iter(loader))   # {"input_ids", "attention_mask", "labels"}: (16, T) each

``pad_collate`` right-pads to the batch's longest document; ``BucketBatchSampler`` groups
documents of similar length so that little of each batch is padding. Both keep the loader's seed,
workers, pinning and exact resume.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from .format import INDEX_DTYPE, open_tokens
from .samplers import CHUNK, DrawSampler, WindowBatchSampler, generator
from .windows import IGNORE_INDEX


def pad_collate(samples: Sequence[Any], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-pad 1-D id tensors to the longest; mask = arange(T) < length; labels -100 at padding.

    Samples may also be (ids, class label) pairs, whose labels come back as ``class_labels``.
    Module-level, so spawn and forkserver workers can pickle it.
    """
    labelled = isinstance(samples[0], (tuple, list))
    seqs = [s[0] for s in samples] if labelled else list(samples)
    lengths = torch.tensor([len(s) for s in seqs])
    T = int(lengths.max())
    input_ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    for row, seq in enumerate(seqs):
        input_ids[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
    attention_mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    batch = {"input_ids": input_ids, "attention_mask": attention_mask,
             "labels": input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)}
    if labelled:
        batch["class_labels"] = torch.tensor([int(s[1]) for s in samples], dtype=torch.long)
    return batch


def padded_fraction(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Share of padding in the padded batches: 1 - real tokens / (rows x longest), summed over batches."""
    lengths = np.asarray(lengths)
    real = sum(int(lengths[b].sum()) for b in batches)
    total = sum(len(b) * int(lengths[b].max()) for b in batches)
    return 1.0 - real / total


class DocumentDataset(Dataset):
    """The documents of a prepared split (from its ``.idx``), each truncated to ``max_length``.

    ``labels`` (one int per document) makes items ``(ids, label)`` pairs, for classification and
    for ``inverse_frequency_weights``.
    """

    default_collate_fn = staticmethod(pad_collate)

    def __init__(self, path: str | Path, max_length: int, labels: Sequence[int] | None = None):
        self.path = Path(path)
        if max_length < 1:
            raise ValueError(f"max_length {max_length} must be at least 1")
        index = self.path.with_suffix(".idx")
        if not index.is_file():
            raise FileNotFoundError(f"{index} is missing: documents need the index that tokpack.prepare writes "
                                    "beside each .bin; rerun python -m tokpack.prepare")
        n = len(open_tokens(self.path))
        starts = np.fromfile(index, dtype=INDEX_DTYPE).astype(np.int64)
        self.starts, self.ends = starts, np.append(starts[1:], n)
        self.max_length = max_length
        self.lengths = np.minimum(self.ends - self.starts, max_length)
        if labels is not None and len(labels) != len(starts):
            raise ValueError(f"{len(labels)} labels for {len(starts)} documents in {self.path}; give one per document")
        self.labels = None if labels is None else np.asarray(labels, dtype=np.int64)
        self.rng: np.random.Generator | None = None
        self._tokens: np.memmap | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tokens": None}  # workers reopen the memmap, never copy it

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> Any:
        if self._tokens is None:
            self._tokens = open_tokens(self.path)
        start = int(self.starts[i])
        ids = torch.from_numpy(self._tokens[start:start + int(self.lengths[i])].astype(np.int64))
        return ids if self.labels is None else (ids, int(self.labels[i]))


def inverse_frequency_weights(labels: Sequence[int]) -> torch.Tensor:
    """Per-item weights 1 / count(label): balanced classes when drawn with replacement."""
    labels = torch.as_tensor(np.asarray(labels), dtype=torch.long)
    return (1.0 / torch.bincount(labels).double())[labels]


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


class BucketBatchSampler(WindowBatchSampler):
    """Batches of similar lengths: shuffle, cut into pools of ``pool_batches`` batches, sort each
    pool by length, slice into batches, shuffle the batch order; reshuffled every epoch.

    Distributed, every rank builds the same batch list and takes every world-th batch after
    trimming it to a multiple of the world size: equal batch counts, disjoint documents.
    """

    kind = "bucket"

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int, pool_batches: int = 50,
                 rank: int | None = None, world_size: int | None = None, drop_last: bool = False):
        self.lengths = torch.as_tensor(np.asarray(lengths), dtype=torch.long)
        super().__init__(len(self.lengths), batch_size, rank, world_size)
        self.seed, self.pool_batches, self.drop_last = seed, pool_batches, drop_last

    def batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches for ``epoch``."""
        g = generator("bucket", self.seed, epoch)
        order = torch.randperm(self.num_windows, generator=g)
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

    def batches_per_epoch(self) -> float:
        # Counted from the sizes alone: building an epoch's batches just to count them would
        # repeat the shuffle and sorts that every iteration already does.
        pool = self.pool_batches * self.batch_size
        whole_pools, rest = divmod(self.num_windows, pool)
        last = rest // self.batch_size if self.drop_last else -(-rest // self.batch_size)
        return (whole_pools * self.pool_batches + last) // self.world_size

    def __iter__(self) -> Iterator[list[int]]:
        yield from self.batches(self.epoch)[self.start_batch:]
