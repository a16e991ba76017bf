"""The one cost model's formulas (`edgespec.core.costs`): the paper's worked examples through
`CostModel.speedup`, the draft length `CostModel.best_gamma` chooses against hand-computed
optima, and a simulation that agrees with Eq. 1."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.core.costs import PASSES_KEPT, CostModel, PassLog, expected_tokens


def test_worked_examples_of_the_paper():
    """Leviathan et al. 2023, T(K) = T(1): alpha 0.75, gamma 7, c 0.02 gives 3.60 tokens per target
    call and a 3.16x speedup; alpha 0.82, gamma 7, c 0.11 gives 2.50x."""
    assert expected_tokens(0.75, 7) == pytest.approx(3.60, abs=0.005)
    assert CostModel.flat(0.02).speedup(0.75, 7) == pytest.approx(3.16, abs=0.005)
    assert CostModel.flat(0.11).speedup(0.82, 7) == pytest.approx(2.50, abs=0.005)
    assert CostModel.flat(0.11).speedup(0.82, 7, c=0.02) == pytest.approx(4.420 / 1.14, abs=0.005)  # c given wins


def test_expected_tokens_limits_and_per_position_acceptance():
    assert expected_tokens(1.0, 5) == 6
    assert expected_tokens(0.0, 5) == 1
    assert expected_tokens(0.5, 2) == 1.75
    assert expected_tokens([1.0, 1.0, 0.5], 3) == 3.5  # 1 + 1 + 1 + 0.5
    assert expected_tokens([0.5, 0.5, 0.5], 2) == 1.75  # only the first gamma positions count


def test_best_gamma_declines_when_drafting_does_not_pay():
    # Corollary 3.9: with one draft, speculation helps only when alpha > c: (1 + alpha) / (1 + c)
    assert CostModel.flat(0.3).best_gamma(0.2) == (0, 1.0)
    assert CostModel.flat(0.3).best_gamma(0.5) == (1, pytest.approx(15 / 13))  # gamma 2: 1.75 / 1.6
    # compute-bound verification, T(K) = K T(1): alpha 0.5 never pays (gamma 1: 1.5 / 2)
    assert CostModel({1: 1.0, 2: 2.0}).best_gamma(0.5) == (0, 1.0)
    assert CostModel({1: 1.0, 2: 2.0}).best_gamma(0.5, drafting=True) == (1, 0.75)


def test_best_gamma_finds_the_optimum_of_a_rising_cost():
    """T(K) = T(1) (1 + 0.1 (K - 1)), alpha 0.9, free drafting: S(g) = (1 - 0.9^(g+1)) / 0.1 / (1 + 0.1 g)
    peaks at g = 10 (3.4309) between S(9) = 3.4280 and S(11) = 3.4170."""
    cm = CostModel({1: 1.0, 17: 2.6})
    assert cm.best_gamma(0.9) == (10, pytest.approx(3.43095, abs=1e-5))
    assert cm.best_gamma(0.9, gamma_max=9) == (9, pytest.approx(3.42801, abs=1e-5))


def test_best_gamma_at_perfect_acceptance_drafts_as_long_as_allowed():
    assert CostModel.flat().best_gamma(1.0) == (16, 17.0)
    assert CostModel.flat().best_gamma(1.0, gamma_max=3) == (3, 4.0)
    # exact mode: a pass holds at most max_rows rows proven batch-invariant
    assert CostModel({1: 1.0, 2: 1.0}, max_rows=5).best_gamma(1.0) == (4, 5.0)


def test_step_cost_and_predicted_for_a_run():
    cm = CostModel({1: 0.01, 2: 0.012, 4: 0.016}, c=0.1, gamma_max=8)
    assert cm.step_cost(3) == pytest.approx(0.3 + 1.6)
    assert cm.step_cost(0) == 1.0
    # 5 plain steps and 10 steps of 3 drafts at alpha 0.5: (5 + 10 * 1.875) tokens for (5 + 10 * 1.9) passes
    assert cm.predicted_for({0: 5, 3: 10}, 0.5) == pytest.approx(23.75 / 24)
    assert cm.predicted_for({}, 0.5) == 1.0


def test_verification_ceiling_is_k_t1_over_tk():
    """What `bench --verify-cost` reports: every draft accepted and free, K rows give K tokens."""
    cm = CostModel({1: 0.010, 2: 0.011, 3: 0.013, 4: 0.020}, gamma_max=3)
    assert [cm.speedup(1.0, k - 1, c=0.0) for k in (1, 2, 3, 4)] == pytest.approx([1.0, 2 / 1.1, 3 / 1.3, 2.0])


@pytest.mark.parametrize("alpha,gamma", [(0.3, 2), (0.75, 7), (0.9, 12)])
def test_simulation_matches_eq1(alpha, gamma):
    """Monte Carlo: each draft accepted independently with probability alpha until the first
    rejection; every step also yields one token of the target's."""
    accepted = np.random.default_rng(1).random((200_000, gamma)) < alpha
    first_reject = np.where(accepted.all(axis=1), gamma, np.argmin(accepted, axis=1))
    assert float((first_reject + 1).mean()) == pytest.approx(expected_tokens(alpha, gamma), rel=0.02)


