"""The verifiers: greedy match, and modified rejection sampling whose output must be distributed
exactly as the target's processed distribution (Leviathan et al. 2023, Theorem 3.5)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare, kstest

from edgespec.core.sampling import (
    ACCEPT,
    DRAFT,
    RESIDUAL,
    SAMPLE,
    Noise,
    SamplingParams,
    process,
    sample,
    verify_greedy,
    verify_match,
    verify_stochastic,
)
from edgespec.runtime.errors import EdgeSpecError

V = 8
TRIALS = 30_000


def _draft(q_rows: np.ndarray | None, onehot_tokens: list[int] | None, rng) -> tuple[np.ndarray, np.ndarray | None]:
    if q_rows is None:
        return np.asarray(onehot_tokens, dtype=np.int32), None
    return np.asarray([sample(q, rng.random()) for q in q_rows], dtype=np.int32), q_rows


def _emitted_counts(logits, q_rows, params, verify, onehot_tokens=None, seed=0):
    """Histogram of the first and second emitted tokens over many verification steps."""
    rng = np.random.default_rng(seed)
    first = np.zeros(V)
    second = np.zeros(V)
    for _ in range(TRIALS):
        draft, q = _draft(q_rows, onehot_tokens, rng)
        n, tok = verify(logits, draft, q, params, lambda row, purpose: rng.random())
        out = [*draft[:n].tolist(), tok]
        first[out[0]] += 1
        if len(out) > 1:
            second[out[1]] += 1
    return first, second


def _assert_matches(counts: np.ndarray, p: np.ndarray) -> None:
    """Chi-square goodness of fit over the tokens the target can emit; a token with p = 0 must
    never be emitted."""
    assert counts.sum() > 1000, "too few samples for the test to mean anything"
    assert counts[p == 0].sum() == 0, "emitted a token the target gives zero probability"
    support = p > 0
    if support.sum() == 1:
        return  # a single possible token, and nothing else was emitted
    expected = p[support] * counts.sum()
    stat = chisquare(counts[support], expected)
    assert stat.pvalue > 1e-4, f"emitted distribution differs from the target's (p={stat.pvalue:.2e})"
    tv = 0.5 * np.abs(counts / counts.sum() - p).sum()
    assert tv < 1.5 * np.sqrt(V / counts.sum())


def _wrong_verify(logits, draft, q, params, u):
    """A plausible bug: on rejection resample from p instead of norm(max(0, p - q))."""
    for i, d in enumerate(draft.tolist()):
        p = process(logits[i], params)
        q_d = 1.0 if q is None else q[i][d]
        if u(i, 1) * q_d < p[d]:
            continue
        return i, sample(p, u(i, 2))
    return len(draft), sample(process(logits[len(draft)], params), u(len(draft), 0))


CASES = {
    "plain": SamplingParams(temperature=1.0),
    "hot": SamplingParams(temperature=1.7),
    "top_k": SamplingParams(temperature=0.8, top_k=3),  # zero-mass tokens in p
    "top_p": SamplingParams(temperature=1.0, top_p=0.7),
    "min_p": SamplingParams(temperature=1.0, min_p=0.2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_rejection_sampling_is_lossless_with_model_drafts(case):
    rng = np.random.default_rng(1)
    params = CASES[case]
    logits = rng.normal(0, 2, size=(3, V)).astype(np.float32)
    q_logits = rng.normal(0, 1, size=(2, V))
    q_logits[:, 0] = -np.inf  # q has zero mass where p may not
    # Verification is lossless for any q; a softer q keeps both positions well sampled.
    q_rows = np.stack([process(r, SamplingParams(temperature=1.0)) for r in q_logits])
    first, second = _emitted_counts(logits, q_rows, params, verify_stochastic)
    _assert_matches(first, process(logits[0], params))
    _assert_matches(second, process(logits[1], params))


def test_rejection_sampling_is_lossless_with_onehot_drafts():
    """n-gram drafts are deterministic: q is one-hot, accept with probability p(d)."""
    rng = np.random.default_rng(2)
    params = SamplingParams(temperature=1.0, top_k=5)
    logits = rng.normal(0, 2, size=(3, V)).astype(np.float32)
    p0 = process(logits[0], params)
    drafted = [int(np.argmax(p0)), int(np.argsort(p0)[-2])]
    first, second = _emitted_counts(logits, None, params, verify_stochastic, onehot_tokens=drafted)
    _assert_matches(first, p0)
    _assert_matches(second, process(logits[1], params))


def test_exact_match_verification_is_lossless_but_accepts_less():
    """Both verifiers emit p; over the same seeded draws from q, exact match accepts the first draft
    with probability sum(q * p), rejection sampling with sum(min(p, q)) (Leviathan et al., Thm 3.5)."""
    rng = np.random.default_rng(4)
    params = SamplingParams(temperature=1.0)
    logits = rng.normal(0, 2, size=(3, V)).astype(np.float32)
    q_rows = np.stack([process(r, params) for r in rng.normal(0, 1, size=(2, V))])
    first, _ = _emitted_counts(logits, q_rows, params, lambda lg, d, q, pr, r: verify_match(lg, d, pr, r))
    _assert_matches(first, process(logits[0], params))
    p0 = process(logits[0], params)
    accepted = {"match": 0, "rejection": 0}
    for seed in range(TRIALS):
        u = Noise(seed).at(0)
        draft = np.array([sample(q_rows[0], u(0, DRAFT))], dtype=np.int32)
        accepted["match"] += verify_match(logits, draft, params, u)[0]
        accepted["rejection"] += verify_stochastic(logits, draft, q_rows[:1], params, u)[0]
    rate = {k: v / TRIALS for k, v in accepted.items()}
    expected = {"match": float((q_rows[0] * p0).sum()), "rejection": float(np.minimum(q_rows[0], p0).sum())}
    for k in rate:  # within 4 standard errors of the theory
        assert abs(rate[k] - expected[k]) < 4 * np.sqrt(expected[k] * (1 - expected[k]) / TRIALS), (k, rate, expected)
    assert rate["match"] < rate["rejection"] - 0.05, rate


def test_keyed_noise_is_uniform_independent_and_reproducible():
    a, b = Noise(5), Noise(5)
    draws = np.array([[a.uniform(pos, k) for k in (SAMPLE, ACCEPT, RESIDUAL)] for pos in range(4000)])
    assert draws.tolist() == [[b.uniform(pos, k) for k in (SAMPLE, ACCEPT, RESIDUAL)] for pos in range(4000)]
    for col in draws.T:
        assert kstest(col, "uniform").pvalue > 1e-4
    corr = np.corrcoef(draws.T)
    assert np.abs(corr[np.triu_indices(3, 1)]).max() < 0.06
    assert kstest(np.diff(draws[:, 0]), "triang", args=(0.5, -1, 2)).pvalue > 1e-4  # neighbours independent
    assert Noise(6).uniform(0, SAMPLE) != a.uniform(0, SAMPLE)
    assert Noise(-3).uniform(1, SAMPLE) == Noise(-3).uniform(1, SAMPLE)


def test_rejection_sampling_is_lossless_with_keyed_noise():
    """The engine's keyed draws (a fresh seed per generation) in place of one stream."""
    rng = np.random.default_rng(6)
    params = SamplingParams(temperature=1.0, top_k=6)
    logits = rng.normal(0, 2, size=(2, V)).astype(np.float32)
    q = process(rng.normal(0, 1, size=V), SamplingParams(temperature=1.0))[None, :]
    counts = np.zeros(V)
    for seed in range(20_000):
        u = Noise(seed).at(10)
        d = np.array([sample(q[0], u(0, 3))])
        n, tok = verify_stochastic(logits, d, q, params, u)
        counts[d[0] if n else tok] += 1
    _assert_matches(counts, process(logits[0], params))


