"""A tokenizer's own chat template (``--chat template``), rendered as transformers renders it.

    python -m tokpack.prepare chats.jsonl --chat template --encoding model/tokenizer.json

The template runs in jinja2's immutable sandbox with transformers' settings, globals and
filters (``raise_exception``, ``tojson``, ``dict``, ``namespace``, the ``{% generation %}``
tag), given ``messages``, ``add_generation_prompt=False`` and the tokenizer config's special
tokens (``bos_token``, ``eos_token``, ...). ``strftime_now`` formats a fixed day (26 Jul 2024),
so a prepare is the same whatever day it runs. A render is bounded: loop turns and calls
counted, output and string repetition capped, so a template that loops, recurses or renders
megabytes is one error, not a hang.

The rendered text is cut at the special tokens the template wrote (message text is marked
before rendering, so special-token text inside a message stays text, unless ``special_text``
is "special": transformers' way), each stretch between them encoded whole. The mask is 1 on
each token overlapping a ``{% generation %}`` block; a template without one has its assistant
turns found by rendering prefixes: turn i is the text the conversation's first i+1 messages add
to its first i rendered with ``add_generation_prompt=True``. O(conversation) a render;
O(turns x conversation) without generation blocks.

See docs/chat.md.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.ext
import jinja2.utils
from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
import numpy as np

from ..tokenizer.specials import specials_apart
from .records import bad_record
from .render import ChatPieces, Encoded, PieceMask, Renderer, Vocabulary, encode_conversations, overlapping, token_sizes

if TYPE_CHECKING:
    from ..tokenizer import Encoder

# Loop turns and calls one render may take: STEPS, and STEP_GROWTH more a character of its
# conversation (a template may loop over a message's characters); a real one takes hundreds.
STEPS = 100_000
STEP_GROWTH = 4
OUTPUT_CHARS = 1 << 20  # characters a render may have beyond GROWTH a character of its conversation
GROWTH = 8
FIXED_DAY = datetime(2024, 7, 26)  # strftime_now's day: the one Llama 3's template falls back to
# Markers for special-token text inside messages: pairs of Unicode noncharacters, the first pair
# that no string of a conversation holds, so no text is ever changed to make room for them.
MARKERS = tuple((chr(a), chr(a + 1)) for a in range(0xFDD0, 0xFDF0, 2))
GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: where the text the model learns to write is."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation"), [], [], body).set_lineno(lineno)

    def _generation(self, caller: Callable[[], str]) -> str:
        text = caller()
        env = self.environment
        assert isinstance(env, _Sandbox)
        env.spans.append((env.written, env.written + len(text)))
        return text


class _Namespace(jinja2.utils.Namespace):
    """jinja's namespace, refusing names that reach Python internals, and bounded in what it holds."""

    def __init__(*args: Any, **kwargs: Any):  # jinja's own signature trick: namespace(self=...) works
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name, value in attrs.items():
            _Namespace._check(name, value)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name, value)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any, value: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a namespace attribute may not start with '_' ({name!r})")
        if isinstance(value, (str, list, tuple)) and len(value) > OUTPUT_CHARS * GROWTH:
            raise TemplateError(f"a namespace attribute holds {len(value):,} items")


class _Dict:
    """``dict(...)`` for templates, without the class's attributes."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args)


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # transformers' filter: plain json.dumps, no HTML escaping
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _Sandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox, counting each loop turn and call and capping what a render writes."""

    intercepted_binops = frozenset({"*", "**"})

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols])
        self.filters["tojson"] = _tojson
        self.globals.update(raise_exception=_raise, strftime_now=FIXED_DAY.strftime, dict=_Dict(),
                            namespace=_Namespace)
        self.start(0)

    def start(self, size: int) -> None:
        """A render of a conversation of ``size`` characters begins: its budget of steps and of
        characters, and no span yet."""
        self.budget, self.limit = STEPS + STEP_GROWTH * size, OUTPUT_CHARS + GROWTH * size
        self.steps, self.written = self.budget, 0
        self.spans: list[tuple[int, int]] = []

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):  # every loop's items counted as they are taken
            loop.iter = nodes.Call(nodes.EnvironmentAttribute("counted"), [loop.iter], [], None, None)
        return tree

    def counted(self, items: Any) -> Iterator[Any]:
        for item in items:
            self.step()
            yield item

    def step(self) -> None:
        self.steps -= 1
        if self.steps < 0:
            raise TemplateError(f"takes more than {self.budget:,} steps (loop turns and calls)")

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.step()
        return super().call(context, obj, *args, **kwargs)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            times, seq = (right, left) if isinstance(right, int) else (left, right)
            if isinstance(times, int) and isinstance(seq, (str, list, tuple)) and len(seq) * times > self.limit:
                raise TemplateError(f"repeats a sequence to {len(seq) * times:,} items")
        elif isinstance(right, int) and abs(right) > 4096 and isinstance(left, (int, float)) and abs(left) > 1:
            raise TemplateError(f"raises to the power {right:,}")
        return super().call_binop(context, operator, left, right)


