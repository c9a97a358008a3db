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
    ("truncate", "bytes, meta.json says"),
    ("big_id", "holds id 60000"),
    ("bad_index", "not a strictly increasing list"),
    ("no_meta", "meta.json is missing"),
    ("no_bin", "val.bin is missing"),
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
