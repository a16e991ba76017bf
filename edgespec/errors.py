"""The one exception type users see: its message is a complete, single-line explanation."""

from __future__ import annotations

import sys
from collections.abc import Callable


class EdgeSpecError(Exception):
    """A problem with the user's input or environment, reported as one line without a traceback."""


def first_line(exc: BaseException) -> str:
    """The first non-blank line of an exception's message (its type's name if it has none), for
    wrapping a library's error into a one-line EdgeSpecError."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


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
