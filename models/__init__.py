"""Where models come from: a local .gguf path or a bundled short name (resolve())."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from edgespec.errors import EdgeSpecError
from models.bundled import BUNDLED, DEFAULT_TARGET, bundled_path

MODELS_DIR = Path(__file__).resolve().parent

__all__ = ["BUNDLED", "DEFAULT_TARGET", "MODELS_DIR", "bundled_path", "resolve"]


def resolve(name: str) -> Path:
    """Turn what a user typed into a local GGUF path.

    Accepts a path to a .gguf file, a bundled short name (smollm2-135m, gemma3-270m), or a file
    name inside models/. Unknown names get a one-line error with the closest known names.
    """
    if not name or not name.strip():
        raise EdgeSpecError("no model named")
    name = name.strip()
    if name in BUNDLED:
        return bundled_path(name)
    p = Path(os.path.expanduser(name))
    if p.exists() or p.suffix == ".gguf" or os.sep in name:
        if not p.exists():
            raise EdgeSpecError(f"model file not found: {p}")
        return p
    local = MODELS_DIR / name
    if local.is_file():
        return local
    known = list(BUNDLED) + sorted(f.name for f in MODELS_DIR.glob("*.gguf"))
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.4)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(known)}"
    raise EdgeSpecError(f"unknown model {name!r}{hint}")
