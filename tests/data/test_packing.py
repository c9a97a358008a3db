"""PackedDocuments against each client's own rule, written as a miniature: modded-nanogpt's
BOS-aligned flat batches, nanochat's best fit (the bench's peer, ``tokpack.bench.packing``),
Hugging Face's flattening collator, and scoring each document alone."""

from __future__ import annotations

import itertools
import json
import re
import warnings

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from helpers import make_docs, megatron_indexed, prepare_docs
from tokpack.bench.packing import nanochat_bestfit
from tokpack.check import resumed, take
from tokpack.data.loader import build_loader
from tokpack.data.packers import Order
from tokpack.data.layouts import HF, PRESETS, EvalRows, Flat, Rows, TrainRows, preset
from tokpack.data.packing import PackedDocuments
from tokpack.data.windows import TokenWindows
from tokpack.evaluation import evaluate
from tokpack.models import GPT, GPTConfig
from tokpack.split import open_split, read_index

EOT = 50256


@pytest.fixture(scope="module")
def prepended(tmp_path_factory):
    """Documents led by <|endoftext|>, as llm.c and modded-nanogpt store them."""
    return prepare_docs(tmp_path_factory.mktemp("prepend"), make_docs(120, seed=3, words=90), eot="prepend",
                        val_fraction=0.2)


@pytest.fixture(scope="module")
def few(tmp_path_factory):
    """A handful of short documents, each ended by <|endoftext|> (--eot append): cheap to score one by one."""
    return prepare_docs(tmp_path_factory.mktemp("few"), make_docs(16, seed=5, words=45), val_fraction=0.5)


def stored(folder, split="train"):
    return np.concatenate([np.asarray(t) for t in open_split(folder, split).open()]).astype(np.int64)


# -- modded-nanogpt: BOS-aligned flat batches ---------------------------------------------------

def modded_batches(tokens, num_tokens, max_seq_len, max_num_docs):
    """modded-nanogpt's distributed_data_generator on one rank, as a miniature: from each BOS in
    order, a document cut at the next BOS, at max_seq_len and at the batch's N + 1 tokens; the next
    batch starts at the next BOS; cum_lengths padded with N to max_num_docs."""
    bos_idx = np.flatnonzero(tokens == EOT)
    i = 0
    while True:
        starts, ends, cur_len = [], [], 0
        while cur_len <= num_tokens:
            if i >= len(bos_idx):
                return
            cur = bos_idx[i]
            starts.append(cur)
            i += 1
            end = min(bos_idx[i] if i < len(bos_idx) else len(tokens), cur + max_seq_len, cur + num_tokens - cur_len + 1)
            ends.append(end)
            cur_len += end - cur
        buf = np.concatenate([tokens[s:e] for s, e in zip(starts, ends)])
        ends[-1] -= 1
        cum = np.cumsum(np.array(ends) - np.array(starts))
        padded = np.full(max_num_docs, num_tokens)
        padded[0] = 0
        padded[1:len(cum) + 1] = cum
        yield buf[:-1], buf[1:], padded


def test_flat_aligned_batches_are_modded_nanogpts(prepended):
    N, max_seq_len, max_docs = 96, 40, 12
    data = PackedDocuments(prepended, N, split="train", rows=TrainRows("aligned", max_doc_len=max_seq_len),
                           form=Flat(max_docs - 1))
    assert not data.insert_bos  # --eot prepend: every document already starts with BOS
    ours = take_batches(build_loader(data, 1, seed=0, shuffle=False), 30)
    theirs = list(itertools.islice(modded_batches(stored(prepended), N, max_seq_len, max_docs), 30))
    assert len(theirs) == 30
    starts = set(read_index(open_split(prepended, "train")).tolist())
    for batch, (x, y, cum) in zip(ours, theirs):
        assert batch.x.shape == (1, N)
        assert batch.x[0].tolist() == x.tolist() and batch.y[0].tolist() == y.tolist()
        assert batch.cu_seqlens.tolist() == cum.tolist()
        bounds = batch.cu_seqlens[batch.cu_seqlens < N].long()
        assert batch.x[0, 0] == EOT and (batch.x[0, bounds] == EOT).all()
        assert batch.max_seqlen == int(np.diff(cum).max()) <= max_seq_len
    # Each row's documents start where the index says documents start.
    first = [row[0][0] for row in itertools.islice(data.rows(), 30)]
    assert {int(data.index.starts[d]) for d in first} <= starts


