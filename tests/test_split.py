"""One opened split: found once, handed down, never re-derived, never misread."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from helpers import shard_file
from tokpack import split as split_module
from tokpack.bench.loops import write_shard_folder
from tokpack.data.loader import build_loader
from tokpack.data.windows import TokenWindows
from tokpack.split import open_split


def _counting(monkeypatch, name):
    calls = []
    real = getattr(split_module, name)
    monkeypatch.setattr(split_module, name, lambda *a, **k: calls.append(a) or real(*a, **k))
    return calls


def _refusing(monkeypatch, *names):
    for name in names:
        monkeypatch.setattr(split_module, name, lambda *a, **k: pytest.fail(f"{name} called again"))


def test_two_thousand_shards_open_with_one_meta_read_and_one_look_per_file(tmp_path, monkeypatch):
    folder = write_shard_folder(tmp_path / "f", 2000, 16)
    meta_reads, headers = _counting(monkeypatch, "read_meta"), _counting(monkeypatch, "shard_header")
    windows = TokenWindows(folder, 8, split="train")
    assert len(meta_reads) == 1 and len(headers) == 2000
    assert len(windows) == 2000 * (16 - 8) and windows.split.meta["splits"]["train"]["tokens"] == 2000 * 16


def test_a_state_and_a_worker_re_derive_nothing(tmp_path, monkeypatch):
    folder = write_shard_folder(tmp_path / "f", 300, 16)
    windows = TokenWindows(folder, 8, split="train")
    loader = build_loader(windows, 4, seed=0)
    first = next(iter(loader))
    _refusing(monkeypatch, "read_meta", "shard_header", "_probe")
    state = loader.state_dict()
    assert state["dataset"] == windows.split.fingerprint and len(state["dataset"]) == 64  # O(1): one hash
    worker_copy = pickle.loads(pickle.dumps(windows))  # what a worker receives
    assert worker_copy._tokens is None  # the maps are not pickled: the worker maps the files itself
    again = build_loader(worker_copy, 4, seed=0)
    assert np.array_equal(next(iter(again)).x, first.x)


def test_the_fingerprint_follows_the_data(tmp_path):
    a = write_shard_folder(tmp_path / "a", 3, 16)
    b = write_shard_folder(tmp_path / "b", 3, 16)
    assert open_split(a, "train").fingerprint == open_split(b, "train").fingerprint  # same bytes, same names
    c = write_shard_folder(tmp_path / "c", 4, 16)
    assert open_split(c, "train").fingerprint != open_split(a, "train").fingerprint


def test_a_glob_over_uint16_and_uint32_shards_is_refused_never_misread(tmp_path):
    shard_file(tmp_path / "web_train_000001.bin", np.arange(100), version=1)
    shard_file(tmp_path / "web_train_000002.bin", np.arange(100) + 70_000, version=7)
    with pytest.raises(ValueError, match=r"web_train_000001.bin holds uint16 tokens but .*web_train_000002.bin "
                                         r"holds uint32"):
        TokenWindows(str(tmp_path / "web_train_*.bin"), 8)


def test_each_width_alone_reads_its_own_ids(tmp_path):
    wide = shard_file(tmp_path / "wide.bin", np.arange(100) + 70_000, version=7)
    split = open_split(wide)
    assert split.dtype == np.uint32 and split.open()[0][0] == 70_000


def test_a_file_rewritten_after_opening_is_refused_where_it_is_read(prepared):
    windows = TokenWindows(prepared, 8, split="train")
    worker_copy = pickle.loads(pickle.dumps(windows))
    path = prepared / "train.bin"
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data[: len(data) // 2])  # a --force rewrite with a smaller corpus
    with pytest.raises(ValueError, match="train.bin was rewritten after its split was opened"):
        worker_copy.gather([0])
