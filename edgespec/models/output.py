"""Writing an output file whole or not at all: a temporary file beside it, renamed into place."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from edgespec.runtime.errors import EdgeSpecError

# What a path that exists and is not a regular file is, for the message that refuses it.
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"))


def check_output(dst: Path) -> None:
    """Refuse an output path that exists and is not a regular file (followed through symlinks): the
    rename into place would replace it, and `/dev/null` replaced by a file breaks the machine for
    every program (as root, rename into /dev succeeds)."""
    try:
        mode = os.stat(dst).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:  # a name too long, a folder this user may not look into, a symlink loop
        raise EdgeSpecError(f"cannot use the output path {dst}: {exc.strerror or exc}") from None
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    raise EdgeSpecError(f"the output path {dst} exists and is {kind}, not a file; choose another output path")


@contextmanager
def atomic_output(dst: Path, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path next to dst; on success fsync and rename it to dst, else delete it.
    An existing dst that is not a regular file (a device, FIFO, socket or folder) is refused first."""
    check_output(dst)
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=dst.name + ".tmp-", suffix=suffix, dir=dst.parent)
    except OSError as exc:  # e.g. a read-only folder, or one such as /proc or /sys that takes no new files
        raise EdgeSpecError(f"cannot create the output file {dst} ({exc.strerror or exc}); choose a writable folder") from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; the output should look like any new file
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        check_output(dst)  # made in the meantime (the write may take minutes)
        os.replace(tmp, dst)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise EdgeSpecError(f"could not write {dst}: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
