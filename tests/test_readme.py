"""The README's client snippets, run as written (a prelude supplies what the host script defines,
a postlude checks the result), each in its own interpreter as a user's script would run."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from helpers import ROOT


def example(name: str) -> str:
    readme = (ROOT / "README.md").read_text("utf-8")
    match = re.search(rf"<!-- example: {name} -->\n```python\n(.*?)```", readme, re.S)
    assert match, f"README has no example {name!r}"
    return match.group(1)


def run(tmp_path, prepared, code: str) -> subprocess.CompletedProcess:
    (tmp_path / "data").mkdir(exist_ok=True)
    shutil.copytree(prepared, tmp_path / "data" / "sample", dirs_exist_ok=True)
    script = tmp_path / "script.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)


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
