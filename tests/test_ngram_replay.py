"""The replay that gamma auto's n-gram policy is designed with (benchmarks.ngram_replay): it runs
the engine's loop over a recorded greedy output, so its accounting must match what verification
would do. No model needed: the outputs here are made up."""

from __future__ import annotations

from benchmarks.ngram_replay import accepted_prefix, alternative, chain_table, replay
from edgespec.core.adaptive import AutoGamma
from edgespec.core.costs import CostModel
from edgespec.core.drafters.ngram import NgramDrafter
from edgespec.core.engine import FixedGamma

COSTS = CostModel({k: 0.010 + 0.002 * (k - 1) for k in range(1, 18)})
TEXT = list(range(100, 160))  # 60 distinct tokens


def test_a_copied_output_is_drafted_and_priced():
    """The output repeats the prompt: drafts are accepted, passes are fewer than tokens, and the
    replayed speedup is tokens * T(1) over the summed T(k+1)."""
    row = {"prompt": TEXT + [1] + TEXT[:8], "out": TEXT[8:48]}
    res = replay(row, FixedGamma(7), COSTS, NgramDrafter())
    assert res["calls"] == 5 and res["drafted_hist"] == {7: 5}  # 8 tokens per pass
    assert abs(res["speedup"] - 40 * 0.010 / (5 * COSTS.seconds(8))) < 1e-9
    auto = replay(row, AutoGamma(), COSTS, NgramDrafter())
    assert auto["speedup"] > 1.5


def test_text_that_never_repeats_is_decoded_plainly_by_gamma_auto():
    row = {"prompt": TEXT[:20], "out": TEXT[20:60]}
    res = replay(row, AutoGamma(), COSTS, NgramDrafter())
    assert res["drafted_hist"] == {0: 40} and abs(res["speedup"] - 1.0) < 1e-9


def test_a_fixed_gamma_drafts_only_where_the_drafter_has_a_match():
    """The engine's FixedGamma asks for 7 tokens on every step. The output copies the prompt for 8
    tokens (7 drafts and the bonus), then leaves it: the next draft is cut to the 2 tokens the
    budget leaves after its pass and rejected, and where the drafter has no match it proposes
    nothing, so the last two steps are plain passes."""
    row = {"prompt": TEXT[:10] + [1] + TEXT[:2], "out": TEXT[2:10] + [7, 8, 9]}
    res = replay(row, FixedGamma(7), COSTS, NgramDrafter())
    assert res["calls"] == 4 and res["drafted_hist"] == {7: 1, 2: 1, 0: 2}


def test_chain_table_counts_each_position_once_reached():
    """The output copies 3 tokens after a 4-token match, then leaves the copy. Position t's draft is
    right for 3 - t tokens; the match grows from 4 to 6 tokens at t = 2 (the whole "1 2 3 4 5 6").
    Size 4 (t = 0, 1): j=1 and j=2 right twice, j=3 once of twice, j=4 tried once and wrong, j=5
    never reached. Size 6 (t = 2, 3): j=1 right once of twice, j=2 tried once."""
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4]
    table = chain_table([{"prompt": prompt, "out": [5, 6, 7, 50]}])
    assert table[4][:5] == [[2, 2], [2, 2], [1, 2], [0, 1], [0, 0]]
    assert table[6][:3] == [[1, 2], [0, 1], [0, 0]] and set(table) == {4, 6}
    assert accepted_prefix([5, 6, 7, 8], [5, 6, 7, 50]) == 3


def test_alternative_is_another_occurrence_with_a_different_next_token():
    ctx = [7, 8, 1, 7, 8, 2, 9, 7, 8]
    assert alternative(ctx, 2, first=2, m=2) == [1, 7]
    assert alternative(ctx, 2, first=1, m=2) == [2, 9]
    assert alternative(ctx, 3, first=2, m=2) == []


def test_the_benchmarks_refuse_bad_input_in_one_line():
    """An unknown model (or nothing to replay) is a one-line error and exit 1, not a traceback."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    cases = [("exact_check", "--models"), ("grammar_mask", "--target"), ("ngram_replay", "--target"),
             ("pass_cost", "--target"), ("short_open", "--target")]
    for module, option in cases:
        res = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", option, "no-such-model"], cwd=root,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 1 and "Traceback" not in res.stderr, (module, res.stderr[-2000:])
        assert res.stderr.strip().splitlines()[-1].startswith("error: unknown model 'no-such-model'"), (module, res.stderr)
    res = subprocess.run([sys.executable, "-m", "benchmarks.ngram_replay", "--grounded", "0", "--open", "0"], cwd=root,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and res.stderr.strip() == "error: no prompts to replay: --grounded and --open are both 0"
