#!/usr/bin/env bash
# The device check for a lent NVIDIA GPU (docs/gpu.md, "Device check"): one command there, nothing fetched.
#
#   bash scripts/device_check.sh prepare     # here, once: build/device-check/ (git-ignored, ~20 MB):
#                                            # the llama.cpp source of the cached sdist without its docs,
#                                            # tests and vocab files, the GGUF headers of the real pair
#                                            # (qwen2.5-coder-1.5b / -0.5b) and the pure-Python packages
#                                            # the runtime imports that a bare Python lacks
#   bash scripts/device_check.sh             # on the GPU machine (carry build/device-check): builds libllama,
#                                            # the CPU modules and the CUDA module for this GPU's architecture
#                                            # from that source, then benchmarks.device_check measures T(K)/T(1)
#                                            # for K = 1..16 on random-weight twins of the pair and compares
#                                            # greedy plain, n-gram and draft-model output on the GPU; results
#                                            # go to $OUT (default build/device-check/out)
#   bash scripts/device_check.sh configure   # only the CMake configure of the CUDA build (a check off the GPU)
#
# EDGESPEC_CUDA_ARCH overrides the CUDA architecture (default: this GPU's compute capability, e.g. 90-real).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"
DC="$here/build/device-check"
VERSION="0.3.36"
SRC_TAR="$DC/llama-cpp-python-$VERSION-src.tar.xz"
say() { printf '[device-check] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

if [ "${1:-}" = "prepare" ]; then
  sdist="${EDGESPEC_CACHE:-$HOME/.cache/edgespec}/src/llama_cpp_python-$VERSION.tar.gz"
  [ -f "$sdist" ] || die "no $sdist: run scripts/setup.sh first"
  mkdir -p "$DC"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  tar xzf "$sdist" -C "$tmp" --strip-components=1
  v="vendor/llama.cpp"
  # what a library build needs: CMake files, ggml, libllama, its vendored headers, licenses, gguf-py
  tar cJf "$SRC_TAR" -C "$tmp" llama_cpp "$v/CMakeLists.txt" "$v/cmake" "$v/ggml" "$v/src" "$v/include" \
    "$v/vendor" "$v/licenses" "$v/LICENSE" "$v/gguf-py"
  .venv/bin/python -m benchmarks.device_check prepare "$DC"
  say "ready to carry: $(du -sh "$DC" | cut -f1) in $DC"
  exit 0
fi

[ -f "$SRC_TAR" ] || die "no $SRC_TAR: run 'bash scripts/device_check.sh prepare' on the development machine and carry build/device-check"
OUT="${OUT:-$DC/out}"
mkdir -p "$OUT"
work="${TMPDIR:-/tmp}/edgespec-device-check"
rm -rf "$work" && mkdir -p "$work/src" "$work/py"
tar xJf "$SRC_TAR" -C "$work/src"
export PATH="$PATH:/usr/local/cuda/bin"

arch="${EDGESPEC_CUDA_ARCH:-}"
if [ -z "$arch" ]; then
  cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' .')" || cap=""
  arch="${cap:-90}-real"
fi
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
# The set-up's CPU flags (every CPU variant as a module) with CUDA: the same layout as a set-up there.
flags=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF
       -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF
       -DLLAMA_BUILD_APP=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_NATIVE=OFF
       -DGGML_CUDA=ON -DGGML_CUDA_NCCL=OFF "-DCMAKE_CUDA_ARCHITECTURES=$arch")
start=$SECONDS
say "configuring llama.cpp with CUDA for $arch"
if ! cmake -S "$work/src/vendor/llama.cpp" -B "$work/build" "${generator[@]}" "${flags[@]}" >"$OUT/configure.log" 2>&1; then
  tail -n 20 "$OUT/configure.log" >&2
  die "the CMake configure failed (log: $OUT/configure.log)"
fi
configure_s=$((SECONDS - start))
say "configured in ${configure_s} s"
if [ "${1:-}" = "configure" ]; then
  grep -i "cuda\|cublas" "$OUT/configure.log" | head -n 20 >&2 || true
  exit 0
fi

# libllama, the CUDA module, and the CPU variants a server CPU picks (Zen 4/5: zen4; Xeon: icelake; else haswell)
targets=(llama ggml-cuda ggml-cpu-haswell ggml-cpu-icelake ggml-cpu-zen4)
start=$SECONDS
say "building ${targets[*]} on $(nproc) cores"
if ! cmake --build "$work/build" --target "${targets[@]}" -j "$(nproc)" >"$OUT/build.log" 2>&1; then
  tail -n 20 "$OUT/build.log" >&2
  die "the build failed (log: $OUT/build.log)"
fi
build_s=$((SECONDS - start))
say "built in ${build_s} s"
printf '{"cuda_arch": "%s", "configure_s": %d, "build_s": %d, "cores": %d}\n' "$arch" "$configure_s" "$build_s" "$(nproc)" \
  > "$OUT/build.json"

# The llama_cpp package of the same sdist with the fresh libraries in its lib folder, as a wheel installs them.
cp -r "$work/src/llama_cpp" "$work/py/"
mkdir -p "$work/py/llama_cpp/lib"
cp -a "$work"/build/bin/*.so* "$work/py/llama_cpp/lib/"
PYTHONPATH="$work/py:$here:$DC/site" EDGESPEC_PROFILES="$work/profiles" python3 -m benchmarks.device_check run \
  --models "$DC/models" --work "$work" --out "$OUT"
