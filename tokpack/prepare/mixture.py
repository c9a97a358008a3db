"""Conversations as a task mixture (``--mixture``): each split written in the order nanochat's
``TaskMixture`` serves its tasks.

    python -m tokpack.prepare smoltalk.jsonl identity.jsonl --chat nanochat --mixture identity.jsonl=2 --seed 42

The inputs are the tasks, in the order given, each repeated its epochs in place (``A=2``: A, A,
then the next input); the list of every (task, conversation) is shuffled by ``random.Random(seed)``,
as ``TaskMixture`` shuffles with its 42, and each split is written in that order. So a loader
that reads a split in stored order (``ranks="cursor"``, nanochat's SFT cursor) serves nanochat's
mixture; any loader gets its epochs and its interleaving, and its resume. The conversations are
rendered once into temporary files beside the outputs, then copied out in mixture order: O(corpus)
time and disk, O(conversations) memory for the order. ``meta.json`` reports each input's share of
the supervised tokens, split by split.

See docs/chat.md.
"""

from __future__ import annotations

import array
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..format import MASK_DTYPE
from ..storage import InputFile
from .writers import SplitWriter, split_writers

UNMIXED = "{split}.unmixed"  # the name the rendered conversations are held at, temporary
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


def staging_writers(out: Path, dtype: np.dtype, eot_token: int) -> dict[str, SplitWriter]:
    """A writer a split in ``out`` for the conversations before they are mixed, at temporary names
    only."""
    def staged(split: str) -> SplitWriter:
        held = UNMIXED.format(split=split)
        return SplitWriter(out, split, dtype, "none", eot_token, None, f"{held}.idx", f"{held}.bin", masked=True,
                           mask_name=f"{held}.mask")

    return split_writers(staged)


def _read(writer: SplitWriter, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A closed staging writer's tokens and mask (mapped) and its conversations' starts and ends."""
    if not writer.tokens:
        empty = np.zeros(0, np.int64)
        return np.zeros(0, dtype), np.zeros(0, MASK_DTYPE), np.stack([empty, empty])
    tokens = np.memmap(writer.bin.tmp, dtype=dtype, mode="r")  # type: ignore[union-attr]
    mask = np.memmap(writer.mask.tmp, dtype=MASK_DTYPE, mode="r")  # type: ignore[union-attr]
    starts = np.fromfile(writer.idx.tmp, dtype="<u8").astype(np.int64)
    return tokens, mask, np.stack([starts, np.append(starts[1:], len(tokens))])


def mix(mixture: Mixture, dtype: np.dtype, staged: dict[str, SplitWriter], kinds: dict[str, array.array],
        writers: dict[str, SplitWriter]) -> dict[str, Any]:
    """Each split's staged conversations (tokens of ``dtype``) into its writer in mixture order;
    meta.json's report: each input's epochs and, split by split, its conversations, tokens and
    supervised tokens written, and its share of the supervised tokens."""
    report: dict[str, Any] = {"seed": mixture.seed, "inputs": [{"input": n, "epochs": e} for n, e in
                                                                 zip(mixture.names, mixture.epochs)]}
    for split, held in staged.items():
        held.close()
        tokens, mask, (starts, ends) = _read(held, dtype)
        source = np.frombuffer(kinds[split], dtype=np.uint32) if len(kinds[split]) else np.zeros(0, np.uint32)
        tally = np.zeros((len(mixture.names), 3), dtype=np.int64)  # conversations, tokens, supervised
        out = writers[split]
        for doc in mixture.order(source):
            a, b = starts[doc], ends[doc]
            out.start_document(int(b - a))
            out.write(tokens[a:b], mask[a:b])
            out.end_document()
            tally[source[doc]] += (1, b - a, np.count_nonzero(mask[a:b]))
        total = max(1, int(tally[:, 2].sum()))
        for entry, (conversations, count, supervised) in zip(report["inputs"], tally.tolist()):
            entry[split] = {"conversations": conversations, "tokens": count, "supervised": supervised,
                            "supervised_share": round(supervised / total, 6)}
    return report
