"""The one exception type users see: its message is a complete, single-line explanation."""

from __future__ import annotations

import os
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


class OutputError(EdgeSpecError):
    """Standard output cannot be written (a full disk, /dev/full, an I/O error, a closed stream)."""


class _CheckedStdout:
    """sys.stdout whose write errors are an OutputError (one line, exit status 1) instead of an
    OSError traceback; a reader that left (BrokenPipeError) stays itself: run_command ends quietly."""

    def __init__(self, stream) -> None:  # noqa: ANN001 - any text stream
        self._stream = stream

    def _guard(self, call: Callable, *args):  # noqa: ANN202
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputError(f"cannot write to standard output: {exc.strerror or exc}") from None

    def write(self, text: str) -> int:
        return self._guard(self._stream.write, text)

    def flush(self) -> None:
        self._guard(self._stream.flush)

    def __getattr__(self, name: str):  # noqa: ANN204 - isatty, fileno, encoding, buffer, ...
        return getattr(self._stream, name)


_closed: set[str] | None = None  # the standard streams that were closed when the process started


def standard_streams() -> set[str]:
    """Make the standard streams safe to use; the names of those closed at start ('stdin', 'stdout',
    'stderr'). A closed descriptor 0, 1 or 2 gets /dev/null, so that no file opened later takes its
    number (llama.cpp's log or our output would land in a model file), and Python's None stream a
    file on it: errors are then lost with a closed stderr, never written into stdout."""
    global _closed
    if _closed is None:
        _closed = set()
        for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
            if getattr(sys, name) is not None:
                continue
            _closed.add(name)
            try:
                os.fstat(fd)
            except OSError:  # still closed: reserve the number
                null = os.open(os.devnull, os.O_RDWR)
                if null != fd:
                    os.dup2(null, fd)
                    os.close(null)
            setattr(sys, name, open(fd, mode, closefd=False))  # noqa: SIM115 - lives as long as the process
    return _closed


def require_stdout() -> None:
    """A command whose result is its standard output refuses to run with it closed (`>&-`): the
    result would be lost while the command said it succeeded."""
    if "stdout" in standard_streams():
        raise EdgeSpecError("standard output is closed (>&-), so the output would be lost; "
                            "redirect it to a file, or to /dev/null to discard it")


def _quiet_stdout() -> None:
    """Point descriptor 1 at /dev/null: output still buffered would fail again at exit."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)


def run_command(command: Callable[[], int | None], *, output: bool = True) -> int:
    """Run a command-line entry point: an EdgeSpecError becomes `error: <message>` on stderr and
    exit status 1, Ctrl-C becomes `interrupted` and status 130; never a traceback for either.
    `output`: the command's result is its standard output, so a closed one is refused (`require_stdout`).
    A full or failing standard output is an error (status 1); a reader that left (`| head`) ends the
    command quietly with status 141, as SIGPIPE ends Unix tools (Python ignores SIGPIPE, so sockets
    get errors instead: the same status by hand)."""
    standard_streams()
    outer = not isinstance(sys.stdout, _CheckedStdout)
    if outer:
        sys.stdout = _CheckedStdout(sys.stdout)
    try:
        if output:
            require_stdout()
        code = command() or 0
        sys.stdout.flush()
        return code
    except EdgeSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if isinstance(exc, OutputError):
            _quiet_stdout()
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _quiet_stdout()
        return 141
    finally:
        if outer and isinstance(sys.stdout, _CheckedStdout):
            sys.stdout = sys.stdout._stream
