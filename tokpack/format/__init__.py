"""On-disk format: every name tokpack gives a file, meta.json's and the records' schemas, llm.c's header.

    python -c "from tokpack.format import read_meta; print(read_meta('data/sample'))"

A prepared folder holds ``train.bin`` / ``val.bin`` (flat token ids, no header, nanoGPT's
format), ``train.idx`` / ``val.idx`` (little-endian uint64 start offset of every document), with
``--chat`` ``train.mask`` / ``val.mask`` (a byte a token; one beside each shard in shards), and
``meta.json``, which names the dtype so no reader guesses it. ``meta.json`` is written last, so a
folder without it is incomplete.
Megatron's index is ``tokpack.format.megatron``.

See docs/formats.md.
"""

from __future__ import annotations

import enum
import json
import os
import re
import stat
from pathlib import Path
from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

import numpy as np

FORMAT_VERSION = 1
SPLITS = ("train", "val")
INDEX_DTYPE = np.dtype("<u8")
MASK_DTYPE = np.dtype("uint8")  # a loss mask: one byte a token, 1 = trained on

# Every name tokpack gives a file, in one table. What tokpack reads back from disk (meta.json,
# unit records, a cache's records) may be forged, so a name found there is used only if it
# matches its pattern here; anything else (a path, "..", another tool's file) is refused before
# it is opened.
#
# A prepared folder: meta.json, written last (a folder without it is incomplete), the token files
# and indexes it lists, and while a run works, its lock and temporaries.
META_NAME = "meta.json"
BIN_NAME = "{split}.bin"  # a flat split, nanoGPT's name
IDX_NAME = "{split}.idx"  # tokpack's document index
MASK_NAME = "{split}.mask"  # a conversation split's loss mask: one byte a token, 1 = trained on
# Shards: bare (``train_UUUUU_KKKKKK.bin``, unit and shard) or llm.c's, the folder's name first,
# which may itself start with a dot.
SHARD_STEM = r"(?:[^/\\\x00]+_)?(?:train|val)(?:_\d{5})?_\d{6}"
SHARD_NAME = SHARD_STEM + r"\.bin"
MASK_SHARD_NAME = SHARD_STEM + r"\.mask"  # a shard's loss mask, beside it: one byte a token
# --format megatron's files: Megatron-LM's preprocess_data.py names them PREFIX_KEY_LEVEL.bin/.idx.
MEGATRON_NAME = "{split}_text_document"
GUARD_REPORT = "{split}.guard.jsonl"  # the split's documents the guard moved, removed or found near copies of


class Removed(enum.IntEnum):
    """Why the guard removed a document (``KEPT``: it did not), as a report row's ``removed`` says."""

    KEPT = 0
    COPY = 1  # a later copy of the same text (--dedup)
    NEAR_COPY = 2  # a later near-duplicate (--dedup near)
    EVALUATION = 3  # a train document holding an evaluation n-gram (--decontaminate)
    NEAR_COPY_OF_VAL = 4  # a train near-copy of a document of the user's val (--near-split --val-inputs)

    @property
    def label(self) -> str | None:
        return None if self is Removed.KEPT else self.name.lower().replace("_", "-", 1).replace("_", " ")


GUARD_REMOVED = tuple(reason.label for reason in Removed)  # a report row's "removed", by its code
# The split joins near-duplicates this many standard errors of the similarity estimate below the
# threshold: a pair at exactly the threshold is estimated below it half the time, and a val
# document left beside its train near-copy is a leak, where one moved too many costs nothing.
SPLIT_MARGIN = 3


def split_threshold(threshold: float, hashes: int) -> float:
    """The estimated similarity from which ``--near-split`` keeps two documents on one side."""
    return round(max(threshold - SPLIT_MARGIN * (threshold * (1 - threshold) / hashes) ** 0.5, 0.0), 4)
