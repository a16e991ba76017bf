"""Writing an output file whole or not at all: a temporary file beside it, renamed into place."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from edgespec.runtime.errors import EdgeSpecError


@contextmanager
def atomic_output(dst: Path, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path next to dst; on success fsync and rename it to dst, else delete it."""
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
        os.replace(tmp, dst)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise EdgeSpecError(f"could not write {dst}: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
