from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from helpers import run_module
from tokpack.check import check_folder, resumed, take
from tokpack.data.loader import build_loader
from tokpack.data.runtime import to_device
from tokpack.data.samplers import RandomStartSampler
from tokpack.data.windows import TokenWindows

SETUPS = {
    "random": lambda ds, **kw: build_loader(ds["train"], 4, 11, num_samples=4 * 6, **kw),
    "random-endless": lambda ds, **kw: build_loader(ds["train"], 4, 11, **kw),
    "epochs": lambda ds, **kw: build_loader(ds["strided"], 4, 11, shuffle=True, **kw),
    "in-order": lambda ds, **kw: build_loader(ds["strided"], 4, 11, **kw),
}


@pytest.fixture
def datasets(prepared):
    return {"train": TokenWindows(prepared / "train.bin", 16),
            "strided": TokenWindows(prepared / "val.bin", 16, stride=16)}


@pytest.mark.parametrize("setup", SETUPS)
def test_resume_from_any_batch_yields_the_uninterrupted_batches(datasets, setup):
    build = lambda: SETUPS[setup](datasets)  # noqa: E731
    epoch = len(build()) if setup != "random-endless" else 6
    n = 3 * epoch + 2  # crosses epoch boundaries
    fresh = take(build(), n)
    assert len(fresh) == n and len(set(fresh)) > 3
    # Each side of every epoch boundary, and seeded positions between.
    points = {1, n - 1} | {k * epoch + d for k in (1, 2, 3) for d in (-1, 0, 1)}
    points |= set(random.Random(setup).sample(range(1, n), min(6, n - 1)))
    for at in sorted(p for p in points if 0 < p < n):
        assert resumed(build, n, at) == fresh, at


def test_epochs_differ_without_set_epoch_and_rerun_identically(datasets):
    def rows(loader):
        return [tuple(x.tolist()) for batch, _ in loader for x in batch]

    loader = SETUPS["epochs"](datasets)
    e0, e1 = rows(loader), rows(loader)
    assert e0 != e1 and sorted(e0) == sorted(e1)  # a new order of the same windows
    assert len(e0) == len(datasets["strided"])  # each window once per epoch
    assert rows(SETUPS["epochs"](datasets)) == e0


def test_resume_does_not_fetch_skipped_batches(datasets, monkeypatch):
    fetched = []
    original = TokenWindows.__getitems__
    monkeypatch.setattr(TokenWindows, "__getitems__", lambda self, idx: fetched.append(list(idx)) or original(self, idx))
    loader = SETUPS["random"](datasets)
    loader.load_state_dict({**loader.state_dict(), "batch": 5})
    assert len(take(loader, 1)) == 1 and len(fetched) == 1


def test_state_from_other_settings_is_refused_showing_both_values(datasets):
    state = SETUPS["random"](datasets).state_dict()
    other = build_loader(datasets["train"], 8, 11, num_samples=24)
    with pytest.raises(ValueError, match="batch_size=4 but this loader has batch_size=8"):
        other.load_state_dict(state)
    reseeded = build_loader(datasets["train"], 4, 12, num_samples=24)
    with pytest.raises(ValueError, match="seed=11 but this loader has seed=12"):
        reseeded.load_state_dict(state)
    with pytest.raises(ValueError, match="version"):
        reseeded.load_state_dict({**state, "version": 99})


def test_batches_are_int64_next_token_pairs(datasets):
    x, y = next(iter(SETUPS["random"](datasets)))
    assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_ranks_in_the_environment_without_a_process_group_are_refused(datasets, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="WORLD_SIZE=3 is set but torch.distributed is not initialised"):
        SETUPS["in-order"](datasets)
    loader = build_loader(datasets["strided"], 4, 11, rank=1, world_size=3)  # explicit ranks need no group
    assert (loader.sampler.rank, loader.sampler.world_size) == (1, 3)
    streams = [take(build_loader(datasets["train"], 4, 11, num_samples=8, rank=r, world_size=2), 2) for r in (0, 1)]
    assert streams[0] != streams[1]


def test_bad_combinations_are_refused(datasets):
    with pytest.raises(ValueError, match="drop_last=True would skip"):
        build_loader(datasets["strided"], 4, drop_last=True)
    with pytest.raises(ValueError, match="only sampled at random"):
        build_loader(datasets["train"], 4, shuffle=False)
    with pytest.raises(ValueError, match="num_samples applies to random-start"):
        build_loader(datasets["strided"], 4, num_samples=10)


