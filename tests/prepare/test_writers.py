"""The writers' own promises: what is written is what was given, and hashed as written."""

from __future__ import annotations

import hashlib

import numpy as np

from tokpack.prepare.writers import HashingWriter


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
