"""The seed's fences 2 and 3 for torch's samplers, then the same properties for tokpack's."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, random_split

from tokpack.samplers import EpochSampler, RandomStartSampler, SequentialSampler


def _flat(sampler) -> list[int]:
    return [i for batch in sampler for i in batch]


# -- torch.utils.data, in our own words ------------------------------------------------------

def test_torch_shuffle_order_is_a_function_of_the_generator_and_advances_per_epoch():
    items = list(range(12))

    def one_epoch(seed):
        loader = DataLoader(items, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(seed))
        return [i for b in loader for i in b.tolist()]

    first, again, other = one_epoch(7), one_epoch(7), one_epoch(8)
    assert first == again and first != other and sorted(first) == items
    loader = DataLoader(items, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(7))
    epochs = [[i for b in loader for i in b.tolist()] for _ in range(2)]
    assert epochs[0] == first and epochs[1] != epochs[0]


def test_torch_random_split_is_reproducible_disjoint_and_covering():
    def parts(seed):
        split = random_split(range(10), [0.5, 0.3, 0.2], generator=torch.Generator().manual_seed(seed))
        return [list(p.indices) for p in split]

    a = parts(0)
    assert a == parts(0) and [len(p) for p in a] == [5, 3, 2]
    assert sorted(i for p in a for i in p) == list(range(10))


def test_torch_distributed_sampler_pads_shares_and_needs_set_epoch():
    items = list(range(10))

    def shares(epoch=None):
        out = []
        for rank in range(3):
            s = DistributedSampler(items, num_replicas=3, rank=rank, shuffle=True, seed=0)
            if epoch is not None:
                s.set_epoch(epoch)
            out.append(list(s))
        return out

    e0, e1 = shares(0), shares(1)
    assert [len(p) for p in e0] == [4, 4, 4]  # ceil(10 / 3)
    flat = [i for p in e0 for i in p]
    assert len(flat) == 12 and set(flat) == set(items)  # two repeated as padding
    assert e1 != e0 and shares(None) == e0 == shares(None)  # without set_epoch: epoch 0 forever
    trimmed = [list(DistributedSampler(items, num_replicas=3, rank=r, shuffle=False, drop_last=True)) for r in range(3)]
    assert [len(p) for p in trimmed] == [3, 3, 3] and len({i for p in trimmed for i in p}) == 9


# -- tokpack's samplers ------------------------------------------------------------------------

def test_random_starts_follow_the_seed_rank_and_epoch():
    def stream(seed=1, rank=0, epoch=0, world=2):
        s = RandomStartSampler(1000, 8, seed, num_samples=400, rank=rank, world_size=world)
        s.epoch = epoch
        return _flat(s)

    a = stream()
    assert a == stream() and len(a) == 400 and all(0 <= i < 1000 for i in a)
    assert a != stream(seed=2) and a != stream(rank=1) and a != stream(epoch=1)
    assert len(set(a)) > 300  # with replacement, but spread over the windows


def test_random_starts_resume_at_any_batch_without_drawing_the_past():
    s = RandomStartSampler(10**6, 7, seed=3, num_samples=CHUNK_SPAN)
    full = list(s)
    for start in (0, 1, 1170, 1171, len(full) - 1):
        s.start_batch = start
        assert list(s) == full[start:]


CHUNK_SPAN = 3 * 8192 + 5


def test_random_starts_never_build_a_permutation_of_a_huge_corpus():
    # A permutation of 9e9 int64 indices would need 72 GB; this draws a chunk at a time.
    s = RandomStartSampler(9_000_000_000, 64, seed=0, num_samples=64 * 10)
    batches = list(s)
    assert len(batches) == 10 and max(max(b) for b in batches) > 2**32


def test_random_starts_length_and_drop_last():
    assert len(RandomStartSampler(100, 8, 0, num_samples=20)) == 2
    assert len(RandomStartSampler(100, 8, 0, num_samples=20, drop_last=False)) == 3
    assert [len(b) for b in RandomStartSampler(100, 8, 0, num_samples=20, drop_last=False)] == [8, 8, 4]
    with pytest.raises(TypeError, match="endless"):
        len(RandomStartSampler(100, 8, 0))


def test_epochs_see_every_window_once_and_reshuffle_by_themselves():
    s = EpochSampler(50, 8, seed=5)
    e0 = _flat(s)
    s.epoch = 1
    e1 = _flat(s)
    assert sorted(e0) == sorted(e1) == list(range(50)) and e0 != e1
    s.epoch, s.start_batch = 1, 3
    assert _flat(s) == e1[24:]


@pytest.mark.parametrize("n,world", [(50, 3), (10, 3), (9, 3), (7, 2)])
def test_epoch_shares_are_equal_and_disjoint(n, world):
    shares = [_flat(EpochSampler(n, 4, seed=1, rank=r, world_size=world)) for r in range(world)]
    assert {len(p) for p in shares} == {n // world}
    flat = [i for p in shares for i in p]
    assert len(set(flat)) == len(flat) == n // world * world


@pytest.mark.parametrize("n,world", [(10, 3), (55, 2), (2, 3), (1, 1)])
def test_sequential_shares_cover_every_window_once_with_no_padding(n, world):
    shares = [_flat(SequentialSampler(n, 4, rank=r, world_size=world)) for r in range(world)]
    assert [i for p in shares for i in p] == list(range(n))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="rank 3 must lie in 0..world_size-1"):
        SequentialSampler(10, 2, rank=3, world_size=3)
    with pytest.raises(ValueError, match="batch_size 0"):
        EpochSampler(10, 0, seed=0)
    with pytest.raises(ValueError, match="cannot be shared by 4 ranks"):
        EpochSampler(3, 1, seed=0, world_size=4)
