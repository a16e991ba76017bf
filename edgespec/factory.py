"""Build models, drafters and engines from what a user names (CLI, UI and bench share this)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgespec import runtime
from edgespec.adaptive import AutoGamma
from edgespec.drafters import Drafter
from edgespec.drafters.model import ModelDrafter
from edgespec.drafters.ngram import NgramDrafter
from edgespec.engine import FixedGamma, GammaPolicy
from edgespec.errors import EdgeSpecError
from edgespec.runtime import FlashAttn, Model

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class RuntimeOptions:
    """How models are loaded. `exact` selects the llamafile-off library, flash attention off and
    no weight repacking: single-token and batched decoding then agree bit for bit on F16 and
    Q8_0/Q4_0/Q4_1 weights (README, "Exactness")."""

    n_ctx: int = 4096
    n_threads: int | None = None
    flash_attn: FlashAttn = "auto"
    exact: bool = False

    def __post_init__(self) -> None:
        if self.n_ctx < 16:
            raise EdgeSpecError(f"context size must be >= 16, got {self.n_ctx}")
        if self.n_threads is not None and self.n_threads < 1:
            raise EdgeSpecError(f"threads must be >= 1, got {self.n_threads}")


def exact_site() -> Path:
    """Folder holding the llamafile-off build of llama-cpp-python (made by scripts/setup.sh)."""
    env = os.environ.get("EDGESPEC_EXACT_SITE")
    if env:
        return Path(env)
    marker = PROJECT_ROOT / ".venv" / ".exact-site"
    if marker.is_file():
        return Path(marker.read_text().strip())
    raise EdgeSpecError("exact mode is not set up: run scripts/setup.sh (it builds the exact-mode library)")


def prepare_runtime(opts: RuntimeOptions) -> None:
    """Pick the shared library before the first model loads."""
    if opts.exact:
        runtime.use_exact_library(exact_site())
        if runtime.llamafile_enabled():
            raise EdgeSpecError("the exact-mode library was built with llamafile on; rebuild it with scripts/setup.sh")


def load_model(
    name: str,
    opts: RuntimeOptions,
    progress: Callable[[float], None] | None = None,
    download_progress: Callable[[int, int], None] | None = None,
) -> Model:
    """Resolve `name` (downloading a catalog or hf: model if needed) and load it.
    progress(fraction) follows llama.cpp's loading; download_progress(done, total) a download."""
    from models import resolve

    prepare_runtime(opts)
    path = resolve(name, download_progress)
    return Model(
        path,
        n_ctx=opts.n_ctx,
        n_threads=opts.n_threads,
        flash_attn="off" if opts.exact else opts.flash_attn,
        repack=not opts.exact,
        progress=progress,
    )


def make_drafter(spec: str, target: Model, opts: RuntimeOptions, ngram: tuple[int, int] = (1, 16)) -> Drafter | None:
    """'none' -> no drafter (plain decoding), 'ngram' -> prompt lookup, anything else -> a draft model."""
    spec = (spec or "none").strip()
    if spec == "none":
        return None
    if spec == "ngram":
        return NgramDrafter(*ngram)
    return ModelDrafter.load(spec, target, opts)


def parse_gamma(value: str | int) -> int | GammaPolicy:
    text = str(value).strip().lower()
    if text == "auto":
        return AutoGamma()
    try:
        g = int(text)
    except ValueError:
        raise EdgeSpecError(f"gamma must be a whole number >= 0 or 'auto', got {value!r}") from None
    return FixedGamma(g).gamma

