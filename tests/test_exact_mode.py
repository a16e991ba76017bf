"""Exact mode (--exact): llamafile-off build, flash attention off, no repacking. For F16/Q8_0/Q4_x
weights a token's logits do not depend on the batch it is decoded in, so greedy speculative
output is identical to plain single-token decoding (no same-path trick needed)."""

from __future__ import annotations

import json

import pytest

from edgespec.models.derive import derive_pair
from edgespec.runtime.backend import exact_available
from tests.conftest import run_app

pytestmark = [
    pytest.mark.skipif(not exact_available(), reason="exact-mode library not built (EDGESPEC_EXACT_LIB=0)"),
    pytest.mark.slow,  # each case starts the app twice in exact mode
]

PROMPTS = [
    "Rewrite this function with a docstring:\n\ndef area(w, h):\n    return w * h\n",
    "List three uses of copper and explain each briefly.",
]


def generate(target: str, draft: str, prompt: str, gamma: str = "4", *extra: str) -> dict:
    chat = () if "gemma" in target else ("--chat",)  # the bundled Gemma is a base model
    res = run_app("--headless", "--exact", *chat, "--target", target, "--draft", draft, "--gamma", gamma,
                  "--prompt", prompt, "--max-tokens", "64", "--json", *extra)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["exact"] is True
    if draft != "none":
        assert out["draft_cap"] is not None  # probed batch invariance bounds every draft
    return out


@pytest.mark.parametrize("which", ["q4_1", "q8_0"])
def test_exact_mode_speculative_equals_plain_decoding(which):
    target = "smollm2-135m" if which == "q4_1" else str(derive_pair()[0])
    for prompt in PROMPTS:
        plain = generate(target, "none", prompt)
        spec = generate(target, "ngram", prompt, gamma="6")
        assert spec["tokens"] == plain["tokens"], prompt
        assert spec["stats"]["drafted"] > 0


@pytest.mark.parametrize("target, gamma", [("smollm2-135m", "auto"), ("gemma3-270m", "4")])
def test_exact_mode_seeded_sampling_is_the_same_with_and_without_speculation(target, gamma):
    """Draws are keyed by token position, so with batch-independent logits a seeded speculative
    run prints exactly what seeded plain sampling prints. (Gemma's K-quant logits are identical up
    to 5 rows in this build, hence gamma 4.)"""
    seeded = ("--temperature", "0.9", "--top-p", "0.95", "--seed", "21")
    prompt = PROMPTS[0]
    plain = generate(target, "none", prompt, "4", *seeded)
    spec = generate(target, "ngram", prompt, gamma, *seeded)
    assert spec["tokens"] == plain["tokens"]
    assert spec["stats"]["drafted"] > 0


GEMMA_PROMPTS = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n# The same function, with a docstring:\n",
    "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is",
]


@pytest.mark.parametrize("gamma", ["2", "8", "auto"])
def test_exact_mode_on_k_quants_is_exact_with_the_probed_cap(gamma):
    """Gemma's K-quant kernels are not batch-invariant for every row count on every CPU; exact mode
    probes which row counts are, caps drafts there (draft_cap in the JSON), and is then exact."""
    for prompt in GEMMA_PROMPTS:
        plain = generate("gemma3-270m", "none", prompt)
        spec = generate("gemma3-270m", "ngram", prompt, gamma)
        assert spec["tokens"] == plain["tokens"], (gamma, spec["draft_cap"], prompt[:30])
        cap = spec["draft_cap"]
        assert max(int(k) for k in spec["stats"]["drafted_hist"]) <= cap
