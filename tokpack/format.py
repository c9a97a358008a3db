"""On-disk format: flat token files, document indexes, meta.json, and llm.c shards.

    python -c "from tokpack.format import read_meta; print(read_meta('data/sample'))"

A prepared folder holds ``train.bin`` / ``val.bin`` (flat token ids, no header, nanoGPT's
format), ``train.idx`` / ``val.idx`` (little-endian uint64 start offset of every document) and
``meta.json``, which names the dtype so no reader guesses it. ``meta.json`` is written last, so a
folder without it is incomplete.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, NotRequired, TypedDict

import numpy as np

FORMAT_VERSION = 1
META_NAME = "meta.json"
SPLITS = ("train", "val")
INDEX_DTYPE = np.dtype("<u8")
# A sharded run's record of each finished unit: while one stands without meta.json, the folder
# is an unfinished run that a rerun resumes, not data to read.
UNIT_RECORD = ".tokpack-unit-{:05d}.json"
UNIT_RECORD_GLOB = ".tokpack-unit-*.json"
UNIT_INDEX_GLOB = ".*.idx.u[0-9][0-9][0-9][0-9][0-9]"
# The same names as patterns: a record (its unit in group 1), a unit's hidden index part.
UNIT_RECORD_NAME = re.compile(r"\.tokpack-unit-(\d{5})\.json")
UNIT_INDEX_NAME = re.compile(r"\.(?:train|val)\.idx\.u\d{5}")
LOCK_NAME = ".tokpack.lock"
TMP_SUFFIX = ".tokpack-tmp"
# The names of the token files tokpack writes (flat, bare shards, llm.c shards with the folder's
# name first) and of its indexes: the only names a meta.json may list, since meta.json is data on
# disk and may be forged; any other (a path, "..", another tool's file) is refused before it is
# opened. llm.c shards start with the output folder's name, which may itself start with a dot.
SHARD_NAME = r"(?:[^/\\\x00]+_)?(?:train|val)(?:_\d{5})?_\d{6}\.bin"
DATA_FILE = re.compile(rf"(?:train|val)(?:\.|_text_document\.)(?:bin|idx)|{SHARD_NAME}")
# --format megatron's files: Megatron-LM's preprocess_data.py names them PREFIX_KEY_LEVEL.bin/.idx.
MEGATRON_NAME = "{split}_text_document"

# llm.c / modded-nanogpt shards: 256 int32 header words (magic, version, token count), then tokens:
# magic 20240520 / version 1 for uint16 (GPT-2), 20240801 / version 7 for uint32 (llama-3).
SHARD_HEADER_BYTES = 256 * 4
SHARD_VERSIONS = {"uint16": 20240520, "uint32": 20240801}
SHARD_DTYPE_VERSION = {"uint16": 1, "uint32": 7}
# The token llm.c's writers (dev/data/fineweb.py) put before every document: GPT-2's <|endoftext|>
# in version 1 shards, llama-3's <|begin_of_text|> in version 7 ones.
LLMC_DOCUMENT_START = {"uint16": 50256, "uint32": 128000}

# Megatron-LM's indexed datasets: a flat .bin beside an .idx that starts with this magic,
# followed by a uint64 version and a one-byte dtype code.
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32",
                   8: "uint16"}
# What Megatron's preprocessing writes for token ids (uint16 under 65,500 ids, else int32).
MEGATRON_TOKEN_DTYPES = ("uint16", "int32")
MEGATRON_CODES = {"uint16": 8, "uint32": 4}  # tokpack's widths as Megatron declares them (ids < 2**31)


class FileEntry(TypedDict):
    """A file as meta.json and unit records list it: a plain name of tokpack's pattern."""

    file: str
    bytes: int
    sha256: str
    tokens: NotRequired[int]  # of a shard


class SplitInfo(TypedDict):
    """meta.json's entry for one split: one flat ``bin`` or llm.c ``shards``, and the index."""

    tokens: int
    documents: int
    bin: NotRequired[FileEntry]
    shards: NotRequired[list[FileEntry]]
    idx: NotRequired[FileEntry]
    megatron_idx: NotRequired[FileEntry]
    # Of a split that holds whole parquet files: each file's row group sizes, in documents.
    row_groups: NotRequired[list[list[int]]]


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


