"""Megatron-LM's indexed datasets: the ``.idx`` beside a flat ``.bin``, read and written.

    python -m tokpack.prepare corpus/ --format megatron      # train_text_document.bin/.idx

An index (MMIDIDX version 1) holds a dtype code, the sequence and document counts, each
sequence's length (int32), its byte pointer (int64) and the document boundaries (int64), as
Megatron's ``preprocess_data.py`` writes them. Reading one checks it against the tokens of its
``.bin``, so no tail of the ``.bin`` is served as tokens. See docs/formats.md.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from . import INDEX_DTYPE

MAGIC = b"MMIDIDX\x00\x00"  # then a uint64 version and a one-byte dtype code
DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}
# What Megatron's preprocessing writes for token ids (uint16 under 65,500 ids, else int32).
TOKEN_DTYPES = ("uint16", "int32")
CODES = {"uint16": 8, "uint32": 4}  # tokpack's widths as Megatron declares them (ids < 2**31)
_FIX = "re-create it with Megatron's preprocess_data.py or python -m tokpack.prepare --format megatron"


def is_index(index: Path) -> bool:
    """Whether ``index`` is a Megatron ``.idx`` (it starts with MMIDIDX), not tokpack's."""
    if not index.is_file():
        return False
    with open(index, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


def token_dtype(path: Path) -> np.dtype:
    """The dtype the ``.idx`` beside ``path`` declares, refused unless it is one of token ids."""
    with open(path.with_suffix(".idx"), "rb") as f:
        head = f.read(len(MAGIC) + 9)
    code = head[len(MAGIC) + 8] if len(head) == len(MAGIC) + 9 else -1
    if DTYPES.get(code) not in TOKEN_DTYPES:
        named = DTYPES.get(code, f"code {code}")
        raise ValueError(f"{path.with_suffix('.idx')} declares dtype {named}, which is not a token dtype (it "
                         f"could hold negative or fractional ids); Megatron writes {' or '.join(TOKEN_DTYPES)}: "
                         "re-create the dataset")
    return np.dtype(DTYPES[code])


def document_starts(index: Path, tokens: int, itemsize: int) -> np.ndarray:
    """The token offset of every document of the Megatron ``.idx`` at ``index``, checked against
    the ``tokens`` of its ``.bin`` (``parse_starts``)."""
    return parse_starts(np.memmap(index, dtype=np.uint8, mode="r"), tokens, itemsize, str(index))


def parse_starts(raw: np.ndarray, tokens: int, itemsize: int, where: str) -> np.ndarray:
    """The token offset of every document of a Megatron index's bytes ``raw`` (read from
    ``where``), checked to describe the ``tokens`` of its ``.bin`` in order."""
    head = len(MAGIC) + 8 + 1 + 16
    if len(raw) < head or bytes(raw[:len(MAGIC)]) != MAGIC:
        raise ValueError(f"{where} is not a Megatron index (no MMIDIDX header); {_FIX}")
    version, = np.frombuffer(raw[9:17], dtype="<u8")
    sequences, documents = (int(v) for v in np.frombuffer(raw[18:34], dtype="<u8"))
    if version != 1 or len(raw) < head + sequences * 12 + documents * 8 or documents < 1:
        raise ValueError(f"{where} declares version {version}, {sequences} sequences and {documents - 1} documents, "
                         f"which its {len(raw)} bytes do not hold; {_FIX}")
    lengths = np.frombuffer(raw[head:head + 4 * sequences], dtype="<i4").astype(np.int64)
    pointers = np.frombuffer(raw[head + 4 * sequences:head + 12 * sequences], dtype="<i8")
    document_indices = np.frombuffer(raw[head + 12 * sequences:head + 12 * sequences + 8 * documents], dtype="<i8")
    expected = np.concatenate([[0], np.cumsum(lengths[:-1])]) * itemsize
    if ((lengths <= 0).any() or not np.array_equal(pointers, expected) or lengths.sum() != tokens
            or document_indices[0] != 0 or document_indices[-1] != sequences or (np.diff(document_indices) <= 0).any()):
        raise ValueError(f"{where} does not describe the {tokens} tokens of its .bin in order (lengths, pointers or "
                         f"document indices disagree); {_FIX}")
    return pointers[document_indices[:-1]] // itemsize


def write_index(write: Callable[[bytes], Any], starts_file: Path, documents: int, tokens: int,
                dtype: np.dtype, chunk: int = 1 << 20) -> None:
    """A Megatron ``.idx``, one sequence a document as Megatron's preprocess_data.py writes it, for
    the documents whose starts a tokpack ``.idx`` holds; streamed ``chunk`` documents at a time."""
    write(MAGIC + np.array([1], "<u8").tobytes() + bytes([CODES[dtype.name]])
          + np.array([documents, documents + 1], "<u8").tobytes())
    for section in ("lengths", "pointers"):
        for lo in range(0, documents, chunk):
            count = min(chunk, documents - lo)
            starts = np.fromfile(starts_file, dtype=INDEX_DTYPE, count=count + 1, offset=lo * 8).astype(np.int64)
            if section == "lengths":
                ends = starts[1:] if len(starts) > count else np.append(starts[1:], tokens)
                write((ends - starts[:count]).astype("<i4").tobytes())
            else:
                write((starts[:count] * dtype.itemsize).astype("<i8").tobytes())
    for lo in range(0, documents + 1, chunk):
        write(np.arange(lo, min(lo + chunk, documents + 1), dtype="<i8").tobytes())
