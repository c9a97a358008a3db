"""Options from one source: a frozen config dataclass gives a command's flags and TOML keys.

    python -m tokpack.prepare --config configs/sample.toml --workers 2   # the flag wins over the file

A config is a frozen dataclass per stage, possibly holding another (a ``[model]`` table). Each
field's help (and its choices) live in its metadata (``option(...)``); ``add_options`` makes the
flags from them. ``configs/NAME.toml`` sets any field, the command line overrides the file, and an
unknown key, or a value of the wrong type (in the file even where a flag overrides it), is an error
naming the key, the file and what is expected.

See docs/prepare.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
import types
import typing
import warnings
from pathlib import Path
from typing import Any, TypeVar

from .format import load_json

C = TypeVar("C")


def load_toml(path: str | Path) -> dict[str, Any]:
    """The tables of a TOML config file, as read."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist; pass an existing .toml file")
    try:
        return tomllib.loads(path.read_text("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"config file {path} is not valid TOML ({exc}); fix the file") from None


def _describe(annotation: Any) -> str:
    if dataclasses.is_dataclass(annotation):
        return f"a table of {annotation.__name__} keys"
    if typing.get_origin(annotation) is dict:
        return "a table"
    if typing.get_origin(annotation) in (tuple, list):
        return f"a list of {_describe(typing.get_args(annotation)[0])}"
    names = [a.__name__ for a in typing.get_args(annotation)] or [annotation.__name__]
    spelled = {"NoneType": "none", "bool": "true or false", "int": "an integer", "float": "a number",
               "str": "a string"}
    return " or ".join(spelled.get(n, n) for n in names)


def _checked(annotation: Any, value: Any, key: str, source: str) -> Any:
    """``value`` if it has the type ``annotation`` names, else a ValueError naming key, source and type."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if dataclasses.is_dataclass(annotation) and isinstance(value, dict):
        return from_dict(annotation, value, source, prefix=f"{key}.")
    if origin in (types.UnionType, typing.Union):
        for option in args:
            try:
                return _checked(option, value, key, source)
            except ValueError:
                continue
    elif origin is dict and isinstance(value, dict):
        return dict(value)
    elif origin in (tuple, list) and isinstance(value, (list, tuple)):
        return tuple(_checked(args[0], v, key, source) for v in value)
    elif annotation is type(None) and value is None:
        return value
    elif annotation is bool and isinstance(value, bool):
        return value
    elif annotation is int and type(value) is int and -2**63 <= value < 2**63:
        return value
    elif annotation is float and type(value) in (int, float):
        return float(value)
    elif annotation is str and isinstance(value, str):
        return value
    raise ValueError(f"{key} = {value!r} in {source} is not {_describe(annotation)}; give {key} "
                     f"{_describe(annotation)}" + (" (64-bit)" if annotation is int else ""))


def option(default: Any, help: str, choices: tuple[str, ...] | None = None, **field_args: Any) -> Any:
    """A config field whose help (stating its default) and choices make its command-line flag."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices}, **field_args)


def _moved(cls: type, data: dict[str, Any], source: str) -> dict[str, Any]:
    """``data`` with each top-level key that moved into a table (``cls.MOVED``) put there, with a
    warning: a config written for the old place keeps working for a release."""
    moved = getattr(cls, "MOVED", {})
    if not any(key in moved for key in data):
        return data
    data = {k: dict(v) if k in moved.values() and isinstance(v, dict) else v for k, v in data.items()}
    keys = [k for k in data if k in moved]
    for key in keys:
        table = data.setdefault(moved[key], {})
        if not isinstance(table, dict) or key in table:
            raise ValueError(f"{key} is given both at the top of {source} and in its [{moved[key]}] table; keep the "
                             "one in the table")
        table[key] = data.pop(key)
    tables = sorted({moved[key] for key in keys})
    warnings.warn(f"{', '.join(keys)} at the top of {source} belong{'s' * (len(keys) == 1)} in its "
                  f"{', '.join(f'[{t}]' for t in tables)} table now; the old place is read until the next release",
                  FutureWarning, stacklevel=4)
    return data


def _values(cls: type, data: dict[str, Any], source: str, prefix: str = "") -> dict[str, Any]:
    """``data`` with every key known and every value checked against its annotation."""
    hints = typing.get_type_hints(cls)
    data = _moved(cls, data, source) if not prefix else data
    valid = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in valid:
            raise ValueError(f"unknown key {prefix + key!r} in {source}; valid keys: {', '.join(valid)}")
    return {k: _checked(hints[k], v, prefix + k, source) for k, v in data.items()}


def from_dict(cls: type[C], data: dict[str, Any], source: str, prefix: str = "") -> C:
    """``cls`` from ``data``, every key known and every value checked against its annotation."""
    return cls(**_values(cls, data, source, prefix))


def build_config(cls: type[C], config_path: str | Path | None, overrides: dict[str, Any]) -> C:
    """``cls`` from the TOML file (if any) with every override that is not None applied.

    An override whose name is a field of a nested config (``n_layer`` for ``model``) sets it there.
    """
    values = _moved(cls, load_toml(config_path), str(config_path)) if config_path else {}
    _values(cls, values, str(config_path))  # a wrong value in the file is refused even where a flag replaces it
    hints = typing.get_type_hints(cls)
    for key, value in overrides.items():
        if value is None:
            continue
        if key in hints:
            values[key] = value
            continue
        table = next((name for name, t in hints.items() if dataclasses.is_dataclass(t)
                      and key in {f.name for f in dataclasses.fields(t)}), None)
        if table is None:
            raise ValueError(f"unknown option {key!r}; valid options: {', '.join(f.name for f in dataclasses.fields(cls))}")
        values.setdefault(table, {})[key] = value
    return from_dict(cls, values, str(config_path) if config_path else "the command line")


def default_of(cls: type, name: str) -> Any:
    """A config field's default, so help strings state the signature's value."""
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory()  # type: ignore[misc]


def add_options(p: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    """A ``--flag`` for every field of ``cls`` but ``skip``, typed by its annotation, helped by its
    metadata (or its default); every default is None, so only what is given overrides a config file.
    A boolean is ``--name`` / ``--no-name``; a tuple takes one or more values, and more each time
    its flag is given."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        default = default_of(cls, f.name)
        meta = f.metadata
        shown = "off" if default is False else "on" if default is True else default
        text = meta.get("help", "")
        kwargs: dict[str, Any] = {"help": text if "(default:" in text else f"{text} (default: {shown})".lstrip(),
                                  "default": None, "choices": None if meta.get("choices") is None
                                  else [str(choice) for choice in meta["choices"]]}  # an enum's values, not its reprs
        kind = hints[f.name]
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(kind) in (tuple, list):  # a flag given twice adds to it, never replaces it
            kwargs.update(nargs="+", type=_scalar(typing.get_args(kind)[0]), action="extend")
        else:
            kwargs["type"] = _scalar(kind)
        p.add_argument(f"--{f.name.replace('_', '-')}", **kwargs)


def _scalar(kind: Any) -> Any:
    """The argparse type of an annotation: ``int | None`` parses as int, a table as a JSON object."""
    options = [a for a in typing.get_args(kind) if a is not type(None)] or [kind]
    if typing.get_origin(options[0]) is dict:
        return _json_object
    return options[0] if options[0] in (int, float) else str


def _json_object(raw: str) -> dict[str, Any]:
    try:
        value = load_json(raw, "the option", "")
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{raw!r} is not a JSON object (give '{{\"key\": value}}')")
    return value