class UnitPart(TypedDict):
    """One split of a finished unit: its counts and files, its index part, and (in a one-unit
    run, whose files stay temporary until the leader publishes them) the renames still to make."""

    info: SplitInfo
    idx: FileEntry
    renames: NotRequired[list[tuple[Path, Path]]]


class UnitRecord(TypedDict):
    """``.tokpack-unit-NNNNN.json``: data on disk, checked before any name in it is used."""

    fingerprint: NotRequired[str]
    unit: NotRequired[int]
    input_sha256: str
    splits: dict[str, UnitPart]


class ForeignFormat(NamedTuple):
    """A known non-tokpack format whose header would otherwise be read as tokens."""

    kind: str  # "megatron" or "litdata"
    description: str


def token_offset(meta: Meta) -> int:
    """The bytes before the first token of each of a folder's token files: llm.c's header, or none."""
    return SHARD_HEADER_BYTES if meta["options"].get("format") == "llmc" else 0


def split_files(info: SplitInfo) -> list[FileEntry]:
    """A split's token files as meta.json lists them: one flat ``bin``, or llm.c ``shards``."""
    return info["shards"] if "shards" in info else [info["bin"]]


def every_file(info: SplitInfo) -> list[FileEntry]:
    """Every file a split's meta.json entry lists: token files, the index, and with --format
    megatron Megatron's index."""
    return [*split_files(info), info["idx"], *([info["megatron_idx"]] if "megatron_idx" in info else [])]


# The most bytes of JSON tokpack reads as one of its own records (meta.json, a unit record, a
# cache record): a million shards' entries fit; a planted file of gigabytes is refused unread.
JSON_LIMIT = 256 << 20