DATA_FILE = re.compile(rf"(?:train|val)(?:\.|_text_document\.)(?:bin|idx)|(?:train|val)\.mask|{SHARD_NAME}|"
                       rf"{MASK_SHARD_NAME}|(?:train|val)\.guard\.jsonl")
LOCK_NAME = ".tokpack.lock"
TMP_SUFFIX = ".tokpack-tmp"  # ".NAME.PID" + this: a file being written, renamed to NAME when whole
# A sharded run's record of each finished unit (while one stands without meta.json, the folder is
# an unfinished run that a rerun resumes, not data to read) and each unit's hidden index part.
UNIT_RECORD = ".tokpack-unit-{:05d}.json"
UNIT_RECORD_GLOB = ".tokpack-unit-*.json"
UNIT_RECORD_NAME = re.compile(r"\.tokpack-unit-(\d{5})\.json")  # its unit in group 1
UNIT_INDEX = ".{split}.idx.u{unit:05d}"
UNIT_INDEX_GLOB = ".*.idx.u[0-9][0-9][0-9][0-9][0-9]"
UNIT_INDEX_NAME = re.compile(r"\.(?:train|val)\.idx\.u\d{5}")
SIGN = ".tokpack-sign-{:05d}.{}"  # a unit's signatures of a guarded run (--near-split, --dedup, --decontaminate)
PAIRS = ".tokpack-sign-pairs-{}{:02d}.{}"  # the pairs one part of the match found, its record, its claim
PLACED = ".tokpack-sign-placed.{}"  # where the guard sends each moved or dropped document, its record, its claim
SIGN_GLOB = ".tokpack-sign-*"
SIGN_NAME = re.compile(r"\.tokpack-sign-(?:\d{5}\.(?:json|docs|prints|hits|lock|(?:copies|near)\d{2})"
                       r"|pairs-(?:copies|near)\d{2}\.(?:bin|json|lock)|placed\.(?:bin|json|lock))")
MATCH = ".tokpack-match-{}-{:05d}"  # a guarded run's spill file while matching, only ever at its temporary name
# A remote folder being published: the probe that proves the credentials may write.
PROBE = ".tokpack-probe-{}"  # + a random hex token
PROBE_NAME = re.compile(r"\.tokpack-probe-[0-9a-f]{32}")
# A remote run's local spool: a folder of this prefix, marked (and locked) by its run.
SPOOL_PREFIX = "tokpack-spool-"
SPOOL_MARK = ".tokpack-spool"
# The cache of remote folders: one mirror folder a URL, named by hex digits of its sha256.
MIRROR_HEX = 24
MIRROR_NAME = re.compile(f"[0-9a-f]{{{MIRROR_HEX}}}")
CACHE_LOCK_NAME = ".tokpack-cache.lock"
FETCHED_NAME = ".tokpack-fetched.json"  # a mirror's record: the sha256 of each file fetched into it
LEASE_PREFIX = ".tokpack-lease-"  # + pid: the files that process holds open
FETCHING_SUFFIX = ".tokpack-fetching"  # "." + name + this: held while one process fetches the file


def plain_name(name: str, where: str) -> str:
    """``name`` if it names a file directly inside a folder (``where``, for the message): no
    separator, no "." or "..", no NUL; otherwise one line refusing it."""
    if not name or name in (".", "..") or any(ch in name for ch in "/\\\x00"):
        raise ValueError(f"{name!r} is not a plain file name inside {where}; tokpack reads and writes only "
                         "its own files directly inside a folder")
    return name


# llm.c / modded-nanogpt shards: 256 int32 header words (magic, version, token count), then tokens:
# magic 20240520 / version 1 for uint16 (GPT-2), 20240801 / version 7 for uint32 (llama-3).
SHARD_HEADER_BYTES = 256 * 4
SHARD_VERSIONS = {"uint16": 20240520, "uint32": 20240801}
SHARD_DTYPE_VERSION = {"uint16": 1, "uint32": 7}
# The token llm.c's writers (dev/data/fineweb.py) put before every document: GPT-2's <|endoftext|>
# in version 1 shards, llama-3's <|begin_of_text|> in version 7 ones.
LLMC_DOCUMENT_START = {"uint16": 50256, "uint32": 128000}



