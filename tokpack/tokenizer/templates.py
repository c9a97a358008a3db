"""A chat template's text, as a tokenizer folder or a file holds it: no jinja2 needed to read one.

See docs/chat.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..format import load_json, read_file

TEMPLATE_BYTES = 1 << 20  # a template file's size at most


def template_source(settings: Mapping[str, Any], where: str) -> str | None:
    """The chat template a tokenizer config names (``chat_template``: a string, or a list of named
    templates, of which "default" is used), or None."""
    found = settings.get("chat_template")
    if found is None or isinstance(found, str):
        return found
    listed = found if isinstance(found, list) else []
    named = {t.get("name"): t.get("template") for t in listed if isinstance(t, Mapping)}
    if isinstance(named.get("default"), str):
        return named["default"]
    raise ValueError(f"{where} has a chat_template that is not a template nor a list holding one named 'default'; "
                     "pass the template with --chat-template FILE")


def refuse_links_out(path: Path, what: str) -> None:
    """Refuse ``path`` where it is a link to a file outside its folder. A template's text and a
    config's special tokens become training data: a link in a downloaded folder to a file of the
    user's (a key, a password file) would copy that file into the tokens. A Hugging Face cache's
    snapshot files are links into the ``blobs`` folder of the same repository, and are read."""
    if not path.is_symlink():
        return
    target, folder = path.resolve(), path.parent.resolve()
    snapshots = folder.parent
    inside = [folder]
    if snapshots.name == "snapshots" and snapshots.parent.name.startswith(("models--", "datasets--")):
        inside.append(snapshots.parent / "blobs")
    if not any(target.is_relative_to(place) for place in inside):
        raise ValueError(f"{what} {path} is a link to {target}, outside its folder; a folder's files are its own: "
                         "copy the file in, or name the file itself")


def read_template(path: Path) -> str:
    """The template in a file: a tokenizer_config.json's ``chat_template``, or a template's text."""
    fix = "pass a .jinja template or a tokenizer_config.json that holds one"
    refuse_links_out(path, "chat template")
    raw = read_file(path, "chat template", fix, TEMPLATE_BYTES)
    if path.suffix != ".json":
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"chat template {path} is not UTF-8 text; {fix}") from None
    settings = load_json(raw, str(path), fix)
    source = template_source(settings, str(path)) if isinstance(settings, Mapping) else None
    if source is None:
        raise ValueError(f"{path} holds no chat_template; {fix}")
    return source
