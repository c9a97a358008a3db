from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import (kill, make_docs, megatron_indexed, paused_at, peak_rss_mb_of_prepare, prepare_cmd,
                     run_module, write_docs, write_spec, write_tiktoken_file, write_web_jsonl)
from tokpack.storage import files as storage_files
from tokpack.prepare.config import launch
from tokpack.prepare.tokenize import writers
from tokpack.format import INDEX_DTYPE, read_meta
from tokpack.split import open_split, open_tokens
from tokpack.data.documents import DocumentDataset
from tokpack.inspect import describe
from tokpack.prepare import PrepareConfig, prepare
from tokpack.prepare.__main__ import main
from tokpack.tokenizer import load_encoding
from tokpack.verify import VerifyError, verify_folder
from tokpack.data.windows import TokenWindows

ENC = load_encoding("gpt2")


def _run(tmp_path: Path, *inputs, **options) -> Path:
    out = tmp_path / options.pop("out", "out")
    prepare(PrepareConfig(inputs=tuple(map(str, inputs)), out_dir=str(out), quiet=True, **options))
    return out


def _documents(folder: Path, split: str) -> list[list[int]]:
    tokens = open_tokens(folder / f"{split}.bin")
    starts = np.fromfile(folder / f"{split}.idx", dtype=INDEX_DTYPE).tolist() + [len(tokens)]
    return [tokens[a:b].tolist() for a, b in zip(starts, starts[1:])]


def _folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_one_document_matches_nanogpt_shakespeare_prepare(tmp_path, newline):
    text = "\n".join(f"FIRST CITIZEN {i}:\nBefore we proceed any further, hear me speak.\n" for i in range(300))
    (tmp_path / "input.txt").write_bytes(text.replace("\n", newline).encode())
    out = _run(tmp_path, tmp_path / "input.txt", piece_chars=64)
    with open(tmp_path / "input.txt", encoding="utf-8") as f:  # nanoGPT's prepare.py: text mode
        data = f.read()
    n = len(data)
    train_ids = ENC.encode_ordinary(data[: int(n * 0.9)])
    val_ids = ENC.encode_ordinary(data[int(n * 0.9):])
    assert (out / "train.bin").read_bytes() == np.array(train_ids, dtype=np.uint16).tobytes()
    assert (out / "val.bin").read_bytes() == np.array(val_ids, dtype=np.uint16).tobytes()
    meta = read_meta(out)
    assert meta["single_document"] and meta["eot"] == "none" and meta["dtype"] == "uint16"
    assert meta["text_newlines"] == "universal"
    assert meta["splits"]["train"]["documents"] == meta["splits"]["val"]["documents"] == 1


@pytest.mark.parametrize("eot", ["append", "prepend", "none"])
def test_every_document_is_encode_ordinary_of_the_whole(tmp_path, eot):
    docs = make_docs(40, words=400)
    docs[3] = "it contains <|endoftext|> as plain text " * 20
    out = _run(tmp_path, write_docs(tmp_path / "c", docs), eot=eot, piece_chars=50, val_fraction=0.3)
    expected = {}
    for doc in docs:
        ids = ENC.encode_ordinary(doc)
        expected[tuple({"append": ids + [50256], "prepend": [50256] + ids, "none": ids}[eot])] = doc
    got = _documents(out, "train") + _documents(out, "val")
    assert sorted(map(tuple, got)) == sorted(expected)
    assert len(_documents(out, "val")) > 0 and len(_documents(out, "train")) > 0


def test_output_is_byte_identical_for_any_thread_count_and_piece_size(tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "cores", lambda: 4)  # 3 threads even on 2 cores
    corpus = write_docs(tmp_path / "c", make_docs(30, words=600))
    runs = [_folder_bytes(_run(tmp_path, corpus, out=f"o{w}-{pc}", workers=w, piece_chars=pc))
            for w, pc in [(1, 1 << 18), (2, 1 << 18), (3, 40), (1, 7)]]
    assert all(run == runs[0] for run in runs[1:])


