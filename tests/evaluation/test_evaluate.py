from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import tiktoken
import torch
from torch.nn import functional as F

import tokpack
from helpers import byte_unigram, make_docs
from tokpack.evaluation import byte_lengths, main, sweep
from tokpack.split import open_tokens
from tokpack.models import GPT, GPTConfig, NGram, gpt_checkpoint
from tokpack.data.loader import build_loader
from tokpack.tokenizer import CL100K_PATTERN, TiktokenEncoder, load_encoding
from tokpack.data.packing import PackedDocuments
from tokpack.data.windows import TokenWindows

V = 50257


def _direct_losses(train: np.ndarray, val: np.ndarray, order: int, k: float = 0.01) -> np.ndarray:
    """-log p of every val target, from counts taken with plain Python."""
    if order == 1:
        counts = Counter(train.tolist())
        return -np.array([math.log((counts[t] + k) / (len(train) + k * V)) for t in val[1:].tolist()])
    pairs = Counter(zip(train[:-1].tolist(), train[1:].tolist()))
    rows = Counter(train[:-1].tolist())
    return -np.array([math.log((pairs[(a, b)] + k) / (rows[a] + k * V)) for a, b in zip(val[:-1].tolist(),
                                                                                           val[1:].tolist())])


def _direct_loss(train: np.ndarray, val: np.ndarray, order: int, k: float = 0.01) -> float:
    return float(np.mean(_direct_losses(train, val, order, k)))


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("T,S", [(32, 32), (32, 24)])
def test_ngram_losses_match_a_direct_computation(prepared, order, T, S):
    train, val = (np.asarray(open_tokens(prepared / f"{s}.bin")) for s in ("train", "val"))
    model = NGram(prepared / "train.bin", V, order)
    result = tokpack.evaluate(model, build_loader(TokenWindows(prepared / "val.bin", T, stride=S), 4))
    assert result["tokens"] == len(val) - 1
    losses = _direct_losses(train, val, order)
    assert result["loss"] == pytest.approx(losses.mean(), rel=1e-6)
    assert result["ppl"] == pytest.approx(math.exp(result["loss"]))
    assert result["bits_per_token"] == pytest.approx(result["loss"] / math.log(2))
    enc = load_encoding("gpt2")
    text = val[1:] != enc.eot_token  # bits/byte: the text targets' loss over the text's bytes
    text_bytes = len(enc.library.decode_bytes(val[1:][text].tolist()))
    assert result["bits_per_byte"] == pytest.approx(losses[text].sum() / math.log(2) / text_bytes, rel=1e-6)


def test_bigram_beats_unigram(prepared):
    rows = sweep(prepared, baselines=["bigram", "unigram"], block_size=32, quiet=True)
    losses = {r["model"]: r["loss"] for r in rows}
    assert losses["bigram"] < losses["unigram"]


def test_every_stride_scores_every_token_once(prepared):
    n = len(open_tokens(prepared / "val.bin"))
    model = NGram(prepared / "train.bin", V, 1)
    rows = [tokpack.evaluate(model, build_loader(TokenWindows(prepared / "val.bin", 8, stride=s), 3))
            for s in (8, 5, 2)]
    assert {r["tokens"] for r in rows} == {n - 1}
    assert rows[0]["loss"] == pytest.approx(rows[2]["loss"])  # a unigram ignores context
    assert rows[0]["windows"] < rows[1]["windows"] < rows[2]["windows"]


