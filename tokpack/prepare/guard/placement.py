"""Where a guarded run sends each document it moves or drops: the part of the guard's verdicts a
unit needs to be written, decided once for the run and kept beside the signatures.

    .tokpack-sign-placed.bin    each moved or dropped document's number in the run (int64), then
                                its verdict (uint8), in number order
    .tokpack-sign-placed.json   the record, written last: the run's fingerprint, the signatures it
                                was decided from, each read's first number, each unit's input
                                sha256 and digest of its verdicts, the file's size and sha256

One task decides (a claim on ``.tokpack-sign-placed.lock``); every other task, and a rerun, reads
the file instead of reading every unit's signatures: O(moved documents + reads) a task, where
deciding is O(documents). On Ray with a URL ``--out-dir`` (workers that share no disk) the run's
own process decides it and each task fetches it.
"""

from __future__ import annotations

import enum
import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from ...format import PLACED, SIGN, load_json
from ...storage.local import read_own, remove_own, replacing, write_json_atomic


class Verdict(enum.IntEnum):
    """What happens to a document other than its own split: moved to val or train, or dropped."""

    VAL = 1
    TRAIN = 2
    DROP = 3


class InputChanged(ValueError):
    """A unit's input is not what its documents were signed from (edited since it was signed)."""

    def __init__(self, unit: int):
        super().__init__(f"the input of unit {unit} changed while the run read it (its documents were signed from "
                         "other bytes); run the same command again")
        self.unit = unit


class Placement:
    """Each read's documents' verdicts, looked up by (read, number in the read), and what a unit
    record holds of them.

    Args:
        starts: each read's first document number in the run.
        numbers: the moved or dropped documents' numbers, ascending.
        verdicts: their ``Verdict``s.
        inputs: each unit's input sha256, as it was signed.
        placed: each unit's digest of its documents' verdicts (a unit written under others is redone).
        out: the folder the signatures are in.
    """

    def __init__(self, starts: list[int], numbers: np.ndarray, verdicts: np.ndarray, inputs: list[str],
                 placed: list[str], out: Path):
        self.numbers, self.verdicts, self.inputs, self.placed, self.out = numbers, verdicts, inputs, placed, out
        self._starts = starts
        self._gap = (0, -1)  # numbers known to hold no verdict: [lo, hi)

    def split(self, read: int, doc: int, own: str) -> str | None:
        """The split document ``doc`` of the run's read ``read`` goes to (``own``: its own), or
        None: dropped."""
        verdict = self.verdict(read, doc)
        return own if verdict is None else None if verdict == Verdict.DROP else verdict.name.lower()

    def verdict(self, read: int, doc: int) -> Verdict | None:
        """The verdict of document ``doc`` of read ``read``, or None (it stays in its own split).
        Documents come in order and few have a verdict: the gap between the verdicts around the
        last document looked up answers most in two comparisons, where a search a document cost a
        tenth of a prepare."""
        number = self._starts[read] + doc
        lo, hi = self._gap
        if lo <= number < hi:
            return None
        numbers = self.numbers
        at = int(np.searchsorted(numbers, number))
        found = at < len(numbers) and int(numbers[at]) == number
        after = at + 1 if found else at
        self._gap = (number + 1 if found else int(numbers[at - 1]) + 1 if at else 0,
                     int(numbers[after]) if after < len(numbers) else 1 << 62)
        return Verdict(int(self.verdicts[at])) if found else None

    def check_input(self, unit: int, digest: str) -> None:
        """Refuse a unit whose input is not what its documents were signed from; its signatures'
        record and this placement go, so that the next run signs it again."""
        if digest != self.inputs[unit]:
            remove_own(self.out / SIGN.format(unit, "json"))
            forget(self.out)
            raise InputChanged(unit)

    def save(self, fingerprint: str, signed: str) -> None:
        """Kept in ``out`` for the run's other tasks, decided from the signatures ``signed``
        (their digest), unless it is kept there, intact, already."""
        kept = _load(self.out, fingerprint, len(self.inputs), len(self._starts))
        if kept is not None and kept[1] == signed:
            return
        raw = self.numbers.astype("<i8").tobytes() + self.verdicts.astype(np.uint8).tobytes()
        forget(self.out)  # the record goes first: a file without its record is never read
        with replacing(self.out / PLACED.format("bin")) as f:
            f.write(raw)
        write_json_atomic(self.out / PLACED.format("json"), {
            "fingerprint": fingerprint, "signed": signed, "moved": len(self.numbers), "starts": self._starts,
            "inputs": self.inputs, "placed": self.placed, "sha256": hashlib.sha256(raw).hexdigest()}, durable=False)


def signed(out: Path, fingerprint: str, units: int, reads: int) -> str | None:
    """The digest of the signatures the placement kept in ``out`` was decided from, if it is this
    run's and intact."""
    kept = _load(out, fingerprint, units, reads)
    return kept[1] if kept is not None else None


def load(out: Path, fingerprint: str, units: int, reads: int) -> Placement | None:
    """The placement kept in ``out`` if it is this run's (``units`` units, ``reads`` reads) and
    its file is as recorded, else None."""
    kept = _load(out, fingerprint, units, reads)
    return kept[0] if kept is not None else None


def _load(out: Path, fingerprint: str, units: int, reads: int) -> tuple[Placement, str] | None:
    """The kept placement and the digest of the signatures it was decided from."""
    try:
        record = load_json(read_own(out / PLACED.format("json")), f"{out}'s guard placement", "it is decided again")
        if not (isinstance(record, dict) and record.get("fingerprint") == fingerprint and _listed(record, units, reads)):
            return None
        raw = read_own(out / PLACED.format("bin"))
    except (OSError, ValueError):
        return None
    n = record["moved"]
    if len(raw) != 9 * n or hashlib.sha256(raw).hexdigest() != record["sha256"]:
        return None
    numbers = np.frombuffer(raw, dtype="<i8", count=n).astype(np.int64)
    verdicts = np.frombuffer(raw, dtype=np.uint8, offset=8 * n)
    if n and not ((np.diff(numbers) > 0).all() and numbers[0] >= 0 and ((verdicts >= 1) & (verdicts <= 3)).all()):
        return None
    return Placement(record["starts"], numbers, verdicts, record["inputs"], record["placed"], out), record["signed"]


def forget(out: Path) -> None:
    """The kept placement gone (its record first): the signatures it was decided from changed."""
    remove_own(out / PLACED.format("json"))
    remove_own(out / PLACED.format("bin"))


def _listed(record: dict[str, Any], units: int, reads: int) -> bool:
    """Whether a record's fields are of their types and sizes."""
    starts, inputs, placed = record.get("starts"), record.get("inputs"), record.get("placed")
    return (type(record.get("moved")) is int and record["moved"] >= 0 and isinstance(record.get("sha256"), str)
            and isinstance(record.get("signed"), str)
            and isinstance(starts, list) and len(starts) == reads
            and all(type(s) is int and s >= 0 for s in starts) and starts == sorted(starts)
            and isinstance(inputs, list) and isinstance(placed, list) and len(inputs) == len(placed) == units
            and all(isinstance(s, str) for s in inputs + placed))
