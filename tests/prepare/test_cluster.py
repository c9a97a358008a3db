"""prepare under real torchrun: shares by rank, one meta.json, the single-process bytes."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys

import pytest

from helpers import make_docs, write_docs
from tokpack.format import read_meta
from tokpack.prepare import PrepareConfig, prepare
from tokpack.storage import LocalFile
from tokpack.verify import verify_folder


@pytest.fixture
def corpus(tmp_path):
    """Text files, a large jsonl that ranks cut at line starts, and a gzip file that goes whole."""
    import gzip

    folder = write_docs(tmp_path / "corpus", make_docs(12, words=300))
    docs = make_docs(120, seed=3, words=150)
    (folder / "big.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    with gzip.open(folder / "more.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps({"text": d}) + "\n" for d in make_docs(15, seed=4)))
    return folder


def _torchrun(*args, nproc, node=None, port=None, quiet=True):
    launch = ["--standalone"] if node is None else ["--nnodes=2", f"--node-rank={node}", "--master-addr=127.0.0.1",
                                                    f"--master-port={port}"]
    return [sys.executable, "-m", "torch.distributed.run", *launch, f"--nproc-per-node={nproc}",
            "-m", "tokpack.prepare", *args, *(["--quiet"] if quiet else []), "--workers", "1"]


def _split_bytes(folder, split):
    info = read_meta(folder)["splits"][split]
    files = info["shards"] if "shards" in info else [info["bin"]]
    return b"".join((folder / f["file"]).read_bytes() for f in files)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.e2e
def test_any_world_size_gives_the_single_process_bytes(tmp_path, corpus):
    single = tmp_path / "single"
    prepare(PrepareConfig(inputs=(str(corpus),), out_dir=str(single), quiet=True, val_fraction=0.2))
    budget = tmp_path / "budget"  # a val token budget: the same documents whichever rank reads them
    prepare(PrepareConfig(inputs=(str(corpus),), out_dir=str(budget), quiet=True, val_tokens=5000))
    runs = {}
    # 2 ranks here and 4 over two nodes below (one process under torchrun is the plain run); the
    # unit tests cut the input for 2, 3 and 7 units.
    out = tmp_path / "w2"
    done = subprocess.run(_torchrun(str(corpus), "--out-dir", str(out), "--val-tokens", "5000", nproc=2, quiet=False),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count(f"tokpack.prepare -> {out}") == 1, done.stdout  # the summary is rank 0's alone
    runs[2] = out
    port = _free_port()
    out = tmp_path / "nodes"
    nodes = [subprocess.Popen(_torchrun(str(corpus), "--out-dir", str(out), "--val-fraction", "0.2", nproc=2,
                                        node=node, port=port), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for node in (0, 1)]
    for proc in nodes:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    runs[4] = out
    for world, folder in runs.items():
        verify_folder(folder)
        meta = read_meta(folder)
        reference = budget if world == 2 else single
        assert meta["val"] == read_meta(reference)["val"]
        if world > 1:
            shards = meta["splits"]["train"]["shards"]
            assert len({s["file"].split("_")[1] for s in shards}) > 1, world  # several ranks wrote train shards
        for split in ("train", "val"):
            assert _split_bytes(folder, split) == (reference / f"{split}.bin").read_bytes(), (world, split)
            assert (folder / f"{split}.idx").read_bytes() == (reference / f"{split}.idx").read_bytes(), (world, split)
            assert meta["splits"][split]["documents"] == read_meta(reference)["splits"][split]["documents"]
        assert not [p for p in folder.iterdir() if p.name.startswith(".")]


@pytest.mark.e2e
def test_a_failing_rank_fails_every_rank_and_no_meta_appears(tmp_path, corpus):
    (corpus / "zz-bad.txt").write_bytes(b"fine text \xff broken")  # last in input order: the last rank's
    out = tmp_path / "out"
    done = subprocess.run(_torchrun(str(corpus), "--out-dir", str(out), nproc=2), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("tokpack:")]
    # The rank that reads it first says so: the guard's signing (whichever rank signs that unit) or
    # the tokenizing of the last rank's unit.
    assert lines and all(re.match(r"tokpack: rank [01]: ", line) and "zz-bad.txt is not valid UTF-8" in line
                         for line in lines), lines
    assert not out.exists() or not (out / "meta.json").exists() and not list(out.glob("*.bin"))
    assert not out.exists() or not [p for p in out.iterdir() if p.name.endswith("tokpack-tmp")]


@pytest.mark.parametrize("count", [2, 3, 7])
def test_units_cut_jsonl_at_line_starts_and_cover_every_record_once(corpus, count):
    from tokpack.prepare.plan.shares import share_of
    from tokpack.corpus import ReadOptions, documents
    from tokpack.inputs import resolve_inputs

    files = resolve_inputs([corpus])
    sizes = {f: f.stat().st_size for f in files}
    whole = ["".join(d) for d in documents(files, ReadOptions())]
    shares, texts = [], []
    for unit in range(count):
        share = share_of(files, sizes, unit, count)
        shares.append(share)
        texts += ["".join(d) for d in documents(share, ReadOptions())]
    assert texts == whole  # every document once, in input order
    cut = [entry for share in shares for entry in share if entry[0].name == "big.jsonl"]
    assert len(cut) > 1 and any(lo > 0 for _, lo, _ in cut)  # the large jsonl was cut inside


class _ThreadRank:
    """A rank of a world made of threads: what Ranks needs of a process group (all_gather)."""

    def __init__(self, rank, world, board, barrier):
        self.rank, self.world_size, self.board, self.barrier = rank, world, board, barrier

    def all_gather(self, obj):
        self.barrier.wait()
        self.board[self.rank] = obj
        self.barrier.wait()
        return list(self.board)


def _each_rank(world, fn):
    """fn(Ranks) on ``world`` thread ranks; each rank's result or error line, in rank order."""
    import threading

    from tokpack.prepare.executors.torchrun import Ranks

    board, barrier, results = [None] * world, threading.Barrier(world), [None] * world

    def run(rank):
        try:
            results[rank] = fn(Ranks(_ThreadRank(rank, world, board, barrier)))
        except ValueError as exc:
            results[rank] = str(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_ranks_that_see_other_inputs_all_refuse_naming_the_difference(tmp_path):
    import os
    files = [LocalFile(tmp_path / f"{i}.txt") for i in range(3)]
    for f in files:
        f.write_text("same text")
    views = {0: files, 1: files, 2: files}
    assert _each_rank(3, lambda r: r.check_same_inputs(views[r.rank])) == [None] * 3
    other = tmp_path / "node2"
    other.mkdir()
    for name, (text, mtime) in {"size": ("other text!", None), "mtime": ("same text", 10**18)}.items():
        copy = LocalFile(other / "1.txt")
        copy.write_text(text)
        if mtime:
            os.utime(copy, ns=(mtime, mtime))
        views[2] = [files[0], copy, files[2]]
        lines = _each_rank(3, lambda r: r.check_same_inputs(views[r.rank]))
        assert len(set(lines)) == 1 and lines[0].startswith("rank 2 sees other inputs than rank 0"), lines
        assert "cp -p" in lines[0]
    views[1] = files[:2]  # a glob that matched one file fewer
    lines = _each_rank(3, lambda r: r.check_same_inputs(views[r.rank]))
    assert lines[0].startswith("rank 1 sees other inputs") and "3 input files on rank 0, 2 there" in lines[0]


@pytest.mark.e2e
def test_nodes_whose_copies_of_the_corpus_differ_both_exit_2_before_writing(tmp_path, corpus):
    import shutil
    for node in (0, 1):
        shutil.copytree(corpus, tmp_path / f"node{node}" / "corpus")
    edited = sorted((tmp_path / "node1" / "corpus").glob("*.txt"))[0]
    edited.write_text(edited.read_text() + " one more sentence.")
    out, port = tmp_path / "out", _free_port()
    nodes = [subprocess.Popen(_torchrun("corpus", "--out-dir", str(out), nproc=1, node=node, port=port),
                              cwd=tmp_path / f"node{node}", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for node in (0, 1)]
    for proc in nodes:
        _, err = proc.communicate(timeout=300)
        lines = [line for line in err.splitlines() if line.startswith("tokpack:")]
        assert proc.returncode != 0 and len(lines) == 1, err[-3000:]
        assert f"rank 1 sees other inputs than rank 0 (corpus/{edited.name} is" in lines[0], lines
    assert not out.exists() or not list(out.iterdir())
