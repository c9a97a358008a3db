"""tokpack's samplers: seeded, reshuffled per epoch, resumable, equal and disjoint rank shares."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest

from tokpack.data.samplers import EpochSampler, InOrderSampler, RandomStartSampler, WeightedSampler


def _flat(sampler) -> list[int]:
    return [i for batch in sampler for i in batch]


def test_random_starts_follow_the_seed_rank_and_epoch():
    def stream(seed=1, rank=0, epoch=0, world=2):
        s = RandomStartSampler(1000, 8, seed, num_samples=400, rank=rank, world_size=world)
        s.set_position(epoch, 0)
        return _flat(s)

    a = stream()
    assert a == stream() and len(a) == 400 and all(0 <= i < 1000 for i in a)
    assert a != stream(seed=2) and a != stream(rank=1) and a != stream(epoch=1)
    assert len(set(a)) > 300  # with replacement, but spread over the windows


def test_random_starts_resume_at_any_batch_without_drawing_the_past():
    s = RandomStartSampler(10**6, 7, seed=3, num_samples=CHUNK_SPAN)
    full = list(s)
    for start in (0, 1, 1170, 1171, len(full) - 1):
        s.set_position(0, start)
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
    e0, e1 = _flat(s), _flat(s)  # each pass is the next epoch, with no set_epoch call
    assert sorted(e0) == sorted(e1) == list(range(50)) and e0 != e1
    s.set_position(1, 3)
    assert _flat(s) == e1[24:]
    assert _flat(EpochSampler(50, 8, seed=5)) == e0


@pytest.mark.parametrize("n,world", [(50, 3), (10, 3), (9, 3), (7, 2)])
def test_epoch_shares_are_equal_and_disjoint(n, world):
    shares = [_flat(EpochSampler(n, 4, seed=1, rank=r, world_size=world)) for r in range(world)]
    assert {len(p) for p in shares} == {n // world}
    flat = [i for p in shares for i in p]
    assert len(set(flat)) == len(flat) == n // world * world


@pytest.mark.parametrize("n,world", [(10, 3), (55, 2), (2, 3), (1, 1)])
def test_sequential_shares_cover_every_window_once_with_no_padding(n, world):
    shares = [_flat(InOrderSampler(n, 4, rank=r, world_size=world)) for r in range(world)]
    assert [i for p in shares for i in p] == list(range(n))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="rank 3 must lie in 0..world_size-1"):
        InOrderSampler(10, 2, rank=3, world_size=3)
    with pytest.raises(ValueError, match="batch_size 0"):
        EpochSampler(10, 0, seed=0)
    with pytest.raises(ValueError, match="cannot be shared by 4 ranks"):
        EpochSampler(3, 1, seed=0, world_size=4)


def test_a_pass_claims_its_epoch_with_its_first_batch():
    s = EpochSampler(40, 4, seed=0)
    unused = iter(s)  # DataLoader makes an iterator it never reads from; that must not skip an epoch
    first = iter(s)
    assert next(first) == _flat(EpochSampler(40, 4, seed=0))[:4] and s.epoch == 1
    del unused
    abandoned_then_next = _flat(s)  # the pass after an abandoned one is the next epoch
    s.set_position(1, 0)
    assert abandoned_then_next == _flat(s)


def test_sampler_and_iterator_states_resume_exactly():
    s = RandomStartSampler(10**6, 5, seed=2, num_samples=100)
    it = iter(s)
    head = [next(it) for _ in range(7)]
    sampler_state, iterator_state = s.state_dict(), it.state_dict()
    rest = list(it)
    fresh = RandomStartSampler(10**6, 5, seed=2, num_samples=100)
    fresh.load_state_dict(sampler_state)
    resumed = iter(fresh)
    resumed.load_state_dict(iterator_state)
    assert list(resumed) == rest and len(head + rest) == 20
    following = RandomStartSampler(10**6, 5, seed=2, num_samples=100)
    following.set_position(1, 0)
    assert list(fresh) == list(following)  # after the restored pass, the next epoch


@pytest.mark.parametrize("state,message", [
    (None, "not NoneType"),
    ("epoch 3", "not str"),
    ({"foreign": 1}, "version None"),
])
def test_foreign_states_are_refused(state, message):
    s = EpochSampler(40, 4, seed=0)
    with pytest.raises((TypeError, ValueError), match=message):
        s.load_state_dict(state)


def test_forged_positions_are_refused():
    s = EpochSampler(40, 4, seed=0)
    good = s.state_dict()
    for bad in ({**good, "batch": 11}, {**good, "batch": -1}, {**good, "epoch": "1"}, {**good, "seed": 9}):
        with pytest.raises(ValueError):
            s.load_state_dict(bad)
    with pytest.raises(ValueError, match="batch=11"):
        iter(s).load_state_dict({"epoch": 0, "batch": 11})



def test_states_claiming_more_than_a_run_hands_out_or_without_a_setting_are_refused():
    from tokpack.data.samplers import MAX_BATCHES

    for s in (EpochSampler(40, 4, seed=0), RandomStartSampler(10**6, 5, seed=2)):  # ten batches an epoch; endless
        good = s.state_dict()
        per_epoch = s.batches_per_epoch()
        most = MAX_BATCHES if per_epoch == float("inf") else MAX_BATCHES // per_epoch
        s.load_state_dict({**good, "epoch": most})  # the most a state may claim is taken
        iter(s).load_state_dict({"epoch": most, "batch": 0})
        for bad in ({**good, "epoch": most + 1}, {**good, "epoch": 10**12},
                    {k: v for k, v in good.items() if k != "num_samples"}, {**good, "seed": float(good["seed"])}):
            with pytest.raises(ValueError, match="epoch=|no num_samples|seed=0.0|seed=2.0"):
                s.load_state_dict(bad)
        with pytest.raises(ValueError, match="epoch="):
            iter(s).load_state_dict({"epoch": most + 1, "batch": 0})


def test_torchdata_stateful_dataloader_resumes_in_o1_and_epochs_differ(prepared, monkeypatch):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    from tokpack import TokenWindows, collate_windows
    from tokpack.data.samplers import SamplerIterator

    ds = TokenWindows(prepared / "train.bin", 16, stride=16)

    def build():
        return stateful.StatefulDataLoader(ds, batch_sampler=EpochSampler(len(ds), 4, seed=3),
                                           collate_fn=collate_windows)

    def rows(batches):
        return [tuple(x.tolist()) for batch, _ in batches for x in batch]

    loader = build()
    epochs = [rows(loader) for _ in range(3)]
    assert epochs[0] != epochs[1] != epochs[2] and sorted(epochs[0]) == sorted(epochs[1])
    loader = build()
    rows(loader)  # epoch 0
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = loader.state_dict()
    drawn = []
    original = SamplerIterator.__next__
    monkeypatch.setattr(SamplerIterator, "__next__", lambda self: drawn.append(self.batch) or original(self))
    resumed = build()
    resumed.load_state_dict(state)
    rest = rows(resumed)
    assert rows(head) + rest == epochs[1]
    assert drawn[0] == 3 and len(drawn) == len(rest) // 4 + (len(rest) % 4 > 0) + 1  # no fast-forward
    assert rows(resumed) == epochs[2]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 65, 1000, 10_007])
def test_computed_shuffles_are_permutations_that_change_every_epoch(n):
    from tokpack.data.permutation import Shuffle

    orders = [Shuffle(n, "epoch", 5, epoch)(np.arange(n, dtype=np.uint64)).tolist() for epoch in (0, 1)]
    assert all(sorted(order) == list(range(n)) for order in orders)
    if n >= 7:
        assert orders[0] != orders[1] and orders[0] != list(range(n))
    assert Shuffle(n, "epoch", 5, 0)(np.arange(n, dtype=np.uint64)).tolist() == orders[0]


def test_shuffled_epochs_of_billions_resume_in_constant_memory():
    # In a fresh interpreter: a peak that earlier, heavier work already raised would hide growth.
    code = """