def test_gpt_checkpoint_sweep(prepared, tmp_path, capsys):
    model = GPT(GPTConfig(block_size=32, n_layer=1, n_head=2, n_embd=16), seed=0)
    torch.save(gpt_checkpoint(model), tmp_path / "ckpt.pt")
    assert main([str(prepared), "--checkpoint", str(tmp_path / "ckpt.pt"), "--stride", "32", "16", "--quiet"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    rows = json.loads(out[-1])
    assert [r["stride"] for r in rows] == [32, 16] and abs(rows[0]["loss"] - math.log(V)) < 1.0


BAD_SWEEPS = {  # the fragment of the one line -> the options ({tmp}: the test's folder, {data}: the prepared one)
    "has vocab_size 1000 but": ["--checkpoint", "{tmp}/small.pt"],
    "is longer than ckpt.pt's block size 32": ["--checkpoint", "{tmp}/ckpt.pt", "--block-size", "64"],
    "split 'test' is not in": ["--model", "bigram", "--split", "test"],
    "stride 0 must lie in 1..block_size": ["--model", "bigram", "--stride", "0"],
    "stride 300 must lie in 1..block_size": ["--model", "bigram", "--block-size", "32", "--stride", "300"],
    "is not a GPT checkpoint": ["--checkpoint", "{data}/meta.json"],
    "--block-size 0 must be at least 1": ["--model", "bigram", "--block-size", "0"],
    "block_size 100000000 is longer than the": ["--model", "bigram", "--block-size", str(10**8)],
    "add_k nan must be a positive finite number": ["--model", "bigram", "--add-k", "nan"],
    "add_k inf must be a positive finite number": ["--model", "bigram", "--add-k", "inf"],
    "argument --batch-size: invalid int value": ["--model", "bigram", "--batch-size", "x"],
    "--device 'nonsense' is not a device": ["--model", "bigram", "--device", "nonsense"],
}


@pytest.mark.parametrize("fragment", list(BAD_SWEEPS))
def test_bad_sweeps_are_one_line_and_exit_2(prepared, tmp_path, capsys, fragment):
    torch.save(gpt_checkpoint(GPT(GPTConfig(block_size=32, n_layer=1, n_head=2, n_embd=16))), tmp_path / "ckpt.pt")
    small = GPT(GPTConfig(vocab_size=1000, block_size=32, n_layer=1, n_head=2, n_embd=16))
    torch.save(gpt_checkpoint(small), tmp_path / "small.pt")
    argv = [arg.format(tmp=tmp_path, data=prepared) for arg in BAD_SWEEPS[fragment]]
    with pytest.raises(SystemExit) as exc:
        main([str(prepared), *argv, "--quiet"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and fragment in err and "\n" not in err, err


@pytest.mark.e2e
def test_sums_over_ranks_equal_one_process(prepared):
    """Windows across documents, and each document alone (packed rows): the same sums on 1, 2 and 3 processes."""
    rows = sweep(prepared, baselines=["bigram"], block_size=16, strides=[16], batch_size=2, quiet=True, documents=True)
    single, documents = rows
    assert (single["scope"], documents["scope"]) == ("stream", "documents")
    assert single["windows"] % 3  # uneven shares (2 ranks: in test_packing)
    for world in (3,):  # one process is `single`, the same command's code in this process
        done = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
             "-m", "tokpack.evaluate", str(prepared), "--model", "bigram", "--block-size", "16",
             "--batch-size", "2", "--quiet", "--documents"],
            capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        for row, one in zip(json.loads(done.stdout.strip().splitlines()[-1]), rows, strict=True):
            assert row["tokens"] == one["tokens"] and row["windows"] == one["windows"] and row["scope"] == one["scope"]
            assert row["loss"] == pytest.approx(one["loss"], rel=1e-12)
            assert row["bits_per_byte"] == pytest.approx(one["bits_per_byte"], rel=1e-12)


def test_gpt_shapes_and_limits():
    model = GPT(GPTConfig(vocab_size=100, block_size=8, n_layer=1, n_head=2, n_embd=8), seed=3)
    assert model(torch.zeros(2, 8, dtype=torch.long)).shape == (2, 8, 100)
    same = GPT(GPTConfig(vocab_size=100, block_size=8, n_layer=1, n_head=2, n_embd=8), seed=3)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), same.parameters()))
    with pytest.raises(ValueError, match="longer than the model's block_size 8"):
        model(torch.zeros(1, 9, dtype=torch.long))


