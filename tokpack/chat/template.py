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
to its first i rendered with ``add_generation_prompt=True``, aligned with the whole where a
template renders a conversation otherwise than its prefixes, or its content where a stand-in for
it stands in a render of the whole. Every turn by one rule (``PREFIX_RULE``): through its end
(its eos_token), never what the template writes after the last message whatever it holds.
O(conversation) a render; O(turns x conversation) without generation blocks, bounded per record
(``PREFIX_WORK``).

See docs/chat.md.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import re
import unicodedata
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timezone
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

import jinja2
import jinja2.ext
import jinja2.utils
import jinja2.visitor
from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
import numpy as np

from ..tokenizer.specials import specials_apart
from .records import bad_record
from .render import (ChatPieces, Encoded, PieceMask, Renderer, Vocabulary, encode_conversations, overlapping,
                     token_sizes, utf8_size)

if TYPE_CHECKING:
    from ..tokenizer import Encoder

# Loop turns and calls one render may take: STEPS, and STEP_GROWTH more a character of its
# conversation (a template may loop over a message's characters); a real one takes hundreds.
STEPS = 100_000
STEP_GROWTH = 4
OUTPUT_CHARS = 1 << 20  # characters a render may have beyond GROWTH a character of its conversation
GROWTH = 8
JOIN_BLOCKS = 1024  # a render's blocks held apart at most: the rest joined
# Characters and steps the prefix renders of one record may take together (about 5 s): a template
# without {% generation %} renders two prefixes an assistant turn.
PREFIX_WORK = 1 << 25
MAX_BITS = 1 << 16  # a number a template makes at most (20,000 digits): big-integer arithmetic is unbounded time
FIXED_DAY = datetime(2024, 7, 26, tzinfo=timezone.utc)  # strftime_now's day: the one Llama 3's template falls back to
# Markers for special-token text inside messages: pairs of Unicode noncharacters, the first pair
# that no string of a conversation holds, so no text is ever changed to make room for them.
MARKERS = tuple((chr(a), chr(a + 1)) for a in range(0xFDD0, 0xFDF0, 2))
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")  # an object's repr: "<built-in method items of dict object at 0x7f...>"
_SPACES = re.compile(r"\s*")
GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
# What meta.json says a mask trains, a rule each way of finding assistant turns.
GENERATION_RULE = "each token overlapping a {% generation %} block of the template"
PREFIX_RULE = ("each assistant turn, every one alike: from where the generation prompt ends through its end (the "
               "first eos_token after it and the whitespace after that, or where the next message begins); never "
               "what the template writes after the last message whatever it holds")


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


def _strftime_now(fmt: str) -> str:
    """The fixed day, in UTC, formatted: ``%s`` is replaced first, since the C library's reads the
    machine's time zone."""
    return FIXED_DAY.strftime(re.sub("%.", lambda m: str(int(FIXED_DAY.timestamp())) if m.group() == "%s"
                                     else m.group(), str(fmt)))


def _raise(message: str) -> None:
    raise TemplateError(message)


def _random(*args: Any, **kwargs: Any) -> None:
    raise TemplateError("draws at random (lipsum, random), so a prepare would differ run to run")


# A format's widths and precisions: "%-10.3f", "%(name)5s"; "{:>10}", "{0:.{1}}" (nested ones are arguments).
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0 +\-]*(\d*)(?:\.(\d*))?")
_BRACE_SPEC = re.compile(r"\{[^{}]*:([^{}]*)\}")


def _format_size(fmt: str, args: Any, kwargs: Mapping[str, Any], percent: bool) -> int:
    """An upper estimate of what formatting ``fmt`` with the arguments writes: the format, each
    width and precision in it, and the arguments' text."""
    if percent:
        widths = sum(int(n) for spec in _PERCENT_SPEC.findall(fmt) for n in spec if n)
    else:
        widths = sum(int(n) for spec in _BRACE_SPEC.findall(fmt) for n in re.findall(r"\d+", spec))
    values = [*(args if isinstance(args, (tuple, list)) else [args]), *kwargs.values()]
    if isinstance(args, Mapping):
        values += list(args.values())
    return len(fmt) + widths + sum(_text_size(v) for v in values)


