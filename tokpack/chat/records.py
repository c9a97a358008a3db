"""Chat records read as messages, checked before any rendering.

A record is ``{"messages": [{"role": ..., "content": ...}, ...]}`` (content a string, or for an
assistant nanochat's list of parts ``{"type": "text" | "python" | "python_output", "text": ...}``),
or TRL's ``{"prompt": ..., "completion": ...}`` (each a string, or a list of messages). A
message's other keys (``reasoning_content``, ``name``, ...) are kept for a chat template; keys
whose value is null are dropped, as transformers drops them. Function calling, as transformers
takes it: a record's ``tools`` (a list of function schemas), an assistant's ``tool_calls`` (with
or without content) and ``tool`` messages (a call's result) after it.

See docs/chat.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


PART_TYPES = ("text", "python", "python_output")
ROLES = ("system", "user", "assistant", "tool")  # a tuple: a role may be any value, and unhashable
# Nesting of a message's values at most: a tool call's arguments reach 5 or so, and everything
# that walks a message (marking special-token text, a template's filters) recurses.
MAX_DEPTH = 32


def bad_record(where: str, problem: str) -> ValueError:
    """The one error of a record that is not a good conversation: where it is, and what is wrong."""
    return ValueError(f"{where} {problem}; fix the record, or leave it out with --skip-bad")


def _message(value: Any, where: str, i: int) -> dict[str, Any]:
    # type(...) is dict first: isinstance of an ABC is slow, and json gives dicts.
    if (type(value) is not dict and not isinstance(value, Mapping)) or not isinstance(value.get("role"), str) \
            or ("content" not in value and not calls(value)):
        raise bad_record(where, f"has message {i} without a role and content")
    role, content = value["role"], value.get("content")
    if role not in ROLES:
        raise bad_record(where, f"has message {i} of role {role!r}; the roles are system, user, assistant and tool")
    if "tool_calls" in value and value["tool_calls"] is not None:
        _check_calls(value["tool_calls"], where, i, role)
        if content is None:
            content = ""
    result = role == "tool" and isinstance(content, (list, Mapping))  # a call's result as JSON: a template writes it
    if isinstance(content, list) and role == "assistant":
        for part in content:
            if not ((type(part) is dict or isinstance(part, Mapping)) and part.get("type") in PART_TYPES
                    and isinstance(part.get("text"), str)):
                raise bad_record(where, f"has message {i} with a part that is not {{'type': one of "
                                 f"{', '.join(PART_TYPES)}, 'text': a string}}")
    elif not isinstance(content, str) and not result:
        raise bad_record(where, f"has message {i} ({role}) whose content is {type(content).__name__}, not a string"
                   + (" or a list of parts" if role == "assistant" else ""))
    if _deeper(value, MAX_DEPTH):
        raise bad_record(where, f"has message {i} with values nested more than {MAX_DEPTH} deep")
    if None in value.values():
        return {key: item for key, item in value.items() if item is not None}
    return value


# What json gives besides lists and dicts: skipped by type alone, since isinstance of an ABC is slow.
_SCALARS = frozenset((str, int, float, bool, type(None)))


def _parts(message: dict[str, Any], content: Any) -> bool:
    """Whether ``message`` is an assistant's of nanochat's parts, each just a known type and its text."""
    return (content.__class__ is list and message.get("role") == "assistant"
            and all(p.__class__ is dict and len(p) == 2 and p.get("type") in PART_TYPES and p.get("text").__class__ is str
                    for p in content))


def _deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and mappings more than ``limit`` deep (found without recursion)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if item.__class__ is dict or isinstance(item, Mapping):
            inner = item.values()
        elif isinstance(item, (list, tuple)):
            inner = item
        else:
            continue
        if depth == limit:
            return True
        stack.extend((child, depth + 1) for child in inner if child.__class__ not in _SCALARS)
    return False


def calls(message: Mapping[str, Any]) -> bool:
    """Whether an assistant message calls tools."""
    return bool(message.get("tool_calls"))


def _check_calls(value: Any, where: str, i: int, role: Any) -> None:
    """An assistant's ``tool_calls``: a list of calls, each naming its function, as OpenAI's
    ``{"type": "function", "function": {"name": ..., "arguments": ...}}`` or flat."""
    if role != "assistant":
        raise bad_record(where, f"has message {i} ({role}) with tool_calls; only an assistant calls tools")
    ok = isinstance(value, list) and bool(value)
    for call in value if ok else ():
        function = call.get("function", call) if isinstance(call, Mapping) else None
        ok = ok and isinstance(function, Mapping) and isinstance(function.get("name"), str)
    if not ok:
        raise bad_record(where, f"has message {i} whose tool_calls are not a list of calls, each "
                         "{'function': {'name': ..., 'arguments': ...}}")


def tools(record: Any, where: str) -> list[Any] | None:
    """A record's ``tools`` (function schemas, handed to a chat template), or None."""
    found = record.get("tools") if isinstance(record, Mapping) else None
    if found is None:
        return None
    if not (isinstance(found, list) and all(isinstance(t, Mapping) for t in found)) or _deeper(found, MAX_DEPTH):
        raise bad_record(where, f"has tools that are not a list of function schemas (objects) nested at most "
                         f"{MAX_DEPTH} deep")
    return found


