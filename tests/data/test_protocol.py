"""What ``build_loader`` reads of a dataset (``tokpack.data.protocol``), kept as a promise to users:
a dataset of their own, plain or using every optional member, read by 2 workers, gives the
batches of 0 workers and resumes exactly."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from tokpack.data.loader import build_loader
from tokpack.data.samplers import index_sampler


class Squares(Dataset):
    """A user's plain map-style dataset: nothing of tokpack's."""

    def __len__(self) -> int:
        return 50

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, i * i])


class Narrow(Dataset):
    """A user's dataset with every optional member: its workers send uint16 rows, which the
    training process widens; its own sampler and collate step; a fingerprint of its data."""

    def __init__(self, n: int = 60):
        self.n, self.compact = n, False
        self.data = np.random.default_rng(n).integers(0, 60000, (n, 8), dtype=np.uint16)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray | torch.Tensor:
        row = self.data[i]
        return row if self.compact else torch.from_numpy(row.astype(np.int64))

    @staticmethod
    def default_collate_fn(rows: list) -> np.ndarray | torch.Tensor:
        return np.stack(rows) if isinstance(rows[0], np.ndarray) else torch.stack(rows)

    def default_sampler(self, batch_size: int, seed: int, *, shuffle: bool | None = None,
                        num_samples: int | None = None, drop_last: bool | None = None, rank: int | None = None,
                        world_size: int | None = None):
        return index_sampler(self.n, batch_size, seed, shuffle is not False, drop_last, rank, world_size)

    def fingerprint(self) -> dict:
        return {"rows": self.n}

    def worker_copy(self) -> Narrow:
        read = copy.copy(self)
        read.compact = True
        return read

    def finish_batch(self, batch: np.ndarray, device) -> torch.Tensor:
        wide = torch.from_numpy(batch.astype(np.int64))
        return wide if device is None else wide.to(device)


def _batches(loader, n: int | None = None) -> list[list]:
    return [b.tolist() for b in itertools.islice(loader, n)]


@pytest.mark.parametrize("make", [Squares, Narrow], ids=["plain", "every-member"])
def test_a_users_own_dataset_reads_alike_with_two_workers_and_resumes(make):
    options = {"seed": 3, "shuffle": True}
    alone = _batches(build_loader(make(), 4, **options))
    workers = build_loader(make(), 4, num_workers=2, **options)
    assert _batches(workers) == alone and len(alone) == -(-len(make()) // 4)
    assert all(isinstance(v, int) for b in alone for row in b for v in row)  # int64 rows, whole
    first = build_loader(make(), 4, num_workers=2, **options)
    head = _batches(first, 5)
    resumed = build_loader(make(), 4, num_workers=2, **options)
    resumed.load_state_dict(first.state_dict())
    assert head + _batches(resumed) == alone


def test_a_state_of_other_data_is_refused_by_the_datasets_fingerprint():
    first = build_loader(Narrow(60), 4, seed=1)
    _batches(first, 2)
    other = build_loader(Narrow(61), 4, seed=1)
    with pytest.raises(ValueError):
        other.load_state_dict(first.state_dict())
