"""What ``build_loader`` asks of a dataset: a small interface, every part of it optional.

    from tokpack import build_loader
    loader = build_loader(my_dataset, batch_size=8, num_workers=2)   # any map-style dataset

A dataset may say which sampler it wants (``default_sampler``), how its samples become a batch
(``default_collate_fn``), what identifies its data for a resume (``fingerprint``), and, to send
narrow batches from the workers, the copy the workers read (``worker_copy``) and how such a
batch is finished in the training process (``finish_batch``). The loader knows no dataset by name:
``TokenWindows`` and ``PackedDocuments`` use the whole of it, a plain ``Dataset`` none, and a
user's own dataset any part (tests/data/test_protocol.py reads one of each under 2 workers).

See docs/loading.md.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import torch

from .samplers import ResumableBatchSampler


class LoaderDataset(Protocol):
    """The optional members ``build_loader`` reads (with ``getattr``) from a dataset."""

    default_collate_fn: Callable[[Any], Any]

    def __len__(self) -> int:
        ...

    def default_sampler(self, batch_size: int, seed: int, *, shuffle: bool | None = None,
                        num_samples: int | None = None, drop_last: bool | None = None, rank: int | None = None,
                        world_size: int | None = None) -> ResumableBatchSampler:
        """The sampler this dataset is read with, unless the caller passes one."""
        ...

    def fingerprint(self) -> Any:
        """What a loader's state records of the data, so a resume on other data is refused."""
        ...

    def worker_copy(self) -> Any:
        """The dataset the workers read, whose batches are narrow (stored tokens), or None: the
        workers read this one and its batches pass unchanged."""
        ...

    def finish_batch(self, batch: Any, device: torch.device | str | None) -> Any:
        """A batch of the worker copy made whole (int64, labels, document structure), on ``device``."""
        ...


D = TypeVar("D")


def compact_copy(dataset: D, base: type) -> D | None:
    """``dataset``'s copy with ``compact`` set, the one its workers read to send narrow batches;
    None for a subclass of ``base`` with its own ``__getitems__``, whose batches pass unchanged."""
    if type(dataset).__getitems__ is not base.__getitems__:
        return None
    read = copy.copy(dataset)
    read.compact = True  # type: ignore[attr-defined]
    return read
