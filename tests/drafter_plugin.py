"""A plug-in drafter for the tests: registered from outside the package through EDGESPEC_DRAFTERS
(`EDGESPEC_DRAFTERS=tests.drafter_plugin`), so it must show up wherever drafters are offered."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgespec.core.drafters import Draft, DraftContext, Hint, register
from edgespec.core.sampling import SamplingParams


class RepeatDrafter:
    """Proposes the last committed token repeated gamma times (right on runs like '....' or '===')."""

    name = "repeat"
    needs_hidden = False

    def __init__(self) -> None:
        self._last: int | None = None

    def begin(self, prompt: Sequence[int], sampling: SamplingParams) -> None:
        self._last = int(prompt[-1]) if len(prompt) else None

    def hint(self, context: Sequence[int]) -> Hint:
        return Hint()  # nothing cheap to tell

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        if gamma <= 0 or not len(context):
            return Draft()
        return Draft(np.full(gamma, int(context[-1]), dtype=np.int32))

    def commit(self, context: Sequence[int], n_accepted: int) -> None:
        self._last = int(context[-1]) if len(context) else None

    def draft_cost_s(self) -> float:
        return 0.0

    def close(self) -> None:
        self._last = None


@register("repeat", "repeats the last token (a test plug-in)")
def _build(ctx: DraftContext) -> RepeatDrafter:
    return RepeatDrafter()