def test_split_follows_content_not_order_or_corpus_size(tmp_path):
    docs = make_docs(80)
    first = _run(tmp_path, write_docs(tmp_path / "a", docs), out="pa", val_fraction=0.25)
    grown = _run(tmp_path, write_docs(tmp_path / "b", docs[::-1] + make_docs(40, seed=9)), out="pb", val_fraction=0.25)
    val_a = {tuple(d) for d in _documents(first, "val")}
    val_b = {tuple(d) for d in _documents(grown, "val")}
    assert val_a and val_a <= val_b
    assert not val_a & {tuple(d) for d in _documents(grown, "train")}
    other_seed = _run(tmp_path, tmp_path / "a", out="pc", val_fraction=0.25, seed=7)
    assert {tuple(d) for d in _documents(other_seed, "val")} != val_a


def test_jsonl_dtype_uint32_and_meta_records_inputs_and_options(tmp_path):
    lines = [json.dumps({"body": d}) for d in make_docs(20)]
    (tmp_path / "c.jsonl").write_text("\n".join(lines))
    with pytest.warns(UserWarning, match="--doc-sep has no effect: every input is .jsonl"):
        out = _run(tmp_path, tmp_path / "c.jsonl", jsonl_key="body", dtype="uint32", val_fraction=0.4, doc_sep="##")
    meta = read_meta(out)
    assert meta["dtype"] == "uint32" and open_tokens(out / "train.bin").dtype == np.uint32
    size = (tmp_path / "c.jsonl").stat().st_size
    assert meta["inputs"]["given"] == [{"path": str(tmp_path / "c.jsonl"), "files": 1, "bytes": size}]
    assert meta["inputs"]["bytes"] == size and len(meta["inputs"]["listing_sha256"]) == 64
    assert meta["options"]["jsonl_key"] == "body" and meta["encoding"]["n_vocab"] == 50257
    assert sum(s["documents"] for s in meta["splits"].values()) == 20
    assert verify_folder(out)["train"] == meta["splits"]["train"]["tokens"]


def test_large_documents_spill_to_disk_and_stay_exact(tmp_path, monkeypatch):
    monkeypatch.setattr(writers, "SPILL_TOKENS", 100)
    monkeypatch.setattr(writers, "INDEX_FLUSH", 3)  # the index is written in several blocks too
    docs = make_docs(12, words=500)
    out = _run(tmp_path, write_docs(tmp_path / "c", docs), piece_chars=64, val_fraction=0.3)
    got = sorted(map(tuple, _documents(out, "train") + _documents(out, "val")))
    assert got == sorted(tuple(ENC.encode_ordinary(d) + [50256]) for d in docs)
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_cli_warns_in_one_line_when_an_option_has_no_effect(tmp_path, capsys):
    corpus = write_docs(tmp_path / "c", make_docs(20))
    assert main([str(corpus), "--out-dir", str(tmp_path / "o"), "--jsonl-key", "body", "--quiet"]) == 0
    err = capsys.readouterr().err.strip()
    assert err == "tokpack: warning: --jsonl-key 'body' has no effect: no input is .jsonl"


def test_existing_folder_needs_force(tmp_path):
    corpus = write_docs(tmp_path / "c", make_docs(20))
    out = _run(tmp_path, corpus, val_fraction=0.3)
    with pytest.raises(ValueError, match="already holds a prepared corpus; pass --force"):
        _run(tmp_path, corpus, val_fraction=0.3)
    _run(tmp_path, corpus, val_fraction=0.5, force=True)
    assert read_meta(out)["options"]["val_fraction"] == 0.5


def _cli_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tokpack: ") and "\n" not in err and "Traceback" not in err
    return err


