"""Conversations in shards: a mask a shard, cut where the tokens are; llm.c shards, independent
tasks in any order and a run killed and resumed all give the one-process flat folder's bytes,
concatenated; the readers, verify and inspect take them; a forged mask shard is refused."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest

from helpers import cli_run, kill, make_chats, paused_at, write_jsonl, write_nanochat_spec
from tokpack.data.loader import build_loader
from tokpack.data.packing import PackedDocuments
from tokpack.data.windows import TokenWindows
from tokpack.format import read_meta
from tokpack.inspect import describe
from tokpack.prepare.__main__ import main as prepare_main
from tokpack.verify import VerifyError, verify_folder

CHATS = make_chats(160, seed=9)
OPTIONS = ("--chat", "nanochat", "--quiet", "--unit-mb", "0.02")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded")
    spec, source = write_nanochat_spec(root / "tok"), write_jsonl(root / "chats.jsonl", CHATS)
    assert prepare_main([str(source), "--out-dir", str(root / "flat"), "--encoding", str(spec), *OPTIONS]) == 0
    return root, spec, source


def _joined(folder, split, key, dtype):
    meta = read_meta(folder)
    return np.concatenate([np.fromfile(folder / e["file"], dtype=dtype, offset=1024 if key == "shards" and
                                       meta["options"]["format"] == "llmc" else 0)
                           for e in meta["splits"][split][key]])


def _same_as_flat(folder, flat):
    meta = read_meta(folder)
    for split in ("train", "val"):
        assert np.array_equal(_joined(folder, split, "shards", np.uint16), np.fromfile(flat / f"{split}.bin", np.uint16))
        assert np.array_equal(_joined(folder, split, "mask_shards", np.uint8), np.fromfile(flat / f"{split}.mask", np.uint8))
        assert meta["splits"][split]["supervised"] == read_meta(flat)["splits"][split]["supervised"]
    assert meta["chat"] == read_meta(flat)["chat"]
    verify_folder(folder)


@pytest.mark.parametrize("extra", [("--shard-tokens", "3000"), ("--format", "llmc", "--shard-tokens", "4000")],
                         ids=["bare", "llmc"])
def test_shards_with_a_mask_each_are_the_flat_folder(made, tmp_path, extra):
    root, spec, source = made
    out = tmp_path / "out"
    assert prepare_main([str(source), "--out-dir", str(out), "--encoding", str(spec), *OPTIONS, *extra]) == 0
    meta = read_meta(out)
    assert len(meta["inputs"]["units_sha256"]) > 1 and len(meta["splits"]["train"]["mask_shards"]) > 2
    for shard, mask in zip(meta["splits"]["train"]["shards"], meta["splits"]["train"]["mask_shards"]):
        assert mask["file"] == shard["file"].removesuffix(".bin") + ".mask" and mask["tokens"] == shard["tokens"]
    _same_as_flat(out, root / "flat")
    # Readers take the masks across shards as they take the tokens.
    T = 96
    for a, b in itertools.islice(zip(build_loader(PackedDocuments(out, T, split="train", rows="bestfit"), 2, seed=3),
                                     build_loader(PackedDocuments(root / "flat", T, split="train", rows="bestfit"), 2,
                                                  seed=3)), 6):
        assert (a.y == b.y).all() and (a.y == -100).any()
    windows, flat = TokenWindows(out, 64, split="val", stride=64), TokenWindows(root / "flat", 64, split="val", stride=64)
    assert windows.scored_tokens == flat.scored_tokens == meta["splits"]["val"]["supervised"]
    assert "trained on" in describe(str(out), "train", 5000, 40)


def test_tasks_in_any_order_and_a_killed_run_resumed_give_the_flat_folder(made, tmp_path, capsys):
    root, spec, source = made
    args = [str(source), "--encoding", str(spec), *OPTIONS, "--shard-tokens", "3000"]
    out = tmp_path / "tasks"
    for task in (2, 0, 1):
        assert prepare_main([*args, "--out-dir", str(out), "--tasks", "3", "--task", str(task)]) == 0
    _same_as_flat(out, root / "flat")
    # A run killed while it writes, then rerun: the units it finished are kept, the rest redone.
    resumed = tmp_path / "resumed"
    cmd = [sys.executable, "-m", "tokpack.prepare", *args, "--out-dir", str(resumed)]
    # Two records stand: the first unit's renames are done (the kill may fall between a record and
    # its renames, so a unit counts as finished once every file it records stands at its size).
    kill(paused_at(cmd, lambda: len(list(resumed.glob(".tokpack-unit-*.json"))) >= 2))
    kept = {}
    for record in resumed.glob(".tokpack-unit-*.json"):
        parts = json.loads(record.read_text())["splits"].values()
        data = [f for part in parts for f in (*part["info"]["shards"], *part["info"]["mask_shards"])]
        if all((resumed / f["file"]).is_file() and (resumed / f["file"]).stat().st_size == f["bytes"]
               for f in (*data, *(part["idx"] for part in parts))):  # index parts are merged at the end
            kept.update({f["file"]: (resumed / f["file"]).stat().st_mtime_ns for f in data})
    assert any(name.endswith(".mask") for name in kept) and not (resumed / "meta.json").exists()
    assert prepare_main([*args, "--out-dir", str(resumed)]) == 0
    assert all((resumed / name).stat().st_mtime_ns == when for name, when in kept.items())  # kept, not redone
    _same_as_flat(resumed, root / "flat")


def test_a_forged_mask_shard_is_refused(made, tmp_path, capsys):
    root, spec, source = made
    out = tmp_path / "out"
    assert prepare_main([str(source), "--out-dir", str(out), "--encoding", str(spec), *OPTIONS,
                         "--shard-tokens", "3000"]) == 0
    meta = read_meta(out)
    entry = meta["splits"]["train"]["mask_shards"][1]
    meta["splits"]["train"]["mask_shards"][1] = {**entry, "file": "../outside.mask"}
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(VerifyError, match="not the name of a file tokpack writes"):
        verify_folder(out)
    meta["splits"]["train"]["mask_shards"][1] = entry
    meta["splits"]["train"]["mask_shards"].pop()  # one short of the shards
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(VerifyError, match="mask_shards that are not one byte a token of each of its shards"):
        verify_folder(out)
    code, err = cli_run(prepare_main, capsys, source, "--out-dir", tmp_path / "m", "--encoding", spec, *OPTIONS,
                        "--shard-tokens", "3000", "--mixture", f"{source}=2")
    assert code == 2 and "--mixture writes each split in one order" in err, err


def test_conversations_from_s3_published_to_s3_are_the_local_folder_and_read_back(made, s3_server, tmp_path,
                                                                                   monkeypatch):
    root, spec, source = made
    s3_server.create_bucket(Bucket="chats")
    s3_server.put_object(Bucket="chats", Key="in/chats.jsonl", Body=source.read_bytes())
    args = ["--encoding", str(spec), *OPTIONS, "--shard-tokens", "3000"]
    assert prepare_main(["s3://chats/in/chats.jsonl", "--out-dir", "s3://chats/sft", "--spool-dir",
                         str(tmp_path), *args]) == 0
    local = tmp_path / "sft"
    assert prepare_main([str(source), "--out-dir", str(local), *args]) == 0
    listed = s3_server.list_objects_v2(Bucket="chats", Prefix="sft/")["Contents"]
    published = {o["Key"][4:]: s3_server.get_object(Bucket="chats", Key=o["Key"])["Body"].read() for o in listed}
    mine = {p.name: p.read_bytes() for p in local.iterdir() if not p.name.startswith(".")}
    assert {n for n in published if n.endswith(".mask")} and published.keys() == mine.keys()
    assert {n: b for n, b in published.items() if n != "meta.json"} == {n: b for n, b in mine.items() if n != "meta.json"}
    verify_folder("s3://chats/sft")
    monkeypatch.setenv("TOKPACK_CACHE_DIR", str(tmp_path / "cache"))
    remote, here = TokenWindows("s3://chats/sft", 64, split="train"), TokenWindows(local, 64, split="train")
    for i in (0, 7, len(here) - 1):
        assert all(a.equal(b) for a, b in zip(remote[i], here[i]))
    assert (here[7][1] == -100).any()  # the masks were read, remotely as here


@pytest.mark.e2e
def test_under_torchrun_two_ranks_give_the_flat_folder(made, tmp_path):
    root, spec, source = made
    out = tmp_path / "ranks"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           "-m", "tokpack.prepare", str(source), "--out-dir", str(out), "--encoding", str(spec),
                           *OPTIONS, "--workers", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    _same_as_flat(out, root / "flat")
