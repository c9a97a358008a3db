"""Corpus documents: the files ``tokpack.inputs`` resolved, read as documents and cut into pieces.

    python -m tokpack.prepare notes.txt docs/ web.jsonl.gz     # reads its inputs through these

Text, jsonl, parquet, gzip and zstd are read as streams (``ReadOptions`` says how). Every file is
a document, every ``.jsonl`` record is a document, and ``doc_sep`` cuts text files into documents.
Long documents come out as pieces cut only where the encoding's split pattern cannot join the two
sides, so memory stays bounded by the piece size, not the corpus.
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import gzip
import importlib
import io
import json
import re
import warnings
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

from .format import load_json
from .storage import InputFile, as_input

# (text, lo, hi, last) -> the last (or first) position in [lo, hi] where a cut leaves the tokens
# unchanged, or -1: ``tokpack.tokenizer.safe_cut``.
SafeCut = Callable[[str, int, int, bool], int]

try:  # tokpack[fast]: jsonl records parsed in about half json's time (see _fast_text)
    import orjson
except ImportError:
    orjson = None

BLOCK_BYTES = 1 << 20
UNCUT_WARN_CHARS = 1 << 20
UNCUT_BYTES_PER_CHAR = 48  # tiktoken's peak on one long pre-token, measured on 5M and 20M chars
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Piece:
    """A run of one document's text; ``last`` marks the document's final piece."""

    doc: int
    text: str
    last: bool


@dataclass(frozen=True)
class ReadOptions:
    """How files are read as documents: ``errors`` (strict or replace) for invalid UTF-8, the
    string ``doc_sep`` that cuts text files, and the text field of jsonl and parquet records."""

    errors: str = "strict"
    doc_sep: str | None = None
    jsonl_key: str = "text"
    text_column: str = "text"


COMPRESSED = (".gz", ".zst")


def is_jsonl(path: InputFile) -> bool:
    name = path.name
    for suffix in COMPRESSED:
        name = name.removesuffix(suffix)
    return name.endswith(".jsonl")


def is_parquet(path: InputFile) -> bool:
    return path.suffix == ".parquet"


def is_records(path: InputFile) -> bool:
    """Whether each record of the file (jsonl line, parquet row) is a document."""
    return is_jsonl(path) or is_parquet(path)


def _extra(module: str, extra: str, path: InputFile) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ValueError(f"reading {path} needs {module}; pip install \"tokpack[{extra}]\"") from None


def _open(path: InputFile) -> BinaryIO:
    """The file's bytes, decompressed: a stream wherever it lives (``InputFile.open_stream``)."""
    if path.suffix == ".zst":
        return io.BufferedReader(_ZstdReader(path, _extra("zstandard", "zstd", path)))
    raw = path.open_stream()
    if path.suffix == ".gz":
        f = gzip.GzipFile(fileobj=raw, mode="rb")
        f.myfileobj = raw  # closed with it  # type: ignore[attr-defined]
        return f  # type: ignore[return-value]
    return raw


