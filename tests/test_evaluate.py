from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import torch

import tokpack
from tokpack.evaluate import main, sweep
from tokpack.format import open_tokens
from tokpack.gpt import GPT, GPTConfig, NGram, gpt_checkpoint
from tokpack.loader import build_loader
from tokpack.tokenizer import load_encoding
from tokpack.windows import TokenWindows

V = 50257


def _direct_loss(train: np.ndarray, val: np.ndarray, order: int, k: float = 0.01) -> float:
    """Mean -log p over every val target, from counts taken with plain Python."""
    if order == 1:
        counts = Counter(train.tolist())
        return -float(np.mean([math.log((counts[t] + k) / (len(train) + k * V)) for t in val[1:].tolist()]))
    pairs = Counter(zip(train[:-1].tolist(), train[1:].tolist()))
    rows = Counter(train[:-1].tolist())
    return -float(np.mean([math.log((pairs[(a, b)] + k) / (rows[a] + k * V))
                           for a, b in zip(val[:-1].tolist(), val[1:].tolist())]))


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("T,S", [(32, 32), (32, 24)])
def test_ngram_losses_match_a_direct_computation(prepared, order, T, S):
    train, val = (np.asarray(open_tokens(prepared / f"{s}.bin")) for s in ("train", "val"))
    model = NGram(prepared / "train.bin", V, order)
    result = tokpack.evaluate(model, build_loader(TokenWindows(prepared / "val.bin", T, stride=S), 4))
    assert result["tokens"] == len(val) - 1
    assert result["loss"] == pytest.approx(_direct_loss(train, val, order), rel=1e-6)
    assert result["ppl"] == pytest.approx(math.exp(result["loss"]))
    assert result["bits_per_token"] == pytest.approx(result["loss"] / math.log(2))
    text_bytes = len(load_encoding("gpt2").decode_bytes(val[1:].tolist()))
    assert result["bits_per_byte"] == pytest.approx(result["loss"] * result["tokens"] / math.log(2) / text_bytes)


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


def test_gpt_checkpoint_sweep_and_bad_inputs(prepared, tmp_path, capsys):
    model = GPT(GPTConfig(block_size=32, n_layer=1, n_head=2, n_embd=16), seed=0)
    torch.save(gpt_checkpoint(model), tmp_path / "ckpt.pt")
    assert main([str(prepared), "--checkpoint", str(tmp_path / "ckpt.pt"), "--stride", "32", "16", "--quiet"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    rows = json.loads(out[-1])
    assert [r["stride"] for r in rows] == [32, 16] and abs(rows[0]["loss"] - math.log(V)) < 1.0
    small = GPT(GPTConfig(vocab_size=1000, block_size=32, n_layer=1, n_head=2, n_embd=16))
    torch.save(gpt_checkpoint(small), tmp_path / "small.pt")
    cases = {
        "has vocab_size 1000 but": ["--checkpoint", str(tmp_path / "small.pt")],
        "is longer than ckpt.pt's block size 32": ["--checkpoint", str(tmp_path / "ckpt.pt"), "--block-size", "64"],
        "split 'test' is not in": ["--model", "bigram", "--split", "test"],
        "stride 0 must lie in 1..block_size": ["--model", "bigram", "--stride", "0"],
        "stride 300 must lie in 1..block_size": ["--model", "bigram", "--block-size", "32", "--stride", "300"],
        "not a tokpack GPT checkpoint": ["--checkpoint", str(prepared / "meta.json")],
    }
    for fragment, argv in cases.items():
        with pytest.raises(SystemExit) as exc:
            main([str(prepared), *argv, "--quiet"])
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and fragment in err and "\n" not in err, (fragment, err)


def test_sums_over_ranks_equal_one_process(prepared):
    single = sweep(prepared, baselines=["bigram"], block_size=16, strides=[16], batch_size=2, quiet=True)[0]
    windows = single["windows"]
    assert windows % 3 != 0  # shares are uneven for 2 and 3 ranks
    for world in (1, 2, 3):
        done = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
             "-m", "tokpack.evaluate", str(prepared), "--model", "bigram", "--block-size", "16",
             "--batch-size", "2", "--quiet"],
            capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        row = json.loads(done.stdout.strip().splitlines()[-1])[0]
        assert row["tokens"] == single["tokens"] and row["windows"] == windows
        assert row["loss"] == pytest.approx(single["loss"], rel=1e-12)
        assert row["bits_per_byte"] == pytest.approx(single["bits_per_byte"], rel=1e-12)


def test_gpt_shapes_and_limits():
    model = GPT(GPTConfig(vocab_size=100, block_size=8, n_layer=1, n_head=2, n_embd=8), seed=3)
    assert model(torch.zeros(2, 8, dtype=torch.long)).shape == (2, 8, 100)
    same = GPT(GPTConfig(vocab_size=100, block_size=8, n_layer=1, n_head=2, n_embd=8), seed=3)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), same.parameters()))
    with pytest.raises(ValueError, match="longer than the model's block_size 8"):
        model(torch.zeros(1, 9, dtype=torch.long))