@lru_cache(maxsize=8)
def _specials_pattern(names: tuple[str, ...], markers: tuple[str, str] | None) -> re.Pattern[str]:
    """Special tokens (longest first), each with the markers that may touch it."""
    tokens = "|".join(map(re.escape, sorted(names, key=len, reverse=True)))
    if markers is None:
        return re.compile(f"()({tokens})()")
    start, end = map(re.escape, markers)
    return re.compile(f"({start}?)({tokens})({end}?)")


def _strings(value: Any) -> list[str]:
    """Every string inside ``value`` (keys too), in no particular order."""
    out, stack = [], [value]
    while stack:
        item = stack.pop()
        kind = type(item)  # the types JSON gives, tested first: isinstance of an ABC is slow
        if kind is str or (kind is not dict and kind is not list and isinstance(item, str)):
            out.append(item)
        elif kind is dict or isinstance(item, Mapping):
            out += map(str, item)
            stack += item.values()
        elif kind is list or isinstance(item, (list, tuple)):
            stack += item
    return out


def _mark(value: Any, pattern: re.Pattern[str], markers: tuple[str, str]) -> Any:
    """``value`` with each special token's text inside its strings wrapped in the markers."""
    if isinstance(value, str):
        return pattern.sub(lambda m: markers[0] + m.group(2) + markers[1], value)
    if isinstance(value, Mapping):
        return {key: _mark(item, pattern, markers) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_mark(item, pattern, markers) for item in value]
    return value


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Spans in order, overlapping ones joined (a generation block inside another is inside it)."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _byte_spans(raw: str, lo: int, spans: list[tuple[int, int]], markers: tuple[str, str] | None) -> tuple[
        str, tuple[tuple[int, int], ...]]:
    """A stretch of the rendered text (starting at ``lo``) without markers, and the spans that
    fall in it as byte ranges of that text."""

    def clean(text: str) -> str:
        return text if markers is None else text.replace(markers[0], "").replace(markers[1], "")

    one_byte = markers is None and raw.isascii()  # a character a byte: no prefix to encode

    def at(i: int) -> int:
        i = max(0, min(i - lo, len(raw)))
        return i if one_byte else len(clean(raw[:i]).encode("utf-8", "surrogatepass"))

    inside = tuple((at(s), at(e)) for s, e in spans if s < lo + len(raw) and e > lo)
    return clean(raw), tuple((s, e) for s, e in inside if e > s)


