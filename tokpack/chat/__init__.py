"""Conversations: chat records read as messages, and rendered to token ids with a loss mask a token.

    python -m tokpack.prepare chats.jsonl --chat nanochat --encoding tok/tokenizer.json
    python -m tokpack.prepare chats.jsonl --chat template --encoding model/tokenizer.json

``records`` checks a record's messages; ``nanochat`` and ``template`` render them (each a
``ChatRenderer``: pieces of text to encode, special tokens placed by id), and encode a batch of
conversations at once into their ids and masks (``Encoded``), in the same way for every rendering
(``render.encode_conversations``).

See docs/chat.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..tokenizer.specials import NANOCHAT_TOKENS
from ..tokenizer.templates import read_template, template_source
from .nanochat import Nanochat
from .records import messages, tools
from .render import ChatPieces, ChatRenderer, Encoded, PieceMask, Renderer

if TYPE_CHECKING:
    from .template import Template

__all__ = ["NANOCHAT_TOKENS", "ChatPieces", "ChatRenderer", "Encoded", "Nanochat", "PieceMask", "Renderer", "Template",
           "messages", "read_template", "template_source", "tools"]


def __getattr__(name: str) -> Any:
    # Chat templates need jinja2, a tenth of every start-up that imports tokpack.tokenizer:
    # imported on first use, as tokpack's own public names are.
    if name == "Template":
        from .template import Template

        return Template
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