def take_batches(loader, n):
    return list(itertools.islice(iter(loader), n))


# -- nanochat: best fit ---------------------------------------------------------------------------

@pytest.mark.parametrize("buffer_size", [1, 8, 64])
def test_bestfit_rows_are_nanochats_with_no_padding(prepared, buffer_size):
    T, rows = 48, 40
    data = PackedDocuments(prepared, T, split="train", rows=TrainRows("bestfit", buffer_size=buffer_size))
    assert data.insert_bos  # --eot append: the dataset leads each document with the BOS
    tokens = stored(prepared)
    bounds = list(zip(data.index.starts.tolist(), data.index.ends.tolist()))
    docs = [[EOT, *tokens[s:e].tolist()] for s, e in bounds]  # as nanochat's tokenizer hands them over
    counts = {}
    theirs = list(itertools.islice(nanochat_bestfit(docs, 4, T, buffer_size, counts), rows // 4))
    batches = take_batches(build_loader(data, 4, seed=0, shuffle=False), rows // 4)
    for ours, (x, y) in zip(batches, theirs, strict=True):
        assert torch.equal(ours.x, x) and torch.equal(ours.y, y)
    stats = data.stats(rows, shuffle=False)
    assert stats["utilisation"] == 1.0 and stats["cropped"] == pytest.approx(counts["cropped"] / counts["placed"])
    assert all((b.x[:, 0] == EOT).all() for b in batches)


def test_bestfit_pad_padding_is_never_a_target_on_a_text_split(shared_prepared):
    # A split without a loss mask: only the rows' padding segments can hide their targets.
    T = 300  # a document or two a row, and often room that none fits
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a document longer than a row is cropped, and said so
        data = PackedDocuments(shared_prepared, T, split="train", rows=TrainRows("bestfit-pad", buffer_size=4))
    rows = list(itertools.islice(data.rows(), 40))
    batch = data.gather(rows).widen()
    padded = 0
    for r, row in enumerate(rows):
        col = sum(n for unit, _, n, _ in row if unit >= 0)
        assert all(unit < 0 for unit, *_ in row[len(row) - (col <= T):])  # padding comes last, if at all
        padded += col <= T
        assert (batch.y[r, col:] == -100).all() and (batch.y[r, :col] != -100).all()
    assert padded > 0


def test_aligned_rows_start_at_documents_and_state_what_they_drop(prepared):
    T = 32
    data = PackedDocuments(prepared, T, split="train", rows="aligned")
    lengths = (data.index.ends - data.index.starts + 1).tolist()  # with the inserted BOS
    rows = list(itertools.islice(data.rows(), 50))
    # The rule: documents in order (epoch after epoch), each cut to T + 1; the one reaching the
    # row's end is cut there.
    expected, row, room = [], [], T + 1
    for doc, n in itertools.islice(itertools.cycle(enumerate(lengths)), 10**4):
        take = min(n, T + 1, room)
        row.append((doc, 0, take, 0))
        room -= take
        if room == 0:
            expected.append(tuple(row))
            row, room = [], T + 1
    assert rows == expected[:50]
    dropped = sum(lengths[d] - n for r in rows for d, _, n, _ in r)
    assert data.stats(50, shuffle=False)["cropped"] == pytest.approx(dropped / sum(lengths[d] for r in rows for d, *_ in r))


# -- the batch's document structure ---------------------------------------------------------------

def test_position_ids_cu_seqlens_and_the_boundary_mask_follow_the_documents(prepared):
    T = 40
    plain = PackedDocuments(prepared, T, split="train", rows=TrainRows("bestfit", buffer_size=16))
    masked = PackedDocuments(prepared, T, split="train",
                             rows=TrainRows("bestfit", buffer_size=16, mask_boundary=True))
    rows = list(itertools.islice(plain.rows(), 6))
    a, b = plain.__getitems__(rows), masked.__getitems__(rows)
    assert torch.equal(a.x, b.x) and torch.equal(a.position_ids, b.position_ids)
    flat_x, flat_pos, flat_y, flat_masked = a.x.reshape(-1), a.position_ids.reshape(-1), a.y.reshape(-1), b.y.reshape(-1)
    cu = a.cu_seqlens.tolist()
    assert cu[0] == 0 and cu[-1] == 6 * T and a.cu_seqlens.dtype == torch.int32
    assert set(range(0, 6 * T, T)) <= set(cu)  # every row starts a segment
    for s, e in zip(cu[:-1], cu[1:]):
        assert flat_pos[s:e].tolist() == list(range(e - s))
        assert flat_x[s] == EOT
        # Only the last target of a segment may lie across a boundary (its row goes on): masked then.
        if e % T:
            assert flat_masked[e - 1] == -100 and flat_y[e - 1] == flat_x[e] == EOT
        assert (flat_masked[s:e - 1] == flat_y[s:e - 1]).all() and (flat_y[s:e - 1] != -100).all()
    assert a.max_seqlen == max(e - s for s, e in zip(cu[:-1], cu[1:]))


class HFStyleLM(torch.nn.Module):
    """A Hugging Face causal LM's contract in miniature: forward(input_ids, position_ids, labels)
    shifts the labels itself, and, given one flattened row, finds the packed sequences where
    position_ids restart at 0 (as its flash-attention path does)."""

    def __init__(self, gpt):
        super().__init__()
        self.gpt = gpt

    def forward(self, input_ids, position_ids, labels):
        flat = position_ids.reshape(-1)
        starts = torch.cat([torch.nonzero(flat == 0)[:, 0], torch.tensor([flat.numel()])]).to(torch.int32)
        logits = self.gpt(input_ids, position_ids, starts)
        return F.cross_entropy(logits[0, :-1].double(), labels[0, 1:], ignore_index=-100, reduction="sum")


def test_the_hf_form_trains_an_hf_style_model_on_each_document_alone(prepared):
    T = 32
    gpt = GPT(GPTConfig(vocab_size=50304, block_size=2 * T, n_layer=1, n_head=2, n_embd=16)).double()
    hf = PackedDocuments(prepared, T, split="train", rows=TrainRows("bestfit", buffer_size=8), form="hf")
    rows = PackedDocuments(prepared, T, split="train", rows=TrainRows("bestfit", buffer_size=8, mask_boundary=True))
    batch = next(iter(build_loader(hf, 3, seed=0)))
    assert set(batch) == {"input_ids", "labels", "position_ids"} and batch["input_ids"].shape == (1, 3 * T)
    reference = next(iter(build_loader(rows, 3, seed=0)))
    assert torch.equal(batch["input_ids"][0], reference.x.reshape(-1))
    starts = reference.cu_seqlens[:-1].long()
    assert (batch["labels"][0, starts] == -100).all() and (batch["position_ids"][0, starts] == 0).all()
    with torch.no_grad():
        loss = HFStyleLM(gpt)(**batch)
        alone = 0.0
        x = reference.x.reshape(-1)
        cu = reference.cu_seqlens.tolist()
        for s, e in zip(cu[:-1], cu[1:]):
            logits = gpt(x[s:e][None])[0]
            alone += F.cross_entropy(logits[:-1], x[s + 1:e], reduction="sum").item()
    assert loss.item() == pytest.approx(alone, rel=1e-9)


def test_the_hf_form_is_the_real_flattening_collators_batch_with_its_optional_keys(prepared):
    transformers = pytest.importorskip("transformers")
    collator = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True,
                                                       return_tensors="pt")
    T = 32
    asked = PackedDocuments(prepared, T, split="train", rows=TrainRows("bestfit", buffer_size=8),
                            form=HF(flash_attn_kwargs=True, seq_idx=True))
    rows = PackedDocuments(prepared, T, split="train", rows=TrainRows("bestfit", buffer_size=8))
    batch = next(iter(build_loader(asked, 3, seed=0, num_workers=0)))
    reference = next(iter(build_loader(rows, 3, seed=0)))
    x, cu = reference.x.reshape(-1).tolist(), reference.cu_seqlens.tolist()
    expected = collator([{"input_ids": x[s:e]} for s, e in zip(cu[:-1], cu[1:])])
    assert set(batch) == set(expected)
    for key, value in expected.items():
        if isinstance(value, int):
            assert type(batch[key]) is int and batch[key] == value, key
        else:
            assert batch[key].dtype == value.dtype and torch.equal(batch[key], value), key
    with pytest.raises(ValueError, match="pass form='hf'"), pytest.warns(DeprecationWarning):
        PackedDocuments(prepared, T, split="train", return_seq_idx=True)  # 0.2's keywords; HF() alone takes it now


# -- exact per-document evaluation ------------------------------------------------------------------

def test_packed_masked_evaluation_equals_each_document_scored_alone(few):
    T = 12
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50304, block_size=T, n_layer=1, n_head=2, n_embd=16), seed=1).double()
    tokens = stored(few, "val")
    split = open_split(few, "val")
    starts = read_index(split).tolist()
    docs = [[EOT, *tokens[s:e].tolist()] for s, e in zip(starts, [*starts[1:], len(tokens)])]
    assert max(map(len, docs)) > 3 * T  # documents longer than a row are scored as sliding windows
    for S in (T, 5):
        # Each document alone: windows of T + 1 at stride S, targets scored once (TokenWindows' rule);
        # windows of one length go through the model together.
        total, count = 0.0, 0
        with torch.no_grad():
            for doc in docs:
                d = torch.tensor(doc)
                starts = list(range(0, max(len(doc) - T - 1, 0) + S, S)) if len(doc) > T + 1 else [0]
                starts = [s for s in starts if s == 0 or s + T - S + 1 < len(doc)]
                for group in ([s for s in starts if s + T + 1 <= len(doc)], [s for s in starts if s + T + 1 > len(doc)]):
                    if not group:
                        continue
                    pieces = torch.stack([d[s:s + min(T + 1, len(doc) - s)] for s in group])
                    losses = F.cross_entropy(model(pieces[:, :-1]).transpose(1, 2), pieces[:, 1:], reduction="none")
                    for row, s in enumerate(group):
                        skip = 0 if s == 0 else T - S
                        total += losses[row, skip:].sum().item()
                        count += losses.shape[1] - skip
        data = PackedDocuments(few, T, split="val", rows=EvalRows(S))
        one = evaluate(model, build_loader(data, 3), "cpu")
        assert one["tokens"] == count == sum(len(d) - 1 for d in docs)
        assert one["loss"] * one["tokens"] == pytest.approx(total, rel=1e-9)
        for world in (2, 3):
            shares = [evaluate(model, build_loader(data, 3, rank=r, world_size=world), "cpu") for r in range(world)]
            assert sum(s["tokens"] for s in shares) == count
            assert sum(s["loss"] * s["tokens"] for s in shares) == pytest.approx(total, rel=1e-9)
        stats = data.stats(10**6)
        assert stats["cropped"] == 0 and stats["utilisation"] < 1.0  # evaluation rows are padded, never cropped


