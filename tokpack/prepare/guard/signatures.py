"""The sign stage of a guarded run: a unit's documents read (no tokenizer) and signed, into files
of the unit that any task of the run may write and every task reads.

    .tokpack-sign-00003.docs     a document each: split hash, number in its read, input, own split
    .tokpack-sign-00003.prints   16-bit fingerprints, ``hashes`` a document
    .tokpack-sign-00003.copies07 the text hashes in part 7 of the match's hash ranges (``match.ENTRY``)
    .tokpack-sign-00003.near07   the band hashes in part 7 of its band ranges, ``bands`` a document in all
    .tokpack-sign-00003.hits     (document, evaluation set) of each n-gram hit
    .tokpack-sign-00003.json     the record, written last: the run's fingerprint, the unit, the
                                 sha256 of its input and of each file above

A unit's signatures are a function of its input and the run's options, so whichever task writes
them writes the same bytes; a record of another run, or whose files do not hash as recorded, is
signed again. Each file goes to a temporary name first and the record last, so a killed task
leaves no record whose files are not whole. The text and band hashes are written already cut into
the match's parts (``match.Part``), so the task that matches a part reads that part of every unit
and nothing else. 40 + 2 x hashes + 18 x bands bytes a document (1,128 at the defaults), whatever
the tokenizer.

See docs/dedup.md.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ...chat import messages, tools
from ...corpus import ReadOptions, documents, parse_record, records
from ...dedup.minhash import Shingling, sign, words
from ...dedup.ngrams import NgramIndex
from ...format import SIGN, SIGN_GLOB, SIGN_NAME, load_json
from ...storage.local import named_errors, open_new, read_own, remove_own, tmp_path, write_json_atomic
from ...tokenizer import encoded_batches
from . import match
from ..plan.shares import Share
from ..plan.holdout import Holdout, Rule, conversation_hash, document_hash, document_key, hash_small
from ..plan.input_hash import input_sha256

DOC = np.dtype([("hash", "<u8"), ("number", "<i8"), ("file", "<i4"), ("read", "u1"), ("val", "u1")])
HIT = np.dtype([("doc", "<i8"), ("set", "<u2")])
_BATCH_CHARS = 1 << 19
# What a document weighs in a batch beside its text: its signing arrays (about 36 bytes a bin,
# 9 KB at 256) outweigh a short text's, and a batch of 8,000 one-line documents held 300 MB.
_DOCUMENT_CHARS = 256
_ENCODED = 1 << 20  # characters of a text encoded at a time for its split hash
_NEAR = 64 << 10  # rows of a signature file this close are read in one slab, those between passed over
_SLAB = 8 << 20  # the most bytes of a signature file read at once
_BLOCK = 1 << 18  # documents checked at a time


class Reading(NamedTuple):
    """How a run's documents are read for signing: as its units read them."""

    read: ReadOptions
    seed: int
    holdout: Holdout
    chat: bool  # records are conversations: a document each, numbered by record
    files: dict[Any, int]  # each input file's place among the run's files


class Signed(NamedTuple):
    """A unit's signatures as its files hold them, read where they lie."""

    docs: Stored  # DOC, a document
    prints: Stored  # uint16 (documents, hashes)
    routed: dict[str, tuple[Path, str]]  # each part's entries of its hashes (``match.Part.name``), and their sha256
    hits: np.ndarray  # HIT
    slots: list[int]  # how many numbers each read of the unit gives out
    input_sha256: str
    digest: str  # of its record, which hashes every file above


def documents_of(reading: Reading, entries: list[Share]) -> Iterator[tuple[int, str, bytes | None, int]]:
    """(number, text, split hash, file) of each document of one read, numbered as the unit
    numbers them: text, its non-empty documents; conversations, every record (a record that is
    not a conversation gives no document, and its number is skipped, as the unit skips it). A
    text's split hash is None here: the signing threads take it, beside its signature."""
    key = document_key(reading.seed)
    number = 0
    for entry in entries:
        file = reading.files[entry.file]
        if reading.chat:
            for where, value in records([entry]):
                try:
                    record = parse_record(value, where, reading.read.errors)
                    found = messages(record, where)
                    tools(record, where)
                except ValueError:
                    number += 1
                    continue
                yield number, "\n".join(map(_words_of, found)), conversation_hash(key, found), file
                number += 1
            continue
        for runs in documents([entry], reading.read):
            text = "".join(runs)
            if text:
                yield number, text, None, file
                number += 1