class _ZstdReader(io.RawIOBase):
    """A .zst file's frames decompressed as they are read (memory stays flat), refusing a file
    that ends inside a frame: zstandard's own readers return a truncated file's text silently."""

    def __init__(self, path: InputFile, zstandard: Any):
        self.path, self.zstandard, self.file = path, zstandard, path.open_stream()
        self.frame = zstandard.ZstdDecompressor().decompressobj()
        self.fed = False  # whether the current frame has been given any input
        self.pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.pending:
            chunk = self.file.read(1 << 20)
            if not chunk:
                if self.fed and not self.frame.eof:
                    raise self.zstandard.ZstdError("the file ends inside a frame (truncated)")
                return 0
            while chunk:
                self.fed = True
                self.pending += self.frame.decompress(chunk)
                if not self.frame.eof:
                    break
                chunk = self.frame.unused_data  # the next frame starts here
                self.frame, self.fed = self.zstandard.ZstdDecompressor().decompressobj(), False
        n = min(len(buffer), len(self.pending))
        buffer[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n

    def close(self) -> None:
        self.file.close()
        super().close()


def is_single_document(files: Sequence[InputFile], doc_sep: str | None) -> bool:
    """A lone text file with no separator is one document (nanoGPT's Shakespeare case)."""
    return len(files) == 1 and not is_records(files[0]) and not doc_sep


@contextlib.contextmanager
def _readable(path: InputFile) -> Iterator[None]:
    """Damaged compressed input as one line naming the file, not a decompressor's traceback."""
    try:
        yield
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        reason = str(exc) or type(exc).__name__
        raise ValueError(f"{path} is not a readable gzip file ({reason}); re-create it or leave it out") from None
    except Exception as exc:
        if type(exc).__name__ != "ZstdError":
            raise
        raise ValueError(f"{path} is not a readable zstd file ({exc}); re-create it or leave it out") from None


def _decoded_blocks(path: InputFile, errors: str) -> Iterator[str]:
    """The text of a file in blocks, with universal newlines: ``\r\n`` and ``\r`` become ``\n``,
    as Python's text mode reads them (and so every Python prepare script sees them)."""
    decoder = io.IncrementalNewlineDecoder(codecs.getincrementaldecoder("utf-8")(errors), translate=True)
    offset = 0
    with _readable(path), _open(path) as f:
        while True:
            block = f.read(BLOCK_BYTES)
            pending = len(decoder.getstate()[0])
            try:
                text = decoder.decode(block, final=not block)
            except UnicodeDecodeError as exc:
                where = offset - pending + exc.start
                unit = "uncompressed byte" if path.suffix in COMPRESSED else "byte"
                raise ValueError(
                    f"{path} is not valid UTF-8 at {unit} {where} ({exc.reason}); "
                    "fix the file or pass --errors replace"
                ) from None
            offset += len(block)
            if text:
                yield text
            if not block:
                return


def count_chars(path: InputFile, errors: str) -> int:
    """Characters in a text file, read as a stream."""
    return sum(len(text) for text in _decoded_blocks(as_input(path), errors))


def _text_documents(path: InputFile, errors: str, doc_sep: str | None) -> Iterator[Iterator[str]]:
    """Each document of a text file as an iterator of its text runs."""
    blocks = _decoded_blocks(path, errors)
    if not doc_sep:
        yield blocks
        return
    # Hold back len(doc_sep) - 1 characters so a separator split across blocks is still found.
    keep = len(doc_sep) - 1
    buffer = ""
    exhausted = False

    def one_document() -> Iterator[str]:
        nonlocal buffer, exhausted
        while True:
            at = buffer.find(doc_sep)
            if at >= 0:
                yield buffer[:at]
                buffer = buffer[at + len(doc_sep):]
                return
            if exhausted:
                yield buffer
                buffer = ""
                return
            cut = max(len(buffer) - keep, 0)
            yield buffer[:cut]
            buffer = buffer[cut:]
            block = next(blocks, None)
            if block is None:
                exhausted = True
            else:
                buffer += block

    while True:
        yield one_document()
        if exhausted and not buffer:
            return


def _where(path: InputFile, number: int, start: int, cut: bool) -> str:
    """A jsonl line as an error names it: its number, or in a unit cut from the middle its byte."""
    return f"{path} (the line at byte {start})" if cut else f"{path}:{number}"


def _jsonl_text(path: InputFile, number: int, cut: bool, line: bytes, start: int, errors: str, key: str) -> str:
    """The text field of one jsonl record, or a ValueError naming where it is (file and line)."""
    value = _fast_text(line, key)
    if value is None:
        value = _json_text(path, number, cut, line, start, errors, key)
    # UTF-8 cannot carry a surrogate, so a lone one comes from a \uD800-\uDFFF escape: only a
    # text that is not ASCII (a flag Python keeps) from a line with "\ud" in it is searched.
    surrogate = not value.isascii() and (b"\\ud" in line or b"\\uD" in line) and _SURROGATE.search(value)
    if surrogate:
        if errors != "replace":
            raise ValueError(f"{_where(path, number, start, cut)} holds a lone surrogate ({surrogate.group()!a}) in "
                             f"{key!r}, which is not text; fix the record or pass --errors replace")
        value = _SURROGATE.sub("\ufffd", value)
    return value


def _fast_text(line: bytes, key: str) -> str | None:
    """The record's text as orjson reads it, where it is installed and the line is an object whose
    ``key`` is a string; else None, and json reads the line (and words any error). orjson refuses
    whatever json would read otherwise (invalid UTF-8, a lone surrogate escape, NaN), so a line
    gives json's text or goes to json."""
    if orjson is None:
        return None
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    value = record.get(key) if isinstance(record, dict) else None
    return value if isinstance(value, str) else None


def _json_text(path: InputFile, number: int, cut: bool, line: bytes, start: int, errors: str, key: str) -> str:
    """The text field by json, or a ValueError naming where the record is (file and line)."""
    where = functools.partial(_where, path, number, start, cut)  # formatted only for an error
    try:
        text = line.decode("utf-8", errors)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where()} is not valid UTF-8 at byte {start + exc.start} of the file; "
                         "fix the file or pass --errors replace") from None
    try:
        record = json.loads(text)
    except (ValueError, RecursionError) as exc:  # bad JSON, over-long integers, deep nesting
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc).split(";")[0] or type(exc).__name__
        raise ValueError(f"{where()} is not a JSON record ({reason}); fix the line") from None
    if not isinstance(record, dict) or key not in record:
        found = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"{where()} has no field {key!r} (found {found}); "
                         "pass --jsonl-key with the text field's name")
    value = record[key]
    if not isinstance(value, str):
        raise ValueError(f"{where()} has {key!r} of type {type(value).__name__}, not a string; "
                         "fix the record or pass --jsonl-key with the text field's name")
    return value


