"""Conversations: chat records read as messages, and rendered to token ids with a loss mask a token.

    python -m tokpack.prepare chats.jsonl --chat nanochat --encoding tok/tokenizer.json

A record is ``{"messages": [{"role": ..., "content": ...}, ...]}`` (content a string, or for an
assistant nanochat's list of parts ``{"type": "text" | "python" | "python_output", "text": ...}``),
or TRL's ``{"prompt": ..., "completion": ...}`` (each a string, or a list of messages). The
``nanochat`` rendering is nanochat's ``render_conversation``: ``<|bos|>``, each user turn inside
``<|user_start|>`` / ``<|user_end|>``, each assistant turn inside ``<|assistant_start|>`` /
``<|assistant_end|>`` (python calls and outputs inside their own tokens), a system message merged
into the first user turn; the mask is 1 on assistant text, python calls and ``<|assistant_end|>``,
0 on everything else (python outputs too); a conversation is cut to ``max_tokens``. Message text
is always encoded as ordinary text, so special-token text a user typed stays text and never
becomes a control token. Rendering is O(conversation) and holds one conversation.

See docs/chat.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from enum import StrEnum
from typing import Any, NamedTuple

import numpy as np

from .format import MASK_DTYPE

# nanochat's special tokens, by name: <|bos|> starts every document, the others render chats.
NANOCHAT_TOKENS = ("<|bos|>", "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>",
                   "<|python_start|>", "<|python_end|>", "<|output_start|>", "<|output_end|>")


class Renderer(StrEnum):
    """How a conversation becomes tokens."""

    NONE = "none"  #: the inputs are text, not conversations
    NANOCHAT = "nanochat"  #: nanochat's rendering, with its nine special tokens


PART_TYPES = ("text", "python", "python_output")


def _fix(where: str, problem: str) -> ValueError:
    return ValueError(f"{where} {problem}; fix the record, or leave it out with --skip-bad")


def _message(value: Any, where: str, i: int) -> dict[str, Any]:
    if not isinstance(value, Mapping) or not isinstance(value.get("role"), str) or "content" not in value:
        raise _fix(where, f"has message {i} without a role and content")
    role, content = value["role"], value["content"]
    if role not in ("system", "user", "assistant"):
        raise _fix(where, f"has message {i} of role {role!r}; the roles are system, user and assistant")
    if isinstance(content, list) and role == "assistant":
        for part in content:
            if not (isinstance(part, Mapping) and part.get("type") in PART_TYPES and isinstance(part.get("text"), str)):
                raise _fix(where, f"has message {i} with a part that is not {{'type': one of {', '.join(PART_TYPES)}, "
                           "'text': a string}")
    elif not isinstance(content, str):
        raise _fix(where, f"has message {i} ({role}) whose content is {type(content).__name__}, not a string"
                   + (" or a list of parts" if role == "assistant" else ""))
    return {"role": role, "content": content}


def _turns(value: Any, role: str, where: str, field: str) -> list[Any]:
    """TRL's prompt or completion: a string (one turn of ``role``) or a list of messages."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, list):
        return value
    raise _fix(where, f"has {field!r} of type {type(value).__name__}, not a string or a list of messages")


def messages(record: Any, where: str) -> list[dict[str, Any]]:
    """The messages of a chat record (``where`` names it in errors), checked: roles known, content
    of the right type, a system message first if any, then user and assistant turns alternating
    from a user turn, and at least one assistant turn with text to train on."""
    if not isinstance(record, Mapping):
        raise _fix(where, f"is {type(record).__name__}, not a record with 'messages'")
    if "messages" in record:
        raw = record["messages"]
    elif "prompt" in record and "completion" in record:
        raw = _turns(record["prompt"], "user", where, "prompt") + _turns(record["completion"], "assistant", where,
                                                                        "completion")
    else:
        raise _fix(where, f"has no 'messages' (nor TRL's 'prompt' and 'completion'; found {sorted(record)})")
    if not isinstance(raw, list) or not raw:
        raise _fix(where, "has an empty conversation" if isinstance(raw, list) else "has 'messages' that is not a list")
    found = [_message(m, where, i) for i, m in enumerate(raw)]
    turns = found[1:] if found[0]["role"] == "system" else found
    for i, message in enumerate(turns):
        expected = "user" if i % 2 == 0 else "assistant"
        if message["role"] != expected:
            article = "an" if expected == "assistant" else "a"
            raise _fix(where, f"has a {message['role']} message where {article} {expected} turn comes (a system "
                       "message first, then user and assistant turns alternating, from a user turn)")
    assistant = [m for m in turns if m["role"] == "assistant"]
    if not assistant:
        raise _fix(where, "has no assistant turn, so nothing to train on")
    for message in assistant:
        content = message["content"]
        text = content if isinstance(content, str) else "".join(p["text"] for p in content
                                                                  if p["type"] != "python_output")
        if not text:
            raise _fix(where, "has an assistant turn with no text to train on")
    return found