import json
from tokpack.data.samplers import EpochSampler

def peak_kb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

s = EpochSampler(9_000_000_000, 64, seed=0, world_size=3, rank=2)
before = peak_kb()
s.set_position(4, 10**9 // 64)
first = next(iter(s))
print(json.dumps({"grown_mb": (peak_kb() - before) / 1024, "first": first}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    first = found["first"]
    assert len(first) == 64 and len(set(first)) == 64 and max(first) < 9_000_000_000
    assert found["grown_mb"] < 50  # a permutation of 9e9 int64 indices would take 72 GB
    again = EpochSampler(9_000_000_000, 64, seed=0, world_size=3, rank=2)
    again.set_position(4, 10**9 // 64)
    assert next(iter(again)) == first


@pytest.mark.parametrize("num_samples,batch_size,drop_last,start", [
    (None, 32, True, 0), (None, 7, True, 300), (5000, 32, False, 0), (5000, 48, False, 100), (5000, 48, True, 3),
    (1000, 1000, False, 0), (10, 3, False, 2)])
def test_drawn_batches_are_the_index_streams_cut_into_batches(num_samples, batch_size, drop_last, start):
    from tokpack.data.samplers import IndexSampler

    for sampler in (RandomStartSampler(10**6, batch_size, seed=3, num_samples=num_samples, drop_last=drop_last),
                    WeightedSampler(np.linspace(1, 2, 500), batch_size, seed=3, num_samples=num_samples or 10**6,
                                    drop_last=drop_last)):
        fast = itertools.islice(sampler.batches(1, start), 200)
        reference = itertools.islice(IndexSampler.batches(sampler, 1, start), 200)
        assert [list(b) for b in fast] == [list(b) for b in reference]
