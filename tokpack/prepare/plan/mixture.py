"""Conversations as a task mixture (``--mixture``): each split written in the order nanochat's
``TaskMixture`` serves its tasks.

    python -m tokpack.prepare smoltalk.jsonl identity.jsonl --chat nanochat --mixture identity.jsonl=2 --seed 42

The inputs are the tasks, in the order given, each repeated its epochs in place (``A=2``: A, A,
then the next input); the list of every (task, conversation) is shuffled by ``random.Random(seed)``,
as ``TaskMixture`` shuffles with its 42, and each split is written in that order. So a loader
that reads a split in stored order (``ranks="cursor"``, nanochat's SFT cursor) serves nanochat's
mixture; any loader gets its epochs and its interleaving, and its resume. The conversations are
rendered once, unit by unit in input order, then copied out in mixture order at the finish
(``publish.folder.mixed``): O(corpus) time and disk, O(conversations) memory for the order.
``meta.json`` reports each input's share of the supervised tokens, split by split.

See docs/chat.md.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...storage import InputFile

# The order is held in memory, an entry a (conversation, epoch) shuffled as a list, as TaskMixture
# holds it (about 40 bytes each): a count of epochs past any mixture's (nanochat's repeat a task a
# few times) would only grow it without writing anything for minutes.
MAX_EPOCHS = 100


@dataclass(frozen=True)
class Mixture:
    """The tasks of a mixture: each input as given, its epochs, and the input each file is of (by
    the file's identity, however it is reached)."""

    names: tuple[str, ...]
    epochs: tuple[int, ...]
    source: dict[tuple[Any, ...], int]
    seed: int

    def source_of(self, file: InputFile) -> int:
        return self.source[file.identity()]

    @classmethod
    def of(cls, asked: tuple[str, ...], groups: list[tuple[str, list[InputFile]]], seed: int) -> Mixture | None:
        """The mixture ``--mixture INPUT=EPOCHS ...`` asks for over the inputs ``groups`` (as given,
        with their files); None where none is asked for."""
        if not asked:
            return None
        names = tuple(raw for raw, _ in groups)
        epochs = dict.fromkeys(names, 1)
        given: dict[str, str] = {}
        for entry in asked:
            name, _, count = entry.rpartition("=")
            if name not in epochs:
                raise ValueError(f"--mixture {entry!r} names no input; name an input as given ({', '.join(names)}) "
                                 "and its epochs, INPUT=N")
            if name in given:
                raise ValueError(f"--mixture names {name} twice ({given[name]!r} and {entry!r}); give each input once")
            if not (count.isascii() and count.isdigit()) or not 1 <= int(count) <= MAX_EPOCHS:
                raise ValueError(f"--mixture {entry!r} gives {count!r} epochs; give a whole number from 1 to "
                                 f"{MAX_EPOCHS}")
            given[name], epochs[name] = entry, int(count)
        source = {file.identity(): i for i, (_, found) in enumerate(groups) for file in found}
        return cls(names, tuple(epochs[n] for n in names), source, seed)

    def order(self, kinds: np.ndarray) -> np.ndarray:
        """The stored conversations (of inputs ``kinds``) in mixture order, repeats included."""
        listed = np.concatenate([np.flatnonzero(kinds == task) for task, epochs in enumerate(self.epochs)
                                 for _ in range(epochs)] or [np.zeros(0, np.int64)])
        places = list(range(len(listed)))
        random.Random(self.seed).shuffle(places)  # a shuffle moves places alone: its contents never count
        return listed[np.array(places, dtype=np.int64)]
