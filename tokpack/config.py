"""Configs and CLI plumbing shared by every ``python -m tokpack.<tool>``.

A config is a frozen dataclass per stage. ``configs/NAME.toml`` sets any of its fields, the
command line overrides the file, and an unknown key is an error naming the key, the file and the
valid keys.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tomllib
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

C = TypeVar("C")


def load_toml(path: str | Path, cls: type) -> dict[str, Any]:
    """The keys of a TOML config for the dataclass ``cls``, refusing any it does not have."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist; pass an existing .toml file")
    try:
        data = tomllib.loads(path.read_text("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"config file {path} is not valid TOML ({exc}); fix the file") from None
    valid = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in valid:
            raise ValueError(f"unknown key {key!r} in {path}; valid keys: {', '.join(valid)}")
    return data


def build_config(cls: type[C], config_path: str | Path | None, overrides: dict[str, Any]) -> C:
    """``cls`` from the TOML file (if any) with every override that is not None applied."""
    values = load_toml(config_path, cls) if config_path else {}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return cls(**values)


def default_of(cls: type, name: str) -> Any:
    """A config field's default, so help strings state the signature's value."""
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory()  # type: ignore[misc]


def _show_warning(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
    print(f"tokpack: warning: {message}", file=sys.stderr)


def run_cli(body: Callable[[], int | None]) -> int:
    """Run a CLI body; a user error becomes one ``tokpack: ...`` line and exit code 2.

    Warnings print as one ``tokpack: warning: ...`` line, without the source line a library
    user would want.
    """
    previous, warnings.showwarning = warnings.showwarning, _show_warning
    try:
        return body() or 0
    except (ValueError, OSError) as exc:
        message = str(exc)
        if isinstance(exc, OSError) and exc.filename and str(exc.filename) not in message:
            message = f"{message}: {exc.filename}"
        print(f"tokpack: {message}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print("tokpack: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        warnings.showwarning = previous


def parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """An argparse parser whose description is the tool module's docstring."""
    return argparse.ArgumentParser(
        prog=f"python -m tokpack.{prog}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_config_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="TOML", help="a configs/*.toml file; options given here override it")


def table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    def cell(value: Any) -> str:
        return f"{value:,.3g}" if isinstance(value, float) else f"{value:,}" if isinstance(value, int) else str(value)

    cells = [[cell(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths))) for r in cells]
    return "\n".join(lines)
