"""The accelerated backend (splintr-rs): tiktoken's ids on adversarial text, byte-identical
prepare output, a runtime check that stops a run, and fallbacks that never change ids silently."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import ADVERSARIAL_ATOMS, make_docs, write_docs, write_spec
from tokpack.format import read_meta
from tokpack.prepare.__main__ import main
from tokpack.prepare.plan import write_sample_corpus
from tokpack.tokenizer import CL100K_PATTERN, NANOCHAT_PATTERN, O200K_PATTERN, R50K_PATTERN, load_encoding
from tokpack.tokenizer import fast

GPT2 = load_encoding("gpt2")
BACKEND = fast.choose_backend(GPT2.library, "splintr")
ENCODINGS = ["gpt2", "cl100k_base", "o200k_base"]  # r50k_base holds gpt2's ranks and pattern
# Pre-tokenizer targets: letter, digit, space and punctuation runs, contractions, categories,
# long runs with no space, lone surrogates, and the special token written as text.
ATOMS = [*ADVERSARIAL_ATOMS, "a" * 300, "9" * 50, " " * 40, "\ud800", "x\udfff", "'S", "’s", "\u200b", "\x00",
         "ǅ", "Ⅻ", "𝔘𝔫", "٣", "\U0010ffff"]
texts = st.one_of(st.lists(st.sampled_from(ATOMS), min_size=1, max_size=60).map("".join), st.text(max_size=200))


def test_differential_examples_option_sets_the_run(pytestconfig):
    assert pytestconfig.getoption("differential_examples") >= 1


@pytest.fixture
def examples(pytestconfig):
    return pytestconfig.getoption("differential_examples")


def _trained(pattern: str) -> tiktoken.Encoding:
    """Ranks of another vocabulary than the public ones: a BPE trained here (rustbpe, as nanochat
    trains) on prose and the adversarial atoms, with ``pattern``."""
    rustbpe = pytest.importorskip("rustbpe", reason='training needs rustbpe: pip install "tokpack[train]"')
    rng = np.random.default_rng(0)
    corpus = make_docs(80) + ["".join(rng.choice([a for a in ATOMS if a.isprintable()], 30)) for _ in range(80)]
    trainer = rustbpe.Tokenizer()
    trainer.train_from_iterator(iter(corpus), 900, pattern=pattern)
    return tiktoken.Encoding(name="trained", pat_str=pattern, special_tokens={"<|endoftext|>": 900},
                             mergeable_ranks={bytes(k): v for k, v in trainer.get_mergeable_ranks()})


# Each proven pattern over the public ranks, and over ranks of its own (nanochat's pattern over gpt2's too).
LIBRARIES = {**{name: lambda name=name: load_encoding(name).library for name in ENCODINGS},
             "gpt2 pattern, trained ranks": lambda: _trained(R50K_PATTERN),
             "cl100k pattern, trained ranks": lambda: _trained(CL100K_PATTERN),
             "nanochat pattern, trained ranks": lambda: _trained(NANOCHAT_PATTERN),
             "nanochat pattern, gpt2 ranks": lambda: tiktoken.Encoding(
                 name="mine", pat_str=NANOCHAT_PATTERN, mergeable_ranks=GPT2.library._mergeable_ranks,
                 special_tokens={"<|endoftext|>": 50256})}


def test_the_proven_patterns_are_every_form_tokpack_knows_them_by():
    assert set(fast.PROVEN) == {R50K_PATTERN, CL100K_PATTERN, O200K_PATTERN, NANOCHAT_PATTERN}
    assert {load_encoding(name).library._pat_str for name in ENCODINGS} <= set(fast.PROVEN)


@pytest.mark.parametrize("case", LIBRARIES)
def test_splintr_gives_tiktokens_ids_on_adversarial_text(examples, case):
    library = LIBRARIES[case]()
    backend = fast.choose_backend(library, "splintr")

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(batch=st.lists(texts, min_size=1, max_size=4))
    def check(batch):
        got = backend.encode_batch(batch)
        assert [ids.tolist() for ids in got] == [library.encode_ordinary(t) for t in batch]

    check()


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base"])
def test_the_vocabularies_splintr_ships_load_offline_only_if_they_hash_as_tiktoken_pins(name, monkeypatch):
    from tokpack import tokenizer

    enc = tokenizer._bundled_by_splintr(name)
    assert tokenizer.ranks_sha256(enc) == tokenizer.PINNED_RANKS_SHA256[name]
    assert enc.encode("hello <|endoftext|>", allowed_special="all")[-1] == enc.eot_token
    monkeypatch.setitem(tokenizer.PINNED_RANKS_SHA256, name, "0" * 64)  # a vocabulary that is not the published one
    with pytest.warns(UserWarning, match=f"ships a {name} vocabulary that hashes"):
        assert tokenizer._bundled_by_splintr(name) is None


def _prepared_bytes(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.suffix in (".bin", ".idx")}


def test_prepare_with_splintr_is_byte_identical_to_tiktoken(tmp_path):
    writable = [a for a in ATOMS if not any("\ud800" <= ch <= "\udfff" for ch in a)]  # files hold UTF-8
    adversarial = write_docs(tmp_path / "adv", ["".join(np.random.default_rng(i).choice(writable, 40))
                                                for i in range(30)] + make_docs(20))
    for corpus, encoding in ((write_sample_corpus(tmp_path / "sample"), "gpt2"), (adversarial, "gpt2"),
                             (adversarial, "cl100k_base")):
        runs = {}
        for backend in ("splintr", "tiktoken"):
            out = tmp_path / f"{corpus.name}-{encoding}-{backend}"
            checked = ["--check-fraction", "1"] if backend == "splintr" else []  # tiktoken has nothing to check
            assert main([str(corpus), "--out-dir", str(out), "--backend", backend, "--quiet", "--encoding", encoding,
                         *checked]) == 0
            runs[backend] = _prepared_bytes(out)
            assert read_meta(out)["encoding"]["backend"]["name"] == backend
        assert runs["splintr"] == runs["tiktoken"] and runs["splintr"]


def test_a_difference_found_while_running_stops_the_run_and_publishes_nothing(tmp_path, capsys, monkeypatch):
    real = fast.SplintrBackend.encode_flat

    def one_wrong_id(self, batch):
        flat, bounds = real(self, batch)
        if batch != [fast._PROBE] and len(flat) > 5:  # past the probe at start-up
            flat = flat.copy()
            flat[3] += 1
        return flat, bounds

    monkeypatch.setattr(fast.SplintrBackend, "encode_flat", one_wrong_id)
    corpus = write_docs(tmp_path / "c", make_docs(30))
    with pytest.raises(SystemExit) as exc:
        main([str(corpus), "--out-dir", str(tmp_path / "out"), "--backend", "splintr", "--check-fraction", "1",
              "--quiet"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "\n" not in err
    assert f"backend splintr {BACKEND.version} gave other ids than tiktoken at character" in err
    assert not (tmp_path / "out").exists()


def test_fallbacks_are_tiktoken_with_one_warning_or_one_line_when_asked(tmp_path, capsys, monkeypatch):
    corpus = write_docs(tmp_path / "c", make_docs(10))
    spec = write_spec(tmp_path / "tok", "mytok", r"\S+|\s+", {"<|endoftext|>": 50256})
    with pytest.raises(SystemExit):  # a split pattern the differential test does not cover
        main([str(corpus), "--out-dir", str(tmp_path / "o1"), "--encoding", str(spec), "--backend", "splintr"])
    assert f"proven here for {fast.PROVEN_FOR} only, not the pattern of 'mytok'" in capsys.readouterr().err
    assert main([str(corpus), "--out-dir", str(tmp_path / "o1"), "--encoding", str(spec), "--quiet"]) == 0
    assert read_meta(tmp_path / "o1")["encoding"]["backend"]["name"] == "tiktoken"  # auto: tiktoken, no word
    assert "splintr" not in capsys.readouterr().err

    def broken(self, enc):
        raise RuntimeError("no vocabulary")

    monkeypatch.setattr(fast.SplintrBackend, "__init__", broken)
    fast._built.cache_clear()  # built once a process: this one builds afresh, and fails
    assert main([str(corpus), "--out-dir", str(tmp_path / "o2"), "--quiet"]) == 0
    warning = [line for line in capsys.readouterr().err.splitlines() if "splintr" in line]
    assert len(warning) == 1 and "failed to build gpt2 (RuntimeError: no vocabulary); encoding with tiktoken" in \
        warning[0]
    assert read_meta(tmp_path / "o2")["encoding"]["backend"]["name"] == "tiktoken"
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "splintr", None)  # the extra is not installed: tiktoken, no word
    assert main([str(corpus), "--out-dir", str(tmp_path / "o3"), "--quiet"]) == 0
    assert "splintr" not in capsys.readouterr().err
    assert json.loads((tmp_path / "o3" / "meta.json").read_text())["encoding"]["backend"]["name"] == "tiktoken"
    with pytest.raises(SystemExit):
        main([str(corpus), "--out-dir", str(tmp_path / "o4"), "--backend", "splintr"])
    assert 'needs splintr-rs; pip install "tokpack[fast]"' in capsys.readouterr().err


def test_the_checked_share_is_chosen_by_each_texts_ids_whatever_its_batch():
    # A text is checked or not by its own ids and the seed: the same in any batch, on any run, and
    # about the asked share of the texts with ids.
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 12, 40_000)
    bounds = np.concatenate(([0], np.cumsum(lengths)))
    flat = rng.integers(0, 50_000, int(bounds[-1])).astype(np.uint32)
    chosen = fast.sampled(flat, bounds, 7, 0.05)
    filled = np.count_nonzero(lengths)
    assert abs(len(chosen) / filled - 0.05) < 0.01 and lengths[chosen].all()
    half = len(lengths) // 2  # the second half alone, as a batch of its own
    alone = fast.sampled(flat[bounds[half]:], bounds[half:] - bounds[half], 7, 0.05)
    assert (alone + half).tolist() == chosen[chosen >= half].tolist()
    other = fast.sampled(flat, bounds, 8, 0.05)
    assert len(np.intersect1d(chosen, other)) < len(chosen) / 4  # another seed, other texts
    assert not len(fast.sampled(flat, bounds, 7, 0.0)) and len(fast.sampled(flat, bounds, 7, 1.0)) == len(lengths)
