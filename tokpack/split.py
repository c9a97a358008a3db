"""One opened split: its token files, their dtype and meta.json, found once and handed down.

    python -c "from tokpack.split import open_split; print(open_split('data/sample', 'train'))"

``open_split`` takes whatever names token files (a file, a list of files, a glob, a prepared
folder with ``split=``, a folder of llm.c shards) and returns a ``Split``: every file with its
dtype, header offset, token count and recorded sha256, meta.json as read, and a fingerprint of
the data. Opening costs O(files): meta.json is read once per folder and each file is looked at
once. Readers (datasets, the loader's state, verify, inspect, evaluate, check) take the Split and
re-derive nothing; a worker that receives one only maps its files, after checking that each is
still the file that was opened.

See docs/formats.md.
"""

from __future__ import annotations

import glob
import hashlib
import json
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .storage.cache import CachedFolder
from .storage import is_url, redact
from .format import (INDEX_DTYPE, JSON_LIMIT, LLMC_DOCUMENT_START, MASK_DTYPE, META_NAME, SHARD_HEADER_BYTES,
                     UNIT_RECORD_GLOB, Meta, load_json, mask_files, read_file, read_meta, shard_header, split_files,
                     token_offset)
from .format import megatron


@dataclass(frozen=True)
class TokenFile:
    """One token file as it was found: its tokens start ``offset`` bytes in (an llm.c header)."""

    path: Path
    dtype: np.dtype
    offset: int
    tokens: int
    sha256: str | None  # as meta.json records it, if it does
    identity: tuple[int, int, int]  # size, inode and mtime when opened

    def memmap(self) -> np.memmap:
        """The tokens, memory-mapped read-only, once the file is checked to be the one opened."""
        try:
            info = self.path.stat()
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.path} was removed after its split was opened; "
                                    "build the dataset again") from None
        if (info.st_size, info.st_ino, info.st_mtime_ns) != self.identity:
            raise ValueError(f"{self.path} was rewritten after its split was opened ({self.identity[0]} bytes "
                             f"then, {info.st_size} now); build the dataset again to read the new data")
        return np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset, shape=(self.tokens,))


@dataclass(frozen=True, eq=False)
class Split:
    """The token files of one split, in order, all of one dtype.

    ``folder`` and ``meta`` are set for a prepared folder's split (``name`` is the split's name);
    ``fingerprint`` pins the data (each file's name, size and recorded sha256) for resume states.
    A remote folder's split has its ``cache`` (``tokpack.storage.cache``), ``fits`` saying whether
    the whole split fits in it; ``folder`` is then its mirror in the cache.
    """

    files: tuple[TokenFile, ...]
    dtype: np.dtype
    name: str | None = None
    folder: Path | None = None
    meta: Meta | None = field(default=None, repr=False)
    fingerprint: str = ""
    cache: CachedFolder | None = field(default=None, repr=False)
    fits: bool = True
    mask: Split | None = field(default=None, repr=False)  # a split of conversations: its loss mask, file by file

    @property
    def lengths(self) -> np.ndarray:
        return np.array([f.tokens for f in self.files], dtype=np.int64)

    @property
    def paths(self) -> list[Path]:
        return [f.path for f in self.files]

    def open(self) -> OpenedFiles:
        """Every file's tokens, each memory-mapped when first indexed (``OpenedFiles``)."""
        return OpenedFiles(self)

    @property
    def n_vocab(self) -> int | None:
        """The vocabulary meta.json records, if the split comes from a prepared folder."""
        return self.meta["encoding"]["n_vocab"] if self.meta is not None else None

    def check_ids(self, tokens: np.ndarray) -> np.ndarray:
        """``tokens`` as read, unless one lies outside the recorded vocabulary: a file changed after
        it was prepared (a forged header, a rewrite of the same size). O(tokens served)."""
        if self.n_vocab is not None and tokens.size and int(tokens.max()) >= self.n_vocab:
            raise ValueError(f"{self.describe()} holds id {int(tokens.max())}, outside the {self.n_vocab} ids its "
                             f"meta.json records; a token file was changed: python -m tokpack.verify {self.folder}")
        return tokens

    def check_mask(self, values: np.ndarray) -> np.ndarray:
        """A loss mask (this split's values) as read, unless one is other than 0 and 1: a mask file
        changed after it was prepared. O(values served)."""
        if values.size and int(values.max()) > 1:
            raise ValueError(f"{self.describe()} holds the loss-mask value {int(values.max())}, where a mask is 0 or 1; "
                             f"a mask file was changed: python -m tokpack.verify {self.folder}")
        return values

    def index_path(self) -> Path:
        """The document index of the split: meta.json's ``idx``, or the ``.idx`` beside a lone file."""
        if self.folder is not None and self.meta is not None and self.name is not None:
            return self.folder / self.meta["splits"][self.name]["idx"]["file"]
        return self.files[0].path.with_suffix(".idx")

    def describe(self) -> str:
        first = self.files[0].path
        return str(first) if len(self.files) == 1 else f"{len(self.files)} files in {first.parent}"

    def __repr__(self) -> str:
        return f"Split({self.describe()}, {self.dtype}, {int(self.lengths.sum()):,} tokens)"


