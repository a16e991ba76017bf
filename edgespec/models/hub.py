"""Hugging Face Hub downloads into huggingface_hub's own cache (never into the repo).

A Hub model is named `hf:ORG/REPO` or `hf:ORG/REPO:FILE.gguf`. Downloads are resumable within a
run (huggingface_hub retries a dropped connection with a Range request), show a tqdm bar and/or
call `progress(done_bytes, total_bytes)`, and are checked after the fact: the size and sha256 the
Hub lists, then the GGUF header and tensor extent. A file that fails any check is removed from the
cache, so nothing half-written is ever found again as a model. HF_ENDPOINT, HF_HUB_CACHE/HF_HOME
and HF_HUB_OFFLINE are read at call time, so they work even when set after import. Every request
to the Hub waits at most EDGESPEC_HUB_TIMEOUT seconds (default 30) to connect and between bytes,
so an endpoint that accepts and never answers ends in one line instead of a hang.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import HfApi, constants, get_session, hf_hub_download, try_to_load_from_cache
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from tqdm.auto import tqdm

try:  # huggingface_hub 2.x talks through httpx2, 1.x through httpx
    from httpx2 import HTTPError as TransportError
    from httpx2 import TimeoutException
except ImportError:
    from httpx import HTTPError as TransportError
    from httpx import TimeoutException

from edgespec.models.catalog import HF_PREFIX
from edgespec.models.inspect import read_header
from edgespec.runtime import env
from edgespec.runtime.errors import EdgeSpecError, one_line

Progress = Callable[[int, int], None]
REVISION = "main"
# Which file to take when a repo is named without one (bartowski-style repos hold a dozen quants).
QUANT_PREFERENCE = ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q8_0", "Q6_K", "Q4_0", "Q5_0", "Q4_1")
_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<idx>\d{5})-of-(?P<n>\d{5})\.gguf$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_REPO_PART = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")  # the Hub's rule for ORG and REPO
_HASH_CHUNK = 8 << 20
TIMEOUT_ENV = "EDGESPEC_HUB_TIMEOUT"
DEFAULT_TIMEOUT_S = 30.0
_timeout_s = DEFAULT_TIMEOUT_S  # what _cap_timeout applies; set by _bound_requests() before each use of the Hub


@dataclass(frozen=True)
class HubFile:
    repo: str
    file: str
    size: int | None  # bytes, as listed by the Hub
    sha256: str | None  # LFS files only


def endpoint() -> str:
    """The Hub URL: HF_ENDPOINT as set now, else huggingface_hub's default."""
    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def timeout_s() -> float:
    """Seconds a Hub request may wait to connect or for its next bytes: EDGESPEC_HUB_TIMEOUT, else 30."""
    return env.number(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)


def _cap_timeout(request) -> None:  # noqa: ANN001 - an httpx(2) Request
    """A request hook: huggingface_hub asks for no timeout on some calls (model_info) and a minute
    per retry on others; none of them may wait longer than the configured timeout."""
    asked = request.extensions.get("timeout") or {}
    capped = {k: _timeout_s if asked.get(k) is None else min(asked[k], _timeout_s)
              for k in ("connect", "read", "write", "pool")}
    request.extensions = {**request.extensions, "timeout": capped}


def _bound_requests() -> float:
    """Put the timeout on huggingface_hub's shared HTTP client (it may have been recreated since)."""
    global _timeout_s
    _timeout_s = timeout_s()
    client = get_session()
    hooks = client.event_hooks
    if _cap_timeout not in hooks["request"]:
        client.event_hooks = {**hooks, "request": [*hooks["request"], _cap_timeout]}
    return _timeout_s


def _timed_out(exc: BaseException | None) -> bool:
    """Whether `exc` (or what it wraps) is a connect/read timeout."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, TimeoutException | TimeoutError):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _no_answer(spec: str) -> str:
    return (f"the Hub at {endpoint()} did not answer within {_timeout_s:g} s ({TIMEOUT_ENV}) and {spec} is not cached; "
            f"check the connection or HF_ENDPOINT, or raise {TIMEOUT_ENV}")


def cache_dir() -> Path:
    """huggingface_hub's cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE).expanduser()


def offline() -> bool:
    """True when HF_HUB_OFFLINE (or huggingface_hub's own offline flag) forbids network access."""
    env = os.environ.get("HF_HUB_OFFLINE", "").upper() in constants.ENV_VARS_TRUE_VALUES
    return env or constants.HF_HUB_OFFLINE


