#!/usr/bin/env bash
# Optional: build llama.cpp's own speculative decoder (`llama-speculative-simple`) as the bench's
# reference (`app.py bench --reference llama.cpp:ngram-simple,...`).
#
# It is compiled from the very llama.cpp sources vendored in the llama-cpp-python release the
# project uses (the sdist the set-up caches), and it runs on the *same shared libraries* the
# project's set-up installed: libllama, libggml and every CPU-variant kernel module are copied from
# the installed llama_cpp package next to the binary. Only the example program and llama.cpp's
# `common` helpers are compiled here, so both sides of a comparison run identical kernels, picked
# for this CPU by the same loader, and nothing in it is specific to this processor.
#
# The AMX kernel module (sapphirerapids) is left out, as the app itself skips it (edgespec/runtime/backend.py):
# on AMX Xeons the loader would pick it and the program would die.
#
# The result is cached in $EDGESPEC_CACHE/reference/llama.cpp-<version>-<build key>-noamx
# (10-20 minutes on 2 cores the first time; a second run reuses it).
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"
VPY="$here/.venv/bin/python"
CACHE="${EDGESPEC_CACHE:-$HOME/.cache/edgespec}"
LLAMA_CPP_VERSION="0.3.36"
say() { printf '\033[1m[reference]\033[0m %s\n' "$*"; }
die() { printf '\033[1m[reference]\033[0m error: %s\n' "$*" >&2; exit 1; }

[ -x "$VPY" ] || die "run the set-up first: bash scripts/setup.sh"
libdir="$("$VPY" -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("llama_cpp").origin).parent / "lib")')" \
  || die "llama-cpp-python is not installed in .venv: run bash scripts/setup.sh"
key="$(cat .venv/.llama-build-key 2>/dev/null || echo unknown)"
out="$CACHE/reference/llama.cpp-$LLAMA_CPP_VERSION-$key-noamx"
if [ -x "$out/llama-speculative-simple" ]; then
  say "ready: $out/llama-speculative-simple"
  exit 0
fi
sdist="$CACHE/src/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz"
[ -f "$sdist" ] || die "no cached source at $sdist: run bash scripts/setup.sh first (it downloads it)"
command -v cmake >/dev/null || die "cmake is needed to build the reference"

src="$out.src"
rm -rf "$src" "$out.tmp" && mkdir -p "$src" "$out.tmp"
tar xzf "$sdist" -C "$src" --strip-components=1
say "compiling llama-speculative-simple from the vendored llama.cpp (10-15 minutes on 2 cores; cached afterwards)"
# The CPU kernels are not compiled (GGML_CPU=OFF): the binary loads the installed ones at run time.
{ cmake -S "$src/vendor/llama.cpp" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DCMAKE_SKIP_RPATH=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=ON \
    -DGGML_BACKEND_DL=ON -DGGML_CPU=OFF -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_NATIVE=OFF \
  && cmake --build "$src/build" --target llama-speculative-simple -j "$(nproc)"; } >"$out.tmp/build.log" 2>&1 \
  || { tail -20 "$out.tmp/build.log" >&2; die "the reference build failed (log: $out.tmp/build.log)"; }
cp "$src/build/bin/llama-speculative-simple" "$out.tmp/"
cp -P "$src"/build/bin/libllama-common.so* "$out.tmp/"  # llama.cpp's helpers (arguments, sampling, n-gram caches)
# The installed library, unchanged: the program runs with LD_LIBRARY_PATH set to this folder.
cp -P "$libdir"/lib*.so* "$out.tmp/"
rm -f "$out.tmp"/libggml-cpu-sapphirerapids*  # AMX kernels: never loaded by the app either
rm -f "$out.tmp/build.log"
LD_LIBRARY_PATH="$out.tmp" "$out.tmp/llama-speculative-simple" --version >/dev/null 2>&1 \
  || die "the reference program does not start (kept: $src)"
rm -rf "$out" "$src" && mv "$out.tmp" "$out"
say "ready: $out/llama-speculative-simple"
