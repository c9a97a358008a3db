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

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from .render import ChatPiece, Renderer, assemble

# nanochat's special tokens, by name: <|bos|> starts every document, the others render chats.
NANOCHAT_TOKENS = ("<|bos|>", "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>",
                   "<|python_start|>", "<|python_end|>", "<|output_start|>", "<|output_end|>")


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

    def pieces(self, found: list[dict[str, Any]], doc: int, where: str) -> list[ChatPiece]:
        return list(self._pieces(found, doc))

    def _pieces(self, found: list[dict[str, Any]], doc: int) -> Iterator[ChatPiece]:
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
        return assemble(encoded, dtype, self.max_tokens)

    def describe(self) -> dict[str, Any]:
        return {"renderer": Renderer.NANOCHAT.value, "max_tokens": self.max_tokens}