def test_a_document_starting_at_a_rows_last_token_is_in_y_only(shared_prepared):
    # T = 8: the first document fills x, the second's first token is the row's last, a target only.
    data = PackedDocuments(shared_prepared, 8, split="train", rows=TrainRows("bestfit", buffer_size=4))
    batch = data.gather([((0, 0, 8, 0), (1, 0, 1, 0))]).widen()
    assert batch.cu_seqlens.tolist() == [0, 8] and batch.max_seqlen == 8  # no empty segment
    assert batch.position_ids.tolist() == [list(range(8))]
    assert batch.y[0, -1].item() == batch.x[0, 0].item()  # the second document's BOS, predicted


def test_evaluation_rows_fill_exactly_and_end_at_a_documents_end():
    from tokpack.data.packers import evaluation_rows

    # Rows of 5 tokens, stride 3: a document of exactly 5 fills a row, 2 + 3 fill the next with no
    # padding, and a document of 8 is two windows, the second reaching its end (its first target an
    # earlier window scored) and none after it.
    rows = list(evaluation_rows(iter([(0, 5), (1, 2), (2, 3), (3, 8)]), 5, 3))
    assert rows == [((0, 0, 5, 0),), ((1, 0, 2, 0), (2, 0, 3, 0)), ((3, 0, 5, 0),), ((3, 3, 5, 1),)]
    # Each document's targets scored once: a segment scores its tokens after the first, those it skips aside.
    scored = sorted((doc, t) for row in rows for doc, start, take, skip in row for t in range(start + skip + 1,
                                                                                              start + take))
    assert scored == [(doc, t) for doc, n in enumerate([5, 2, 3, 8]) for t in range(1, n)]


