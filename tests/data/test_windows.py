from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from helpers import bare_file, shard_file
from tokpack.data.windows import IGNORE_INDEX, TokenWindows, WindowBatch, _trained_windows, collate_windows
from tokpack.format.megatron import write_index as write_megatron_index


def test_training_windows_are_shifted_reads_of_the_file(tmp_path):
    tokens = bare_file(tmp_path / "t.bin", 1000)
    ds = TokenWindows(tmp_path / "t.bin", block_size=16, dtype="uint16")
    assert len(ds) == 1000 - 16
    for i in (0, 1, 500, len(ds) - 1):
        x, y = ds[i]
        assert x.dtype == y.dtype == torch.int64 and x.shape == (16,)
        assert x.tolist() == tokens[i:i + 16].tolist() and y.tolist() == tokens[i + 1:i + 17].tolist()
    batch = ds.__getitems__([3, 900, 3])
    assert isinstance(batch, WindowBatch) and batch.x.shape == (3, 16)
    assert torch.equal(batch.x[:, 1:], batch.y[:, :-1])
    assert torch.equal(batch.x[1], ds[900][0]) and batch.x.is_contiguous() and batch.y.is_contiguous()
    for bad in ([len(ds)], [3, -1], [2**63], np.array([-2])):  # refused by the view's bounds, never wrapped
        with pytest.raises(IndexError, match="out of range"):
            ds.__getitems__(bad)


@pytest.mark.parametrize("n,T,S", [(1000, 16, 16), (1000, 16, 5), (1001, 16, 1), (17, 16, 16), (20, 16, 4), (300, 32, 31)])
def test_evaluation_windows_score_every_target_exactly_once(tmp_path, n, T, S):
    tokens = bare_file(tmp_path / "v.bin", n)
    ds = TokenWindows(tmp_path / "v.bin", block_size=T, stride=S, dtype="uint16")
    batch = ds.__getitems__(list(range(len(ds))))
    scored = batch.y != IGNORE_INDEX
    assert int(scored.sum()) == n - 1 == ds.scored_tokens
    covered = []
    for k in range(len(ds)):
        for t in np.flatnonzero(scored[k].numpy()):
            position = k * S + t + 1  # the target's position in the file
            covered.append(position)
            assert batch.y[k, t] == int(tokens[position])
            assert t >= T - S or k == 0  # at least T - S tokens of context after the first window
            real = min(T, n - k * S)
            assert batch.x[k, :real].tolist() == tokens[k * S:k * S + real].tolist()
    assert sorted(covered) == list(range(1, n))


def test_pickle_carries_the_path_not_the_corpus(tmp_path):
    bare_file(tmp_path / "big.bin", 4_000_000)
    ds = TokenWindows(tmp_path / "big.bin", block_size=64, dtype="uint16")
    ds.__getitems__([0, 123456])  # opens the memmap in this process
    blob = pickle.dumps(ds)
    assert len(blob) < 2000
    clone = pickle.loads(blob)
    assert torch.equal(clone[77][0], ds[77][0])


def test_dtype_comes_from_meta_json(prepared):
    ds = TokenWindows(prepared / "train.bin", block_size=8)
    assert ds.dtype == np.uint16
    with pytest.raises(ValueError, match="holds uint16 tokens, not the dtype=uint32"):
        TokenWindows(prepared / "train.bin", block_size=8, dtype="uint32")


def test_bad_files_get_one_clear_error(tmp_path):
    bare_file(tmp_path / "t.bin", 100)
    with pytest.raises(ValueError, match="cannot tell the dtype.*pass dtype='uint16'"):
        TokenWindows(tmp_path / "t.bin", block_size=8)
    with pytest.raises(ValueError, match=r"block_size 100 needs more than 100 tokens, but .*t.bin holds 100"):
        TokenWindows(tmp_path / "t.bin", block_size=100, dtype="uint16")
    (tmp_path / "odd.bin").write_bytes(b"\x01\x02\x03")
    with pytest.raises(ValueError, match="3 bytes, not a whole number of uint16 tokens.*truncated"):
        TokenWindows(tmp_path / "odd.bin", block_size=1, dtype="uint16")
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="holds no tokens"):
        TokenWindows(tmp_path / "empty.bin", block_size=1, dtype="uint16")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TokenWindows(tmp_path / "nope.bin", block_size=1, dtype="uint16")
    with pytest.raises(ValueError, match="stride 9 must lie in 1..block_size"):
        TokenWindows(tmp_path / "t.bin", block_size=8, stride=9, dtype="uint16")
    with pytest.raises(ValueError, match="block_size 10000000000 is longer than the 99 targets"):
        TokenWindows(tmp_path / "t.bin", block_size=10**10, stride=10**10, dtype="uint16")


