#!/usr/bin/env bash
# Builds sb_bench (sb_bench.c) for one instruction set, against the vendored ggml of the
# llama-cpp-python sdist (extract it first: tar xzf llama_cpp_python-0.3.36.tar.gz -C /tmp/kern-src).
#   ./build.sh [zen4|haswell] [OLD_REV]  -> build-<set>/sb_bench; then run build-<set>/sb_bench
# zen4 and haswell use the flag sets of ggml's CPU variants of those names (ggml/src/CMakeLists.txt);
# OLD_REV (default HEAD) is the commit whose kernels are timed as "old".
set -euo pipefail
set_="${1:-zen4}"
old="${2:-HEAD}"
here="$(cd "$(dirname "$0")" && pwd)"
ggml="${GGML:-/tmp/kern-src/llama_cpp_python-0.3.36/vendor/llama.cpp/ggml}"
base_lib="${GGML_BASE_LIB:-$(ls -d "$here"/../../../.venv/lib/python3*/site-packages/llama_cpp/lib | head -1)}"
case "$set_" in
  zen4) flags="-msse4.2 -mf16c -mfma -mbmi2 -mavx -mavx2 -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw -mavx512vbmi -mavx512vnni -mavx512bf16" ;;
  haswell) flags="-msse4.2 -mf16c -mfma -mbmi2 -mavx -mavx2" ;;
  *) echo "unknown set $set_" >&2; exit 2 ;;
esac
b="$here/build-$set_"
mkdir -p "$b/old"
for f in smallbatch.h smallbatch-q6_K.c smallbatch-q4_K.c; do
  git -C "$here" show "$old:native/smallbatch/$f" > "$b/old/$f"
done
inc="-I$ggml/src -I$ggml/src/ggml-cpu -I$ggml/include"
cc="cc -O3 -DNDEBUG -std=gnu11 -D_GNU_SOURCE $flags -ffunction-sections -fdata-sections"
cxx="c++ -O3 -DNDEBUG -std=gnu++17 -D_GNU_SOURCE $flags -ffunction-sections -fdata-sections"
ren="-Dggml_smallbatch_q6_K=old_smallbatch_q6_K -Dggml_smallbatch_q4_Kx8=old_smallbatch_q4_Kx8 -Dggml_smallbatch_q6_K_prepared=old_smallbatch_q6_K_prepared -Dggml_smallbatch_q8_K_prepared_size=old_smallbatch_q8_K_prepared_size -Dggml_smallbatch_q8_K_prepare=old_smallbatch_q8_K_prepare"
# the old per-row-layout kernel's interface: several weight rows a call since GGML_SMALLBATCH_MAX_WROWS
old_if=""
grep -q GGML_SMALLBATCH_MAX_WROWS "$b/old/smallbatch.h" && old_if="-DSB_OLD_WROWS"
$cc -I"$b/old" $inc $ren -c "$b/old/smallbatch-q6_K.c" -o "$b/old-q6_K.o"
$cc -I"$b/old" $inc $ren -c "$b/old/smallbatch-q4_K.c" -o "$b/old-q4_K.o"
# the earlier commit's F16 kernel, where it has one (timed against this one)
old_f16=""
rm -f "$b/old-f16.o"
if git -C "$here" show "$old:native/smallbatch/smallbatch-f16.c" > "$b/old/smallbatch-f16.c" 2>/dev/null; then
  $cc -I"$b/old" $inc -Dggml_smallbatch_f16_chunk=old_smallbatch_f16_chunk -Dggml_smallbatch_has_f16=old_smallbatch_has_f16 \
      -c "$b/old/smallbatch-f16.c" -o "$b/old-f16.o"
  old_f16="-DSB_OLD_F16"
fi
$cc ${SB_CFLAGS:-} -I"$here/.." $inc -c "$here/../smallbatch-q6_K.c" -o "$b/q6_K.o"
$cc ${SB_CFLAGS:-} -I"$here/.." $inc -c "$here/../smallbatch-q4_K.c" -o "$b/q4_K.o"
$cc ${SB_CFLAGS:-} -I"$here/.." $inc -c "$here/../smallbatch-q8_K.c" -o "$b/q8_K.o"
$cc ${SB_CFLAGS:-} -I"$here/.." $inc -c "$here/../smallbatch-legacy.c" -o "$b/legacy.o"
$cc ${SB_CFLAGS:-} -I"$here/.." $inc -c "$here/../smallbatch.c" -o "$b/sb.o"
$cc ${SB_CFLAGS:-} -I"$here/.." $inc -c "$here/../smallbatch-f16.c" -o "$b/f16.o"
$cc $old_if $old_f16 -I"$here/.." $inc -c "$here/sb_bench.c" -o "$b/sb_bench.o"
# ggml's per-row kernels, straight from the sdist
$cc $inc -c "$ggml/src/ggml-cpu/arch/x86/quants.c" -o "$b/ref-quants.o"
$cxx $inc -c "$ggml/src/ggml-cpu/arch/x86/repack.cpp" -o "$b/ref-repack.o"
$cxx $inc -c "$ggml/src/ggml-cpu/vec.cpp" -o "$b/ref-vec.o"
c++ -o "$b/sb_bench" "$b"/*.o -Wl,--gc-sections \
    -L"$base_lib" -l:libggml-base.so -Wl,-rpath,"$base_lib"
echo "$b/sb_bench"
