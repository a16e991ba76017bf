"""The hint contract: every drafter's `hint` returns a `Hint`, and gamma auto reads only its fields
(no drafter names, no bare ints)."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.core.adaptive import AutoGamma
from edgespec.core.costs import CostModel
from edgespec.core.drafters import LEARNED, Draft, Hint
from edgespec.core.drafters.combined import CombinedDrafter
from edgespec.core.drafters.model import ModelDrafter
from edgespec.core.drafters.ngram import NgramDrafter
from edgespec.core.sampling import SamplingParams
from tests.drafter_plugin import RepeatDrafter

CONTEXTS = ([5], [5, 6, 7, 5, 6], [1, 2, 3, 1, 2, 3, 1, 2, 3], [9, 8, 7])


class StubLearned:
    """Stands in for the ONNX drafter inside the combined one: ready on even context lengths."""

    name = f"{LEARNED}:stub@CPU"
    source = LEARNED
    needs_hidden = True

    def begin(self, prompt, sampling) -> None:
        pass

    def ready(self, context) -> bool:
        return len(context) % 2 == 0

    def hint(self, context) -> Hint:
        return Hint(None, LEARNED, 1e-3, 0.8) if self.ready(context) else Hint.nothing(LEARNED)

    def propose(self, context, gamma) -> Draft:
        return Draft(np.zeros(gamma, dtype=np.int32), None, LEARNED)


def drafters(smollm2) -> dict:
    return {
        "ngram": NgramDrafter(),
        "model": ModelDrafter(smollm2, smollm2),
        "combined": CombinedDrafter(NgramDrafter(), StubLearned()),
        "plugin": RepeatDrafter(),
    }


def test_every_drafter_hints_with_a_hint(smollm2):
    for name, d in drafters(smollm2).items():
        d.begin(CONTEXTS[0], SamplingParams())
        for ctx in CONTEXTS:
            h = d.hint(ctx)
            assert type(h) is Hint, f"{name}.hint({ctx}) returned {h!r}, not a Hint"
            assert h.size is None or h.size >= 0


def test_what_differs_between_drafters_is_in_the_hint():
    d = NgramDrafter()
    d.begin([1, 2, 3, 1, 2, 3, 1, 2, 3])
    assert d.hint([1, 2, 3, 1, 2, 3, 1, 2, 3]) == Hint(6, copies=True)
    assert d.hint([1, 2, 3, 1, 2, 3, 1, 2, 3, 4]) == Hint.nothing() == Hint(0)
    combined = CombinedDrafter(NgramDrafter(), StubLearned())
    combined.begin([7], SamplingParams())
    ctx = [1, 2, 3, 4, 1, 2, 3]  # a 3-token match: the n-gram source, at no drafting cost
    assert combined.hint(ctx) == Hint(3, "ngram", 0.0, copies=True)
    assert combined.hint([1, 2, 3, 9]) == Hint(None, LEARNED, 1e-3, 0.8)  # no match, learned ready
    assert combined.hint([1, 2, 3]) == Hint.nothing("none")  # neither


def table(per_row: float = 0.5) -> CostModel:
    return CostModel({k: 0.01 * (1 + per_row * (k - 1)) for k in (1, 2, 3, 5, 9, 17)})


def test_gamma_auto_reads_copying_from_the_hint_not_the_source_name():
    """A hint that says its proposal copies a 16-token match starts from the measured prior for
    long matches (drafted), whatever the source is called; the same size without `copies` is
    a plain context with an uninformed prior."""
    chosen = {}
    for source in ("", "ngram", "any-name"):
        for copies in (True, False):
            policy = AutoGamma()
            policy.start(table())
            chosen[source, copies] = policy.choose(Hint(16, source, copies=copies))
    assert all(chosen[s, True] >= 4 for s in ("", "ngram", "any-name")), chosen
    assert all(chosen[s, False] < chosen[s, True] for s in ("", "ngram", "any-name")), chosen


def test_a_bare_int_is_no_hint():
    policy = AutoGamma()
    policy.start(table())
    with pytest.raises(AttributeError):
        policy.choose(16)
    with pytest.raises(AttributeError):
        policy.choose(None)
