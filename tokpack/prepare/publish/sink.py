"""Where a prepare run's units and its finished folder go: the run's own local folder
(``folder.LocalSink``), or a folder at a URL made from a local spool (``remote.Publisher``).
Whoever launches the run hands its stages one, and none of them asks which it is."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from ...format import UnitRecord
from ..guard.placement import Placement
from ..plan import Plan


class Sink(Protocol):
    """Where a run's finished units go, and its finished folder."""

    apart: bool  # whether tasks started on other machines (Ray's) see only what this sink holds, not this disk

    def kept(self, plan: Plan, unit: int, placement: Placement | None) -> UnitRecord | None:
        """The record of ``unit`` where a run finished it already (by the guard's ``placement``)
        and it is intact, else None."""
        ...

    def keep(self, plan: Plan, record: UnitRecord) -> UnitRecord:
        """A unit just finished (its files in ``plan.out``, at their temporary names), kept: its
        record as kept."""
        ...

    def done(self) -> None:
        """Every unit given to ``keep`` is kept."""
        ...

    def numbered(self, plan: Plan) -> set[int]:
        """The units recorded so far, from their names alone (for progress)."""
        ...

    def recorded(self, plan: Plan, placement: Placement | None) -> tuple[list[UnitRecord], list[int]]:
        """Every unit's record that the run's tasks left, in unit order, and the units lost."""
        ...

    def share(self, plan: Plan, names: list[str]) -> None:
        """Files of ``plan.out`` that tasks of the run read (the guard's placement), made theirs."""
        ...

    def publish(self, plan: Plan, meta: Mapping[str, Any], renames: list[tuple[str, str]]) -> None:
        """The finished folder: the files (renamed from their temporary names) and meta.json, last."""
        ...