class FileEntry(TypedDict):
    """A file as meta.json and unit records list it: a plain name of tokpack's pattern."""

    file: str
    bytes: int
    sha256: str
    tokens: NotRequired[int]  # of a shard
    rows: NotRequired[int]  # of a guard report


class SplitInfo(TypedDict):
    """meta.json's entry for one split: one flat ``bin`` or llm.c ``shards``, and the index."""

    tokens: int
    documents: int
    bin: NotRequired[FileEntry]
    shards: NotRequired[list[FileEntry]]
    idx: NotRequired[FileEntry]
    megatron_idx: NotRequired[FileEntry]
    # Of a split of conversations (--chat): the loss mask beside the tokens (one file, or one a
    # shard), and its 1s.
    mask: NotRequired[FileEntry]
    mask_shards: NotRequired[list[FileEntry]]
    supervised: NotRequired[int]
    # Of a split that holds whole parquet files: each file's row group sizes, in documents.
    row_groups: NotRequired[list[list[int]]]
    # Of a guarded run (--near-split, --dedup, --decontaminate): its report of the split.
    guard: NotRequired[FileEntry]


class EncodingInfo(TypedDict):
    name: str
    ranks_sha256: str  # the vocabulary's hash (a tokenizer.json's own)
    n_vocab: int
    eot_id: int
    backend: dict[str, str]  # name and version of what encoded the ids


class InputsInfo(TypedDict):
    given: list[dict[str, Any]]
    files: int
    bytes: int
    listing_sha256: str
    units_sha256: NotRequired[list[str]]


class Meta(TypedDict):
    """meta.json: written last, so a folder without it is incomplete."""

    format_version: int
    tokpack_version: str
    encoding: EncodingInfo
    dtype: str
    eot: str
    single_document: bool
    val: dict[str, Any]
    text_newlines: str
    splits: dict[str, SplitInfo]
    inputs: InputsInfo
    options: dict[str, Any]
    chat: NotRequired[dict[str, Any]]  # of conversations (--chat): the renderer and the counts
    guard: NotRequired[dict[str, Any]]  # the split guard's, dedup's and decontamination's rules and counts


class UnitPart(TypedDict):
    """One split of a finished unit: its counts and files, its index part, and (while its files are
    temporary: until the ledger keeps the unit, or the leader publishes a one-unit run) the
    renames still to make."""

    info: SplitInfo
    idx: FileEntry
    renames: NotRequired[list[tuple[str, str]]]


class UnitRecord(TypedDict):
    """``.tokpack-unit-NNNNN.json``: data on disk, checked before any name in it is used."""

    fingerprint: NotRequired[str]
    unit: NotRequired[int]
    input_sha256: str
    splits: dict[str, UnitPart]
    chat: NotRequired[dict[str, Any]]  # of conversations: how many were written, skipped and cut (a mixture's report)
    verdicts: NotRequired[str]  # of a guarded run: the digest of the verdicts on its documents


def token_offset(meta: Meta) -> int:
    """The bytes before the first token of each of a folder's token files: llm.c's header, or none."""
    return SHARD_HEADER_BYTES if meta["options"].get("format") == "llmc" else 0


def split_files(info: SplitInfo) -> list[FileEntry]:
    """A split's token files as meta.json lists them: one flat ``bin``, or llm.c ``shards``."""
    return info["shards"] if "shards" in info else [info["bin"]]


def mask_files(info: SplitInfo) -> list[FileEntry]:
    """A conversation split's mask files, one a token file; none for a split without a mask."""
    return [info["mask"]] if "mask" in info else info.get("mask_shards", [])


