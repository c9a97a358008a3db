from __future__ import annotations

import gzip
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokpack import corpus
from tokpack.corpus import ReadOptions, count_chars, documents, is_single_document, pieces, split_runs
from tokpack.inputs import resolve_inputs
from tokpack.tokenizer import safe_cut


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


def test_a_folder_lists_in_path_order_with_each_files_own_stat(tmp_path):
    # Names that sort differently as strings than as paths ("a" before "a-b.txt" before "a/z.txt"
    # as a string, but a folder's files come right after its name), a file link, a broken link.
    c = tmp_path / "c"
    for name in ("a/z.txt", "a/b/deep/x.txt", "a-b.txt", "a.txt", "B.txt", "a0/y.txt", ".git/HEAD", "a/.h.txt"):
        (c / name).parent.mkdir(parents=True, exist_ok=True)
        (c / name).write_text(name * 3)
    (tmp_path / "target.txt").write_text("outside, linked in")
    (c / "link.txt").symlink_to(tmp_path / "target.txt")
    (c / "dead.txt").symlink_to(tmp_path / "gone.txt")
    with pytest.warns(UserWarning, match="skipping .*dead.txt: not a regular file"):
        got = resolve_inputs([c])
    rel = [p.relative_to(c).as_posix() for p in got]
    assert rel == sorted(rel, key=lambda r: r.split("/")) == [
        "B.txt", "a/b/deep/x.txt", "a/z.txt", "a-b.txt", "a.txt", "a0/y.txt", "link.txt"]
    for f in got:  # the stat the listing took is the file's (a link's target's) own
        assert (f.size(), f.identity()) == (os.stat(f).st_size, (os.stat(f).st_dev, os.stat(f).st_ino))
    assert got[-1].size() == len("outside, linked in")


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
    assert _texts(documents([path], ReadOptions(doc_sep="<SEP>"))) == ["alpha", "béta", "", "gamma 東京", ""]
    assert count_chars(path, "strict") == len(path.read_text("utf-8"))


@pytest.mark.parametrize("block", [1, 4, 1 << 20])
def test_invalid_utf8_names_file_and_byte_offset(tmp_path, monkeypatch, block):
    monkeypatch.setattr(corpus, "BLOCK_BYTES", block)
    path = tmp_path / "bad.txt"
    path.write_bytes("héllo ".encode() + b"\xff tail")
    with pytest.raises(ValueError, match=rf"{path} is not valid UTF-8 at byte 7 .*--errors replace"):
        _texts(documents([path], ReadOptions()))
    assert _texts(documents([path], ReadOptions(errors="replace"))) == ["héllo \ufffd tail"]