def test_llmc_shards_are_detected_and_windows_stay_inside_a_shard(tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    parts = [np.arange(k * 1000, k * 1000 + n) for k, n in enumerate((50, 9, 70))]
    for k, part in enumerate(parts):
        shard_file(folder / f"fineweb_train_{k:06d}.bin", part)
    ds = TokenWindows(folder, block_size=10)
    assert ds.dtype == np.uint16 and len(ds) == (50 - 10) + 0 + (70 - 10)
    batch = ds.__getitems__(list(range(len(ds))))
    # Every window lies inside one shard: consecutive ids, as each shard counts up by one.
    whole = torch.cat([batch.x, batch.y[:, -1:]], dim=1)
    assert torch.equal(whole[:, 1:] - whole[:, :-1], torch.ones(len(ds), 10, dtype=torch.int64))
    assert batch.x[0, 0] == 0 and batch.x[40, 0] == 2000
    evaluation = TokenWindows(folder, block_size=10, stride=10)
    assert int((evaluation.__getitems__(list(range(len(evaluation)))).y != IGNORE_INDEX).sum()) == 49 + 8 + 69
    (folder / "fineweb_train_000001.bin").write_bytes((folder / "fineweb_train_000001.bin").read_bytes()[:-2])
    with pytest.raises(ValueError, match="header promises 9 uint16 tokens.*truncated"):
        TokenWindows(folder, block_size=10)


def test_collate_passes_batches_through_and_stacks_samples():
    batch = WindowBatch(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long))
    assert collate_windows(batch) is batch
    xb, yb = collate_windows([(torch.arange(3), torch.arange(3)), (torch.arange(3), torch.arange(3))])
    assert xb.shape == (2, 3) and yb.shape == (2, 3)


def test_llmc_v7_uint32_shards_read_and_a_contradicting_dtype_is_refused(tmp_path):
    tokens = np.arange(100_000, 100_300)  # ids beyond uint16: llama-3's vocabulary
    shard_file(tmp_path / "llama_train_000000.bin", tokens, version=7)
    ds = TokenWindows(tmp_path / "llama_train_000000.bin", block_size=8)
    assert ds.dtype == np.uint32 and len(ds) == 300 - 8
    assert ds[0][0].tolist() == tokens[:8].tolist()  # the 1024-byte header is not read as tokens
    for dtype in ("uint16", "uint32"):
        if dtype == "uint16":
            with pytest.raises(ValueError, match="holds uint32 tokens, not the dtype=uint16"):
                TokenWindows(tmp_path / "llama_train_000000.bin", 8, dtype=dtype)
        else:
            assert len(TokenWindows(tmp_path / "llama_train_000000.bin", 8, dtype=dtype)) == 292
    header = np.zeros(256, dtype="<i4")
    header[:3] = (20240801, 1, 10)  # llama magic with GPT-2's version: neither layout
    (tmp_path / "odd.bin").write_bytes(header.tobytes() + b"\0" * 40)
    with pytest.raises(ValueError, match="magic 20240801 with version 1"):
        TokenWindows(tmp_path / "odd.bin", 4)


def test_foreign_formats_are_named_not_read_as_tokens(tmp_path):
    litdata = tmp_path / "lit"
    litdata.mkdir()
    (litdata / "chunk-0-0.bin").write_bytes(np.arange(40, dtype=np.uint32).tobytes())
    (litdata / "index.json").write_text('{"chunks": [], "config": {}}')
    with pytest.raises(ValueError, match="litdata chunk"):
        TokenWindows(litdata / "chunk-0-0.bin", 4, dtype="uint16")
    # Megatron's .bin/.idx pair: the .idx magic, version 1, dtype code 8 (uint16); .bin is flat.
    mega = tmp_path / "mega"
    mega.mkdir()
    tokens = np.arange(500, 600, dtype=np.uint16)
    tokens.tofile(mega / "corpus_text_document.bin")
    np.array([0, 40], dtype="<u8").tofile(mega / "starts")  # two documents: 40 and 60 tokens
    with open(mega / "corpus_text_document.idx", "wb") as f:
        write_megatron_index(f.write, mega / "starts", 2, len(tokens), np.dtype("uint16"))
    ds = TokenWindows(mega / "corpus_text_document.bin", 10)
    assert ds.dtype == np.uint16 and ds[3][0].tolist() == tokens[3:13].tolist()
    with pytest.raises(ValueError, match="holds uint16 tokens, not the dtype=int32"):
        TokenWindows(mega / "corpus_text_document.bin", 10, dtype="int32")