def test_a_run_of_certain_tokens_is_not_cut_when_its_rest_would_cost_a_pass_of_its_own():
    """Six forced tokens on a curve where 6 rows are cheap and 7 dear (this EPYC's profile: T(6) 1.92,
    T(7) 2.32): one step alone reads 6 / 1.92 better than 7 / 2.32, but the forced token it leaves costs
    the next step a pass, so the run is drafted whole (7 tokens in 2.32 against 8 in 1.92 + 1.11)."""
    curve = CostModel({1: 1.0, 2: 1.11, 5: 1.86, 6: 1.92, 7: 2.32, 8: 2.64, 11: 3.54})
    alphas = [1.0] * 6 + [0.3] * 10
    assert curve.speedup(alphas, 5, free=6) > curve.speedup(alphas, 6, free=6)  # what one step alone prefers
    assert curve.best_gamma(alphas, free=6) == (6, pytest.approx(7 / 2.32))
    assert curve.best_gamma([1.0] * 10 + [0.3] * 6, free=10)[0] == 5  # 11 in 3.54 < 12 in 1.92 + 1.86: two steps
    assert curve.best_gamma(alphas)[0] == 5  # the same acceptances, nothing certain (no pass owed): one step's best


def test_observed_passes_bend_the_profile_toward_what_they_cost():
    """Gamma auto plans with the passes it observed (issue 44, item 38): T(K)/T(1) moves toward the
    observed medians' ratio, as far as their number weighs against the profile, between observed
    row counts by interpolation and beyond the largest as it is; T(1) stays the profile's."""
    prof = {1: 0.070, 2: 0.064, 4: 0.082, 8: 0.150, 16: 0.270, 32: 0.600}
    m = CostModel(prof)
    before = {k: m.t_ratio(k) for k in range(1, 33)}
    log = PassLog()
    m.calibrate(log)  # nothing observed: unchanged
    assert {k: m.t_ratio(k) for k in range(1, 33)} == before
    log.add({4: [0.082 * 1.1 * 1.5] * 40})
    m.calibrate(log)  # no single-row pass to compare with: unchanged
    assert {k: m.t_ratio(k) for k in range(1, 33)} == before
    # machine 10% slower on one row, and a 4-row pass costs 1.5 times the profile's ratio
    log.add({1: [0.077] * 40})
    m.calibrate(log)
    w = 40 / (40 + 8)
    assert m.seconds(1) == pytest.approx(0.070)
    assert m.t_ratio(4) == pytest.approx(before[4] * (1 + w * 0.5))
    assert m.t_ratio(2) == pytest.approx(before[2] * (1 + w * 0.5 / 3))  # a third of the way from 1 row to 4
    assert m.t_ratio(16) == pytest.approx(before[16] * (1 + w * 0.5))  # beyond: held
    # calibrating again starts from the profile, not from the last calibration
    m.calibrate(log)
    assert m.t_ratio(4) == pytest.approx(before[4] * (1 + w * 0.5))
    # a few passes weigh little; a wild observation is held to CORRECTION_RANGE
    few = PassLog()
    few.add({1: [0.070] * 40, 8: [0.150 * 1.5] * 2})
    m.calibrate(few)
    assert m.t_ratio(8) == pytest.approx(before[8] * (1 + 0.5 * 2 / 10))
    wild = PassLog()
    wild.add({1: [0.070] * 40, 8: [0.150 * 100] * 40})
    m.calibrate(wild)
    assert m.t_ratio(8) == pytest.approx(before[8] * 2.0)
    # only the most recent passes are kept
    log.add({4: [1.0] * PASSES_KEPT})
    assert log.passes[4] == [1.0] * PASSES_KEPT


def test_dearer_observed_passes_shorten_the_draft():
    """A profile that made long passes look cheap gets a shorter draft once the real passes are
    seen to cost more, and the speedup it predicts falls to what those passes give."""
    prof = {1: 0.070, 2: 0.072, 4: 0.085, 8: 0.140, 16: 0.250, 32: 0.560}
    m = CostModel(prof, gamma_max=31)
    g0, s0 = m.best_gamma(0.95)
    log = PassLog()
    log.add({1: [0.070] * 64, 8: [0.140 * 1.4] * 64, 16: [0.250 * 1.6] * 64})
    m.calibrate(log)
    g1, s1 = m.best_gamma(0.95)
    assert g1 < g0 and s1 < s0, (g0, g1, s0, s1)
