"""``python -m tokpack.prepare``: tokenize a corpus into a prepared folder (see ``tokpack.prepare``).

    python -m tokpack.prepare corpus.txt                # one document: nanoGPT's Shakespeare split
    python -m tokpack.prepare docs/ --out-dir data/web  # many documents: a seeded per-document split
    python -m tokpack.prepare                           # the built-in sample corpus -> data/sample
    torchrun --nproc-per-node=8 -m tokpack.prepare docs/ --out-dir data/web   # every rank a share

Options may come from ``--config configs/NAME.toml``; the command line overrides the file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..cli import add_config_option, parser, run_cli
from ..config import build_config, default_of
from .config import EOT_MODES, FORMATS, LLMC_SHARD_TOKENS, PrepareConfig
from .run import fix_mmap_threshold, prepare


def summary(result: dict[str, Any]) -> str:
    stats = result["stats"]
    lines = [f"tokpack.prepare -> {stats['out_dir']} ({result['encoding']['name']}, {result['dtype']}, "
             f"{result['options']['format']})"]
    for split, info in result["splits"].items():
        shards = ""
        if "shards" in info:
            # llm.c's loader needs processes x B x T + 1 tokens in every shard it opens.
            smallest = min(s["tokens"] for s in info["shards"])
            shards = (f"  {len(info['shards'])} shards, the smallest {smallest:,} tokens "
                      f"(llm.c: processes x B x T up to {smallest - 1:,})")
        lines.append(f"  {split:5s} {info['tokens']:>13,} tokens  {info['documents']:>9,} documents{shards}")
    lines.append(f"  {stats['tokens_per_s']:,.0f} tokens/s on {stats['workers']} threads, "
                 f"{stats['seconds']:.2f} s, peak memory {stats['peak_rss_mb']:.0f} MB")
    if result["dtype"] == "uint32":
        # llm.c's C loader (and modded-nanogpt's) accept version 1 headers, uint16, only.
        lines.append("  note: uint32 tokens. " + (
            "nanoGPT's train.py reads uint16 and would misread them; tokpack's readers read them, and "
            "--format llmc writes them as llm.c's version 7 shards" if result["options"]["format"] == "flat" else
            "These are llm.c's version 7 shards: tokpack and loaders that accept version 7 read them; llm.c's C "
            "loader and modded-nanogpt read version 1 (uint16) only") + ".")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = parser("prepare", __doc__)
    d = lambda name: default_of(PrepareConfig, name)  # noqa: E731
    p.add_argument("inputs", nargs="*", help="files, folders (recursive) or globs; text, .jsonl, .gz and .zst of "
                   "both, .parquet (default: the built-in sample corpus, the Python docs topics)")
    p.add_argument("--out-dir", help="output folder (default: data/sample for the sample, else data/<first input's stem>)")
    p.add_argument("--encoding", help=f"tiktoken encoding name, NAME.tiktoken file or spec file (.toml/.json) "
                   f"(default: {d('encoding')})")
    p.add_argument("--tokenizer", dest="encoding", help="a Hugging Face tokenizer.json, or its folder (needs "
                   "tokpack[hf]); instead of --encoding")
    p.add_argument("--backend", choices=["auto", "tiktoken", "splintr"], help=f"the BPE implementation: auto uses "
                   f"splintr (tokpack[fast]) where it is proven, else tiktoken (default: {d('backend')})")
    p.add_argument("--check-fraction", type=float, help=f"share of pieces an accelerated backend's ids are checked "
                   f"against tiktoken's (default: {d('check_fraction')})")
    p.add_argument("--eot-token", help="the special token that ends (or, with --eot prepend, starts) each document, "
                   "when a tokenizer.json's config does not name it (default: from the config)")
    p.add_argument("--dtype", choices=["auto", "uint16", "uint32"], help=f"token dtype (default: {d('dtype')}, "
                   "the narrowest that holds every id)")
    p.add_argument("--val-fraction", type=float, help=f"share of documents (or of a lone document's tail) "
                   f"that goes to val (default: {d('val_fraction')})")
    p.add_argument("--val-tokens", type=int, help="a fixed val budget instead: the documents first in hash order "
                   "until they hold at least N tokens, e.g. modded-nanogpt's 10485760 (default: 0, off)")
    p.add_argument("--val-inputs", nargs="+", help="these files, folders or globs are the val split, whole (nanochat's "
                   "last parquet file, llm.c's first shard); the rest is train (default: none)")
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
                   f"modded-nanogpt shards NAME_train_000001.bin, ...; megatron: Megatron-LM's indexed datasets "
                   f"train_text_document.bin/.idx (default: {d('format')})")
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
        args["val_inputs"] = tuple(args["val_inputs"] or ()) or None
        config = build_config(PrepareConfig, config_path, args)
        fix_mmap_threshold()  # this process only prepares: keep its peak flat
        result = prepare(config)
        if not config.quiet and result["stats"]["leader"]:
            print(summary(result))
        return 0

    return run_cli(body)


if __name__ == "__main__":
    raise SystemExit(main())