def test_a_model_without_position_ids_is_refused_on_packed_rows(prepared):
    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(50304, 8)

        def forward(self, x):
            return self.emb(x)

    data = PackedDocuments(prepared, 16, split="val", rows=EvalRows(16))
    with pytest.raises(ValueError, match="takes no position_ids and cu_seqlens"):
        evaluate(Plain(), build_loader(data, 2), "cpu")


# -- samplers, workers, ranks and resume ------------------------------------------------------------

@pytest.mark.parametrize("workers", [0, 2])
def test_resume_at_random_batches_gives_the_uninterrupted_batches(prepared, workers):
    data = PackedDocuments(prepared, 32, split="train", rows=TrainRows("bestfit", buffer_size=16))
    build = lambda: build_loader(data, 4, seed=7, num_workers=workers)  # noqa: E731
    fresh = take(build(), 12)
    rng = np.random.default_rng(workers)
    for at in rng.integers(1, 12, size=2).tolist():
        assert resumed(build, 12, at) == fresh
    assert len(set(fresh)) == 12


def test_training_rows_are_a_function_of_the_seed_and_rank_shares_are_disjoint(prepared):
    data = PackedDocuments(prepared, 32, split="train", rows="aligned")
    n = len(data)

    def one_epoch(seed, rank=0, world=1):
        batches = Order().batches(data.lengths, (seed, rank, world, True))
        return [d for [(d, _)] in itertools.islice(batches, n // world)]

    assert sorted(one_epoch(1)) == list(range(n)) and one_epoch(1) != one_epoch(2) and one_epoch(1) == one_epoch(1)
    shares = [set(one_epoch(1, r, 2)) for r in range(2)]
    assert not shares[0] & shares[1] and len(shares[0]) == len(shares[1]) == n // 2
    a = take(build_loader(data, 2, seed=1, rank=0, world_size=2), 3)
    b = take(build_loader(data, 2, seed=1, rank=1, world_size=2), 3)
    assert not set(a) & set(b)


def test_a_state_taken_under_another_packing_is_refused(prepared):
    a = build_loader(PackedDocuments(prepared, 32, split="train", rows="aligned"), 2, seed=0)
    b = build_loader(PackedDocuments(prepared, 32, split="train", rows="bestfit"), 2, seed=0)
    take(a, 2)
    with pytest.raises(ValueError, match="packing"):
        b.load_state_dict(a.state_dict())


# -- hostile and foreign input -----------------------------------------------------------------------

def test_forged_rows_and_settings_are_refused_in_one_line(prepared):
    data = PackedDocuments(prepared, 16, split="train")
    for rows in ([((0, 0, 5, 0),)], [((10**6, 0, 17, 0),)], [((0, 10**6, 17, 0),)], [((0, 0, 17, 0), (1, 0, 17, 0))]):
        with pytest.raises(ValueError, match="packed rows must be"):
            data.__getitems__(rows)
    for kwargs, fragment in (({"rows": "greedy"}, "not one of aligned, bestfit"), ({"form": "2d"}, "not one of rows"),
                             ({"rows": EvalRows(17)}, "must lie in 1..block_size")):
        with pytest.raises(ValueError, match=fragment):
            PackedDocuments(prepared, 16, split="train", **kwargs)
    for label in (0, 5, 50256):  # a token id's value: its real targets would be ignored
        with pytest.raises(ValueError, match=f"ignore_index={label} could be a token's id"):
            PackedDocuments(prepared, 16, split="train", ignore_index=label)
        with pytest.raises(ValueError, match=f"ignore_index={label} could be a token's id"):
            TokenWindows(prepared, 16, split="train", ignore_index=label)
    for option in ("buffer_size", "refill"):  # an int to Python, never a count here
        with pytest.raises(TypeError, match=f"{option}=True is not an int"):
            PackedDocuments(prepared, 16, split="train", rows=TrainRows("bestfit", **{option: True}))
    with pytest.raises(TypeError, match="block_size=True is not an int"):
        TokenWindows(prepared, True, split="train")
    with pytest.raises(ValueError, match="form='flat'"), pytest.warns(DeprecationWarning):
        PackedDocuments(prepared, 16, split="train", max_docs=4)  # 0.2's keywords: only Flat() takes it now
    crowded = PackedDocuments(prepared, 64, split="train", rows="bestfit", form=Flat(1))
    with pytest.raises(ValueError, match="more than max_docs=1"):
        next(iter(build_loader(crowded, 1, seed=0)))


def test_foreign_folders_without_meta_need_the_bos_named(prepared, tmp_path):
    import shutil

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("train.bin", "train.idx"):
        shutil.copy(prepared / name, bare / name)
    split = open_split(bare / "train.bin", dtype="uint16")
    with pytest.raises(ValueError, match="pass bos_id="):
        PackedDocuments(split, 16)
    data = PackedDocuments(split, 16, bos_id=EOT)
    assert data.insert_bos and next(iter(build_loader(data, 2, seed=0))).x.shape == (2, 16)


def test_split_long_serves_long_documents_as_bos_led_pieces_that_tile_them(prepared):
    T = 24
    data = PackedDocuments(prepared, T, split="train", rows=TrainRows("bestfit", buffer_size=32, split_long=True))
    assert len(data) > len(data.index) and data.lengths.max() == T + 1
    tokens = stored(prepared)
    # The pieces, in order, are the stored tokens, each exactly once.
    pieces = [tokens[s:s + n - b] for s, n, b in zip(data.unit_starts, data.lengths, data.unit_bos)]
    assert np.concatenate(pieces).tolist() == tokens.tolist()
    rows = list(itertools.islice(data.rows(0, 0, 1, True), 40))
    batch = data.__getitems__(rows)
    x = torch.cat([batch.x, batch.y[:, -1:]], 1)
    cropped = 0
    for r, row in enumerate(rows):
        pos = 0
        for unit, offset, n, _ in row:
            assert offset == 0 and x[r, pos] == EOT  # each piece led by its BOS
            assert x[r, pos + 1:pos + n].tolist() == pieces[unit][:n - 1].tolist()
            cropped += int(data.lengths[unit]) - n
            pos += n
    assert cropped / sum(int(data.lengths[u]) for row in rows for u, *_ in row) < 0.05


def test_llmc_shards_and_megatron_datasets_pack_by_their_own_documents(tmp_path):
    IndexedDatasetBuilder = megatron_indexed().IndexedDatasetBuilder

    from helpers import shard_file

    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 50000, int(n)).tolist() for n in rng.integers(2, 30, 40)]
    # llm.c's writers lead every document with <|endoftext|>; no .idx: it is found by that token.
    folder = tmp_path / "fineweb"
    folder.mkdir()
    stream = [t for d in docs for t in (EOT, *d)]
    shard_file(folder / "fineweb_train_000001.bin", np.array(stream[:300]))
    shard_file(folder / "fineweb_train_000002.bin", np.array(stream[300:]))  # a document runs across
    # Megatron's builder: documents as they are, no BOS: the dataset inserts it.
    builder = IndexedDatasetBuilder(str(tmp_path / "web_text_document.bin"), dtype=np.uint16)
    for doc in docs:
        builder.add_document(np.array(doc, dtype=np.uint16), [len(doc)])
    builder.finalize(str(tmp_path / "web_text_document.idx"))
    for data in (PackedDocuments(folder, 16, split="train", rows="aligned"),
                 PackedDocuments(tmp_path / "web_text_document.bin", 16, rows="aligned", bos_id=EOT)):
        assert len(data.index) == len(docs)
        batch = next(iter(build_loader(data, 6, seed=0, shuffle=False)))
        x = torch.cat([batch.x, batch.y[:, -1:]], 1)
        for r, row in enumerate(itertools.islice(data.rows(), 6)):
            pos = 0
            for doc, _, n, _ in row:
                assert x[r, pos:pos + n].tolist() == [EOT, *docs[doc]][:n]
                pos += n


