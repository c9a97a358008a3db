"""Hostile folders and checkpoints: each is built here, and tokpack touches nothing outside the
folder, runs nothing, serves nothing it cannot vouch for, and says why in one line.

Classes: names in tokpack's own metadata (unit records, meta.json), links where tokpack reads or
writes (token files, the lock, temporary files), checkpoints that carry code, headers and indexes
that lie, globs that mix splits, folders left by killed runs.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from helpers import make_docs, script, shard_file, write_docs
from tokpack.bench.loops import write_shard_folder
from tokpack.data.documents import DocumentDataset
from tokpack.data.windows import TokenWindows
from tokpack.evaluation import main as evaluate_main
from tokpack.inspect import main as inspect_main
from tokpack.models import GPT, GPTConfig, gpt_checkpoint
from tokpack.prepare.__main__ import main as prepare_main
from tokpack.verify import main as verify_main
from tokpack.verify import verify_folder

SECRET = "keep me"


@pytest.fixture
def outside(tmp_path):
    """A file outside every folder under test, which must stay as it is."""
    path = tmp_path / "notes.txt"
    path.write_text(SECRET)
    return path


@pytest.fixture
def corpus(tmp_path):
    folder = write_docs(tmp_path / "corpus", make_docs(20, words=300))
    (folder / "web.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in make_docs(600, seed=5)))
    return folder


def _one_line_exit_2(capsys, run, *fragments):
    with pytest.raises(SystemExit) as exc:
        run()
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err.startswith("tokpack: ") and "\n" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    return err


def _prepare_argv(corpus, out, *extra):
    return [str(corpus), "--out-dir", str(out), "--quiet", "--workers", "1", *extra]


# Unit records: every name is checked; nothing outside the folder, nor another tool's file, goes.

@pytest.mark.parametrize("sharded", [True, False])
def test_a_forged_unit_record_deletes_nothing_outside_the_folder_nor_another_tools_file(tmp_path, corpus, outside,
                                                                                         sharded, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.bin").write_bytes(b"\0" * 64)  # nanoGPT's, not tokpack's
    (out / "val_000000.bin").symlink_to(outside)  # a unit's name, but a link out of the folder
    names = [str(outside), "../notes.txt", "train.bin", "val_000000.bin"]
    shard = {"file": names[0], "bytes": 1, "sha256": "0" * 64, "tokens": 1}
    record = {"fingerprint": "forged", "unit": 0, "splits": {
        "train": {"info": {"shards": [shard, *({**shard, "file": n} for n in names[1:])]},
                  "idx": {**shard, "file": ".train.idx.u00000"}},
        "val": {"info": {"shards": []}, "idx": {**shard, "file": ".val.idx.u00000"}}}}
    (out / ".tokpack-unit-00000.json").write_text(json.dumps(record))
    argv = _prepare_argv(corpus, out, *(["--shard-tokens", "3000", "--unit-mb", "0.05"] if sharded else []))
    # train.bin is not tokpack's, whatever the record says
    _one_line_exit_2(capsys, lambda: prepare_main(argv), "train.bin", "--force")
    assert outside.read_text() == SECRET and (out / "train.bin").read_bytes() == b"\0" * 64
    (out / "train.bin").unlink()  # the user moves the files the run named away
    (out / "val_000000.bin").unlink()
    assert prepare_main(argv) == 0
    assert outside.read_text() == SECRET and not (out / ".tokpack-unit-00000.json").exists()
    verify_folder(out)


@pytest.mark.parametrize("name", ["../notes.txt", "/NOTES", ".train.bin.123.tokpack-tmp", "train.bin/x",
                                  "notes.txt", ".train.idx.u00000"])
def test_meta_json_naming_a_file_tokpack_does_not_write_is_refused_by_every_reader_and_by_prepare(
        prepared, outside, capsys, name):
    meta = json.loads((prepared / "meta.json").read_text())
    meta["splits"]["val"]["bin"]["file"] = name.replace("/NOTES", str(outside))
    (prepared / "meta.json").write_text(json.dumps(meta))
    for read in (lambda: TokenWindows(prepared, 8, split="val"), lambda: DocumentDataset(prepared, 8, split="val")):
        with pytest.raises(ValueError, match="is not the name of a file tokpack writes"):
            read()
    for command in (lambda: inspect_main([str(prepared)]), lambda: evaluate_main([str(prepared), "--model", "bigram"])):
        _one_line_exit_2(capsys, command, "is not the name of a file tokpack writes")
    assert verify_main([str(prepared)]) == 1
    # A --force rerun replaces the folder; the file the forged meta.json names is not touched.
    corpus = write_docs(prepared.parent / "c2", make_docs(30))
    assert prepare_main(_prepare_argv(corpus, prepared, "--force")) == 0
    assert outside.read_text() == SECRET
    verify_folder(prepared)


DEEP = b"[" * 200_000  # deeper than any JSON parser's stack


def test_deeply_nested_json_as_meta_json_is_one_line_everywhere_and_prepare_force_repairs_it(prepared, capsys):
    (prepared / "meta.json").write_bytes(DEEP)
    for command in (lambda: inspect_main([str(prepared)]), lambda: evaluate_main([str(prepared), "--model", "bigram"])):
        _one_line_exit_2(capsys, command, "meta.json is JSON nested too deeply to read")
    for read in (lambda: TokenWindows(prepared, 8, split="val"), lambda: DocumentDataset(prepared, 8, split="val")):
        with pytest.raises(ValueError, match="nested too deeply"):
            read()
    assert verify_main([str(prepared)]) == 1 and "nested too deeply" in capsys.readouterr().err
    corpus = write_docs(prepared.parent / "c2", make_docs(30))
    assert prepare_main(_prepare_argv(corpus, prepared, "--force")) == 0
    verify_folder(prepared)


def test_a_deeply_nested_unit_record_is_redone_by_a_tasks_rerun(tmp_path, corpus, capsys):
    out = tmp_path / "out"
    argv = _prepare_argv(corpus, out, "--unit-mb", "0.05", "--tasks", "2")
    assert prepare_main([*argv, "--task", "0"]) == 0
    (out / ".tokpack-unit-00000.json").write_bytes(DEEP)
    assert prepare_main([*argv, "--task", "0"]) == 0  # the unit is redone, not a traceback
    assert prepare_main([*argv, "--task", "1"]) == 0
    verify_folder(out)


# Links: a prepared folder's files are its own, and tokpack writes through no link.

def test_a_token_file_linked_out_of_the_folder_is_refused_by_every_reader(prepared, tmp_path, capsys):
    secret = tmp_path / "secret.bin"
    os.replace(prepared / "val.bin", secret)
    (prepared / "val.bin").symlink_to(secret)
    for read in (lambda: TokenWindows(prepared, 8, split="val"), lambda: DocumentDataset(prepared, 8, split="val"),
                 lambda: TokenWindows(prepared / "val.bin", 8)):
        with pytest.raises(ValueError, match="val.bin is a link"):
            read()
    _one_line_exit_2(capsys, lambda: inspect_main([str(prepared)]), "val.bin is a link")
    assert verify_main([str(prepared)]) == 1


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "foreign text"])
def test_a_lock_file_that_is_not_tokpacks_is_neither_followed_nor_truncated(tmp_path, corpus, outside, capsys, kind):
    out = tmp_path / "out"
    out.mkdir()
    lock = out / ".tokpack.lock"
    if kind == "symlink":
        lock.symlink_to(outside)
    elif kind == "hardlink":
        os.link(outside, lock)
    else:
        lock.write_text("my notes, not a pid")
    before = lock.read_text() if kind == "foreign text" else SECRET
    _one_line_exit_2(capsys, lambda: prepare_main(_prepare_argv(corpus, out)), ".tokpack.lock")
    assert outside.read_text() == SECRET and not (out / "meta.json").exists()
    assert kind != "foreign text" or lock.read_text() == before


def test_a_link_planted_at_a_temporary_name_is_not_written_through(tmp_path, corpus, outside, capsys):
    out = tmp_path / "out"
    out.mkdir()
    planted = [out / f".{name}.{os.getpid()}.tokpack-tmp" for name in ("train.bin", "val.bin", "spill", "meta.json")]
    for path in planted:
        path.symlink_to(outside)
    _one_line_exit_2(capsys, lambda: prepare_main(_prepare_argv(corpus, out)), "tokpack-tmp is already there")
    assert outside.read_text() == SECRET and all(p.is_symlink() for p in planted)


# Checkpoints are data: a pickle that would run code is refused before it runs.

class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_that_carries_code_is_refused_by_evaluate_and_by_train_gpt_resume(prepared, tmp_path, capsys):
    marker = tmp_path / "ran"
    model = GPT(GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=16))
    out = tmp_path / "run"
    out.mkdir()
    torch.save(gpt_checkpoint(model, step=1, loader=_Payload(marker)), out / "ckpt.pt")
    _one_line_exit_2(capsys, lambda: evaluate_main([str(prepared), "--checkpoint", str(out / "ckpt.pt")]),
                     "ckpt.pt holds posix.system, which tokpack does not load")
    train_gpt = script("train_gpt")
    _one_line_exit_2(capsys, lambda: train_gpt.main(["--data-dir", str(prepared), "--out-dir", str(out), "--resume",
                                                     "--block-size", "16", "--n-layer", "1", "--n-head", "2",
                                                     "--n-embd", "16"]), "holds posix.system")
    assert not marker.exists()


# Headers and indexes that lie: refused, never served.

def test_lying_headers_and_indexes_are_refused(tmp_path, capsys):
    (tmp_path / "neg").mkdir()
    negative = shard_file(tmp_path / "neg" / "data_train_000000.bin", np.arange(100))
    header = np.fromfile(negative, dtype="<i4", count=256)
    header[2] = -5
    negative.write_bytes(header.tobytes() + negative.read_bytes()[1024:])
    with pytest.raises(ValueError, match="token count is -5, below 0"):
        TokenWindows(negative, 8)
    megatron = tmp_path / "mega" / "text_document.bin"
    megatron.parent.mkdir()
    megatron.write_bytes(np.array([-3, 5, 7, 9] * 10, dtype=np.int8).tobytes())
    megatron.with_suffix(".idx").write_bytes(b"MMIDIDX\x00\x00" + (1).to_bytes(8, "little") + bytes([2]))
    with pytest.raises(ValueError, match="declares dtype int8, which is not a token dtype"):
        TokenWindows(megatron, 8)


def test_a_shard_forged_to_uint32_in_a_prepared_folder_is_refused(tmp_path, corpus):
    out = tmp_path / "llmc"
    assert prepare_main(_prepare_argv(corpus, out, "--format", "llmc")) == 0
    shard = sorted(out.glob("*_train_*.bin"))[0]
    data = shard.read_bytes()
    header = np.frombuffer(data[:1024], dtype="<i4").copy()
    header[:3] = (20240801, 7, header[2] // 2)  # the same bytes read as half as many uint32 ids
    shard.write_bytes(header.tobytes() + data[1024:])
    with pytest.raises(ValueError, match="header for .* uint32 tokens but meta.json records .* uint16"):
        TokenWindows(out, 8, split="train")


def test_ids_outside_the_recorded_vocabulary_are_never_served(prepared):
    val = prepared / "val.bin"
    tokens = np.fromfile(val, dtype=np.uint16)
    tokens[5] = 65000  # the same size, so only the ids tell
    tokens.tofile(val)
    windows = TokenWindows(prepared, 8, split="val", stride=8)
    with pytest.raises(ValueError, match="holds id 65000, outside the 50257 ids its meta.json records"):
        windows.__getitems__(list(range(len(windows))))
    with pytest.raises(ValueError, match="holds id 65000"):
        [DocumentDataset(prepared, 64, split="val")[i] for i in range(3)]


# Globs and folders that mix what must not be mixed.

def test_globs_and_folders_that_mix_splits_or_sets_are_refused_with_the_glob_to_use(tmp_path):
    folder = tmp_path / "fineweb10B"
    folder.mkdir()
    shard_file(folder / "fineweb_val_000000.bin", np.full(50, 7))
    shard_file(folder / "fineweb_train_000001.bin", np.arange(40))
    with pytest.raises(ValueError, match=r"several splits \(train, val\).*fineweb_train_\*.bin"):
        TokenWindows(str(folder / "*.bin"), 8)
    np.arange(60, dtype=np.uint16).tofile(folder / "train.bin")  # nanoGPT's train.bin beside llm.c's shards
    with pytest.raises(ValueError, match=r"two sets of train token files .*fineweb_train_\*.bin and .*train.bin"):
        TokenWindows(folder, 8, split="train", dtype="uint16")
    with pytest.raises(ValueError, match="two sets of train"):
        TokenWindows(str(folder / "*train*.bin"), 8, dtype="uint16")
    assert len(TokenWindows(str(folder / "fineweb_train_*.bin"), 8)) == 32


# Folders left by killed runs.

def test_an_unfinished_run_is_refused_by_every_reader_whatever_dtype_says(tmp_path):
    folder = write_shard_folder(tmp_path / "f", 3, 16)
    (folder / "meta.json").unlink()
    (folder / ".tokpack-unit-00000.json").write_text("{}")
    for read in (lambda: TokenWindows(folder, 8, split="train"),
                 lambda: TokenWindows(folder, 8, dtype="uint16", split="train"),
                 lambda: TokenWindows(folder / "train_000000.bin", 8, dtype="uint16")):
        with pytest.raises(ValueError, match="unfinished tokpack.prepare run .* rerun the same"):
            read()


def test_leftovers_of_a_run_killed_after_meta_json_are_removed_by_the_next_run_and_by_verify(prepared, capsys,
                                                                                                 outside):
    leftovers = [".tokpack.lock", ".tokpack-unit-00000.json", ".train.idx.u00000", ".val.bin.123.tokpack-tmp"]
    for name in leftovers:
        (prepared / name).write_text("12345" if name == ".tokpack.lock" else "{}")
    (prepared / ".tokpack-unit-00001.json").symlink_to(outside)  # a link is never tokpack's to remove
    assert verify_main([str(prepared)]) == 0
    assert "removed 4 leftovers" in capsys.readouterr().out
    assert not [name for name in leftovers if (prepared / name).exists()]
    assert (prepared / ".tokpack-unit-00001.json").is_symlink() and outside.read_text() == SECRET
    (prepared / ".tokpack-unit-00001.json").unlink()
    for name in leftovers:
        (prepared / name).write_text("12345" if name == ".tokpack.lock" else "{}")
    corpus = write_docs(prepared.parent / "c2", make_docs(30))
    err = _one_line_exit_2(capsys, lambda: prepare_main(_prepare_argv(corpus, prepared)), "already holds a prepared")
    assert "--force" in err and not [name for name in leftovers if (prepared / name).exists()]
