"""Tokenize a text corpus into train.bin / val.bin / meta.json: exact, streaming, parallel.

    python -m tokpack.prepare corpus.txt                # one document: nanoGPT's Shakespeare split
    python -m tokpack.prepare docs/ --out-dir data/web  # many documents: a seeded per-document split
    python -m tokpack.prepare                           # the built-in sample corpus -> data/sample

The tokens of every document are exactly ``encode_ordinary(document)``, whatever the thread
count; pieces are tokenized on all cores and written in input order, so the output is
byte-identical for any ``--workers``. Everything is written to temporary names and renamed when
complete, meta.json last.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import resource
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__, units
from .cluster import Ranks
from .config import add_config_option, build_config, default_of, parser, run_cli
from .corpus import is_jsonl, is_parquet, is_records, is_single_document
from .folder import OutputFolder, check_out_dir, publish_parts, retire
from .format import FORMAT_VERSION, SPLITS
from .inputs import resolve_groups
from .tokenizer import load_encoding, ranks_sha256, token_dtype
from .units import LLMC_SHARD_TOKENS
from .writers import remove_temporaries

EOT_MODES = ("auto", "append", "prepend", "none")
FORMATS = ("flat", "llmc")
SHORT_SPLIT = 256  # a split with fewer tokens is shorter than any useful training or evaluation window
SAMPLE_CORPUS = Path("data/sample-corpus")


@dataclass(frozen=True)
class PrepareConfig:
    """Every option of ``tokpack.prepare``; those that change the output go into meta.json."""

    inputs: tuple[str, ...] = ()
    out_dir: str | None = None
    encoding: str = "gpt2"
    dtype: str = "auto"
    val_fraction: float = 0.1
    seed: int = 1337
    eot: str = "auto"
    doc_sep: str | None = None
    jsonl_key: str = "text"
    text_column: str = "text"
    errors: str = "strict"
    workers: int = 0
    piece_chars: int = 1 << 18
    unit_mb: float = 1024.0
    format: str = "flat"
    shard_tokens: int = 0
    force: bool = False
    quiet: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(map(str, self.inputs)))
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"--val-fraction {self.val_fraction} must lie strictly between 0 and 1; try 0.1")
        if self.eot not in EOT_MODES:
            raise ValueError(f"--eot {self.eot!r} is not one of {', '.join(EOT_MODES)}")
        if self.errors not in ("strict", "replace"):
            raise ValueError(f"--errors {self.errors!r} is not strict or replace")
        if self.workers < 0:
            raise ValueError(f"--workers {self.workers} is negative; use 0 for all cores")
        if self.format not in FORMATS:
            raise ValueError(f"--format {self.format!r} is not one of {', '.join(FORMATS)}")
        if self.shard_tokens < 0:
            raise ValueError(f"--shard-tokens {self.shard_tokens} is negative; use 0 for the default, or N > 0")
        if not self.unit_mb > 0:
            raise ValueError(f"--unit-mb {self.unit_mb} must be positive; try 1024")
        if self.piece_chars < 2:
            raise ValueError(f"piece_chars {self.piece_chars} is too small; use at least 2 (default {1 << 18})")

    def output_options(self) -> dict[str, Any]:
        keys = ("encoding", "dtype", "val_fraction", "seed", "eot", "doc_sep", "jsonl_key", "text_column", "errors",
                "format", "shard_tokens", "unit_mb")
        return {k: getattr(self, k) for k in keys}


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB."""
    # VmHWM starts afresh at exec; ru_maxrss would count the memory of the process that forked us.
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def write_sample_corpus(folder: Path = SAMPLE_CORPUS) -> Path:
    """The built-in sample: the Python documentation topics, one file per topic."""
    from pydoc_data.topics import topics

    folder.mkdir(parents=True, exist_ok=True)
    for name, text in sorted(topics.items()):
        path = folder / f"{name}.txt"
        if not path.is_file() or path.read_text("utf-8") != text:
            path.write_text(text, "utf-8")
    return folder


