"""The prediction drafter (OpenAI's predicted outputs): it follows the answer through the predicted
tokens, finds its place again after an edit, lets the drafter it wraps propose elsewhere, and gives
gamma auto a confidence that follows what came true. Then on the bundled model through the session:
greedy text equals plain decoding's with most of it drafted by the prediction."""

from __future__ import annotations

from edgespec.core.drafters import Hint
from edgespec.core.drafters.ngram import NgramDrafter
from edgespec.core.drafters.prediction import PREDICTION, PRIOR, PredictionDrafter
from edgespec.core.sampling import SamplingParams

PROMPT = [1, 2, 3]
PRED = list(range(100, 140))  # 40 predicted tokens, all different


def step(d: PredictionDrafter, context: list[int], tokens: list[int], gamma: int = 8) -> tuple[Hint, list[int]]:
    """One engine step: hint, propose, then `tokens` committed."""
    hint = d.hint(context)
    proposal = d.propose(context, gamma).tokens.tolist()
    context += tokens
    d.commit(context, 0)
    return hint, proposal


def test_follows_the_prediction_and_finds_its_place_after_an_edit():
    d = PredictionDrafter(PRED)
    d.begin(PROMPT, SamplingParams())
    ctx = list(PROMPT)
    hint, proposal = step(d, ctx, PRED[:8])
    assert hint.source == PREDICTION and hint.draft_cost_s == 0.0 and hint.confidence[0] == PRIOR
    assert proposal == PRED[:8]
    _, proposal = step(d, ctx, [7, 7, 7])  # the edit: tokens that are not in the prediction
    assert proposal == PRED[8:16]
    hint, proposal = step(d, ctx, PRED[11:13])  # two predicted tokens again: the place is found
    assert hint.size == 0 and proposal == []  # (while lost, nothing to propose and no drafter to ask)
    hint, proposal = step(d, ctx, PRED[13:15])
    assert proposal == PRED[13:21] and hint.size == len(PRED) - 13


def test_confidence_follows_what_came_true():
    d = PredictionDrafter(PRED)
    d.begin(PROMPT, SamplingParams())
    ctx = list(PROMPT)
    for i in range(0, 32, 8):
        step(d, ctx, PRED[i : i + 8])
    assert d.confidence > 0.95  # 32 of 32 came true
    wrong = PredictionDrafter(PRED)
    wrong.begin(PROMPT, SamplingParams())
    ctx = list(PROMPT)
    step(wrong, ctx, [5, 6])  # the first predicted token is wrong
    assert wrong.confidence < PRIOR


def test_the_wrapped_drafter_proposes_where_the_prediction_does_not_match():
    d = PredictionDrafter(PRED, NgramDrafter(1, 4))
    assert d.name == "prediction+ngram"
    prompt = [1, 2, 3, 4, 5]
    d.begin(prompt, SamplingParams())
    ctx = list(prompt)
    step(d, ctx, [1, 2])  # not the prediction, but a copy of the prompt's start
    hint, draft = d.hint(ctx), d.propose(ctx, 3)
    assert hint == Hint(2, copies=True)  # the n-gram drafter's own hint
    assert draft.tokens.tolist() == [3, 4, 5] and draft.source == "ngram"  # provenance names it
    step(d, ctx, [3, 100, 101])  # the prediction's first two tokens: it proposes again
    assert d.propose(ctx, 3).tokens.tolist() == PRED[2:5] and d.hint(ctx).source == PREDICTION


def test_gamma_auto_drafts_a_confident_prediction_long():
    """A prediction that keeps coming true is drafted longer than a short n-gram match would be, from the
    same cost profile; the first proposal is planned from the prior without a probe."""
    from edgespec.core.adaptive import AutoGamma
    from edgespec.core.costs import CostModel

    cm = CostModel({k: 0.01 * (1 + 0.1 * (k - 1)) for k in (1, 2, 3, 5, 9, 17)})  # batching is cheap here
    d = PredictionDrafter(PRED)
    d.begin(PROMPT, SamplingParams())
    ctx = list(PROMPT)
    policy = AutoGamma()
    policy.start(cm)
    first = policy.choose(d.hint(ctx))
    assert first > 2
    for i in range(0, 24, 8):
        step(d, ctx, PRED[i : i + 8])
    later = policy.choose(d.hint(ctx))
    short_match = AutoGamma()
    short_match.start(cm)
    assert later >= first > short_match.choose(Hint(2, copies=True))
