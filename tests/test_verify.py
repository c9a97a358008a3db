from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from tokpack.format import read_meta
from tokpack.inspect import describe
from tokpack.verify import VerifyError, main, verify_folder


def _rehash(folder, split, part):
    """Rewrite meta.json's hash and size of a file, as a consistent but wrong folder would have."""
    meta = json.loads((folder / "meta.json").read_text())
    data = (folder / meta["splits"][split][part]["file"]).read_bytes()
    meta["splits"][split][part].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    (folder / "meta.json").write_text(json.dumps(meta))


def test_whole_folder_passes(prepared, capsys):
    counts = verify_folder(prepared)
    assert counts == {s: read_meta(prepared)["splits"][s]["tokens"] for s in ("train", "val")}
    assert main([str(prepared)]) == 0 and "is whole" in capsys.readouterr().out


@pytest.mark.parametrize("damage,reason", [
    ("flip", "has sha256"),
    ("truncate", "bytes but meta.json records"),
    ("big_id", "holds id 60000"),
    ("bad_index", "not a strictly increasing list"),
    ("no_meta", "meta.json is missing"),
    ("no_bin", "val.bin does not exist"),
])
def test_damage_is_found_with_its_reason(prepared, capsys, damage, reason):
    val = prepared / "val.bin"
    if damage == "flip":
        data = bytearray(val.read_bytes())
        data[10] ^= 1
        val.write_bytes(bytes(data))
    elif damage == "truncate":
        val.write_bytes(val.read_bytes()[:-2])
    elif damage == "big_id":
        tokens = np.fromfile(val, dtype=np.uint16)
        tokens[5] = 60000
        tokens.tofile(val)
        _rehash(prepared, "val", "bin")
    elif damage == "bad_index":
        np.array([0, 0], dtype="<u8").tofile(prepared / "val.idx")
        meta = json.loads((prepared / "meta.json").read_text())
        meta["splits"]["val"]["documents"] = 2
        (prepared / "meta.json").write_text(json.dumps(meta))
        _rehash(prepared, "val", "idx")
    elif damage == "no_meta":
        (prepared / "meta.json").unlink()
    else:
        val.unlink()
    with pytest.raises((VerifyError, FileNotFoundError), match=reason):
        verify_folder(prepared)
    assert main([str(prepared)]) == 1
    assert "is NOT whole" in capsys.readouterr().err


def test_inspect_decodes_a_peek(prepared):
    text = describe(prepared, "val", at=0, count=5)
    assert "gpt2" in text and "val[0:5]" in text and "decoded:" in text
    with pytest.raises(ValueError, match="outside val"):
        describe(prepared, "val", at=10**9)
    with pytest.raises(ValueError, match="split 'test' is not in"):
        describe(prepared, "test")


@pytest.mark.parametrize("content,reason", [
    ('{"format_version": 1}', "is malformed: dtype None"),
    ("[]", "format_version None"),
    ("FORGED_DTYPE", "is malformed: dtype 'foo'"),
    ("FORGED_SPLITS", "split 'train' needs tokens"),
])
def test_malformed_meta_is_a_verdict_and_one_line_for_every_reader(prepared, capsys, content, reason):
    from tokpack.data.windows import TokenWindows

    meta = json.loads((prepared / "meta.json").read_text())
    if content == "FORGED_DTYPE":
        content = json.dumps({**meta, "dtype": "foo"})
    elif content == "FORGED_SPLITS":
        content = json.dumps({**meta, "splits": {"train": {"tokens": "many"}}})
    (prepared / "meta.json").write_text(content)
    assert main([str(prepared)]) == 1
    err = capsys.readouterr().err.strip()
    assert "is NOT whole" in err and reason in err and "\n" not in err and "Traceback" not in err
    with pytest.raises(ValueError, match=reason):
        TokenWindows(prepared, 8, split="train")
    with pytest.raises(ValueError, match=reason):
        describe(prepared)


def test_a_split_shorter_than_meta_json_says_is_refused_on_open(prepared):
    from tokpack.data.windows import TokenWindows

    data = (prepared / "val.bin").read_bytes()
    (prepared / "val.bin").write_bytes(data[:-2])  # one token short
    with pytest.raises(ValueError, match="meta.json records .* tokens .* changed or truncated"):
        TokenWindows(prepared / "val.bin", 8)


def test_verify_reports_ids_beyond_the_vocabulary(prepared, capsys):
    tokens = np.fromfile(prepared / "val.bin", dtype=np.uint16)
    tokens[3] = 60000
    tokens.tofile(prepared / "val.bin")
    _rehash(prepared, "val", "bin")
    assert main([str(prepared)]) == 1
    assert "holds id 60000" in capsys.readouterr().err


def test_non_increasing_document_index_is_refused(prepared):
    from tokpack.data.documents import DocumentDataset

    starts = np.fromfile(prepared / "train.idx", dtype="<u8")
    starts[[1, 2]] = starts[[2, 1]]
    starts.tofile(prepared / "train.idx")
    with pytest.raises(ValueError, match="not a strictly increasing list of document starts"):
        DocumentDataset(prepared / "train.bin", 16)


def test_inspect_refuses_a_negative_count(prepared):
    with pytest.raises(ValueError, match="--count -5 must be at least 1"):
        describe(prepared, count=-5)


def test_a_file_of_many_blocks_hashed_beside_its_reading_finds_damage_in_any_block(prepared, monkeypatch):
    from tokpack import verify

    monkeypatch.setattr(verify, "CHUNK_BYTES", 64)  # every file many blocks: the threaded hashing path
    assert verify_folder(prepared)["val"] == read_meta(prepared)["splits"]["val"]["tokens"]
    val = prepared / "val.bin"
    good = val.read_bytes()
    assert len(good) > 4 * 64 and len(good) % 64  # full blocks, then a short last one
    for at in (0, 32 + 1, len(good) // 4, len(good) // 2 - 1):  # token positions: first, second, middle, last block
        tokens = np.frombuffer(good, dtype=np.uint16).copy()
        tokens[at] = tokens[at] + 1 if tokens[at] < 1000 else tokens[at] - 1  # still an id of the vocabulary
        tokens.tofile(val)
        with pytest.raises(VerifyError, match="has sha256"):
            verify_folder(prepared)
    tokens = np.frombuffer(good, dtype=np.uint16).copy()
    tokens[100] = 60000  # in the fourth block, bytes 192..255
    tokens.tofile(val)
    _rehash(prepared, "val", "bin")
    with pytest.raises(VerifyError, match="holds id 60000 near byte 192"):
        verify_folder(prepared)