class NanoGPTShaped(torch.nn.Module):
    """nanoGPT's model contract in miniature: its parameter names, bias switch, tied head, and
    ``forward(idx, targets=None) -> (logits, loss)`` with last-position logits when targets is
    None and ``ignore_index=-1``."""

    def __init__(self, vocab_size, block_size, n_embd=16, n_head=2, n_layer=1, bias=False):
        super().__init__()
        self.n_head = n_head
        nn = torch.nn
        blocks = nn.ModuleList()
        for _ in range(n_layer):
            block = nn.Module()
            block.ln_1, block.ln_2 = nn.LayerNorm(n_embd, bias=bias), nn.LayerNorm(n_embd, bias=bias)
            block.attn = nn.Module()
            block.attn.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
            block.attn.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
            block.mlp = nn.Module()
            block.mlp.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
            block.mlp.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
            blocks.append(block)
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(vocab_size, n_embd), wpe=nn.Embedding(block_size, n_embd),
                                              h=blocks, ln_f=nn.LayerNorm(n_embd, bias=bias)))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        g = torch.Generator().manual_seed(1)
        for p in self.parameters():
            torch.nn.init.normal_(p, 0.0, 0.2, generator=g)

    def forward(self, idx, targets=None):
        F = torch.nn.functional
        B, T = idx.shape
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(T))
        for b in self.transformer.h:
            q, k, v = b.attn.c_attn(b.ln_1(x)).split(x.shape[-1], dim=2)
            q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
            x = x + b.attn.c_proj(y)
            x = x + b.mlp.c_proj(F.gelu(b.mlp.c_fc(b.ln_2(x))))
        x = self.transformer.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def _direct_model_loss(model, val: np.ndarray, T: int) -> float:
    """Mean -log p of every val target, each scored once in windows of T from the start (stride T)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(val) - 1, T):
            ids = torch.from_numpy(val[start:start + T + 1].astype(np.int64))[None]
            logits, _ = model(ids[:, :-1], ids[:, 1:])
            logp = torch.log_softmax(logits.double(), -1)[0]
            total -= logp[torch.arange(ids.shape[1] - 1), ids[0, 1:]].sum().item()
            count += ids.shape[1] - 1
    return total / count


def test_nanogpt_models_and_checkpoints_score_exactly(prepared, tmp_path, capsys):
    val = np.asarray(open_tokens(prepared / "val.bin"))
    model = NanoGPTShaped(V, 16).eval()
    # nanoGPT's train.py checkpoint, trained under torch.compile (the `_orig_mod.` prefix on every
    # key): AdamW's state after a step, best_val_loss a tensor, config its int/float/bool/str globals.
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), fused=False)
    model(torch.zeros(1, 4, dtype=torch.long))[0].sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    expected = _direct_model_loss(model, val, 16)
    result = tokpack.evaluate(model, build_loader(TokenWindows(prepared, 16, stride=16, split="val"), 4))
    assert result["tokens"] == len(val) - 1 and result["loss"] == pytest.approx(expected, rel=1e-6)
    config = {"out_dir": "out", "eval_interval": 2000, "always_save_checkpoint": True, "init_from": "scratch",
              "dataset": "shakespeare", "learning_rate": 6e-4, "decay_lr": True, "dtype": "bfloat16", "compile": True}
    ckpt = {"model": {f"_orig_mod.{k}": v for k, v in model.state_dict().items()},
            "optimizer": opt.state_dict(),
            "model_args": dict(n_layer=1, n_head=2, n_embd=16, block_size=16, bias=False, vocab_size=V, dropout=0.0),
            "iter_num": 5, "best_val_loss": torch.tensor(9.9), "config": config}
    torch.save(ckpt, tmp_path / "ckpt.pt")
    assert main([str(prepared), "--checkpoint", str(tmp_path / "ckpt.pt"), "--quiet"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])[0]
    assert row["tokens"] == len(val) - 1 and row["loss"] == pytest.approx(expected, rel=1e-5)
    ckpt["model_args"]["bias"] = True  # a layout that does not fit its weights: one line, exit 2
    torch.save(ckpt, tmp_path / "bad.pt")
    with pytest.raises(SystemExit) as exc:
        main([str(prepared), "--checkpoint", str(tmp_path / "bad.pt"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "does not fit a GPT" in err and "\n" not in err


def test_models_returning_objects_with_logits_are_scored(prepared):
    class HFShaped(torch.nn.Module):  # a Hugging Face causal LM: an output object with .logits
        def __init__(self):
            super().__init__()
            self.inner = GPT(GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=16), seed=4)

        def forward(self, input_ids):
            return type("Output", (), {"logits": self.inner(input_ids)})()

    hf = HFShaped()
    loader = build_loader(TokenWindows(prepared / "val.bin", 16, stride=8), 4)
    assert tokpack.evaluate(hf, loader)["loss"] == pytest.approx(tokpack.evaluate(hf.inner, loader)["loss"], rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logits_scored_a_slice_at_a_time_give_the_whole_batchs_sums(prepared, monkeypatch, dtype):
    # The cross-entropy runs over a slice of positions at a time to reuse its scratch memory:
    # every position's loss, and so every sum, must be the one of a single pass over the batch.
    gpt = GPT(GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=16), seed=5).to(dtype)
    windows = TokenWindows(prepared / "val.bin", 16, stride=12)
    calls = []
    real = F.cross_entropy
    monkeypatch.setattr(F, "cross_entropy", lambda *a, **k: calls.append(len(a[0])) or real(*a, **k))
    monkeypatch.setattr("tokpack.evaluation.CE_ELEMENTS", 4 * 16 * gpt.config.vocab_size)
    batches = 6  # the first few batches: the sums' agreement is per position, and bfloat16 is slow on CPUs
    whole = tokpack.evaluate(gpt, build_loader(windows, 4), max_batches=batches)
    assert max(calls) == 4 * 16 and len(build_loader(windows, 4)) > batches
    calls.clear()
    monkeypatch.setattr("tokpack.evaluation.CE_ELEMENTS", 5 * gpt.config.vocab_size)
    assert tokpack.evaluate(gpt, build_loader(windows, 4), max_batches=batches) == whole
    assert max(calls) == 5 and len(calls) > 2 * batches


def test_evaluate_stays_a_function_after_its_command_is_imported_and_prepare_is_the_write_wing():
    import tokpack.evaluate  # noqa: F401 - the `python -m tokpack.evaluate` package
    import tokpack.prepare
    from tokpack import evaluate
    from tokpack.prepare import PrepareConfig, prepare

    assert type(evaluate).__name__ == "function" and evaluate.__module__ == "tokpack.evaluation"
    assert tokpack.evaluate is evaluate
    assert prepare.__module__ == "tokpack.prepare.run" and tokpack.prepare.prepare is prepare
    assert tokpack.PrepareConfig is PrepareConfig


def test_ids_a_model_cannot_index_are_refused_before_any_batch(prepared):
    model = GPT(GPTConfig(vocab_size=1000, block_size=16, n_layer=1, n_head=2, n_embd=16))
    loader = build_loader(TokenWindows(prepared / "val.bin", 16, stride=16), 4)
    with pytest.raises(ValueError, match=r"the data holds token id \d+ but GPT's vocab_size is 1000"):
        tokpack.evaluate(model, loader)


def test_ranks_in_the_environment_without_a_group_are_one_line_from_the_clis(prepared):
    import os

    env = {key: value for key, value in os.environ.items() if key not in ("MASTER_ADDR", "MASTER_PORT")}
    env.update(RANK="1", WORLD_SIZE="2")
    done = subprocess.run([sys.executable, "-m", "tokpack.check", str(prepared)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        line for line in done.stderr.strip().splitlines() if "WORLD_SIZE=2 is set but torch.distributed" in line]
    # The evaluation command joins torchrun's group itself: without torchrun's rendezvous, one line with the fix.
    done = subprocess.run([sys.executable, "-m", "tokpack.evaluate", str(prepared), "--model", "unigram"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "WORLD_SIZE=2 is set but MASTER_ADDR and MASTER_PORT are not" in done.stderr and "torchrun" in done.stderr


def test_an_endless_loader_is_refused_at_once_or_cut_by_max_batches(prepared):
    model = GPT(GPTConfig(vocab_size=50304, block_size=16, n_layer=1, n_head=2, n_embd=16))
    for data in (TokenWindows(prepared, 16, split="train"), PackedDocuments(prepared, 16, split="train")):
        loader = build_loader(data, 4)
        with pytest.raises(ValueError, match="evaluate needs a finite loader.*stride=.*max_batches="):
            tokpack.evaluate(model, loader)
        assert tokpack.evaluate(model, loader, max_batches=3)["windows"] == 12
    with pytest.raises(ValueError, match="max_batches=0 must be at least 1"):
        tokpack.evaluate(model, build_loader(TokenWindows(prepared, 16, split="val", stride=16), 4), max_batches=0)


def test_every_public_name_is_exported_and_visible_to_static_analysis():
    assert set(tokpack.__all__) == {"__version__", *tokpack._EXPORTS}
    assert all(getattr(tokpack, name) is not None for name in tokpack._EXPORTS)


# -- bits per byte: nanochat's convention, and the same number through any tokenizer -----------

def _nanochat_bpb(model, loader, token_bytes):
    """nanochat's evaluate_bpb, as a miniature: the loss of targets with bytes, over their bytes."""
    total_nats, total_bytes = 0.0, 0
    with torch.no_grad():
        for x, y in loader:
            loss2d = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-100, reduction="none")
            y = y.flatten()
            valid = y >= 0
            num_bytes = torch.where(valid, token_bytes[torch.where(valid, y, 0)], 0)
            total_nats += (loss2d * (num_bytes > 0)).sum().item()
            total_bytes += num_bytes.sum().item()
    return total_nats / (math.log(2) * total_bytes)


