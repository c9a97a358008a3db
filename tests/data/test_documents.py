from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from helpers import make_docs, megatron_indexed, script
from tokpack.check import resumed, take
from tokpack.data.documents import DocumentDataset, pad_collate
from tokpack.data.samplers import BucketBatchSampler, WeightedSampler, inverse_frequency_weights
from tokpack.data.loader import build_loader
from tokpack.split import open_split
from tokpack.tokenizer import load_encoding


# -- padding ---------------------------------------------------------------------------------

def test_pad_collate_right_pads_to_the_longest_with_the_keys_hf_models_take():
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(1, 50, (n,), generator=g) for n in (5, 2, 7, 3)]
    batch = next(iter(DataLoader(seqs, batch_size=4, collate_fn=functools.partial(pad_collate, pad_id=99))))
    assert batch["input_ids"].shape == (4, 7)
    assert batch["attention_mask"].sum(1).tolist() == [5, 2, 7, 3]
    assert (batch["labels"][batch["attention_mask"] == 0] == -100).all()
    assert (batch["labels"][batch["attention_mask"] == 1] == batch["input_ids"][batch["attention_mask"] == 1]).all()
    for row, seq in enumerate(seqs):
        assert torch.equal(batch["input_ids"][row, :len(seq)], seq)
        assert (batch["input_ids"][row, len(seq):] == 99).all()
    labelled = pad_collate([(seqs[0], 1), (seqs[1], 0)], pad_id=99)
    assert labelled["labels"].tolist() == [1, 0] and labelled["input_ids"].shape == (2, 5)


class CausalClassifier(torch.nn.Module):
    """GPT2ForSequenceClassification in miniature: a causal model (each position sees only those
    before it) whose class logits are read at each row's last token that is not ``pad_token_id``."""

    def __init__(self, vocab, pad_token_id):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.emb, self.head = torch.randn(vocab, 8, generator=g), torch.randn(8, 2, generator=g)
        self.pad_token_id = pad_token_id

    def forward(self, input_ids):
        T = input_ids.shape[1]
        hidden = self.emb[input_ids].cumsum(1) / torch.arange(1, T + 1)[None, :, None]
        logits = hidden @ self.head
        last = (torch.arange(T) * (input_ids != self.pad_token_id).int()).argmax(-1)
        return logits[torch.arange(len(input_ids)), last]


def test_padded_classification_batches_give_the_logits_of_one_by_one_inputs(prepared):
    n = len(DocumentDataset(prepared, 10**6, split="val"))
    docs = DocumentDataset(prepared, 10**6, split="val", labels=[i % 2 for i in range(n)])
    enc = load_encoding("gpt2")
    assert docs.pad_id == enc.eot_token  # GPT-2's config has no pad token: the model is given this one
    model = CausalClassifier(enc.n_vocab, pad_token_id=docs.pad_id)
    samples = [docs[i] for i in range(8)]
    assert len({len(ids) for ids, _ in samples}) == 8  # rows of 8 lengths: 7 are padded
    batch = docs.default_collate_fn(samples)
    one_by_one = torch.cat([model(ids[None]) for ids, _ in samples])
    assert torch.allclose(model(batch["input_ids"]), one_by_one, atol=1e-6)
    # Padding with 0 while the model is told 50256 reads most rows at a padding position.
    zero_padded = pad_collate(samples, pad_id=0)
    wrong = (~torch.isclose(model(zero_padded["input_ids"]), one_by_one, atol=1e-6)).any(1)
    assert wrong.sum() == 7
    loaded = next(iter(build_loader(docs, 8, shuffle=True)))
    assert (loaded["input_ids"][loaded["attention_mask"] == 0] == docs.pad_id).all()


def test_documents_without_meta_json_need_the_pad_id_named(prepared, tmp_path):
    for name in ("val.bin", "val.idx"):
        (tmp_path / name).write_bytes((prepared / name).read_bytes())
    bare = open_split(tmp_path / "val.bin", dtype="uint16")
    with pytest.raises(ValueError, match="no meta.json to name its end-of-text id; pass pad_id="):
        DocumentDataset(bare, 64)
    assert DocumentDataset(bare, 64, pad_id=7).default_collate_fn([torch.tensor([1, 2]), torch.tensor([3])])[
        "input_ids"].tolist() == [[1, 2], [3, 7]]


# -- documents ---------------------------------------------------------------------------------

