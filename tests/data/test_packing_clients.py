"""PackedDocuments at nanochat's and modded-nanogpt's own defaults, against faithful miniatures of
their loaders reading the very files they read: nanochat's parquet row groups (written here with
pyarrow), modded-nanogpt's llm.c shards (read by their header rules). Rows and batches must agree
to the token on 1 and 2 ranks, and resume exactly."""

from __future__ import annotations

import collections
import itertools
import random
from pathlib import Path

import numpy as np
import pytest

from helpers import WORDS
from tokpack.data.loader import build_loader
from tokpack.data.layouts import Flat, TrainRows, preset
from tokpack.data.packing import PackedDocuments
from tokpack.prepare import PrepareConfig, prepare
from tokpack.tokenizer import load_encoding

pq = pytest.importorskip("pyarrow.parquet")
pa = pytest.importorskip("pyarrow")

BOS = 50256


def texts(n: int, seed: int, most: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.choice([rng.randint(1, 12), rng.randint(5, most)])))
            + f" t{i}" for i in range(n)]  # none empty: prepare keeps no empty document, nanochat a lone BOS


# -- nanochat: best fit over parquet row groups ------------------------------------------------------

def nanochat_document_batches(files: list[Path], rank: int, world: int, tokenizer_batch_size: int = 128):
    """nanochat's _document_batches: endless epochs over the files in order; in each file the row
    groups rank, rank + world, ...; each row group's texts in batches of tokenizer_batch_size."""
    while True:
        for path in files:
            pf = pq.ParquetFile(path)
            rg_idx = rank
            while rg_idx < pf.num_row_groups:
                batch = pf.read_row_group(rg_idx).column("text").to_pylist()
                for i in range(0, len(batch), tokenizer_batch_size):
                    yield batch[i:i + tokenizer_batch_size]
                rg_idx += world


def nanochat_bestfit_rows(files, B, T, rank, world, buffer_size=1000):
    """nanochat's tokenizing_distributed_data_loader_with_state_bos_bestfit, rows as lists: the
    buffer refilled a tokenizer batch at a time while below buffer_size; the largest document that
    fits (the first among equals), else the shortest cropped to fill the row."""
    enc = load_encoding("gpt2").library
    batches = nanochat_document_batches(files, rank, world)
    doc_buffer: list[list[int]] = []
    row_capacity = T + 1
    while True:
        rows = []
        for _ in range(B):
            row: list[int] = []
            while len(row) < row_capacity:
                while len(doc_buffer) < buffer_size:
                    doc_buffer.extend([BOS] + enc.encode_ordinary(t) for t in next(batches))
                remaining = row_capacity - len(row)
                best_idx, best_len = -1, 0
                for i, doc in enumerate(doc_buffer):
                    if best_len < len(doc) <= remaining:
                        best_idx, best_len = i, len(doc)
                if best_idx >= 0:
                    row += doc_buffer.pop(best_idx)
                else:
                    shortest = min(range(len(doc_buffer)), key=lambda i: len(doc_buffer[i]))
                    row += doc_buffer.pop(shortest)[:remaining]
            rows.append(row)
        yield rows


@pytest.fixture(scope="module")
def parquet_corpus(tmp_path_factory):
    """Three train files and a val file of row groups of uneven size (the last of a file shorter),
    prepared with nanochat's layout: BOS + text, the last file as val."""
    root = tmp_path_factory.mktemp("nanochat")
    corpus = root / "parquet"
    corpus.mkdir()
    sizes = [(700, 300), (650, 256), (900, 400), (120, 50)]
    for k, (rows, group) in enumerate(sizes):
        table = pa.table({"text": texts(rows, seed=k, most=60), "id": list(range(rows))})
        pq.write_table(table, corpus / f"shard_{k:05d}.parquet", row_group_size=group)
    files = sorted(corpus.glob("*.parquet"))
    out = root / "prepared"
    prepare(PrepareConfig(inputs=(str(corpus),), val_inputs=(str(files[-1]),), out_dir=str(out), eot="prepend",
                          quiet=True))
    return out, files


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("buffer_size", [8, 1000])
def test_bestfit_rows_are_nanochats_at_its_defaults(parquet_corpus, world, buffer_size):
    folder, files = parquet_corpus
    B, T, steps = 8, 64, 2400 // 8 // world
    for rank in range(world):
        data = PackedDocuments(folder, T, split="train", rows=preset("nanochat", buffer_size=buffer_size))
        ours = itertools.islice(build_loader(data, B, seed=0, rank=rank, world_size=world), steps)
        theirs = nanochat_bestfit_rows(files[:-1], B, T, rank, world, buffer_size)
        for step, (batch, rows) in enumerate(zip(ours, theirs)):
            rows = np.array(rows)
            assert batch.x.tolist() == rows[:, :-1].tolist() and batch.y.tolist() == rows[:, 1:].tolist(), step


def test_nanochat_order_resumes_exactly_and_keeps_its_rules(parquet_corpus, tmp_path):
    folder, files = parquet_corpus
    data = PackedDocuments(folder, 64, split="train", rows=preset("nanochat", buffer_size=300))
    loader = build_loader(data, 4, seed=0, rank=1, world_size=2)
    it = iter(loader)
    for _ in range(37):
        next(it)
    state = loader.state_dict()
    after = [next(it).x.tolist() for _ in range(5)]
    resumed = build_loader(data, 4, seed=0, rank=1, world_size=2)
    resumed.load_state_dict(state)
    assert [b.x.tolist() for b in itertools.islice(resumed, 5)] == after
    with pytest.raises(ValueError, match="read the documents in stored order"):
        build_loader(data, 4, seed=0, shuffle=True)
    with pytest.raises(ValueError, match="no input file has more than 3"):
        build_loader(data, 4, seed=0, rank=0, world_size=4)
    plain = tmp_path / "plain"  # documents split by hash: no file is whole in a split, so no row groups
    prepare(PrepareConfig(inputs=tuple(map(str, files)), out_dir=str(plain), eot="prepend", quiet=True))
    with pytest.raises(ValueError, match="prepare again with --val-inputs"):
        PackedDocuments(plain, 64, split="train", rows=TrainRows("bestfit", ranks="groups"))