def _words_of(message: dict[str, Any]) -> str:
    """A message's text as signed: its content, or its parts' texts (nanochat's), one a line."""
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str))
    return content if isinstance(content, str) else ""


def sign_unit(out: Path, unit: int, share: list[Share], reads: list[tuple[str | None, list[Share]]],
              reading: Reading, shingling: Shingling | None, index: NgramIndex | None, workers: int,
              fingerprint: str) -> None:
    """Sign the documents of ``unit`` (its input ``share``, read as ``reads``) into its files in
    ``out``, the record last; the share's sha256 is taken beside, as the unit's record takes it."""
    stop = threading.Event()
    with ThreadPoolExecutor(1) as hashing:
        digest = hashing.submit(input_sha256, share, stop)
        parts: dict[str, Any] = {}
        try:
            for name in _names(shingling):
                parts[name] = _Part(out / SIGN.format(unit, name))
            slots = _sign_reads(reads, reading, shingling, index, workers, parts)
            files = {name: part.close() for name, part in parts.items()}
            record = {"fingerprint": fingerprint, "unit": unit, "input_sha256": digest.result(), "slots": slots,
                      "files": files}
        except BaseException:
            stop.set()
            for part in parts.values():
                part.discard()
            raise
        for part in parts.values():
            os.replace(part.tmp, part.path)
        write_json_atomic(out / SIGN.format(unit, "json"), record, durable=False)


def _sign_reads(reads: list[tuple[str | None, list[Share]]], reading: Reading, shingling: Shingling | None,
                index: NgramIndex | None, workers: int, parts: dict[str, Any]) -> list[int]:
    """Each read's documents signed in ``workers`` threads, in batches, written in order; how many
    numbers each read gave out."""
    slots = []
    done = 0
    for at, (only, entries) in enumerate(reads):
        count = 0
        signing = functools.partial(_sign, read=at, only=only, reading=reading, shingling=shingling, index=index)
        for batch, signed in encoded_batches(documents_of(reading, entries), signing, workers, _BATCH_CHARS,
                                             2 * workers, size=lambda found: len(found[1]) + _DOCUMENT_CHARS):
            count = batch[-1][0] + 1
            done = _write(signed, parts, done)
        slots.append(count)
    return slots


def _sign(batch: list[tuple[int, str, bytes | None, int]], read: int, only: str | None, reading: Reading,
          shingling: Shingling | None, index: NgramIndex | None) -> tuple[np.ndarray, Any, list[frozenset[int]]]:
    """A batch's documents (``DOC``), signatures and evaluation hits."""
    key = document_key(reading.seed)
    hashes = []
    for _, text, found, _ in batch:
        if found is None:
            digest = document_hash(key)
            for at in range(0, len(text), _ENCODED):  # a slice at a time: never a long text's bytes whole
                hash_small(digest, text[at:at + _ENCODED].encode("utf-8", "surrogatepass"))  # the others sign meanwhile
            found = digest.digest()
        hashes.append(found)
    docs = np.zeros(len(batch), dtype=DOC)
    docs["read"] = read
    docs["number"] = [number for number, _, _, _ in batch]
    docs["hash"] = [int.from_bytes(h, "big") for h in hashes]
    docs["file"] = [file for _, _, _, file in batch]
    docs["val"] = [only == "val" if reading.holdout.kind == Rule.INPUTS else reading.holdout.is_val(h) for h in hashes]
    texts = [text for _, text, _, _ in batch]
    found = words(texts)  # once, for the signatures and the evaluation n-grams
    return (docs, sign(texts, shingling, found) if shingling is not None else None,
            index.hits(texts, found) if index is not None else [])


def _parts(shingling: Shingling | None) -> list[match.Part]:
    return match.parts(shingling.bands if shingling is not None else 0)


def _names(shingling: Shingling | None) -> list[str]:
    """The files of a unit's signatures but its record."""
    return ["docs", "prints", "hits", *(part.name for part in _parts(shingling))]


