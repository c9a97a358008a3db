"""``python -m tokpack.prepare``: tokenize a corpus into a prepared folder (see ``tokpack.prepare``).

    python -m tokpack.prepare corpus.txt                # one document: nanoGPT's Shakespeare split
    python -m tokpack.prepare docs/ --out-dir data/web  # many documents: a seeded per-document split
    python -m tokpack.prepare                           # the built-in sample corpus -> data/sample
    python -m tokpack.prepare docs/ --out-dir data/web --processes 8          # every core, one process each
    torchrun --nproc-per-node=8 -m tokpack.prepare docs/ --out-dir data/web   # every rank a share
    python -m tokpack.prepare docs/ --out-dir data/web --tasks 8 --task 3      # independent tasks

Options may come from ``--config configs/NAME.toml``; the command line overrides the file.
"""

from __future__ import annotations

import os

from collections.abc import Sequence
from typing import Any

from ..cli import add_config_option, parser, run_cli
from ..options import add_options, build_config
from ..tokenizer import load_encoding
from .config import GuardOptions, LaunchOptions, PrepareConfig
from .memory import fix_mmap_threshold
from .run import prepare


def _guarded(record: dict[str, Any] | None) -> str:
    """What the guard did, from meta.json's record: clusters and moves, and what it removed, why."""
    if record is None:
        return "off (one document, or --no-near-split): val is not checked for near-copies of train documents"
    said = []
    near = record.get("near", {})
    if near:
        said.append(f"{near['clusters']:,} cluster{'' if near['clusters'] == 1 else 's'} of near-copies "
                    f"(Jaccard >= {near['threshold']:g})")
    if near.get("split"):
        said.append(f"{near['removed_from_train']:,} train near-copies of val removed" if "removed_from_train" in near
                    else f"{near['moved_to_val']:,} documents moved to val, {near['moved_to_train']:,} to train")
    if "dedup" in record:
        said.append(f"{sum(record['dedup']['removed']):,} duplicates removed ({record['dedup']['mode']})")
    if "decontaminate" in record:
        found = record["decontaminate"]
        said.append(f"{found.get('found', 0):,} train documents hold evaluation {found['ngram']}-grams (kept)"
                    if found["report_only"] else
                    f"{found['removed']:,} train documents removed for evaluation {found['ngram']}-grams")
    return "; ".join(said)


def summary(result: dict[str, Any]) -> str:
    stats = result["stats"]
    if "splits" not in result:  # an independent task, with units of other tasks still to do
        return (f"tokpack.prepare -> {stats['out_dir']}: task {stats['task']} of {stats['tasks']} done, "
                f"{stats['units_done']} of {stats['units']} units recorded; meta.json is written when the last "
                "one is (or with --finalize)")
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
    lines.append(f"  guard {_guarded(result.get('guard'))}")
    on = f"{stats['processes']} processes" if stats["processes"] > 1 else f"{stats['workers']} threads"
    memory = f"peak memory {stats['peak_rss_mb']:.0f} MB"
    if "task_peak_rss_mb" in stats:
        memory += f" here, {stats['task_peak_rss_mb']:.0f} MB the largest task"
    lines.append(f"  {stats['tokens_per_s']:,.0f} tokens/s on {on}, {stats['seconds']:.2f} s, {memory}")
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
    p.add_argument("inputs", nargs="*", help=PrepareConfig.__dataclass_fields__["inputs"].metadata["help"])
    add_options(p, PrepareConfig, skip=("inputs", "guard", "launch"))
    add_options(p, GuardOptions)
    add_options(p, LaunchOptions)
    p.add_argument("--tokenizer", help="a Hugging Face tokenizer.json, or its folder (needs tokpack[hf]); "
                   "instead of --encoding")
    add_config_option(p)
    args = vars(p.parse_args(argv))

    def body() -> int:
        config_path, tokenizer = args.pop("config"), args.pop("tokenizer")
        if tokenizer is not None:
            if args["encoding"] is not None:
                raise ValueError(f"--tokenizer {tokenizer} and --encoding {args['encoding']} each name the "
                                 "tokenizer; pass one of them")
            args["encoding"] = tokenizer
        args["inputs"] = tuple(args["inputs"]) or None
        config = build_config(PrepareConfig, config_path, args)
        if tokenizer is not None and load_encoding(config.encoding, config.eot_token,
                                                   config.special_text).kind != "huggingface":
            raise ValueError(f"--tokenizer {tokenizer} is not a Hugging Face tokenizer.json (nor a folder holding "
                             "one); pass a tiktoken encoding or spec file with --encoding")
        fix_mmap_threshold()  # this process only prepares: keep its peak flat
        # pyarrow's default pool (mimalloc) keeps the row groups it freed, which raised the peak on
        # parquet by a fifth. Read when pyarrow is first imported; a choice of the user's stands.
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
        result = prepare(config)
        if not config.quiet and result["stats"]["leader"]:
            print(summary(result))
        return 0

    return run_cli(body)


if __name__ == "__main__":
    raise SystemExit(main())
