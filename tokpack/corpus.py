"""Corpus input: resolve paths to files and stream their documents as bounded text pieces.

    python -c "from tokpack.corpus import resolve_inputs; print(resolve_inputs(['corpus/']))"

Every file is a document, every ``.jsonl`` record is a document, and ``doc_sep`` cuts text files
into documents. Long documents come out as pieces cut only where the encoding's split pattern
cannot join the two sides, so memory stays bounded by the piece size, not the corpus.
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import io
import json
import os
import re
import stat
import warnings
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .tokenizer import safe_cut

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


def is_jsonl(path: Path) -> bool:
    return path.name.removesuffix(".gz").endswith(".jsonl")


def _open(path: Path) -> BinaryIO:
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


def _walk(folder: Path) -> list[Path]:
    """Files below ``folder``, sorted, hidden ones skipped; directory links are never followed."""
    found = []
    for root, dirs, names in os.walk(folder):  # os.walk does not descend into linked directories
        dirs[:] = [d for d in dirs if not d.startswith(".")]  # hidden folders: .git and kin
        found += [Path(root, n) for n in names if not n.startswith(".")]
    return sorted(found, key=lambda p: p.parts)


def _glob(raw: str) -> list[Path]:
    """Matches of a glob, sorted; ``**`` recurses without following directory links."""
    parts = Path(raw).parts
    first = next(i for i, part in enumerate(parts) if any(ch in part for ch in "*?["))
    root = Path(*parts[:first]) if first else Path(".")
    pattern = "/".join(parts[first:])
    if pattern.endswith("**"):
        pattern += "/*"  # glob.glob's 'dir/**' means everything below dir

    def reached_by_link(path: Path) -> bool:
        rel = path.relative_to(root).parts
        return any(root.joinpath(*rel[:k]).is_symlink() for k in range(1, len(rel)))

    matches = [p for p in root.glob(pattern) if not any(part.startswith(".") for part in p.relative_to(root).parts)]
    return sorted((p for p in matches if not p.is_dir() and not reached_by_link(p)), key=lambda p: p.parts)


def resolve_groups(paths: Sequence[str | Path]) -> list[tuple[str, list[Path]]]:
    """Each path as given with its files: a file, a folder (recursive, sorted) or a glob.

    An existing path is taken literally before it is read as a glob (``data[1].txt``). Only
    regular files are read: others found in folders or globs (FIFOs, sockets, devices) are skipped
    with a warning, and refused when named directly. A file reached twice is read once.
    """
    if not paths:
        raise ValueError("no corpus given; pass files, folders or globs")
    groups: list[tuple[str, list[Path]]] = []
    seen: set[tuple[int, int]] = set()
    for raw in map(str, paths):
        path = Path(raw)
        if path.is_dir():
            found = _walk(path)
            if not found:
                raise ValueError(f"folder {raw} holds no readable files; put .txt/.jsonl files in it")
        elif path.exists():
            if not _regular(path):
                raise ValueError(f"corpus path {raw} is not a regular file (a pipe, socket or device); "
                                 "pass files, folders or globs of regular files")
            found = [path]
        elif any(ch in raw for ch in "*?["):
            found = _glob(raw)
            if not found:
                raise FileNotFoundError(f"glob {raw!r} matches no file; check the pattern and quote it")
        else:
            raise FileNotFoundError(f"corpus path {raw} does not exist; pass a file, a folder or a glob")
        files = []
        for f in found:
            if not _regular(f):
                warnings.warn(f"skipping {f}: not a regular file", stacklevel=2)
                continue
            info = f.stat()
            if (info.st_dev, info.st_ino) in seen:
                warnings.warn(f"{f} is reached twice; it is read once", stacklevel=2)
                continue
            seen.add((info.st_dev, info.st_ino))
            files.append(f)
        groups.append((raw, files))
    if not any(files for _, files in groups):
        raise ValueError(f"the inputs ({', '.join(map(str, paths))}) hold no regular files; pass text files")
    return groups


def resolve_inputs(paths: Sequence[str | Path]) -> list[Path]:
    """Files from paths, folders (recursively, sorted) and globs, in the order given, each once."""
    return [f for _, files in resolve_groups(paths) for f in files]


def is_single_document(files: Sequence[Path], doc_sep: str | None) -> bool:
    """A lone text file with no separator is one document (nanoGPT's Shakespeare case)."""
    return len(files) == 1 and not is_jsonl(files[0]) and not doc_sep


@contextlib.contextmanager
def _readable(path: Path) -> Iterator[None]:
    """Damaged compressed input as one line naming the file, not a decompressor's traceback."""
    try:
        yield
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        reason = str(exc) or type(exc).__name__
        raise ValueError(f"{path} is not a readable gzip file ({reason}); re-create it or leave it out") from None


def _decoded_blocks(path: Path, errors: str) -> Iterator[str]:
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
                unit = "uncompressed byte" if path.suffix == ".gz" else "byte"
                raise ValueError(
                    f"{path} is not valid UTF-8 at {unit} {where} ({exc.reason}); "
                    "fix the file or pass --errors replace"
                ) from None
            offset += len(block)
            if text:
                yield text
            if not block:
                return


def count_chars(path: Path, errors: str) -> int:
    """Characters in a text file, read as a stream."""
    return sum(len(text) for text in _decoded_blocks(path, errors))


def _text_documents(path: Path, errors: str, doc_sep: str | None) -> Iterator[Iterator[str]]:
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


def _jsonl_text(path: Path, number: int, line: bytes, start: int, errors: str, key: str) -> str:
    """The text field of one jsonl record, or a ValueError naming the file and line."""
    try:
        text = line.decode("utf-8", errors)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not valid UTF-8 at byte {start + exc.start} (line {number}); "
                         "fix the file or pass --errors replace") from None
    try:
        record = json.loads(text)
    except (ValueError, RecursionError) as exc:  # bad JSON, over-long integers, deep nesting
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc).split(";")[0] or type(exc).__name__
        raise ValueError(f"{path}:{number} is not a JSON record ({reason}); fix the line") from None
    if not isinstance(record, dict) or key not in record:
        found = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"{path}:{number} has no field {key!r} (found {found}); "
                         "pass --jsonl-key with the text field's name")
    value = record[key]
    if not isinstance(value, str):
        raise ValueError(f"{path}:{number} has {key!r} of type {type(value).__name__}, not a string; "
                         "fix the record or pass --jsonl-key with the text field's name")
    surrogate = _SURROGATE.search(value)
    if surrogate:
        if errors != "replace":
            raise ValueError(f"{path}:{number} holds a lone surrogate ({surrogate.group()!a}) in {key!r}, which is "
                             "not text; fix the record or pass --errors replace")
        value = _SURROGATE.sub("\ufffd", value)
    return value