def parse_spec(spec: str) -> tuple[str, str | None]:
    """'hf:ORG/REPO[:FILE]' -> (repo id, file name or None)."""
    body = spec[len(HF_PREFIX):] if spec.startswith(HF_PREFIX) else spec
    repo, _, file = body.partition(":")
    parts = repo.split("/")
    if len(parts) != 2 or not all(_REPO_PART.match(p) and ".." not in p and "--" not in p for p in parts):
        raise EdgeSpecError(f"bad Hub model name {spec!r}; expected hf:ORG/REPO or hf:ORG/REPO:FILE.gguf "
                            "(ORG and REPO: letters, digits, '-', '_' and '.')")
    # FILE is a path inside the repo: it must stay inside it (and inside the cache's snapshot folder)
    if file and (":" in file or "\\" in file or any(not seg or seg in (".", "..") or not seg.isprintable()
                                                     for seg in file.split("/"))):
        raise EdgeSpecError(f"bad file name {file!r} in Hub model name {spec!r}: a file path inside the repo "
                            "has no ':', '\\', '.' or '..' parts")
    return repo, (file or None)


def _split_parts(name: str) -> list[str]:
    """All part names of a split GGUF (NAME-00001-of-0000N.gguf), or just [name]."""
    m = _SPLIT.match(name)
    if not m:
        return [name]
    n = int(m["n"])
    return [f"{m['stem']}-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]


def _is_model_file(name: str) -> bool:
    base = name.rsplit("/", 1)[-1].lower()
    if not base.endswith(".gguf") or base.startswith("mmproj"):
        return False
    m = _SPLIT.match(name)
    return m is None or int(m["idx"]) == 1


# ---- what is already in the cache ------------------------------------------------------------

def _repo_dir(repo: str) -> Path:
    return cache_dir() / ("models--" + repo.replace("/", "--"))


def _cached_file(repo: str, file: str, revision: str = REVISION) -> Path | None:
    hit = try_to_load_from_cache(repo, file, cache_dir=str(cache_dir()), revision=revision)
    if isinstance(hit, str) and os.path.isfile(hit):
        return Path(hit)
    return None


def cached(spec: str) -> Path | None:
    """The cached GGUF for a Hub name (no network), or None. Without FILE, the preferred quant."""
    repo, file = parse_spec(spec)
    if file:
        hit = _cached_file(repo, file)
        # A split model is usable only with every part beside the first.
        return hit if hit is not None and all((hit.parent / n).is_file() for n in _split_parts(file)) else None
    ref = _repo_dir(repo) / "refs" / REVISION
    if not ref.is_file():
        return None
    snap = _repo_dir(repo) / "snapshots" / ref.read_text().strip()
    names = sorted(str(p.relative_to(snap)) for p in snap.rglob("*.gguf") if p.is_file())
    names = [n for n in names if _is_model_file(n)]
    return snap / _pick(names) if names else None


def installed() -> list[dict]:
    """GGUF models in the HF cache: spec, repo, file, path, size_bytes (all parts of a split model)."""
    out: dict[tuple[str, str], dict] = {}
    root = cache_dir()
    for repo_dir in sorted(root.glob("models--*")) if root.is_dir() else []:
        repo = repo_dir.name[len("models--"):].replace("--", "/")
        ref = repo_dir / "refs" / REVISION
        current = ref.read_text().strip() if ref.is_file() else None
        for snap in sorted((repo_dir / "snapshots").glob("*"), key=lambda s: s.name != current):
            for p in sorted(snap.rglob("*.gguf")):
                rel = str(p.relative_to(snap))
                if not p.is_file() or not _is_model_file(rel) or (repo, rel) in out:
                    continue
                parts = [snap / n for n in _split_parts(rel)]
                out[(repo, rel)] = {
                    "spec": f"{HF_PREFIX}{repo}:{rel}", "repo": repo, "file": rel, "path": p,
                    "size_bytes": sum(q.stat().st_size for q in parts if q.is_file()),
                }
    return list(out.values())


def remove(spec: str) -> list[Path]:
    """Delete a Hub model's files from the cache (all snapshots; blobs nothing else points to)."""
    repo, file = parse_spec(spec)
    snaps = _repo_dir(repo) / "snapshots"
    if file:
        names = set(_split_parts(file))
    else:
        names = {e["file"] for e in installed() if e["repo"] == repo}
        names = {part for n in names for part in _split_parts(n)}
    pointers = [snap / n for snap in (snaps.iterdir() if snaps.is_dir() else []) for n in sorted(names)
                if (snap / n).is_symlink() or (snap / n).is_file()]
    if not pointers:
        raise EdgeSpecError(f"{spec} is not in the Hugging Face cache ({cache_dir()})")
    for p in pointers:
        _discard(p)
    return pointers


def _discard(pointer: Path) -> None:
    """Remove a snapshot entry and its blob unless another snapshot entry still points to it."""
    blob = pointer.resolve()
    pointer.unlink(missing_ok=True)
    if blob == pointer:
        return
    snaps = blob.parent.parent / "snapshots"
    still_used = snaps.is_dir() and any(p.is_symlink() and p.resolve() == blob for p in snaps.rglob("*"))
    if not still_used:
        blob.unlink(missing_ok=True)


# ---- talking to the Hub ----------------------------------------------------------------------

def _remote_files(repo: str) -> tuple[str | None, list[HubFile]]:
    """(commit sha, files) of `repo` at main, with sizes and LFS sha256."""
    info = HfApi(endpoint=endpoint()).model_info(repo, revision=REVISION, files_metadata=True)
    files = [
        HubFile(repo, s.rfilename, s.lfs.size if s.lfs else s.size, s.lfs.sha256 if s.lfs else None)
        for s in info.siblings or []
    ]
    return info.sha, files


def _pick(names: list[str]) -> str:
    if len(names) == 1:
        return names[0]
    for quant in QUANT_PREFERENCE:
        hits = [n for n in names if quant.lower() in n.lower()]
        if hits:
            return hits[0]
    return names[0]


def _choose(spec: str, repo: str, file: str | None, files: list[HubFile]) -> list[HubFile]:
    by_name = {f.file: f for f in files}
    ggufs = [f.file for f in files if _is_model_file(f.file)]
    if not ggufs:
        listing = ", ".join(sorted(by_name)[:12]) or "nothing"
        raise EdgeSpecError(
            f"{HF_PREFIX}{repo} has no .gguf model files (it has: {listing}); look for a -GGUF repo of this model"
        )
    if file is None:
        file = _pick(ggufs)
    elif file not in by_name:
        close = difflib.get_close_matches(file, ggufs, n=3, cutoff=0.4)
        hint = f"did you mean {', '.join(close)}?" if close else f"it has: {', '.join(ggufs[:12])}"
        raise EdgeSpecError(f"{HF_PREFIX}{repo} has no file {file}; {hint}")
    elif not file.lower().endswith(".gguf"):
        raise EdgeSpecError(f"{spec}: {file} is not a .gguf file; GGUF files here: {', '.join(ggufs[:12])}")
    parts = _split_parts(file)
    missing = [p for p in parts if p not in by_name]
    if missing:
        raise EdgeSpecError(f"split model {file} is incomplete on the Hub: missing {', '.join(missing)}")
    return [by_name[n] for n in parts]


def _bar_class(desc: str, progress: Progress | None, show: bool, offset: int, grand_total: int,
               used: list[bool]) -> type:
    """A tqdm class for huggingface_hub's downloader that also reports to `progress`."""

    class _Bar(tqdm):
        def __init__(self, *args, **kwargs) -> None:
            kwargs.pop("name", None)
            kwargs["disable"] = not show
            kwargs["desc"] = desc  # huggingface_hub would show the CDN URL
            kwargs.setdefault("file", sys.stderr)
            super().__init__(*args, **kwargs)
            self._done = int(kwargs.get("initial") or 0)
            used.append(True)
            self._report()

        def update(self, n: float | None = 1) -> bool | None:
            self._done += int(n or 0)
            out = super().update(n)
            self._report()
            return out

        def _report(self) -> None:
            if progress is not None:
                progress(offset + self._done, grand_total or offset + int(self.total or self._done))

    return _Bar


def _sha256(path: Path, show: bool) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh, tqdm(total=path.stat().st_size, unit="B", unit_scale=True, desc="checking sha256",
                                     disable=not show, file=sys.stderr) as bar:
        while chunk := fh.read(_HASH_CHUNK):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


def _verify(path: Path, want: HubFile, downloaded: bool, show: bool) -> None:
    """Size and sha256 against the Hub's listing (hash only after a fresh download)."""
    size = path.stat().st_size
    if want.size is not None and size != want.size:
        raise EdgeSpecError(f"downloaded {want.file} is {size} bytes, the Hub lists {want.size}")
    if not downloaded:
        return
    blob_name = path.resolve().name
    expected = want.sha256 or (blob_name if _SHA256.match(blob_name) else None)
    if expected and _sha256(path, show) != expected:
        raise EdgeSpecError(f"downloaded {want.file} does not match its sha256 {expected[:12]}...")


def _download(spec: str, want: HubFile, commit: str | None, progress: Progress | None, show: bool,
              offset: int, grand_total: int) -> Path:
    if commit:
        hit = _cached_file(want.repo, want.file, revision=commit)
        if hit is not None and (want.size is None or hit.stat().st_size == want.size):
            return hit
    used: list[bool] = []
    try:
        path = Path(hf_hub_download(
            want.repo, want.file, revision=REVISION, cache_dir=str(cache_dir()), endpoint=endpoint(),
            tqdm_class=_bar_class(want.file, progress, show, offset, grand_total, used),
        ))
    except GatedRepoError:
        raise EdgeSpecError(f"{HF_PREFIX}{want.repo} is gated: accept its licence on the Hub and log in (hf auth login)") from None
    except (RepositoryNotFoundError, RevisionNotFoundError, RemoteEntryNotFoundError) as exc:
        raise EdgeSpecError(f"{want.repo}/{want.file} not found on the Hub ({one_line(exc, limit=200)})") from None
    except LocalEntryNotFoundError as exc:
        if _timed_out(exc):
            raise EdgeSpecError(_no_answer(spec)) from None
        raise EdgeSpecError(f"cannot reach the Hub at {endpoint()} to download {want.file} ({one_line(exc.__cause__ or exc, limit=200)})") from None
    except (TransportError, HfHubHTTPError, OSError, ValueError) as exc:
        if _timed_out(exc):
            raise EdgeSpecError(_no_answer(spec)) from None
        raise EdgeSpecError(
            f"download of {want.repo}/{want.file} failed ({one_line(exc, limit=200)}); the partial file was discarded, "
            f"run `python -m edgespec.models pull {spec}` to retry"
        ) from None
    try:
        _verify(path, want, downloaded=bool(used), show=show)
        read_header(path)  # every part of a split model is a GGUF with its own tensor table
    except EdgeSpecError as exc:
        _discard(path)
        raise EdgeSpecError(f"{spec}: {exc}; the file was removed from the cache") from None
    return path


def pull(spec: str, progress: Progress | None = None, *, show_bar: bool | None = None) -> Path:
    """Download `hf:ORG/REPO[:FILE]` into the HF cache (a no-op when it is already complete).

    `progress(done_bytes, total_bytes)` is called as bytes arrive; a tqdm bar goes to stderr unless
    `show_bar` is False (default: shown when no `progress` callback is given). Returns the path of
    the GGUF (the first part of a split model). Raises EdgeSpecError with a one-line message.
    """
    repo, file = parse_spec(spec)
    show = progress is None if show_bar is None else show_bar
    if offline():
        hit = cached(spec)
        if hit is not None:
            return hit
        raise EdgeSpecError(
            f"{spec} is not in the Hugging Face cache ({cache_dir()}) and HF_HUB_OFFLINE is set: "
            f"unset HF_HUB_OFFLINE to download it, or run `python -m edgespec.models pull {spec}` while online"
        )
    _bound_requests()
    try:
        commit, files = _remote_files(repo)
    except GatedRepoError:
        raise EdgeSpecError(f"{HF_PREFIX}{repo} is gated: accept its licence on the Hub and log in (hf auth login)") from None
    except RepositoryNotFoundError:
        raise EdgeSpecError(
            f"Hub repo {repo} not found at {endpoint()} (check the name; private repos need `hf auth login`)"
        ) from None
    except (TransportError, HfHubHTTPError, OSError) as exc:
        hit = cached(spec)
        if hit is not None:
            return hit
        if _timed_out(exc):
            raise EdgeSpecError(_no_answer(spec)) from None
        raise EdgeSpecError(
            f"cannot reach the Hub at {endpoint()} ({one_line(exc, limit=200)}) and {spec} is not cached; "
            "check the connection or HF_ENDPOINT"
        ) from None
    chosen = _choose(spec, repo, file, files)
    grand_total = sum(f.size or 0 for f in chosen)
    paths, offset = [], 0
    for want in chosen:
        paths.append(_download(spec, want, commit, progress, show, offset, grand_total))
        offset += want.size or paths[-1].stat().st_size
        if progress is not None and len(chosen) > 1:
            progress(offset, grand_total)  # a part already in the cache still counts towards the total
    return paths[0]