def test_bits_per_byte_is_nanochats_evaluate_bpb(prepared):
    enc = load_encoding("gpt2")
    token_bytes = torch.tensor([0 if i == enc.eot_token else len(enc.token_bytes(i))
                                for i in range(enc.n_vocab)])
    model = GPT(GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=16), seed=3).double().eval()
    loader = build_loader(TokenWindows(prepared, 16, stride=16, split="val"), 4)
    assert sum(int((y == enc.eot_token).sum()) for _, y in loader) > 5  # end-of-text targets are scored
    result = tokpack.evaluate(model, loader)
    assert result["bits_per_byte"] == pytest.approx(_nanochat_bpb(model, loader, token_bytes), rel=1e-9)
    # Counting <|endoftext|> as its 13 characters, with its loss, gives another number.
    eot_as_text = byte_lengths(enc) + 13 * (np.arange(enc.n_vocab) == enc.eot_token)
    as_text = tokpack.evaluate(model, loader, token_bytes=eot_as_text)
    assert abs(as_text["bits_per_byte"] / result["bits_per_byte"] - 1) > 0.01


def test_bits_per_byte_does_not_depend_on_the_tokenizer(tmp_path):
    gpt2 = load_encoding("gpt2")
    # A second tokenizer: cl100k's split pattern over gpt2's first 3,000 merges.
    ranks = {gpt2.token_bytes(i): i for i in range(3000)}
    small = TiktokenEncoder(tiktoken.Encoding("small", pat_str=CL100K_PATTERN, mergeable_ranks=ranks,
                                              special_tokens={"<|endoftext|>": 3000}))
    docs = make_docs(40, words=80) + ["naïve café — 日本語 ünïcödé, 12345 's 'll\n\n  tabs\tand  spaces"]
    text = b"".join(d.encode() for d in docs)
    counts = np.bincount(np.frombuffer(text, dtype=np.uint8), minlength=256) + 1
    byte_logp = np.log(counts / counts.sum())
    expected = -sum(byte_logp[b] for b in text) / math.log(2) / len(text)
    results = {}
    for enc in (gpt2, small):
        ids = [t for d in docs for t in (enc.eot_token, *enc.encode_ordinary(d))]  # --eot prepend: all text scored
        path = tmp_path / f"{enc.name}.bin"
        np.asarray(ids, dtype=np.uint16).tofile(path)
        loader = build_loader(TokenWindows(path, 32, stride=32, dtype="uint16"), 4)
        model = byte_unigram(enc, byte_logp)
        results[enc.name] = (len(ids), tokpack.evaluate(model, loader, token_bytes=byte_lengths(enc)))
    (n_gpt2, gpt2_result), (n_small, small_result) = results.values()
    assert n_small > 1.2 * n_gpt2 and abs(small_result["loss"] / gpt2_result["loss"] - 1) > 0.1  # other tokens
    assert gpt2_result["bits_per_byte"] == pytest.approx(expected, rel=1e-9)
    assert small_result["bits_per_byte"] == pytest.approx(expected, rel=1e-9)