class OpenedFiles(Sequence[np.ndarray]):
    """A split's files as plain ndarray views (np.memmap's own indexing costs more than a gather),
    each mapped when first indexed, and so fetched then from a remote folder's cache. A split
    larger than its cache keeps one file open: indexing another releases the last (views already
    taken stay readable), and ``version`` counts the releases, so a reader that keeps views derived
    from the arrays knows to drop them. Behind each file opened, the cache fetches the ones after
    it: all the rest where the split fits, else the next."""

    def __init__(self, split: Split):
        self.split, self.version = split, 0
        self._arrays: list[np.ndarray | None] = [None] * len(split.files)
        self._names = [f.path.name for f in split.files]
        self._held: list[str] = []  # the files leased from the split's cache
        self._offsets = np.concatenate([[0], np.cumsum([f.tokens for f in split.files])]).astype(np.int64)

    def __len__(self) -> int:
        return len(self._arrays)

    def span(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of the split, across its files' boundaries."""
        if len(self._arrays) == 1:
            return self[0][start:stop]
        first = int(np.searchsorted(self._offsets, start, side="right")) - 1
        parts = []
        while start < stop:
            local = start - int(self._offsets[first])
            take = min(stop, int(self._offsets[first + 1])) - start
            parts.append(self[first][local:local + take])
            start, first = start + take, first + 1
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0, self.split.dtype)

    def __getitem__(self, i: int) -> np.ndarray:  # type: ignore[override]
        array = self._arrays[i]
        return array if array is not None else self._open(i)

    def _open(self, i: int) -> np.ndarray:
        f, cache = self.split.files[i], self.split.cache
        if cache is None:
            array = np.asarray(f.memmap())
        else:
            if not self.split.fits:
                self.close()
            first = not self._held
            if first:  # a split that fits is held whole from its first file on, and fetched behind it
                self._held = self._names if self.split.fits else [self._names[i]]
                cache.hold(self._held)
            local = cache.path(f.path.name)
            array = np.asarray(np.memmap(local, dtype=f.dtype, mode="r", offset=f.offset, shape=(f.tokens,)))
            if first or not self.split.fits:
                after = self._names[i + 1:] + self._names[:i]
                cache.prefetch(after if self.split.fits else after[:1])
        self._arrays[i] = array
        return array

    def close(self) -> None:
        """Let go of every file opened (a cache may evict them)."""
        if any(array is not None for array in self._arrays):
            self._arrays = [None] * len(self._arrays)
            self.version += 1
        if self._held and self.split.cache is not None:
            held, self._held = self._held, []
            self.split.cache.release(held)

    def __del__(self) -> None:
        if self._held and self.split.cache is not None:
            self.split.cache.release_later(self._held)


class _Folder:
    """What a folder says about the token files in it: its meta.json, read once."""

    def __init__(self, folder: Path, meta: Meta | None = None):
        self.meta = meta if meta is not None else read_meta(folder) if (folder / META_NAME).is_file() else None
        if self.meta is None and any(folder.glob(UNIT_RECORD_GLOB)):
            raise ValueError(f"{folder} is an unfinished tokpack.prepare run (unit records, no meta.json); "
                             "rerun the same python -m tokpack.prepare command to finish it")
        # Each listed file's (tokens, sha256): a flat split's tokens are the split's.
        self.recorded: dict[str, tuple[int, str]] = {}
        for info in (self.meta or {}).get("splits", {}).values():
            for entry in split_files(info):
                self.recorded[entry["file"]] = (entry.get("tokens", info["tokens"]), entry["sha256"])