def every_file(info: SplitInfo) -> list[FileEntry]:
    """Every file a split's meta.json entry lists: token files, the index, with --format megatron
    Megatron's index, masks, and the guard's report."""
    megatron = [info["megatron_idx"]] if "megatron_idx" in info else []
    guard = [info["guard"]] if "guard" in info else []
    return [*split_files(info), info["idx"], *megatron, *mask_files(info), *guard]


def meta_files(splits: Mapping[str, SplitInfo]) -> list[FileEntry]:
    """Every file meta.json's ``splits`` list, split by split."""
    return [entry for info in splits.values() for entry in every_file(info)]


# The most bytes of JSON tokpack reads as one of its own records (meta.json, a unit record, a
# cache record): a million shards' entries fit; a planted file of gigabytes is refused unread.
JSON_LIMIT = 256 << 20


def read_file(path: Path, what: str, fix: str, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; ``what`` names it in errors."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens without waiting for a writer
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {path} does not exist; {fix}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # before a file object, which refuses a folder by its descriptor's number
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise ValueError(f"{what} {path} is {kind}; {fix}")
    with os.fdopen(fd, "rb") as f:
        data = f.read(min(info.st_size, limit) + 1)  # a file that grew since is caught below too
        if len(data) > limit:
            raise ValueError(f"{what} {path} is {max(info.st_size, len(data)):,} bytes, more than the {limit:,} a "
                             f"{what} may have; {fix}")
        return data


_DECODER = json.JSONDecoder()


def load_json(raw: bytes | str, where: str, fix: str, limit: int = JSON_LIMIT) -> Any:
    """JSON that tokpack did not necessarily write, bounded in size and depth: too large, nested
    deeper than the interpreter's recursion limit (200,000 ``[`` would overflow the parser's
    stack), or not JSON, it is one ``ValueError`` naming ``where`` and ``fix``."""
    if len(raw) > limit:
        raise ValueError(f"{where} is {len(raw):,} bytes, more than the {limit:,} tokpack reads as JSON; {fix}")
    try:
        if isinstance(raw, str):  # json.loads' own scan, without its layers: a fifth of a chat record's parse
            try:
                value, end = _DECODER.raw_decode(raw)
            except ValueError:
                pass  # json.loads words it (or reads what leads with whitespace)
            else:
                if end == len(raw) or not raw[end:].strip(" \t\n\r"):  # json's whitespace, no other
                    return value
        return json.loads(raw)
    except RecursionError:
        raise ValueError(f"{where} is JSON nested too deeply to read; {fix}") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise ValueError(f"{where} is not valid JSON ({exc}); {fix}") from None


# A guard report row's most bytes (its evaluation files' names included): a longer line is no row.
GUARD_ROW_LIMIT = 1 << 20
_ROW_FIELDS = {"document": (int,), "file": (str,), "own_split": (str,), "index": (int, type(None)),
               "cluster": (int, type(None)), "similarity": (float, type(None)), "removed": (str, type(None))}


def parse_guard_row(line: bytes | str, where: str) -> dict[str, Any]:
    """A guard report's line as its row: every field of its type, none negative, the split and
    the reason of removal tokpack's; one ``ValueError`` naming ``where`` otherwise."""
    fix = "it is not a row of a report tokpack wrote; prepare the folder again"
    row = load_json(line, where, fix, GUARD_ROW_LIMIT)
    sets = row.get("evaluation", []) if isinstance(row, dict) else None
    if not (isinstance(row, dict) and all(key in row and type(row[key]) in kind for key, kind in _ROW_FIELDS.items())
            and all(row[key] is None or row[key] >= 0 for key in ("document", "index", "cluster", "similarity"))
            and row["own_split"] in SPLITS and row["removed"] in GUARD_REMOVED
            and isinstance(sets, list) and all(isinstance(name, str) for name in sets)):
        raise ValueError(f"{where} is not a guard report's row ({str(line)[:80]}); {fix}")
    return row


_META_FIX = "rerun python -m tokpack.prepare --force"


def read_meta(folder: str | Path) -> Meta:
    """The meta.json of a prepared folder, checked for a format this version reads."""
    path = Path(folder) / META_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: {folder} is not a complete prepared folder; "
            "run python -m tokpack.prepare to (re)create it"
        )
    return parse_meta(read_file(path, "meta.json", _META_FIX, JSON_LIMIT), str(path))