def _text_size(value: Any) -> int:
    """A value's text length where it is text or a sequence of text, else a few characters."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value.bit_length() // 3 + 2  # its digits, at most
    if isinstance(value, (list, tuple)):
        return sum(_text_size(v) + 4 for v in value)
    if isinstance(value, Mapping):
        return sum(_text_size(k) + _text_size(v) + 4 for k, v in value.items())
    return 64


class _Sandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox, counting each loop turn and call (a call a step an argument),
    capping what a render writes, and sizing every operation that makes text or numbers larger
    than its inputs before it runs: a render never holds more than a few times its limit."""

    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols])
        self.globals.update(raise_exception=_raise, strftime_now=_strftime_now, dict=_Dict(),
                            namespace=_Namespace, lipsum=_random)
        self.filters.update(tojson=self._tojson, random=_random, **self._bounded_filters())
        self.start(0)

    def _bounded_filters(self) -> dict[str, Callable[..., Any]]:
        """The filters that can write more than they are given, each sized first."""
        filters, size = self.filters, self.size

        @functools.wraps(filters["indent"])
        def indent(s: Any, width: int | str = 4, *args: Any, **kwargs: Any) -> str:
            text = str(s)
            size("indents", len(text) + (text.count("\n") + 1) * (width if isinstance(width, int) else len(str(width))))
            return filters_indent(s, width, *args, **kwargs)

        @functools.wraps(filters["center"])
        def center(value: Any, width: int = 80) -> str:
            size("centres", width)
            return filters_center(value, width)

        @functools.wraps(filters["replace"])
        def replace(eval_ctx: Any, s: Any, old: Any, new: Any, count: int | None = None) -> str:
            size("replaces", _replaced_size(str(s), str(old), str(new), count))
            return filters_replace(eval_ctx, s, old, new, count)

        @functools.wraps(filters["wordwrap"])
        def wordwrap(environment: Any, s: Any, width: int = 79, break_long_words: bool = True,
                     wrapstring: str | None = None, break_on_hyphens: bool = True) -> str:
            text = str(s)
            size("wraps", len(text) * (2 + len(wrapstring or "")))
            return filters_wordwrap(environment, s, width, break_long_words, wrapstring, break_on_hyphens)

        @functools.wraps(filters["join"])
        def join(eval_ctx: Any, value: Any, d: str = "", attribute: Any = None) -> str:
            items = list(value)
            size("joins", _text_size(items) + len(str(d)) * len(items))
            return filters_join(eval_ctx, items, d, attribute)

        @functools.wraps(filters["format"])
        def format_(value: Any, *args: Any, **kwargs: Any) -> str:
            size("formats", _format_size(str(value), args or kwargs, {}, percent=True))
            return filters_format(value, *args, **kwargs)

        @functools.wraps(filters["batch"])
        def batch(value: Any, linecount: int, fill_with: Any = None) -> Any:
            size("batches", linecount)
            return filters_batch(value, linecount, fill_with)

        @functools.wraps(filters["slice"])
        def slice_(value: Any, slices: int, fill_with: Any = None) -> Any:
            size("slices", slices)
            return filters_slice(value, slices, fill_with)

        filters_indent, filters_center, filters_replace = filters["indent"], filters["center"], filters["replace"]
        filters_wordwrap, filters_join, filters_format = filters["wordwrap"], filters["join"], filters["format"]
        filters_batch, filters_slice = filters["batch"], filters["slice"]
        return {"indent": indent, "center": center, "replace": replace, "wordwrap": wordwrap, "join": join,
                "format": format_, "batch": batch, "slice": slice_}

    def size(self, what: str, chars: int) -> None:
        """Refuse an operation that would make ``chars`` characters (or items), past the limit."""
        if chars > self.limit:
            raise TemplateError(f"{what} to {chars:,} characters")

    def _tojson(self, value: Any, ensure_ascii: bool = False, indent: int | str | None = None, separators: Any = None,
                sort_keys: bool = False) -> str:
        # transformers' filter: plain json.dumps, no HTML escaping; written a piece at a time, so
        # that an indent that grows it past the limit stops it there
        self.size("indents JSON", indent if isinstance(indent, int) else len(indent or ""))
        out, written = [], 0
        encoder = json.JSONEncoder(ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                                   sort_keys=sort_keys)
        for piece in encoder.iterencode(value):
            written += len(piece)
            self.size("writes JSON", written)
            out.append(piece)
        return "".join(out)

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
        return _Joins().visit(tree)

    def joined(self, *items: Any) -> str:
        """``a ~ b``: the texts sized before they are joined."""
        texts = [str(item) for item in items]
        self.size("joins", sum(map(len, texts)))
        return "".join(texts)

    def getattr(self, obj: Any, attribute: str) -> Any:
        return self._internal(super().getattr(obj, attribute), obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        return self._internal(super().getitem(obj, argument), obj, argument)

    def _internal(self, found: Any, obj: Any, name: Any) -> Any:
        # An internal's name that is not there renders as "" in jinja's sandbox (a function's
        # __self__): reaching for one is this record's error, whether or not the object has it.
        if isinstance(found, jinja2.Undefined) and isinstance(name, str) and name.startswith("_"):
            return self.unsafe_undefined(obj, name)
        return found

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        # jinja's own is an undefined that renders as "": a template reaching for an internal is
        # this record's error instead
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is unsafe")

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        fmt = value.__self__

        def sized(*args: Any, **kwargs: Any) -> str:
            self.size("formats", _format_size(fmt, args, kwargs, percent=False))
            return wrapper(*args, **kwargs)

        return sized

    def counted(self, items: Any) -> Iterator[Any]:
        for item in items:
            self.step()
            yield item

    def step(self, steps: int = 1) -> None:
        self.steps -= steps
        if self.steps < 0:
            raise TemplateError(f"takes more than {self.budget:,} steps (loop turns and calls)")

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.step(1 + len(args) + len(kwargs))  # loop.cycle(*range(10**5)) costs what it copies
        if args or kwargs:
            for value in (*args, *kwargs.values()):
                if value.__class__ is int and abs(value) > self.limit:
                    raise TemplateError(f"calls with the number {value:,}, past what a render may write")
            of = getattr(obj, "__self__", None)
            if of.__class__ is str and obj.__name__ in _STR_SIZES:
                if obj.__name__ == "join":
                    args = (list(args[0]), *args[1:])  # counted before the separator goes between them
                self.size(f"makes text ({obj.__name__})", _STR_SIZES[obj.__name__](of, *args, **kwargs))
        return super().call(context, obj, *args, **kwargs)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "+":  # the common one first: '<|im_start|>' + message['role']
            if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)) and \
                    len(left) + len(right) > self.limit:
                raise TemplateError(f"adds to {len(left) + len(right):,} characters")
            return left + right
        ints = left.__class__ is int and right.__class__ is int
        if operator == "*" and ints:
            if left.bit_length() + right.bit_length() > MAX_BITS:
                raise TemplateError(f"multiplies numbers past {MAX_BITS:,} bits")
        elif operator == "*":
            times, seq = (right, left) if isinstance(right, int) else (left, right)
            if isinstance(times, int) and isinstance(seq, (str, list, tuple)) and len(seq) * times > self.limit:
                raise TemplateError(f"repeats a sequence to {len(seq) * times:,} items")
        elif operator == "**":
            if isinstance(right, int) and right > 0 and isinstance(left, (int, float)) and abs(left) > 1 and (
                    not isinstance(left, int) and right > MAX_BITS or int(abs(left)).bit_length() * right > MAX_BITS):
                raise TemplateError(f"raises to the power {right:,}")
        elif operator == "%" and isinstance(left, str):
            self.size("formats", _format_size(left, right, {}, percent=True))
        return super().call_binop(context, operator, left, right)


