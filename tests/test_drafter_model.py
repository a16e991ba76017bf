"""Draft-model drafting on a real same-vocabulary pair derived from a bundled model:
SmolLM2-135M Q8_0 (target, requantized at test time) drafted by the bundled Q4_1 file."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.core.drafters.model import ModelDrafter
from edgespec.core.engine import Engine, FixedGamma, GenerationConfig
from edgespec.core.sampling import SamplingParams
from edgespec.models.derive import derive_pair
from edgespec.models.pairing import check_compatible
from edgespec.runtime.errors import EdgeSpecError
from edgespec.runtime.llama import Model
from edgespec.service.session import Reply
from tests.conftest import run_app

QUESTIONS = [
    "Explain how a bicycle gear works.",
    "Write a limerick about a cat.",
    "Give three tips for learning a language.",
]


@pytest.fixture(scope="module")
def pair():
    target_path, draft_path = derive_pair()
    target = Model(target_path, n_ctx=2048, flash_attn="off")
    draft = Model(draft_path, n_ctx=2048, flash_attn="off")
    yield target, draft
    target.close()
    draft.close()


def chat(model: Model, text: str) -> list[int]:
    return model.tokenize(model.apply_chat_template([{"role": "user", "content": text}]), parse_special=True)


def test_incompatible_pair_names_the_reason(smollm2, gemma):
    with pytest.raises(EdgeSpecError, match="differ|different"):
        check_compatible(smollm2, gemma)


def test_greedy_draft_model_equals_same_path_reference(pair):
    target, draft = pair
    drafter = ModelDrafter(draft, target)
    for text in QUESTIONS[:2]:
        prompt = chat(target, text)
        cfg = GenerationConfig(max_tokens=40, min_batch_rows=2)
        ref = Reply.collect(Engine(target, None).generate(prompt, cfg))
        for gamma in (2, 5):
            spec = Reply.collect(Engine(target, drafter, FixedGamma(gamma)).generate(prompt, cfg))
            assert spec.tokens == ref.tokens
            assert spec.stats.acceptance_rate > 0.5  # same weights, finer quantization: drafts mostly agree


def test_draft_cache_is_rolled_back(pair):
    """After every step the draft's cache holds only committed tokens (plus its own new drafts)."""
    target, draft = pair
    drafter = ModelDrafter(draft, target)
    prompt = chat(target, QUESTIONS[2])
    context = list(prompt)
    for ev in Engine(target, drafter, FixedGamma(4)).generate(prompt, GenerationConfig(max_tokens=30)):
        context += ev.tokens
        committed = drafter._cached[: drafter._committed]
        assert committed == context[: len(committed)]
        assert draft.n_past == len(drafter._cached)


@pytest.mark.slow
def test_rejection_sampling_accepts_at_least_as_much_as_exact_match(pair):
    target, draft = pair
    totals = {"rejection": [0, 0], "match": [0, 0]}
    for verifier in totals:
        for i, text in enumerate(QUESTIONS):
            for seed in range(3):
                cfg = GenerationConfig(max_tokens=48, verifier=verifier,
                                       sampling=SamplingParams(temperature=0.8, seed=100 * i + seed))
                res = Reply.collect(Engine(target, ModelDrafter(draft, target), FixedGamma(4)).generate(chat(target, text), cfg))
                totals[verifier][0] += res.stats.accepted
                totals[verifier][1] += res.stats.drafted
    rate = {k: a / d for k, (a, d) in totals.items()}
    print(f"acceptance at T=0.8: rejection sampling {rate['rejection']:.3f}, exact match {rate['match']:.3f}")
    assert rate["rejection"] >= rate["match"]


def test_seeded_sampling_with_a_draft_model_is_reproducible(pair):
    target, draft = pair
    cfg = GenerationConfig(max_tokens=32, sampling=SamplingParams(temperature=0.8, seed=5))
    prompt = chat(target, QUESTIONS[1])
    a, b = (Reply.collect(Engine(target, ModelDrafter(draft, target), FixedGamma(3)).generate(prompt, cfg)).tokens for _ in range(2))
    assert a == b


def test_draft_probabilities_cover_the_target_vocabulary(pair):
    target, draft = pair
    drafter = ModelDrafter(draft, target)
    prompt = chat(target, QUESTIONS[0])
    drafter.begin(prompt, SamplingParams(temperature=0.7, seed=1))
    d = drafter.propose(prompt, 3)
    assert d.probs.shape == (3, target.n_vocab)
    np.testing.assert_allclose(d.probs.sum(axis=1), 1.0, rtol=1e-6)
    assert all(d.probs[i, t] > 0 for i, t in enumerate(d.tokens))


def test_cli_pair_errors_and_warnings():
    res = run_app("--headless", "--target", "smollm2-135m", "--draft", "gemma3-270m", "--prompt", "hi")
    assert res.returncode == 1 and res.stderr.startswith("error: ") and len(res.stderr.strip().splitlines()) == 1
    big_draft = str(derive_pair()[0])  # Q8_0 drafting for the Q4_1 file: larger than the target
    res = run_app("--headless", "--target", "smollm2-135m", "--draft", big_draft, "--chat",
                  "--prompt", "Say hi.", "--max-tokens", "8")
    assert res.returncode == 0 and "warning: the draft" in res.stderr
