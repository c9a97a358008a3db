"""The unit ledger of a prepare run: in a sharded run each finished unit leaves a record, and a
rerun keeps it.

    python -m tokpack.prepare big/ --shard-tokens 100000000 --out-dir D    # killed at 90 %
    python -m tokpack.prepare big/ --shard-tokens 100000000 --out-dir D    # redoes the last 10 %

A unit is a consecutive byte range of the input (``--unit-mb``). When its shards are written it
first writes ``.tokpack-unit-NNNNN.json`` (a fingerprint of the inputs and every option that
changes the output, the sha256 of the unit's input bytes, and the size and sha256 of each file),
then renames its shards to their final names and keeps its document index as a hidden part: a
kill between the two leaves a record whose files do not verify, never a final name that no
record claims. A rerun keeps every unit whose record has the same fingerprint, whose input
hashes the same (a read, no tokenizing) and whose files still have those sizes and hashes;
records of other inputs or options are dropped, with their files, in one warning, and a record
that cannot be read takes only its own unit with it. The records go once meta.json is written.
Every name a record gives is checked against the names a unit writes before it is used.

See docs/cluster.md.
"""

from __future__ import annotations

import os
import re
import stat
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, cast

from ...format import (MASK_SHARD_NAME, SHARD_HEADER_BYTES, SHARD_NAME, UNIT_INDEX_GLOB, UNIT_INDEX_NAME, UNIT_RECORD,
                       UNIT_RECORD_GLOB, UNIT_RECORD_NAME, UnitPart, UnitRecord, load_json)
from ...storage.local import LocalFolder, read_own, remove_own, write_json_atomic
from ...verify import VerifyError, check_index, check_mask, check_tokens
from ..guard import signatures
from ..guard.placement import Placement
from ..plan import Plan
from ..plan.input_hash import input_sha256
from ..tokenize.chats import CHAT_COUNTS


# The names a unit writes: its shards (NAME_train_00003_000000.bin, train_000000.bin, ...) and its
# hidden index part. A record is data on disk and may be forged: any other name in it is refused.
_UNIT_FILE = re.compile(rf"{SHARD_NAME}|{MASK_SHARD_NAME}|{UNIT_INDEX_NAME.pattern}")