def open_split(path: str | Path | Sequence[str | Path] | Split, split: str | None = None,
               dtype: str | np.dtype | None = None, *, cache_dir: str | Path | None = None,
               cache_limit: int | None = None, storage_options: dict[str, Any] | None = None) -> Split:
    """The ``Split`` behind ``path``, opened once.

    Args:
        path: a token file, a list of them, a glob, a prepared folder (with ``split``), a folder of
            shards (per ``split`` when it holds several), a prepared folder's URL (read through
            the cache, ``tokpack.storage.cache``), or a ``Split`` already opened.
        split: the split of a folder: ``train``, ``val``, ...
        dtype: the dtype of bare files that say nothing of theirs; one that contradicts an llm.c
            header, meta.json or a Megatron index is refused.
        cache_dir: for a URL, the cache folder (default ``$TOKPACK_CACHE_DIR``, ``~/.cache/tokpack``).
        cache_limit: for a URL, the most bytes the cache holds (default ``$TOKPACK_CACHE_LIMIT``).
        storage_options: for a URL, the store's options, as for remote inputs.
    """
    remote = isinstance(path, str) and is_url(path)
    if not remote and (cache_dir, cache_limit, storage_options) != (None, None, None):
        raise ValueError(f"cache_dir, cache_limit and storage_options apply to a folder's URL, and {path} is local: "
                         "drop them")
    if remote:
        if split is None:
            raise ValueError(f"{redact(path)} is a folder: pass split= (train, val, ...)")
        return _cached(CachedFolder(path, cache_dir, cache_limit, storage_options), split)
    if isinstance(path, Split):
        if split not in (None, path.name) or (dtype is not None and np.dtype(dtype) != path.dtype):
            raise ValueError(f"{path} is already opened as split {path.name!r} of {path.dtype}; "
                             "drop split= and dtype=")
        return path
    paths, folder, name, meta = _locate(path, split)
    return _opened(paths, {} if folder is None else {folder: _Folder(folder, meta)}, dtype, name, folder)


def _opened(paths: list[Path], facts: dict[Path, _Folder], dtype: str | np.dtype | None, name: str | None,
            folder: Path | None) -> Split:
    files = []
    for p in paths:
        if p.parent not in facts:
            facts[p.parent] = _Folder(p.parent)
        files.append(_probe(p, facts[p.parent], dtype))
    widths = {f.dtype: f.path for f in files}
    if len(widths) > 1:
        (a, pa), (b, pb) = list(widths.items())[:2]
        raise ValueError(f"{pa} holds {a} tokens but {pb} holds {b}: one split is read with one width; "
                         "pass the files of one tokenizer (a narrower glob or list)")
    parents = {p.parent for p in paths}
    if folder is None and len(parents) == 1 and facts[paths[0].parent].meta is not None:
        # Files of one prepared folder, named one by one: its meta.json describes them too.
        folder = paths[0].parent
        listed = {n: [folder / f["file"] for f in split_files(i)] for n, i in facts[folder].meta["splits"].items()}
        name = next((n for n, files in listed.items() if files == paths), name)
    meta = facts[folder].meta if folder is not None else None
    mask = _mask(folder, meta, name, files)
    return Split(tuple(files), files[0].dtype, name, folder, meta, _fingerprint(files, mask), mask=mask)


