"""What a distill run is asked for (`DistillConfig`, every flag's default) and its checks."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from edgespec.runtime.errors import EdgeSpecError

DEFAULT_SUITE = "spec_bench"


@dataclass
class DistillConfig:
    target: str
    out: str | None = None
    suites: list[str] = field(default_factory=lambda: [DEFAULT_SUITE])
    budget_minutes: float = 20.0
    holdout: int = 5  # first N prompts of each category are never used
    vocab: int = 16384
    hidden: int = 1024
    max_new_tokens: int = 96
    max_doc_tokens: int = 768
    collect_share: float = 0.45  # of the budget; training gets the rest minus export
    corpus: str | None = None  # offline text to read besides the suites ('python' or a path; edgespec.apps.distill.corpus)
    corpus_share: float = 0.5  # of the collection time, for reading the corpus
    seed: int = 0
    n_ctx: int = 2048
    threads: int | None = None
    lr: float = 2e-3  # Adam's peak learning rate (no flag: 0 makes an untrained drafter, for tests)

    def __post_init__(self) -> None:
        if not self.budget_minutes > 0:
            raise EdgeSpecError(f"--budget-minutes must be > 0, got {self.budget_minutes}")
        if not math.isfinite(self.budget_minutes):
            raise EdgeSpecError(f"--budget-minutes must be a finite number of minutes, got {self.budget_minutes}")
        if self.max_new_tokens < 1:
            raise EdgeSpecError(f"--max-new-tokens must be >= 1 (the length of each self-generated answer), "
                                f"got {self.max_new_tokens}")
        if self.vocab < 16:
            raise EdgeSpecError(f"--vocab must be >= 16, got {self.vocab}")
        if self.hidden < 8:
            raise EdgeSpecError(f"--hidden must be >= 8, got {self.hidden}")
        if self.holdout < 0:
            raise EdgeSpecError(f"--holdout must be >= 0, got {self.holdout}")

