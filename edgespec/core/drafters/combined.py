"""The combined drafter: n-gram lookup where the context has a long recurring match (copying
text), the learned ONNX drafter elsewhere (`--draft ngram+learned:FOLDER_OR_NAME`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgespec.core.drafters import LEARNED, Draft, DraftContext, Hint, register
from edgespec.core.drafters.ngram import NgramDrafter
from edgespec.core.drafters.onnx import LearnedDrafter
from edgespec.core.learned_format import resolve
from edgespec.core.sampling import SamplingParams


class CombinedDrafter:
    """n-gram lookup where the context has a long recurring match (copying text), the learned drafter
    elsewhere. Each step names its source in a Hint, so gamma auto keeps alpha and c per source."""

    needs_hidden = True

    def __init__(self, ngram: NgramDrafter, learned: LearnedDrafter, long_match: int = 3) -> None:
        self.ngram = ngram
        self.learned = learned
        self.long_match = long_match
        self.name = f"ngram+{learned.name}"

    def begin(self, prompt: Sequence[int], sampling: SamplingParams) -> None:
        self.ngram.begin(prompt, sampling)
        self.learned.begin(prompt, sampling)

    def _source(self, context: Sequence[int]) -> tuple[str, int]:
        n = self.ngram.match_size(context)
        if n >= self.long_match or (n > 0 and not self.learned.ready(context)):
            return "ngram", n
        return (LEARNED, -1) if self.learned.ready(context) else ("none", 0)

    def hint(self, context: Sequence[int]) -> Hint:
        src, n = self._source(context)
        if src == "ngram":
            return Hint(n, "ngram", 0.0, copies=True)
        if src == LEARNED:
            return self.learned.hint(context)
        return Hint.nothing("none")

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        src, _ = self._source(context)
        if src == "ngram":
            d = self.ngram.propose(context, gamma)
            return Draft(d.tokens, d.probs, "ngram")
        if src == LEARNED:
            return self.learned.propose(context, gamma)
        return Draft()

    def observe_hidden(self, hidden: np.ndarray) -> None:
        self.learned.observe_hidden(hidden)

    def commit(self, context: Sequence[int], n_accepted: int) -> None:
        self.ngram.commit(context, n_accepted)
        self.learned.commit(context, n_accepted)

    def draft_cost_s(self) -> float:
        return self.learned.draft_cost_s()

    def close(self) -> None:
        self.ngram.close()
        self.learned.close()


@register("ngram+learned", "n-gram lookup on long matches, the learned drafter elsewhere (--draft ngram+learned:FOLDER_OR_NAME)",
          takes_model=True)
def _build_combined(ctx: DraftContext) -> CombinedDrafter:
    return CombinedDrafter(NgramDrafter(*ctx.ngram), LearnedDrafter(resolve(ctx.arg), ctx.target))