# -- parameters and states from outside ---------------------------------------------------------------

@pytest.mark.parametrize("make,fragment", [  # a combination that means nothing cannot be written
    (lambda: TrainRows("packed"), "packing 'packed' is not one of aligned, bestfit"),
    (lambda: TrainRows(buffer_size=2.5), "buffer_size=2.5 is not an int"),
    (lambda: TrainRows(buffer_size=0), "buffer_size 0 must be at least 1"),
    (lambda: TrainRows(max_doc_len=0), "max_doc_len 0 must be at least 1"),
    (lambda: TrainRows(ranks="nodes"), "ranks 'nodes' is not one of documents, rows, groups"),
    (lambda: TrainRows(shard_end="skip"), "shard_end 'skip' is not one of continue, drop"),
    (lambda: TrainRows("bestfit", refill=0), "refill 0 must be at least 1"),
    (lambda: TrainRows("bestfit", refill=1.5), "refill=1.5 is not an int"),
    (lambda: TrainRows(refill=128), "packing='aligned' has no buffer: drop it"),
    (lambda: TrainRows("bestfit", shard_end="drop"), "shard_end='drop' is modded-nanogpt's rule"),
    (lambda: TrainRows(ranks="groups", split_long=True), "split_long cuts them into pieces"),
    (lambda: EvalRows(0), "stride 0 must be at least 1"),
    (lambda: Flat(max_docs=0), "max_docs 0 must be at least 1"),
    (lambda: Flat(max_docs=-1), "max_docs -1 must be at least 1"),
    (lambda: preset("torchtitan"), "preset 'torchtitan' is not one of nanochat, modded, hf"),
])
def test_every_setting_is_checked_where_it_is_made(make, fragment):
    with pytest.raises((ValueError, TypeError), match=fragment):
        make()