def _describe_inputs(groups: list[tuple[str, list[Path]]], sizes: dict[Path, int]) -> dict[str, Any]:
    """Each input as given, with its file count and bytes, and a hash of the whole file listing.

    Per-file entries would make meta.json grow with the number of files; the hash still pins them.
    """
    listing = hashlib.sha256()
    for _, found in groups:
        for f in found:
            listing.update(f"{f}\t{sizes[f]}\n".encode("utf-8", "surrogateescape"))
    return {
        "given": [{"path": raw, "files": len(found), "bytes": sum(sizes[f] for f in found)} for raw, found in groups],
        "files": len(sizes),
        "bytes": sum(sizes.values()),
        "listing_sha256": listing.hexdigest(),
    }


def prepare(config: PrepareConfig) -> dict[str, Any]:
    """Run the whole preparation; returns meta.json's content plus a ``stats`` entry."""
    started = time.perf_counter()
    enc = load_encoding(config.encoding)
    dtype = token_dtype(enc, config.dtype)
    groups = resolve_groups(config.inputs or [str(write_sample_corpus())])
    files = [f for _, found in groups for f in found]
    single = is_single_document(files, config.doc_sep)
    if config.doc_sep and all(map(is_records, files)):
        warnings.warn("--doc-sep has no effect: every input is .jsonl or .parquet, whose records are the documents",
                      stacklevel=2)
    for option, of_kind, kind in (("jsonl_key", is_jsonl, ".jsonl"), ("text_column", is_parquet, ".parquet")):
        value = getattr(config, option)
        if value != default_of(PrepareConfig, option) and not any(map(of_kind, files)):
            warnings.warn(f"--{option.replace('_', '-')} {value!r} has no effect: no input is {kind}", stacklevel=2)
    llmc = config.format == "llmc"
    # llm.c's convention is an <|endoftext|> before every document.
    eot = config.eot if config.eot != "auto" else ("prepend" if llmc else "none" if single else "append")
    out = Path(config.out_dir or ("data/sample" if not config.inputs else f"data/{files[0].name.split('.')[0]}"))
    # Fail fast, before the corpus is read; checked again once the folder is locked.
    check_out_dir(out, config.force, files, _input_folders(config),
                  ours=units.recorded_files(out) if out.is_dir() else set())
    sizes = {p: p.stat().st_size for p in files}
    ranks = Ranks()
    try:
        meta, workers = _run(config, enc, dtype, eot, single, files, sizes, groups, out, ranks, started)
    finally:
        ranks.close()
    for split, info in meta["splits"].items():
        if info["tokens"] < SHORT_SPLIT:
            warnings.warn(f"the {split} split holds only {info['tokens']} tokens, shorter than most useful "
                          "windows; raise --val-fraction or add documents", stacklevel=2)
    elapsed = time.perf_counter() - started
    tokens = sum(s["tokens"] for s in meta["splits"].values())
    return {**meta, "stats": {"seconds": elapsed, "tokens_per_s": tokens / elapsed,
                              "peak_rss_mb": peak_rss_mb(), "workers": workers, "out_dir": str(out)}}


