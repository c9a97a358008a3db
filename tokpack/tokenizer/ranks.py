"""The ``.tiktoken`` form of a vocabulary: ``<base64 token> <rank>`` lines in rank order, read
(checked), written and hashed in one place.

A vocabulary's identity (``ranks_sha256``, in meta.json) is the sha256 of this form, so equal
vocabularies hash equal whatever file they were loaded from, and splintr is built from the same
bytes, made once an encoding. Reading, writing and hashing are O(ranks), in bulk: a process that
loads a tokenizer pays for them before its first token.

See docs/tokenizers.md.
"""

from __future__ import annotations

import binascii
import hashlib
from collections.abc import Mapping
from functools import lru_cache
from operator import itemgetter
from pathlib import Path
from typing import Any

from ..format import read_file

# The largest vocabulary file read (o200k_base's ranks are 3.6 MB, the largest tokenizer.json
# files in use a few tens of MB).
MAX_FILE_BYTES = 128 << 20
_FIX = "pass a .tiktoken file of '<base64 token> <rank>' lines"


def read_ranks(path: Path) -> dict[bytes, int]:
    """A ``.tiktoken`` file: one ``<base64 token> <rank>`` line a token, no token or rank twice,
    every byte ranked."""
    data = read_file(path, "encoding file", _FIX, MAX_FILE_BYTES)
    ranks = _in_bulk(data)
    if ranks is None:
        ranks = _line_by_line(path, data)
    # tiktoken fails on a byte it has no rank for, and an accelerated backend would leave it out.
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise ValueError(f"{path} gives no rank to the byte {missing[0]:#04x} ({len(missing)} of the 256 bytes have "
                         "none), so text holding it cannot be encoded; a byte-level vocabulary ranks every byte")
    return ranks


def _in_bulk(data: bytes) -> dict[bytes, int] | None:
    """The ranks of a file whose every line is ``token rank`` with one space, read without a Python
    step a line (a third of the time); None for any other file or any fault, which the reading
    line by line then finds and names."""
    lines = data.count(b"\n") + (not data.endswith(b"\n"))
    if not data or any(c in data for c in (b"\t", b"\r", b"\x0b", b"\x0c", b"\n\n")) or data.startswith(b"\n") \
            or data.count(b" ") != lines:
        return None
    fields = data.split()
    if len(fields) != 2 * lines:  # a line with no token or no rank
        return None
    try:
        tokens = [binascii.a2b_base64(token, strict_mode=True) for token in fields[0::2]]
        ids = list(map(int, fields[1::2]))
    except (ValueError, binascii.Error):
        return None
    ranks = dict(zip(tokens, ids))
    if len(ranks) != lines or len(set(ids)) != lines or min(ids) < 0 or max(ids) >= 2**31:
        return None
    return ranks


def _line_by_line(path: Path, data: bytes) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    seen: set[int] = set()
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            token, rank = binascii.a2b_base64(parts[0], strict_mode=True), int(parts[1])
            if len(parts) != 2 or not 0 <= rank < 2**31:
                raise ValueError
        except (ValueError, IndexError, binascii.Error):
            raise ValueError(f"line {number} of {path} is not '<base64 token> <rank>'; {_FIX}") from None
        if token in ranks or rank in seen:
            raise ValueError(f"line {number} of {path} repeats a {'token' if token in ranks else 'rank'} of an "
                             "earlier line; a .tiktoken file holds each token and each rank once")
        ranks[token] = rank
        seen.add(rank)
    if not ranks:
        raise ValueError(f"{path} holds no ranks; {_FIX}")
    return ranks


def tiktoken_lines(ranks: Mapping[bytes, int]) -> bytes:
    """``ranks`` in .tiktoken form."""
    return b"".join([binascii.b2a_base64(token, newline=False) + b" %d\n" % rank
                     for token, rank in sorted(ranks.items(), key=itemgetter(1))])


@lru_cache(maxsize=2)
def ranks_file(enc: Any) -> bytes:
    """The ranks of ``enc`` (a ``tiktoken.Encoding``) in .tiktoken form, made once an encoding."""
    return tiktoken_lines(enc._mergeable_ranks)


def ranks_sha256(enc: Any) -> str:
    """sha256 of the ranks of ``enc`` (a ``tiktoken.Encoding``) in .tiktoken form, so equal
    vocabularies hash equal, whatever file they were loaded from."""
    return hashlib.sha256(ranks_file(enc)).hexdigest()
