"""scripts/train_gpt.py, run as a user runs it: straight, interrupted and resumed, and under torchrun."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from helpers import ROOT, make_chats, make_docs, prepare_docs, script, write_jsonl, write_nanochat_spec
from tokpack.format import read_meta
from tokpack.prepare import PrepareConfig, prepare
from tokpack.plot import png_size


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A folder with a small val split: each evaluation takes a 50,257-way softmax a token."""
    return prepare_docs(tmp_path_factory.mktemp("train_gpt"), make_docs(40, words=200), val_fraction=0.1)


TINY = ["--block-size", "16", "--batch-size", "4", "--n-layer", "1", "--n-head", "2", "--n-embd", "16",
        "--warmup-iters", "2", "--eval-interval", "4", "--eval-batch-size", "32", "--log-interval", "100"]


def train(prepared, out, *args, launcher=(sys.executable,)):
    done = subprocess.run([*launcher, str(ROOT / "scripts" / "train_gpt.py"), "--data-dir", str(prepared),
                           "--out-dir", str(out), *TINY, *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def losses(out, rank=0):
    return [json.loads(line) for line in (out / f"losses-rank{rank}.jsonl").read_text().splitlines()]


PACKED = ["--packing", "bestfit", "--split-long", "--buffer-size", "8"]


@pytest.mark.e2e
def test_resume_gives_the_uninterrupted_losses_and_parameters(prepared, tmp_path):
    """With packed, document-masked rows (the sample config's); windows resume in test_loader."""
    k = 3  # evaluations at step 4 and the end: the interruption falls between them
    train(prepared, tmp_path / "straight", "--max-iters", str(2 * k), *PACKED)
    train(prepared, tmp_path / "resumed", "--max-iters", str(2 * k), "--stop-at", str(k), *PACKED)
    assert [r["step"] for r in losses(tmp_path / "resumed")] == list(range(1, k + 1))
    done = train(prepared, tmp_path / "resumed", "--max-iters", str(2 * k), "--resume", "--plot", *PACKED)
    assert "PackedDocuments(" in done.stdout and "val_documents loss" in done.stdout
    assert f"train_gpt: {tmp_path / 'resumed' / 'losses.png'} ({2 * k} steps, val " in done.stdout
    assert png_size(tmp_path / "resumed" / "losses.png") == (800, 450)
    straight, resumed = losses(tmp_path / "straight"), losses(tmp_path / "resumed")
    assert [r["step"] for r in straight] == list(range(1, 2 * k + 1))
    assert resumed == straight
    a = torch.load(tmp_path / "straight" / "ckpt.pt", weights_only=True)
    b = torch.load(tmp_path / "resumed" / "ckpt.pt", weights_only=True)
    assert a["step"] == b["step"] == 2 * k and a["loader"] == b["loader"]
    assert all(torch.equal(a["model"][name], b["model"][name]) for name in a["model"])
    assert [e["loss"] for e in a["evals"]] == [e["loss"] for e in b["evals"]] and len(a["evals"]) == 4
    train(prepared, tmp_path / "resumed", "--max-iters", str(2 * k + 2), "--resume", *PACKED)  # a longer run continues
    assert [r["step"] for r in losses(tmp_path / "resumed")] == list(range(1, 2 * k + 3))


@pytest.mark.e2e
def test_sft_on_conversations_starts_from_a_pretrained_checkpoint_and_scores_what_the_assistant_says(tmp_path):
    spec = write_nanochat_spec(tmp_path / "tok")
    text = prepare_docs(tmp_path / "text", make_docs(30, words=100), val_fraction=0.2, encoding=str(spec))
    chat = tmp_path / "chat"
    prepare(PrepareConfig(inputs=(str(write_jsonl(tmp_path / "c.jsonl", make_chats(80))),), out_dir=str(chat),
                          encoding=str(spec), chat="nanochat", quiet=True))
    train(text, tmp_path / "base", "--max-iters", "2")
    # With a learning rate of 0 the fine-tuned weights stay the pretrained ones: they were loaded.
    train(chat, tmp_path / "sft", "--max-iters", "2", "--init-from", str(tmp_path / "base" / "ckpt.pt"),
          "--learning-rate", "0", "--min-lr", "0", "--packing", "bestfit-pad", "--buffer-size", "8")
    base = torch.load(tmp_path / "base" / "ckpt.pt", weights_only=True)["model"]
    sft = torch.load(tmp_path / "sft" / "ckpt.pt", weights_only=True)
    assert all(torch.equal(base[name], sft["model"][name]) for name in base)
    evals = [e for e in sft["evals"] if "scope" not in e]
    assert evals[-1]["tokens"] == read_meta(chat)["splits"]["val"]["supervised"]  # the assistant's targets alone
    assert all(r["loss"] == r["loss"] for r in losses(tmp_path / "sft"))  # never NaN
    # windows at random starts, one a batch: many would fall inside a user's turn
    train(chat, tmp_path / "windows", "--max-iters", "12", "--batch-size", "1", "--packing", "none")
    assert len(losses(tmp_path / "windows")) == 12 and all(r["loss"] == r["loss"] for r in losses(tmp_path / "windows"))


@pytest.mark.parametrize("args,fragment", [
    (["--resume"], "--resume needs"),
    (["--device", "cuda"], "this torch has no CUDA device"),
    (["--n-layer", "x"], "argument --n-layer: invalid int value"),
    (["--packing", "greedy"], "[data] packing 'greedy' is not one of none, aligned, bestfit, bestfit-pad"),
])
def test_bad_runs_are_one_line_and_leave_no_folder(prepared, tmp_path, args, fragment, capsys):
    if args[0] == "--device" and torch.cuda.is_available():
        pytest.skip("CUDA is present")
    with pytest.raises(SystemExit) as exc:  # in process: the script's main, as its __main__ calls it
        script("train_gpt").main(["--data-dir", str(prepared), "--out-dir", str(tmp_path / "out"), *args])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(lines) == 1 and fragment in lines[0], lines
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e
def test_ddp_under_torchrun_each_rank_draws_its_own_reproducible_stream(prepared, tmp_path):
    launcher = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")
    runs = []
    for name in ("first", "second"):
        done = train(prepared, tmp_path / name, "--max-iters", "3", launcher=launcher)
        assert "val loss" in done.stdout
        runs.append([losses(tmp_path / name, rank) for rank in (0, 1)])
    assert runs[0] == runs[1]
    rank0, rank1 = runs[0]
    assert len(rank0) == len(rank1) == 3 and rank0 != rank1