def _run(config: PrepareConfig, enc: Any, dtype: np.dtype, eot: str, single: bool, files: list[Path],
         sizes: dict[Path, int], groups: list[tuple[str, list[Path]]], out: Path, ranks: Ranks,
         started: float) -> tuple[dict[str, Any], int]:
    """Tokenize this rank's units; the leader then publishes every unit's files, meta.json last.

    The input is cut into units in input order, so the units' outputs, concatenated, are the one
    process's, byte for byte, for any number of units and ranks. A flat run is one unit written
    straight to train.bin / val.bin. A sharded run (``--shard-tokens``, ``--format llmc`` or
    torchrun) publishes each unit's shards as it finishes, with a record, so a rerun keeps them.
    """
    sharded = config.format == "llmc" or bool(config.shard_tokens) or ranks.world > 1
    count = max(ranks.world, math.ceil(sum(sizes.values()) / (config.unit_mb * 1e6))) if sharded else 1
    inputs = _describe_inputs(groups, sizes)
    expected = units.fingerprint({"options": config.output_options(), "units": count, "eot": eot,
                                  "inputs": inputs["listing_sha256"]})
    workers = config.workers or default_workers()

    def make_ready() -> None:
        check_out_dir(out, config.force, files, _input_folders(config), ours=units.recorded_files(out))
        units.drop_foreign(out, expected)  # a killed run of other options: its shards must not stay
        if sharded:
            # Units publish their shards as they finish: from the first one on, the folder is
            # being rewritten, so an older meta.json and its files must not describe it.
            retire(out, keep=units.recorded_files(out))

    with OutputFolder(out) if ranks.leader else contextlib.nullcontext():
        # Every rank waits until the leader holds the folder and has checked and cleared it.
        ranks.together(make_ready, leader_only=True)
        done: dict[int, dict[str, Any]] = {}

        def work() -> None:
            for unit in ranks.units(count):
                kept = units.load(out, unit, expected) if sharded else None
                done[unit] = kept or units.run_unit(config, enc, dtype, eot, single, files, sizes, out, unit, count,
                                           expected if sharded else None, workers, started)

        try:
            ranks.together(work)
            every = {unit: part for parts in ranks.gather(done) for unit, part in parts.items()}
            parts = [every[unit] for unit in range(count)]
            meta = None
            if ranks.leader:
                meta = {
                    "format_version": FORMAT_VERSION,
                    "tokpack_version": __version__,
                    "encoding": {"name": enc.name, "ranks_sha256": ranks_sha256(enc), "n_vocab": enc.n_vocab,
                                 "eot_id": enc.eot_token},
                    "dtype": dtype.name,
                    "eot": eot,
                    "single_document": single,
                    "text_newlines": "universal",  # \r\n and \r in text files are read as \n; jsonl as is
                    "splits": _combined(parts, config),
                    "inputs": inputs,
                    "options": config.output_options(),
                }
            ranks.together(lambda: publish_parts(out, meta, parts, merge=sharded), leader_only=True)
            meta = ranks.gather(meta)[0]
        except (ValueError, OSError):
            remove_temporaries(out)
            if sharded and ranks.leader:
                units.drop_own(out, expected)  # a killed or terminated run keeps its units instead
            raise
        except BaseException:
            remove_temporaries(out)  # the leader's folder does it too; the other ranks' files are theirs
            raise
    return meta, workers


def _input_folders(config: PrepareConfig) -> list[Path]:
    return [Path(i) for i in config.inputs if Path(i).is_dir()]


def _combined(parts: list[dict[str, Any]], config: PrepareConfig) -> dict[str, Any]:
    """meta.json's splits from every unit's part, in input order (the index comes at publishing)."""
    splits = {}
    for split in SPLITS:
        infos = [part["splits"][split]["info"] for part in parts]
        info = {"tokens": sum(i["tokens"] for i in infos), "documents": sum(i["documents"] for i in infos)}
        if "bin" in infos[0]:
            info["bin"] = infos[0]["bin"]
        else:
            info["shards"] = [shard for i in infos for shard in i["shards"]]
        splits[split] = info
    seen = sum(info["documents"] for info in splits.values())
    if not seen:
        raise ValueError("the corpus holds no text; pass non-empty files")
    for split, info in splits.items():
        if not info["documents"]:
            raise ValueError(
                f"the {split} split would be empty: all {seen} documents hashed to the other "
                f"split with --val-fraction {config.val_fraction}; add documents or change --val-fraction"
            )
    return splits


