"""`Stats`: counting steps (alpha by draft depth included, a step a stop string ended in), pooling
generations with `merge`, and the round trip through `to_dict` / `from_dict`."""

from __future__ import annotations

from dataclasses import replace

import pytest

from edgespec.core.drafters.ngram import NgramDrafter
from edgespec.core.engine import Engine, FixedGamma, GenerationConfig
from edgespec.core.stats import PLAIN_KEEP, Stats, speedup


def test_alpha_by_depth_counts_each_tested_draft_at_its_depth():
    st = Stats()
    st.record_step(4, 2, 3)  # d1 d2 accepted, d3 rejected, d4 never tested
    st.record_step(3, 3, 4)  # d1 d2 d3 accepted, bonus
    st.record_step(0, 0, 1)  # plain step: no depth
    st.record_step(5, 0, 1)  # d1 rejected
    assert st.depth_tested == [3, 2, 2]
    assert st.depth_accepted == [2, 2, 1]
    assert st.alpha_by_depth == [pytest.approx(2 / 3), 1.0, 0.5]
    assert (st.accepted, st.rejections, st.drafted) == (5, 2, 12)
    assert st.alpha == pytest.approx(5 / 7)  # the depths pooled
    assert st.to_dict()["alpha_by_depth"] == st.alpha_by_depth


def test_alpha_by_depth_stops_at_the_generations_end():
    st = Stats()
    # 4 drafts all accepted, but the 2nd token produced was end-of-generation: depths 1-2 only
    st.record_step(4, 4, 1, end=2)
    assert (st.depth_tested, st.depth_accepted) == ([1, 1], [1, 1])
    st = Stats()
    # 1 of 4 accepted, the correction is the last token allowed: d2 was tested (rejected) before the end
    st.record_step(4, 1, 2, end=2)
    assert (st.depth_tested, st.depth_accepted) == ([1, 1], [1, 0])
    assert st.alpha_by_depth == [1.0, 0.0]


def test_a_step_a_stop_string_ended_in_counts_to_the_stop_strings_end():
    """A stop string begun by a token an earlier step counted as answer and completed by the 2nd
    token of a fully accepted 5-draft step: the answer loses that token, the step's drafts count up
    to its 2nd token, and the end tokens are the stop string's three."""
    st = Stats()
    st.record_step(2, 0, 1, source="context")
    st.record_step(5, 5, -1, end=2, source="answers")
    assert (st.generated, st.end_tokens, st.produced) == (0, 3, 3)
    assert st.source_drafted == {"context": 2, "answers": 2} and st.source_accepted == {"context": 0, "answers": 2}
    assert st.depth_tested == [2, 1]  # depths 3-5 came after the end: never tested
    assert st.depth_accepted == [1, 1]
    assert (st.drafted, st.accepted, st.rejections) == (4, 2, 1)
    assert st.accepted_hist == {0: 1, 2: 1}


def two_runs() -> tuple[Stats, Stats]:
    a = Stats(prompt_tokens=10, generated=30, end_tokens=1, target_calls=10, drafted=40, accepted=20, rejections=8,
              prefill_s=0.5, draft_s=0.1, wall_s=2.5, ttft_s=0.6, target_bytes=1000,
              drafted_hist={4: 10}, accepted_hist={0: 2, 2: 4, 4: 4}, plain_pass_s=[0.01],
              pass_s={5: [0.02, 0.03]}, depth_tested=[10, 8, 6, 4], depth_accepted=[8, 6, 4, 2])
    b = Stats(prompt_tokens=20, generated=10, target_calls=10, drafted=0, prefill_s=0.5, wall_s=1.5,
              ttft_s=0.8, target_bytes=1000, drafted_hist={0: 10}, plain_pass_s=[0.02, 0.03], pass_s={1: [0.01]})
    return a, b


def test_merge_pools_counters_so_properties_are_the_pooled_figures():
    a, b = two_runs()
    m = Stats.merge([a, b])
    assert (m.prompt_tokens, m.generated, m.target_calls, m.drafted, m.accepted) == (30, 40, 20, 40, 20)
    assert m.tokens_per_s == pytest.approx(40 / 3.0)  # 40 tokens over 2.0 + 1.0 decode seconds
    assert m.acceptance_rate == pytest.approx(0.5)
    assert m.alpha == pytest.approx(20 / 28)
    assert m.tokens_per_call == pytest.approx(41 / 20)
    assert m.mean_accepted == pytest.approx(1.0)
    assert m.ttft_s == pytest.approx(0.7) and m.target_bytes == 1000
    assert m.drafted_hist == {4: 10, 0: 10} and m.accepted_hist == {0: 2, 2: 4, 4: 4}
    assert m.plain_pass_s == [0.01, 0.02, 0.03] and m.pass_s == {5: [0.02, 0.03], 1: [0.01]}
    assert m.alpha_by_depth == [0.8, 0.75, pytest.approx(2 / 3), 0.5]
    # depth lists of different lengths add up position by position
    c = Stats(depth_tested=[2, 2], depth_accepted=[2, 1])
    assert Stats.merge([a, c]).depth_tested == [12, 10, 6, 4]
    assert Stats.merge([c, a]).depth_accepted == [10, 7, 4, 2]
    assert Stats.merge([]) == Stats()


def test_merge_of_one_is_a_copy_that_shares_nothing():
    a, _ = two_runs()
    c = a.copy()
    assert c == a
    c.drafted_hist[4] += 1
    c.pass_s[5].append(1.0)
    c.plain_pass_s.append(1.0)
    c.depth_tested[0] += 1
    assert a == two_runs()[0]


def test_to_dict_and_back_keeps_every_counter():
    a, _ = two_runs()
    back = Stats.from_dict(a.to_dict())
    assert back == replace(a, plain_pass_s=[], pass_s={})  # to_dict keeps only their medians
    assert back.tokens_per_s == a.tokens_per_s and back.alpha_by_depth == a.alpha_by_depth


def test_record_plain_pass_keeps_the_last_ones():
    st = Stats()
    for i in range(PLAIN_KEEP + 5):
        st.record_plain_pass(float(i))
    assert len(st.plain_pass_s) == PLAIN_KEEP and st.plain_pass_s[0] == 5.0


def test_depth_counts_agree_with_the_engines_other_counters(smollm2):
    """On a real generation: depth 1 is tested once per step that drafted and accepted once per step
    that kept a draft (accepted_hist), and the depths add up to accepted and accepted + rejections."""
    text = "one two three four five six seven eight nine ten. " * 4 + "Repeat: one two three"
    prompt = smollm2.tokenize(text)
    events = list(Engine(smollm2, NgramDrafter(1, 4), FixedGamma(6)).generate(prompt, GenerationConfig(max_tokens=48)))
    st = events[-1].stats
    assert st.accepted > 0 and st.rejections > 0
    assert st.depth_tested[0] == sum(st.accepted_hist.values()) == sum(e.drafted > 0 for e in events)
    assert st.depth_accepted[0] == sum(n for a, n in st.accepted_hist.items() if a >= 1)
    assert sum(st.depth_accepted) == st.accepted
    assert sum(st.depth_tested) == st.accepted + st.rejections
    assert len(st.depth_tested) <= 6


def test_speedup_is_one_rate_over_another():
    """The one speedup of two measured rates: their ratio, and 0.0 when there is no baseline rate."""
    assert speedup(30.0, 20.0) == pytest.approx(1.5) and speedup(20.0, 20.0) == 1.0
    assert speedup(12.0, 0.0) == 0.0
