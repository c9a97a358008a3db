"""nanochat's rendering (``--chat nanochat``): its ``render_conversation``, token for token.

``<|bos|>``, each user turn inside ``<|user_start|>`` / ``<|user_end|>``, each assistant turn
inside ``<|assistant_start|>`` / ``<|assistant_end|>`` (python calls and outputs inside their own
tokens), a system message merged into the first user turn; the mask is 1 on assistant text,
python calls and ``<|assistant_end|>``, 0 on everything else (python outputs too). Message text
is always encoded as ordinary text and the special tokens placed by id, so special-token text a
user typed stays text. O(conversation) time and memory.

See docs/chat.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..format import MASK_DTYPE
from ..tokenizer.specials import NANOCHAT_TOKENS, lead_places
from .records import bad_record, calls
from .render import ChatPieces, Encoded, Renderer, encode_conversations

if TYPE_CHECKING:
    from ..tokenizer import Encoder

# The step each kind of token makes in the mask: assistant start and end, output start and end.
_STEPS = np.array([0, 1, -1, -1, 1], dtype=np.int8)
_OUTPUT_START = 3


class Nanochat:
    """nanochat's rendering, for a tokenizer that has its special tokens.

    A conversation is rendered as its texts, each led by the special tokens before it: the texts
    of a batch of conversations are encoded in one call as ordinary text (``Encoder.encode_flat``)
    and the special tokens placed between them by id, so no text is read as a special token and
    texts side by side are encoded apart, as nanochat does. The mask follows from the ids.

    Args:
        specials: the tokenizer's special tokens, by text.
        max_tokens: a conversation's tokens at most (nanochat's 2048); 0 keeps every one.
    """

    marks = frozenset(NANOCHAT_TOKENS)

    def __init__(self, specials: Mapping[str, int], max_tokens: int):
        missing = [t for t in NANOCHAT_TOKENS if t not in specials]
        if missing:
            raise ValueError(f"--chat nanochat needs nanochat's special tokens, and this tokenizer lacks "
                             f"{', '.join(missing)}; train one with python -m tokpack.tokenizer train --special "
                             "nanochat")
        self.specials, self.max_tokens = dict(specials), max_tokens
        self._ids = _Ids(*(self.specials[name] for name in NANOCHAT_TOKENS))

    def pieces(self, found: list[dict[str, Any]], where: str, tools: list[Any] | None = None) -> ChatPieces:
        if tools is not None or any(m["role"] == "tool" or calls(m) for m in found):
            raise bad_record(where, "has tools, tool_calls or tool messages, which nanochat's rendering has no tokens "
                             "for (its python tool is an assistant's parts); render it with --chat template")
        return ChatPieces(*_rendered(found, self._ids))

    def encode(self, enc: Encoder, dtype: np.dtype, batch: list[ChatPieces]) -> Encoded:
        return encode_conversations(enc, dtype, batch, self.marks, self._mask, self.max_tokens)

    def _mask(self, ids: np.ndarray, layout: np.ndarray, conversations: list[ChatPieces]) -> np.ndarray:
        """1 from an assistant turn's first token to its ``<|assistant_end|>``, python outputs
        (with their tokens) left out; 0 elsewhere, for many conversations in a row. The special
        tokens alone place the turns, and they are the texts' leads (``layout``): each is a step up
        or down where a trained stretch begins or ends, and the mask is where the steps sum above
        0 (a pass over the ids, the rest over the special tokens)."""
        at = lead_places(layout)
        kinds = self._kinds.take(ids[at], mode="clip")  # a place past the special tokens' ids holds 0
        steps = np.flatnonzero(kinds)
        at, kind = at[steps], kinds[steps]
        level = np.zeros(len(ids) + 1, dtype=np.int8)
        # A step after its token, but an output's start steps down before it: its token is not trained.
        np.add.at(level, at + (kind != _OUTPUT_START), _STEPS[kind])
        return (np.cumsum(level[:-1], dtype=np.int8) > 0).view(MASK_DTYPE)

    @cached_property
    def _kinds(self) -> np.ndarray:
        """Each id's kind of step (``_STEPS``' index), 0 for all but the four tokens that open and
        close trained stretches; one place more than the highest of those, for ids past them."""
        names = ("<|assistant_start|>", "<|assistant_end|>", "<|output_start|>", "<|output_end|>")
        kinds = np.zeros(max(self.specials[name] for name in names) + 2, dtype=np.int8)
        for kind, name in enumerate(names, 1):
            kinds[self.specials[name]] = kind
        return kinds

    def describe(self) -> dict[str, Any]:
        return {"renderer": Renderer.NANOCHAT.value, "max_tokens": self.max_tokens}


class _Ids(NamedTuple):
    """The ids of nanochat's special tokens, in ``NANOCHAT_TOKENS``' order."""

    bos: int
    user_start: int
    user_end: int
    assistant_start: int
    assistant_end: int
    python_start: int
    python_end: int
    output_start: int
    output_end: int


def _rendered(found: list[dict[str, Any]], ids: _Ids) -> tuple[list[str], list[list[int]]]:
    """A conversation as nanochat renders it: its texts, and the ids of the special tokens before
    each (the last text, empty, has those after the last text)."""
    if found[0]["role"] == "system":  # merged into the first user turn, as nanochat does
        found = [{"role": "user", "content": found[0]["content"] + "\n\n" + found[1]["content"]}, *found[2:]]
    texts, leads, lead = [], [], [ids.bos]
    for message in found:
        content = message["content"]
        if message["role"] == "user":
            lead.append(ids.user_start)
            texts.append(content)
            leads.append(lead)
            lead = [ids.user_end]
            continue
        lead.append(ids.assistant_start)
        if isinstance(content, str):
            texts.append(content)
            leads.append(lead)
            lead = [ids.assistant_end]
            continue
        for part in content:
            kind = part["type"]
            if kind == "python":
                lead.append(ids.python_start)
            elif kind == "python_output":
                lead.append(ids.output_start)
            texts.append(part["text"])
            leads.append(lead)
            lead = [] if kind == "text" else [ids.python_end if kind == "python" else ids.output_end]
        lead.append(ids.assistant_end)
    texts.append("")
    leads.append(lead)
    return texts, leads
