"""Prove that the installed llama.cpp runs on this processor: `python -m edgespec.buildcheck`.

The set-up runs this before it says "ready". Each candidate CPU kernel variant (best first, as
`edgespec.backend` would choose it) is tried in a child process that loads the bundled SmolLM2 and
decodes one token and then a batch of four. A child that dies (illegal instruction, segfault) is
reported in one line and its variant is recorded as crashed for this CPU in the build manifest,
so the app never picks it; the next variant is tried. The same is done for the exact-mode kernels.
Exit status 0 when fast mode (and exact mode, when its kernels exist) has a working variant.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from edgespec import backend
from edgespec.errors import EdgeSpecError, run_command

CHILD_TIMEOUT_S = 300


def _say(msg: str) -> None:
    print(f"\033[1m[setup]\033[0m {msg}", flush=True)


def child(mode: str, model_path: str) -> int:
    """Load the model with the chosen kernels and decode 1 token, then a batch of 4."""
    import numpy as np

    from edgespec import runtime

    runtime.set_mode(mode)
    model = runtime.Model(model_path, n_ctx=256, n_batch=64, flash_attn="off" if mode == "exact" else "auto",
                          repack=mode != "exact")
    toks = model.tokenize("The quick brown fox jumps over the lazy dog", add_special=True)
    one = np.array(model.decode(toks[:1], n_logits=1))
    four = np.array(model.decode(toks[1:5], n_logits=4))
    if not (np.isfinite(one).all() and np.isfinite(four).all()):
        print(json.dumps({"ok": False, "why": "non-finite logits"}))
        return 1
    info = runtime.backend_info()
    print(json.dumps({"ok": True, **info.to_dict()}))
    model.close()
    return 0


def _death(rc: int) -> str:
    if rc < 0:
        try:
            return signal.Signals(-rc).name.replace("SIGILL", "Illegal instruction").replace("SIGSEGV", "segfault")
        except ValueError:
            return f"signal {-rc}"
    return f"exit status {rc}"


def _run_child(mode: str, model_path: str, env: dict[str, str]) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "edgespec.buildcheck", "--child", mode, "--model", model_path]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env={**os.environ, **env})
    except subprocess.TimeoutExpired:
        return 1, f"no answer within {CHILD_TIMEOUT_S} s"
    lines = [ln for ln in (res.stderr or "").strip().splitlines() if ln.strip()]
    return res.returncode, (lines[-1] if lines else "")


def prove(mode: str, directory: Path, model_path: str, manifest: dict, sig: str) -> bool:
    """Try this mode's kernel variants, best first, until one runs; record what happened."""
    env = {"EDGESPEC_EXACT_MODULES": str(directory)} if mode == "exact" else {}
    entry = manifest.setdefault("checked", {}).setdefault(sig, {}).setdefault(mode, {})
    entry["crashed"] = []
    entry["cpu"] = backend.this_cpu().model
    ranked = backend.ranked_variants(directory, sig, mode, {})
    if not backend.cpu_modules(directory):
        ranked = [("built-in", directory, 1)]
    label = "exact-mode " if mode == "exact" else ""
    for name, _, _ in ranked:
        rc, tail = _run_child(mode, model_path, {} if name == "built-in" else {**env, "EDGESPEC_CPU_VARIANT": name})
        if rc == 0:
            entry["variant"] = name
            _say(f"{label}llama.cpp runs here with the {name} CPU kernels")
            return True
        why = _death(rc) + (f": {tail}" if tail and rc > 0 else "")
        _say(f"the {label}{name} CPU kernels do not run on this CPU ({why}); trying the next")
        entry["crashed"].append(name)
    entry.pop("variant", None)
    _say(f"no {label}CPU kernel variant runs on this CPU")
    return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m edgespec.buildcheck", description=__doc__.splitlines()[0])
    ap.add_argument("--cmake-args", default=None, help="the flags the library was built with (recorded)")
    ap.add_argument("--exact-modules", default=None, help="folder of the llamafile-off CPU modules")
    ap.add_argument("--model", default=None, help="GGUF to test with (default: the bundled SmolLM2)")
    ap.add_argument("--dry-run", action="store_true", help="check, but record nothing beside the library")
    ap.add_argument("--child", choices=["fast", "exact"], default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.model is None:
        from models import bundled_path

        args.model = str(bundled_path("smollm2-135m"))
    if args.child:
        return run_command(lambda: child(args.child, args.model))

    try:
        lib = backend.lib_dir()
    except EdgeSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    # Scoring a module needs libggml-base in the process (the modules link to it by name); it holds
    # no CPU-specific kernels, so loading it here is safe on any processor.
    base = backend.shared_lib(lib, "ggml-base")
    if base is not None:
        ctypes.CDLL(str(base), mode=getattr(os, "RTLD_GLOBAL", 0))
    manifest = backend.read_manifest(lib)
    version = importlib.metadata.version("llama_cpp_python")
    if args.cmake_args is not None and (manifest.get("cmake_args"), manifest.get("llama_cpp_python")) != (
        args.cmake_args, version
    ):
        manifest = {}  # another build: what was checked before says nothing about this one
    cpu = backend.this_cpu()
    manifest["llama_cpp_python"] = version
    if args.cmake_args is not None:
        manifest["cmake_args"] = args.cmake_args
        manifest["built_on"] = {"cpu": cpu.model, "flags": sorted(cpu.flags & backend.ISA_FLAGS)}
    if args.exact_modules is not None:
        manifest["exact_modules"] = str(Path(args.exact_modules).resolve())
    modes = [("fast", lib)]
    if manifest.get("exact_modules"):
        modes.append(("exact", Path(manifest["exact_modules"])))
    ok = True
    for mode, directory in modes:
        ok = prove(mode, directory, args.model, manifest, cpu.signature) and ok
    if args.dry_run:
        return 0 if ok else 1
    try:
        backend.write_manifest(lib, manifest)
    except OSError as exc:
        _say(f"could not record the check beside the library ({exc}); it will be repeated next time")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