def _mask(folder: Path | None, meta: Meta | None, name: str | None, files: list[TokenFile]) -> Split | None:
    """The loss mask of a prepared split of conversations, one byte a token, a file a token file,
    each checked to be a regular file of its token file's length; None for a split without one."""
    info = meta["splits"][name] if meta is not None and name is not None and name in meta["splits"] else None
    entries = mask_files(info) if folder is not None and info is not None else []
    if not entries:
        return None
    masks = []
    for entry, tokens in zip(entries, files, strict=True):
        path = folder / entry["file"]  # type: ignore[operator]
        try:
            found = path.lstat()
        except FileNotFoundError:
            raise FileNotFoundError(f"{path} is missing: the split's loss mask; rerun python -m tokpack.prepare "
                                    "--force") from None
        if not stat.S_ISREG(found.st_mode) or found.st_size != tokens.tokens:
            raise ValueError(f"{path} is not the plain file of one byte a token of {tokens.path} that meta.json "
                             "records; rerun python -m tokpack.prepare --force")
        identity = (found.st_size, found.st_ino, found.st_mtime_ns)
        masks.append(TokenFile(path, MASK_DTYPE, 0, found.st_size, entry["sha256"], identity))
    return Split(tuple(masks), MASK_DTYPE, name, folder, None, _fingerprint(masks))


def open_splits(folder: str | Path, meta: Meta | None = None) -> dict[str, Split]:
    """Every split of a prepared folder, with meta.json read once.

    Args:
        folder: a folder written by ``python -m tokpack.prepare``, or its URL (``tokpack.storage.cache``).
        meta: its meta.json, if the caller has read it already.
    """
    if isinstance(folder, str) and is_url(folder):
        cached = CachedFolder(folder)
        return {name: _cached(cached, name) for name in cached.meta["splits"]}
    folder = Path(folder)
    facts = _Folder(folder, meta if meta is not None else read_meta(folder))
    assert facts.meta is not None
    return {name: _opened([folder / f["file"] for f in split_files(info)], {folder: facts}, None, name, folder)
            for name, info in facts.meta["splits"].items()}


def _cached(cached: CachedFolder, name: str) -> Split:
    """A remote folder's split, its files listed from meta.json (each is checked against its sha256
    when fetched); its index is fetched now and held by this process."""
    fits = cached.check_split(name)
    meta, info = cached.meta, cached.meta["splits"][name]
    dtype = np.dtype(meta["dtype"])
    offset = token_offset(meta)
    files = tuple(TokenFile(cached.mirror / e["file"], dtype, offset, e.get("tokens", info["tokens"]), e["sha256"],
                            (e["bytes"], 0, 0)) for e in split_files(info))
    cached.hold([info["idx"]["file"]])
    cached.path(info["idx"]["file"])
    mask = None
    if mask_files(info):  # fetched through the cache like a token file, when first read
        masks = tuple(TokenFile(cached.mirror / e["file"], MASK_DTYPE, 0, e["bytes"], e["sha256"], (e["bytes"], 0, 0))
                      for e in mask_files(info))
        mask = Split(masks, MASK_DTYPE, name, cached.mirror, None, _fingerprint(masks), cached, fits)
    return Split(files, dtype, name, cached.mirror, meta, _fingerprint(files, mask), cached, fits, mask)


def _fingerprint(files: Sequence[TokenFile], mask: Split | None = None) -> str:
    every = [*files, *(mask.files if mask is not None else ())]  # a mask changes the targets too
    return hashlib.sha256(json.dumps([[f.path.name, f.identity[0], f.sha256] for f in every]).encode()).hexdigest()


def open_tokens(path: str | Path, dtype: str | np.dtype | None = None) -> np.memmap:
    """Memory-map one token file: a prepared split's, an llm.c shard, a Megatron ``.bin``, or a bare
    file with ``dtype`` (see ``open_split``)."""
    if Path(path).is_dir():
        raise ValueError(f"{path} is a folder; open_tokens maps one file (use open_split for folders)")
    return open_split([path], dtype=dtype).files[0].memmap()