class ChatPiece(NamedTuple):
    """One text of a conversation to encode (``mask`` on each of its tokens), led by special
    tokens (``lead``, with their masks); ``last`` ends the conversation ``doc``."""

    doc: int
    text: str
    mask: int
    lead: list[int]
    lead_mask: list[int]
    last: bool = False


class Nanochat:
    """nanochat's rendering, for a tokenizer that has its special tokens.

    Args:
        specials: the tokenizer's special tokens, by text.
        max_tokens: a conversation's tokens at most (nanochat's 2048); 0 keeps every one.
    """

    def __init__(self, specials: Mapping[str, int], max_tokens: int):
        missing = [t for t in NANOCHAT_TOKENS if t not in specials]
        if missing:
            raise ValueError(f"--chat nanochat needs nanochat's special tokens, and this tokenizer lacks "
                             f"{', '.join(missing)}; train one with python -m tokpack.tokenizer train --special "
                             "nanochat")
        self.ids = {name[2:-2]: specials[name] for name in NANOCHAT_TOKENS}
        self.max_tokens = max_tokens

    def pieces(self, found: list[dict[str, Any]], doc: int) -> Iterator[ChatPiece]:
        """The pieces of one conversation's checked ``messages``."""
        t = self.ids
        if found[0]["role"] == "system":  # merged into the first user turn, as nanochat does
            found = [{"role": "user", "content": found[0]["content"] + "\n\n" + found[1]["content"]}, *found[2:]]
        lead, masks = [t["bos"]], [0]  # the special tokens before the next text, and their masks
        for message in found:
            content = message["content"]
            if message["role"] == "user":
                yield ChatPiece(doc, content, 0, lead + [t["user_start"]], masks + [0])
                lead, masks = [t["user_end"]], [0]
                continue
            lead.append(t["assistant_start"])
            masks.append(0)
            for part in [{"type": "text", "text": content}] if isinstance(content, str) else content:
                if part["type"] == "text":
                    yield ChatPiece(doc, part["text"], 1, lead, masks)
                    lead, masks = [], []
                elif part["type"] == "python":
                    yield ChatPiece(doc, part["text"], 1, lead + [t["python_start"]], masks + [1])
                    lead, masks = [t["python_end"]], [1]
                else:
                    yield ChatPiece(doc, part["text"], 0, lead + [t["output_start"]], masks + [0])
                    lead, masks = [t["output_end"]], [0]
            lead.append(t["assistant_end"])
            masks.append(1)
        yield ChatPiece(doc, "", 0, lead, masks, last=True)

    def assemble(self, encoded: list[tuple[ChatPiece, list[int]]],
                 dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, bool]:
        """A conversation's ids (of ``dtype``) and mask from its pieces and their tokens, cut to
        ``max_tokens``; and whether it was cut."""
        ids: list[int] = []
        mask: list[int] = []
        for piece, tokens in encoded:
            ids += piece.lead
            ids += tokens
            mask += piece.lead_mask
            mask += [piece.mask] * len(tokens)
        cut = bool(self.max_tokens) and len(ids) > self.max_tokens
        if cut:
            ids, mask = ids[:self.max_tokens], mask[:self.max_tokens]
        return np.array(ids, dtype=dtype), np.array(mask, dtype=MASK_DTYPE), cut