def test_pinning_is_automatic_and_warns_only_when_asked_for_in_vain(datasets):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = build_loader(datasets["train"], 4, num_samples=8)
    assert loader.dataloader.pin_memory == torch.cuda.is_available()
    if not torch.cuda.is_available():
        with pytest.warns(UserWarning, match="pin_memory=True has no effect"):
            build_loader(datasets["train"], 4, num_samples=8, pin_memory=True)


def test_to_device_keeps_structure():
    batch = {"a": torch.ones(2), "b": [torch.zeros(1), (torch.ones(1), 3)]}
    moved = to_device(batch, "cpu")
    assert moved["a"].device.type == "cpu" and moved["b"][1][1] == 3 and isinstance(moved["b"][1], tuple)


def test_check_reports_differences(prepared, monkeypatch):
    rows = check_folder(prepared, batches=6, block_size=16, batch_size=4, workers=(0,))
    assert all(v in ("same", "n/a") for row in rows for k, v in row.items() if k != "check")
    original = RandomStartSampler._chunks
    draws = iter(range(10**6))
    # A sampler that ignores its position: resumed and repeated runs must now differ.
    monkeypatch.setattr(RandomStartSampler, "_chunks", lambda self, e, s: (
        [next(draws) % self.num_items for _ in values] for values in original(self, e, s)))
    rows = check_folder(prepared, batches=6, block_size=16, batch_size=4, workers=(0,))
    assert rows[0]["train (random starts)"] == "DIFFERENT" and rows[0]["val (in order)"] == "same"


def test_check_cli_with_two_workers(prepared):
    done = run_module("tokpack.check", str(prepared), "--batches", "10", "--block-size", "16")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "workers=2 == workers=0" in done.stdout and "DIFFERENT" not in done.stdout


AUGMENT = textwrap.dedent('''
    import json, sys
    import numpy as np
    import torch
    from tokpack import TokenWindows, build_loader
    from tokpack.data.windows import WindowBatch

    class Masked(TokenWindows):
        """Masks tokens with the worker's own numpy Generator, and reports which worker it ran in."""
        def __getitems__(self, indices):
            batch = super().__getitems__(indices)
            info = torch.utils.data.get_worker_info()
            draw = int(self.rng.integers(1 << 30))
            keep = torch.from_numpy(self.rng.random(batch.x.shape) > 0.2)
            return WindowBatch(batch.x * keep, torch.tensor([info.id if info else -1, draw]))

    if __name__ == "__main__":
        runs = []
        for _ in range(2):  # a second loader from the same seed (new workers, the same server)
            loader = build_loader(Masked(sys.argv[1], 16), 4, seed=5, num_samples=16, num_workers=2,
                                  multiprocessing_context=sys.argv[2])
            runs.append([[(int(w), int(d), int(x.sum())) for x, (w, d) in loader] for _ in range(2)])
        print(json.dumps(runs))
''')


@pytest.mark.parametrize("context", ["forkserver"])  # pickles the dataset, as spawn does
def test_worker_augmentation_differs_by_worker_and_epoch_and_reruns_exactly(prepared, tmp_path, context):
    script = tmp_path / "masked_lab.py"
    script.write_text(AUGMENT)
    done = subprocess.run([sys.executable, str(script), str(prepared / "train.bin"), context],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)
    assert runs[0] == runs[1]  # same seed, same batches, same augmentation
    epoch0, epoch1 = runs[0]
    assert {w for w, _, _ in epoch0} == {0, 1}
    assert epoch0 != epoch1
    first_draw = {w: d for w, d, _ in reversed(epoch0)}
    assert first_draw[0] != first_draw[1]  # each worker has its own stream


# nanoGPT's train.py in miniature: module-level code with no __main__ guard, the data folder of
# uint16 bins, and get_batch replaced by tokpack's loader with workers and default settings.
NANOGPT_STYLE = textwrap.dedent("""
    import json, sys
    import torch
    from tokpack import TokenWindows, build_loader
    data_dir, block_size, batch_size = sys.argv[1], 16, 4
    context = sys.argv[2] if len(sys.argv) > 2 else "default"
    loaders = {split: iter(build_loader(TokenWindows(data_dir, block_size, split=split), batch_size,
                                        seed=1337, num_workers=2, multiprocessing_context=context))
               for split in ("train", "val")}
    def get_batch(split):
        x, y = next(loaders[split])
        return x, y
    for it in range(3):
        X, Y = get_batch("train")
        assert X.dtype == torch.int64 and X.shape == (batch_size, block_size)
        assert torch.equal(X[:, 1:], Y[:, :-1])
    print(json.dumps([int(get_batch("train")[0].sum()), int(get_batch("val")[0].sum())]))
""")