def _locate(path: str | Path | Sequence[str | Path],
            split: str | None) -> tuple[list[Path], Path | None, str | None, dict[str, Any] | None]:
    """The token files ``path`` names, with the prepared folder, split and meta.json they come
    from, if any.

    A folder of llm.c-style shards named ``*_train_*.bin`` / ``*_val_*.bin`` is read per ``split``;
    without ``split`` such a folder is refused with the glob to use, so splits never mix.
    """
    if not isinstance(path, (str, Path)):
        files = [Path(p) for p in path]
        if not files:
            raise ValueError("no token files given; pass a path, a list of paths, a glob or a folder")
        return _unmixed(files, "the list of token files"), None, split, None
    raw, path = str(path), Path(path)
    if not path.exists() and any(ch in raw for ch in "*?["):
        matches = sorted(Path(m) for m in glob.glob(raw) if Path(m).is_file())
        if not matches:
            raise FileNotFoundError(f"glob {raw!r} matches no file; check the pattern")
        return _unmixed(matches, f"glob {raw!r}"), None, split, None
    if not path.is_dir():
        if split is not None:
            raise ValueError(f"split={split!r} applies to folders, but {path} is a file; drop split=")
        return [path], None, None, None
    if (path / META_NAME).is_file():
        meta = read_meta(path)
        splits = meta["splits"]
        if split not in splits:
            raise ValueError(f"{path} is a prepared folder with splits {', '.join(splits)}; "
                             f"pass split= one of them (got {split!r})")
        return [path / f["file"] for f in split_files(splits[split])], path, split, meta
    shards = sorted(p for p in path.glob("*.bin") if p.is_file())
    if not shards:
        raise FileNotFoundError(f"folder {path} holds no .bin files; pass a token file or a shard folder")
    by_split: dict[str, list[Path]] = {}
    for shard in shards:
        by_split.setdefault(_split_of(shard), []).append(shard)
    if split is not None:
        if split not in by_split:
            raise ValueError(f"{path} holds no *_{split}_*.bin shards; splits found: "
                             f"{', '.join(sorted(k for k in by_split if k)) or 'none'}")
        return _unmixed(by_split[split], f"{path} (split={split!r})"), None, split, None
    if len(by_split) > 1:
        named = sorted(k for k in by_split if k)
        raise ValueError(f"{path} holds token files of several splits ({', '.join(named)}); pass "
                         f"split={named[0]!r} or a glob such as '{_family(by_split[named[0]][0])}' "
                         "so they are never mixed")
    return shards, None, None, None


def _split_of(path: Path) -> str:
    named = re.search(r"(?:^|[_.-])(train|val|test)(?=[_.-])", path.name)
    return named.group(1) if named else ""


def _family(path: Path) -> Path:
    """The glob that names ``path`` and its numbered siblings: fineweb_train_000001.bin -> fineweb_train_*.bin."""
    return path.with_name(re.sub(r"\d+", "*", path.name))


def _unmixed(files: list[Path], source: str) -> list[Path]:
    """``files``, unless they hold two splits (llm.c's train and val shards under one ``*.bin``) or
    two sets of one split (llm.c shards beside nanoGPT's train.bin), which no reader should mix."""
    named = [f for f in files if _split_of(f)]
    splits = sorted({_split_of(f) for f in named})
    if len(splits) > 1:
        first = next(f for f in named if _split_of(f) == splits[0])
        raise ValueError(f"{source} names token files of several splits ({', '.join(splits)}); pass a glob of "
                         f"one split, such as '{_family(first)}', so they are never mixed")
    sets = sorted({str(_family(f)) for f in named})
    if len(sets) > 1:
        raise ValueError(f"{source} names two sets of {splits[0]} token files ({sets[0]} and {sets[1]}); "
                         f"pass a glob of one set, such as '{sets[0]}', so they are never mixed")
    return files


class ForeignFormat(NamedTuple):
    """A known non-tokpack format whose header would otherwise be read as tokens."""

    kind: str  # "megatron" or "litdata"
    description: str


def foreign_format(path: Path) -> ForeignFormat | None:
    """The known non-tokpack format ``path`` is in, whose header would otherwise be read as tokens."""
    if megatron.is_index(path.with_suffix(".idx")):
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