def _replaced_size(s: str, old: str, new: str, count: int | None = -1) -> int:
    times = s.count(old)  # len(s) + 1 for ""
    if count is not None and count >= 0:
        times = min(times, count)
    return len(s) + times * len(new)


def _translated_size(s: str, table: Any) -> int:
    longest = max((len(v) for v in table.values() if isinstance(v, str)), default=1) if isinstance(table, Mapping) \
        else 1
    return len(s) * max(longest, 1)


# What a str method that can write more than it is given writes at most, from its arguments.
_STR_SIZES: dict[str, Callable[..., int]] = {
    "ljust": lambda s, width, *_: max(len(s), width), "rjust": lambda s, width, *_: max(len(s), width),
    "center": lambda s, width, *_: max(len(s), width), "zfill": lambda s, width: max(len(s), width),
    "expandtabs": lambda s, tabsize=8: len(s) + s.count("\t") * tabsize,
    "replace": lambda s, old, new, count=-1: _replaced_size(s, old, new, count),
    "join": lambda s, items: _text_size(items) + len(s) * len(items),
    "translate": _translated_size,
}


class _Joins(jinja2.visitor.NodeTransformer):
    """``a ~ b ~ c`` as ``environment.joined(a, b, c)``, which sizes the text before joining it."""

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return nodes.Call(nodes.EnvironmentAttribute("joined"), node.nodes, [], None, None).set_lineno(node.lineno)


@lru_cache(maxsize=8)
def _specials_pattern(names: tuple[str, ...], markers: tuple[str, str] | None) -> re.Pattern[str]:
    """Special tokens (longest first), each with the markers that may touch it."""
    tokens = "|".join(map(re.escape, sorted(names, key=len, reverse=True)))
    if markers is None:
        return re.compile(f"()({tokens})()")
    start, end = map(re.escape, markers)
    return re.compile(f"({start}?)({tokens})({end}?)")


# The names a message's reasoning goes by; transformers hands a template each message's first one
# given as ``reasoning_content`` (what most templates read) and as ``thinking`` (gpt-oss's) unless
# the message names its own.
REASONING = ("reasoning_content", "thinking", "reasoning")


