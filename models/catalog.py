"""The catalog of known target/draft models (models/catalog.json): load it and look names up.

A catalog name may carry a quantization, `NAME:QUANT` (e.g. `qwen2.5-7b-instruct:Q5_K_M`),
choosing another file listed under the entry's `files`. EDGESPEC_CATALOG names a JSON file of further
entries and sets.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from edgespec.errors import EdgeSpecError

HF_PREFIX = "hf:"  # names a Hugging Face Hub repository: hf:ORG/REPO[:FILE]

CATALOG_PATH = Path(__file__).resolve().parent / "catalog.json"
REQUIRED_KEYS = ("name", "role", "repo", "file", "quant", "size_bytes", "license", "use", "pairs_with")


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EdgeSpecError(f"cannot read the model catalog {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("models", []), list):
        raise EdgeSpecError(f"model catalog {path}: want {{\"models\": [...], \"sets\": {{...}}}}")
    return data


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    """The built-in catalog plus a user's own entries and sets from the JSON file EDGESPEC_CATALOG
    names (same format; e.g. another model published as PyPI part wheels)."""
    data = _read(CATALOG_PATH)
    extra = os.environ.get("EDGESPEC_CATALOG")
    if extra:
        more = _read(Path(extra).expanduser())
        data = {**data, "models": data["models"] + more.get("models", []),
                "sets": {**data.get("sets", {}), **more.get("sets", {})}}
    return data


def sets() -> dict[str, list[str]]:
    """Named groups of catalog models that install together, e.g. coder-pair (target + draft)."""
    return copy.deepcopy(_data().get("sets", {}))


@lru_cache(maxsize=1)
def _load() -> tuple[dict[str, Any], ...]:
    data = _data()
    entries = []
    for entry in data["models"]:
        missing = [k for k in REQUIRED_KEYS if k not in entry]
        if missing:
            raise EdgeSpecError(f"catalog entry {entry.get('name')!r} lacks {', '.join(missing)}")
        entry.setdefault("bundled", False)
        entry.setdefault("files", {entry["quant"]: {"file": entry["file"], "size_bytes": entry["size_bytes"]}})
        entries.append(entry)
    return tuple(entries)


def load() -> list[dict[str, Any]]:
    """All catalog entries (copies): name, role ('target' | 'draft'), repo (None when bundled), file,
    quant, size_bytes, license, use, pairs_with, bundled, files ({quant: {file, size_bytes}})."""
    return copy.deepcopy(list(_load()))


def names() -> list[str]:
    return [e["name"] for e in _load()]


def find(name: str) -> dict[str, Any] | None:
    """The entry for `name` or `name:QUANT` (with file/quant/size set for that quantization), else None.

    Raises a one-line error when the name is known but the quantization is not.
    """
    base, _, quant = name.partition(":")
    for entry in _load():
        if entry["name"].lower() != base.lower():
            continue
        entry = copy.deepcopy(entry)
        if not quant:
            return entry
        by_quant = {q.upper(): (q, f) for q, f in entry["files"].items()}
        if quant.upper() not in by_quant:
            raise EdgeSpecError(
                f"catalog model {entry['name']} has no {quant} file; known: {', '.join(entry['files'])}"
            )
        q, f = by_quant[quant.upper()]
        entry.update(quant=q, file=f["file"], size_bytes=f["size_bytes"])
        return entry
    return None


def close_matches(name: str, extra: list[str] | None = None, n: int = 3) -> list[str]:
    """Catalog (and `extra`) names that look like `name`, best first."""
    known = names() + list(sets()) + list(extra or [])
    lower = {k.lower(): k for k in known}
    hits = difflib.get_close_matches(name.lower(), list(lower), n=n, cutoff=0.5)
    return [lower[h] for h in hits]
