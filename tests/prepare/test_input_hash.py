"""The input hash a rerun compares: the bytes of exactly a unit's input, whether the reader's
tap gave them or the files were read again."""

from __future__ import annotations

import gzip
import json
import threading

import numpy as np
import pytest

from helpers import make_docs, write_docs
from tokpack.format import read_meta
from tokpack.prepare import GuardOptions, PrepareConfig, prepare
from tokpack.prepare.plan import input_hash
from tokpack.prepare.plan.shares import share_of
from tokpack.prepare.plan.input_hash import InputTap, input_sha256
from tokpack.storage import LocalFile


def test_a_units_input_hash_covers_exactly_the_bytes_its_documents_come_from(tmp_path):
    lines = [json.dumps({"text": f"doc {i} " * (i % 7 + 1)}) + "\n" for i in range(200)]
    path = LocalFile(tmp_path / "web.jsonl")
    path.write_text("".join(lines))
    data = path.read_bytes()
    sizes = {path: len(data)}
    count = 5
    shares = [share_of([path], sizes, unit, count) for unit in range(count)]
    before = [input_sha256(share) for share in shares]
    starts = np.cumsum([0] + [len(line) for line in lines])
    for line in (0, 37, 38, 99, 199):  # each document's bytes belong to the unit that reads it
        offset = int(starts[line]) + 2  # inside the line's text: the same length
        path.write_bytes(data[:offset] + (b"X" if data[offset:offset + 1] != b"X" else b"Y") + data[offset + 1:])
        owner = [u for u, share in enumerate(shares) if share[0][1] <= starts[line] < share[0][2]]
        changed = [u for u in range(count) if input_sha256(shares[u]) != before[u]]
        assert changed == owner, (line, changed, owner)
    path.write_bytes(data)
    assert [input_sha256(share) for share in shares] == before


def test_an_input_hash_gives_up_once_its_unit_has_failed(tmp_path):
    # A unit's input is hashed in a thread beside its tokenizing; a unit that fails sets ``stop``,
    # so the failure is not held up until the rest of a large input is read and hashed.
    path = LocalFile(tmp_path / "big.txt")
    path.write_bytes(b"x" * (2 * input_hash._BLOCK + 5))
    share = [(path, 0, None)]
    stop = threading.Event()
    whole = input_sha256(share, stop)
    assert whole == input_sha256(share) and len(whole) == 64
    stop.set()
    assert input_sha256(share, stop) == ""


@pytest.fixture
def files(tmp_path):
    folder = write_docs(tmp_path / "corpus", make_docs(6, words=400))
    (folder / "web.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in make_docs(30, seed=3)))
    (folder / "more.txt.gz").write_bytes(gzip.compress("\n\n".join(make_docs(5, seed=4)).encode()))
    zstandard = pytest.importorskip("zstandard")
    lines = "".join(json.dumps({"text": d}) + "\n" for d in make_docs(8, seed=6))
    (folder / "zst.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
    return [LocalFile(f) for f in sorted(folder.iterdir())]


def test_a_prepared_folders_input_hash_is_the_bytes_its_reader_took(tmp_path, files, monkeypatch):
    # One unit of whole files (text, jsonl, gzip, zstd): hashed from the reader's own reads, never read
    # again, and the same as a second read gives.
    def read_again(*args):
        raise AssertionError("the input was read again to be hashed")

    monkeypatch.setattr(input_hash, "_read_into", read_again)
    out = tmp_path / "out"
    # The tokenize stage's own hashing (the guard's signing reads the input once more, and hashes it there).
    prepare(PrepareConfig(inputs=(str(files[0].parent),), out_dir=str(out), quiet=True,
                          guard=GuardOptions(near_split=False)))
    monkeypatch.undo()
    share = [(f, 0, None) for f in files]
    assert InputTap.fits(share)
    assert read_meta(out)["inputs"]["units_sha256"] == [input_sha256(share)]


def _read(f, size=None):
    with f.open_stream() as stream:
        return stream.read() if size is None else stream.read(size)


def test_files_read_whole_in_order_are_hashed_as_read(files):
    share = [(f, 0, None) for f in files]
    tap = InputTap(share)
    for f, _, _ in tap.share:
        _read(f)
        _read(f)  # a second read of the same file is not hashed twice
    expected = input_sha256(share)
    for f in files:  # a digest from the reads: nothing is read again
        f.unlink()
    assert not tap.broken and tap.hexdigest() == expected


@pytest.mark.parametrize("reading", ["out of order", "stopped early", "sought", "one left out"])
def test_any_other_reading_is_hashed_again_from_the_files(files, reading):
    share = [(f, 0, None) for f in files]
    tap = InputTap(share)
    tapped = [f for f, _, _ in tap.share]
    if reading == "out of order":
        for f in [tapped[1], tapped[0], *tapped[2:]]:
            _read(f)
    elif reading == "stopped early":
        _read(tapped[0], 10)
        for f in tapped[1:]:
            _read(f)
    elif reading == "sought":
        with tapped[0].open_stream() as stream:
            stream.seek(5)
            stream.read()
        for f in tapped[1:]:
            _read(f)
    else:
        for f in tapped[:-1]:
            _read(f)
    assert tap.hexdigest() == input_sha256(share)
    assert tap.broken or reading == "one left out"


def test_only_shares_of_whole_streamed_local_files_are_tapped(files):
    whole = [(f, 0, None) for f in files]
    assert InputTap.fits(whole)
    assert not InputTap.fits([(files[0], 0, 100), *whole[1:]])  # a jsonl range is read again
    parquet = LocalFile(files[0].parent / "rows.parquet")
    parquet.write_bytes(b"PAR1")
    assert not InputTap.fits([*whole, (parquet, 0, None)])  # pyarrow reads it by its path