def parse_meta(raw: bytes, path: str) -> Meta:
    """A meta.json's bytes (read from ``path``), checked as ``read_meta`` checks them."""
    meta = load_json(raw, path, _META_FIX)
    version = meta.get("format_version") if isinstance(meta, dict) else None
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{path} has format_version {version!r}, this tokpack reads {FORMAT_VERSION}; "
            "rerun python -m tokpack.prepare --force or upgrade tokpack"
        )
    problem = _meta_problem(meta)
    if problem:
        raise ValueError(f"{path} is malformed: {problem}; rerun python -m tokpack.prepare --force")
    return meta


def bad_file(entry: Any, with_tokens: bool = False) -> bool:
    """Whether ``entry`` is not a file entry (name, bytes, sha256, and with ``with_tokens`` a count)."""
    return not (isinstance(entry, dict) and isinstance(entry.get("file"), str)
                and _is_count(entry.get("bytes")) and isinstance(entry.get("sha256"), str)
                and (not with_tokens or _is_count(entry.get("tokens"))))


def _meta_problem(meta: dict[str, Any]) -> str | None:
    """What is structurally wrong with a meta.json, or None: every reader relies on this shape."""
    if meta.get("dtype") not in ("uint16", "uint32"):
        return f"dtype {meta.get('dtype')!r} is not uint16 or uint32"
    enc = meta.get("encoding")
    if not (isinstance(enc, dict) and isinstance(enc.get("name"), str) and _is_count(enc.get("n_vocab"))
            and _is_count(enc.get("eot_id"))):
        return "encoding needs name, n_vocab and eot_id"
    options = meta.get("options")
    if not (isinstance(options, dict) and isinstance(options.get("encoding"), str)):
        return "options needs the encoding"
    splits = meta.get("splits")
    if not isinstance(splits, dict) or not splits:
        return "splits is missing or empty"
    for name, info in splits.items():
        if not (isinstance(info, dict) and _is_count(info.get("tokens")) and _is_count(info.get("documents"))):
            return f"split {name!r} needs tokens and documents counts"
        entries = [info.get("idx"), info.get("bin"), info.get("megatron_idx"), info.get("mask"), info.get("guard"),
                   *(info["shards"] if isinstance(info.get("shards"), list) else []),
                   *(info["mask_shards"] if isinstance(info.get("mask_shards"), list) else [])]
        for entry in entries:
            file = entry.get("file") if isinstance(entry, dict) else None
            if isinstance(file, str) and not DATA_FILE.fullmatch(file):
                return f"split {name!r} lists {file!r}, which is not the name of a file tokpack writes"
        if bad_file(info.get("idx")):
            return f"split {name!r} has no valid idx entry"
        shards = info.get("shards")
        if shards is not None:
            if not isinstance(shards, list) or not shards or any(bad_file(s, True) for s in shards):
                return f"split {name!r} has invalid shards"
        elif bad_file(info.get("bin")):
            return f"split {name!r} has no valid bin entry"
        if "megatron_idx" in info and bad_file(info["megatron_idx"]):
            return f"split {name!r} has an invalid megatron_idx entry"
        if "guard" in info and (bad_file(info["guard"]) or info["guard"]["file"] != GUARD_REPORT.format(split=name)):
            return f"split {name!r} has a guard entry that is not its {GUARD_REPORT.format(split=name)}"
        if "mask" in info and not (not bad_file(info["mask"]) and _is_count(info.get("supervised"))
                                   and info["mask"]["bytes"] == info["tokens"] and "bin" in info):
            return f"split {name!r} has a mask entry that is not one byte a token of a flat split, with its count"
        if ("supervised" in info or meta.get("chat") is not None) and not ("mask" in info or "mask_shards" in info):
            return f"split {name!r} is of conversations but lists no loss mask, so every token would be trained on"
        if "mask_shards" in info and not _masks_match(info):
            return f"split {name!r} has mask_shards that are not one byte a token of each of its shards, with its count"
        groups = info.get("row_groups")
        if groups is not None and not (isinstance(groups, list) and all(
                isinstance(sizes, list) and all(_is_count(n) for n in sizes) for sizes in groups)
                and sum(map(sum, groups)) == info["documents"]):
            return f"split {name!r} has row_groups that are not lists of counts summing to its documents"
    return None


