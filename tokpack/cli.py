"""What every ``python -m tokpack.<tool>`` shares: the one-line error policy, parsers, tables.

    python -m tokpack.verify data/sample      # any tool: a user error is one line and exit 2

A user error is an exception of ``USER_ERRORS``: tokpack raises ``ValueError`` (or
``FileNotFoundError``, an ``OSError``) with the value, the file and the fix in its message, and the
operating system raises ``OSError`` for a file it cannot read or write. ``run_cli`` turns one into a
``tokpack: ...`` line on stderr and exit code 2; the torchrun ranks of a prepare run share it
with ``error_line``.

See docs/bad-input.md.
"""

from __future__ import annotations

import argparse
import errno
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from .storage import scrub

# The one definition of a user error: it becomes one line, never a traceback.
USER_ERRORS: tuple[type[Exception], ...] = (ValueError, OSError)


# The fix for the operating system's errors that a user can act on, by errno.
_OS_FIXES = {
    errno.EACCES: "give this user access to it (chmod, chown) or leave it out",
    errno.EPERM: "give this user access to it (chmod, chown) or leave it out",
    errno.ENOSPC: "free space on that disk or choose an --out-dir on another one; nothing was published",
    errno.EDQUOT: "free space within your quota or choose an --out-dir elsewhere; nothing was published",
    errno.EROFS: "choose an --out-dir on a writable file system",
}


def error_line(exc: BaseException) -> str:
    """A user error's message, with the file and the fix an OSError leaves out, and no URL's
    credentials, whoever wrote it."""
    return scrub(_message(exc))


def _message(exc: BaseException) -> str:
    message = str(exc)
    if not isinstance(exc, OSError):
        return message
    filename = getattr(exc, "filename", None)
    if filename and str(filename) not in message:
        message = f"{message}: {filename}"
    fix = _OS_FIXES.get(exc.errno) if exc.errno is not None else None
    if fix and fix not in message:
        message = f"{message}; {fix}"
    return message


def _show_warning(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
    print(f"tokpack: warning: {scrub(str(message))}", file=sys.stderr)


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that a run cleans up as on Ctrl-C."""


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated


def run_cli(body: Callable[[], int | None]) -> int:
    """Run a CLI body; a user error becomes one ``tokpack: ...`` line and exit code 2.

    Warnings print as one ``tokpack: warning: ...`` line, without the source line a library
    user would want. SIGTERM cleans up like Ctrl-C and exits 143.
    """
    previous, warnings.showwarning = warnings.showwarning, _show_warning
    main_thread = threading.current_thread() is threading.main_thread()
    previous_term = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        return body() or 0
    except USER_ERRORS as exc:
        print(f"tokpack: {error_line(exc)}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print("tokpack: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    except Terminated:
        print("tokpack: terminated", file=sys.stderr)
        raise SystemExit(143) from None
    finally:
        warnings.showwarning = previous
        if main_thread:
            signal.signal(signal.SIGTERM, previous_term)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not the whole usage block: what is wrong, and where the options are listed.
        self.exit(2, f"tokpack: {self.prog}: {message}; see {self.prog} --help\n")


def parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """An argparse parser whose description is the tool module's docstring; ``prog`` is a tool
    name (``prepare``) or a whole command (``python scripts/train_gpt.py``)."""
    return _Parser(
        prog=prog if " " in prog else f"python -m tokpack.{prog}",
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
