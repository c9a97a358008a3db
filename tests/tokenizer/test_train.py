"""Training a tokenizer on a corpus: nanochat's vocabulary from nanochat's call sequence, three
files that encode alike, byte-identical reruns, prepare and evaluate with it, bad input in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tiktoken

from helpers import ADVERSARIAL_ATOMS, byte_unigram, make_docs, write_docs
from tokpack.tokenizer import NANOCHAT_PATTERN, load_encoding
from tokpack.tokenizer.__main__ import main
from tokpack.chat import NANOCHAT_TOKENS
from tokpack.tokenizer.train import FILES

rustbpe = pytest.importorskip("rustbpe", reason='training needs rustbpe: pip install "tokpack[train]"')

def _topics() -> list[str]:
    from pydoc_data.topics import topics  # English prose that ships with CPython

    return [text for _, text in sorted(topics.items())]


DOCS = _topics()[:70] + ["naïve café — 日本語 ünïcödé, 12345 items; it's 2026's\n\n  tabs\tand"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("train")
    write_docs(folder / "text", DOCS[:40])
    (folder / "text" / "web.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS[40:]))
    return folder / "text"


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("tok") / "tok"
    assert main(["train", str(corpus), "--vocab-size", "600", "--out", str(out), "--special", "nanochat",
                 "--max-chars", "20000", "--doc-cap", "500", "--quiet"]) == 0
    return out


def _nanochat_tok_train(texts, max_chars, doc_cap, vocab_size):
    """A miniature of nanochat's scripts/tok_train.py with its RustBPETokenizer.train_from_iterator:
    the same text iterator, the same trainer calls, the same special tokens after the ranks."""
    def text_iterator():
        nchars = 0
        for doc in texts:
            doc_text = doc[:doc_cap] if len(doc) > doc_cap else doc
            nchars += len(doc_text)
            yield doc_text
            if nchars > max_chars:
                return

    tokenizer = rustbpe.Tokenizer()
    tokenizer.train_from_iterator(text_iterator(), vocab_size - len(NANOCHAT_TOKENS), pattern=NANOCHAT_PATTERN)
    ranks = {bytes(k): v for k, v in tokenizer.get_mergeable_ranks()}
    specials = {name: len(ranks) + i for i, name in enumerate(NANOCHAT_TOKENS)}
    return tiktoken.Encoding(name="rustbpe", pat_str=tokenizer.get_pattern(), mergeable_ranks=ranks,
                             special_tokens=specials)


def test_the_vocabulary_is_nanochats_for_the_same_text_budget_and_pattern(trained, corpus):
    from tokpack.corpus import ReadOptions, documents
    from tokpack.inputs import resolve_inputs

    texts = ["".join(runs) for runs in documents(resolve_inputs([str(corpus)]), ReadOptions())]
    anchor = _nanochat_tok_train(texts, 20000, 500, 600)
    ours = load_encoding(str(trained / "tokenizer.toml"))
    assert ours.library._mergeable_ranks == anchor._mergeable_ranks  # rank for rank, not just the size
    assert ours.library._special_tokens == anchor._special_tokens
    assert ours.eot_token == anchor._special_tokens["<|bos|>"]
    record = json.loads((trained / "training.json").read_text())
    assert record["ranks_sha256"] == ours.vocab_sha256 and record["budget_reached"] and record["vocab_size"] == 600
    assert 20000 < record["chars"] <= 20500 and record["documents"] < len(DOCS)


def test_the_spec_the_tokenizer_json_and_tiktoken_encode_alike(trained):
    spec = load_encoding(str(trained / "tokenizer.toml"))
    hf = load_encoding(str(trained / "tokenizer.json"))
    raw = spec.library
    rng = np.random.default_rng(0)
    held_out = make_docs(30, seed=99, words=80) + ["".join(rng.choice(ADVERSARIAL_ATOMS, 60)) for _ in range(30)]
    for text in held_out:
        expected = raw.encode_ordinary(text)
        assert spec.encode_ordinary(text) == expected and hf.encode_ordinary(text) == expected, text
        assert hf.decode(expected) == text
    assert hf.n_vocab == spec.n_vocab and hf.eot_token == spec.eot_token  # <|bos|>, from tokenizer_config.json


def test_transformers_reads_special_token_text_in_a_document_as_prepare_does(trained):
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoTokenizer.from_pretrained(trained)
    text = "a web page that writes <|bos|> and <|user_start|> in its text"
    ours = load_encoding(str(trained / "tokenizer.json"))
    [ids] = ours.encode_batch([text])
    assert theirs(text, add_special_tokens=False)["input_ids"] == ids.tolist()
    assert not set(ids.tolist()) & set(ours.special_ids)  # text, never a control token


def test_training_again_writes_the_same_bytes(trained, corpus, tmp_path):
    again = tmp_path / "again"
    assert main(["train", str(corpus), "--vocab-size", "600", "--out", str(again), "--special", "nanochat",
                 "--max-chars", "20000", "--doc-cap", "500", "--quiet"]) == 0
    assert {name: (again / name).read_bytes() for name in FILES} == {name: (trained / name).read_bytes()
                                                                      for name in FILES}


def test_a_corpus_smaller_than_the_budget_is_trained_on_whole_and_said_so(corpus, tmp_path, capsys):
    assert main(["train", str(corpus), "--vocab-size", "400", "--out", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    assert "the corpus is smaller than --max-chars 2e+09: trained on all of it" in out
    record = json.loads((tmp_path / "t" / "training.json").read_text())
    assert record["documents"] == len(DOCS) and not record["budget_reached"]


def test_prepare_and_evaluate_with_the_trained_tokenizer(trained, corpus, tmp_path):
    # The same val text through the trained tokenizer and through gpt2: a byte-level model scores
    # both to the same bits per byte, which is what makes the numbers comparable.
    import tokpack
    from tokpack.data.loader import build_loader
    from tokpack.data.windows import TokenWindows
    from tokpack.prepare import PrepareConfig, prepare

    text = "".join(DOCS).encode()
    counts = np.bincount(np.frombuffer(text, dtype=np.uint8), minlength=256) + 1
    byte_logp = np.log(counts / counts.sum())
    results = []
    for encoding in (str(trained / "tokenizer.toml"), "gpt2"):
        out = tmp_path / encoding.replace("/", "_")
        prepare(PrepareConfig(inputs=(str(corpus),), out_dir=str(out), encoding=encoding, eot="prepend",
                              val_inputs=(str(corpus / "doc0003.txt"),), quiet=True))
        model = byte_unigram(load_encoding(encoding), byte_logp)
        results.append(tokpack.evaluate(model, build_loader(TokenWindows(out, 16, split="val", stride=16), 4)))
    assert results[0]["tokens"] != results[1]["tokens"]
    assert results[0]["bits_per_byte"] == pytest.approx(results[1]["bits_per_byte"], rel=1e-9)


def test_eval_compares_bytes_per_token_and_draws_them(trained, corpus, tmp_path, capsys):
    assert main(["eval", str(trained), "--inputs", str(corpus), "--against", "gpt2", "--plot",
                 str(tmp_path / "bars.png")]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    assert [row["tokenizer"] for row in rows] == [str(trained), "gpt2"]
    gpt2 = load_encoding("gpt2")
    assert rows[1]["tokens"] == sum(len(gpt2.encode_ordinary(d)) for d in DOCS)
    assert rows[0]["bytes/token"] == pytest.approx(rows[0]["bytes"] / rows[0]["tokens"])
    from tokpack import plot

    assert plot.png_size(tmp_path / "bars.png") == (800, 450)


@pytest.mark.parametrize("extra,fragment", [
    (["--vocab-size", "200"], "--vocab-size 200 must lie in 257.."),
    (["--vocab-size", str(2**32 + 1)], "must lie in 257..4294967296"),
    (["--max-chars", "0"], "--max-chars 0 leaves nothing to train on"),
    (["--special", "hello"], "--special 'hello' is one pre-token of the pattern"),
    (["--pattern", "("], "--pattern is not a valid regex"),
    (["--pattern", "x*"], "--pattern matches the empty string"),
    (["--pattern", "[a-z]+"], "--pattern gives 'H' to no pre-token, and tiktoken drops from the ids"),
    (["EMPTY"], "hold no text but whitespace, or none at all"),
    (["BLANK"], "hold no text but whitespace, or none at all"),
])
def test_bad_input_is_one_line_and_writes_nothing(corpus, tmp_path, capsys, extra, fragment):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text("   \n\n\t  ")
    inputs = {"EMPTY": str(tmp_path / "empty.txt"), "BLANK": str(tmp_path / "blank.txt")}
    given = [inputs[a] for a in extra if a in inputs] or [str(corpus)]
    argv = ["train", *given, "--out", str(tmp_path / "tok"), "--quiet", *[a for a in extra if a not in inputs]]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and fragment in err and "\n" not in err, err
    assert not (tmp_path / "tok").exists()


def test_another_tokenizer_in_the_folder_is_replaced_only_with_force(trained, corpus, tmp_path, capsys):
    out = tmp_path / "tok"
    out.mkdir()
    (out / "tokenizer.json").write_text("{}")  # someone's tokenizer
    with pytest.raises(SystemExit):
        main(["train", str(corpus), "--vocab-size", "400", "--out", str(out), "--quiet"])
    assert "already holds a tokenizer (tokenizer.json); pass --force" in capsys.readouterr().err
    assert (out / "tokenizer.json").read_text() == "{}" and sorted(p.name for p in out.iterdir()) == ["tokenizer.json"]
    assert main(["train", str(corpus), "--vocab-size", "400", "--out", str(out), "--quiet", "--force"]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)


def test_without_the_extra_it_is_one_line(corpus, tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "rustbpe", None)
    with pytest.raises(SystemExit):
        main(["train", str(corpus), "--out", str(tmp_path / "tok")])
    assert 'needs rustbpe; pip install "tokpack[train]"' in capsys.readouterr().err


def test_a_failure_while_writing_leaves_the_folder_as_it_was(trained, corpus, tmp_path, monkeypatch, capsys):
    import shutil

    from tokpack.tokenizer import train as module

    out = tmp_path / "tok"
    shutil.copytree(trained, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real, calls = module.open_new, []

    def failing(path):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(28, "No space left on device", str(path))
        return real(path)

    monkeypatch.setattr(module, "open_new", failing)
    with pytest.raises(SystemExit):
        main(["train", str(corpus), "--vocab-size", "400", "--out", str(out), "--quiet", "--force"])
    assert "No space left on device" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok"]  # no staging folder left behind
