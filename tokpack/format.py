"""On-disk format: flat token files, document indexes, meta.json, and llm.c shards.

    python -c "from tokpack.format import read_meta; print(read_meta('data/sample'))"

A prepared folder holds ``train.bin`` / ``val.bin`` (flat token ids, no header, nanoGPT's
format), ``train.idx`` / ``val.idx`` (little-endian uint64 start offset of every document) and
``meta.json``, which names the dtype so no reader guesses it. ``meta.json`` is written last, so a
folder without it is incomplete.
"""

from __future__ import annotations

import glob
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

FORMAT_VERSION = 1
META_NAME = "meta.json"
SPLITS = ("train", "val")
INDEX_DTYPE = np.dtype("<u8")

# llm.c / modded-nanogpt shards: 256 int32 header words (magic, version, token count), then tokens:
# magic 20240520 / version 1 for uint16 (GPT-2), 20240801 / version 7 for uint32 (llama-3).
SHARD_HEADER_BYTES = 256 * 4
SHARD_VERSIONS = {"uint16": 20240520, "uint32": 20240801}
SHARD_DTYPE_VERSION = {"uint16": 1, "uint32": 7}
SHARD_MAGIC = SHARD_VERSIONS["uint16"]

# Megatron-LM's indexed datasets: a flat .bin beside an .idx that starts with this magic,
# followed by a uint64 version and a one-byte dtype code.
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 8: "uint16"}


def split_files(info: dict[str, Any]) -> list[dict[str, Any]]:
    """A split's token files as meta.json lists them: one flat ``bin``, or llm.c ``shards``."""
    return info["shards"] if "shards" in info else [info["bin"]]


