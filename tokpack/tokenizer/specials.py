"""Special tokens among ordinary text: nanochat's names, whether texts may stand between written
special tokens without changing where they are read (``specials_apart``), and texts' ids with
special tokens placed between them by id (``with_leads``). A tokenizer's business: the chat
renderings stand on it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import numpy as np

# nanochat's special tokens, by name: <|bos|> starts every document, the others render chats.
NANOCHAT_TOKENS = ("<|bos|>", "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>",
                   "<|python_start|>", "<|python_end|>", "<|output_start|>", "<|output_end|>")


def specials_apart(names: Iterable[str]) -> bool:
    """Whether any text that holds no special token's text may stand between special tokens
    written out without changing where they are read: no special token holds another, and none
    ends with the start of one (else the end of a text and the start of the token after it, or
    the token itself, could be read as that one). Then a scan for special tokens finds exactly
    those written. O(special tokens x their length) with a set of their proper ends."""
    names = list(names)
    ends = {name[-k:] for name in names for k in range(1, len(name))}
    held = any(a != b and b in a for a in names for b in names)
    return bool(names) and not held and not any(name[:k] in ends for name in names for k in range(1, len(name) + 1))


def with_leads(flat: np.ndarray, bounds: np.ndarray, leads: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Texts' ids laid end to end (``flat``, each text's offsets ``bounds``) with each text's
    ``leads`` (special tokens' ids) placed before it: the ids (uint32), and the layout, one row a
    text: where its lead starts, where its own ids start, where they end. A few array operations."""
    held = np.fromiter(map(len, leads), dtype=np.int64, count=len(leads))
    sizes = held + np.diff(bounds)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    layout = np.stack([starts, starts + held, ends], axis=1)
    ids = np.empty(int(ends[-1]) if len(ends) else 0, dtype=np.uint32)
    at = lead_places(layout)
    text = np.ones(len(ids), dtype=bool)
    text[at] = False
    ids[at] = np.fromiter(itertools.chain.from_iterable(leads), dtype=np.uint32, count=len(at))
    ids[text] = flat
    return ids, layout


def lead_places(layout: np.ndarray) -> np.ndarray:
    """Where each lead's special tokens stand in the ids, from their ``layout`` (``with_leads``')."""
    held = layout[:, 1] - layout[:, 0]
    return np.repeat(layout[:, 0] - (np.cumsum(held) - held), held) + np.arange(int(held.sum()))