class Template:
    """A chat template as a rendering.

    Args:
        source: the template's text.
        origin: where it comes from, for messages.
        vocab: the tokenizer (its special tokens, and its tokens' bytes to find which a span covers).
        max_tokens: a conversation's tokens at most; 0 keeps every one.
        variables: the template's other inputs: the tokenizer config's special tokens by name.
        special_text: "ordinary" keeps special-token text inside messages as text; "special"
            lets it become control tokens, as transformers does.
    """

    def __init__(self, source: str, origin: str, vocab: Vocabulary, max_tokens: int,
                 variables: Mapping[str, Any] | None = None, special_text: str = "ordinary"):
        self.env = _Sandbox()
        try:
            self.compiled = self.env.from_string(source)
        except TemplateError as exc:
            raise ValueError(f"the chat template {origin} does not parse ({exc}); fix it, or pass another with "
                             "--chat-template FILE") from None
        self.origin, self.specials, self.vocab = origin, dict(vocab.specials), vocab
        self._names = tuple(self.specials)  # the key of their patterns, made once
        self._apart = specials_apart(self.specials)  # a rendered text may be encoded whole
        self.max_tokens, self.variables = max_tokens, dict(variables or {})
        self.ordinary = special_text == "ordinary"
        self.generation = bool(GENERATION.search(source))
        self.sha256 = hashlib.sha256(source.encode("utf-8")).hexdigest()

    def describe(self) -> dict[str, Any]:
        return {"renderer": Renderer.TEMPLATE.value, "max_tokens": self.max_tokens, "template_sha256": self.sha256,
                "assistant_mask": "generation" if self.generation else "prefixes"}

    def render(self, found: list[dict[str, Any]], where: str, size: int,
               prompt: bool = False) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text of ``found`` and its generation spans (character ranges); ``size``,
        the characters of the conversation, sets how far the render may go."""
        self.env.start(size)
        blocks = []
        try:
            for block in self.compiled.generate(messages=found, tools=None, documents=None,
                                                add_generation_prompt=prompt, **self.variables):
                blocks.append(block)
                self.env.written += len(block)
                if self.env.written > self.env.limit:
                    raise TemplateError(f"renders more than {self.env.limit:,} characters")
        except SecurityError as exc:
            raise bad_record(where, f"makes the chat template {self.origin} reach outside its sandbox "
                             f"({exc})") from None
        except Exception as exc:  # a template is code: whatever it raises is this record's error
            raise bad_record(where, f"makes the chat template {self.origin} fail: "
                             f"{type(exc).__name__}: {exc}") from None
        return "".join(blocks), self.env.spans

    def _prefix_spans(self, found: list[dict[str, Any]], text: str, where: str, size: int) -> list[tuple[int, int]]:
        spans = []
        for i, message in enumerate(found):
            if message["role"] != "assistant":
                continue
            before, _ = self.render(found[:i], where, size, prompt=True)
            upto, _ = self.render(found[:i + 1], where, size)
            if not (upto.startswith(before) and text.startswith(upto)):
                raise bad_record(where, f"is rendered by the chat template {self.origin} differently as a whole "
                                 f"than in its first {i + 1} messages, so its assistant turn {i} cannot be found "
                                 "by rendering prefixes; mark the assistant's text in the template with "
                                 "{% generation %}")
            spans.append((len(before), len(upto)))
        return spans

    def pieces(self, found: list[dict[str, Any]], where: str) -> ChatPieces:
        markers, held = None, _strings(found)
        typed = _specials_pattern(self._names, None)
        # Special-token text in a message is marked, to stay text.
        if self.ordinary and self.specials and any(typed.search(s) for s in held):
            markers = next((m for m in MARKERS if not any(m[0] in s or m[1] in s for s in held)), None)
            if markers is None:
                raise bad_record(where, "holds every marker tokpack could use for special-token text")
            found = _mark(found, typed, markers)
        size = sum(map(len, held))
        text, spans = self.render(found, where, size)
        spans = _merged(spans if self.generation else self._prefix_spans(found, text, where, size))
        if markers is None and self._apart:  # every special token's text in it is the template's
            lead = [self.specials[name] for _, name, _ in typed.findall(text)]
            return ChatPieces([text], [lead], [PieceMask([], 0, _byte_spans(text, 0, spans, None)[1])], marked=True)
        return self._split(text, spans, markers)

    def _split(self, text: str, spans: list[tuple[int, int]], markers: tuple[str, str] | None) -> ChatPieces:
        """The rendered text cut at the special tokens the template wrote."""
        out = ChatPieces([], [], [])
        lead, lead_mask, lo = [], [], 0
        for m in _specials_pattern(self._names, markers).finditer(text) if self.specials else ():
            if m.group(1) or m.group(3):  # marked: a message's text, not the template's
                continue
            start, end = m.span(2)
            if start > lo:
                self._add(out, text[lo:start], lo, spans, markers, lead, lead_mask)
                lead, lead_mask = [], []
            lead.append(self.specials[m.group(2)])
            lead_mask.append(int(any(s < end and e > start for s, e in spans)))
            lo = end
        if lo < len(text):
            self._add(out, text[lo:], lo, spans, markers, lead, lead_mask)
            lead, lead_mask = [], []
        self._add(out, "", 0, [], None, lead, lead_mask)
        return out

    @staticmethod
    def _add(out: ChatPieces, raw: str, lo: int, spans: list[tuple[int, int]], markers: tuple[str, str] | None,
             lead: list[int], lead_mask: list[int]) -> None:
        """One text of the rendered text (at ``lo`` in it, its markers still in) and its lead into ``out``."""
        text, inside = _byte_spans(raw, lo, spans, markers)
        out.texts.append(text)
        out.leads.append(lead)
        assert out.masks is not None
        if not inside:
            out.masks.append(PieceMask(lead_mask, 0))
        elif inside == ((0, len(text.encode("utf-8", "surrogatepass"))),):
            out.masks.append(PieceMask(lead_mask, 1))
        else:
            out.masks.append(PieceMask(lead_mask, 0, inside))

    def encode(self, enc: Encoder, dtype: np.dtype, batch: list[ChatPieces]) -> Encoded:
        return encode_conversations(enc, dtype, batch, frozenset(self.specials), self._masks, self.max_tokens)

    def _masks(self, ids: np.ndarray, layout: np.ndarray, conversations: list[ChatPieces]) -> np.ndarray:
        """Each text's spans found in its tokens, its lead's masks, and a whole text's 1."""
        found = [m for conversation in conversations for m in conversation.masks or ()]
        texts = [text for conversation in conversations for text in conversation.texts]
        mask = overlapping(ids, list(zip(layout[:, 1].tolist(), layout[:, 2].tolist())), texts,
                           [m.spans for m in found], self._sizes)
        for (lead, text, end), piece in zip(layout.tolist(), found):
            if piece.lead:
                mask[lead:text] = piece.lead
            if piece.value:
                mask[text:end] = True
        return mask

    @cached_property
    def _sizes(self) -> np.ndarray:
        """Each token's bytes, to find which a span covers."""
        return token_sizes(self.vocab)