def test_workers_start_in_an_unguarded_training_script_with_default_settings(prepared, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(NANOGPT_STYLE)
    runs = [subprocess.run([sys.executable, str(script), str(prepared)], capture_output=True, text=True,
                           timeout=300, cwd=tmp_path) for _ in range(2)]
    assert runs[0].returncode == 0, runs[0].stderr[-2000:]
    assert runs[0].stdout == runs[1].stdout  # reproducible from the seed, workers and all


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_a_start_method_that_would_rerun_the_script_fails_at_build_with_the_fix(prepared, tmp_path, context):
    script = tmp_path / "train.py"
    script.write_text(NANOGPT_STYLE)
    done = subprocess.run([sys.executable, str(script), str(prepared), context], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode != 0 and "bootstrapping" not in done.stderr and "exited unexpectedly" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert f"multiprocessing_context='{context}' re-runs" in last and "multiprocessing_context='fork'" in last


def test_sampler_and_loader_arguments_never_contradict_silently(datasets):
    from tokpack.data.samplers import RandomStartSampler as Random

    sampler = Random(len(datasets["train"]), 4, seed=3, num_samples=8)
    assert build_loader(datasets["train"], sampler=sampler).sampler is sampler
    assert build_loader(datasets["train"], 4, 3, sampler=sampler).seed == 3
    with pytest.raises(ValueError, match="batch_size=32 contradicts the sampler's batch_size=4"):
        build_loader(datasets["train"], 32, sampler=sampler)
    with pytest.raises(ValueError, match="seed=5 contradicts the sampler's seed=3"):
        build_loader(datasets["train"], 4, 5, sampler=sampler)
    with pytest.raises(ValueError, match="num_samples would be ignored"):
        build_loader(datasets["train"], sampler=sampler, num_samples=100)
    with pytest.raises(TypeError, match="not a tokpack ResumableBatchSampler"):
        build_loader(datasets["train"], 4, sampler=torch.utils.data.BatchSampler(range(10), 4, False))


def test_loader_states_name_their_data_and_refuse_forgeries(datasets, prepared, tmp_path):
    loader = SETUPS["random"](datasets)
    state = loader.state_dict()
    for forged, message in [({**state, "batch": 6}, "batch=6"), ({**state, "epoch": "0"}, "epoch='0'"),
                            ({**state, "batch": None}, "batch=None"), ({}, "version None")]:
        with pytest.raises(ValueError, match=message):
            SETUPS["random"](datasets).load_state_dict(forged)
    with pytest.raises(TypeError, match="not NoneType"):
        loader.load_state_dict(None)
    # Other data with the same number of windows: same length, other file.
    other = tmp_path / "other"
    other.mkdir()
    (other / "train.bin").write_bytes((prepared / "train.bin").read_bytes()[::-1])
    twin = TokenWindows(other / "train.bin", 16, dtype="uint16")
    assert len(twin) == len(datasets["train"])
    with pytest.raises(ValueError, match="loader state was taken with dataset="):
        build_loader(twin, 4, 11, num_samples=24).load_state_dict(state)


AUGMENT_PERSISTENT = textwrap.dedent('''
    import json, sys
    import torch
    from tokpack import TokenWindows, build_loader
    from tokpack.data.windows import WindowBatch

    class Masked(TokenWindows):
        def __getitems__(self, indices):
            batch = super().__getitems__(indices)
            keep = torch.from_numpy(self.rng.random(batch.x.shape) > 0.3)
            return WindowBatch(batch.x * keep, batch.y)

    def build():
        return build_loader(Masked(sys.argv[1], 16), 4, seed=2, num_samples=12, num_workers=2,
                            persistent_workers=True)

    if __name__ == "__main__":
        straight = build()
        sums = [int(x.sum()) for _ in range(3) for x, _ in straight]
        first = build()
        head = []
        for x, _ in first:
            head.append(int(x.sum()))
            if len(head) == 2:
                break
        resumed = build()
        resumed.load_state_dict(first.state_dict())
        tail = [int(x.sum()) for _ in range(3) for x, _ in resumed][: len(sums) - 2]
        print(json.dumps({"straight": sums, "resumed": head + tail}))
''')


def test_persistent_workers_resume_with_the_same_augmentation(prepared, tmp_path):
    script = tmp_path / "persistent.py"
    script.write_text(AUGMENT_PERSISTENT)
    done = subprocess.run([sys.executable, str(script), str(prepared / "train.bin")], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = json.loads(done.stdout)
    assert len(runs["straight"]) == 9 and runs["resumed"] == runs["straight"]
