"""A split of conversations read with its loss mask: nanochat's SFT batches (a faithful miniature
of its loader) batch for batch on one and two ranks and resumed exactly, no clogging where
nanochat clogs, masked targets in windows and in every packed form, and a batch with nothing to
train on refused."""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import warnings

import numpy as np
import pytest
import torch

from helpers import make_chats, megatron_indexed, write_jsonl, write_nanochat_spec
from tokpack.bench.chat import nanochat_render, nanochat_sft_batches
from tokpack.data.layouts import HF, TrainRows
from tokpack.data.documents import DocumentDataset, pad_collate
from tokpack.data.loader import build_loader
from tokpack.data.packing import PackedDocuments
from tokpack.data.windows import TokenWindows
from tokpack.format import read_meta
from tokpack.prepare import PrepareConfig, prepare
from tokpack.tokenizer import load_encoding

CHATS = make_chats(90, seed=11)


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    """(folder, tokenizer, the train split's conversations in stored order, the longest's tokens)."""
    root = tmp_path_factory.mktemp("sft")
    spec = write_nanochat_spec(root / "tok")
    source = write_jsonl(root / "chats.jsonl", CHATS)
    prepare(PrepareConfig(inputs=(str(source),), out_dir=str(root / "out"), encoding=str(spec), chat="nanochat",
                          val_fraction=0.2, quiet=True))
    enc = load_encoding(str(spec))
    tokens = np.fromfile(root / "out" / "train.bin", dtype=np.uint16)
    starts = np.fromfile(root / "out" / "train.idx", dtype="<u8").astype(np.int64).tolist() + [len(tokens)]
    stored = [tokens[a:b].tolist() for a, b in zip(starts, starts[1:])]
    train = [c for c in CHATS if nanochat_render(enc, c)[0] in stored]
    assert [nanochat_render(enc, c)[0] for c in train] == stored  # the stored order is the input order
    return root / "out", enc, train, max(map(len, stored))


def _nanochat_rows(folder, T, **keywords):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # tokpack 0.2's keywords, as the issue spells them
        return PackedDocuments(folder, T, split="train", **keywords)


@pytest.mark.parametrize("spelling", ["keywords", "preset"])
@pytest.mark.parametrize("world", [1, 2])
def test_bestfit_pad_gives_nanochats_sft_batches(chats, spelling, world):
    folder, enc, train, longest = chats
    T, B = longest + 30, 3  # no conversation longer than a row: nanochat's loader never clogs here
    for rank in range(world):
        if spelling == "keywords":
            data = _nanochat_rows(folder, T, packing="bestfit-pad", buffer_size=100, ignore_index=-1, ranks="cursor")
        else:
            data = PackedDocuments(folder, T, split="train", rows="nanochat-sft", ignore_index=-1)
        loader = build_loader(data, B, seed=0, rank=rank, world_size=world)
        reference = nanochat_sft_batches(enc, train, B, T, rank, world)
        served = 0
        for batch, (inputs, targets) in zip(itertools.islice(loader, 50), reference):  # past the end: round again
            assert np.array_equal(batch.x.numpy(), inputs) and np.array_equal(batch.y.numpy(), targets)
            served += 1
        assert served == 50 and (targets == -1).any()


def test_bestfit_pad_resumes_exactly_mid_stream(chats):
    folder, _, _, longest = chats
    data = PackedDocuments(folder, longest + 30, split="train", rows="nanochat-sft", ignore_index=-1)
    first = build_loader(data, 3, seed=0, rank=1, world_size=2)
    taken = list(itertools.islice(iter(first), 17))
    state = first.state_dict()
    ahead = [b.y for b in itertools.islice(iter(first), 9)]
    again = build_loader(data, 3, seed=0, rank=1, world_size=2)
    again.load_state_dict(state)
    assert taken and all(torch.equal(a, b.y) for a, b in zip(ahead, itertools.islice(iter(again), 9)))


def test_where_nanochat_clogs_tokpack_crops_or_drops_and_says_so(tmp_path):
    spec = write_nanochat_spec(tmp_path / "tok")
    chats = make_chats(60, seed=2, long_every=4)
    prepare(PrepareConfig(inputs=(str(write_jsonl(tmp_path / "c.jsonl", chats)),), out_dir=str(tmp_path / "out"),
                          encoding=str(spec), chat="nanochat", quiet=True))
    enc = load_encoding(str(spec))
    T = 200  # shorter than the long conversations
    train = [c for c in chats if len(nanochat_render(enc, c)[0]) > T + 1][:2] + chats[:10]
    # nanochat's loader: the long conversations never leave its buffer, and rows of padding follow.
    batches = list(itertools.islice(nanochat_sft_batches(enc, train, 2, T, buffer_size=2), 10))
    assert all((targets == -1).all() for _, targets in batches[-3:])  # a NaN loss from here on
    for policy in ("crop", "drop"):
        with pytest.warns(UserWarning, match=f"longer than a row of {T + 1} tokens: each is {policy}ped"):
            data = PackedDocuments(tmp_path / "out", T, split="train",
                                   rows=TrainRows("bestfit-pad", buffer_size=2, long_documents=policy))
        assert data.long_documents > 0
        for batch in itertools.islice(build_loader(data, 2, seed=0), 40):
            assert (batch.y != -100).any()  # every batch trains on something


