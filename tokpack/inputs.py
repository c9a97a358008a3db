"""Corpus inputs: paths, folders and globs resolved to the regular files a run reads, each once.

    python -c "from tokpack.inputs import resolve_inputs; print(resolve_inputs(['corpus/']))"
"""

from __future__ import annotations

import os
import stat
import warnings
from collections.abc import Sequence
from pathlib import Path


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


def identity(path: Path) -> tuple[int, int]:
    """What makes two paths one file: its device and inode (links and other spellings agree)."""
    info = path.stat()
    return info.st_dev, info.st_ino


def resolve_inputs(paths: Sequence[str | Path]) -> list[Path]:
    """Files from paths, folders (recursively, sorted) and globs, in the order given, each once."""
    return [f for _, files in resolve_groups(paths) for f in files]
