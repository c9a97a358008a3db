"""The code of the README and of docs/, run as written: each example in its own interpreter, as a
user's script or shell would run it (a prelude supplies what the host script defines, a postlude
checks the result). Every Python block is an example or says why it is not run."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import ROOT, make_chats, make_docs, write_docs, write_jsonl

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:<!-- (example: [\w-]+|not run: [^>]+) -->\n)?```(\w*)\n(.*?)```", re.S)


def _blocks() -> list[tuple[Path, str | None, str, str]]:
    """(page, marker, language, code) of every fenced block."""
    return [(page, marker, language, code) for page in PAGES
            for marker, language, code in BLOCK.findall(page.read_text("utf-8"))]


def example(name: str) -> str:
    found = [code for _, marker, _, code in _blocks() if marker == f"example: {name}"]
    assert len(found) == 1, f"{len(found)} examples named {name!r} in README.md and docs/"
    return found[0]


def run(tmp_path: Path, prepared: Path, code: str) -> subprocess.CompletedProcess:
    (tmp_path / "data").mkdir(exist_ok=True)
    shutil.copytree(prepared, tmp_path / "data" / "sample", dirs_exist_ok=True)
    script = tmp_path / "script.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)


RUN_BY_TESTS = {"nanogpt", "torchdata", "packed", "tour-prepare", "tour-packed", "tour-evaluate", "prepare-api",
                "documents", "train-tokenizer", "tour-chat", "tour-guard"}


def test_every_python_block_is_run_or_says_why_not_and_every_example_is_run():
    unmarked = [f"{page.name}: {code.splitlines()[0]}" for page, marker, language, code in _blocks()
                if language == "python" and not marker]
    assert not unmarked, f"Python blocks that are neither examples nor 'not run': {unmarked}"
    named = {marker.removeprefix("example: ") for _, marker, _, _ in _blocks() if marker.startswith("example")}
    assert named == RUN_BY_TESTS
    linked = set(re.findall(r"\(docs/([\w-]+\.md)\)", (ROOT / "README.md").read_text("utf-8")))
    assert linked == {p.name for p in PAGES[1:]}  # every docs page is reachable from the README


def test_the_tour_commands_run_as_typed(tmp_path):
    write_docs(tmp_path / "corpus", make_docs(40, words=120))
    for argv in _commands("tour-prepare"):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert done.returncode == 0, (argv, done.stderr[-2000:])
    assert (tmp_path / "data" / "web" / "meta.json").is_file() and list((tmp_path / "data" / "shards").glob("*.bin"))


def test_the_tour_guard_commands_run_as_typed(tmp_path):
    docs = make_docs(60, words=120)
    write_docs(tmp_path / "corpus", docs + docs[:6])
    write_jsonl(tmp_path / "questions.jsonl", [{"question": " ".join(d.split()[10:40])} for d in docs[:4]])
    shown = ""
    for argv in _commands("tour-guard"):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert done.returncode == 0, (argv, done.stderr[-2000:])
        shown = done.stdout
    guard = json.loads((tmp_path / "data" / "guarded" / "meta.json").read_text())["guard"]
    assert guard["dedup"]["removed"] == [6] and guard["decontaminate"]["removed"] >= 1
    assert "val: no near-copy of a train document" in shown


def test_the_tour_chat_commands_run_as_typed(tmp_path):
    pytest.importorskip("rustbpe")
    write_docs(tmp_path / "corpus", make_docs(40, words=120))
    write_jsonl(tmp_path / "chats.jsonl", make_chats(40))
    for argv in _commands("tour-chat"):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert done.returncode == 0, (argv, done.stderr[-2000:])
    meta = json.loads((tmp_path / "data" / "sft" / "meta.json").read_text())
    assert meta["chat"]["conversations"] == 40 and (tmp_path / "data" / "sft" / "train.mask").is_file()


def _commands(name: str) -> list[list[str]]:
    """The commands of a shell example, each as argv with this interpreter for ``python``."""
    commands = []
    for line in example(name).splitlines():
        argv = shlex.split(line.split("#")[0])
        assert argv[:2] == ["python", "-m"], line
        commands.append([sys.executable, *argv[1:]])
    return commands


def test_the_tour_evaluation_commands_run_as_typed(tmp_path, prepared):
    import torch

    from tokpack.models import GPT, GPTConfig, gpt_checkpoint

    shutil.copytree(prepared, tmp_path / "data" / "sample")
    (tmp_path / "out" / "sample").mkdir(parents=True)
    model = GPT(GPTConfig(vocab_size=50257, block_size=32, n_layer=1, n_head=2, n_embd=16), seed=0)
    torch.save(gpt_checkpoint(model), tmp_path / "out" / "sample" / "ckpt.pt")
    for argv in _commands("tour-evaluate"):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert done.returncode == 0 and "bigram" in done.stdout, (argv, done.stderr[-2000:])
    assert (tmp_path / "sweep.png").stat().st_size > 1000


def test_the_tokenizer_training_commands_run_as_typed(tmp_path):
    pytest.importorskip("rustbpe")
    from pydoc_data.topics import topics

    texts = [text for _, text in sorted(topics.items())]
    write_docs(tmp_path / "corpus", texts[:40])
    write_docs(tmp_path / "val", texts[40:50])
    for argv in _commands("train-tokenizer"):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert done.returncode == 0, (argv, done.stderr[-2000:])
    assert (tmp_path / "data" / "mine" / "meta.json").is_file() and (tmp_path / "tok" / "tokenizer.json").is_file()


def test_prepare_from_python_as_the_docs_show(tmp_path, prepared):
    write_docs(tmp_path / "docs", make_docs(20))
    check = ('\nassert result["splits"]["train"]["tokens"] > 0 and result["stats"]["out_dir"] == "data/web"\n'
             'print("ok")\n')
    done = run(tmp_path, prepared, example("prepare-api") + check)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_nanogpt_get_batch_replacement_runs_in_an_unguarded_script(tmp_path, prepared):
    prelude = 'import torch\ndata_dir, block_size, batch_size, device = "data/sample", 32, 4, "cpu"\n'
    check = textwrap.dedent("""
        for split in ("train", "val", "train"):
            x, y = get_batch(split)
            assert x.shape == y.shape == (batch_size, block_size) and x.dtype == torch.int64
            assert torch.equal(x[:, 1:], y[:, :-1])
        print("ok")
    """)
    done = run(tmp_path, prepared, prelude + example("nanogpt") + check)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_tours_packed_rows_start_at_a_document(tmp_path, prepared):
    prelude = 'data_dir, block_size, batch_size = "data/sample", 32, 4\n'
    check = textwrap.dedent("""
        assert x.shape == y.shape == position_ids.shape == (batch_size, block_size)
        assert (x[:, 0] == 50256).all() and (position_ids[:, 0] == 0).all() and cu_seqlens[0] == 0
        print("ok")
    """)
    done = run(tmp_path, prepared, prelude + example("tour-packed") + check)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_documents_example_pads_buckets_mixes_and_streams(tmp_path, prepared):
    for name, seed in (("web", 1), ("code", 2)):
        write_docs(tmp_path / name, make_docs(30, seed=seed, words=150))
    write_docs(tmp_path / "raw", make_docs(20, seed=3, words=150))
    prelude = textwrap.dedent("""
        from tokpack.prepare import PrepareConfig, prepare
        for name in ("web", "code"):
            prepare(PrepareConfig(inputs=(name,), out_dir=f"data/{name}", quiet=True))
        my_labels = [i % 2 for i in range(len(__import__("tokpack").DocumentDataset("data/sample/train.bin", 8)))]
    """)
    check = textwrap.dedent("""
        assert set(batch) == {"input_ids", "attention_mask", "labels"} and batch["input_ids"].shape[0] == 16
        shares = mix.realised(mixed)
        assert set(shares) == {"web", "code"}
        print("ok")
    """)
    done = run(tmp_path, prepared, prelude + example("documents") + check)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_stateful_dataloader_snippet_resumes_exactly(tmp_path, prepared):
    pytest.importorskip("torchdata.stateful_dataloader")
    check = textwrap.dedent("""
        import torch
        nxt = next(iter(resumed))
        straight = StatefulDataLoader(train, batch_sampler=EpochSampler(len(train), 8, seed=0),
                                      collate_fn=collate_windows)
        batches = [b for _, b in zip(range(5), straight)]
        assert torch.equal(nxt.x, batches[4].x) and torch.equal(nxt.y, batches[4].y)
        print("ok")
    """)
    code = "if __name__ == '__main__':\n" + textwrap.indent(example("torchdata") + check, "    ")
    done = run(tmp_path, prepared, code)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_packed_loop_trains_resumes_and_scores_each_document(tmp_path, prepared):
    prelude = 'data_dir, block_size, batch_size, device, max_iters = "data/sample", 32, 4, "cpu", 3\n'
    check = textwrap.dedent("""
        expected, resumed = next(batches), next(iter(train_loader(state)))  # the loop's next batch, restored
        assert all(torch.equal(a, b) for a, b in zip(expected[:4], resumed[:4]))
        assert (expected.x[:, 0] == 50256).all()  # every row starts at a document, with its BOS
        from tokpack.split import open_split
        n = int(open_split(data_dir, "val").lengths.sum())
        assert result["tokens"] == n  # an append folder: each document's tokens, each after its inserted BOS
        print("ok", result["loss"])
    """)
    done = run(tmp_path, prepared, prelude + example("packed") + check)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
