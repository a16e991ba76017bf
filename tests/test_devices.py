"""Devices without a GPU: what this machine lists, the CPU as the default, one-line errors for a bad
--device, EDGESPEC_GPU or EDGESPEC_GPU_LAYERS, and the set-up's GPU probe (tests/test_gpu_vulkan.py runs
the GPU path on Mesa's software Vulkan device)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from edgespec.models.loader import RuntimeOptions
from edgespec.runtime import backend, gpuprobe
from edgespec.runtime.errors import EdgeSpecError
from tests.conftest import ROOT, run_app

CPU_ONLY = {"EDGESPEC_GPU_MODULES": str(ROOT / "no-gpu-module-here")}  # whatever the set-up recorded
PROMPT = ["--headless", "--prompt", "Hello", "--raw", "--temperature", "0", "--max-tokens", "2", "--draft", "none"]


def test_cpu_is_listed_and_the_default():
    res = run_app("--list-devices", env=CPU_ONLY)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines == [ln for ln in lines if ln.startswith("cpu ")] and len(lines) == 1, lines
    assert lines[0].endswith("[default]") and "GiB" in lines[0]


def test_the_cpu_runs_with_no_layer_offloaded():
    import json

    res = run_app(*PROMPT, "--json", "--device", "CPU", env=CPU_ONLY)
    assert res.returncode == 0, res.stderr
    be = json.loads(res.stdout)["backend"]
    assert be["device"] == "cpu" and be["device_layers"] == "0", be


def test_an_unknown_device_is_one_line():
    res = run_app(*PROMPT, "--device", "CUDA0", env=CPU_ONLY)
    assert res.returncode != 0
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and "no device 'CUDA0' here; devices: cpu (" in err[0], res.stderr
    assert "scripts/setup.sh builds one" in err[0]


def test_exact_and_a_gpu_device_are_refused_before_loading():
    with pytest.raises(EdgeSpecError, match="--exact runs on the CPU only"):
        RuntimeOptions(exact=True, device="Vulkan0")
    with pytest.raises(EdgeSpecError, match="--device is empty"):
        RuntimeOptions(device=" ")
    RuntimeOptions(exact=True, device="cpu")


def test_bad_gpu_layers_is_one_line():
    # every variable with a meaning is read before any work starts (runtime/env.py), on the CPU too
    res = run_app(*PROMPT, env={**CPU_ONLY, "EDGESPEC_GPU_LAYERS": "all"})
    assert res.returncode != 0 and res.stderr.strip().splitlines() == [
        "error: EDGESPEC_GPU_LAYERS must be a whole number >= 0, got 'all'"], res.stderr
    from edgespec.runtime.env import gpu_layers

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGESPEC_GPU_LAYERS", "all")
        with pytest.raises(EdgeSpecError, match="EDGESPEC_GPU_LAYERS must be a whole number"):
            gpu_layers()
        mp.setenv("EDGESPEC_GPU_LAYERS", "12")
        assert gpu_layers() == 12
        mp.setenv("EDGESPEC_GPU_LAYERS", "")
        assert gpu_layers() is None  # unset: every layer on the chosen device


def test_setup_refuses_an_unknown_gpu_kind():
    res = subprocess.run(["bash", str(ROOT / "scripts/setup.sh")], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "EDGESPEC_GPU": "opencl"})
    assert res.returncode == 2
    assert res.stderr.strip() == "[setup] error: EDGESPEC_GPU must be vulkan, cuda, none or auto, got opencl"


def test_gpu_probe_takes_lavapipe_for_no_gpu():
    """Mesa's lavapipe is a CPU-type Vulkan device: a machine with only that has no GPU to build for."""
    found = gpuprobe.vulkan_devices()
    if not any("llvmpipe" in name for name, _ in found):
        pytest.skip("Mesa's lavapipe is not installed (Debian: mesa-vulkan-drivers)")
    assert [kind for name, kind in found if "llvmpipe" in name] == ["CPU"]
    res = subprocess.run([sys.executable, "-m", "edgespec.runtime.gpuprobe"], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    if not gpuprobe.nvidia_gpus() and all(kind == "CPU" for _, kind in found):
        assert res.stdout == "\n"


def test_gpu_modules_of_a_folder(tmp_path):
    assert backend.gpu_modules(None) == [] and backend.gpu_modules(tmp_path) == []
    (tmp_path / "libggml-vulkan.so").write_bytes(b"")
    (tmp_path / "libggml-cpu-zen4.so").write_bytes(b"")
    assert [p.name for p in backend.gpu_modules(tmp_path)] == ["libggml-vulkan.so"]


def test_stats_lines_name_the_device():
    from edgespec.apps.cli import stats_line
    from edgespec.apps.ui import render
    from edgespec.apps.ui.live import Tracker
    from edgespec.service.session import Reply

    reply = Reply(device="Vulkan0", framing="raw")
    assert stats_line(reply).endswith("| Vulkan0]")
    tr = Tracker()
    tr.reply = reply
    assert "device Vulkan0" in render.stats_line(tr).split(" | ")


def test_the_pool_changes_device_only_to_one_that_exists():
    from edgespec.service.pool import ModelPool

    pool = ModelPool(RuntimeOptions(n_ctx=512))
    with pytest.raises(EdgeSpecError, match="no device 'Vulkan3' here"):
        pool.use_device("Vulkan3")
    assert pool.opts.device is None
    pool.use_device("cpu")
    assert pool.opts.device == "cpu"


def test_flash_attention_auto_is_off_on_the_cpu_and_on_lavapipe():
    from edgespec.runtime.llama import resolve_flash_attn
    assert backend.is_software("llvmpipe (LLVM 15.0.6, 256 bits)")
    assert not backend.is_software("NVIDIA H100 80GB HBM3") and not backend.is_software("AMD EPYC")
    assert resolve_flash_attn("auto", on_cpu=True) == "off"
    assert resolve_flash_attn("auto", on_cpu=False, software_gpu=True) == "off"  # lavapipe dies in it (docs/gpu.md)
    assert resolve_flash_attn("auto", on_cpu=False) == "auto"  # a real GPU: llama.cpp decides
    assert resolve_flash_attn("on", on_cpu=False, software_gpu=True) == "on"  # what the user asks is kept