def test_folders_never_mix_splits_and_globs_select(tmp_path, prepared):
    folder = tmp_path / "fineweb10B"
    folder.mkdir()
    shard_file(folder / "fineweb_val_000000.bin", np.full(50, 7))
    for k in (1, 2):
        shard_file(folder / f"fineweb_train_{k:06d}.bin", np.arange(k * 100, k * 100 + 40))
    with pytest.raises(ValueError, match=r"several splits \(train, val\).*fineweb_train_\*.bin"):
        TokenWindows(folder, 8)
    by_glob = TokenWindows(str(folder / "fineweb_train_*.bin"), 8)
    by_split = TokenWindows(folder, 8, split="train")
    assert [p.name for p in by_glob.paths] == [p.name for p in by_split.paths] == [
        "fineweb_train_000001.bin", "fineweb_train_000002.bin"]
    assert 7 not in by_split.__getitems__(list(range(len(by_split)))).x
    assert TokenWindows(folder, 8, split="val").paths == [folder / "fineweb_val_000000.bin"]
    with pytest.raises(FileNotFoundError, match="matches no file"):
        TokenWindows(str(folder / "fineweb_test_*.bin"), 8)
    # A tokpack folder: split= picks the file meta.json names; without it, refused.
    assert TokenWindows(prepared, 8, split="val").paths == [prepared / "val.bin"]
    with pytest.raises(ValueError, match="prepared folder with splits train, val; pass split="):
        TokenWindows(prepared, 8)


@pytest.mark.parametrize("stride", [None, 10, 6])
def test_compact_batches_widen_to_the_same_windows_in_any_process(tmp_path, stride):
    from tokpack.data.loader import build_loader

    folder = tmp_path / "shards"
    folder.mkdir()
    for k, n in enumerate((50, 9, 70)):
        shard_file(folder / f"web_train_{k:06d}.bin", np.arange(k * 1000, k * 1000 + n))
    ds = TokenWindows(folder, block_size=10, stride=stride)
    everything = list(range(len(ds)))
    wide = ds.__getitems__(everything)
    ds.compact = True
    compact = ds.__getitems__(everything)
    assert compact.tokens.dtype == np.uint16 and compact.tokens.shape == (len(ds), 11)
    assert all(torch.equal(a, b) for a, b in zip(compact.to("cpu").widen(), wide))  # the device path
    assert all(torch.equal(a, b) and a.is_contiguous() for a, b in zip(compact.widen(), wide))
    ds.compact = False
    kwargs = {"num_samples": 40} if stride is None else {}
    in_process = [b for b in build_loader(ds, 4, 3, **kwargs)]
    workers = [b for b in build_loader(ds, 4, 3, num_workers=2, **kwargs)]
    assert len(workers) == len(in_process) and all(
        torch.equal(a.x, b.x) and torch.equal(a.y, b.y) for a, b in zip(in_process, workers))


def test_a_megatron_bin_longer_than_its_index_declares_is_refused(tmp_path):
    from helpers import make_docs, write_docs
    from tokpack.prepare import PrepareConfig, prepare

    prepare(PrepareConfig(inputs=(str(write_docs(tmp_path / "c", make_docs(20))),), out_dir=str(tmp_path / "p"),
                          format="megatron", quiet=True))
    pair = tmp_path / "megatron"
    pair.mkdir()
    for suffix in (".bin", ".idx"):  # the pair alone, as Megatron's preprocessing leaves it
        (pair / f"web{suffix}").write_bytes((tmp_path / "p" / f"train_text_document{suffix}").read_bytes())
    n = len(TokenWindows(pair / "web.bin", 8)) + 8
    with open(pair / "web.bin", "ab") as f:
        f.write(np.arange(100, dtype=np.uint16).tobytes())  # a tail no document of the index holds
    with pytest.raises(ValueError, match=r"web.idx does not describe the \d+ tokens of its .bin"):
        TokenWindows(pair / "web.bin", 8)
    assert n > 8


def test_the_trained_windows_are_those_that_score_a_trained_target_on_any_masks():
    """Against every window checked one by one, on masks of any density over several files, read
    in chunks of any size (a run of trained tokens may cross a chunk's edge)."""
    rng = np.random.default_rng(5)
    for _ in range(400):
        masks = [(rng.random(rng.integers(0, 30)) < rng.choice([0.05, 0.3, 0.9])).astype(np.uint8)
                 for _ in range(rng.integers(1, 4))]
        if rng.random() < 0.3:
            masks[0] = np.concatenate([[1, 0], masks[0]]).astype(np.uint8)  # a trained position 0: no target
        T = int(rng.integers(1, 7))
        stride = None if rng.random() < 0.5 else int(rng.integers(1, T + 1))
        want, at, counts = [], 0, []
        for mask in masks:
            n = len(mask)
            starts = range(max(n - T, 0)) if stride is None else range(0, max(n - 1, 0), stride)
            for k, s in enumerate(starts):
                later = stride is not None and k > 0
                scored = range(s + 1 + (T - stride if later else 0), min(s + T, n - 1) + 1)
                if mask[list(scored)].any():
                    want.append(at + k)
                if stride is not None and s + T >= n - 1:
                    starts = range(k + 1)
                    break
            counts.append(len(starts))
            at += len(starts)
        lo, hi, ends = _trained_windows(masks, np.array(counts), T, stride, chunk=int(rng.integers(1, 8)))
        assert [w for a, b in zip(lo, hi) for w in range(a, b)] == want and ends[-1] == len(want)