def _jsonl_lines(path: InputFile, lo: int, hi: int | None) -> Iterator[tuple[int, int, bytes]]:
    """(number, first byte, line) of each non-blank line of a jsonl file that starts in [lo, hi)."""
    with _readable(path), _open(path) as f:
        offset = 0
        if lo:  # a line that began before lo belongs to whoever reads the bytes before lo
            f.seek(lo - 1)
            offset = lo
            if f.read(1) != b"\n":
                offset += len(f.readline())
        for number, line in enumerate(f, 1):
            start, offset = offset, offset + len(line)
            if hi is not None and start >= hi:
                return
            if not line.isspace():  # the whitespace strip() would remove, without copying the line
                yield number, start, line


def _jsonl_documents(path: InputFile, errors: str, key: str, lo: int = 0, hi: int | None = None) -> Iterator[Iterator[str]]:
    """The records of a jsonl file; with ``lo``/``hi``, those whose line starts in [lo, hi)."""
    for number, start, line in _jsonl_lines(path, lo, hi):
        yield iter((_jsonl_text(path, number, bool(lo), line, start, errors, key),))


def records(files: Sequence[InputFile | tuple[InputFile, int, int | None]]) -> Iterator[tuple[str, Any]]:
    """Every record of every ``.jsonl`` or ``.parquet`` file (as ``documents`` takes them), in
    order, with where it is (``file:line``, ``file row N``): a parquet row as a dict, a jsonl line
    as its bytes, for ``parse_record``."""
    for entry in files:
        file, lo, hi = entry if isinstance(entry, tuple) else (entry, 0, None)
        path = as_input(file)
        if is_parquet(path):
            with _parquet(path) as table:
                row = 0
                for batch in table.iter_batches(batch_size=256):
                    for record in batch.to_pylist():
                        row += 1
                        yield f"{path} row {row}", record
        elif is_jsonl(path):
            for number, start, line in _jsonl_lines(path, lo, hi):
                yield _where(path, number, start, bool(lo)), line
        else:
            raise ValueError(f"{path} is not .jsonl or .parquet, so it holds no chat records; pass conversations "
                             "as .jsonl or .parquet records")


def parse_record(value: Any, where: str, errors: str) -> Any:
    """A record from ``records``: a jsonl line decoded and parsed (bounded in size and depth), or
    one ``ValueError`` naming ``where``; a parquet row as it is."""
    if not isinstance(value, bytes):
        return value
    try:
        text = value.decode("utf-8", errors)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where} is not valid UTF-8 (byte {exc.start} of the line); fix the file, pass --errors "
                         "replace, or leave it out with --skip-bad") from None
    return load_json(text, where, "fix the line, or leave it out with --skip-bad")


def _parquet_documents(path: InputFile, errors: str, column: str) -> Iterator[Iterator[str]]:
    """The ``column`` of every row, read a batch of a row group at a time."""
    with _parquet(path) as table:
        yield from _parquet_rows(path, table, errors, column)


@contextlib.contextmanager
def _parquet(path: InputFile) -> Iterator[Any]:
    """A parquet file opened by pyarrow: a local one by its path, a remote one through its stream
    (pyarrow reads the footer, then only the column chunks asked for)."""
    pq = _extra("pyarrow.parquet", "parquet", path)
    with contextlib.ExitStack() as stack:
        local = path.local_path()
        source = local if local is not None else stack.enter_context(path.open_stream())
        try:
            table = pq.ParquetFile(source)
        except Exception as exc:  # pyarrow raises its own types for a file that is not parquet
            if isinstance(exc, ValueError) and str(exc).startswith(str(path)):
                raise  # a remote read's own line
            raise ValueError(f"{path} is not a readable parquet file ({exc}); re-create it or leave it out") from None
        yield table