def _turns(value: Any, role: str, where: str, field: str) -> list[Any]:
    """TRL's prompt or completion: a string (one turn of ``role``) or a list of messages."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, list):
        return value
    raise bad_record(where, f"has {field!r} of type {type(value).__name__}, not a string or a list of messages")


def messages(record: Any, where: str) -> list[dict[str, Any]]:
    """The messages of a chat record (``where`` names it in errors), checked: roles known, content
    of the right type, a system message first if any, then user and assistant turns alternating
    from a user turn, and at least one assistant turn with text to train on."""
    if not isinstance(record, Mapping):
        raise bad_record(where, f"is {type(record).__name__}, not a record with 'messages'")
    if "messages" in record:
        raw = record["messages"]
    elif "prompt" in record and "completion" in record:
        raw = _turns(record["prompt"], "user", where, "prompt") + _turns(record["completion"], "assistant", where,
                                                                        "completion")
    else:
        raise bad_record(where, f"has no 'messages' (nor TRL's 'prompt' and 'completion'; found {sorted(record)})")
    if not isinstance(raw, list) or not raw:
        raise bad_record(where, "has an empty conversation" if isinstance(raw, list)
                         else "has 'messages' that is not a list")
    # A message of just a known role and string content, or an assistant's of nanochat's parts, is
    # good as it is: the common cases, found without a call a message.
    found = [m if m.__class__ is dict and len(m) == 2 and ((content := m.get("content")).__class__ is str
                                                           and m.get("role") in ROLES or _parts(m, content))
             else _message(m, where, i) for i, m in enumerate(raw)]
    turns = found[1:] if found[0]["role"] == "system" else found
    roles = [message["role"] for message in turns]
    if roles[::2] != ["user"] * ((len(roles) + 1) // 2) or roles[1::2] != ["assistant"] * (len(roles) // 2):
        _check_order(turns, where)
    if "assistant" not in roles:
        raise bad_record(where, "has no assistant turn, so nothing to train on")
    for message in turns:
        if message["role"] != "assistant" or calls(message):
            continue
        content = message["content"]
        if not (content if isinstance(content, str) else
                "".join(p["text"] for p in content if p["type"] != "python_output")):
            raise bad_record(where, "has an assistant turn with no text to train on")
    return found


def _check_order(turns: list[dict[str, Any]], where: str) -> None:
    """Turns after a system message: from a user turn, user and assistant alternating, and after
    an assistant that calls tools, their results (tool messages), then an assistant again."""
    before: dict[str, Any] | None = None
    for message in turns:
        role = before["role"] if before is not None else None
        allowed = {None: ("user",), "user": ("assistant",), "tool": ("tool", "assistant"),
                   "assistant": ("user", "tool") if before is not None and calls(before) else ("user",)}.get(role, ())
        if message["role"] not in allowed:
            expected = " or ".join(allowed)
            article = "an" if expected.startswith("assistant") else "a"
            raise bad_record(where, f"has a {message['role']} message where {article} {expected} turn comes (a "
                             "system message first, then user and assistant turns alternating, from a user turn; "
                             "tool messages only after an assistant's tool_calls)")
        before = message