# -- modded-nanogpt: aligned flat batches over llm.c shards -----------------------------------------

def load_data_shard(path: Path) -> np.ndarray:
    """modded-nanogpt's _load_data_shard: magic 20240520, version 1, the claimed count read whole."""
    header = np.fromfile(path, dtype="<i4", count=256)
    assert header[0] == 20240520 and header[1] == 1
    tokens = np.fromfile(path, dtype="<u2", offset=1024)
    assert len(tokens) == header[2]
    return tokens.astype(np.int64)


def next_multiple_of_n(v, n):
    return next(x for x in range(n, int(v) + 1 + n, n) if x >= v)


class Shard:
    """modded-nanogpt's Shard: the BOS positions of one shard and the next batch of every rank."""

    def __init__(self, tokens, world):
        self.tokens, self.size, self.world, self.i = tokens, len(tokens), world, 0
        self.bos_idx = np.flatnonzero(tokens == BOS)

    def next_batch(self, num_tokens_local, max_seq_len):
        n = len(self.bos_idx)
        starts, ends = [[] for _ in range(self.world)], [[] for _ in range(self.world)]
        idx = self.i
        for r in range(self.world):
            cur_len = 0
            while cur_len <= num_tokens_local:
                if idx >= n:
                    raise StopIteration("Insufficient BOS ahead; hit tail of shard.")
                cur = self.bos_idx[idx]
                starts[r].append(cur)
                idx += 1
                end = min(self.bos_idx[idx] if idx < n else self.size, cur + max_seq_len,
                          cur + num_tokens_local - cur_len + 1)
                ends[r].append(end)
                cur_len += end - cur
        self.i = idx
        return starts, ends


def modded_batches(files, num_tokens, max_seq_len, rank, world):
    """modded-nanogpt's distributed_data_generator (align_to_bos): files in order, two loaded ahead;
    a shard's batch that hits its tail is dropped and the next shard starts; ends with the files."""
    file_iter = iter(sorted(files))
    shard = Shard(load_data_shard(next(file_iter)), world)
    upcoming = Shard(load_data_shard(next(file_iter)), world)  # it needs two train shards
    num_tokens_local = num_tokens // world
    max_num_docs = next_multiple_of_n(num_tokens_local // 300, 128)
    while True:
        try:
            seq_starts, seq_ends = shard.next_batch(num_tokens_local, max_seq_len)
        except StopIteration:
            if upcoming is None:
                return
            shard = upcoming
            path = next(file_iter, None)
            upcoming = None if path is None else Shard(load_data_shard(path), world)
            continue
        start_idxs, end_idxs = np.array(seq_starts[rank]), np.array(seq_ends[rank])
        buf = np.concatenate([shard.tokens[i:j] for i, j in zip(start_idxs, end_idxs)])
        end_idxs[-1] -= 1
        cum = np.cumsum(end_idxs - start_idxs)
        padded = np.full(max_num_docs, num_tokens_local)
        padded[0] = 0
        padded[1:len(cum) + 1] = cum
        yield buf[:-1], buf[1:], padded


@pytest.fixture(scope="module", params=["document", "token"])
def llmc_corpus(tmp_path_factory, request):
    root = tmp_path_factory.mktemp(f"modded-{request.param}")
    corpus = root / "corpus"
    corpus.mkdir()
    for i, text in enumerate(texts(260, seed=9, most=150)):
        (corpus / f"d{i:04d}.txt").write_text(text, "utf-8")
    out = root / "fineweb10B"
    prepare(PrepareConfig(inputs=(str(corpus),), out_dir=str(out), format="llmc", shard_tokens=3000,
                          shard_boundary=request.param, quiet=True))
    return out


@pytest.mark.parametrize("world", [1, 2])
def test_aligned_batches_are_modded_nanogpts_at_its_defaults(llmc_corpus, world):
    N, max_seq_len = 128, 96  # per rank
    files = sorted(llmc_corpus.glob("*_train_*.bin"))
    assert len(files) >= 3
    max_docs = next_multiple_of_n(N // 300, 128) - 1
    for rank in range(world):
        theirs = list(modded_batches(files, N * world, max_seq_len, rank, world))
        data = PackedDocuments(llmc_corpus, N, split="train", rows=preset("modded", max_doc_len=max_seq_len),
                               form=Flat(max_docs))
        loader = build_loader(data, 1, seed=0, rank=rank, world_size=world)
        ours = list(itertools.islice(loader, len(theirs)))
        assert len(theirs) > 20
        for step, (batch, (x, y, cum)) in enumerate(zip(ours, theirs)):
            assert batch.x[0].tolist() == x.tolist() and batch.y[0].tolist() == y.tolist(), step
            assert batch.cu_seqlens.tolist() == cum.tolist(), step
        k = len(theirs) // 2
        first = build_loader(data, 1, seed=0, rank=rank, world_size=world)
        collections.deque(itertools.islice(first, k), maxlen=0)
        resumed = build_loader(data, 1, seed=0, rank=rank, world_size=world)
        resumed.load_state_dict(first.state_dict())
        assert [b.x[0].tolist() for b in itertools.islice(resumed, 5)] == [x.tolist() for x, _, _ in theirs[k:k + 5]]
