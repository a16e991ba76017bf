"""Shared fixtures: the bundled models, loaded once per test session (real llama.cpp, no mocks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgespec.models import bundled_path  # noqa: E402
from edgespec.runtime.llama import Model  # noqa: E402

# Cost profiles measured while tests run (other processes may share the cores) stay out of the
# user's store; subprocesses started by the tests inherit this.
if not os.environ.get("EDGESPEC_PROFILES"):
    import tempfile

    os.environ["EDGESPEC_PROFILES"] = tempfile.mkdtemp(prefix="edgespec-profiles-")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return bundled_path("smollm2-135m")


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    return bundled_path("gemma3-270m")


@pytest.fixture(scope="session")
def smollm2(smollm2_path) -> Model:
    """SmolLM2-135M Q4_1 on the batched-consistent path (flash attention off)."""
    return Model(smollm2_path, n_ctx=2048, flash_attn="off")


@pytest.fixture(scope="session")
def gemma(gemma_path) -> Model:
    return Model(gemma_path, n_ctx=2048, flash_attn="off")


def run_app(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python app.py ARGS` as a user would and capture its output."""
    return subprocess.run(
        [sys.executable, str(ROOT / "app.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )
