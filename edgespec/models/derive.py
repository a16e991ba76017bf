"""Make a same-vocabulary target/draft pair from one bundled model (no two bundled models share a
vocabulary). The target is a higher-precision (Q8_0) requantization of SmolLM2-135M's weights; the
draft is the bundled 4-bit (Q4_1) file of the same weights, so the draft agrees with the target
most of the time, as a well-matched small draft would.
"""

from __future__ import annotations

import os
from pathlib import Path

from edgespec.models.bundled import bundled_path
from edgespec.models.output import atomic_output
from edgespec.runtime import env
from edgespec.runtime import llama as runtime
from edgespec.runtime.errors import EdgeSpecError

DERIVED_DIR = env.cache_dir() / "derived"
DERIVED_TARGET_NAME = "SmolLM2-135M-Instruct.Q8_0-from-Q4_1.gguf"
FTYPES = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "f16": "LLAMA_FTYPE_MOSTLY_F16"}


def requantize(src: Path, dst: Path, to: str) -> Path:
    """Write `src` requantized to `to` at `dst` with llama.cpp's own quantizer (atomic: a failed
    run leaves no file behind)."""
    if to not in FTYPES:
        raise EdgeSpecError(f"unknown target type {to!r}; choose from {', '.join(FTYPES)}")
    llama = runtime.lib()
    params = llama.llama_model_quantize_default_params()
    params.ftype = getattr(llama, FTYPES[to])
    params.allow_requantize = True
    params.nthread = max(1, len(os.sched_getaffinity(0)))
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EdgeSpecError(f"cannot make the folder {dst.parent} for {dst.name} ({exc.strerror or exc}); "
                            "choose another --out") from None
    with atomic_output(dst) as tmp:
        rc = llama.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
        if rc != 0:
            raise EdgeSpecError(f"llama.cpp could not requantize {src.name} to {to} (code {rc})")
    return dst


def derived_target(out_dir: Path = DERIVED_DIR) -> Path:
    """Where the derived Q8_0 target is (or will be once `python -m edgespec.models derive` has run)."""
    return out_dir / DERIVED_TARGET_NAME


def derive_pair(out_dir: Path = DERIVED_DIR) -> tuple[Path, Path]:
    """(target, draft) paths of the derived SmolLM2 pair, creating the target on first use."""
    draft = bundled_path("smollm2-135m")
    target = derived_target(out_dir)
    if not target.is_file():
        requantize(draft, target, "q8_0")
    return target, draft