def _write(signed: tuple[np.ndarray, Any, list[frozenset[int]]], parts: dict[str, Any], done: int) -> int:
    """A signed batch into the unit's files, its hashes cut into the match's parts; the documents
    written so far."""
    docs, signatures, hits = signed
    parts["docs"].write(docs)
    local = np.arange(done, done + len(docs), dtype=np.int64)
    routed = [(match.Kind.COPIES, docs["hash"][:, None])]
    if signatures is not None:
        parts["prints"].write(signatures.fingerprints)
        routed.append((match.Kind.NEAR, signatures.bands))
    for kind, values in routed:
        for part, entries in match.routed(kind, values, local):
            parts[part.name].write(entries)
    found = [(done + i, s) for i, sets in enumerate(hits) for s in sorted(sets)]
    if found:
        parts["hits"].write(np.array(found, dtype=HIT))
    return done + len(docs)


class _Part:
    """One file of a unit's signatures, written to a temporary name and hashed as it is written.
    Not synced to disk: the record holds each file's sha256, and a file that does not hash as
    recorded (after a crash of the machine) is signed again; a unit of 38 files synced one by one
    cost a tenth of the guard stage."""

    def __init__(self, path: Path):
        self.path, self.tmp = path, tmp_path(path)
        self.file = open_new(self.tmp)
        self.digest = hashlib.sha256()
        self.bytes = 0

    def write(self, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array).tobytes()
        with named_errors(self.path):
            self.file.write(data)
        self.digest.update(data)
        self.bytes += len(data)

    def close(self) -> dict[str, Any]:
        with named_errors(self.path):
            self.file.close()
        return {"bytes": self.bytes, "sha256": self.digest.hexdigest()}

    def discard(self) -> None:
        try:
            self.file.close()
        except OSError:
            pass  # a full disk fails its flush again: the error that discards it is the one to tell
        remove_own(self.tmp)