def test_documents_are_the_prepared_documents_truncated(prepared):
    enc = load_encoding("gpt2")
    docs = DocumentDataset(prepared / "train.bin", max_length=40)
    full = DocumentDataset(prepared / "train.bin", max_length=10**9)
    texts = {enc.decode(full[i][:-1].tolist()) for i in range(len(full))}  # minus the eot
    assert texts <= set(make_docs(60, words=200))
    for i in range(len(docs)):
        assert docs[i].dtype == torch.int64 and len(docs[i]) == min(40, len(full[i])) == docs.lengths[i]
        assert torch.equal(docs[i], full[i][:40]) and full[i][-1] == enc.eot_token
    with pytest.raises(ValueError, match="labels for"):
        DocumentDataset(prepared / "train.bin", 8, labels=[0])


def test_documents_through_build_loader_with_buckets_and_resume(prepared):
    docs = DocumentDataset(prepared / "train.bin", max_length=64)

    def build():
        return build_loader(docs, 4, seed=3, sampler=BucketBatchSampler(docs.lengths, 4, seed=3, pool_batches=2))

    batch = next(iter(build()))
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    n = 2 * len(build()) + 1
    fresh = take(build(), n)
    assert all(resumed(build, n, at) == fresh for at in (1, len(build()) - 1, len(build()) + 1))


def test_bucketing_cuts_padding_from_about_45_to_under_5_percent():
    lengths = torch.randint(4, 65, (2000,), generator=torch.Generator().manual_seed(0)).tolist()
    order = torch.randperm(2000, generator=torch.Generator().manual_seed(1)).tolist()
    random_batches = [order[i:i + 32] for i in range(0, 2000, 32)]
    bucketed = list(BucketBatchSampler(lengths, 32, seed=0))
    assert sorted(i for b in bucketed for i in b) == list(range(2000))
    padded_fraction = script("lab").padded_fraction
    assert 0.40 < padded_fraction(lengths, random_batches) < 0.50
    assert padded_fraction(lengths, bucketed) < 0.05


@pytest.mark.parametrize("n,batch,pool,world,drop_last", [(2000, 32, 50, 1, False), (101, 4, 3, 1, True),
                                                          (101, 4, 3, 2, False), (7, 3, 2, 3, True), (50, 5, 2, 3, False)])
def test_bucket_length_matches_the_batches_it_yields(n, batch, pool, world, drop_last):
    for rank in range(world):
        sampler = BucketBatchSampler(list(range(n)), batch, seed=0, pool_batches=pool, rank=rank, world_size=world,
                                     drop_last=drop_last)
        assert len(sampler) == len(list(sampler))


@pytest.mark.parametrize("world", [2, 3])
def test_bucket_shares_are_equal_and_disjoint(world):
    lengths = list(range(1, 101))
    shares = [[i for b in BucketBatchSampler(lengths, 4, seed=0, rank=r, world_size=world) for i in b]
              for r in range(world)]
    counts = [len(list(BucketBatchSampler(lengths, 4, seed=0, rank=r, world_size=world))) for r in range(world)]
    assert len(set(counts)) == 1
    flat = [i for s in shares for i in s]
    assert len(flat) == len(set(flat))


# -- weighted sampling and labelled documents ----------------------------------------------

def test_weighted_sampler_balances_resumes_and_labelled_documents(prepared):
    labels = torch.tensor([0] * 900 + [1] * 100)
    sampler = WeightedSampler(inverse_frequency_weights(labels), 50, seed=0, num_samples=20_000)
    idx = torch.tensor([i for b in sampler for i in b])
    assert 0.45 <= labels[idx].float().mean().item() <= 0.55
    sampler.set_position(0, 123)
    assert [i for b in sampler for i in b] == idx[123 * 50:].tolist()

    docs = DocumentDataset(prepared / "train.bin", 32)
    doc_labels = np.zeros(len(docs), dtype=int)
    doc_labels[:3] = 1  # a rare class
    labelled = DocumentDataset(prepared / "train.bin", 32, labels=doc_labels)
    loader = build_loader(labelled, 16, seed=0,
                          sampler=WeightedSampler(inverse_frequency_weights(doc_labels), 16, seed=0, num_samples=4000))
    drawn = torch.cat([b["labels"] for b in loader])
    assert len(drawn) == 4000 and 0.45 <= drawn.float().mean().item() <= 0.55