def test_jsonl_and_gzip(tmp_path):
    records = [{"text": "first"}, {"text": "second doc", "id": 2}, {"text": ""}]
    lines = "\n".join(json.dumps(r) for r in records) + "\n\n"
    (tmp_path / "a.jsonl").write_text(lines)
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write(lines)
    with gzip.open(tmp_path / "c.txt.gz", "wt") as f:
        f.write("gzipped text")
    files = [tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz", tmp_path / "c.txt.gz"]
    assert _texts(documents(files, ReadOptions())) == ["first", "second doc", ""] * 2 + ["gzipped text"]
    with pytest.raises(ValueError, match=r"a.jsonl:1 has no field 'body' \(found \['text'\]\).*--jsonl-key"):
        _texts(documents(files, ReadOptions(jsonl_key="body")))


def test_split_runs_cuts_a_stream_at_a_character():
    head, tail = split_runs(iter(["abc", "def", "gh"]), 4)
    assert "".join(head) == "abcd" and "".join(tail) == "efgh"


def test_pieces_skip_empty_documents_and_number_the_rest():
    docs = iter([iter(["a b c d e f"]), iter([""]), iter(["x", "y"])])
    got = list(pieces(docs, 4, cut=safe_cut))
    assert "".join(p.text for p in got if p.doc == 0) == "a b c d e f"
    assert [p.doc for p in got if p.last] == [0, 1]
    assert all(0 < len(p.text) for p in got)
    whole = list(pieces(iter([iter(["a b c d e f"])]), 4, cut=None))
    assert [(p.text, p.last) for p in whole] == [("a b c d e f", True)]


def test_links_special_files_and_duplicates(tmp_path):
    c = tmp_path / "corpus"
    (c / "sub").mkdir(parents=True)
    (c / "a.txt").write_text("a")
    (c / "sub" / "b.txt").write_text("b")
    (c / "self").symlink_to(".")
    (c / "sub" / "up").symlink_to("..")
    os.mkfifo(c / "pipe")  # reading it would block forever
    with pytest.warns(UserWarning, match="skipping .*pipe: not a regular file"):
        by_glob = resolve_inputs([str(c / "**")])
    with pytest.warns(UserWarning, match="pipe"):
        by_folder = resolve_inputs([c])
    assert [p.name for p in by_glob] == [p.name for p in by_folder] == ["a.txt", "b.txt"]
    with pytest.warns(UserWarning, match="reached twice; it is read once"):
        assert resolve_inputs([c / "a.txt", c / "a.txt", c / "self" / "a.txt"]) == [c / "a.txt"]
    with pytest.raises(ValueError, match="pipe is not a regular file"):
        resolve_inputs([c / "pipe"])
    (tmp_path / "data[1].txt").write_text("literal")
    assert resolve_inputs([str(tmp_path / "data[1].txt")]) == [tmp_path / "data[1].txt"]


@pytest.mark.parametrize("damage", ["truncated", "corrupt", "not gzip"])
def test_damaged_gzip_is_one_line_naming_the_file(tmp_path, damage):
    good = gzip.compress(("hello world " * 5000).encode())
    data = {"truncated": good[: len(good) // 2], "corrupt": good[:20] + b"\xff" * 50 + good[70:],
            "not gzip": b"plain text, not gzip"}[damage]
    (tmp_path / "d.txt.gz").write_bytes(data)
    with pytest.raises(ValueError, match=r"d.txt.gz is not a readable gzip file") as exc:
        _texts(documents([tmp_path / "d.txt.gz"], ReadOptions()))
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("line,fragment", [
    ('{"text": 42}', "has 'text' of type int, not a string"),
    ('{"text": null}', "has 'text' of type NoneType, not a string"),
    ('{"text": "\\ud800 lone"}', "holds a lone surrogate"),
    ("[" * 100_000 + "]" * 100_000, "is not a JSON record"),
    ('{"text": "x", "n": ' + "9" * 5000 + "}", "is not a JSON record"),
])
def test_bad_jsonl_records_name_the_file_and_line(tmp_path, line, fragment):
    (tmp_path / "r.jsonl").write_text('{"text": "fine"}\n' + line + "\n")
    with pytest.raises(ValueError) as exc:
        _texts(documents([tmp_path / "r.jsonl"], ReadOptions()))
    assert "r.jsonl:2 " in str(exc.value) and fragment in str(exc.value)
    assert "\n" not in str(exc.value)


def test_lone_surrogates_are_replaced_with_errors_replace(tmp_path):
    (tmp_path / "r.jsonl").write_text('{"text": "a\\ud800b"}\n')
    assert _texts(documents([tmp_path / "r.jsonl"], ReadOptions(errors="replace"))) == ["a\ufffdb"]


def test_text_files_read_with_universal_newlines_and_jsonl_as_is(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "BLOCK_BYTES", 3)  # a \r\n split across two read blocks too
    (tmp_path / "crlf.txt").write_bytes(b"one\r\ntwo\rthree\r\n\r\nfour")
    assert _texts(documents([tmp_path / "crlf.txt"], ReadOptions())) == ["one\ntwo\nthree\n\nfour"]
    assert count_chars(tmp_path / "crlf.txt", "strict") == len("one\ntwo\nthree\n\nfour")
    (tmp_path / "r.jsonl").write_text(json.dumps({"text": "keeps\r\nthis"}) + "\n")
    assert _texts(documents([tmp_path / "r.jsonl"], ReadOptions())) == ["keeps\r\nthis"]
    (tmp_path / "bad.txt").write_bytes(b"a\r\nb\r\n\xff")
    with pytest.raises(ValueError, match="not valid UTF-8 at byte 6"):  # the offset counts the bytes as stored
        _texts(documents([tmp_path / "bad.txt"], ReadOptions()))


def test_a_long_run_without_cut_points_warns_once(monkeypatch):
    monkeypatch.setattr(corpus, "UNCUT_WARN_CHARS", 100)
    with pytest.warns(UserWarning, match="holds a run of over 100 characters with no safe cut point") as record:
        out = list(pieces(iter([iter(["a" * 150, "a" * 150])]), 20, cut=safe_cut))
    assert len(record) == 1 and "".join(p.text for p in out) == "a" * 300


def test_parquet_rows_and_zstd_frames_are_documents(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    zstandard = pytest.importorskip("zstandard")
    texts = [f"document {i}: " + "words " * (i % 7) for i in range(50)]
    table = pa.table({"id": list(range(50)), "body": texts})
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=8)  # several row groups
    assert _texts(documents([tmp_path / "d.parquet"], ReadOptions(text_column="body"))) == texts
    with pytest.raises(ValueError, match=r"d.parquet has no column 'text' \(found \['id', 'body'\]\).*--text-column"):
        _texts(documents([tmp_path / "d.parquet"], ReadOptions()))
    with pytest.raises(ValueError, match=r"d.parquet row 1 has 'id' of type int, not a string"):
        _texts(documents([tmp_path / "d.parquet"], ReadOptions(text_column="id")))
    lines = "".join(json.dumps({"text": t}) + "\n" for t in texts)
    (tmp_path / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
    (tmp_path / "t.txt.zst").write_bytes(zstandard.ZstdCompressor().compress("one\r\ntext file".encode()))
    assert _texts(documents([tmp_path / "d.jsonl.zst", tmp_path / "t.txt.zst"], ReadOptions())) == [
        *texts, "one\ntext file"]
    assert is_single_document([tmp_path / "d.parquet"], None) is False
    (tmp_path / "bad.txt.zst").write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 20)
    with pytest.raises(ValueError, match="bad.txt.zst is not a readable zstd file"):
        _texts(documents([tmp_path / "bad.txt.zst"], ReadOptions()))
    monkeypatch.setitem(__import__("sys").modules, "zstandard", None)  # the extra is not installed
    with pytest.raises(ValueError, match=r'needs zstandard; pip install "tokpack\[zstd\]"'):
        _texts(documents([tmp_path / "t.txt.zst"], ReadOptions()))


def test_a_parquet_page_that_fails_to_decompress_names_the_file_and_the_row(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    texts = [f"document number {i} " * 50 for i in range(2000)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "d.parquet", compression="snappy", row_group_size=500)
    data = bytearray((tmp_path / "d.parquet").read_bytes())
    middle = len(data) // 2  # inside a later row group's page: the footer still reads
    data[middle:middle + 200] = bytes(b ^ 0x5A for b in data[middle:middle + 200])
    (tmp_path / "d.parquet").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"d.parquet has a damaged page after row \d+ \(.*\); re-create it"):
        _texts(documents([tmp_path / "d.parquet"], ReadOptions()))


def test_truncated_zstd_is_refused_not_read_short(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    frames = b"".join(zstandard.ZstdCompressor().compress(f"frame {i} ".encode() * 300) for i in range(3))
    (tmp_path / "whole.txt.zst").write_bytes(frames)
    assert _texts(documents([tmp_path / "whole.txt.zst"], ReadOptions())) == [
        "".join(f"frame {i} " * 300 for i in range(3))]
    (tmp_path / "cut.txt.zst").write_bytes(frames[:-7])
    with pytest.raises(ValueError, match="cut.txt.zst is not a readable zstd file .*truncated"):
        _texts(documents([tmp_path / "cut.txt.zst"], ReadOptions()))


def _read_jsonl(folder, lines: list[bytes], errors: str = "strict") -> list[str] | str:
    """The texts of a jsonl file of ``lines``, or the one line of its error."""
    path = folder / "r.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    try:
        return _texts(documents([path], ReadOptions(errors=errors)))
    except ValueError as exc:
        return str(exc)


_EDGES = [b'{"text": "a", "text": "b"}', '\ufeff{"text": "a"}'.encode(), b'{"text": NaN}',
          b'{"text": "x", "n": Infinity}', b'{"text": "x", "n": 123456789012345678901234567890}',
          b'{"text": "x", "n": 1' + b"0" * 5000 + b"}", b'{"text": "a\\ud800b"}', b'{"text": "\\ud83d\\ude00"}',
          b'{"text": "a\tb"}', b'{"text": "a\\u0000b"}', b' {"text": "a"} \r', b'{"text": "\xff"}',
          b'{"text": "\xed\xa0\x80"}', b'{"text": 1e400}', b'{"text": "a", "d": ' + b"[" * 1100 + b"]" * 1100 + b"}",
          b'{"text": "a", "n": 01}', b'\xa0{"text": "a"}', b'{"text": "a"} x', b"[1]", b'{"other": "a"}',
          b'{"text": ["a"]}', b'{"text": "\xe2\x80\xa8 \\/ \\u00e9"}']


@pytest.mark.parametrize("errors", ["strict", "replace"])
@pytest.mark.parametrize("line", _EDGES)
def test_jsonl_records_read_the_same_with_and_without_orjson(tmp_path, monkeypatch, line, errors):
    # With tokpack[fast], orjson parses a line; whatever it refuses goes to json, so every line
    # gives the same text, or the same error, as json alone.
    pytest.importorskip("orjson")
    with_orjson = _read_jsonl(tmp_path, [line], errors)
    with monkeypatch.context() as without:
        without.setattr(corpus, "orjson", None)
        assert with_orjson == _read_jsonl(tmp_path, [line], errors)


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                     max_leaves=8)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(), others=st.dictionaries(st.text(max_size=5), _JSON, max_size=3), ascii_only=st.booleans())
def test_any_record_reads_the_same_with_and_without_orjson(tmp_path, monkeypatch, text, others, ascii_only):
    pytest.importorskip("orjson")
    line = json.dumps({**others, "text": text}, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    with_orjson = _read_jsonl(tmp_path, [line])
    with monkeypatch.context() as without:
        without.setattr(corpus, "orjson", None)
        assert with_orjson == _read_jsonl(tmp_path, [line])


def _loaded(text: str) -> str:
    """``load_json``'s value, spelled with its types, or json's own error message."""
    from tokpack.format import load_json

    try:
        return repr(load_json(text, "r.jsonl:1", "fix it"))
    except ValueError as exc:
        return str(exc)


def _json_loaded(text: str) -> str:
    try:
        return repr(json.loads(text))
    except ValueError as exc:
        return f"r.jsonl:1 is not valid JSON ({exc}); fix it"


@settings(max_examples=200, deadline=None)
@given(value=_JSON, before=st.sampled_from(["", " ", "\t", "\n", "\u00a0"]),
       after=st.sampled_from(["", " \n", "\r\n", "\x0b", "\u00a0", "\u2028", "x", "}"]))
def test_a_record_reads_as_json_loads_reads_it(value, before, after):
    # load_json scans a record without json.loads' layers: it must read, and refuse, as json does.
    text = before + json.dumps(value) + after
    assert _loaded(text) == _json_loaded(text)
    for line in _EDGES:
        text = line.decode("utf-8", "replace")
        assert _loaded(text) == _json_loaded(text)