BAD_INPUTS = {  # the fragment of the one line -> the command line ({tmp}: the test's folder)
    "does not exist": ["{tmp}/missing.txt"],
    "holds no readable files": ["{tmp}/empty"],
    "holds no text": ["{tmp}/blank"],
    "not valid UTF-8 at byte 3": ["{tmp}/bad.txt"],
    "leaves a split empty": ["{tmp}/tiny.txt"],
    "val split would be empty": ["{tmp}/good", "--val-fraction", "0.0001"],
    "strictly between 0 and 1": ["{tmp}/good", "--val-fraction", "1.5"],
    "unknown encoding 'bogus'": ["{tmp}/good", "--encoding", "bogus"],
    "uint16 cannot hold encoding 'big'": ["{tmp}/good", "--encoding", "{tmp}/big.toml", "--dtype", "uint16"],
    "named cl100k_base but holds another vocabulary": ["{tmp}/good", "--encoding", "{tmp}/cl100k_base.tiktoken"],
    "cannot create output folder": ["{tmp}/good", "--out-dir", "{tmp}/afile/sub"],
    "lies inside the corpus": ["{tmp}/good", "--out-dir", "{tmp}/good/prepared"],
    "cut.txt.gz is not a readable gzip file": ["{tmp}/cut.txt.gz", "{tmp}/good"],
    "r.jsonl:1 has 'text' of type int": ["{tmp}/good", "{tmp}/r.jsonl"],
    "seed = 1180591620717411303424 in the command line is not an integer": ["{tmp}/good", "--seed", str(2**70)],
    "would be overwritten by the output": ["{tmp}/ow/../ow/val.idx", "--out-dir", "{tmp}/ow"],
}


@pytest.mark.parametrize("fragment", list(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(tmp_path, capsys, fragment):
    write_docs(tmp_path / "good", make_docs(20))
    (tmp_path / "empty").mkdir()
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "a.txt").write_text("")
    (tmp_path / "bad.txt").write_bytes(b"ok \xc3\x28 bad")
    (tmp_path / "tiny.txt").write_text("a")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "ow").mkdir()
    (tmp_path / "ow" / "val.idx").write_text("not a corpus to overwrite")
    if "'big'" in fragment:
        write_spec(tmp_path, "big")
    if "cl100k" in fragment:
        write_tiktoken_file(tmp_path / "cl100k_base.tiktoken")
    (tmp_path / "cut.txt.gz").write_bytes(gzip.compress(" ".join(map(str, range(5000))).encode())[:100])
    (tmp_path / "r.jsonl").write_text('{"text": 42}\n')
    out = tmp_path / "out"
    argv = [arg.format(tmp=tmp_path) for arg in BAD_INPUTS[fragment]]
    err = _cli_error(capsys, [*argv, "--quiet", *([] if "--out-dir" in argv else ["--out-dir", str(out)])])
    assert fragment in err
    assert not out.exists()


def test_disk_full_while_writing_is_one_line_with_the_file_and_the_fix_and_leaves_nothing(tmp_path, capsys,
                                                                                           monkeypatch):
    real = writers.open_new

    def on_a_full_disk(path):  # the operating system's own ENOSPC: writes to /dev/full fail with it
        return open("/dev/full", "r+b") if ".train.bin." in path.name else real(path)

    monkeypatch.setattr(writers, "open_new", on_a_full_disk)
    out = tmp_path / "out"
    err = _cli_error(capsys, [str(write_docs(tmp_path / "c", make_docs(400, words=300))), "--out-dir", str(out),
                              "--quiet"])
    assert "No space left on device" in err and "train.bin" in err and "free space on that disk" in err
    assert not out.exists()


def test_an_input_this_user_may_not_read_is_one_line_with_the_fix(tmp_path, capsys, monkeypatch):
    corpus = write_docs(tmp_path / "c", make_docs(20))
    locked = corpus / "doc0003.txt"
    locked.chmod(0)
    real = open

    def as_an_unprivileged_user(path, *args, **kwargs):  # root reads it anyway; the check is the message
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(storage_files, "open", as_an_unprivileged_user, raising=False)
    err = _cli_error(capsys, [str(corpus), "--out-dir", str(tmp_path / "out"), "--quiet"])
    assert err == (f"tokpack: [Errno 13] Permission denied: '{locked}'; "
                   "give this user access to it (chmod, chown) or leave it out")
    assert not (tmp_path / "out").exists()


