"""AutoGamma's choices follow measured costs and acceptance (fed timings, no model needed) and,
on the real models, speculation with gamma=auto is never much slower than plain decoding."""

from __future__ import annotations

from edgespec.adaptive import AutoGamma


def feed(policy: AutoGamma, steps: int, alpha_hits: float, cost) -> list[int]:
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
        policy.observe(k, n_acc, k + 1, cost(k + 1), 0.0)
    return chosen


def test_compute_bound_target_with_poor_drafts_stays_plain():
    policy = AutoGamma()
    chosen = feed(policy, 200, 0.3, lambda rows: 0.01 * rows)
    assert policy.alpha_overall < 0.5
    assert sum(k == 0 for k in chosen[-100:]) >= 80  # only occasional probes


def test_cheap_verification_and_good_drafts_speculate_long():
    policy = AutoGamma()
    chosen = feed(policy, 200, 0.95, lambda rows: 0.01 * (1 + 0.03 * (rows - 1)))
    assert policy.alpha_overall > 0.8
    assert min(chosen[-50:]) >= 6


def test_adapts_when_the_text_changes():
    policy = AutoGamma()
    cost = lambda rows: 0.01 * (1 + 0.2 * (rows - 1))  # noqa: E731
    feed(policy, 100, 0.97, cost)
    assert policy.choose() > 4
    chosen = feed(policy, 100, 0.05, cost)
    assert sum(k == 0 for k in chosen[-60:]) >= 50


def test_a_draft_that_costs_as_much_as_the_target_is_not_used():
    """c close to 1 (a same-size draft): even perfect acceptance cannot pay, so after the first
    measurement no more drafts (not even probes) are sent."""
    policy = AutoGamma()
    chosen = []
    for _ in range(200):
        k = policy.choose()
        chosen.append(k)
        policy.observe(k, k, k + 1, 0.01 * (1 + 0.3 * k), 0.009 * k)
    assert sum(chosen[-150:]) == 0
