"""meta.json of a prepare run: every unit's record joined into the splits' counts and files, the
guard's record and reports, the conversations' counts, the inputs and the options.

See docs/format.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

from ...corpus import is_parquet, parquet_row_groups
from ...format import FORMAT_VERSION, GUARD_REPORT, SPLITS, EncodingInfo, FileEntry, Meta, SplitInfo, UnitRecord
from ...version import __version__
from ..guard import Verdicts
from ..plan import Plan
from ..plan.holdout import Holdout
from ..tokenize.chats import CHAT_COUNTS
from ..tokenize.writers import HashingWriter


def meta_of(plan: Plan, parts: list[UnitRecord], verdicts: Verdicts | None) -> Meta:
    """meta.json of a run from every unit's record, in unit order, and the guard's ``verdicts``
    (a guarded run's): its reports are written first, beside it."""
    counts = {key: sum(part["chat"][key] for part in parts) for key in CHAT_COUNTS} if plan.chat is not None else {}
    if counts and not any(part["splits"][split]["info"]["documents"] for part in parts for split in SPLITS):
        raise ValueError(_nothing_trained(counts, plan.config.max_tokens))
    meta: Meta = {
        "format_version": FORMAT_VERSION,
        "tokpack_version": __version__,
        "encoding": cast(EncodingInfo, plan.enc.describe()),
        "dtype": plan.dtype.name,
        "eot": plan.eot,
        "single_document": plan.single,
        "val": plan.holdout.describe(),
        "text_newlines": "universal",  # \r\n and \r in text files are read as \n; jsonl as is
        "splits": _with_row_groups(plan, _combined(parts, plan.holdout, verdicts)),
        "inputs": {**plan.inputs, "units_sha256": [part["input_sha256"] for part in parts]},
        "options": plan.config.output_options(),
    }
    if verdicts is not None:
        meta["guard"] = verdicts.record
        for split in SPLITS:
            meta["splits"][split]["guard"] = _write_report(plan.out / GUARD_REPORT.format(split=split),
                                                           verdicts.report(split))
    if plan.chat is not None:
        meta["chat"] = {**plan.chat.describe(), **counts}
        if plan.mixture is not None:  # a mixture is one unit's: conversations are written flat
            meta["chat"]["mixture"] = parts[0]["chat"]["mixture"]
    return meta


def _write_report(path: Path, rows: Iterable[dict[str, Any]]) -> FileEntry:
    """A split's guard report, one JSON object a line, put in place before meta.json names it with
    its row count."""
    writer = HashingWriter(path)
    count = 0
    try:
        for count, row in enumerate(rows, 1):
            writer.write(json.dumps(row, ensure_ascii=False).encode() + b"\n")
        entry = writer.close()
    except BaseException:
        writer.discard()
        raise
    os.replace(writer.tmp, path)
    entry["rows"] = count
    return entry


def _nothing_trained(counts: dict[str, int], max_tokens: int) -> str:
    """Why no conversation was written: every record bad, or none with a token to train on."""
    if not counts["conversations"]:
        return (f"all {counts['skipped']:,} records are bad and were skipped (--skip-bad): no conversation is left"
                if counts["skipped"] else "the corpus holds no conversation; pass files of chat records")
    why = []
    if counts["cropped"]:
        why.append(f"{counts['cropped']:,} cut to --max-tokens {max_tokens} before their first trained token (raise "
                   "--max-tokens)")
    if counts["conversations"] > counts["cropped"]:
        why.append(f"{counts['conversations'] - counts['cropped']:,} rendered with no token to train on (the chat "
                   "template writes no assistant text, or its {% generation %} blocks are empty)")
    return f"none of the {counts['conversations']:,} conversations has a token to train on: {'; '.join(why)}"


def _with_row_groups(plan: Plan, splits: dict[str, SplitInfo]) -> dict[str, SplitInfo]:
    """Each split that holds whole parquet files (--val-inputs) with their row group sizes, in
    documents, so that readers can share row groups among ranks as nanochat does."""
    if plan.holdout.kind != "inputs":
        return splits
    for split, info in splits.items():
        files = [f for f in plan.files if (f in plan.holdout.files) == (split == "val")]
        if not all(map(is_parquet, files)):
            continue
        groups = [parquet_row_groups(f) for f in files]
        if sum(map(sum, groups)) == info["documents"]:  # every row a document, as the reader makes them
            info["row_groups"] = groups
    return splits


def _combined(parts: list[UnitRecord], rule: Holdout, guard: Verdicts | None) -> dict[str, SplitInfo]:
    """meta.json's splits from every unit's part, in input order (the index comes at publishing);
    a split left empty is refused, naming what emptied it."""
    splits = {}
    for split in SPLITS:
        infos = [part["splits"][split]["info"] for part in parts]
        info: SplitInfo = {"tokens": sum(i["tokens"] for i in infos), "documents": sum(i["documents"] for i in infos)}
        if "bin" in infos[0]:
            info["bin"] = infos[0]["bin"]
            for key in ("megatron_idx", "mask", "supervised"):
                if key in infos[0]:
                    info[key] = infos[0][key]
        else:
            info["shards"] = [shard for i in infos for shard in i["shards"]]
            if "mask_shards" in infos[0]:
                info["mask_shards"] = [mask for i in infos for mask in i["mask_shards"]]
                info["supervised"] = sum(i["supervised"] for i in infos)
        splits[split] = info
    seen = sum(info["documents"] for info in splits.values())
    if not seen:
        raise ValueError("the corpus holds no text; pass non-empty files")
    for split, info in splits.items():
        removed = guard.removed(split) if guard is not None and not info["documents"] else {}
        if removed:
            said = ", ".join(f"{n:,} {'as ' + why if why == 'evaluation' else why}" for why, n in removed.items())
            raise ValueError(f"the {split} split would be empty: the guard removed all {sum(removed.values()):,} of "
                             f"its documents ({said}); drop or loosen the option that removed them (--dedup, "
                             "--decontaminate), or add documents")
        if not info["documents"]:
            option = {"fraction": "--val-fraction", "tokens": "--val-tokens", "inputs": "--val-inputs"}[rule.kind]
            gone = sum(guard.removed("train").values()) + sum(guard.removed("val").values()) if guard else 0
            raise ValueError(f"the {split} split would be empty: all {seen} documents went to the other split with "
                             f"{option} {rule.value}" + (f" (the guard removed {gone:,} others)" if gone else "")
                             + f"; add documents or change {option}")
    return splits
