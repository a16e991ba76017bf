"""Entry point of the desktop bundle (packaging/desktop/build.py freezes this file).

* no arguments, or only UI options: the web UI on 127.0.0.1 on a free port (unless --host/--port
  are given), and the browser opened on it once the server answers (EDGESPEC_NO_BROWSER=1: don't);
* `--headless ...`, `bench ...`, `serve ...` and every other command line: exactly `edgespec`'s;
* `models ...` / `quant ...`: `python -m edgespec.models ...` / `python -m edgespec.apps.quant ...`;
* `-m MODULE ...`: runs a bundled module like `python -m` (the set-up's build check starts its
  children as `sys.executable -m edgespec.apps.buildcheck`, and in the bundle sys.executable is this program).
"""

from __future__ import annotations

import os
import runpy
import socket
import sys
import threading
import time
import urllib.request
import webbrowser
from pathlib import Path

MODULE_COMMANDS = {"models": "edgespec.models", "quant": "edgespec.apps.quant"}


def bundle_dir() -> Path | None:
    """The folder PyInstaller unpacked the bundle's files into (None when not frozen)."""
    base = getattr(sys, "_MEIPASS", None)
    return Path(base) if base else None


def use_bundled_files() -> None:
    """Point EdgeSpec at the llamafile-off CPU kernels shipped in the bundle (for --exact); the
    library's own manifest names the build machine's cache folder, which the user may not have."""
    base = bundle_dir()
    if base is not None and (base / "edgespec_exact").is_dir():
        os.environ.setdefault("EDGESPEC_EXACT_MODULES", str(base / "edgespec_exact"))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def open_browser_when_ready(url: str, timeout_s: float = 600.0) -> None:
    """Open `url` in the browser once the UI answers (model loading comes first)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                break
        except OSError:
            time.sleep(0.3)
    else:
        return
    print(f"EdgeSpec is running at {url} (Ctrl-C to quit)", flush=True)
    if os.environ.get("EDGESPEC_NO_BROWSER") != "1":
        webbrowser.open(url)


def _option(argv: list[str], name: str) -> str | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def ui_argv(argv: list[str]) -> list[str]:
    """The UI's command line: 127.0.0.1 and a free port unless the user chose them."""
    out = list(argv)
    if _option(out, "--host") is None:
        out += ["--host", "127.0.0.1"]
    if _option(out, "--port") is None:
        out += ["--port", str(free_port(_option(out, "--host") or "127.0.0.1"))]
    return out


def is_ui(argv: list[str]) -> bool:
    return not argv or (argv[0].startswith("-") and not {"--headless", "-h", "--help", "-m"} & set(argv))


def run_module(name: str, args: list[str]) -> int:
    sys.argv = [name, *args]
    try:
        runpy.run_module(name, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    use_bundled_files()
    if argv[:1] == ["-m"] and len(argv) >= 2:
        return run_module(argv[1], argv[2:])
    if argv and argv[0] in MODULE_COMMANDS:
        return run_module(MODULE_COMMANDS[argv[0]], argv[1:])
    from edgespec.apps.cli import main as cli_main

    if is_ui(argv):
        argv = ui_argv(argv)
        host, port = _option(argv, "--host"), _option(argv, "--port")
        shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        url = f"http://[{shown}]:{port}/" if shown and ":" in shown else f"http://{shown}:{port}/"
        print(f"EdgeSpec: loading the model, then opening {url}", flush=True)
        threading.Thread(target=open_browser_when_ready, args=(url,), daemon=True).start()
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
