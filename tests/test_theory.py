"""The paper's formulas reproduce its worked examples, and a simulation agrees with them."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec import theory


def test_worked_examples():
    # alpha 0.75, gamma 7, c 0.02: 3.60 expected tokens per target call and a 3.16x speedup
    assert theory.expected_tokens(0.75, 7) == pytest.approx(3.60, abs=0.005)
    assert theory.walltime_speedup(0.75, 7, 0.02) == pytest.approx(3.16, abs=0.005)
    # alpha 0.82, gamma 7, c 0.11: 2.50x
    assert theory.walltime_speedup(0.82, 7, 0.11) == pytest.approx(2.50, abs=0.005)


def test_limits_and_viability():
    assert theory.expected_tokens(1.0, 5) == 6
    assert theory.expected_tokens(0.0, 5) == 1
    assert theory.viable(0.5, 0.3) and not theory.viable(0.2, 0.3)
    assert theory.gamma1_speedup(0.6, 0.1) == pytest.approx(theory.walltime_speedup(0.6, 1, 0.1))
    assert theory.gamma1_speedup(0.3, 0.3) == pytest.approx(1.0)


def test_operations_grow_when_drafts_are_rejected():
    assert theory.expected_operations(1.0, 4, 0.0) == pytest.approx(1.0)
    assert theory.expected_operations(0.5, 4, 0.05) > 2.0


def test_alpha_and_dlk():
    rng = np.random.default_rng(0)
    for _ in range(20):
        p, q = rng.dirichlet(np.ones(10)), rng.dirichlet(np.ones(10))
        assert theory.acceptance(p, q) == pytest.approx(1 - theory.d_lk(p, q))
    p = np.array([0.5, 0.5, 0.0])
    assert theory.acceptance(p, p) == pytest.approx(1.0)
    assert theory.acceptance(p, np.array([0.0, 0.0, 1.0])) == 0.0


@pytest.mark.parametrize("alpha,gamma", [(0.3, 2), (0.75, 7), (0.9, 12)])
def test_simulation_matches_formula(alpha, gamma):
    sim = theory.simulate_tokens_per_step(alpha, gamma, 200_000, np.random.default_rng(1))
    assert sim == pytest.approx(theory.expected_tokens(alpha, gamma), rel=0.02)


def test_best_gamma_respects_verification_cost():
    # compute-bound verification (cost grows with rows) and modest acceptance: do not speculate
    assert theory.best_gamma(0.5, 0.0, lambda k: float(k), 16)[0] == 0
    # nearly free verification and high acceptance: draft long
    g, s = theory.best_gamma(0.9, 0.0, lambda k: 1 + 0.02 * (k - 1), 16)
    assert g >= 8 and s > 3