def load_unit(out: Path, unit: int, fingerprint: str, shingling: Shingling | None, files: set[int],
              sets: int) -> Signed | None:
    """The signatures of ``unit`` if its record is this run's, its files are as recorded and what
    they hold names only its own input ``files`` and evaluation sets (``sets`` of them), else None."""
    try:
        raw = read_own(out / SIGN.format(unit, "json"))
        record = load_json(raw, f"{out}'s signatures of unit {unit}", "they are signed again")
        if not (isinstance(record, dict) and record.get("fingerprint") == fingerprint and record.get("unit") == unit
                and isinstance(record.get("input_sha256"), str) and isinstance(record.get("slots"), list)
                and all(type(s) is int and s >= 0 for s in record["slots"]) and isinstance(record.get("files"), dict)):
            return None
        routed = {p.name for p in _parts(shingling)}
        sizes = {name: _checked(out / SIGN.format(unit, name), record["files"].get(name), name not in routed)
                 for name in _names(shingling)}
        k, b = (shingling.hashes, shingling.bands) if shingling is not None else (0, 0)
        n, extra = divmod(sizes["docs"], DOC.itemsize)
        entries = {kind: sum(sizes[p.name] for p in _parts(shingling) if p.kind == kind) for kind in match.Kind}
        if extra or sizes["prints"] != n * k * 2 or sizes["hits"] % HIT.itemsize \
                or entries[match.Kind.COPIES] != n * match.ENTRY.itemsize \
                or entries[match.Kind.NEAR] != n * b * match.ENTRY.itemsize:
            return None
        docs = Stored(out / SIGN.format(unit, "docs"), DOC, (n,))
        hits = Stored(out / SIGN.format(unit, "hits"), HIT, (sizes["hits"] // HIT.itemsize,))[:]
        if not _valid(docs, hits, record["slots"], files, sets):
            return None
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return Signed(docs, Stored(out / SIGN.format(unit, "prints"), np.dtype(np.uint16), (n, k)),
                  {name: (out / SIGN.format(unit, name), record["files"][name]["sha256"]) for name in routed}, hits,
                  record["slots"],
                  record["input_sha256"], hashlib.sha256(raw).hexdigest())


class Stored:
    """An array in a file of a unit's signatures, read a block of rows, or a set of them, at a
    time: a copy, through no mapping, so the file's pages never stay in this process's memory (a
    unit may hold a whole corpus's signatures).

    Args:
        path: the file, opened without following a link.
        dtype: its rows' type; ``shape``: its rows and, where a row is an array, their length.
        field: a field of the rows given instead of the rows.
    """

    def __init__(self, path: Path, dtype: np.dtype, shape: tuple[int, ...], field: str | None = None):
        self.path, self.dtype, self.shape, self.field = path, dtype, shape, field
        self.row = int(np.prod(shape[1:], dtype=np.int64))

    def __len__(self) -> int:
        return self.shape[0]

    def column(self, field: str) -> Stored:
        return Stored(self.path, self.dtype, self.shape, field)

    def __getitem__(self, rows: slice | np.ndarray) -> np.ndarray:
        if isinstance(rows, slice):
            lo, hi, _ = rows.indices(len(self))
            count = max(hi - lo, 0)
        else:
            count = len(rows)
        size = self.row * self.dtype.itemsize
        out = np.empty((count, *self.shape[1:]), self.dtype)
        if count and size:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                if isinstance(rows, slice):
                    f.seek(lo * size)
                    out = np.fromfile(f, self.dtype, count=count * self.row).reshape(out.shape)
                else:
                    out = self._rows(f.fileno(), np.asarray(rows), size)
        return out[self.field] if self.field else out

    def _rows(self, fd: int, rows: np.ndarray, size: int) -> np.ndarray:
        """The rows ``rows``, in their order: rows near each other (less than ``_NEAR`` bytes
        apart) read in one slab of ``_SLAB`` bytes at most, the rows between them passed over, a
        lone row read alone (a mapping would fault in 64 KB around every row, and a read a row was
        most of matching a corpus of near-copies)."""
        wanted, back = np.unique(rows, return_inverse=True)
        out = np.empty((len(wanted), *self.shape[1:]), self.dtype)
        cuts = np.flatnonzero(np.diff(wanted) * size > _NEAR) + 1
        most = max(1, _SLAB // size)
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(wanted)]):
            for lo in range(int(wanted[a]), int(wanted[b - 1]) + 1, most):
                hi = min(lo + most, int(wanted[b - 1]) + 1)
                slab = np.frombuffer(os.pread(fd, (hi - lo) * size, lo * size), self.dtype)
                i, j = np.searchsorted(wanted, [lo, hi])
                out[i:j] = slab.reshape(hi - lo, *self.shape[1:])[wanted[i:j] - lo]
        return out[back]


def _checked(path: Path, entry: Any, opened: bool = True) -> int:
    """A signature file's size, if its size and sha256 are as recorded; not ``opened``, its size as
    recorded: a part of the match's entries is read, and checked, by the one task that matches it,
    not opened by every task."""
    if not (isinstance(entry, dict) and type(entry.get("bytes")) is int and entry["bytes"] >= 0
            and isinstance(entry.get("sha256"), str)):
        raise ValueError(f"{path.name} is not recorded")
    if not opened:
        return entry["bytes"]
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)  # a link is no file of ours
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size != entry["bytes"]:
            raise ValueError(f"{path.name} is not as recorded")
        digest = hashlib.file_digest(f, "sha256")
    if digest.hexdigest() != entry["sha256"]:
        raise ValueError(f"{path.name} is not as recorded")
    return size


def _valid(docs: Stored, hits: np.ndarray, slots: list[int], files: set[int], sets: int) -> bool:
    """Whether a record's documents are numbered within their reads and come from its files, and
    its hits name its documents and the run's evaluation sets."""
    if not (hits["set"] < sets).all() or not ((hits["doc"] >= 0) & (hits["doc"] < len(docs))).all():
        return False
    limits = np.array(slots + [0], dtype=np.int64)
    for at in range(0, len(docs), _BLOCK):  # a block at a time: a unit may be a whole corpus
        block = docs[at:at + _BLOCK]
        reads = np.minimum(block["read"].astype(np.int64), len(slots))  # past the reads: a limit of 0
        if not ((block["number"] >= 0).all() and (block["number"] < limits[reads]).all()
                and (block["val"] <= 1).all() and np.isin(block["file"], list(files)).all()):
            return False
    return True


def clear(out: Path) -> None:
    """Every unit's signatures in ``out`` (once meta.json stands, or a run starts over)."""
    for path in out.glob(SIGN_GLOB):
        if SIGN_NAME.fullmatch(path.name):
            remove_own(path)