@pytest.mark.parametrize("kwargs,fragment", [  # what needs the data: checked at construction
    ({"rows": TrainRows("bestfit", buffer_size=10**9)}, "buffer_size 1,000,000,000 is more than the"),
    ({"rows": TrainRows("bestfit", refill=2**70)}, "refill 1,180,591,620,717,411,303,424 is more than the"),
    ({"block_size": 10**9}, "block_size 1000000000 needs rows of"),
    ({"block_size": 10**7}, "block_size 10000000 needs rows of"),
    ({"block_size": 0}, "block_size 0 must be at least 1"),
    ({"rows": EvalRows(17)}, "stride 17 must lie in 1..block_size"),
    ({"bos_id": -1}, "bos_id -1 is not a token id"),
    ({"bos_id": 70000}, "bos_id 70000 is not a token id"),
    ({"bos_id": 2**40}, "is not a token id"),
    ({"bos_id": 1.5}, "bos_id=1.5 is not an int"),
    ({"rows": "packed"}, "rows 'packed' is not one of aligned, bestfit"),
    ({"rows": 3}, "is not TrainRows, EvalRows, a packing or a preset"),
    ({"form": "table"}, "form 'table' is not one of rows, flat, hf"),
    ({"form": TrainRows()}, "is not Rows(), Flat(), HF(), MegatronSFT() or one of their names"),
])
def test_every_parameter_is_checked_at_construction(prepared, kwargs, fragment):
    kwargs = {"block_size": 16, **kwargs}
    with pytest.raises((ValueError, TypeError), match=re.escape(fragment)):
        PackedDocuments(prepared, kwargs.pop("block_size"), split="train", **kwargs)