def _masks_match(info: dict[str, Any]) -> bool:
    masks, shards = info["mask_shards"], info.get("shards")
    return (isinstance(masks, list) and isinstance(shards, list) and len(masks) == len(shards)
            and _is_count(info.get("supervised")) and "mask" not in info
            and all(not bad_file(m, True) and isinstance(s, dict) and m["tokens"] == s.get("tokens") == m["bytes"]
                    for m, s in zip(masks, shards)))


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def shard_header(path: Path) -> tuple[np.dtype, int] | None:
    """(dtype, token count) from the llm.c shard header of the file at ``path``, or None if it has none."""
    with open(path, "rb") as f:
        return parse_shard_header(f.read(SHARD_HEADER_BYTES), str(path))


def parse_shard_header(head: bytes, where: str) -> tuple[np.dtype, int] | None:
    """(dtype, token count) from the first bytes of a file (read from ``where``), or None if they
    are no llm.c shard header; a header of another version, or with a negative count, is refused."""
    if len(head) < SHARD_HEADER_BYTES:
        return None
    words = np.frombuffer(head[:SHARD_HEADER_BYTES], dtype="<i4")
    if int(words[0]) not in SHARD_VERSIONS.values():
        return None
    magic, version = int(words[0]), int(words[1])
    dtype = next((d for d, v in SHARD_DTYPE_VERSION.items() if v == version), None)
    if dtype is None or SHARD_VERSIONS[dtype] != magic:
        raise ValueError(f"{where} has llm.c magic {magic} with version {version}; tokpack reads "
                         "20240520/1 (uint16) and 20240801/7 (uint32) shards. Re-create the shard")
    if words[2] < 0:
        raise ValueError(f"{where} has an llm.c header whose token count is {int(words[2])}, below 0: the header "
                         "is damaged or forged; re-create the shard")
    return np.dtype(dtype), int(words[2])


def describe_guard(meta: Meta) -> str:
    """One line of how a folder's val was guarded: what a loss on it can be compared with."""
    record = meta.get("guard", {})
    near = record.get("near", {})
    if near.get("split"):
        how = (f"{near['removed_from_train']:,} train documents removed" if "removed_from_train" in near else
               f"{near['moved_to_val'] + near['moved_to_train']:,} documents moved")
        held = (f"no near-copy of a train document (Jaccard of word {near['ngram']}-grams >= {near['threshold']}: "
                f"pairs estimated at {near.get('split_threshold', near['threshold'])} or more kept on one side, "
                f"three standard errors below it, MinHash {near['hashes']} in {near['bands']} bands; {how})")
    else:
        held = ("not guarded against near-copies of train documents (prepared with --no-near-split, from one "
                "document, or by a tokpack before the guard was the default: prepare it again to guard it)")
    decontaminated = record.get("decontaminate")
    sets = (f"; train decontaminated ({decontaminated['ngram']}-grams) of "
            f"{', '.join(f['path'] for f in decontaminated['files'])}" if decontaminated and
            not decontaminated["report_only"] else "; train not decontaminated (prepare --decontaminate)")
    dedup = f"; duplicates written once ({record['dedup']['mode']})" if "dedup" in record else ""
    return f"val: {held}{sets}{dedup}"
