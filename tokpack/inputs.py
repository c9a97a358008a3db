"""Corpus inputs: paths, folders, globs and URLs resolved to the files a run reads, each once.

    python -c "from tokpack.inputs import resolve_inputs; print(resolve_inputs(['corpus/']))"

Local files come as ``LocalFile`` and remote objects as ``RemoteFile`` (``tokpack.storage``):
both are ``InputFile``s, which is all a run asks of an input.

See docs/prepare.md.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .storage import InputFile, LocalFile, expand, is_url


def _walk(folder: Path) -> list[LocalFile]:
    """Files below ``folder``, sorted by their parts, hidden ones skipped; directory links are never
    followed, and a folder that cannot be listed is passed over (as ``os.walk`` does). Each file
    keeps the stat its listing took, and its folder's path is parsed once, not once a file."""
    found: list[LocalFile] = []
    # Folders still being read, each with its entries left, by name: depth first in that order
    # lists every file in the order of its path's parts.
    stack = [(LocalFile(folder), iter(_entries(folder)))]
    while stack:
        parent, entries = stack[-1]
        for entry in entries:
            if _is_dir(entry):
                if not entry.is_symlink():
                    stack.append((parent / entry.name, iter(_entries(entry.path))))
                    break
            else:
                found.append(LocalFile.listed(parent, entry))
        else:
            stack.pop()
    return found


def _entries(folder: str | Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as listing:
            return sorted((e for e in listing if not e.name.startswith(".")), key=lambda e: e.name)
    except OSError:
        return []


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # a link to a folder counts as one (and is not descended into)
    except OSError:
        return False


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


def resolve_groups(paths: Sequence[str | Path],
                   storage_options: dict[str, Any] | None = None) -> list[tuple[str, list[InputFile]]]:
    """Each path as given with its files: a file, a folder (recursive, sorted), a glob, or a URL
    (an object, a prefix or a glob of a remote store, expanded there the same way).

    An existing path is taken literally before it is read as a glob (``data[1].txt``). Only
    regular files are read: others found in folders or globs (FIFOs, sockets, devices) are skipped
    with a warning, and refused when named directly. A file reached twice is read once.
    """
    if not paths:
        raise ValueError("no corpus given; pass files, folders or globs")
    groups: list[tuple[str, list[InputFile]]] = []
    seen: set[tuple[Any, ...]] = set()
    for raw in map(str, paths):
        path = Path(raw)
        if is_url(raw):
            remote: list[InputFile] = list(expand(raw, storage_options or {}))
            groups.append((raw, _once(remote, seen)))
            continue
        if path.is_dir():
            found = _walk(path)
            if not found:
                raise ValueError(f"folder {raw} holds no readable files; put .txt/.jsonl files in it")
        elif path.exists():
            found = [LocalFile(path)]
            if not found[0].is_regular():
                raise ValueError(f"corpus path {raw} is not a regular file (a pipe, socket or device); "
                                 "pass files, folders or globs of regular files")
        elif any(ch in raw for ch in "*?["):
            found = [LocalFile(p) for p in _glob(raw)]
            if not found:
                raise FileNotFoundError(f"glob {raw!r} matches no file; check the pattern and quote it")
        else:
            raise FileNotFoundError(f"corpus path {raw} does not exist; pass a file, a folder or a glob")
        regular: list[InputFile] = []
        for f in found:
            if not f.is_regular():
                warnings.warn(f"skipping {f}: not a regular file", stacklevel=2)
                continue
            regular.append(f)
        groups.append((raw, _once(regular, seen)))
    if not any(files for _, files in groups):
        raise ValueError(f"the inputs ({', '.join(map(str, paths))}) hold no regular files; pass text files")
    return groups


def _once(found: list[InputFile], seen: set[tuple[Any, ...]]) -> list[InputFile]:
    """``found`` without the files already ``seen`` (by identity), each skipped with a warning."""
    files = []
    for f in found:
        key = f.identity()
        if key in seen:
            warnings.warn(f"{f} is reached twice; it is read once", stacklevel=3)
            continue
        seen.add(key)
        files.append(f)
    return files


def resolve_inputs(paths: Sequence[str | Path], storage_options: dict[str, Any] | None = None) -> list[InputFile]:
    """Files from paths, folders (recursively, sorted), globs and URLs, in the order given, each once."""
    return [f for _, files in resolve_groups(paths, storage_options) for f in files]