@pytest.mark.parametrize("old,new", [
    ({"packing": "bestfit", "buffer_size": 16, "mask_boundary": True},
     {"rows": TrainRows("bestfit", buffer_size=16, mask_boundary=True)}),
    ({"stride": 8}, {"rows": EvalRows(8)}),
    ({"packing": "bestfit", "form": "flat", "max_docs": 40}, {"rows": "bestfit", "form": Flat(40)}),
    ({"packing": "bestfit", "form": "hf", "return_seq_idx": True}, {"rows": "bestfit", "form": HF(seq_idx=True)}),
])
def test_tokpack_02s_keywords_still_give_the_same_batches_with_a_warning(prepared, old, new):
    split = "val" if "stride" in old else "train"
    with pytest.warns(DeprecationWarning, match="is tokpack 0.2's spelling and goes in 0.3"):
        before = PackedDocuments(prepared, 16, split=split, **old)
    after = PackedDocuments(prepared, 16, split=split, **new)
    assert before.describe_packing() == after.describe_packing()
    take_both = [list(itertools.islice(build_loader(d, 2, seed=4), 5)) for d in (before, after)]
    for a, b in zip(*take_both, strict=True):
        a, b = (a, b) if isinstance(a, dict) else (a._asdict(), b._asdict())
        assert all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)
    with pytest.raises(TypeError, match="unexpected keyword argument 'strides'"):
        PackedDocuments(prepared, 16, split=split, strides=8)


def test_the_presets_are_each_stacks_settings():
    assert preset("nanochat") == TrainRows("bestfit", buffer_size=1000, refill=128, ranks="groups")
    assert preset("modded", max_doc_len=2048) == TrainRows("aligned", max_doc_len=2048, ranks="rows", shard_end="drop")
    assert PRESETS["modded"].form == Flat() and PRESETS["hf"].form == HF() and PRESETS["nanochat"].form == Rows()


