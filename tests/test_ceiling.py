"""benchmarks.ceiling: the acceptance a drafter needs for a goal, from the one cost model."""

from __future__ import annotations

from benchmarks.ceiling import bench_rows, needed_alpha
from edgespec.core.costs import CostModel


def test_flat_verification_cost_needs_little_acceptance():
    # T(K) = T(1) for every K: gamma 63 drafts at c = 0 give (1 - a^64) / (1 - a) tokens per pass,
    # which reaches 1.25 at a = 0.2
    flat = CostModel({1: 1.0, 64: 1.0})
    assert abs(needed_alpha(flat, 0.0, 1.25) - 0.2) < 0.002
    # at c = 0.5 a draft token costs half a pass: with one draft at most, (1 + a) / 1.5 >= 1.25
    # -> a >= 0.875
    assert abs(needed_alpha(CostModel({1: 1.0, 64: 1.0}, gamma_max=1), 0.5, 1.25) - 0.875) < 0.002


def test_linear_verification_cost_never_pays():
    # T(K) = K T(1): verifying k drafts costs what decoding them would; no acceptance gives 1.25x
    linear = CostModel({1: 1.0, 2: 2.0, 64: 64.0})
    assert needed_alpha(linear, 0.0, 1.25) is None
    assert needed_alpha(linear, 0.0, 1.0) is not None  # alpha 1 just breaks even


def test_bench_rows_use_measured_alpha_by_depth_and_cost():
    costs = CostModel({1: 1.0, 2: 1.2, 3: 1.4, 4: 1.6, 64: 20.0})
    run = {"categories": {"overall": {  # results.json as edgespec.service.bench.runner writes it
        "baseline": {"speedup": 1.0, "stats": {"alpha_by_depth": []}},
        "learned g=auto": {"stats": {"alpha_by_depth": [0.9, 0.8, 0.7]}, "draft_cost": 0.01, "speedup": 1.3},
    }}}
    rows = bench_rows(costs, run)
    assert len(rows) == 3  # header, separator, the one configuration with measured depths
    best_g, best_s = costs.best_gamma([0.9, 0.8, 0.7], c=0.01, drafting=True)
    assert f"{best_s:.2f}x ({best_g})" in rows[2] and "0.90/0.80/0.70" in rows[2]
