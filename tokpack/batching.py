"""Items in batches of about a number of characters of text, in order: tokenized, signed or
indexed a batch at a time, so each call's work is large and memory stays bounded."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def batches(items: Iterable[T], chars: int, size: Callable[[T], int]) -> Iterator[list[T]]:
    """``items`` in order, in lists that each reach ``chars`` characters by ``size`` (the last may
    hold fewer)."""
    batch: list[T] = []
    held = 0
    for item in items:
        batch.append(item)
        held += size(item)
        if held >= chars:
            yield batch
            batch, held = [], 0
    if batch:
        yield batch