def _probe(path: Path, folder: _Folder, dtype: str | np.dtype | None) -> TokenFile:
    """One file's dtype, offset and token count, from the first source that says: its llm.c
    header, the folder's meta.json, a Megatron index beside it, or ``dtype``."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"token file {path} does not exist; run python -m tokpack.prepare first") from None
    recorded = folder.recorded.get(path.name)
    if recorded is not None and path.is_symlink():
        raise ValueError(f"{path} is a link, but a prepared folder's token files are its own; "
                         "rerun python -m tokpack.prepare --force")
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"token file {path} is not a regular file; pass token files")
    size, offset = info.st_size, 0
    header = shard_header(path)
    foreign = None if header or folder.meta is not None else foreign_format(path)
    if header is not None:
        found, count = header
        offset = SHARD_HEADER_BYTES
        expected = SHARD_HEADER_BYTES + found.itemsize * count
        if size != expected:
            raise ValueError(
                f"{path} is {size} bytes but its llm.c header promises {count} {found} tokens "
                f"({expected} bytes); the shard is truncated, re-create it"
            )
        if recorded is not None and (found.name, count) != (folder.meta["dtype"], recorded[0]):
            raise ValueError(f"{path} has an llm.c header for {count} {found} tokens but meta.json records "
                             f"{recorded[0]} {folder.meta['dtype']} tokens; the shard was changed, "
                             "rerun python -m tokpack.prepare --force")
    elif folder.meta is not None:
        found = np.dtype(folder.meta["dtype"])
        if recorded is not None and size != recorded[0] * found.itemsize:
            raise ValueError(f"{path} is {size} bytes but meta.json records {recorded[0]} {found} tokens "
                             f"({recorded[0] * found.itemsize} bytes); the file was changed or truncated, "
                             "rerun python -m tokpack.prepare --force")
    elif foreign and foreign.kind == "megatron":
        found = megatron.token_dtype(path)
        # The .bin holds exactly the documents its .idx declares: no tail is served as tokens.
        megatron.document_starts(path.with_suffix(".idx"), size // found.itemsize, found.itemsize)
    elif foreign:
        raise ValueError(f"{path} is {foreign.description}, not a token file tokpack reads; pass a tokpack, llm.c or "
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
    return TokenFile(path, found, offset, (size - offset) // found.itemsize, recorded[1] if recorded else None,
                     (size, info.st_ino, info.st_mtime_ns))


def read_index(split: Split) -> np.ndarray:
    """The split's document starts (int64), checked to be strictly increasing from 0 inside it: from
    tokpack's ``.idx``, a Megatron ``.idx`` (MMIDIDX) beside a ``.bin``, or, for llm.c shards with
    no index, the token that starts every document in llm.c's own writers (O(tokens) to find)."""
    index = split.index_path()
    n = int(split.lengths.sum())
    if split.meta is None and megatron.is_index(index):
        return megatron.document_starts(index, n, split.dtype.itemsize)
    if split.meta is None and not index.is_file() and all(f.offset == SHARD_HEADER_BYTES for f in split.files):
        return _llmc_document_starts(split)
    if not index.is_file():
        fix = ("rerun python -m tokpack.prepare --force" if split.meta is not None else
               "prepare the corpus with python -m tokpack.prepare, which writes it beside each .bin")
        raise FileNotFoundError(f"{index} is missing: documents need the index of {split.describe()}; {fix}")
    starts = np.fromfile(index, dtype=INDEX_DTYPE).astype(np.int64)
    if len(starts) == 0 or starts[0] != 0 or (np.diff(starts) <= 0).any() or starts[-1] >= n:
        raise ValueError(f"{index} is not a strictly increasing list of document starts inside {split.describe()} "
                         f"({n} tokens); rerun python -m tokpack.prepare --force")
    return starts


def _llmc_document_starts(split: Split) -> np.ndarray:
    """Where llm.c's writers start each document: with GPT-2's <|endoftext|> in version 1 shards,
    llama-3's <|begin_of_text|> in version 7 ones. A split that does not start with it is refused."""
    marker = LLMC_DOCUMENT_START[split.dtype.name]
    found, offset = [], 0
    for tokens in split.open():
        for lo in range(0, len(tokens), 1 << 24):
            found.append(np.flatnonzero(tokens[lo:lo + (1 << 24)] == marker) + offset + lo)
        offset += len(tokens)
    starts = np.concatenate(found).astype(np.int64)
    if len(starts) == 0 or starts[0] != 0:
        raise ValueError(f"{split.describe()} has no .idx and does not start with token {marker}, the document "
                         "start llm.c's writers put first; prepare it with python -m tokpack.prepare --format llmc")
    return starts
