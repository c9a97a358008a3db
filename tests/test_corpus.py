from __future__ import annotations

import gzip
import json

import pytest

from tokpack import corpus
from tokpack.corpus import count_chars, documents, is_single_document, pieces, resolve_inputs, split_runs


def _texts(docs) -> list[str]:
    return ["".join(runs) for runs in docs]


def test_resolve_files_folders_and_globs_in_order(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.txt").write_text("z")
    (tmp_path / "b" / "sub").mkdir()
    (tmp_path / "b" / "sub" / "a.txt").write_text("a")
    (tmp_path / "b" / ".hidden").write_text("h")
    (tmp_path / "one.txt").write_text("1")
    (tmp_path / "two.jsonl").write_text("{}")
    got = resolve_inputs([tmp_path / "one.txt", tmp_path / "b", str(tmp_path / "*.jsonl")])
    rel = [p.relative_to(tmp_path).as_posix() for p in got]
    assert rel == ["one.txt", "b/sub/a.txt", "b/z.txt", "two.jsonl"]


def test_resolve_errors_name_the_path_and_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}/nope.txt does not exist; pass a file"):
        resolve_inputs([tmp_path / "nope.txt"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no readable files"):
        resolve_inputs([tmp_path / "empty"])
    with pytest.raises(FileNotFoundError, match="matches no file"):
        resolve_inputs([str(tmp_path / "*.md")])
    with pytest.raises(ValueError, match="no corpus given"):
        resolve_inputs([])


def test_single_document_rule(tmp_path):
    txt, jl = tmp_path / "a.txt", tmp_path / "a.jsonl.gz"
    assert is_single_document([txt], None)
    assert not is_single_document([txt], "\n\n")
    assert not is_single_document([jl], None)
    assert not is_single_document([txt, txt], None)


@pytest.mark.parametrize("block", [1, 2, 3, 7, 1 << 20])
def test_doc_sep_cuts_across_read_blocks(tmp_path, monkeypatch, block):
    monkeypatch.setattr(corpus, "BLOCK_BYTES", block)
    path = tmp_path / "c.txt"
    path.write_text("alpha<SEP>béta<SEP><SEP>gamma 東京<SEP>", "utf-8")
    assert _texts(documents([path], "strict", "<SEP>", "text")) == ["alpha", "béta", "", "gamma 東京", ""]
    assert count_chars(path, "strict") == len(path.read_text("utf-8"))


@pytest.mark.parametrize("block", [1, 4, 1 << 20])
def test_invalid_utf8_names_file_and_byte_offset(tmp_path, monkeypatch, block):
    monkeypatch.setattr(corpus, "BLOCK_BYTES", block)
    path = tmp_path / "bad.txt"
    path.write_bytes("héllo ".encode() + b"\xff tail")
    with pytest.raises(ValueError, match=rf"{path} is not valid UTF-8 at byte 7 .*--errors replace"):
        _texts(documents([path], "strict", None, "text"))
    assert _texts(documents([path], "replace", None, "text")) == ["héllo \ufffd tail"]


def test_jsonl_and_gzip(tmp_path):
    records = [{"text": "first"}, {"text": "second doc", "id": 2}, {"text": ""}]
    lines = "\n".join(json.dumps(r) for r in records) + "\n\n"
    (tmp_path / "a.jsonl").write_text(lines)
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write(lines)
    with gzip.open(tmp_path / "c.txt.gz", "wt") as f:
        f.write("gzipped text")
    files = [tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz", tmp_path / "c.txt.gz"]
    assert _texts(documents(files, "strict", None, "text")) == ["first", "second doc", ""] * 2 + ["gzipped text"]
    with pytest.raises(ValueError, match=r"a.jsonl:1 has no field 'body' \(found \['text'\]\).*--jsonl-key"):
        _texts(documents(files, "strict", None, "body"))


def test_split_runs_cuts_a_stream_at_a_character():
    head, tail = split_runs(iter(["abc", "def", "gh"]), 4)
    assert "".join(head) == "abcd" and "".join(tail) == "efgh"


def test_pieces_skip_empty_documents_and_number_the_rest():
    docs = iter([iter(["a b c d e f"]), iter([""]), iter(["x", "y"])])
    got = list(pieces(docs, 4, cut_inside=True))
    assert "".join(p.text for p in got if p.doc == 0) == "a b c d e f"
    assert [p.doc for p in got if p.last] == [0, 1]
    assert all(0 < len(p.text) for p in got)
    whole = list(pieces(iter([iter(["a b c d e f"])]), 4, cut_inside=False))
    assert [(p.text, p.last) for p in whole] == [("a b c d e f", True)]