def read_file(path: Path, what: str, fix: str, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; ``what`` names it in errors."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens without waiting for a writer
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {path} does not exist; {fix}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{what} {path} is not a regular file; {fix}")
        data = f.read(min(info.st_size, limit) + 1)  # a file that grew since is caught below too
        if len(data) > limit:
            raise ValueError(f"{what} {path} is {max(info.st_size, len(data)):,} bytes, more than the {limit:,} a "
                             f"{what} may have; {fix}")
        return data


def load_json(raw: bytes | str, where: str, fix: str, limit: int = JSON_LIMIT) -> Any:
    """JSON that tokpack did not necessarily write, bounded in size and depth: too large, nested
    deeper than the interpreter's recursion limit (200,000 ``[`` would overflow the parser's
    stack), or not JSON, it is one ``ValueError`` naming ``where`` and ``fix``."""
    if len(raw) > limit:
        raise ValueError(f"{where} is {len(raw):,} bytes, more than the {limit:,} tokpack reads as JSON; {fix}")
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError(f"{where} is JSON nested too deeply to read; {fix}") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise ValueError(f"{where} is not valid JSON ({exc}); {fix}") from None


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


def _meta_problem(meta: dict[str, Any]) -> str | None:
    """What is structurally wrong with a meta.json, or None: every reader relies on this shape."""
    def bad_file(entry: Any, with_tokens: bool = False) -> bool:
        return not (isinstance(entry, dict) and isinstance(entry.get("file"), str)
                    and _is_count(entry.get("bytes")) and isinstance(entry.get("sha256"), str)
                    and (not with_tokens or _is_count(entry.get("tokens"))))

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
        entries = [info.get("idx"), info.get("bin"), info.get("megatron_idx"),
                   *(info["shards"] if isinstance(info.get("shards"), list) else [])]
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
        groups = info.get("row_groups")
        if groups is not None and not (isinstance(groups, list) and all(
                isinstance(sizes, list) and all(_is_count(n) for n in sizes) for sizes in groups)
                and sum(map(sum, groups)) == info["documents"]):
            return f"split {name!r} has row_groups that are not lists of counts summing to its documents"
    return None


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _header_words(path: Path) -> np.ndarray | None:
    with open(path, "rb") as f:
        head = f.read(SHARD_HEADER_BYTES)
    return np.frombuffer(head, dtype="<i4") if len(head) == SHARD_HEADER_BYTES else None


def shard_header(path: Path) -> tuple[np.dtype, int] | None:
    """(dtype, token count) from an llm.c shard header, or None if ``path`` has none."""
    words = _header_words(path)
    if words is None or int(words[0]) not in SHARD_VERSIONS.values():
        return None
    magic, version = int(words[0]), int(words[1])
    dtype = next((d for d, v in SHARD_DTYPE_VERSION.items() if v == version), None)
    if dtype is None or SHARD_VERSIONS[dtype] != magic:
        raise ValueError(f"{path} has llm.c magic {magic} with version {version}; tokpack reads "
                         "20240520/1 (uint16) and 20240801/7 (uint32) shards. Re-create the shard")
    if words[2] < 0:
        raise ValueError(f"{path} has an llm.c header whose token count is {int(words[2])}, below 0: the header "
                         "is damaged or forged; re-create the shard")
    return np.dtype(dtype), int(words[2])


def foreign_format(path: Path) -> ForeignFormat | None:
    """The known non-tokpack format ``path`` is in, whose header would otherwise be read as tokens."""
    if is_megatron_index(path.with_suffix(".idx")):
        return ForeignFormat("megatron", "a Megatron indexed dataset (its .idx starts with MMIDIDX)")
    if re.fullmatch(r"chunk-\d+-\d+\.bin", path.name) or _is_litdata_index(path.parent / "index.json"):
        return ForeignFormat("litdata", "a litdata chunk (written by litdata.optimize; read it with litdata's "
                             "StreamingDataset)")
    return None


def _is_litdata_index(path: Path) -> bool:
    try:
        index = load_json(read_file(path, "index", "", JSON_LIMIT), str(path), "") if path.is_file() else None
    except (OSError, ValueError):
        return False
    return isinstance(index, dict) and "chunks" in index and "config" in index


def is_megatron_index(index: Path) -> bool:
    """Whether ``index`` is a Megatron ``.idx`` (it starts with MMIDIDX), not tokpack's."""
    if not index.is_file():
        return False
    with open(index, "rb") as f:
        return f.read(len(MEGATRON_MAGIC)) == MEGATRON_MAGIC


def megatron_dtype(path: Path) -> np.dtype:
    with open(path.with_suffix(".idx"), "rb") as f:
        head = f.read(len(MEGATRON_MAGIC) + 9)
    code = head[len(MEGATRON_MAGIC) + 8] if len(head) == len(MEGATRON_MAGIC) + 9 else -1
    if MEGATRON_DTYPES.get(code) not in MEGATRON_TOKEN_DTYPES:
        named = MEGATRON_DTYPES.get(code, f"code {code}")
        raise ValueError(f"{path.with_suffix('.idx')} declares dtype {named}, which is not a token dtype (it "
                         "could hold negative or fractional ids); Megatron writes "
                         f"{' or '.join(MEGATRON_TOKEN_DTYPES)}: re-create the dataset")
    return np.dtype(MEGATRON_DTYPES[code])


def tmp_path(path: Path) -> Path:
    """Where ``path`` is written before the rename that publishes it: unique to this process."""
    return path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")


def open_new(path: Path) -> BinaryIO:
    """A file this process creates to write (a temporary name, renamed when complete): never
    through a link and never onto a file that is there already, so tokpack truncates nothing it
    did not create."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        raise ValueError(f"{path} is already there, where tokpack writes a temporary file of its own; "
                         "if no other run is writing into this folder, remove it and rerun") from None
    return os.fdopen(fd, "w+b")


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[BinaryIO]:
    """A new file (``open_new``) under ``path``'s temporary name, put in its place by rename when
    the block ends; if the block fails, the temporary file goes and ``path`` is as it was."""
    tmp = tmp_path(path)
    try:
        with open_new(tmp) as f:
            yield f
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def megatron_document_starts(index: Path, tokens: int, itemsize: int) -> np.ndarray:
    """The token offset of every document of a Megatron ``.idx`` (MMIDIDX version 1: dtype code,
    sequence and document counts, int32 sequence lengths, int64 byte pointers, int64 document
    indices), checked against the ``tokens`` of its ``.bin``."""
    raw = np.memmap(index, dtype=np.uint8, mode="r")
    head = len(MEGATRON_MAGIC) + 8 + 1 + 16
    fix = "re-create it with Megatron's preprocess_data.py or python -m tokpack.prepare --format megatron"
    if len(raw) < head or bytes(raw[:len(MEGATRON_MAGIC)]) != MEGATRON_MAGIC:
        raise ValueError(f"{index} is not a Megatron index (no MMIDIDX header); {fix}")
    version, = np.frombuffer(raw[9:17], dtype="<u8")
    sequences, documents = (int(v) for v in np.frombuffer(raw[18:34], dtype="<u8"))
    if version != 1 or len(raw) < head + sequences * 12 + documents * 8 or documents < 1:
        raise ValueError(f"{index} declares version {version}, {sequences} sequences and {documents - 1} documents, "
                         f"which its {len(raw)} bytes do not hold; {fix}")
    lengths = np.frombuffer(raw[head:head + 4 * sequences], dtype="<i4").astype(np.int64)
    pointers = np.frombuffer(raw[head + 4 * sequences:head + 12 * sequences], dtype="<i8")
    document_indices = np.frombuffer(raw[head + 12 * sequences:head + 12 * sequences + 8 * documents], dtype="<i8")
    expected = np.concatenate([[0], np.cumsum(lengths[:-1])]) * itemsize
    if ((lengths <= 0).any() or not np.array_equal(pointers, expected) or lengths.sum() != tokens
            or document_indices[0] != 0 or document_indices[-1] != sequences or (np.diff(document_indices) <= 0).any()):
        raise ValueError(f"{index} does not describe the {tokens} tokens of its .bin in order (lengths, pointers or "
                         f"document indices disagree); {fix}")
    return pointers[document_indices[:-1]] // itemsize


def write_megatron_index(write: Callable[[bytes], Any], starts_file: Path, documents: int, tokens: int,
                         dtype: np.dtype, chunk: int = 1 << 20) -> None:
    """A Megatron ``.idx``, one sequence a document as Megatron's preprocess_data.py writes it, for
    the documents whose starts a tokpack ``.idx`` holds; streamed ``chunk`` documents at a time."""
    write(MEGATRON_MAGIC + np.array([1], "<u8").tobytes() + bytes([MEGATRON_CODES[dtype.name]])
          + np.array([documents, documents + 1], "<u8").tobytes())
    for section in ("lengths", "pointers"):
        for lo in range(0, documents, chunk):
            count = min(chunk, documents - lo)
            starts = np.fromfile(starts_file, dtype=INDEX_DTYPE, count=count + 1, offset=lo * 8).astype(np.int64)
            if section == "lengths":
                ends = starts[1:] if len(starts) > count else np.append(starts[1:], tokens)
                write((ends - starts[:count]).astype("<i4").tobytes())
            else:
                write((starts[:count] * dtype.itemsize).astype("<i8").tobytes())
    for lo in range(0, documents + 1, chunk):
        write(np.arange(lo, min(lo + chunk, documents + 1), dtype="<i8").tobytes())


def remove_own(path: Path) -> bool:
    """Remove a file that tokpack wrote (the caller has matched its name to tokpack's pattern): a
    regular file only, never a link nor what it points to. Whether it was removed."""
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            path.unlink()
            return True
    except FileNotFoundError:
        pass
    return False


def remove_leftovers(folder: Path) -> list[str]:
    """What a run killed after publishing meta.json left in a whole folder: unit records, index
    parts, temporaries and its lock. Only while no run holds the lock: a running prepare's
    records are its work. Returns the names removed."""
    if not (folder / META_NAME).is_file():
        return []
    lock = folder / LOCK_NAME
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EACCES):
            return []  # not tokpack's lock, or not ours to take: leave the folder as it is
        raise
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return []
        found = [*folder.glob(UNIT_RECORD_GLOB), *folder.glob(UNIT_INDEX_GLOB), *folder.glob(f".*{TMP_SUFFIX}")]
        if fd is not None and stat.S_ISREG(os.fstat(fd).st_mode):
            found.append(lock)
        return sorted(p.name for p in found if remove_own(p))
    finally:
        if fd is not None:
            os.close(fd)
