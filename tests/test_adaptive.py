"""AutoGamma's choices follow the cost profile and the measured acceptance (simulated acceptance,
no model needed), and on a real model its costs come from a stored profile, so they do not change
from run to run."""

from __future__ import annotations

import json

from edgespec.adaptive import AutoGamma
from edgespec.profile import pass_costs, profile_dir


def costs(per_row: float) -> dict[int, float]:
    """T(K) = 10 ms * (1 + per_row * (K - 1)) at the row counts a profile stores."""
    return {k: 0.01 * (1 + per_row * (k - 1)) for k in (1, 2, 3, 5, 9, 17)}


def feed(policy: AutoGamma, steps: int, alpha_hits: float) -> list[int]:
    """Simulated generation: drafts are accepted while a deterministic pattern says so."""
    chosen = []
    hits = 0.0
    for _ in range(steps):
        k = policy.choose()
        chosen.append(k)
        n_acc = 0
        for _ in range(k):
            hits += alpha_hits
            if hits >= 1.0:
                hits -= 1.0
                n_acc += 1
            else:
                break
        policy.observe(k, n_acc, k + 1, 0.0, 0.0)
    return chosen


def test_compute_bound_target_with_poor_drafts_stays_plain():
    policy = AutoGamma(costs=costs(1.0))
    chosen = feed(policy, 200, 0.3)
    assert sum(k == 0 for k in chosen[-100:]) >= 95  # verification costs as much as decoding


def test_poor_drafts_on_cheap_verification_mostly_plain():
    policy = AutoGamma(costs=costs(0.3))
    chosen = feed(policy, 200, 0.3)
    assert policy.alpha_overall < 0.5
    assert sum(k == 0 for k in chosen[-100:]) >= 80  # only occasional probes


def test_cheap_verification_and_good_drafts_speculate_long():
    policy = AutoGamma(costs=costs(0.03))
    chosen = feed(policy, 200, 0.95)
    assert policy.alpha_overall > 0.8
    assert min(chosen[-50:]) >= 6


def test_adapts_when_the_text_changes():
    policy = AutoGamma(costs=costs(0.2))
    feed(policy, 100, 0.97)
    assert policy.choose() > 4
    chosen = feed(policy, 100, 0.05)
    assert sum(k == 0 for k in chosen[-60:]) >= 50


def test_acceptance_is_kept_per_hint_and_probes_need_a_long_match():
    """n-gram hints: long matches that keep being accepted are drafted long while short matches
    that fail are left alone, in the same generation; short matches are never probed."""
    policy = AutoGamma(costs=costs(0.5))
    for step in range(300):
        hint = 16 if step % 2 else 1
        k = policy.choose(hint)
        if hint == 1 and step > 100:
            assert k == 0
        policy.observe(k, k if hint == 16 else 0, k + 1, 0.0, 0.0)
    assert policy.choose(16) >= 8 and policy.choose(1) == 0


def test_a_new_generation_starts_from_the_prior():
    policy = AutoGamma(costs=costs(0.2))
    feed(policy, 100, 0.97)
    policy.start()
    assert policy.alpha_overall == 0.5 and policy.choose() == AutoGamma(costs=costs(0.2)).choose()


def test_a_draft_that_costs_as_much_as_the_target_is_not_used():
    """c close to 1 (a same-size draft): even perfect acceptance cannot pay, so no drafts (not
    even probes) are sent."""
    policy = AutoGamma(costs=costs(0.3), c=0.9)
    chosen = []
    for _ in range(200):
        k = policy.choose()
        chosen.append(k)
        policy.observe(k, k, k + 1, 0.0, 0.0)
    assert sum(chosen) == 0


def test_profile_is_measured_once_and_reused(smollm2_path, tmp_path, monkeypatch):
    from edgespec.runtime import Model

    monkeypatch.setenv("EDGESPEC_PROFILES", str(tmp_path))
    model = Model(smollm2_path, n_ctx=256)
    try:
        first = pass_costs(model, [1, 2, 5])
        assert all(t > 0 for t in first.values())
        (stored,) = profile_dir().glob("*.json")
        assert json.loads(stored.read_text())["pass_s"] == {str(k): v for k, v in first.items()}
        del model._pass_costs
        assert pass_costs(model, [1, 5]) == {1: first[1], 5: first[5]}  # read back, not re-measured
        more = pass_costs(model, [1, 3])  # a missing row count is measured and added
        assert more[1] == first[1] and set(json.loads(stored.read_text())["pass_s"]) == {"1", "2", "3", "5"}
    finally:
        model.close()