def summary(result: dict[str, Any]) -> str:
    stats = result["stats"]
    lines = [f"tokpack.prepare -> {stats['out_dir']} ({result['encoding']['name']}, {result['dtype']}, "
             f"{result['options']['format']})"]
    for split, info in result["splits"].items():
        shards = f"  {len(info['shards'])} shards" if "shards" in info else ""
        lines.append(f"  {split:5s} {info['tokens']:>13,} tokens  {info['documents']:>9,} documents{shards}")
    lines.append(f"  {stats['tokens_per_s']:,.0f} tokens/s on {stats['workers']} threads, "
                 f"{stats['seconds']:.2f} s, peak memory {stats['peak_rss_mb']:.0f} MB")
    if result["dtype"] == "uint32" and result["options"]["format"] == "flat":
        lines.append("  note: uint32 tokens; nanoGPT's train.py reads uint16 and would misread them. Readers that "
                     "work: tokpack's TokenWindows, or llm.c's v7 shards via --format llmc")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = parser("prepare", __doc__)
    d = lambda name: default_of(PrepareConfig, name)  # noqa: E731
    p.add_argument("inputs", nargs="*", help="files, folders (recursive) or globs; text, .jsonl, .gz and .zst of "
                   "both, .parquet (default: the built-in sample corpus, the Python docs topics)")
    p.add_argument("--out-dir", help="output folder (default: data/sample for the sample, else data/<first input's stem>)")
    p.add_argument("--encoding", help=f"tiktoken encoding name or .tiktoken file (default: {d('encoding')})")
    p.add_argument("--dtype", choices=["auto", "uint16", "uint32"], help=f"token dtype (default: {d('dtype')}, "
                   "the narrowest that holds every id)")
    p.add_argument("--val-fraction", type=float, help=f"share of documents (or of a lone document's tail) "
                   f"that goes to val (default: {d('val_fraction')})")
    p.add_argument("--seed", type=int, help=f"seed of the per-document split hash (default: {d('seed')})")
    p.add_argument("--eot", choices=EOT_MODES, help=f"where <|endoftext|> goes around each document (default: "
                   f"{d('eot')}: append, prepend with --format llmc, none for a corpus of one document)")
    p.add_argument("--doc-sep", help="cut text files into documents at this string (default: none)")
    p.add_argument("--jsonl-key", help=f"text field of .jsonl records (default: {d('jsonl_key')})")
    p.add_argument("--text-column", help=f"text column of .parquet files (default: {d('text_column')})")
    p.add_argument("--errors", choices=["strict", "replace"], help=f"invalid UTF-8 handling (default: {d('errors')})")
    p.add_argument("--workers", type=int, help="tokenizer threads (default: 0, every core)")
    p.add_argument("--piece-chars", type=int, help=f"characters per tokenized piece (default: {d('piece_chars')})")
    p.add_argument("--format", choices=FORMATS, help=f"flat: train.bin/val.bin, nanoGPT's; llmc: llm.c / "
                   f"modded-nanogpt shards NAME_train_000001.bin, ... (default: {d('format')})")
    p.add_argument("--shard-tokens", type=int, help=f"write each split as shards of at most N tokens (default: "
                   f"{d('shard_tokens')}: llm.c's {LLMC_SHARD_TOKENS} with --format llmc, else one file a split)")
    p.add_argument("--unit-mb", type=float, help=f"input MB per resumable unit of a sharded run: a rerun keeps "
                   f"the units a killed run finished (default: {d('unit_mb')})")
    p.add_argument("--force", action="store_true", default=None,
                   help="overwrite an existing prepared folder or another tool's token files (default: off)")
    p.add_argument("--quiet", action="store_true", default=None, help="no progress bar or summary (default: off)")
    add_config_option(p)
    args = vars(p.parse_args(argv))

    def body() -> int:
        config_path = args.pop("config")
        args["inputs"] = tuple(args["inputs"]) or None
        config = build_config(PrepareConfig, config_path, args)
        result = prepare(config)
        if not config.quiet:
            print(summary(result))
        return 0

    return run_cli(body)


if __name__ == "__main__":
    raise SystemExit(main())