def test_draft_token_outside_target_support_is_always_rejected():
    rng = np.random.default_rng(3)
    params = SamplingParams(temperature=1.0, top_k=2)
    logits = np.array([[5.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0]] * 2, dtype=np.float32)
    for _ in range(200):
        n, tok = verify_stochastic(logits, np.array([7]), None, params, lambda row, purpose: rng.random())
        assert n == 0 and tok in (0, 1)


def test_wrong_residual_is_detected():
    """The test above has the power to catch a wrong residual."""
    rng = np.random.default_rng(1)
    params = SamplingParams(temperature=1.0)
    logits = rng.normal(0, 2, size=(3, V)).astype(np.float32)
    q_rows = np.stack([process(r, params) for r in rng.normal(0, 2, size=(2, V))])
    first, _ = _emitted_counts(logits, q_rows, params, _wrong_verify)
    p0 = process(logits[0], params)
    with pytest.raises(AssertionError):
        _assert_matches(first, p0)


def test_all_accepted_gives_bonus_from_last_row():
    logits = np.zeros((3, V), dtype=np.float32)
    logits[0, 2] = logits[1, 5] = logits[2, 7] = 10.0
    assert verify_greedy(logits, np.array([2, 5])) == (2, 7)
    assert verify_greedy(logits, np.array([2, 4])) == (1, 5)
    assert verify_greedy(logits, np.array([1, 5])) == (0, 2)
    assert verify_greedy(logits[:1], np.array([], dtype=np.int32)) == (0, 2)


def test_greedy_verification_does_not_softmax(monkeypatch):
    import edgespec.core.sampling as s

    monkeypatch.setattr(s, "process", lambda *a, **k: pytest.fail("greedy must not softmax"))
    logits = np.random.default_rng(0).normal(size=(4, 262_144)).astype(np.float32)
    best = np.argmax(logits, axis=1)
    assert verify_greedy(logits, best[:3]) == (3, int(best[3]))


def test_process_filters():
    logits = np.array([3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0, -4.0])
    p = process(logits, SamplingParams(temperature=1.0, top_k=3))
    assert (p[3:] == 0).all() and np.isclose(p.sum(), 1)
    p = process(logits, SamplingParams(temperature=1.0, top_p=0.5))
    full = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    assert full[0] >= 0.5 and (p[1:] == 0).all()  # the top token alone already holds 50%
    p = process(logits, SamplingParams(temperature=1.0, min_p=0.3))
    assert (p[full < 0.3 * full.max()] == 0).all()
    cold = process(logits, SamplingParams(temperature=0.1))
    assert cold[0] > 0.99


def test_top_p_on_a_large_vocabulary_matches_full_sort():
    rng = np.random.default_rng(5)
    logits = rng.normal(0, 3, size=262_144)
    for top_p in (0.3, 0.9, 0.999):
        p = process(logits, SamplingParams(temperature=1.0, top_p=top_p))
        full = np.exp(logits - logits.max())
        full /= full.sum()
        order = np.argsort(-full, kind="stable")
        n = int(np.searchsorted(np.cumsum(full[order]), top_p)) + 1
        assert set(np.flatnonzero(p)) == set(order[:n].tolist())


@pytest.mark.parametrize(
    "kwargs",
    [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1), dict(min_p=1.0)],
)
def test_bad_sampling_settings(kwargs):
    with pytest.raises(EdgeSpecError):
        SamplingParams(**kwargs)
