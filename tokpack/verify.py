"""Prove that a prepared folder is whole and consistent with its meta.json.

    python -m tokpack.verify data/sample      # exit 0 when whole, 1 with the reason otherwise
    python -m tokpack.verify s3://bucket/edu  # a remote folder, streamed: the same checks

Checks, per split, through the folder's verbs (``tokpack.storage.folder``), so a local and a
remote folder are checked alike: every token file's size (and llm.c header) before any byte is
read, then its sha256 and every id below n_vocab; the token counts; the document index (count,
first offset 0, strictly increasing, inside the split); Megatron's index naming the same
documents; a loss mask's size, sha256, values and count of 1s; a guarded folder's reports against
meta.json, field by field (docs/dedup.md). O(folder bytes), read once; O(clusters) held.

See docs/formats.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .cli import parser, run_cli
from .format import (GUARD_REMOVED, GUARD_ROW_LIMIT, INDEX_DTYPE, MASK_DTYPE, FileEntry, Meta, SplitInfo, describe_guard,
                     mask_files, parse_guard_row, parse_shard_header, split_files, split_threshold, token_offset)
from .format.megatron import parse_starts
from .storage import Missing, is_url
from .storage.folder import Folder, as_folder, published
from .storage.local import remove_leftovers

CHUNK_BYTES = 1 << 22  # verify streams: memory is two of these, not the size of a file


class VerifyError(Exception):
    """A prepared folder that is not whole; the message says what and where."""


# A check of each block of a file as it streams by: (its values' bytes, where they start, the
# file as messages name it); it raises VerifyError.
BlockCheck = Callable[[bytes, int, str], None]


def check_entry(folder: Folder, entry: FileEntry, each: BlockCheck | None = None, offset: int = 0,
                size_checked: bool = False) -> None:
    """A file of ``folder`` against its entry in meta.json (or a unit record): its size (unless
    ``size_checked`` already) and sha256, and ``each`` block's values after ``offset`` header
    bytes: one streaming read in fixed blocks, so memory does not grow with the file."""
    if not size_checked:
        _sized(folder, entry)
    with folder.open(entry["file"]) as f:
        check_stream(f, f"{folder.where}/{entry['file']}", entry, each, offset)


def check_tokens(folder: Folder, entry: FileEntry, dtype: np.dtype, offset: int, n_vocab: int,
                 size_checked: bool = False) -> None:
    """``check_entry`` of a token file: every id below ``n_vocab``."""
    def ids(body: bytes, at: int, where: str) -> None:
        top = int(np.frombuffer(body, dtype=dtype).max())
        if top >= n_vocab:
            raise VerifyError(f"{where} holds id {top} near byte {at}, n_vocab is {n_vocab}")

    check_entry(folder, entry, ids, offset, size_checked)


def _sized(folder: Folder, entry: FileEntry) -> int:
    """The size of an entry's file, refused unless meta.json's: before any of its bytes are read."""
    where = f"{folder.where}/{entry['file']}"
    try:
        size = folder.size(entry["file"])
    except Missing:
        raise VerifyError(f"{where} does not exist") from None
    except ValueError as exc:  # a link, or not a regular file
        raise VerifyError(str(exc)) from None
    if size != entry["bytes"]:
        raise VerifyError(f"{where} is {size} bytes but meta.json records {entry['bytes']}")
    return size


def check_stream(f: BinaryIO, where: str, info: FileEntry, each: BlockCheck | None = None, offset: int = 0) -> None:
    """``check_entry`` of an open stream. A block is hashed in a thread while the next is read and
    checked: sha256 is the slow part, and it lets go of the GIL."""
    digest = hashlib.sha256()
    done = 0
    with ThreadPoolExecutor(1, thread_name_prefix="tokpack-verify") as hashing:
        hashed: Future[None] | None = None
        while chunk := f.read(CHUNK_BYTES):
            if hashed is not None:
                hashed.result()
                hashed = None
            if len(chunk) < CHUNK_BYTES:  # the last block: hashed here (a small file starts no thread)
                digest.update(chunk)
            else:
                hashed = hashing.submit(digest.update, chunk)
            body = chunk[max(offset - done, 0):]
            if each is not None and body:
                each(body, done, where)
            done += len(chunk)
        if hashed is not None:
            hashed.result()
    if done != info["bytes"]:
        raise VerifyError(f"{where} is {done} bytes, meta.json says {info['bytes']}")
    if digest.hexdigest() != info["sha256"]:
        raise VerifyError(f"{where} has sha256 {digest.hexdigest()}, meta.json says {info['sha256']}")


def check_index(folder: Folder, entry: FileEntry, documents: int, tokens: int, what: str) -> None:
    """A document index, read once: its size and sha256, and ``documents`` starts, from 0,
    strictly increasing, below ``tokens`` (``what`` names the tokens in messages)."""
    seen = [0, -1]  # starts read so far, the last of them

    def increasing(body: bytes, at: int, where: str) -> None:
        starts = np.frombuffer(body, dtype=INDEX_DTYPE).astype(np.int64)
        if (seen[0] == 0 and starts[0] != 0) or starts[0] <= seen[1] or (np.diff(starts) <= 0).any():
            raise VerifyError(f"{where} is not a strictly increasing list of offsets inside {what}")
        seen[:] = seen[0] + len(starts), int(starts[-1])

    check_entry(folder, entry, increasing)
    where = f"{folder.where}/{entry['file']}"
    if seen[0] != documents:
        raise VerifyError(f"{where} lists {seen[0]} documents, meta.json says {documents}")
    if seen[1] >= tokens:
        raise VerifyError(f"{where} is not a strictly increasing list of offsets inside {what}")


def _token_count(folder: Folder, entry: FileEntry, meta: Meta) -> int:
    """The tokens a token file holds by its size and, in llm.c's format, its header: each must be
    what meta.json records, before a byte of the body is read."""
    dtype, offset = np.dtype(meta["dtype"]), token_offset(meta)
    where = f"{folder.where}/{entry['file']}"
    size = _sized(folder, entry)
    tokens, rest = divmod(size - offset, dtype.itemsize)
    if rest or tokens < 0:
        raise VerifyError(f"{where} is {size} bytes, not a whole number of {dtype} tokens")
    if offset:
        try:
            header = parse_shard_header(folder.read(entry["file"], 0, offset), where)
        except ValueError as exc:
            raise VerifyError(str(exc)) from None
        if header != (dtype, tokens):
            raise VerifyError(f"{where} has an llm.c header for {header[1] if header else 'no'} tokens of "
                              f"{header[0] if header else 'no dtype'}, but its size holds {tokens} {dtype} tokens")
    if "tokens" in entry and tokens != entry["tokens"]:
        raise VerifyError(f"{where} holds {tokens} tokens, meta.json says {entry['tokens']}")
    return tokens


def _check_megatron(folder: Folder, info: SplitInfo, itemsize: int) -> None:
    """Megatron's index names the very same documents as tokpack's. O(documents) in memory."""
    entry, idx = info["megatron_idx"], info["idx"]
    check_entry(folder, entry)
    where = f"{folder.where}/{entry['file']}"
    try:
        starts = parse_starts(np.frombuffer(folder.read(entry["file"]), np.uint8), info["tokens"], itemsize, where)
    except ValueError as exc:
        raise VerifyError(str(exc)) from None
    if not np.array_equal(starts, np.frombuffer(folder.read(idx["file"]), INDEX_DTYPE).astype(np.int64)):
        raise VerifyError(f"{where} names other documents than {folder.where}/{idx['file']}")


def check_mask(folder: Folder, entry: FileEntry) -> int:
    """``check_entry`` of a loss mask (one byte a token: parse_meta checked its size): each value
    0 or 1. Returns how many 1s it holds."""
    ones = [0]

    def binary(body: bytes, at: int, where: str) -> None:
        values = np.frombuffer(body, dtype=MASK_DTYPE)
        top = int(values.max())
        if top > 1:
            raise VerifyError(f"{where} holds value {top} near byte {at}, a mask holds 0 and 1")
        ones[0] += int(np.count_nonzero(values))

    check_entry(folder, entry, binary)
    return ones[0]


def _check_masks(folder: Folder, name: str, info: SplitInfo) -> None:
    """A split's masks, with as many 1s as meta.json's supervised count, and one at least."""
    ones = sum(check_mask(folder, entry) for entry in mask_files(info))
    if ones != info["supervised"]:
        raise VerifyError(f"the {name} split's mask in {folder.where} trains on {ones} tokens, meta.json says "
                          f"{info['supervised']}")
    if not ones and info["tokens"]:  # prepare writes no conversation without a trained token
        raise VerifyError(f"the {name} split's mask in {folder.where} trains on none of its {info['tokens']} tokens, "
                          "which every reader refuses; prepare the folder again")


def _check_guard(folder: Folder, meta: Meta) -> None:
    """Each split's guard report against meta.json, field by field: its sha256 and row count, one
    row a line of the report's fields in document order, written documents' indexes inside the
    split and in order, each cluster whole (its first document and a later one, the similarities
    on the signature's grid, one pair at least at the threshold) and as many as meta.json counts,
    as many moved and removed documents as it counts, each evaluation file's count, and the guard's
    rules as the run's options give them. Read as it streams, a line at a time; O(clusters) held."""
    record = meta["guard"]  # type: ignore[typeddict-item]
    _check_rules(record, meta["options"].get("guard"), f"{folder.where}/meta.json")
    report = _Report(record, indexed="chat" not in meta)
    for name, info in meta["splits"].items():
        if "guard" not in info:
            raise VerifyError(f"{folder.where}/meta.json records a guard but lists no report of the {name} split")
        entry, held = info["guard"], [b""]
        report_at = f"{folder.where}/{entry['file']}"
        report.start(name, info["documents"])

        def lines(body: bytes, at: int, where: str) -> None:
            *whole, held[0] = (held[0] + body).split(b"\n")
            for line in whole:
                report.row(line, where)
            if len(held[0]) > GUARD_ROW_LIMIT:  # a line that long is no row: not held whole
                raise VerifyError(f"{where} holds a line of more than {GUARD_ROW_LIMIT:,} bytes near byte {at}, "
                                  "longer than any guard report's row")

        check_entry(folder, entry, lines)
        if held[0]:
            raise VerifyError(f"{report_at} ends inside a line")
        if entry.get("rows") != report.rows:
            raise VerifyError(f"{report_at} holds {report.rows} rows, meta.json says {entry.get('rows')} (a report "
                              "written before tokpack counted its rows: prepare it again)")
    report.finish(folder.where)


def _check_rules(record: Any, options: Any, where: str) -> None:
    """meta.json's guard record names the rules its run's options give: which parts, and each setting."""
    if not isinstance(record, dict) or not isinstance(options, dict):
        raise VerifyError(f"{where} has a guard record but not the guard's options it was run with")
    near = bool(options.get("near_split")) or options.get("dedup") == "near"
    expected = {
        "near": {"ngram": options.get("ngram"), "hashes": options.get("hashes"), "bands": options.get("bands"),
                 "threshold": options.get("threshold"), "split": options.get("near_split")} if near else None,
        "dedup": {"mode": options.get("dedup")} if options.get("dedup") not in (None, "none") else None,
        "decontaminate": {"ngram": options.get("decontaminate_ngram"), "report_only": options.get("report_only"),
                          "min_words": options.get("decontaminate_min_words"),
                          "paths": list(options.get("decontaminate") or ())} if options.get("decontaminate") else None,
    }
    if set(record) != {part for part, rules in expected.items() if rules}:
        raise VerifyError(f"{where}'s guard record holds {sorted(record)}, its options ask for "
                          f"{sorted(part for part, rules in expected.items() if rules)}")
    for part, rules in expected.items():
        if rules is None:
            continue
        if not isinstance(record[part], dict):
            raise VerifyError(f"{where}'s guard.{part} is not an object")
        found = dict(record[part])
        if part == "decontaminate":
            files = found.get("files")
            found["paths"] = [f.get("path") if isinstance(f, dict) else None for f in files] \
                if isinstance(files, list) else None
        for key, value in rules.items():
            if type(found.get(key)) is not type(value) or found.get(key) != value:
                raise VerifyError(f"{where}'s guard.{part}.{key} is {found.get(key)!r}, the run's options say "
                                  f"{value!r}")
    near = record.get("near")
    if near and not (type(near["hashes"]) is int and near["hashes"] > 0 and type(near["threshold"]) in (int, float)
                     and 0 < near["threshold"] <= 1):
        raise VerifyError(f"{where}'s guard.near has hashes {near['hashes']!r} and threshold {near['threshold']!r}, "
                          "not a count and a share in (0, 1]")


class _Report:
    """What a guarded folder's report rows hold, read a row at a time and compared with meta.json's
    guard record at the end."""

    def __init__(self, record: dict[str, Any], indexed: bool):
        self.record, self.indexed = record, indexed  # indexed: a text folder (a written row has an index)
        self.hashes = record["near"]["hashes"] if "near" in record else None
        self.counted = dict.fromkeys([*GUARD_REMOVED[1:], "to val", "to train"], 0)  # a row's removal, or its move
        self.clusters: dict[int, list[int]] = {}  # cluster: [first seen, most bins a later one agrees on]
        self.evaluation: dict[str, int] = {}  # evaluation file: train documents holding its n-grams, counted
        self.contaminated = 0
        self.split, self.documents, self.rows, self._last = "", 0, 0, (-1, -1)

    def start(self, split: str, documents: int) -> None:
        self.split, self.documents, self.rows, self._last = split, documents, 0, (-1, -1)

    def row(self, line: bytes, where: str) -> None:
        try:
            row = parse_guard_row(line, where)
            document, removed, index, own = row["document"], row["removed"], row["index"], row["own_split"]
            cluster, similarity, sets = row["cluster"], row["similarity"], row.get("evaluation")
            bins = self._bins(document, cluster, similarity)
            if not (document > self._last[0] and self._indexed(index, removed) and (sets is None or sets)
                    and (removed != "evaluation" or sets is not None)):
                raise ValueError
        except ValueError:
            raise VerifyError(f"{where} holds a line that is not a guard report's row, in order: "
                              f"{line[:80]!r}") from None
        self.rows += 1
        self._last = (document, self._last[1] if index is None else index)
        if removed is not None:
            self.counted[removed] += 1
        elif own != self.split:
            self.counted[f"to {self.split}"] += 1
        if cluster is not None:
            seen = self.clusters.setdefault(cluster, [0, -1])
            if cluster == document:
                seen[0] = 1
            else:
                seen[1] = max(seen[1], bins)
        if sets is not None and self.split == "train" and removed in (None, "evaluation"):
            self.contaminated += 1
            for name in sets:
                self.evaluation[name] = self.evaluation.get(name, 0) + 1

    def _indexed(self, index: Any, removed: str | None) -> bool:
        """An index where the document was written (a text folder's, in order), none where it was not."""
        if index is None:
            return removed is not None or not self.indexed
        return self.indexed and removed is None and type(index) is int and self._last[1] < index < self.documents

    def _bins(self, document: int, cluster: Any, similarity: Any) -> int:
        """How many signature bins a member agrees on with its cluster's first (its similarity on
        the signature's grid, 1.0 for the first itself and wherever no signature was made)."""
        if cluster is None:
            if similarity is not None:
                raise ValueError
            return -1
        if not (type(cluster) is int and 0 <= cluster <= document and type(similarity) is float):
            raise ValueError
        hashes = self.hashes or 1
        bins = round(similarity * hashes)
        if not 0 <= bins <= hashes or round(bins / hashes, 4) != similarity or (
                (cluster == document or self.hashes is None) and bins != hashes):
            raise ValueError
        return bins

    def finish(self, where: str) -> None:
        """The clusters whole and as many as meta.json counts; each removal, move and evaluation
        file's count as meta.json counts them."""
        record, near = self.record, self.record.get("near")
        # a cluster's first is joined to one later member at least: by the rule, or as a copy
        joined_at = None if near is None else near["threshold"] if not near["split"] else near.get("split_threshold")
        if near is not None and near["split"] and joined_at != split_threshold(near["threshold"], near["hashes"]):
            raise VerifyError(f"{where}'s meta.json records a split joined at {joined_at!r}, where its threshold "
                              f"{near['threshold']} and {near['hashes']} hashes give "
                              f"{split_threshold(near['threshold'], near['hashes'])}")
        need = 1 if joined_at is None else math.ceil(joined_at * near["hashes"] - 1e-9)
        for cluster, (first, best) in self.clusters.items():
            if not first or best < need:
                raise VerifyError(f"the guard reports of {where} list cluster {cluster} "
                                  f"{'with' if first else 'without'} its first document, its closest later one "
                                  f"agreeing on {best if best >= 0 else 'no'} bins, where meta.json's rule joins at "
                                  f"{need}")
        if near is not None and near.get("clusters") != len(self.clusters):
            raise VerifyError(f"the guard reports of {where} list {len(self.clusters)} clusters, meta.json says "
                              f"{near.get('clusters')!r}")
        mode = record.get("dedup", {}).get("mode")
        decontaminate = record.get("decontaminate", {})
        removing = decontaminate and not decontaminate["report_only"]
        expected = {"copy": _removed(record) if mode == "exact" else 0, "near-copy": 0,
                    "evaluation": decontaminate.get("removed") if removing else 0,
                    "near-copy of val": near.get("removed_from_train", 0) if near and near["split"] else 0,
                    "to val": near.get("moved_to_val") if near and near["split"] else 0,
                    "to train": near.get("moved_to_train") if near and near["split"] else 0}
        counted = dict(self.counted)
        if mode == "near":  # a copy of the same text is a near copy too
            counted["near-copy"] += counted.pop("copy")
            expected.pop("copy")
            expected["near-copy"] = _removed(record)
        for what, count in expected.items():
            if counted[what] != count:
                raise VerifyError(f"the guard reports of {where} list {counted[what]} documents {what}, meta.json "
                                  f"says {count!r}")
        if decontaminate:
            self._evaluation(decontaminate, where)

    def _evaluation(self, record: dict[str, Any], where: str) -> None:
        word = "found" if record["report_only"] else "removed"
        said: dict[str, Any] = {}
        for entry in record["files"]:
            count, before = entry.get(word), said.get(entry["path"], 0)
            said[entry["path"]] = before + count if type(count) is int and type(before) is int else None
        if record.get(word) != self.contaminated or said != {path: self.evaluation.get(path, 0) for path in said} \
                or set(self.evaluation) - set(said):
            raise VerifyError(f"the guard reports of {where} list {self.contaminated} train documents holding "
                              f"evaluation n-grams ({self.evaluation}), meta.json says {record.get(word)!r} ({said})")


def _removed(record: dict[str, Any]) -> Any:
    """dedup's removals in meta.json, over its inputs."""
    counts = record["dedup"].get("removed")
    return sum(counts) if isinstance(counts, list) and all(type(n) is int for n in counts) else counts


def verify_folder(folder: str | Path, storage_options: dict[str, Any] | None = None) -> dict[str, int]:
    """Raise VerifyError unless ``folder`` is whole; returns tokens per split. A remote folder (its
    URL) is streamed the same way: each listed object read once in ranges, nothing stored.

    Args:
        folder: a prepared folder, or its URL.
        storage_options: for a URL, the store's options, as for remote inputs.
    """
    try:
        where = as_folder(folder, storage_options)
        meta, _ = published(where)
    except ValueError as exc:
        raise VerifyError(str(exc)) from None
    dtype, n_vocab = np.dtype(meta["dtype"]), meta["encoding"]["n_vocab"]
    if n_vocab > np.iinfo(dtype).max + 1:
        raise VerifyError(f"dtype {dtype} in meta.json cannot hold n_vocab {n_vocab}")
    counts = {}
    for name, info in meta["splits"].items():  # every size and header first, then the bytes
        total = sum(_token_count(where, entry, meta) for entry in split_files(info))
        if total != info["tokens"]:
            raise VerifyError(f"{name} should hold {info['tokens']} {dtype} tokens, its files hold {total}")
    for name, info in meta["splits"].items():
        for entry in split_files(info):  # sized above
            check_tokens(where, entry, dtype, token_offset(meta), n_vocab, size_checked=True)
        check_index(where, info["idx"], info["documents"], info["tokens"],
                    f"the {name} split ({info['tokens']} tokens)")
        if "megatron_idx" in info:
            _check_megatron(where, info, dtype.itemsize)
        if mask_files(info):
            _check_masks(where, name, info)
        counts[name] = info["tokens"]
    if "guard" in meta:
        _check_guard(where, meta)
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    p = parser("verify", __doc__)
    p.add_argument("folder", help="a folder written by python -m tokpack.prepare")
    args = p.parse_args(argv)

    def body() -> int:
        try:
            counts = verify_folder(args.folder)
        except (VerifyError, FileNotFoundError, ValueError) as exc:
            print(f"tokpack.verify: {args.folder} is NOT whole: {exc}", file=sys.stderr)
            return 1
        parts = ", ".join(f"{split} {n:,} tokens" for split, n in counts.items())
        print(f"tokpack.verify: {args.folder} is whole ({parts})")
        print(f"tokpack.verify: {describe_guard(published(as_folder(args.folder))[0])}")
        removed = [] if is_url(args.folder) else remove_leftovers(Path(args.folder))
        if removed:
            print(f"tokpack.verify: removed {len(removed)} leftovers of a run killed after it finished "
                  f"({', '.join(removed[:3])}{', ...' if len(removed) > 3 else ''})")
        return 0

    return run_cli(body)


if __name__ == "__main__":
    raise SystemExit(main())
