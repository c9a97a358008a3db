"""Chat records read as messages, checked before any rendering.

A record is ``{"messages": [{"role": ..., "content": ...}, ...]}`` (content a string, or for an
assistant nanochat's list of parts ``{"type": "text" | "python" | "python_output", "text": ...}``),
or TRL's ``{"prompt": ..., "completion": ...}`` (each a string, or a list of messages). A
message's other keys (``reasoning_content``, ``name``, ...) are kept for a chat template; keys
whose value is null are dropped, as transformers drops them.

See docs/chat.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


PART_TYPES = ("text", "python", "python_output")
ROLES = ("system", "user", "assistant")  # a tuple: a role may be any value, and unhashable
# Nesting of a message's values at most: a tool call's arguments reach 5 or so, and everything
# that walks a message (marking special-token text, a template's filters) recurses.
MAX_DEPTH = 32


def bad_record(where: str, problem: str) -> ValueError:
    """The one error of a record that is not a good conversation: where it is, and what is wrong."""
    return ValueError(f"{where} {problem}; fix the record, or leave it out with --skip-bad")


def _message(value: Any, where: str, i: int) -> dict[str, Any]:
    # type(...) is dict first: isinstance of an ABC is slow, and json gives dicts.
    if (type(value) is not dict and not isinstance(value, Mapping)) or not isinstance(value.get("role"), str) \
            or "content" not in value:
        raise bad_record(where, f"has message {i} without a role and content")
    role, content = value["role"], value["content"]
    if role not in ROLES:
        raise bad_record(where, f"has message {i} of role {role!r}; the roles are system, user and assistant")
    if isinstance(content, list) and role == "assistant":
        for part in content:
            if not ((type(part) is dict or isinstance(part, Mapping)) and part.get("type") in PART_TYPES
                    and isinstance(part.get("text"), str)):
                raise bad_record(where, f"has message {i} with a part that is not {{'type': one of "
                                 f"{', '.join(PART_TYPES)}, 'text': a string}}")
    elif not isinstance(content, str):
        raise bad_record(where, f"has message {i} ({role}) whose content is {type(content).__name__}, not a string"
                   + (" or a list of parts" if role == "assistant" else ""))
    if _deeper(value, MAX_DEPTH):
        raise bad_record(where, f"has message {i} with values nested more than {MAX_DEPTH} deep")
    if None in value.values():
        return {key: item for key, item in value.items() if item is not None}
    return value


def _deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and mappings more than ``limit`` deep (found without recursion)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, tuple, Mapping)):
            if depth == limit:
                return True
            stack.extend((inner, depth + 1) for inner in (item.values() if isinstance(item, Mapping) else item))
    return False


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
    # A message of just a known role and string content is good as it is: the common case, found
    # without a call a message.
    found = [m if m.__class__ is dict and len(m) == 2 and m.get("content").__class__ is str and m.get("role") in ROLES
             else _message(m, where, i) for i, m in enumerate(raw)]
    turns = found[1:] if found[0]["role"] == "system" else found
    roles = [message["role"] for message in turns]
    if roles[::2] != ["user"] * ((len(roles) + 1) // 2) or roles[1::2] != ["assistant"] * (len(roles) // 2):
        _out_of_order(roles, where)
    if len(roles) < 2:
        raise bad_record(where, "has no assistant turn, so nothing to train on")
    for message in turns[1::2]:
        content = message["content"]
        if not (content if isinstance(content, str) else
                "".join(p["text"] for p in content if p["type"] != "python_output")):
            raise bad_record(where, "has an assistant turn with no text to train on")
    return found


def _out_of_order(roles: list[str], where: str) -> None:
    for i, role in enumerate(roles):
        expected = "user" if i % 2 == 0 else "assistant"
        if role != expected:
            article = "an" if expected == "assistant" else "a"
            raise bad_record(where, f"has a {role} message where {article} {expected} turn comes (a system message "
                             "first, then user and assistant turns alternating, from a user turn)")
