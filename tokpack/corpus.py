"""Corpus input: resolve paths to files and stream their documents as bounded text pieces.

    python -c "from tokpack.corpus import resolve_inputs; print(resolve_inputs(['corpus/']))"

Every file is a document, every ``.jsonl`` record is a document, and ``doc_sep`` cuts text files
into documents. Long documents come out as pieces cut only where the encoding's split pattern
cannot join the two sides, so memory stays bounded by the piece size, not the corpus.
"""

from __future__ import annotations

import codecs
import glob
import gzip
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .tokenizer import safe_cut

BLOCK_BYTES = 1 << 20


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


def resolve_inputs(paths: Sequence[str | Path]) -> list[Path]:
    """Files from paths, folders (recursively, sorted) and globs, in the order given."""
    if not paths:
        raise ValueError("no corpus given; pass files, folders or globs")
    files: list[Path] = []
    for raw in map(str, paths):
        if any(ch in raw for ch in "*?["):
            matches = sorted((Path(m) for m in glob.glob(raw, recursive=True) if os.path.isfile(m)), key=lambda p: p.parts)
            if not matches:
                raise FileNotFoundError(f"glob {raw!r} matches no file; check the pattern and quote it")
            files.extend(matches)
        elif Path(raw).is_dir():
            found = []
            for root, dirs, names in os.walk(raw):
                dirs[:] = [d for d in dirs if not d.startswith(".")]  # hidden folders: .git and kin
                found += [Path(root, n) for n in names if not n.startswith(".")]
            if not found:
                raise ValueError(f"folder {raw} holds no readable files; put .txt/.jsonl files in it")
            files.extend(sorted(found, key=lambda p: p.parts))
        elif Path(raw).is_file():
            files.append(Path(raw))
        else:
            raise FileNotFoundError(f"corpus path {raw} does not exist; pass a file, a folder or a glob")
    return files


def is_single_document(files: Sequence[Path], doc_sep: str | None) -> bool:
    """A lone text file with no separator is one document (nanoGPT's Shakespeare case)."""
    return len(files) == 1 and not is_jsonl(files[0]) and not doc_sep


def _decoded_blocks(path: Path, errors: str) -> Iterator[str]:
    decoder = codecs.getincrementaldecoder("utf-8")(errors)
    offset = 0
    with _open(path) as f:
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


def _jsonl_documents(path: Path, errors: str, key: str) -> Iterator[Iterator[str]]:
    offset = 0
    with _open(path) as f:
        for number, line in enumerate(f, 1):
            start, offset = offset, offset + len(line)
            if not line.strip():
                continue
            try:
                text = line.decode("utf-8", errors)
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"{path} is not valid UTF-8 at byte {start + exc.start} (line {number}); "
                    "fix the file or pass --errors replace"
                ) from None
            try:
                record = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number} is not a JSON record ({exc.msg}); fix the line") from None
            value = record.get(key) if isinstance(record, dict) else None
            if not isinstance(value, str):
                found = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise ValueError(
                    f"{path}:{number} has no string field {key!r} (found {found}); "
                    "pass --jsonl-key with the text field's name"
                )
            yield iter((value,))


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
    document with none comes out whole. Empty documents are skipped.
    """
    number = 0
    for runs in docs:
        buffer = ""
        searched = 0  # no cut point lies in buffer[piece_chars:searched]
        for run in runs:
            buffer += run
            while cut_inside and len(buffer) > piece_chars:
                at = safe_cut(buffer, piece_chars // 2, piece_chars, last=True)
                if at < 0:
                    at = safe_cut(buffer, max(searched, piece_chars), len(buffer) - 1, last=False)
                if at < 0:
                    searched = len(buffer) - 1
                    break
                yield Piece(number, buffer[:at], False)
                buffer, searched = buffer[at:], 0
        if buffer:
            yield Piece(number, buffer, True)
            number += 1