def _jsonl_documents(path: Path, errors: str, key: str) -> Iterator[Iterator[str]]:
    offset = 0
    with _readable(path), _open(path) as f:
        for number, line in enumerate(f, 1):
            start, offset = offset, offset + len(line)
            if line.strip():
                yield iter((_jsonl_text(path, number, line, start, errors, key),))


def documents(files: Sequence[Path], errors: str, doc_sep: str | None, jsonl_key: str) -> Iterator[Iterator[str]]:
    """Every document of every file, in order, each as an iterator of its text runs."""
    for path in files:
        if is_jsonl(path):
            yield from _jsonl_documents(path, errors, jsonl_key)
        else:
            yield from _text_documents(path, errors, doc_sep)


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


def pieces(docs: Iterator[Iterator[str]], piece_chars: int, cut_inside: bool) -> Iterator[Piece]:
    """Non-empty documents as pieces of about ``piece_chars`` characters, in order.

    With ``cut_inside`` False documents are never cut; otherwise only at safe cut points, and a
    document with none comes out whole. Empty documents are skipped. A run of more than
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
            while cut_inside and len(buffer) > piece_chars:
                at = safe_cut(buffer, piece_chars // 2, piece_chars, last=True)
                if at < 0:
                    at = safe_cut(buffer, max(searched, piece_chars), len(buffer) - 1, last=False)
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
        if buffer:
            yield Piece(number, buffer, True)
            number += 1
