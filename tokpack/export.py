"""Hand a prepared folder to another trainer in the layout it reads.

    python -m tokpack.export olmo data/sample     # data/sample/olmo/train.npy + train.csv.gz, ...

``olmo``: OLMo-core reads raw token arrays named ``*.npy`` and, for document boundaries, a
``.csv.gz`` beside each with one ``start,end`` line per document (token offsets within that file).
Each token file of the folder becomes ``olmo/<name>.npy`` (a hard link to it, no extra disk; a copy
where the file system has no hard links or the file has llm.c's header) and ``olmo/<name>.csv.gz``
from the folder's document index: the boundaries exactly as prepared, whatever the end-of-text
layout (``--eot prepend`` included, where scanning for the end-of-text id would be wrong). A
document cut across two shards is a document in each, as OLMo-core sees each file alone. The
command prints the dataset arguments to use, and how each of OLMo-core's dataset classes reads
the boundaries (an argument, an environment variable, or not at all). Cost: O(documents) (the
index read, the offsets written); a copy adds O(tokens). Rerun it after a new prepare of the
folder: the links keep the files they were made from.

See docs/clients.md.
"""

from __future__ import annotations

import gzip
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .cli import parser, run_cli
from .format import Meta, read_meta
from .storage.local import open_new, replacing, tmp_path
from .split import Split, open_splits, read_index

TARGETS = ("olmo",)
OLMO_FOLDER = "olmo"
COPY_BYTES = 1 << 22
LINES = 1 << 16  # offsets written at a time: memory stays flat


def _publish_tokens(source: Path, offset: int, target: Path) -> None:
    """``target`` holds the tokens of ``source`` after its ``offset`` header bytes, published by rename."""
    tmp = tmp_path(target)
    try:
        if offset == 0:
            try:
                os.link(source, tmp, follow_symlinks=False)
                os.replace(tmp, target)
                return
            except OSError:
                pass  # no hard links here (another file system, or none supported): copy
        with open(source, "rb") as src, open_new(tmp) as out:
            src.seek(offset)
            shutil.copyfileobj(src, out, COPY_BYTES)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _publish_offsets(bounds: np.ndarray, target: Path) -> None:
    """``bounds`` (starts, then the file's end) as OLMo-core's ``start,end`` lines, gzip'd without a
    timestamp or name, so the same folder always exports the same bytes."""
    with replacing(target) as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as out:
        for lo in range(0, len(bounds) - 1, LINES):
            hi = min(lo + LINES, len(bounds) - 1)
            out.write("".join(f"{s},{e}\n" for s, e in zip(bounds[lo:hi].tolist(),
                                                            bounds[lo + 1:hi + 1].tolist())).encode())


def file_documents(split: Split) -> list[np.ndarray]:
    """For each token file of ``split``, its document bounds within it: the starts of the documents
    that begin in it (0 first, where the file begins inside a document), then its token count."""
    starts, out, at = read_index(split), [], 0
    for length in split.lengths.tolist():
        local = starts[(starts >= at) & (starts < at + length)] - at
        if not len(local) or local[0] != 0:
            local = np.concatenate([[0], local])
        out.append(np.append(local, length).astype(np.int64))
        at += length
    return out


def export_olmo(folder: str | Path) -> tuple[Meta, dict[str, list[Path]]]:
    """Write ``FOLDER/olmo/``: each token file as ``.npy`` with its ``.csv.gz`` of document offsets;
    returns the folder's meta.json and the ``.npy`` paths of each split."""
    folder = Path(folder)
    meta = read_meta(folder)
    splits = open_splits(folder, meta)
    out = folder / OLMO_FOLDER
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ValueError(f"{out} is not a folder of its own (a link or a file); remove it and rerun the export")
    out.mkdir(exist_ok=True)
    written: dict[str, list[Path]] = {}
    for name, split in splits.items():
        for file, bounds in zip(split.files, file_documents(split)):
            target = out / (file.path.stem + ".npy")
            _publish_tokens(file.path, file.offset, target)
            _publish_offsets(bounds, target.with_suffix(".csv.gz"))
            written.setdefault(name, []).append(target)
    return meta, written


def olmo_arguments(meta: Meta, paths: list[Path]) -> str:
    """What to give OLMo-core's numpy datasets for ``paths``, exported files of the folder of ``meta``,
    and how each dataset class then finds the documents: only ``NumpyPackedFSLDataset`` takes
    ``use_array_if_local`` (the others raise TypeError on it), the padded ones read the .csv.gz
    only with ``OLMO_DATA_PREP_USE_ARRAY_IF_LOCAL=false`` in the environment, and the rest split at
    ``eos_token_id``, which is right only for a folder whose documents each end with it."""
    eot = meta["encoding"]["eot_id"]
    by_eos = ("right for this folder (--eot append: each document ends with it)" if meta["eot"] == "append" else
              f"wrong for this folder (--eot {meta['eot']}): use a dataset above")
    return "\n".join([
        f"paths={[str(p) for p in paths]}, dtype=numpy.{meta['dtype']}, eos_token_id={eot}, pad_token_id={eot}, "
        f"vocab_size={meta['encoding']['n_vocab']}",
        "  NumpyPackedFSLDataset: add use_array_if_local=False (documents from the .csv.gz)",
        "  NumpyPaddedFSLDataset, NumpyInterleavedFSLDataset, NumpyFSLDatasetMixture: run with "
        "OLMO_DATA_PREP_USE_ARRAY_IF_LOCAL=false in the environment (they take no use_array_if_local, and "
        "without it find documents from eos_token_id)",
        f"  NumpyFSLDataset (doc_lens), NumpyVSLDataset: documents found from eos_token_id, {by_eos}"])


def main(argv: Sequence[str] | None = None) -> int:
    p = parser("export", __doc__)
    p.add_argument("target", choices=TARGETS, help="the trainer whose layout to write")
    p.add_argument("folder", help="a folder written by python -m tokpack.prepare")
    args = p.parse_args(argv)

    def body() -> int:
        meta, paths = export_olmo(args.folder)
        print(f"tokpack.export: wrote {sum(map(len, paths.values()))} token files with their document offsets "
              f"into {Path(args.folder) / OLMO_FOLDER}")
        for name, files in paths.items():
            print(f"{name}: {olmo_arguments(meta, files)}")
        return 0

    return run_cli(body)


if __name__ == "__main__":
    raise SystemExit(main())