class SequenceClassifier(torch.nn.Module):
    """A Hugging Face ``*ForSequenceClassification`` in miniature: ``forward(input_ids,
    attention_mask=None, labels=None)`` pools the last real token and, given ``labels`` of shape
    (B,), returns the loss over num_labels classes; (B, T) labels fail as HF's do."""

    def __init__(self, vocab=50257, num_labels=2):
        super().__init__()
        self.embed, self.score = torch.nn.Embedding(vocab, 8), torch.nn.Linear(8, num_labels)

    def forward(self, input_ids, attention_mask=None, labels=None):
        last = attention_mask.sum(1) - 1
        logits = self.score(self.embed(input_ids)[torch.arange(len(input_ids)), last])
        loss = torch.nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


class CausalLM(torch.nn.Module):
    """A Hugging Face ``*ForCausalLM`` in miniature: it shifts ``labels`` itself, -100 ignored."""

    def __init__(self, vocab=50257):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(vocab, 8), torch.nn.Linear(8, vocab)

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.head(self.embed(input_ids))
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        return {"loss": loss, "logits": logits}


def test_batches_feed_hugging_face_models_as_keyword_arguments(prepared):
    docs = DocumentDataset(prepared / "train.bin", 32)
    labels = np.arange(len(docs)) % 2
    classified = next(iter(build_loader(DocumentDataset(prepared / "train.bin", 32, labels=labels), 4)))
    out = SequenceClassifier()(**classified)
    assert classified["labels"].tolist() == labels[:4].tolist() and out["loss"].ndim == 0
    lm_batch = next(iter(build_loader(docs, 4)))
    assert torch.isfinite(CausalLM()(**lm_batch)["loss"])
    with pytest.raises((ValueError, RuntimeError)):  # LM labels are not class labels
        SequenceClassifier()(**lm_batch)


# -- other tools' datasets, read by documents ------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_a_dataset_megatron_wrote_is_read_by_its_documents(tmp_path, dtype):
    IndexedDatasetBuilder = megatron_indexed().IndexedDatasetBuilder

    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 50000, int(n)).astype(dtype) for n in rng.integers(3, 40, 25)]
    builder = IndexedDatasetBuilder(str(tmp_path / "web_text_document.bin"), dtype=dtype)
    for doc in docs[:10]:
        builder.add_document(doc, [len(doc)])
    for doc in docs[10:]:  # documents of two sentences each, as preprocess_data.py --split-sentences makes
        half = len(doc) // 2
        builder.add_document(doc, [half, len(doc) - half])
    builder.finalize(str(tmp_path / "web_text_document.idx"))
    ds = DocumentDataset(tmp_path / "web_text_document.bin", 10**6, pad_id=0)
    assert len(ds) == len(docs) and all(ds[i].tolist() == doc.tolist() for i, doc in enumerate(docs))
    from tokpack.data.windows import TokenWindows  # the tokens, as windows, as before

    assert TokenWindows(tmp_path / "web_text_document.bin", 8).dtype == np.dtype(dtype)
    index = tmp_path / "web_text_document.idx"
    data = bytearray(index.read_bytes())
    data[-8:] = (999).to_bytes(8, "little")  # the last document index points past the sequences
    index.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="does not describe the .* tokens of its .bin"):
        DocumentDataset(tmp_path / "web_text_document.bin", 10, pad_id=0)


def test_llmc_shards_without_an_index_are_read_by_their_leading_end_of_text(tmp_path):
    from helpers import shard_file

    rng = np.random.default_rng(1)
    docs = [[50256, *rng.integers(0, 50000, int(n)).tolist()] for n in rng.integers(1, 30, 40)]
    train = [t for d in docs[5:] for t in d]  # llm.c's fineweb.py: each document starts with <|endoftext|>
    folder = tmp_path / "fineweb10B"
    folder.mkdir()
    shard_file(folder / "fineweb_val_000000.bin", np.array([t for d in docs[:5] for t in d]))
    shard_file(folder / "fineweb_train_000001.bin", np.array(train[:101]))  # a document runs across shards
    shard_file(folder / "fineweb_train_000002.bin", np.array(train[101:]))
    read = DocumentDataset(folder, 10**6, split="train", pad_id=50256)
    assert [read[i].tolist() for i in range(len(read))] == docs[5:]
    assert len(DocumentDataset(folder, 10**6, split="val", pad_id=50256)) == 5
    (folder / "fineweb_train_000001.bin").unlink()
    shard_file(folder / "fineweb_train_000001.bin", np.array([7, 8, *train[:101]]))  # starts inside a document
    with pytest.raises(ValueError, match="does not start with token 50256, the document start llm.c"):
        DocumentDataset(folder, 10**6, split="train", pad_id=50256)
