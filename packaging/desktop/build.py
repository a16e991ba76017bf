"""Build the EdgeSpec desktop bundle: a PyInstaller one-folder app.

    .venv/bin/python packaging/desktop/build.py [--out DIR] [--no-exact]

Run it with the set-up's environment (scripts/setup.sh, then `pip install pyinstaller`): the bundle
takes the llama.cpp build installed there (all CPU-variant modules and edgespec-build.json), the
exact-mode kernels the set-up compiled (unless --no-exact), and the bundled SmolLM2-135M.

Result: DIR/dist/edgespec/ (default DIR: packaging/desktop/build, git-ignored) with the `edgespec`
executable, its `_internal/` folder, the icon, edgespec.desktop and install-desktop.sh. Copy the
folder anywhere; `./edgespec` opens the UI on 127.0.0.1 on a free port in the browser,
`./edgespec --headless --prompt ... [--json]` and every other `edgespec` command line work too.
PyInstaller builds for the platform it runs on: run this on macOS for a .app, on Windows for an .exe
folder (packaging/README.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def exact_modules() -> Path | None:
    """The set-up's llamafile-off CPU modules for this build, if it made them."""
    from edgespec.runtime import backend
    try:
        d = backend.exact_dir()
    except Exception:
        return None
    return d if d is not None and backend.cpu_modules(d) else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "build", help="build folder (default packaging/desktop/build)")
    ap.add_argument("--no-exact", action="store_true", help="leave out the exact-mode (--exact) kernels")
    args = ap.parse_args(argv)
    try:
        import PyInstaller  # noqa: F401
    except ImportError:
        print(f"error: PyInstaller is not installed: {sys.executable} -m pip install pyinstaller", file=sys.stderr)
        return 1
    out = args.out.resolve()
    env = dict(os.environ, EDGESPEC_BUNDLE_NAME="edgespec")
    env.pop("EDGESPEC_BUNDLE_EXACT_DIR", None)
    exact = None if args.no_exact else exact_modules()
    if exact is not None:
        env["EDGESPEC_BUNDLE_EXACT_DIR"] = str(exact)
    print(f"[desktop] building with {sys.executable} (exact-mode kernels: {exact or 'not bundled'})", flush=True)
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "PyInstaller", "--noconfirm", "--clean", "--log-level", "WARN",
           "--distpath", str(out / "dist"), "--workpath", str(out / "work"), str(HERE / "edgespec.spec")]
    res = subprocess.run(cmd, env=env, cwd=out.parent if out.parent.is_dir() else None)
    if res.returncode != 0:
        print(f"error: PyInstaller failed with status {res.returncode}", file=sys.stderr)
        return res.returncode
    bundle = out / "dist" / "edgespec"
    for name in ("edgespec.png", "edgespec.svg", "edgespec.desktop", "install-desktop.sh"):
        shutil.copy2(HERE / name, bundle / name)
    size = folder_size(bundle)
    print(f"[desktop] built {bundle} in {time.monotonic() - t0:.0f} s: {size / 1e6:.0f} MB", flush=True)
    print(f"[desktop] run: {bundle / 'edgespec'}   (menu entry: {bundle / 'install-desktop.sh'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