def record_files(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The files a record names, each checked to be a plain name of a unit's pattern."""
    entries = [f for part in record["splits"].values()
               for f in (*part["info"]["shards"], *part["info"].get("mask_shards", []), part["idx"])]
    for entry in entries:
        name = entry["file"]
        if not isinstance(name, str) or not _UNIT_FILE.fullmatch(name):
            raise ValueError(f"a unit record names {name!r}, which is not a file a unit writes")
    return entries


def load(plan: Plan, unit: int, placement: Placement | None, proven: bool = False) -> UnitRecord | None:
    """The record of ``unit`` if it belongs to this run (written by the guard's ``placement``, in a
    guarded run), its input is unchanged and its files are intact, else None. ``proven``: a task
    of this run wrote or checked the unit just now, under the folder's lock, so its input and
    files are not read again, only named and sized."""
    try:
        record = this_run(plan, unit, read_own(plan.out / UNIT_RECORD.format(unit)), str(plan.out), placement,
                          proven)
        if record is not None and proven:
            for entry in record_files(record):
                found = os.lstat(plan.out / entry["file"])  # a link is no unit's file
                if not stat.S_ISREG(found.st_mode) or found.st_size != entry["bytes"]:
                    return None
        elif record is not None:
            _check_files(plan, record)
    except (OSError, ValueError, VerifyError):
        return None
    return record


def every(found: list[UnitRecord | None]) -> tuple[list[UnitRecord], list[int]]:
    """The records of every unit of a run (``found``, in unit order, None where one is missing):
    those found, and the units missing."""
    return [record for record in found if record is not None], [u for u, record in enumerate(found) if record is None]


def this_run(plan: Plan, unit: int, raw: bytes | None, where: str, placement: Placement | None,
             proven: bool = False) -> UnitRecord | None:
    """The record ``raw`` of ``unit`` (kept in ``where``) if it is this run's, names only a unit's
    files and was made from the input as it is now (``proven``: not read again; else None, with a
    warning if the input changed): what a rerun keeps, once the files it names are found as
    recorded."""
    try:
        record = load_json(raw or b"null", where, "it is redone")
        if not isinstance(record, dict) or record.get("fingerprint") != plan.fingerprint or record.get("unit") != unit:
            return None
        if record.get("verdicts") != (placement.placed[unit] if placement is not None else None):
            return None  # its documents were placed otherwise: an input changed since
        record_files(record)
        recorded = record["input_sha256"]
        counts = record.get("chat")
        if (plan.chat is not None) != isinstance(counts, dict) or (counts is not None and not all(
                type(counts.get(key)) is int and counts[key] >= 0 for key in CHAT_COUNTS)):
            return None
        if plan.mixture is not None and plan.sharded and not _sources_fit(record, len(plan.mixture.names)):
            return None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not proven and recorded != input_sha256(plan.share(unit)):
        warnings.warn(f"the input of unit {unit} changed since it was recorded in {where}; it is redone",
                      stacklevel=3)
        return None
    return cast(UnitRecord, record)  # checked above, field by field


def _sources_fit(record: dict[str, Any], inputs: int) -> bool:
    """Whether a --processes mixture unit's record gives each conversation of each split its input:
    [input, conversations] runs, as many as the split holds."""
    sources = record["chat"].get("sources")

    def run(found: Any) -> bool:
        return isinstance(found, list) and len(found) == 2 and all(type(n) is int for n in found) \
            and 0 <= found[0] < inputs and found[1] > 0

    return isinstance(sources, dict) and sources.keys() == record["splits"].keys() and all(
        isinstance(found, list) and all(map(run, found))
        and sum(n for _, n in found) == record["splits"][split]["info"]["documents"] for split, found in sources.items())


def _check_files(plan: Plan, record: UnitRecord) -> None:
    """A kept unit's files as verify checks a folder's: each size and sha256 as recorded, every id
    below n_vocab, and its index part a strictly increasing list of its documents' starts, so a
    broken unit is redone here rather than failing the whole run when it is published."""
    folder = LocalFolder(plan.out)
    record_files(record)  # every name of a unit's own pattern
    offset = SHARD_HEADER_BYTES if plan.config.format == "llmc" else 0
    for part in record["splits"].values():
        for entry in part["info"]["shards"]:
            check_tokens(folder, entry, plan.dtype, offset, plan.enc.n_vocab)
        if (plan.chat is not None) != ("mask_shards" in part["info"]):
            raise VerifyError(f"unit {record['unit']} {'lacks' if plan.chat else 'has'} masks")
        if plan.chat is not None:
            masks, shards = part["info"]["mask_shards"], part["info"]["shards"]
            if len(masks) != len(shards) or any(m["bytes"] != s["tokens"] for m, s in zip(masks, shards)) or \
                    sum(check_mask(folder, entry) for entry in masks) != part["info"]["supervised"]:
                raise VerifyError(f"unit {record['unit']}'s masks are not one byte a token of its shards, as "
                                  "recorded")
        check_index(folder, part["idx"], part["info"]["documents"], part["info"]["tokens"], f"unit {record['unit']}")


def keep(plan: Plan, record: UnitRecord) -> UnitRecord:
    """A sharded run's finished unit published: its record first, then its files renamed from
    their temporary names, so a run killed between the two leaves a record whose files do not
    verify (the unit is redone) and no final name that no record claims. The record as kept."""
    splits: dict[str, UnitPart] = {split: {"info": part["info"], "idx": part["idx"]}
                                   for split, part in record["splits"].items()}
    kept: UnitRecord = {**record, "splits": splits}
    write_json_atomic(plan.out / UNIT_RECORD.format(record["unit"]), kept)
    for part in record["splits"].values():  # its shards, index part and masks
        for tmp, final in part.get("renames", []):
            os.replace(tmp, final)
    return kept


_READ_ERRORS = (OSError, ValueError, KeyError, TypeError, AttributeError)


def _records(out: Path) -> list[tuple[Path, dict[str, Any] | None, list[str]]]:
    """Every unit record in ``out``: (path, the record or None when it cannot be read or names a
    file no unit writes, the files it claims). A broken record claims its unit's files by name."""
    found = []
    for path in sorted(out.glob(UNIT_RECORD_GLOB)):
        named = UNIT_RECORD_NAME.fullmatch(path.name)
        if not named:
            continue
        try:
            record = load_json(read_own(path), str(path), "it is redone")
            names = [entry["file"] for entry in record_files(record)]
            if not isinstance(record.get("fingerprint"), str):
                raise ValueError("no fingerprint")
        except _READ_ERRORS:
            record, names = None, _claimed(out, int(named.group(1)))
        found.append((path, record, names))
    return found


def _claimed(out: Path, unit: int) -> list[str]:
    """The files that unit ``unit`` writes, found by their names: its tag (unit 0 of a one-unit
    run has none)."""
    shard = rf"(?:train|val)_{unit:05d}_\d{{6}}\.bin" + (r"|(?:train|val)_\d{6}\.bin" if unit == 0 else "")
    own = re.compile(rf"(?:.*_)?(?:{shard})|\.(?:train|val)\.idx\.u{unit:05d}")
    return sorted(p.name for p in out.iterdir() if _UNIT_FILE.fullmatch(p.name) and own.fullmatch(p.name))


def numbered(out: Path) -> set[int]:
    """The units whose records stand in ``out``, from their names alone (none is read)."""
    return numbered_in(os.listdir(out))


def numbered_in(names: Iterable[str]) -> set[int]:
    """The units whose records are among ``names`` (a folder's listing, local or remote)."""
    return {int(m.group(1)) for m in map(UNIT_RECORD_NAME.fullmatch, names) if m}


def recorded_files(out: Path) -> set[str]:
    """Every file that unit records in ``out`` claim (tokpack's own, whatever their fingerprint)."""
    return {name for _, _, names in _records(out) for name in names}


def recorded(out: Path, expected: str) -> set[int]:
    """The units that have a record of this run (not yet checked as ``load`` checks them), from one
    listing: O(records), whatever the count of units."""
    return {record["unit"] for _, record, _ in _records(out) if record is not None
            and record["fingerprint"] == expected and type(record.get("unit")) is int}


def all_recorded(out: Path, expected: str, count: int) -> bool:
    """Whether every one of ``count`` units has a record of this run: a listing of names, and the
    records read only once there are as many as units (every task asks when it ends)."""
    return len(list(out.glob(UNIT_RECORD_GLOB))) >= count and recorded(out, expected) >= set(range(count))


def foreign(out: Path, expected: str) -> list[Path]:
    """The records in ``out`` of a run with other inputs or options."""
    return [path for path, record, _ in _records(out) if record is not None and record["fingerprint"] != expected]


def drop_foreign(out: Path, expected: str) -> None:
    """Remove the records of other inputs or options, and their files, with one warning; a record
    that cannot be read goes with its unit's files, and only that unit is redone."""
    records = _records(out)
    broken = [(path, names) for path, record, names in records if record is None]
    foreign = [(path, names) for path, record, names in records if record is not None
               and record["fingerprint"] != expected]
    if broken:
        warnings.warn(f"unit record{'s' * (len(broken) > 1)} {', '.join(p.name for p, _ in broken)} in {out} "
                      "cannot be read; those units are redone and the others kept", stacklevel=3)
    if foreign:
        warnings.warn(f"{len(foreign)} unit records in {out} come from a run with other inputs or options; "
                      "that run's work is dropped and this one starts over", stacklevel=3)
    _remove(out, broken + foreign)


def drop_own(out: Path, expected: str) -> None:
    """Remove this run's records and their files, and the units' signatures: after a user error
    nothing is left behind (the fix changes the inputs, and so the fingerprint, anyway)."""
    _remove(out, [(path, names) for path, record, names in _records(out)
                  if record is not None and record["fingerprint"] == expected])
    signatures.clear(out)


def _remove(out: Path, records: list[tuple[Path, list[str]]]) -> None:
    for path, names in records:
        for name in names:
            remove_own(out / name)
        remove_own(path)


def clear(out: Path) -> None:
    """The records, index parts and signatures of a folder whose meta.json now stands."""
    for path in [*out.glob(UNIT_RECORD_GLOB), *out.glob(UNIT_INDEX_GLOB)]:
        remove_own(path)
    signatures.clear(out)