def test_masked_targets_in_windows_and_in_every_packed_form(chats):
    folder = chats[0]
    tokens = np.fromfile(folder / "val.bin", dtype=np.uint16).astype(np.int64)
    mask = np.fromfile(folder / "val.mask", dtype=np.uint8)
    longest = int(np.diff(np.append(np.fromfile(folder / "val.idx", dtype="<u8"), len(tokens))).max())
    windows = TokenWindows(folder, 32, split="val", stride=32, ignore_index=-1)
    k = [k for k in range(len(tokens) // 32) if mask[32 * k + 1:32 * k + 33].any()][2]
    x, y = windows[2]  # the third window with a target to train on
    expected = tokens[32 * k + 1:32 * k + 33].copy()
    expected[mask[32 * k + 1:32 * k + 33] == 0] = -1
    assert torch.equal(y, torch.from_numpy(expected))
    assert windows.scored_tokens == int(mask[1:].sum()) == read_meta(folder)["splits"]["val"]["supervised"]
    rows = PackedDocuments(folder, longest + 1, split="val", rows="bestfit-pad")
    hf = PackedDocuments(folder, longest + 1, split="val", rows="bestfit-pad", form=HF())
    for batch, flat in zip(itertools.islice(build_loader(rows, 2, seed=1), 5), itertools.islice(build_loader(hf, 2, seed=1), 5)):
        x, y = batch.x.reshape(-1), batch.y.reshape(-1)
        assert torch.equal(flat["input_ids"].reshape(-1), x)
        # The hf form's labels are the tokens, -100 where y is and at each segment's first position.
        labels = flat["labels"].reshape(-1)
        assert torch.equal(labels[1:] == -100, (y[:-1] == -100) | (flat["position_ids"].reshape(-1)[1:] == 0))


@pytest.mark.parametrize("stride", [None, 5, 16])
def test_windows_with_nothing_to_train_on_are_left_out_and_counted(chats, stride):
    folder, T = chats[0], 16
    tokens = np.fromfile(folder / "train.bin", dtype=np.uint16).astype(np.int64)
    mask = np.fromfile(folder / "train.mask", dtype=np.uint8)
    windows = TokenWindows(folder, T, split="train", stride=stride)
    # every window as if none were left out: its targets, -100 where not scored
    if stride is None:
        every = [np.where(mask[s + 1:s + T + 1] == 0, -100, tokens[s + 1:s + T + 1]) for s in range(len(tokens) - T)]
    else:
        every = []
        for k, s in enumerate(range(0, len(tokens) - 1, stride)):
            y = np.full(T, -100)
            end = min(s + T, len(tokens) - 1)
            y[:end - s] = np.where(mask[s + 1:end + 1] == 0, -100, tokens[s + 1:end + 1])
            y[:T - stride if k else 0] = -100  # scored by the window before
            every.append(y)
            if s + T >= len(tokens) - 1:
                break
    trained = [y for y in every if (y != -100).any()]
    assert 0 < len(trained) < len(every) and windows.untrained_windows == len(every) - len(trained)
    served = build_loader(windows, 7, seed=0, shuffle=False) if stride else None
    got = torch.cat([b.y for b in served]) if served else windows.__getitems__(range(len(windows))).y
    assert torch.equal(got, torch.from_numpy(np.stack(trained)))
    if stride:  # the sweep's sums: every trained target once
        assert int((got != -100).sum()) == windows.scored_tokens == int(mask[1:].sum())


def test_windows_of_a_split_that_trains_on_nothing_are_refused(chats, tmp_path):
    folder = tmp_path / "zero"
    shutil.copytree(chats[0], folder)
    _zero_mask(folder)
    with pytest.raises(ValueError, match="no window of 16 tokens of .* holds a target its loss mask trains on"):
        TokenWindows(folder, 16, split="train")


def _zero_mask(folder):
    (folder / "train.mask").write_bytes(bytes((folder / "train.mask").stat().st_size))
    meta = json.loads((folder / "meta.json").read_text())
    meta["splits"]["train"]["mask"]["sha256"] = hashlib.sha256((folder / "train.mask").read_bytes()).hexdigest()
    meta["splits"]["train"]["supervised"] = 0
    (folder / "meta.json").write_text(json.dumps(meta))


def test_a_mask_value_other_than_0_and_1_is_refused_by_every_reader(chats, tmp_path):
    folder = tmp_path / "two"
    shutil.copytree(chats[0], folder)
    mask = bytearray((folder / "train.mask").read_bytes())
    mask[:] = bytes(min(b * 2, 2) for b in mask)  # every trained token: 2, which no prepare writes
    (folder / "train.mask").write_bytes(bytes(mask))
    readers = [lambda: build_loader(TokenWindows(folder, 16, split="train"), 4, seed=0),
               lambda: build_loader(PackedDocuments(folder, chats[3] + 30, split="train", rows="nanochat-sft"), 2,
                                    seed=0),
               lambda: iter([DocumentDataset(folder, 4096, split="train")[0]])]
    for reader in readers:
        with pytest.raises(ValueError, match="holds the loss-mask value 2, where a mask is 0 or 1"):
            next(iter(reader()))


def test_a_split_of_conversations_whose_meta_json_lost_its_mask_is_refused(chats, tmp_path, capsys):
    folder = tmp_path / "lost"
    shutil.copytree(chats[0], folder)
    meta = json.loads((folder / "meta.json").read_text())
    del meta["splits"]["train"]["mask"]
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="split 'train' is of conversations but lists no loss mask"):
        TokenWindows(folder, 16, split="train")
    from tokpack.verify import main as verify_main

    assert verify_main([str(folder)]) == 1  # not whole, with the reason
    assert "lists no loss mask" in capsys.readouterr().err


def test_a_batch_with_nothing_to_train_on_is_refused(chats, tmp_path):
    folder = tmp_path / "zero"
    shutil.copytree(chats[0], folder)
    _zero_mask(folder)
    data = PackedDocuments(folder, chats[3] + 30, split="train", rows="nanochat-sft")
    with pytest.raises(ValueError, match="holds no target to train on"):
        next(iter(build_loader(data, 2, seed=0)))


def test_the_hf_form_is_the_real_flattening_collators_batch_of_masked_conversations(chats):
    transformers = pytest.importorskip("transformers")
    folder, _, _, longest = chats
    tokens = np.fromfile(folder / "train.bin", dtype=np.uint16)
    mask = np.fromfile(folder / "train.mask", dtype=np.uint8)
    starts = np.fromfile(folder / "train.idx", dtype="<u8").astype(np.int64).tolist() + [len(tokens)]
    # A conversation by its tokens, and without its last (x leaves out a row's last token).
    masks = {tuple(tokens[a:b - cut].tolist()): mask[a:b - cut] for a, b in zip(starts, starts[1:]) for cut in (1, 0)}
    T = longest + 30
    hf = PackedDocuments(folder, T, split="train", rows="nanochat-sft", form="hf")
    rows = PackedDocuments(folder, T, split="train", rows="nanochat-sft")
    collator = transformers.DataCollatorWithFlattening(return_tensors="pt")
    padded = 0
    for batch, reference in zip(itertools.islice(build_loader(hf, 3, seed=0), 4),
                                itertools.islice(build_loader(rows, 3, seed=0), 4)):
        x, cu = reference.x.reshape(-1).tolist(), reference.cu_seqlens.tolist()
        features = []
        for s, e in zip(cu[:-1], cu[1:]):
            ids = x[s:e]
            # A conversation is labelled where it is trained on; a row's padding (all BOS) nowhere.
            kept = masks.get(tuple(ids), np.zeros(len(ids), dtype=np.uint8))
            padded += tuple(ids) not in masks
            features.append({"input_ids": ids, "labels": [t if m else -100 for t, m in zip(ids, kept)]})
        expected = collator(features)
        for key in ("input_ids", "labels", "position_ids"):
            assert torch.equal(batch[key], expected[key]), key
    assert padded  # padding rows were compared too


def test_megatron_sft_batches_from_a_megatron_folder_with_masks(tmp_path):
    indexed = megatron_indexed()
    spec = write_nanochat_spec(tmp_path / "tok")
    source = write_jsonl(tmp_path / "chats.jsonl", CHATS)
    prepare(PrepareConfig(inputs=(str(source),), out_dir=str(tmp_path / "out"), encoding=str(spec), chat="nanochat",
                          format="megatron", quiet=True))
    # Megatron's own reader sees each conversation whole; the mask lies beside, a byte a token.
    docs = indexed.IndexedDataset(str(tmp_path / "out" / "train_text_document"))
    mask = np.fromfile(tmp_path / "out" / "train.mask", dtype=np.uint8)
    starts = np.append(np.fromfile(tmp_path / "out" / "train.idx", dtype="<u8"), len(mask)).astype(np.int64)
    by_tokens = {tuple(docs[i].tolist()): mask[starts[i]:starts[i + 1]] for i in range(len(docs))}
    by_head: dict[tuple, list] = {}  # a segment's conversations found by its first tokens
    for k, m in by_tokens.items():
        by_head.setdefault(k[:16], []).append((k, m))
    T = 96
    data = PackedDocuments(tmp_path / "out", T, split="train", rows=TrainRows("bestfit"), form="megatron")
    plain = PackedDocuments(tmp_path / "out", T, split="train", rows=TrainRows("bestfit"))
    seen = 0
    for batch, rows in itertools.islice(zip(build_loader(data, 3, seed=4), build_loader(plain, 3, seed=4)), 6):
        assert set(batch) == {"tokens", "labels", "loss_mask", "position_ids", "cu_seqlens", "max_seqlen"}
        assert torch.equal(batch["tokens"], rows.x) and torch.equal(batch["labels"], rows.y)
        assert batch["loss_mask"].dtype == torch.float32 and torch.equal(batch["loss_mask"] == 1, rows.y != -100)
        tokens, labels = batch["tokens"].reshape(-1), batch["labels"].reshape(-1)
        cu = batch["cu_seqlens"].tolist()
        for a, b in zip(cu, cu[1:]):
            assert batch["position_ids"].reshape(-1)[a:b].tolist() == list(range(b - a))
            # A whole conversation of Megatron's reader (or its cropped head), its targets its mask's.
            segment = tokens[a:b].tolist()
            found = [(k, m) for k, m in by_head.get(tuple(segment[:16]), by_tokens.items())
                     if list(k[:b - a]) == segment]
            assert found, "a segment is no conversation's"
            k, m = found[0]
            inside = labels[a:b - 1]
            expected = torch.tensor(k[1:b - a], dtype=torch.long).masked_fill(torch.from_numpy(m[1:b - a] == 0), -100)
            assert torch.equal(inside, expected)
            seen += 1
        # Megatron's loss (a masked mean) is the ignore-index mean on the labels.
        small = torch.where(labels < 0, labels, labels % 16)  # a 16-word model: the masks are what is tested
        logits = torch.randn(tokens.numel(), 16, generator=torch.Generator().manual_seed(0))
        losses = torch.nn.functional.cross_entropy(logits, small.clamp(min=0), reduction="none")
        ours = (losses * batch["loss_mask"].reshape(-1)).sum() / batch["loss_mask"].sum()
        assert torch.allclose(ours, torch.nn.functional.cross_entropy(logits, small, ignore_index=-100))
    assert seen > 10


def test_trl_packs_the_documents_of_a_chat_split_and_trains_on_the_mask(chats):
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("trl")
    pytest.importorskip("accelerate")
    from trl.data_utils import pack_dataset
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    folder = chats[0]
    docs = DocumentDataset(folder, 10**6, split="train")
    items = [docs[i] for i in range(len(docs))]
    mask = np.fromfile(folder / "train.mask", dtype=np.uint8)
    assert torch.equal(torch.cat([item["assistant_masks"] for item in items]), torch.from_numpy(mask.astype(np.int64)))
    # pad_collate: a Hugging Face causal LM's labels, -100 off the mask and at padding.
    batch = pad_collate(items[:4], docs.pad_id)
    for row, item in enumerate(items[:4]):
        n = len(item["input_ids"])
        assert torch.equal(batch["labels"][row, :n], item["input_ids"].masked_fill(item["assistant_masks"] == 0, -100))
        assert (batch["labels"][row, n:] == -100).all()
    # TRL: its columns, its labels rule (a token where every mask is 1, else -100), its best-fit-decreasing
    # packing and its padding-free collator train on exactly the split's supervised tokens.
    rows = datasets.Dataset.from_list([{k: v.tolist() for k, v in item.items()} for item in items])
    rows = rows.map(lambda r: {"labels": [t if m else -100 for t, m in zip(r["input_ids"], r["assistant_masks"])]},
                    remove_columns=["assistant_masks"])
    T = max(len(item["input_ids"]) for item in items)
    packed = pack_dataset(rows, seq_length=T, strategy="bfd")
    collate = DataCollatorForLanguageModeling(pad_token_id=docs.pad_id, padding_free=True)
    trained = 0
    for start in range(0, len(packed), 4):
        out = collate([packed[i] for i in range(start, min(start + 4, len(packed)))])
        trained += int((out["labels"] != -100).sum())
    assert trained == read_meta(folder)["splits"]["train"]["supervised"] > 0