def read_meta(folder: str | Path) -> dict[str, Any]:
    """The meta.json of a prepared folder, checked for a format this version reads."""
    path = Path(folder) / META_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: {folder} is not a complete prepared folder; "
            "run python -m tokpack.prepare to (re)create it"
        )
    try:
        meta = json.loads(path.read_text("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); rerun python -m tokpack.prepare --force") from None
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
        return not (isinstance(entry, dict) and isinstance(entry.get("file"), str) and "/" not in entry["file"]
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
        if bad_file(info.get("idx")):
            return f"split {name!r} has no valid idx entry"
        shards = info.get("shards")
        if shards is not None:
            if not isinstance(shards, list) or not shards or any(bad_file(s, True) for s in shards):
                return f"split {name!r} has invalid shards"
        elif bad_file(info.get("bin")):
            return f"split {name!r} has no valid bin entry"
    return None


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _recorded_tokens(meta: dict[str, Any], name: str) -> int | None:
    """Tokens meta.json records for the token file ``name``: a flat split's, or a shard's."""
    for info in meta["splits"].values():
        if "bin" in info and info["bin"]["file"] == name:
            return info["tokens"]
        for shard in info.get("shards", []):
            if shard["file"] == name:
                return shard["tokens"]
    return None


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
    return np.dtype(dtype), int(words[2])


def _foreign_format(path: Path) -> str | None:
    """The name of a known non-tokpack format whose header would otherwise be read as tokens."""
    index = path.with_suffix(".idx")
    if index.is_file():
        with open(index, "rb") as f:
            if f.read(len(MEGATRON_MAGIC)) == MEGATRON_MAGIC:
                return "a Megatron indexed dataset (its .idx starts with MMIDIDX)"
    if re.fullmatch(r"chunk-\d+-\d+\.bin", path.name) or _is_litdata_index(path.parent / "index.json"):
        return "a litdata chunk (written by litdata.optimize; read it with litdata's StreamingDataset)"
    return None


def _is_litdata_index(path: Path) -> bool:
    try:
        index = json.loads(path.read_text("utf-8")) if path.is_file() else None
    except (OSError, ValueError):
        return False
    return isinstance(index, dict) and "chunks" in index and "config" in index


def _megatron_dtype(path: Path) -> np.dtype:
    with open(path.with_suffix(".idx"), "rb") as f:
        head = f.read(len(MEGATRON_MAGIC) + 9)
    code = head[len(MEGATRON_MAGIC) + 8] if len(head) == len(MEGATRON_MAGIC) + 9 else -1
    if code not in MEGATRON_DTYPES:
        raise ValueError(f"{path.with_suffix('.idx')} names dtype code {code}, which is not a token dtype; "
                         "re-create the Megatron dataset with an integer dtype")
    return np.dtype(MEGATRON_DTYPES[code])


def open_tokens(path: str | Path, dtype: str | np.dtype | None = None) -> np.memmap:
    """Memory-map a token file: a prepared split, an llm.c shard, a Megatron ``.bin``, or a bare
    file with ``dtype``.

    The dtype comes from an llm.c header if the file has one, else from meta.json beside the
    file, else from a Megatron ``.idx`` beside it, else from ``dtype``; a ``dtype`` that
    contradicts any of these, a file whose size does not fit it, and litdata chunks are refused.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"token file {path} does not exist; run python -m tokpack.prepare first")
    size = path.stat().st_size
    offset = 0
    header = shard_header(path)
    foreign = None if header or (path.parent / META_NAME).is_file() else _foreign_format(path)
    if header is not None:
        found, count = header
        offset = SHARD_HEADER_BYTES
        expected = SHARD_HEADER_BYTES + found.itemsize * count
        if size != expected:
            raise ValueError(
                f"{path} is {size} bytes but its llm.c header promises {count} {found} tokens "
                f"({expected} bytes); the shard is truncated, re-create it"
            )
    elif (path.parent / META_NAME).is_file():
        meta = read_meta(path.parent)
        found = np.dtype(meta["dtype"])
        expected_tokens = _recorded_tokens(meta, path.name)
        if expected_tokens is not None and size != expected_tokens * found.itemsize:
            raise ValueError(f"{path} is {size} bytes but meta.json records {expected_tokens} {found} tokens "
                             f"({expected_tokens * found.itemsize} bytes); the file was changed or truncated, "
                             "rerun python -m tokpack.prepare --force")
    elif foreign and foreign.startswith("a Megatron"):
        found = _megatron_dtype(path)
    elif foreign:
        raise ValueError(f"{path} is {foreign}, not a token file tokpack reads; pass a tokpack, llm.c or "
                         "Megatron .bin")
    elif dtype is not None:
        found = np.dtype(dtype)
    else:
        raise ValueError(
            f"cannot tell the dtype of {path}: no meta.json beside it and no llm.c header; "
            "pass dtype='uint16' (or the dtype it was written with)"
        )
    if dtype is not None and np.dtype(dtype) != found:
        raise ValueError(f"{path} holds {found} tokens, not the dtype={np.dtype(dtype)} asked for; drop dtype=")
    if (size - offset) % found.itemsize:
        raise ValueError(
            f"{path} is {size} bytes, not a whole number of {found} tokens "
            f"({found.itemsize} bytes each); the file is truncated, re-create it"
        )
    if size == offset:
        raise ValueError(f"{path} holds no tokens; prepare a non-empty corpus")
    return np.memmap(path, dtype=found, mode="r", offset=offset)


def token_files(path: str | Path | Sequence[str | Path], split: str | None = None) -> list[Path]:
    """The token files behind ``path``: a file, a list of files, a glob, a prepared folder (with
    ``split``), or a folder of shards, never mixing splits silently.

    A folder of llm.c-style shards named ``*_train_*.bin`` / ``*_val_*.bin`` is read per
    ``split``; without ``split`` such a folder is refused with the glob to use.
    """
    if not isinstance(path, (str, Path)):
        files = [Path(p) for p in path]
        if not files:
            raise ValueError("no token files given; pass a path, a list of paths, a glob or a folder")
        return files
    raw, path = str(path), Path(path)
    if not path.exists() and any(ch in raw for ch in "*?["):
        matches = sorted(Path(m) for m in glob.glob(raw) if Path(m).is_file())
        if not matches:
            raise FileNotFoundError(f"glob {raw!r} matches no file; check the pattern")
        return matches
    if not path.is_dir():
        if split is not None:
            raise ValueError(f"split={split!r} applies to folders, but {path} is a file; drop split=")
        return [path]
    if (path / META_NAME).is_file():
        splits = read_meta(path)["splits"]
        if split not in splits:
            raise ValueError(f"{path} is a prepared folder with splits {', '.join(splits)}; "
                             f"pass split= one of them (got {split!r})")
        return [path / f["file"] for f in split_files(splits[split])]
    shards = sorted(p for p in path.glob("*.bin") if p.is_file())
    if not shards:
        raise FileNotFoundError(f"folder {path} holds no .bin files; pass a token file or a shard folder")
    by_split: dict[str, list[Path]] = {}
    for shard in shards:
        named = re.search(r"(?:^|[_.-])(train|val|test)(?=[_.-])", shard.name)
        by_split.setdefault(named.group(1) if named else "", []).append(shard)
    if split is not None:
        if split not in by_split:
            raise ValueError(f"{path} holds no *_{split}_*.bin shards; splits found: "
                             f"{', '.join(sorted(k for k in by_split if k)) or 'none'}")
        return by_split[split]
    if len(by_split) > 1:
        named = sorted(k for k in by_split if k)
        example = re.sub(r"\d+", "*", by_split[named[0]][0].name)
        raise ValueError(f"{path} holds token files of several splits ({', '.join(named)}); pass "
                         f"split={named[0]!r} or a glob such as '{path / example}' so they are never mixed")
    return shards