def test_models_that_take_use_cache_are_given_false(prepared):
    # Hugging Face's causal LMs build a cache before they read position_ids: scoring needs none.
    seen = []

    class CacheMinded(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gpt = GPT(GPTConfig(vocab_size=50304, block_size=16, n_layer=1, n_head=2, n_embd=16))

        def forward(self, input_ids, use_cache=True):
            seen.append(use_cache)
            return self.gpt(input_ids)

    result = tokpack.evaluate(CacheMinded(), build_loader(TokenWindows(prepared, 16, split="val", stride=16), 4))
    assert result["tokens"] > 0 and seen and set(seen) == {False}


def test_a_models_own_loss_is_used_only_when_it_is_the_plain_cross_entropy(prepared, monkeypatch):
    # nanoGPT's forward computes its loss whenever it is given targets: evaluate uses it rather than
    # a second cross-entropy, once the first batch shows it to be the plain mean over the targets.
    val = np.asarray(open_tokens(prepared / "val.bin"))
    model = NanoGPTShaped(V, 16).eval()
    expected = _direct_model_loss(model, val, 16)
    calls = []
    real = F.cross_entropy
    monkeypatch.setattr(F, "cross_entropy", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    loader = build_loader(TokenWindows(prepared, 16, stride=16, split="val"), 4)
    result = tokpack.evaluate(model, loader)
    assert result["loss"] == pytest.approx(expected, rel=1e-6) and len(loader) > 3
    # Positions put through a float32 cross-entropy (the few end-of-text targets go in float64):
    # the model's own each batch, and one check of it on the first, in slices or whole.
    scored = sum(logits.shape[0] for logits in calls if logits.dtype == torch.float32)
    assert scored == (len(loader) + 1) * 4 * 16

    class WithAuxLoss(torch.nn.Module):  # a loss that is not the plain mean: never taken as the sum
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, idx, targets=None):
            logits, loss = self.inner(idx, targets)
            return logits, loss + 0.25

    assert tokpack.evaluate(WithAuxLoss(), loader)["loss"] == pytest.approx(expected, rel=1e-6)
