"""The one exception type users see: its message is a complete, single-line explanation."""

from __future__ import annotations

import sys
from collections.abc import Callable


class EdgeSpecError(Exception):
    """A problem with the user's input or environment, reported as one line without a traceback."""


def one_line(exc: BaseException, *, typed: bool = False, limit: int | None = None) -> str:
    """An exception's message as one line, never a traceback: its words joined by single spaces
    (its type's name when it has no message). `typed` names the type first for anything but an
    EdgeSpecError (whose message is written for the user), as the UI and the server's 500s show an
    unexpected error; `limit` cuts a long message (an HTTP error page) to that many characters."""
    text = " ".join(str(exc).split())
    if not text:
        return type(exc).__name__
    if typed and not isinstance(exc, EdgeSpecError):
        text = f"{type(exc).__name__}: {text}"
    return text if limit is None or len(text) <= limit else text[:limit] + "..."


def run_command(command: Callable[[], int | None]) -> int:
    """Run a command-line entry point: an EdgeSpecError becomes `error: <message>` on stderr and
    exit status 1, Ctrl-C becomes `interrupted` and status 130; never a traceback for either."""
    try:
        return command() or 0
    except EdgeSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