def test_config_file_sets_options_and_cli_overrides(tmp_path, capsys):
    corpus = write_docs(tmp_path / "c", make_docs(30))
    cfg = tmp_path / "p.toml"
    cfg.write_text(f'inputs = ["{corpus}"]\nval_fraction = 0.4\neot = "prepend"\nquiet = true\n'
                   f'out_dir = "{tmp_path / "o"}"\n')
    assert main(["--config", str(cfg), "--eot", "none"]) == 0
    options = read_meta(tmp_path / "o")["options"]
    assert options["val_fraction"] == 0.4 and options["eot"] == "none"
    cfg.write_text("val_fractoin = 0.2\n")
    err = _cli_error(capsys, ["--config", str(cfg)])
    assert "unknown key 'val_fractoin'" in err and str(cfg) in err and "val_fraction" in err


def test_sample_corpus_end_to_end_cli(tmp_path):
    done = run_module("tokpack.prepare", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "train" in done.stdout and "tokens/s" in done.stdout
    meta = read_meta(tmp_path / "data" / "sample")
    topics = len(list((tmp_path / "data/sample-corpus").iterdir()))
    assert sum(s["documents"] for s in meta["splits"].values()) == topics == meta["inputs"]["files"]
    assert run_module("tokpack.verify", "data/sample", cwd=tmp_path).returncode == 0
    peek = run_module("tokpack.inspect", "data/sample", "--count", "8", cwd=tmp_path)
    assert peek.returncode == 0 and "decoded:" in peek.stdout


def test_killed_run_never_leaves_a_folder_verify_accepts(tmp_path):
    corpus = write_docs(tmp_path / "c", make_docs(120, words=3000))
    out = tmp_path / "out"
    cmd = prepare_cmd(corpus, out, "--force")

    def size(name):  # of the running process's temporary file for ``name``, -1 while there is none
        found = list(out.glob(f".{name}.*.tokpack-tmp"))
        try:
            return found[0].stat().st_size if found else -1
        except FileNotFoundError:
            return -1

    events = {
        "temporary files appear": lambda: size("train.bin") >= 0,
        "tokens are being written": lambda: size("train.bin") > 100_000,
        "the document index is being written": lambda: size("train.idx") > 0,
    }
    # A first complete run, so that the kills also hit the overwrite path.
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    for name, event in events.items():
        kill(paused_at(cmd, event))
        try:
            verify_folder(out)
            whole = True
        except (VerifyError, FileNotFoundError):
            whole = False
        assert whole == (out / "meta.json").exists(), name  # a folder is either whole, or has no meta.json
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    verify_folder(out)
    assert not [p for p in os.listdir(out) if p.startswith(".")]


def _llmc_read(path: Path) -> np.ndarray:
    """llm.c / modded-nanogpt's shard reader in miniature: 256 int32 header words, asserted magic
    and version, then exactly header[2] tokens."""
    header = np.fromfile(path, dtype="<i4", count=256)
    assert (header[0], header[1]) in ((20240520, 1), (20240801, 7)), header[:2]
    dtype = np.uint16 if header[1] == 1 else np.uint32
    tokens = np.fromfile(path, dtype=dtype, offset=256 * 4)
    assert len(tokens) == header[2], "number of tokens read does not match header"
    return tokens


def test_llmc_shards_are_the_flat_stream_in_llmc_layout(tmp_path):
    corpus = write_docs(tmp_path / "c", make_docs(40, words=200))
    flat = _run(tmp_path, corpus, out="flat", eot="prepend", val_fraction=0.3)
    llmc = tmp_path / "fineweb10B"
    assert main([str(corpus), "--out-dir", str(llmc), "--format", "llmc", "--shard-tokens", "1000",
                 "--val-fraction", "0.3", "--quiet"]) == 0
    meta = read_meta(llmc)
    assert meta["eot"] == "prepend" and meta["options"]["format"] == "llmc"  # llm.c's default
    names = sorted(p.name for p in llmc.glob("*.bin"))
    assert names[0] == "fineweb10B_train_000001.bin" and "fineweb10B_val_000000.bin" in names
    for split in ("train", "val"):
        shards = sorted(llmc.glob(f"fineweb10B_{split}_*.bin"))
        assert [s.name for s in shards] == [f["file"] for f in meta["splits"][split]["shards"]]
        parts = [_llmc_read(s) for s in shards]
        # Each shard ends at a document's end (as modded-nanogpt reads them), so each starts with one.
        assert all(0 < len(p) <= 1000 and p[0] == 50256 for p in parts) and len(parts) >= 2
        starts = set(np.flatnonzero(np.fromfile(flat / f"{split}.bin", dtype=np.uint16) == 50256).tolist())
        assert set(np.cumsum([len(p) for p in parts])[:-1].tolist()) <= starts
        assert np.concatenate(parts).tolist() == np.fromfile(flat / f"{split}.bin", dtype=np.uint16).tolist()
    verify_folder(llmc)
    cut = tmp_path / "cut"  # llm.c's own writer's rule: shards of exactly --shard-tokens, documents running on
    assert main([str(corpus), "--out-dir", str(cut), "--format", "llmc", "--shard-tokens", "1000",
                 "--val-fraction", "0.3", "--shard-boundary", "token", "--quiet"]) == 0
    parts = [_llmc_read(s) for s in sorted(cut.glob("cut_train_*.bin"))]
    assert all(len(p) == 1000 for p in parts[:-1]) and 500 <= len(parts[-1]) <= 1000
    assert np.concatenate(parts).tolist() == np.fromfile(flat / "train.bin", dtype=np.uint16).tolist()
    assert "decoded:" in describe(llmc, "train", at=990, count=20)  # a peek across a shard boundary
    windows = TokenWindows(llmc, 64, split="train")
    assert len(windows.paths) == len(meta["splits"]["train"]["shards"])
    (llmc / names[0]).write_bytes((llmc / names[0]).read_bytes()[:-2])
    with pytest.raises(VerifyError):
        verify_folder(llmc)
    hidden = tmp_path / ".cache"  # shards named after a hidden folder are still tokpack's own names
    assert main([str(corpus), "--out-dir", str(hidden), "--format", "llmc", "--quiet"]) == 0
    train = TokenWindows(hidden, 64, split="train").paths
    assert train[0].name == ".cache_train_000001.bin" and len(train) == 2  # two, though one would hold them


def test_rerun_with_fewer_shards_leaves_no_stale_shard(tmp_path):
    corpus = write_docs(tmp_path / "c", make_docs(40, words=200))
    out = tmp_path / "shards"
    assert main([str(corpus), "--out-dir", str(out), "--format", "llmc", "--shard-tokens", "500", "--quiet"]) == 0
    many = len(list(out.glob("*_train_*.bin")))
    assert main([str(corpus), "--out-dir", str(out), "--format", "llmc", "--shard-tokens", "4000", "--quiet",
                 "--force"]) == 0
    assert len(list(out.glob("*_train_*.bin"))) == len(read_meta(out)["splits"]["train"]["shards"]) < many
    verify_folder(out)


def test_another_tools_token_files_are_never_overwritten_without_force(tmp_path, capsys):
    corpus = write_docs(tmp_path / "c", make_docs(20))
    nanogpt = tmp_path / "shakespeare"
    nanogpt.mkdir()
    (nanogpt / "train.bin").write_bytes(b"\x01\x00" * 50)  # nanoGPT's prepare.py output, no meta.json
    (nanogpt / "val.bin").write_bytes(b"\x02\x00" * 50)
    err = _cli_error(capsys, [str(corpus), "--out-dir", str(nanogpt), "--quiet"])
    assert "token files that tokpack did not write (train.bin, val.bin)" in err and "--force" in err
    assert (nanogpt / "train.bin").read_bytes() == b"\x01\x00" * 50
    assert main([str(corpus), "--out-dir", str(nanogpt), "--quiet", "--force"]) == 0
    verify_folder(nanogpt)


def test_uint32_summary_names_the_readers_that_work(tmp_path, capsys):
    big = write_spec(tmp_path, "big")
    corpus = write_docs(tmp_path / "c", make_docs(20))
    assert main([str(corpus), "--out-dir", str(tmp_path / "o"), "--encoding", str(big)]) == 0
    note = [line for line in capsys.readouterr().out.splitlines() if "uint32" in line and "note" in line]
    assert len(note) == 1 and "nanoGPT's train.py reads uint16" in note[0] and "--format llmc" in note[0]
    assert main([str(corpus), "--out-dir", str(tmp_path / "l"), "--encoding", str(big), "--format", "llmc"]) == 0
    note = [line for line in capsys.readouterr().out.splitlines() if "note" in line]
    assert len(note) == 1 and "llm.c's C loader and modded-nanogpt read version 1 (uint16) only" in note[0]


def test_the_prepare_command_never_loads_torch(tmp_path):
    corpus = write_docs(tmp_path / "c", make_docs(20))
    code = ("import runpy, sys; sys.argv = ['prepare', sys.argv[1], '--out-dir', sys.argv[2], '--quiet']\n"
            "try:\n    runpy.run_module('tokpack.prepare', run_name='__main__')\nexcept SystemExit as e:\n"
            "    assert not e.code, e.code\nprint('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(corpus), str(tmp_path / "o")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-2000:]


def test_parquet_and_zstd_inputs_prepare_like_jsonl(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    zstandard = pytest.importorskip("zstandard")
    docs = make_docs(40, words=80)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "d.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    (tmp_path / "b").mkdir()
    pq.write_table(pa.table({"content": docs}), tmp_path / "b" / "d.parquet", row_group_size=7)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        (tmp_path / "a" / "d.jsonl").read_bytes()))
    outs = [_run(tmp_path, tmp_path / "a", out="oa", val_fraction=0.3),
            _run(tmp_path, tmp_path / "b", out="ob", val_fraction=0.3, text_column="content"),
            _run(tmp_path, tmp_path / "c", out="oc", val_fraction=0.3)]
    assert len({(o / "train.bin").read_bytes() for o in outs}) == 1
    assert len({(o / "val.bin").read_bytes() for o in outs}) == 1


@pytest.mark.parametrize("total", [2 * 1000 + 1, 3 * 1000 + 499, 3 * 1000 + 500, 1000, 999])
def test_a_writers_last_shard_is_never_under_half_the_shard_size(tmp_path, total):
    from tokpack.prepare.tokenize.writers import ShardLayout, ShardWriter

    tokens = np.random.default_rng(total).integers(0, 50257, total).astype(np.uint16)
    writer = ShardWriter(tmp_path, ShardLayout("t_train_", 0, 1000, header=True), np.dtype(np.uint16))
    for piece in np.array_split(tokens, 7):  # writes that straddle shard boundaries
        writer.write(piece)
    shards = writer.close()
    for old, new in writer.renames():
        os.replace(old, new)
    sizes = [s["tokens"] for s in shards]
    assert sum(sizes) == total and all(s <= 1000 for s in sizes)
    assert all(s >= 500 for s in sizes) or len(sizes) == 1  # a unit under one shard stays whole
    assert sizes[:-2] == [1000] * (len(sizes) - 2)
    read = open_split(tmp_path, "train")  # llm.c headers agree with the balanced counts
    assert [f.tokens for f in read.files] == sizes
    assert np.concatenate([np.asarray(t) for t in read.open()]).tolist() == tokens.tolist()


def test_shard_tokens_cut_any_split_into_shards_that_every_reader_reads(tmp_path):
    from tokpack.data.documents import DocumentDataset
    from tokpack.evaluation import sweep

    corpus = write_docs(tmp_path / "c", make_docs(40, words=200))
    flat = _run(tmp_path, corpus, out="flat", val_fraction=0.3)
    sharded = _run(tmp_path, corpus, out="sharded", val_fraction=0.3, shard_tokens=700)
    meta = read_meta(sharded)
    for split in ("train", "val"):
        shards = meta["splits"][split]["shards"]
        assert [s["file"] for s in shards] == [f"{split}_{k:06d}.bin" for k in range(len(shards))]
        assert all(s["tokens"] == 700 for s in shards[:-2]) and len(shards) > 1
        assert all(350 <= s["tokens"] <= 700 for s in shards)  # balanced: none under half
        joined = b"".join((sharded / s["file"]).read_bytes() for s in shards)
        assert joined == (flat / f"{split}.bin").read_bytes()  # bare shards: the flat split, cut
        assert (sharded / f"{split}.idx").read_bytes() == (flat / f"{split}.idx").read_bytes()
    verify_folder(sharded)
    assert "decoded:" in describe(sharded, "train", at=695, count=10)
    from tokpack.check import check_folder

    checks = check_folder(sharded, batches=4, block_size=8, batch_size=2, workers=(0,))
    assert all(v in ("same", "n/a") for row in checks for k, v in row.items() if k != "check")
    # Documents run on across shard boundaries and are read across them, whole.
    whole, cut = (DocumentDataset(f, 10**6, split="train") for f in (flat, sharded))
    assert len(cut) == len(whole) and all(torch.equal(cut[i], whole[i]) for i in range(len(whole)))
    ends = np.cumsum([s["tokens"] for s in meta["splits"]["train"]["shards"]])
    shard_of = lambda t: int(np.searchsorted(ends, t, side="right"))  # noqa: E731
    spanning = [i for i in range(len(cut)) if shard_of(cut.starts[i]) != shard_of(cut.ends[i] - 1)]
    assert spanning
    row = {r["model"]: r for r in sweep(sharded, baselines=["bigram"], block_size=16, quiet=True)}
    assert row["bigram"]["tokens"] == sum(s["tokens"] for s in meta["splits"]["val"]["shards"]) - len(
        meta["splits"]["val"]["shards"])  # windows never cross a shard: n - 1 targets a shard
    (sharded / "train_000001.bin").write_bytes((sharded / "train_000001.bin").read_bytes()[:-2])
    with pytest.raises(ValueError, match="meta.json records 700 uint16 tokens"):
        TokenWindows(sharded, 8, split="train")


def test_more_workers_than_cores_are_capped_with_one_warning(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(launch, "cores", lambda: 2)
    corpus = write_docs(tmp_path / "c", make_docs(20))
    assert main([str(corpus), "--out-dir", str(tmp_path / "out"), "--workers", "1000"]) == 0
    warning = [line for line in capsys.readouterr().err.splitlines() if "--workers" in line]
    assert warning == ["tokpack: warning: --workers 1000 is more than the 2 cores this process may use; using 2"]
    with pytest.warns(UserWarning, match="using 2"):
        stats = prepare(PrepareConfig(inputs=(str(corpus),), out_dir=str(tmp_path / "api"), quiet=True,
                                      workers=1000))["stats"]
    assert stats["workers"] == 2


def test_peak_memory_is_the_same_ceiling_at_10_and_50_mb(tmp_path):
    corpus = tmp_path / "c10"
    corpus.mkdir()
    write_web_jsonl(corpus / "web.jsonl")
    peaks = {10: peak_rss_mb_of_prepare(str(corpus), tmp_path / "o10")}
    (tmp_path / "c50").mkdir()
    for k in range(5):
        shutil.copy(corpus / "web.jsonl", tmp_path / "c50" / f"web{k}.jsonl")
    peaks[50] = peak_rss_mb_of_prepare(str(tmp_path / "c50"), tmp_path / "o50")
    # A reader that kept the tokens (the verify's memory map did: +1 MB per 4 MB of input) or a heap
    # that grew with the input would pass 150 MB, or differ by far more than the allocator's noise.
    assert peaks[10] < 150 and peaks[50] < 150, peaks
    assert peaks[50] - peaks[10] < 12, peaks


def test_a_spec_encoding_prepares_exact_ids_and_readers_check_its_vocabulary(tmp_path, capsys):
    pattern = r"""'(?i:[sdtm]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s+(?!\S)|\s+"""
    spec = write_spec(tmp_path / "tok", "nanotok", pattern, {"<|bos|>": 50256, "<|user_start|>": 50257},
                      eot="<|bos|>")
    docs = [f"{doc} in 2026, 12345 items" for doc in make_docs(30, words=400)]
    corpus = write_docs(tmp_path / "c", docs)
    out = tmp_path / "out"
    assert main([str(corpus), "--out-dir", str(out), "--encoding", str(spec), "--eot", "prepend", "--quiet",
                 "--piece-chars", "64"]) == 0  # tiny pieces: an unproven pattern must still never cut
    enc = load_encoding(str(spec))
    meta = read_meta(out)
    assert meta["encoding"]["name"] == "nanotok" and meta["encoding"]["eot_id"] == 50256
    expected = {tuple([50256, *enc.encode_ordinary(d)]) for d in docs}
    for split in ("train", "val"):
        tokens = np.fromfile(out / f"{split}.bin", dtype=np.uint16)
        starts = np.fromfile(out / f"{split}.idx", dtype=INDEX_DTYPE).astype(np.int64)
        got = {tuple(part.tolist()) for part in np.split(tokens, starts[1:])}
        assert got <= expected
    assert "decoded: '<|bos|>" in describe(out, "train", count=8)
    spec.write_text(spec.read_text().replace("50257", "50300"))  # the spec changed after prepare
    with pytest.raises(SystemExit):
        from tokpack.evaluation import main as evaluate_main
        evaluate_main([str(out), "--model", "unigram", "--quiet"])
    err = capsys.readouterr().err
    assert "now loads ranks" in err and "n_vocab 50301" in err and "prepare again" in err


def test_megatron_format_is_read_by_megatrons_own_indexed_dataset(tmp_path):
    IndexedDataset = megatron_indexed().IndexedDataset

    corpus = write_docs(tmp_path / "c", make_docs(40, words=200))
    out = tmp_path / "mega"
    assert main([str(corpus), "--out-dir", str(out), "--format", "megatron", "--quiet"]) == 0
    meta = read_meta(out)
    for split in ("train", "val"):
        info = meta["splits"][split]
        assert info["bin"]["file"] == f"{split}_text_document.bin"
        assert info["megatron_idx"]["file"] == f"{split}_text_document.idx"
        theirs = IndexedDataset(str(out / f"{split}_text_document"))
        ours = DocumentDataset(out, 10**6, split=split)
        assert len(theirs) == len(ours) == info["documents"] and theirs.index.dtype == np.uint16
        assert all(theirs[i].tolist() == ours[i].tolist() for i in range(len(ours)))
    flat = _run(tmp_path, corpus, out="flat")  # the same tokens as the flat format
    assert (out / "train_text_document.bin").read_bytes() == (flat / "train.bin").read_bytes()
    verify_folder(out)
    index = out / "val_text_document.idx"
    index.write_bytes(index.read_bytes()[:-8] + (5).to_bytes(8, "little"))
    with pytest.raises(VerifyError, match="val_text_document.idx"):
        verify_folder(out)
    with pytest.raises(ValueError, match="--format megatron writes one .bin/.idx pair a split.*--shard-tokens"):
        PrepareConfig(format="megatron", shard_tokens=1000)
