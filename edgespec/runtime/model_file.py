"""A GGUF file while a loaded model uses it: what the file was when it was loaded, and a shared
lock on it that tells other programs (`models remove`, the Models tab) the model is in use.

llama.cpp maps the weights into memory, so a loaded model keeps running after its file is deleted
(the space comes back when the last user exits); nothing that runs per request may look at the
file again, which is why its identity is read here, once."""

from __future__ import annotations

import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no advisory locks, so nothing is ever reported in use
    fcntl = None


class ModelFile:
    """Opened at load, closed with the model: `identity` (resolved path, size, mtime) as at load."""

    def __init__(self, path: str | os.PathLike) -> None:
        self._fh = open(path, "rb")  # noqa: SIM115 - held for the model's lifetime, closed by close()
        st = os.fstat(self._fh.fileno())
        self.identity = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
        if fcntl is not None:
            try:
                fcntl.flock(self._fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                pass  # a remover holds it this instant: the model runs all the same

    def close(self) -> None:
        self._fh.close()  # and the lock with it


def in_use(path: str | os.PathLike) -> bool:
    """Whether a loaded model (in any process, this one included) holds `path`'s file."""
    if fcntl is None or not Path(path).is_file():
        return False
    with open(path, "rb") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
    return False
