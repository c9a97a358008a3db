"""Hugging Face tokenizers, built here (nothing downloaded): exact ids, the end-of-text token,
the recorded vocabulary, and a missing extra as one line."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from helpers import ADVERSARIAL_ATOMS, make_docs, write_docs, write_gpt2_tokenizer
from tokpack.evaluation import byte_lengths
from tokpack.evaluation import main as evaluate_main
from tokpack.format import INDEX_DTYPE, read_meta
from tokpack.prepare.__main__ import main
from tokpack.corpus import pieces
from tokpack.tokenizer import load_encoding, safe_cut


TEXTS = make_docs(40, words=120) + [
    "naïve café — 日本語 ünïcödé, 12345 items; it's 2026's\n\n  tabs\tand  spaces", "x" * 3000, "  lead"]


def _trained(folder: Path, pre_tokenizer, decoder, specials, **kwargs) -> Path:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer, tok.decoder = pre_tokenizer, decoder
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=400, special_tokens=specials, **kwargs))
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


@pytest.fixture(scope="module")
def gpt2_hf(tmp_path_factory):
    return load_encoding(str(write_gpt2_tokenizer(tmp_path_factory.mktemp("gpt2-hf"))))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(text=st.lists(st.sampled_from(ADVERSARIAL_ATOMS), min_size=1, max_size=80).map("".join),
       piece_chars=st.integers(2, 12))
def test_gpt2s_own_pipeline_is_cut_safe(gpt2_hf, text, piece_chars):
    assert gpt2_hf.can_cut
    parts = [p.text for p in pieces(iter([iter([text])]), piece_chars, cut=safe_cut)]
    assert [t for part in parts for t in gpt2_hf.encode_ordinary(part)] == gpt2_hf.encode_ordinary(text)


def test_pipelines_not_proven_are_never_cut(tmp_path):
    for pre_tokenizer in (pre_tokenizers.ByteLevel(add_prefix_space=True), pre_tokenizers.Metaspace()):
        path = _trained(tmp_path / type(pre_tokenizer).__name__, pre_tokenizer, decoders.ByteLevel(),
                        ["<|endoftext|>"])
        assert not load_encoding(str(path)).can_cut  # unproven: encoded a document at a time


def _documents(out, split):
    tokens = np.fromfile(out / f"{split}.bin", dtype=np.dtype(read_meta(out)["dtype"]))
    starts = np.fromfile(out / f"{split}.idx", dtype=INDEX_DTYPE).astype(np.int64)
    return [part.tolist() for part in np.split(tokens, starts[1:])]


def test_gpt2_as_a_tokenizer_json_prepares_the_very_bytes_of_tiktoken_gpt2(tmp_path):
    folder = write_gpt2_tokenizer(tmp_path / "gpt2-hf")
    enc = load_encoding(str(folder))
    gpt2 = load_encoding("gpt2")
    assert enc.describe()["backend"]["name"] == "tokenizers" and enc.eot_token == 50256 and enc.n_vocab == 50257
    assert all(enc.encode_ordinary(t) == gpt2.encode_ordinary(t) for t in TEXTS)
    assert np.array_equal(byte_lengths(enc), byte_lengths(gpt2))  # bits/byte counts the same bytes
    corpus = write_docs(tmp_path / "c", TEXTS)
    assert main([str(corpus), "--out-dir", str(tmp_path / "hf"), "--tokenizer", str(folder), "--quiet"]) == 0
    assert main([str(corpus), "--out-dir", str(tmp_path / "tt"), "--quiet"]) == 0
    for name in ("train.bin", "val.bin", "train.idx", "val.idx"):
        assert (tmp_path / "hf" / name).read_bytes() == (tmp_path / "tt" / name).read_bytes(), name
    meta = read_meta(tmp_path / "hf")
    assert meta["encoding"]["ranks_sha256"] == enc.vocab_sha256 and meta["dtype"] == "uint16"


@pytest.mark.parametrize("kind", ["metaspace", "digits"])
def test_trained_tokenizers_give_their_own_ids_plus_the_end_of_text(tmp_path, kind, capsys):
    if kind == "metaspace":  # SentencePiece's way: not cut-safe (a space is prepended to the first word only)
        path = _trained(tmp_path / kind, pre_tokenizers.Metaspace(prepend_scheme="first"), decoders.Metaspace(),
                        ["<s>", "</s>"])
    else:  # nanochat's way: numbers in pairs of digits, then byte-level
        pattern = Regex(r"'(?i:[sdtm]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s+")
        path = _trained(tmp_path / kind, pre_tokenizers.Sequence([
            pre_tokenizers.Split(pattern, "isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
            decoders.ByteLevel(), ["<|endoftext|>", "<|bos|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer.from_file(str(path))
    corpus = write_docs(tmp_path / "c", TEXTS)
    out = tmp_path / "out"
    argv = [str(corpus), "--out-dir", str(out), "--tokenizer", str(path), "--quiet", "--piece-chars", "50"]
    if kind == "metaspace":  # two special tokens and no config: which ends a document is not guessed
        with pytest.raises(SystemExit):
            main(argv)
        assert "names no end-of-text token unambiguously (special tokens: <s>, </s>); pass --eot-token" in \
            capsys.readouterr().err
        (path.parent / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    assert main(argv) == 0
    eot = tok.token_to_id("</s>" if kind == "metaspace" else "<|endoftext|>")
    expected = [tok.encode(t, add_special_tokens=False).ids + [eot] for t in TEXTS]
    got = _documents(out, "train") + _documents(out, "val")
    assert sorted(got) == sorted(expected)  # each document whole, never cut, whatever --piece-chars says
    assert read_meta(out)["encoding"]["eot_id"] == eot
    assert main([*argv, "--out-dir", str(tmp_path / "bos"), "--eot", "prepend", "--eot-token", "<s>" if
                 kind == "metaspace" else "<|bos|>"]) == 0
    bos = tok.token_to_id("<s>" if kind == "metaspace" else "<|bos|>")
    assert all(doc[0] == bos for doc in _documents(tmp_path / "bos", "train"))


def test_readers_refuse_a_tokenizer_json_that_changed_after_prepare(tmp_path, capsys):
    folder = write_gpt2_tokenizer(tmp_path / "tok")
    corpus = write_docs(tmp_path / "c", TEXTS)
    out = tmp_path / "out"
    assert main([str(corpus), "--out-dir", str(out), "--tokenizer", str(folder), "--quiet"]) == 0
    assert evaluate_main([str(out), "--model", "unigram", "--quiet"]) == 0
    capsys.readouterr()
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_special_tokens(["<|extra|>"])
    tok.save(str(folder / "tokenizer.json"))
    with pytest.raises(SystemExit):
        evaluate_main([str(out), "--model", "unigram", "--quiet"])
    assert "now loads ranks" in capsys.readouterr().err


def test_hf_errors_are_one_line(tmp_path, capsys, monkeypatch):
    corpus = write_docs(tmp_path / "c", make_docs(10))
    folder = write_gpt2_tokenizer(tmp_path / "tok")
    cases = {"--eot-token '<|nope|>' is not a token of": ["--tokenizer", str(folder), "--eot-token", "<|nope|>"],
             "--eot-token applies to Hugging Face tokenizers": ["--eot-token", "<|endoftext|>"]}
    (tmp_path / "bad" ).mkdir()
    (tmp_path / "bad" / "tokenizer.json").write_text("{not json")
    cases["is not a Hugging Face tokenizer.json"] = ["--tokenizer", str(tmp_path / "bad")]
    for fragment, extra in cases.items():
        with pytest.raises(SystemExit) as exc:
            main([str(corpus), "--out-dir", str(tmp_path / "o"), "--quiet", *extra])
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and fragment in err and "\n" not in err, err
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # the extra is not installed
    with pytest.raises(SystemExit):
        main([str(corpus), "--out-dir", str(tmp_path / "o"), "--quiet", "--tokenizer", str(tmp_path / "bad")])
    assert 'needs the tokenizers library; pip install "tokpack[hf]"' in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_tokenizer_file_of_any_name_is_a_hugging_face_tokenizer(tmp_path, capsys):
    # The quicktour saves tokenizer-wiki.json; --encoding X.json decides by the file's content.
    folder = write_gpt2_tokenizer(tmp_path / "tok")
    renamed = tmp_path / "tokenizer-wiki.json"
    (folder / "tokenizer.json").rename(renamed)
    corpus = write_docs(tmp_path / "c", make_docs(20))
    for flag in ("--tokenizer", "--encoding"):
        out = tmp_path / f"out{flag}"
        assert main([str(corpus), "--out-dir", str(out), flag, str(renamed), "--quiet"]) == 0
        assert read_meta(out)["encoding"]["backend"]["name"] == "tokenizers"
    spec = tmp_path / "spec" / "mine.json"
    spec.parent.mkdir()
    spec.write_text(json.dumps({"ranks": "mine.tiktoken", "pattern": "r50k_base",
                                "special_tokens": {"<|endoftext|>": 50256}, "eot": "<|endoftext|>"}))
    from helpers import write_tiktoken_file

    write_tiktoken_file(spec.parent / "mine.tiktoken")
    with pytest.raises(SystemExit):  # --tokenizer means Hugging Face: a spec is refused, not guessed
        main([str(corpus), "--out-dir", str(tmp_path / "o"), "--tokenizer", str(spec), "--quiet"])
    assert "is not a Hugging Face tokenizer.json" in capsys.readouterr().err
    assert main([str(corpus), "--out-dir", str(tmp_path / "spec-out"), "--encoding", str(spec), "--quiet"]) == 0


@pytest.mark.parametrize("config", ["[1, 2]", '"eos"', "null", "7", "{not json", "{}"])
def test_a_tokenizer_config_that_is_no_json_object_is_refused_naming_it(tmp_path, config):
    folder = write_gpt2_tokenizer(tmp_path / "tok")
    (folder / "tokenizer_config.json").write_text(config)
    if config == "{}":  # names no token: the one special token ends a text
        assert load_encoding(str(folder)).eot_token == 50256
        return
    with pytest.raises(ValueError, match=f"{re.escape(str(folder / 'tokenizer_config.json'))}.*fix it") as err:
        load_encoding(str(folder))
    assert "\n" not in str(err.value)


def test_an_oversized_tokenizer_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from tokpack.tokenizer import vocab

    folder = write_gpt2_tokenizer(tmp_path / "tok")
    monkeypatch.setattr(vocab, "MAX_FILE_BYTES", 1000)
    with pytest.raises(ValueError, match=r"tokenizer file .*tokenizer.json is [\d,]+ bytes, more than the 1,000"):
        load_encoding(str(folder))


def test_an_ordinary_token_as_end_of_text_is_warned_about(tmp_path, capsys):
    folder = write_gpt2_tokenizer(tmp_path / "tok")
    corpus = write_docs(tmp_path / "c", make_docs(40))
    assert main([str(corpus), "--out-dir", str(tmp_path / "o"), "--tokenizer", str(folder), "--eot-token", "Ġ",
                 "--quiet"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "ordinary token" in line]
    assert len(warned) == 1 and "--eot-token 'Ġ' is an ordinary token" in warned[0]


@pytest.mark.parametrize("extra,fragment", [
    (["--eot-token", "<|endoftext|>"], "--eot-token applies to Hugging Face tokenizers"),
    (["--backend", "tiktoken", "--check-fraction", "0.5"], "--check-fraction 0.5 checks an accelerated backend"),
    (["--val-tokens", "50", "--val-fraction", "0.3"], "--val-fraction 0.3 does nothing beside --val-tokens"),
    (["--tokenizer", "TOK", "--encoding", "gpt2"], "each name the tokenizer; pass one of them"),
    (["--tokenizer", "TOK", "--backend", "splintr"], "--backend splintr applies to tiktoken encodings"),
])
def test_a_flag_that_would_do_nothing_is_refused(tmp_path, capsys, extra, fragment):
    folder = write_gpt2_tokenizer(tmp_path / "tok")
    corpus = write_docs(tmp_path / "c", make_docs(10))
    with pytest.raises(SystemExit) as exc:
        main([str(corpus), "--out-dir", str(tmp_path / "o"), "--quiet", *[str(folder) if a == "TOK" else a
                                                                            for a in extra]])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and fragment in err and "\n" not in err, err
    assert not (tmp_path / "o").exists()


def test_special_token_text_in_a_document_is_ordinary_text_unless_asked(tmp_path, capsys):
    # A web page that writes "<|endoftext|>": by default its text, as tiktoken's encode_ordinary
    # gives it, so the end-of-text id marks document boundaries only.
    folder = write_gpt2_tokenizer(tmp_path / "tok")
    gpt2 = load_encoding("gpt2")
    text = "a page that writes <|endoftext|> in its text"
    assert load_encoding(str(folder)).encode_ordinary(text) == gpt2.encode_ordinary(text)
    assert 50256 in load_encoding(str(folder), special_text="special").encode_ordinary(text)
    docs = [text, "another <|endoftext|>document", "plain"] * 10
    corpus = write_docs(tmp_path / "c", docs)
    for mode, inside in (("ordinary", 0), ("special", 2 * 10)):
        out = tmp_path / mode
        assert main([str(corpus), "--out-dir", str(out), "--tokenizer", str(folder), "--special-text", mode,
                     "--quiet"]) == 0
        ids = [t for split in ("train", "val") for doc in _documents(out, split) for t in doc[:-1]]
        assert ids.count(50256) == inside  # end-of-text ids inside documents, not at their ends
        assert read_meta(out)["options"]["special_text"] == mode
    with pytest.raises(SystemExit):
        main([str(corpus), "--out-dir", str(tmp_path / "tt"), "--special-text", "special", "--quiet"])
    assert "--special-text special applies to Hugging Face tokenizers" in capsys.readouterr().err


def test_documents_led_by_the_token_take_the_configs_bos_token(tmp_path):
    path = _trained(tmp_path / "tok", pre_tokenizers.Metaspace(prepend_scheme="first"), decoders.Metaspace(),
                    ["<s>", "</s>"])
    config = {"bos_token": "<s>", "eos_token": {"content": "</s>"}}
    (path.parent / "tokenizer_config.json").write_text(json.dumps(config))
    tok = Tokenizer.from_file(str(path))
    corpus = write_docs(tmp_path / "c", TEXTS)
    for eot, token, first in (("append", "</s>", False), ("prepend", "<s>", True)):
        out = tmp_path / eot
        assert main([str(corpus), "--out-dir", str(out), "--tokenizer", str(path), "--eot", eot, "--quiet"]) == 0
        docs = _documents(out, "train")
        assert all((doc[0] if first else doc[-1]) == tok.token_to_id(token) for doc in docs)
        assert read_meta(out)["encoding"]["eot_id"] == tok.token_to_id(token)
    assert evaluate_main([str(tmp_path / "prepend"), "--model", "unigram", "--quiet"]) == 0  # readers agree


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(conversations=st.lists(st.lists(st.lists(st.sampled_from([*ADVERSARIAL_ATOMS, "<|endof", "text|>"]),
                                                max_size=12).map("".join), min_size=1, max_size=5),
                              min_size=1, max_size=4))
def test_encode_marked_is_each_stretch_encoded_alone_with_the_marks_between(gpt2_hf, conversations):
    from tokpack.tokenizer.specials import specials_apart
    from tokpack.tokenizer.encoder import encode_marked_stretches

    gpt2, mark = load_encoding("gpt2"), "<|endoftext|>"
    assert specials_apart(gpt2.specials)  # so a text that holds no special token may stand between them
    stretches = [s for s in conversations if not any(mark in part for part in s)]  # as a renderer admits them
    texts = [mark + mark.join(s) for s in stretches]
    expected = [[gpt2.eot_token, *[t for part in s for t in [*gpt2.encode_ordinary(part), gpt2.eot_token]][:-1]]
                for s in stretches]
    marks = frozenset([mark])
    held = [len(s) for s in stretches]
    splintr = gpt2.with_backend("splintr", 1.0, 0)
    for ids, bounds in (gpt2.encode_marked(texts, marks), gpt2.encode_marked(texts, marks, held),
                        splintr.encode_marked(texts, marks, held), gpt2_hf.encode_marked(texts, marks),
                        encode_marked_stretches(gpt2_hf, texts, marks)):
        assert ids.dtype == np.uint32 and len(bounds) == len(texts) + 1 and bounds[-1] == len(ids)
        assert [ids[a:b].tolist() for a, b in zip(bounds, bounds[1:])] == expected


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.lists(st.sampled_from([*ADVERSARIAL_ATOMS, "<|endof", "text|>", "\ud800"]), max_size=8)
                      .map("".join), max_size=12))
def test_encode_flat_is_each_text_encoded_alone(gpt2_hf, texts):
    # One call for many short texts: tiktoken joins them by <|endoftext|> (each alone where a text
    # holds it), splintr and tokenizers encode the batch; all must be encode_ordinary of each text.
    gpt2 = load_encoding("gpt2")
    expected = [gpt2.encode_ordinary(text) for text in texts]
    for enc in (gpt2, gpt2.with_backend("splintr", 1.0, 0), gpt2_hf):
        ids, bounds = enc.encode_flat(texts)
        assert ids.dtype == np.uint32 and len(bounds) == len(texts) + 1 and bounds[-1] == len(ids)
        assert [ids[a:b].tolist() for a, b in zip(bounds, bounds[1:])] == expected, enc
