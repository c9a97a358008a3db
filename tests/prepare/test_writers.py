"""The writers' own promises: what is written is what was given, and hashed as written."""

from __future__ import annotations

import errno
import hashlib
import os

import numpy as np
import pytest

from tokpack.format import SHARD_HEADER_BYTES
from tokpack.prepare.tokenize import writers
from tokpack.prepare.tokenize.writers import HashingWriter, ShardLayout, ShardWriter, SplitWriter


def test_buffered_writes_give_the_bytes_and_hash_of_every_write_in_order(tmp_path):
    # Small writes gather in a buffer; one that would overflow it drains it first, and one as
    # large as the buffer goes straight through: the file and its sha256 keep the order.
    rng = np.random.default_rng(0)
    size = HashingWriter.BUFFER_BYTES
    lengths = (3, size // 2 - 1, size // 4, size, 1, 7, size // 2 + 9)  # bytes twice these: some overflow
    parts = [rng.integers(0, 2**16, n, dtype=np.uint16) for n in lengths]
    writer = HashingWriter(tmp_path / "train.bin")
    for part in parts:
        writer.write(part)
    info = writer.close()
    data = b"".join(part.tobytes() for part in parts)
    assert writer.tmp.read_bytes() == data
    assert info == {"file": "train.bin", "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@pytest.fixture
def synced(monkeypatch) -> list[int]:
    """The operating system's fdatasync, watched: the file's size each write-back met."""
    sizes: list[int] = []
    real = writers._datasync

    def watched(fd):
        sizes.append(os.fstat(fd).st_size)
        real(fd)

    monkeypatch.setattr(writers, "_datasync", watched)
    return sizes


def _disk_error(fd):  # a disk error met by a write-back, not by a write
    raise OSError(errno.EIO, "Input/output error")


def test_write_back_starts_while_writing_and_its_disk_error_names_the_file(tmp_path, monkeypatch, synced):
    block = np.arange(writers.WRITEBACK_BYTES // 2, dtype=np.uint16)  # WRITEBACK_BYTES bytes a write
    writer = HashingWriter(tmp_path / "train.bin")
    for _ in range(3):
        writer.write(block)
    info = writer.close()
    assert synced and synced[0] >= writers.WRITEBACK_BYTES  # before close, which fsyncs the rest
    data = block.tobytes() * 3
    assert writer.tmp.read_bytes() == data and info["sha256"] == hashlib.sha256(data).hexdigest()

    monkeypatch.setattr(writers, "_datasync", _disk_error)
    writer = HashingWriter(tmp_path / "val.bin")
    with pytest.raises(OSError, match="Input/output error") as raised:  # at the next write-back, or at close
        writer.write(block)
        writer.write(block)
        writer.close()
    assert raised.value.filename == str(tmp_path / "val.bin")
    writer.discard()
    assert not writer.tmp.exists()


def test_shards_start_their_write_back_as_they_fill_and_stay_whole(tmp_path, synced):
    shard = writers.WRITEBACK_BYTES  # tokens a shard: 2 MiB of uint16 each
    tokens = np.random.default_rng(0).integers(0, 50257, 3 * shard + shard // 3).astype(np.uint16)
    writer = ShardWriter(tmp_path, ShardLayout("t_train_", 0, shard, header=True), np.dtype(np.uint16))
    for piece in np.array_split(tokens, 13):  # writes that straddle shard boundaries
        writer.write(piece)
    assert synced and min(synced) >= writers.WRITEBACK_BYTES  # while writing, not only at close
    shards = writer.close()
    for old, new in writer.renames():
        os.replace(old, new)
    read = np.concatenate([np.fromfile(tmp_path / s["file"], dtype=np.uint16)[SHARD_HEADER_BYTES // 2:] for s in shards])
    assert read.tolist() == tokens.tolist()
    assert all(hashlib.sha256((tmp_path / s["file"]).read_bytes()).hexdigest() == s["sha256"] for s in shards)


def test_a_shards_failed_write_back_names_the_shard(tmp_path, monkeypatch):
    monkeypatch.setattr(writers, "_datasync", _disk_error)
    writer = ShardWriter(tmp_path, ShardLayout("t_train_", 0, writers.WRITEBACK_BYTES, header=True),
                         np.dtype(np.uint16))
    with pytest.raises(OSError, match="Input/output error") as raised:
        for _ in range(4):  # the first shard fills, is held, and is finished as the third opens
            writer.write(np.zeros(writers.WRITEBACK_BYTES // 2, dtype=np.uint16))
        writer.close()
    assert raised.value.filename == str(tmp_path / "t_train_000000.bin")
    writer.discard()
    assert not list(tmp_path.iterdir())


LAYOUTS = {"flat": None, "shards": ShardLayout("train_", 0, 7, header=False),
           "shards at documents": ShardLayout("train_", 0, 7, header=True, at_documents=True, min_shards=2)}


@pytest.mark.parametrize("eot", ["none", "append", "prepend"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_documents_written_at_once_are_the_files_of_one_at_a_time(tmp_path, eot, layout):
    # A batch of conversations goes to a split in one call; its files, index and counts must be
    # those of each document started, written and ended on its own.
    rng = np.random.default_rng(1)
    lengths = [3, 1, 9, 4, 4, 2, 12, 5]
    tokens = rng.integers(0, 50, sum(lengths)).astype(np.uint16)
    mask = rng.integers(0, 2, sum(lengths)).astype(np.uint8)
    bounds = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    made = []
    for way in ("one", "all"):
        folder = tmp_path / way
        folder.mkdir()
        writer = SplitWriter(folder, "train", np.dtype(np.uint16), eot, 99, LAYOUTS[layout], masked=True)
        for lo, hi in ((0, 3), (3, 8)):  # two batches, so the second's starts follow the first's
            if way == "all":
                part = bounds[lo:hi + 1]
                writer.write_documents(tokens[part[0]:part[-1]], mask[part[0]:part[-1]], part - part[0])
                continue
            for a, b in zip(bounds[lo:hi], bounds[lo + 1:hi + 1]):
                writer.start_document(int(b - a) + (eot != "none"))
                writer.write(tokens[a:b], mask[a:b])
                writer.end_document()
        info = writer.close()
        made.append((info, {p.name: p.read_bytes() for p in folder.iterdir()}))
    assert made[0] == made[1]
    info = made[0][0]
    assert info["documents"] == len(lengths) and info["supervised"] == int(mask.sum())
