"""The llama.cpp build runs on this processor: kernels chosen per CPU, the set-up's build check,
and a clear refusal of a library compiled for instructions this CPU lacks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from edgespec.apps.buildcheck import _death, _run_child
from edgespec.runtime import backend
from edgespec.runtime import llama as runtime
from edgespec.runtime.errors import EdgeSpecError
from tests.conftest import ROOT

CPU = backend.this_cpu()
HAVE_MODULES = bool(backend.cpu_modules(backend.lib_dir()))
needs_modules = pytest.mark.skipif(not HAVE_MODULES, reason="library built with its CPU kernels linked in")


def test_loaded_kernels_only_use_instructions_this_cpu_has(smollm2):
    info = runtime.backend_info()
    assert info.variant not in backend.AMX_VARIANTS
    # what the loaded kernels were compiled for, as llama.cpp reports it, against /proc/cpuinfo
    backend.check_builtin_features(runtime.system_info(), CPU, {})


@needs_modules
def test_the_best_variant_this_cpu_scores_is_chosen(smollm2):
    ranked = backend.ranked_variants(backend.lib_dir(), CPU.signature, runtime.mode(), {})
    assert ranked and runtime.backend_info().variant == ranked[0][0]
    assert all(score > 0 for _, _, score in ranked)
    assert not any(name in backend.AMX_VARIANTS for name, _, _ in ranked)
    if "avx2" in CPU.flags:
        assert ranked[0][0] not in ("x64", "sse42", "sandybridge")  # a vector level that fits this CPU


def test_build_check_proves_the_installed_library():
    """The set-up's check, run as the set-up runs it (children load SmolLM2 and decode 1 + 4 rows)."""
    res = subprocess.run([sys.executable, "-m", "edgespec.apps.buildcheck", "--dry-run"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "llama.cpp runs here with the" in res.stdout


@needs_modules
@pytest.mark.skipif("avx512f" in CPU.flags, reason="needs a CPU without AVX-512 to run AVX-512 kernels on")
def test_build_check_detects_kernels_that_crash_here(smollm2_path):
    """Force the AVX-512 kernels onto this AVX2-only CPU past the score check: the child dies with
    an illegal instruction and the check says so in one line instead of dying itself."""
    rc, _ = _run_child("fast", str(smollm2_path), {"EDGESPEC_CPU_VARIANT": "skylakex",
                                                   "EDGESPEC_CPU_VARIANT_UNCHECKED": "1"})
    assert rc != 0 and _death(rc) in ("Illegal instruction", "segfault", f"exit status {rc}")
    assert rc < 0  # killed by a signal, as a user would see it


def test_a_library_built_for_another_cpu_is_refused():
    avx2_only = backend.Cpu("AMD EPYC", frozenset({"avx", "avx2", "fma", "f16c", "bmi2", "pni", "ssse3"}))
    info = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | LLAMAFILE = 1 |"
    with pytest.raises(EdgeSpecError, match="avx512f.*re-run scripts/setup.sh"):
        backend.check_builtin_features(info, avx2_only, {})
    backend.check_builtin_features(info.replace("AVX512 = 1", "AVX512 = 0"), avx2_only, {})
    native = {"cmake_args": "-DGGML_NATIVE=ON", "built_on": {"cpu": "Xeon", "flags": ["avx2", "avx512f", "amx_tile"]}}
    with pytest.raises(EdgeSpecError, match="built for Xeon"):
        backend.check_builtin_features(info.replace("AVX512 = 1", "AVX512 = 0"), avx2_only, native)


def test_forcing_a_variant_this_cpu_cannot_run_is_an_error(smollm2_path):
    mods = backend.cpu_modules(backend.lib_dir())
    unsupported = [n for n, p in mods.items() if backend.module_score(p) == 0]
    if not unsupported:
        pytest.skip("this CPU runs every variant")
    res = subprocess.run([sys.executable, "-m", "edgespec.apps.buildcheck", "--child", "fast", "--model", str(smollm2_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "EDGESPEC_CPU_VARIANT": unsupported[0]})
    assert res.returncode == 1 and "cannot run it" in res.stderr and "Traceback" not in res.stderr