def _parquet_rows(path: InputFile, table: Any, errors: str, column: str) -> Iterator[Iterator[str]]:
    names = table.schema_arrow.names
    if column not in names:
        raise ValueError(f"{path} has no column {column!r} (found {names}); pass --text-column with the text column")
    row = 0
    batches = table.iter_batches(batch_size=1024, columns=[column])
    while True:
        try:
            batch = next(batches, None)
            values = [] if batch is None else batch.column(0).to_pylist()
        except Exception as exc:  # pyarrow's own types: a damaged page, a codec error
            raise ValueError(f"{path} has a damaged page after row {row} ({exc}); re-create it or leave it "
                             "out") from None
        if batch is None:
            return
        for value in values:
            row += 1
            if not isinstance(value, str):
                raise ValueError(f"{path} row {row} has {column!r} of type {type(value).__name__}, not a string; "
                                 "fix the file or pass --text-column with the text column")
            surrogate = _SURROGATE.search(value)
            if surrogate and errors != "replace":
                raise ValueError(f"{path} row {row} holds a lone surrogate in {column!r}; fix the file or pass "
                                 "--errors replace")
            yield iter((_SURROGATE.sub("\ufffd", value) if surrogate else value,))


def parquet_row_groups(path: InputFile) -> list[int]:
    """The rows (documents) of each row group of a parquet file, from its footer alone."""
    with _parquet(path) as table:
        metadata = table.metadata
        return [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]


def documents(files: Sequence[InputFile | tuple[InputFile, int, int | None]],
              options: ReadOptions = ReadOptions()) -> Iterator[Iterator[str]]:
    """Every document of every file, in order, each as an iterator of its text runs. A file may
    come as (path, lo, hi): of a jsonl file, the records whose line starts in [lo, hi). Local
    paths are taken as they are (``as_input``)."""
    errors = options.errors
    for entry in files:
        file, lo, hi = entry if isinstance(entry, tuple) else (entry, 0, None)
        path = as_input(file)
        if is_jsonl(path):
            yield from _jsonl_documents(path, errors, options.jsonl_key, lo, hi)
        elif is_parquet(path):
            yield from _parquet_documents(path, errors, options.text_column)
        else:
            yield from _text_documents(path, errors, options.doc_sep)


def split_runs(runs: Iterator[str], at: int) -> tuple[Iterator[str], Iterator[str]]:
    """Cut a stream of text runs at character ``at`` into two streams, read one after the other."""
    state = {"left": at, "rest": ""}

    def head() -> Iterator[str]:
        for run in runs:
            if len(run) < state["left"]:
                state["left"] -= len(run)
                yield run
            else:
                yield run[: state["left"]]
                state["rest"] = run[state["left"]:]
                state["left"] = 0
                return

    def tail() -> Iterator[str]:
        assert state["left"] == 0, "the head must be read before the tail"
        yield state["rest"]
        yield from runs

    return head(), tail()


def pieces(docs: Iterator[Iterator[str]], piece_chars: int, cut: SafeCut | None) -> Iterator[Piece]:
    """Non-empty documents as pieces of about ``piece_chars`` characters, in order.

    With ``cut`` None documents are never cut; otherwise only where ``cut`` (the encoder's
    ``tokpack.tokenizer.safe_cut``, handed down so that reading text needs no tokenizer) finds a
    safe point, and a document with none comes out whole. Empty documents are skipped. A run of more than
    ``UNCUT_WARN_CHARS`` characters with no cut point (a base64 blob, minified code) must be
    encoded whole to stay exact, at about ``UNCUT_BYTES_PER_CHAR`` bytes of memory a character,
    and is warned about once per document.
    """
    number = 0
    for runs in docs:
        buffer = ""
        searched = 0  # no cut point lies in buffer[piece_chars:searched]
        warned = False
        for run in runs:
            buffer += run
            while cut is not None and len(buffer) > piece_chars:
                at = cut(buffer, piece_chars // 2, piece_chars, True)
                if at < 0:
                    at = cut(buffer, max(searched, piece_chars), len(buffer) - 1, False)
                if at < 0:
                    searched = len(buffer) - 1
                    if len(buffer) > UNCUT_WARN_CHARS and not warned:
                        warned = True
                        warnings.warn(
                            f"document {number} holds a run of over {UNCUT_WARN_CHARS:,} characters with no "
                            "safe cut point; it is encoded whole to stay exact, which takes about "
                            f"{UNCUT_BYTES_PER_CHAR} bytes of memory per character of the run", stacklevel=2)
                    break
                yield Piece(number, buffer[:at], False)
                buffer, searched = buffer[at:], 0
        if cut is None and len(buffer) > UNCUT_WARN_CHARS:
            warnings.warn(f"document {number} holds over {UNCUT_WARN_CHARS:,} characters, and this encoding is "
                          "never cut inside a document; it is encoded whole, which takes about "
                          f"{UNCUT_BYTES_PER_CHAR} bytes of memory per character", stacklevel=2)
        if buffer:
            yield Piece(number, buffer, True)
            number += 1
