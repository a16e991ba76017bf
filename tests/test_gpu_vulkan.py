"""The GPU path on a software Vulkan device: the set-up's Vulkan module (EDGESPEC_GPU=vulkan; scripts/test.sh
builds it) running on Mesa's lavapipe, as llama.cpp's own CI job ubuntu-llvmpipe runs ggml-vulkan.

ggml-vulkan lists a CPU-type device only when GGML_VK_VISIBLE_DEVICES names it, so everything here runs in
child processes with that set (LAVAPIPE); the rest of the suite keeps running on the CPU. lavapipe is slow
(a few tokens a second for SmolLM2): short generations, correctness only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from edgespec.apps.buildcheck import SOFTWARE_VULKAN
from edgespec.runtime import backend
from edgespec.runtime.errors import EdgeSpecError
from tests.conftest import ROOT, run_app


def _vulkan_dir():
    try:
        d = backend.gpu_dir()
    except EdgeSpecError:
        return None
    return d if any("vulkan" in p.name for p in backend.gpu_modules(d)) else None


def _checked() -> dict:
    """What the set-up's build check recorded about the GPU module ({} when it checked none)."""
    try:
        return backend.read_manifest(backend.lib_dir()).get("gpu") or {}
    except EdgeSpecError:
        return {}


VULKAN = _vulkan_dir()
REJECTED = _checked().get("kind") == "vulkan" and not _checked().get("ok")
pytestmark = pytest.mark.skipif(VULKAN is None and not REJECTED, reason="no Vulkan module: the set-up builds it with "
                                "EDGESPEC_GPU=vulkan (scripts/test.sh does)")
built = pytest.mark.skipif(VULKAN is None, reason="the build check rejected the Vulkan module (see "
                           "test_the_set_up_proved_the_module)")
LAVAPIPE = {**SOFTWARE_VULKAN, "EDGESPEC_GPU_MODULES": str(VULKAN)}
PROMPT = ["--prompt", "The capital of France is", "--raw", "--temperature", "0", "--max-tokens", "3", "--draft", "none"]

GREEDY = """
import json, sys
from edgespec.models.loader import RuntimeOptions
from edgespec.runtime.llama import Model
from edgespec.service.devicecheck import greedy_runs
from edgespec.service.session import Session

target = sys.argv[1]
session = Session(Model(target, n_ctx=512, n_batch=64, device="Vulkan0"), RuntimeOptions(n_ctx=512, device="Vulkan0"))
runs = greedy_runs(session, ["ngram", "model:" + target], gamma=3, max_tokens=6)
draft = session.drafter("model:" + target).draft
print(json.dumps({"device": session.target.device, "layers": session.target.layers_on_device,
                  "draft_device": draft.device, "draft_layers": draft.layers_on_device,
                  "runs": [r.to_dict() for r in runs]}))
session.close()
"""


def test_the_set_up_proved_the_module():
    """The set-up's build check ran greedy speculation on lavapipe and recorded the module as good
    (before flash attention was kept off on software devices, Mesa 22.3.6 died there: docs/gpu.md).
    A module it rejects is not loaded: the CPU path runs, and this test fails with the recorded reason."""
    checked = _checked()
    if REJECTED:
        out = run_app("--headless", "--prompt", "hi", "--raw", "--max-tokens", "2", "--draft", "none", "--json",
                      env=SOFTWARE_VULKAN)
        assert out.returncode == 0, out.stderr[-1000:]
        assert json.loads(out.stdout)["backend"]["device"] == "cpu"  # the rejected module is not loaded
    assert checked.get("ok"), f"the set-up's build check rejected the Vulkan module: {checked.get('why')}"
    assert checked["kind"] == "vulkan" and checked["software"] and "llvmpipe" in checked["description"], checked
    done, total = checked["layers"].split("/")
    assert done == total and int(total) > 0, checked


@built
def test_list_devices_names_lavapipe():
    res = run_app("--list-devices", env=LAVAPIPE)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    vulkan = [ln for ln in lines if ln.startswith("Vulkan0")]
    assert len(vulkan) == 1 and "llvmpipe" in vulkan[0] and "GiB" in vulkan[0], lines
    assert vulkan[0].endswith("[default]"), "a GPU device that loads is the default"
    assert lines[0].startswith("cpu ") and not lines[0].endswith("[default]")
    # without GGML_VK_VISIBLE_DEVICES ggml-vulkan hides the CPU-type device: the CPU stays the default
    hidden = run_app("--list-devices", env={"EDGESPEC_GPU_MODULES": str(VULKAN)})
    assert hidden.returncode == 0, hidden.stderr
    assert [ln for ln in hidden.stdout.splitlines() if ln.endswith("[default]")][0].startswith("cpu ")
    assert "Vulkan0" not in hidden.stdout


@built
def test_cli_runs_on_the_device_and_says_so():
    res = run_app("--headless", *PROMPT, "--device", "Vulkan0", "--json", env=LAVAPIPE)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    be = out["backend"]
    assert be["device"] == "Vulkan0" and "vulkan" in be["gpu_backends"]
    done, total = be["device_layers"].split("/")
    assert done == total and int(total) > 0, f"every layer on the device: {be['device_layers']}"
    assert len(out["tokens"]) == 3


@built
def test_bad_device_is_one_line_listing_the_devices():
    res = run_app("--headless", *PROMPT, "--device", "Vulkan7", env=LAVAPIPE)
    assert res.returncode != 0
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and "no device 'Vulkan7'" in err[0], res.stderr
    assert "cpu (" in err[0] and "Vulkan0 (llvmpipe" in err[0]


@built
def test_exact_refuses_a_gpu_device():
    res = run_app("--headless", *PROMPT, "--device", "Vulkan0", "--exact", env=LAVAPIPE)
    assert res.returncode != 0
    assert res.stderr.strip().count("\n") == 0 and "--exact runs on the CPU only" in res.stderr


@built
def test_greedy_speculation_equals_plain_on_the_device(smollm2_path):
    res = subprocess.run([sys.executable, "-c", GREEDY, str(smollm2_path)], capture_output=True, text=True,
                         timeout=1800, cwd=ROOT, env={**os.environ, **LAVAPIPE})
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    for who in ("", "draft_"):
        assert out[f"{who}device"] == "Vulkan0"
        done, total = out[f"{who}layers"].split("/")
        assert done == total and int(total) > 0, out
    plain, ngram, model = out["runs"]
    assert len(plain["tokens"]) == 6
    for run in (ngram, model):
        assert run["drafted"] > 0 and run["accepted"] > 0, run  # passes of several rows ran on the device
        assert run["tokens"] == plain["tokens"], run["divergence"]


@built
def test_build_check_rejects_a_broken_module_in_one_line(tmp_path):
    (tmp_path / "libggml-vulkan.so").write_bytes((VULKAN / "libggml-vulkan.so").read_bytes()[:4096])
    res = subprocess.run([sys.executable, "-m", "edgespec.apps.buildcheck", "--gpu-modules", str(tmp_path), "--dry-run"],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert res.returncode == 0, "a GPU module that fails never fails the set-up"
    said = [ln for ln in res.stdout.splitlines() if "GPU module" in ln]
    # a cut-short library dies in the child (SIGBUS when dlopen maps past its end): the parent survives it
    assert len(said) == 1 and "the vulkan GPU module is not used (" in said[0], res.stdout
    assert said[0].endswith("); models run on the CPU")