def test_shard_end_drop_refuses_rows_or_steps_no_shard_can_hold(tmp_path):
    folder = prepare_docs(tmp_path / "sharded", make_docs(80, words=120), shard_tokens=3000)
    sizes = [s["tokens"] for s in json.loads((folder / "meta.json").read_text())["splits"]["train"]["shards"]]
    assert len(sizes) > 2 and sum(sizes) > 2 * max(sizes)  # a row of most of the split fits it, not a shard
    with pytest.raises(ValueError, match="shard_end='drop' serves no row that runs past a token file's end"):
        PackedDocuments(folder, sum(sizes) // 2, split="train", rows=TrainRows(shard_end="drop"))
    T = max(sizes) // 2  # one row fits a shard, a step of four ranks' rows does not
    rows = PackedDocuments(folder, T, split="train", rows=TrainRows(ranks="rows", shard_end="drop"))
    assert len(next(iter(build_loader(rows, 1, seed=0, rank=0, world_size=1)))[0][0]) == T
    with pytest.raises(ValueError, match="needs a step of 4 rows of"):
        next(iter(build_loader(rows, 1, seed=0, rank=0, world_size=4)))


def test_a_resume_costs_the_same_at_any_step(prepared, monkeypatch):
    from tokpack.data import packers

    data = PackedDocuments(prepared, 32, split="train", rows=TrainRows("bestfit", buffer_size=16))
    for at in (3, 40):
        first = build_loader(data, 4, seed=3)
        take(first, at)
        state = first.state_dict()
        made = []
        real = packers.TrainingRows.__next__
        monkeypatch.setattr(packers.TrainingRows, "__next__", lambda self: made.append(1) or real(self))
        second = build_loader(data, 4, seed=3)
        second.load_state_dict(state)
        resumed_batch = take(second, 1)
        monkeypatch.undo()
        assert len(made) == 4  # the resumed batch's rows only, none packed again
        assert resumed_batch == take(first, 1)


def _packed_state(prepared, at=5):
    data = PackedDocuments(prepared, 32, split="train", rows=TrainRows("bestfit", buffer_size=16))
    loader = build_loader(data, 4, seed=3)
    take(loader, at)
    return data, loader.state_dict()


@pytest.mark.parametrize("forgery,fragment", [
    ("no packer state", "needs its packer state"),
    ("edited, its checksum not", "does not match its checksum"),
    ("batch 10**12", "is at row 4000000000000 but its packer state at row"),
    ("batch 2**70", "out of range"),
    ("a document swapped", "does not hold at that place"),
    ("an emptied buffer", "holds 0 entries where this packing keeps 15"),
    ("more rows than documents", "which no packing makes"),
    ("an arrival not yet taken", "did not arrive where it says"),
])
def test_forged_packed_states_are_refused_in_one_line(prepared, forgery, fragment):
    from tokpack.data.packers import PackerState, buffer_key

    data = PackedDocuments(prepared, 32, split="train", rows=TrainRows("bestfit", buffer_size=16))
    loader = build_loader(data, 4, seed=3)
    take(loader, 5)
    state = loader.state_dict()
    packer = state["packer"]
    if forgery == "no packer state":
        del state["packer"]
    elif forgery == "edited, its checksum not":
        packer["taken"] += 1
    elif forgery == "batch 10**12":
        state["batch"] = 10**12
    else:  # a forger who recomputes the checksum too
        if forgery == "batch 2**70":
            state["batch"], packer["row"] = 2**70, 2**70 * 4
        elif forgery == "a document swapped":
            packer["buffer"][0][1] = (packer["buffer"][0][1] + 1) % len(data)
        elif forgery == "an emptied buffer":
            packer["buffer"] = []
        elif forgery == "an arrival not yet taken":  # the next document to arrive, already in the buffer
            packer["buffer"][0][0] = packer["taken"]
        else:
            packer["row"] = state["batch"] * 4
            packer["taken"] = packer["row"] - 1 + len(packer["buffer"])
        keys = sorted(buffer_key(doc, int(data.lengths[doc]), arrival, None) for arrival, doc in packer["buffer"])
        state["packer"] = data.save_state((3, 0, 1, True), PackerState(packer["row"], packer["taken"], keys))
    with pytest.raises(ValueError, match=fragment) as exc:
        build_loader(data, 4, seed=3).load_state_dict(state)
    assert "\n" not in str(exc.value)