def with_reasoning(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as transformers hands them to a template: reasoning under any of its names is
    there under the name the template reads."""
    out = found
    for i, message in enumerate(found):
        if len(message) <= 2:  # a role and content: the common message, no look-ups
            continue
        reasoning = next((message[key] for key in REASONING if message.get(key) is not None), None)
        if reasoning is not None:
            if out is found:
                out = list(found)
            out[i] = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    return out


def _texts(found: list[dict[str, Any]], tools: list[Any] | None) -> list[str]:
    """Every string a template reads as a record's text: inside its messages (keys too) but their
    roles, and inside its tools."""
    return _strings([tools, *(value for m in found for key, value in m.items() if key != "role")]) + \
        [key for m in found for key in m]


def _free_markers(held: list[str], where: str) -> tuple[str, str]:
    """The first pair of ``MARKERS`` that no string of a record holds."""
    found = next((m for m in MARKERS if not any(m[0] in s or m[1] in s for s in held)), None)
    if found is None:
        raise bad_record(where, "holds every marker tokpack could use for special-token text")
    return found


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


def _mark(text: str, pattern: re.Pattern[str], markers: tuple[str, str], parts: _NameParts) -> str:
    """``text`` with each special token's text inside it wrapped in the markers, and its ends that
    could join another text into one (``_NameParts.ends``)."""
    marked = pattern.sub(lambda m: markers[0] + m.group(2) + markers[1], text)
    head, tail = parts.ends(marked)
    if not head and tail == len(marked):
        return marked
    a, b = markers
    if head > tail:  # the ends overlap: the whole string
        return a + marked + b
    return (a + marked[:head] + b if head else "") + marked[head:tail] + \
        (a + marked[tail:] + b if tail < len(marked) else "")


def _each_string(value: Any, change: Callable[[str], str]) -> Any:
    """``value`` with each string inside it changed (not the keys)."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, Mapping):
        return {key: _each_string(item, change) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_each_string(item, change) for item in value]
    return value


class _NameParts(NamedTuple):
    """What of the special tokens' names a text may hold at its ends and still be joined into a
    name by the text beside it: a proper prefix at its end, a proper suffix at its start, or the
    whole text inside a name."""

    firsts: str  # the characters names start with (a prefix at a text's end starts with one)
    lasts: str  # and end with
    prefixes: frozenset[str]
    suffixes: frozenset[str]
    inner: frozenset[str]
    longest: int

    @classmethod
    def of(cls, names: tuple[str, ...]) -> _NameParts:
        return cls("".join({n[0] for n in names if n}), "".join({n[-1] for n in names if n}),
                   frozenset(n[:k] for n in names for k in range(1, len(n))),
                   frozenset(n[k:] for n in names for k in range(1, len(n))),
                   frozenset(n[i:j] for n in names for i in range(1, len(n)) for j in range(i + 1, len(n))),
                   max(map(len, names), default=0))

    def ends(self, s: str) -> tuple[int, int]:
        """(h, t): ``s[:h]`` the longest start of ``s`` that ends a name, ``s[t:]`` the longest end
        that starts one (h = len(s) + 1 where ``s`` is inside a name); (0, len(s)) where none.
        O(the longest name) a string: only the places a name's first or last character stands."""
        n = len(s)
        if n < self.longest and s in self.inner:
            return n + 1, 0
        head, tail, reach = 0, n, self.longest - 1
        for ch in self.lasts:
            i = s.find(ch, 0, reach)
            while i != -1:
                if s[:i + 1] in self.suffixes:
                    head = max(head, i + 1)
                i = s.find(ch, i + 1, reach)
        for ch in self.firsts:
            i = s.find(ch, max(0, n - reach))
            while i != -1:
                if s[i:] in self.prefixes:
                    tail = min(tail, i)
                i = s.find(ch, i + 1)
        return head, tail

    def joins(self, s: str) -> bool:
        """Whether ``s`` could be joined into a special token by the text beside it."""
        head, tail = self.ends(s)
        return head > 0 or tail < len(s)


def _past_spaces(text: str, at: int) -> int:
    """Where the whitespace from ``at`` on ends."""
    spaces = _SPACES.match(text, at)
    return at if spaces is None else spaces.end()


def _common(a: str, b: str) -> int:
    """The length of the longest common prefix of ``a`` and ``b``: halved by slices, each compared
    in C."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _overlap(tail: str, head: str) -> int:
    """The length of the longest end of ``tail`` that ``head`` begins with: ``tail`` run through
    Knuth-Morris-Pratt's automaton of ``head``'s start, O(their lengths)."""
    pattern = head[:len(tail)]
    fail, k = [0] * len(pattern), 0
    for q in range(1, len(pattern)):
        while k and pattern[q] != pattern[k]:
            k = fail[k - 1]
        k += pattern[q] == pattern[k]
        fail[q] = k
    k = 0
    for ch in tail:
        while k and (k == len(pattern) or ch != pattern[k]):
            k = fail[k - 1]
        k += k < len(pattern) and ch == pattern[k]
    return k


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Spans in order, overlapping ones joined (a generation block inside another is inside it)."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


class _Spans:
    """Spans in order and apart (``_merged``'s), those meeting a stretch found by bisection: a
    conversation of a million turns cut at millions of special tokens stays O(its size)."""

    def __init__(self, spans: list[tuple[int, int]]):
        self.spans, self._ends = spans, [end for _, end in spans]

    def meeting(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The spans that overlap [lo, hi)."""
        i = bisect.bisect_right(self._ends, lo)
        out = []
        while i < len(self.spans) and self.spans[i][0] < hi:
            out.append(self.spans[i])
            i += 1
        return out


def _byte_spans(raw: str, lo: int, spans: list[tuple[int, int]], markers: tuple[str, str] | None) -> tuple[
        str, tuple[tuple[int, int], ...]]:
    """A stretch of the rendered text (starting at ``lo``) without markers, and ``spans`` (in
    order and apart) that fall in it as byte ranges of that text: each boundary's bytes counted
    from the one before, O(stretch)."""

    def clean(text: str) -> str:
        return text if markers is None else text.replace(markers[0], "").replace(markers[1], "")

    one_byte = markers is None and raw.isascii()  # a character a byte: no prefix to encode
    places = [max(0, min(i - lo, len(raw))) for span in spans for i in span]
    if not one_byte:
        done, size = 0, 0
        for k, i in enumerate(places):
            size += utf8_size(raw, done, i) - (0 if markers is None else
                                                3 * (raw.count(markers[0], done, i) + raw.count(markers[1], done, i)))
            places[k], done = size, i
    return clean(raw), tuple((s, e) for s, e in zip(places[::2], places[1::2]) if e > s)


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
        self._parts = _NameParts.of(self._names)
        self._apart = specials_apart(self.specials)  # a rendered text may be encoded whole
        self.max_tokens, self.variables = max_tokens, dict(variables or {})
        self.ordinary = special_text == "ordinary"
        self.generation = bool(GENERATION.search(source))
        self.sha256 = hashlib.sha256(source.encode("utf-8")).hexdigest()

    def describe(self) -> dict[str, Any]:
        return {"renderer": Renderer.TEMPLATE.value, "max_tokens": self.max_tokens, "template_sha256": self.sha256,
                "assistant_mask": "generation" if self.generation else "prefixes",
                "mask_rule": GENERATION_RULE if self.generation else PREFIX_RULE}

    def render(self, found: list[dict[str, Any]], where: str, size: int, prompt: bool = False,
               tools: list[Any] | None = None) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text of ``found`` (and ``tools``) and its generation spans (character
        ranges); ``size``, the characters of the conversation, sets how far the render may go."""
        self.env.start(size)
        # A render's blocks joined a group at a time: a record of a million messages writes
        # millions of small strings, each dozens of bytes of object beside its text.
        blocks: list[str] = []
        joined: list[str] = []
        try:
            for block in self.compiled.generate(messages=found, tools=tools, documents=None,
                                                add_generation_prompt=prompt, **self.variables):
                if " at 0x" in block and _ADDRESS.search(block):
                    raise TemplateError("writes an object's memory address, which differs run to run")
                blocks.append(block)
                if len(blocks) == JOIN_BLOCKS:
                    joined.append("".join(blocks))
                    blocks.clear()
                self.env.written += len(block)
                if self.env.written > self.env.limit:
                    raise TemplateError(f"renders more than {self.env.limit:,} characters")
        except SecurityError as exc:
            raise bad_record(where, f"makes the chat template {self.origin} reach outside its sandbox "
                             f"({exc})") from None
        except Exception as exc:  # a template is code: whatever it raises is this record's error
            raise bad_record(where, f"makes the chat template {self.origin} fail: "
                             f"{type(exc).__name__}: {exc}") from None
        joined.append("".join(blocks))
        return "".join(joined), self.env.spans

    def _prefix_spans(self, found: list[dict[str, Any]], text: str, where: str, size: int,
                      tools: list[Any] | None) -> list[tuple[int, int]]:
        # Two renders a turn (four where it is placed otherwise), each about the whole one's work:
        # a record of thousands of turns is refused before its square is paid.
        steps, turns = self.env.budget - self.env.steps, sum(m["role"] == "assistant" for m in found)
        if 2 * turns * (len(text) + steps) > PREFIX_WORK:
            raise bad_record(where, f"has {turns:,} assistant turns in {len(text):,} rendered characters, too many "
                             f"to find by rendering each turn's prefixes (the chat template {self.origin} has no "
                             "{% generation %} blocks); split the conversation, or mark the assistant's text in "
                             "the template with {% generation %}")
        trailer = self._trailer(found, text, where, size, tools)
        spans = []
        for i, message in enumerate(found):
            if message["role"] != "assistant":
                continue
            before, _ = self.render(found[:i], where, size, prompt=True, tools=tools)
            upto, _ = self.render(found[:i + 1], where, size, tools=tools)
            if upto.startswith(before) and text.startswith(upto):
                start, end = len(before), len(upto)
            else:
                start, end = self._aligned_span(found, i, text, before, upto, where, size, tools) \
                    or self._content_span(found, i, text, where, size, tools)
            spans.append((start, self._stopped(text, start, min(end, trailer))))
        return spans

    def _trailer(self, found: list[dict[str, Any]], text: str, where: str, size: int,
                 tools: list[Any] | None) -> int:
        """Where the text a template writes after the last message whatever it holds begins
        (Phi's end of text, Command-R7B's opening of a chatbot turn): never trained. It is where
        the conversation's render and its render with one more user message part, where that is
        a special token's start and the longer one ends in what the shorter has from there; else
        (an answer written otherwise as the last: gpt-oss's ``<|return|>``, Qwen3's empty think
        block), or where the last message is no assistant's, ``len(text)``."""
        if found[-1]["role"] != "assistant":  # no turn reaches it: no render needed
            return len(text)
        probe = {"role": "user", "content": "".join(_free_markers(_strings(found), where))}
        try:
            more, _ = self.render([*found, probe], where, size, tools=tools)
        except ValueError:  # a template that refuses the probe: nothing found to leave out
            return len(text)
        parted = self._snapped(text, _common(text, more))
        at_special = self.specials and _specials_pattern(self._names, None).match(text, parted)
        return parted if at_special and more.endswith(text[parted:]) else len(text)

    def _snapped(self, text: str, at: int) -> int:
        """``at``, or the start of the special token the template wrote across it."""
        if not self.specials:
            return at
        reach = self._parts.longest
        for m in _specials_pattern(self._names, None).finditer(text, max(0, at - reach), at + reach):
            if m.start(2) < at < m.end(2):
                return m.start(2)
        return at

    def _stopped(self, text: str, start: int, end: int) -> int:
        """A turn's ``end`` no further than the end of text the template wrote first in it (the
        tokenizer's ``eos_token``) and the whitespace after it: the model learns to stop there,
        and not to open what comes next (Command-R7B writes ``<|END_OF_TURN_TOKEN|>`` and then
        the next turn's ``<|START_OF_TURN_TOKEN|>``)."""
        if self._eos is None:
            return end
        found = self._eos.search(text, start, end)
        return end if found is None else min(end, _past_spaces(text, found.end()))

    @cached_property
    def _eos(self) -> re.Pattern[str] | None:
        """The config's ``eos_token`` where it is a special token, as the template writes it (not
        inside the markers that keep a message's text text)."""
        eos = self.variables.get("eos_token")
        if not isinstance(eos, str) or eos not in self.specials:
            return None
        low, high = MARKERS[0][0], MARKERS[-1][1]
        return re.compile(f"(?<![{low}-{high}]){re.escape(eos)}(?![{low}-{high}])")

    def _aligned_span(self, found: list[dict[str, Any]], i: int, text: str, before: str, upto: str, where: str,
                      size: int, tools: list[Any] | None) -> tuple[int, int] | None:
        """Assistant turn ``i`` of a conversation whose template writes a turn otherwise when it
        is the last (an empty think block, a generation prompt that opens one a call never
        closes, a call's text dropped once an answer follows, an end of text after it). Where the
        whole begins with the conversation before the turn (up to what its generation prompt
        writes instead of an end of text): from where it leaves the generation prompt, through
        the longest end of the turn's own render (as the last) that the whole holds where the two
        part. Where it does not (an earlier turn written otherwise once more follows, a system
        message or tools moved to the last user turn): from the generation prompt's last place
        before the turn's own text (or, with no prompt, the longest end of the conversation
        before it that the whole holds there), through as much of what the turn's own render
        writes after its texts as the whole holds there. None where the span does not hold every
        text of the message, as rendering it with each of them marked shows."""
        bare, _ = self.render(found[:i], where, size, tools=tools)
        base = self._snapped(before, _common(before, bare))  # the prompt may replace an end of text
        if _specials_pattern(self._names, None).sub("", bare[base:]).strip():
            return None  # the prompt changes more than the special tokens a render ends with
        prompt, changed = before[base:], self._marked(found[i], found, where)

        def marked_diff() -> tuple[str, int, int]:
            """The whole rendered with the turn's texts marked, and where it first and last differs."""
            marked, _ = self.render([*found[:i], changed, *found[i + 1:]], where, size, tools=tools)
            return marked, _common(text, marked), len(text) - _common(text[::-1], marked[::-1])

        if text.startswith(before[:base]):
            start = base + self._prompt_held(text[base:], prompt)
            parted = _common(text, upto)
            if parted < start:
                return None
            end = parted + _overlap(upto[parted:], text[parted:])
            marked, first, last = marked_diff()
        else:
            marked, first, last = marked_diff()
            if marked == text:
                return None
            head = prompt if prompt in text[:first] else next(
                (m.group(2) for m in _specials_pattern(self._names, None).finditer(prompt)), prompt)
            if head:
                at = text.rfind(head, 0, first)
                start = at + self._prompt_held(text[at:], prompt) if at >= 0 else -1
            else:
                start = self._held_end(text, before, first)
            if start < 0:
                return None
            own, _ = self.render([*found[:i], changed], where, size, tools=tools)
            tail = upto[len(upto) - _common(upto[::-1], own[::-1]):]
            end = last + _common(text[last:], tail)
        if end <= start or (marked != text and not start <= first <= last <= end):
            return None
        return start, self._ended(text, self._snapped(text, end))

    def _held_end(self, text: str, before: str, first: int) -> int:
        """Where the longest end of ``before`` that starts at a special token stands last in
        ``text`` before ``first`` ends, or -1; less the special tokens ``before`` ends with where
        the whole writes none of it (DeepSeek-V3 closes a run of tool results only where no call
        follows)."""
        starts = [m.start(2) for m in _specials_pattern(self._names, None).finditer(before)] if self.specials else []
        while starts:
            lo, hi, found = 0, len(starts), -1  # ends held get shorter as they start later: the first held
            while lo < hi:
                mid = (lo + hi) // 2
                at = text.rfind(before[starts[mid]:], 0, first)
                if at >= 0:
                    found, hi = at + len(before) - starts[mid], mid
                else:
                    lo = mid + 1
            if found >= 0 or before[starts[-1]:].rstrip() not in self.specials:
                return found
            before = before[:starts.pop()]
        return -1

    @staticmethod
    def _marked(message: dict[str, Any], found: list[dict[str, Any]], where: str) -> dict[str, Any]:
        """``message`` with each of its texts (content, reasoning, calls' arguments; not the calls'
        names, which a tool's result may repeat) ending in a character no message holds."""
        marker = _free_markers(_strings(found), where)[0]
        changed = {**message, **{key: _each_string(message[key], lambda s: s + marker)
                                 for key in ("content", *REASONING) if key in message}}
        if "tool_calls" in changed:
            changed["tool_calls"] = [{**call, "function": {**call["function"], "arguments": _each_string(
                call["function"].get("arguments"), lambda s: s + marker)}} if isinstance(call.get("function"), dict)
                else call for call in changed["tool_calls"]]
        return changed

    def _ended(self, text: str, end: int) -> int:
        """A turn's ``end`` past the special token that ends it and the whitespace after it (the
        model learns to stop), where only whitespace comes between and the turn does not end in
        one already."""
        if not self.specials:
            return end
        kept = end
        while kept and text[kept - 1].isspace():  # the turn's own trailing whitespace, not a copy of the text
            kept -= 1
        if any(text.endswith(name, 0, kept) for name in self._names):
            return _past_spaces(text, end)
        ending = _specials_pattern(self._names, None).search(text, end)
        if ending is None or text[end:ending.start(2)].strip():
            return end
        return _past_spaces(text, ending.end(2))

    def _prompt_held(self, text: str, prompt: str) -> int:
        """How much of the generation ``prompt`` the turn written at the start of ``text`` holds:
        all of it (but for whitespace at its end, which an indented template's turn need not
        hold), or up to the end of one of its special tokens or of its whitespace (the rest may
        agree with the turn's own text by chance: QwQ's "<think>" and a call's "<tool_call>")."""
        held = _common(text, prompt)
        if not prompt[held:].strip() or not self.specials:  # all of it, but for its last blank lines
            return held
        ends = [m.end(2) for m in _specials_pattern(self._names, None).finditer(prompt) if m.end(2) <= held]
        return max([*ends, *(k + 1 for k in range(held) if prompt[k].isspace())], default=0)

    def _content_span(self, found: list[dict[str, Any]], i: int, text: str, where: str, size: int,
                      tools: list[Any] | None) -> tuple[int, int]:
        """Assistant turn ``i`` of a conversation its template renders otherwise than its prefixes
        (one that writes the end of text only after the last turn, or moves the system message):
        its content as rendered, found by rendering the whole conversation with a stand-in for it,
        and the special token that ends it where only whitespace comes between."""
        if found[i].get("tool_calls") or not isinstance(found[i].get("content"), str):
            raise bad_record(where, f"is rendered by the chat template {self.origin} differently as a whole than in "
                             f"its first {i + 1} messages, and its assistant turn {i} holds tool calls or parts, which "
                             "cannot be found otherwise; mark the assistant's text in the template with "
                             "{% generation %}")
        stand_in = "".join(_free_markers(_strings(found), where))  # the marked record's markers left out
        swapped, _ = self.render([*found[:i], {**found[i], "content": stand_in}, *found[i + 1:]], where, size,
                                 tools=tools)
        at = swapped.find(stand_in)
        head, tail = swapped[:at], swapped[at + len(stand_in):]
        if at < 0 or stand_in in tail or not (text.startswith(head) and text.endswith(tail)) \
                or len(head) + len(tail) > len(text):
            raise bad_record(where, f"is rendered by the chat template {self.origin} differently as a whole than in "
                             f"its first {i + 1} messages, and its assistant turn {i} cannot be found by putting a "
                             "stand-in in its place either; mark the assistant's text in the template with "
                             "{% generation %}")
        return len(head), self._ended(text, len(text) - len(tail))

    def pieces(self, found: list[dict[str, Any]], where: str, tools: list[Any] | None = None) -> ChatPieces:
        found = with_reasoning(found)

        def each(change: Callable[[str], str]) -> tuple[list[dict[str, Any]], list[Any] | None]:
            """Every string a template reads as the record's text changed: the messages' but their
            roles (templates build tokens of them: '<|' + role + '|>'), and the tools'."""
            return ([{k: v if k == "role" else _each_string(v, change) for k, v in m.items()} for m in found],
                    None if tools is None else _each_string(tools, change))

        markers, held = None, _texts(found, tools)
        form = self.vocab.normal_form
        if form is not None and not all(unicodedata.is_normalized(form, s) for s in held):
            # The tokenizer reads text in its normal form: the record is put in it first, so that
            # the tokens spell the rendered text and the assistant's can be found.
            found, tools = each(functools.partial(unicodedata.normalize, form))
            held = _texts(found, tools)
        typed = _specials_pattern(self._names, None)
        # Special-token text in the record, and a text's end that could join its neighbour (or the
        # template's text) into one, is marked, to stay text.
        if self.ordinary and self.specials and any(typed.search(s) or self._parts.joins(s) for s in held):
            markers = chosen = _free_markers(held, where)
            found, tools = each(lambda text: _mark(text, typed, chosen, self._parts))
        size = sum(map(len, held))
        text, spans = self.render(found, where, size, tools=tools)
        if form is not None and not unicodedata.is_normalized(form, text):
            raise bad_record(where, f"renders text that the tokenizer's {form} normalizer would change (a combining "
                             "mark right after the template's own text), so its tokens would not spell it and the "
                             "assistant's could not be found")
        spans = _merged(spans if self.generation else self._prefix_spans(found, text, where, size, tools))
        if markers is None and self._apart:  # every special token's text in it is the template's
            lead = [self.specials[m.group(2)] for m in typed.finditer(text)]  # no tuple a token held at once
            return ChatPieces([text], [lead], [PieceMask([], 0, _byte_spans(text, 0, spans, None)[1])], marked=True)
        return self._split(text, _Spans(spans), markers)

    def _split(self, text: str, spans: _Spans, markers: tuple[str, str] | None) -> ChatPieces:
        """The rendered text cut at the special tokens the template wrote."""
        out = ChatPieces([], [], [])
        lead, lead_mask, lo = [], [], 0
        for m in _specials_pattern(self._names, markers).finditer(text) if self.specials else ():
            if m.group(1) or m.group(3):  # marked: a message's text, not the template's
                continue
            start, end = m.span(2)
            if start > lo:
                self._add(out, text[lo:start], lo, spans.meeting(lo, start), markers, lead, lead_mask)
                lead, lead_mask = [], []
            lead.append(self.specials[m.group(2)])
            lead_mask.append(int(bool(spans.meeting(start, end))))
            lo = end
        if lo < len(text):
            self._add(out, text[lo:], lo, spans.meeting(lo, len(text)), markers, lead, lead_mask)
            lead, lead_mask = [], []
        self._add(out, "", 0, [], None, lead, lead_mask)
        return out

    @staticmethod
    def _add(out: ChatPieces, raw: str, lo: int, spans: list[tuple[int, int]], markers: tuple[str, str] | None,
             lead: list[int], lead_mask: list[int]) -> None:
        """One text of the rendered text (at ``lo`` in it, its markers still in), with the spans that
        meet it, and its lead into ``out``."""
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
