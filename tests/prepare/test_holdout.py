"""The val split's rules: a token budget in hash order, and whole val inputs, against references
computed here from the documents themselves."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from helpers import make_docs, write_docs
from tokpack.format import read_meta
from tokpack.prepare import PrepareConfig, prepare
from tokpack.tokenizer import load_encoding

EOT = 50256


def _run(tmp_path, *inputs, out="out", **options):
    folder = tmp_path / out
    prepare(PrepareConfig(inputs=tuple(map(str, inputs)), out_dir=str(folder), quiet=True, **options))
    return folder


def _split(folder, split):
    return np.fromfile(folder / f"{split}.bin", dtype=np.uint16).tolist()


@pytest.mark.parametrize("budget", [1, 1500, 4000])
def test_val_tokens_are_the_first_documents_in_hash_order_reaching_the_budget(tmp_path, budget):
    docs = make_docs(80, seed=9, words=70)
    corpus = write_docs(tmp_path / "c", docs)
    enc = load_encoding("gpt2")
    key = (1337).to_bytes(8, "little", signed=True)
    hashed = sorted((hashlib.blake2b(d.encode(), digest_size=8, key=key).digest(), i) for i, d in enumerate(docs))
    chosen, held = set(), 0
    for _, i in hashed:  # the reference: hash order, until the budget is reached
        if held >= budget:
            break
        chosen.add(i)
        held += len(enc.encode_ordinary(docs[i])) + 1
    out = _run(tmp_path, corpus, val_tokens=budget)
    expected = [t for i, d in enumerate(docs) if i in chosen for t in [*enc.encode_ordinary(d), EOT]]
    assert _split(out, "val") == expected and len(expected) >= budget
    assert read_meta(out)["val"]["rule"] == "tokens" and read_meta(out)["splits"]["val"]["documents"] == len(chosen)
    # Units cut the corpus (as torchrun's ranks do): the same split, byte for byte.
    units = _run(tmp_path, corpus, out="units", val_tokens=budget, unit_mb=0.002, shard_tokens=100_000)
    assert b"".join((units / s["file"]).read_bytes() for s in read_meta(units)["splits"]["val"]["shards"]) == \
        (out / "val.bin").read_bytes()


def test_val_inputs_are_the_val_split_whole_and_the_rest_is_train(tmp_path):
    docs = make_docs(30, seed=2, words=40)
    corpus = write_docs(tmp_path / "c", docs)
    val_files = [corpus / "doc0003.txt", corpus / "doc0017.txt"]
    enc = load_encoding("gpt2")
    out = _run(tmp_path, corpus, val_inputs=tuple(map(str, val_files)))
    tokens = lambda ids: [t for i in ids for t in [*enc.encode_ordinary(docs[i]), EOT]]  # noqa: E731
    assert _split(out, "val") == tokens([3, 17])
    assert _split(out, "train") == tokens([i for i in range(30) if i not in (3, 17)])
    assert read_meta(out)["val"] == {"rule": "inputs", "value": list(map(str, val_files)), "files": 2}
    # A val input outside the inputs joins the run; units keep the same split.
    extra = write_docs(tmp_path / "v", ["a held-out document"])
    out = _run(tmp_path, corpus, out="extra", val_inputs=(str(extra),), unit_mb=0.001, shard_tokens=100_000)
    meta = read_meta(out)
    assert meta["splits"]["val"]["documents"] == 1 and meta["splits"]["train"]["documents"] == 30


@pytest.mark.parametrize("options, fragment", [
    ({"val_tokens": 10**9}, "--val-tokens 1,000,000,000 is more than the corpus"),
    ({"val_tokens": -1}, "--val-tokens -1 is negative"),
    ({"val_tokens": 5, "val_inputs": ("x",)}, "pass one of them"),
    ({"val_inputs": ("CORPUS",)}, "leaves train empty"),
])
def test_val_rules_that_cannot_hold_are_one_line(tmp_path, options, fragment):
    corpus = write_docs(tmp_path / "c", make_docs(5))
    options = {k: tuple(str(corpus) if x == "CORPUS" else x for x in v) if isinstance(v, tuple) else v
               for k, v in options.items()}
    with pytest.raises(ValueError, match=fragment):
        _run(tmp_path, corpus, **options)
    assert not (tmp_path / "out" / "meta.json").exists()


def test_val_tokens_refuse_a_corpus_of_one_document(tmp_path):
    (tmp_path / "one.txt").write_text("one long document " * 50)
    with pytest.raises(ValueError, match="is one document; use --val-fraction"):
        _run(tmp_path, tmp_path / "one.txt", val_tokens=10)


@pytest.mark.parametrize("spelling", ["symlink", "hard link", "another spelling"])
def test_a_val_input_reached_by_another_path_never_leaks_into_train(tmp_path, spelling):
    docs = make_docs(20, seed=4, words=40)
    corpus = write_docs(tmp_path / "c", docs)
    target = corpus / "doc0005.txt"
    if spelling == "symlink":
        (tmp_path / "v").mkdir()
        val = tmp_path / "v" / "held.txt"
        val.symlink_to(target)
    elif spelling == "hard link":
        (tmp_path / "v").mkdir()
        val = tmp_path / "v" / "held.txt"
        val.hardlink_to(target)
    else:
        val = tmp_path / "c" / ".." / "c" / "doc0005.txt"
    enc = load_encoding("gpt2")
    with pytest.warns(UserWarning, match="reached by another path"):
        out = _run(tmp_path, corpus, val_inputs=(str(val),))
    held = [*enc.encode_ordinary(docs[5]), EOT]
    assert _split(out, "val") == held
    assert _split(out, "train") == [t for i, d in enumerate(docs) if i != 5 for t in [*enc.encode_ordinary(d), EOT]]


@pytest.mark.parametrize("size", [0, 1, 2047, 2048, 2049, 4095, 4096, 10_000])
def test_a_text_hashed_in_small_pieces_decides_its_split_as_hashed_whole(size):
    from tokpack.prepare.plan.holdout import document_hash, document_key, hash_small

    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    pieces, whole = document_hash(document_key(7)), document_hash(document_key(7))
    hash_small(pieces, data)
    whole.update(data)
    assert pieces.digest() == whole.digest() == hashlib.blake2b(data, digest_size=8,
                                                                  key=document_key(7)).digest()
