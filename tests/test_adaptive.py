"""AutoGamma's choices follow the cost profile and the measured acceptance (simulated acceptance,
no model needed), and on a real model its costs come from a stored profile, so they do not change
from run to run."""

from __future__ import annotations

import json

import pytest

from edgespec.core import costs as costs_mod
from edgespec.core.adaptive import AutoGamma
from edgespec.core.costs import CostModel
from edgespec.core.drafters import Hint
from edgespec.runtime import backend, profiles
from edgespec.runtime.exactness import PROBE_TEXT
from edgespec.runtime.profiles import profile, profile_dir


def costs(per_row: float, c: float = 0.0, max_rows: int | None = None) -> CostModel:
    """T(K) = 10 ms * (1 + per_row * (K - 1)) at the row counts a profile stores."""
    return CostModel({k: 0.01 * (1 + per_row * (k - 1)) for k in (1, 2, 3, 5, 9, 17)}, c, max_rows)


def match(size: int) -> Hint:
    """The n-gram drafter's hint: its proposal copies on from a match of `size` tokens."""
    return Hint(size, copies=True)


def auto(cm: CostModel) -> AutoGamma:
    policy = AutoGamma()
    policy.start(cm)
    return policy


def feed(policy: AutoGamma, steps: int, alpha_hits: float) -> list[int]:
    """Simulated generation: drafts are accepted while a deterministic pattern says so."""
    chosen = []
    hits = 0.0
    for _ in range(steps):
        k = policy.choose(Hint())
        chosen.append(k)
        n_acc = 0
        for _ in range(k):
            hits += alpha_hits
            if hits >= 1.0:
                hits -= 1.0
                n_acc += 1
            else:
                break
        policy.observe(k, n_acc)
    return chosen


def test_compute_bound_target_with_poor_drafts_stays_plain():
    policy = auto(costs(1.0))
    chosen = feed(policy, 200, 0.3)
    assert sum(k == 0 for k in chosen[-100:]) >= 95  # verification costs as much as decoding


def test_poor_drafts_on_cheap_verification_mostly_plain():
    policy = auto(costs(0.3))
    chosen = feed(policy, 200, 0.3)
    assert policy.alpha_overall < 0.5
    assert sum(k == 0 for k in chosen[-100:]) >= 80  # only occasional probes


def test_cheap_verification_and_good_drafts_speculate_long():
    policy = auto(costs(0.03))
    chosen = feed(policy, 200, 0.95)
    assert policy.alpha_overall > 0.8
    assert min(chosen[-50:]) >= 6


def test_adapts_when_the_text_changes():
    policy = auto(costs(0.2))
    feed(policy, 100, 0.97)
    assert policy.choose(Hint()) > 4
    chosen = feed(policy, 100, 0.05)
    assert sum(k == 0 for k in chosen[-60:]) >= 50


def test_acceptance_is_kept_per_hint_and_probes_need_a_long_match():
    """n-gram hints: long matches that keep being accepted are drafted long while short matches
    that fail are left alone, in the same generation; short matches are never probed."""
    policy = auto(costs(0.5))
    for step in range(300):
        hint = 16 if step % 2 else 1
        k = policy.choose(match(hint))
        if hint == 1 and step > 100:
            assert k == 0
        policy.observe(k, k if hint == 16 else 0)
    assert policy.choose(match(16)) >= 8 and policy.choose(match(1)) == 0


def test_a_new_generation_starts_from_the_prior():
    policy = auto(costs(0.2))
    feed(policy, 100, 0.97)
    policy.start(costs(0.2))
    assert policy.alpha_overall == 0.5 and policy.choose(Hint()) == auto(costs(0.2)).choose(Hint())


def test_a_draft_that_costs_as_much_as_the_target_is_not_used():
    """c close to 1 (a same-size draft): even perfect acceptance cannot pay, so no drafts (not
    even probes) are sent."""
    policy = auto(costs(0.3, c=0.9))
    chosen = []
    for _ in range(200):
        k = policy.choose(Hint())
        chosen.append(k)
        policy.observe(k, k)
    assert sum(chosen) == 0


def test_exact_mode_cap_bounds_every_choice():
    """A cost model whose passes are batch-invariant only up to 5 rows never lets a draft exceed 4."""
    policy = auto(costs(0.03, max_rows=5))
    chosen = feed(policy, 200, 0.99)
    assert max(chosen) == 4 and costs(0.03, max_rows=5).draft_cap == 4
    assert costs(0.03, max_rows=1).draft_cap == 0 and max(feed(auto(costs(0.03, max_rows=1)), 50, 0.99)) == 0


def test_cost_model_extrapolates_and_predicts():
    cm = CostModel({1: 0.01, 2: 0.012, 4: 0.016}, gamma_max=8)
    assert cm.seconds(3) == pytest.approx(0.014)  # linear in between
    assert cm.seconds(6) == pytest.approx(0.020)  # beyond: along the last segment's slope
    assert cm.t_ratio(4) == pytest.approx(1.6)
    assert cm.speedup(0.0, 3) < 1 and cm.speedup(1.0, 3) == pytest.approx(4 / 1.6)
    # a run that drafted 3 on every step at alpha 1 is predicted E/T = 4/1.6
    assert cm.predicted_for({3: 10}, 1.0) == pytest.approx(4 / 1.6)


def test_measured_speedup_never_exceeds_tokens_per_call():
    """A stored T(1) slower than this run's passes (a profile measured under load) never makes the
    measured speedup exceed tokens per target call: a step cannot cost less than one single-token pass."""
    cm = CostModel({1: 0.05, 2: 0.06})  # a stale, too-slow T(1)
    s = cm.measured_speedup(tokens=103, calls=100, seconds=1.0)  # 10 ms per step
    assert s <= 1.03 + 1e-9
    assert cm.measured_speedup(tokens=300, calls=100, seconds=2.0, t1=0.01) == pytest.approx(1.5)


def test_profile_is_measured_once_and_reused(smollm2_path, tmp_path, monkeypatch):
    from edgespec.runtime.llama import Model

    monkeypatch.setenv("EDGESPEC_PROFILES", str(tmp_path))
    model = Model(smollm2_path, n_ctx=256)
    try:
        first = profile(model, [1, 2, 5]).pass_s.copy()
        assert all(t > 0 for t in first.values())
        (stored,) = profile_dir().glob("*.json")
        data = json.loads(stored.read_text())
        assert data["pass_s"] == {str(k): v for k, v in first.items()}
        assert data["cpu"] == backend.this_cpu().model and data["cpu_variant"]
        profiles._loaded.clear()
        assert profile(model, [1, 5]).pass_s == first  # read back, not re-measured
        more = profile(model, [1, 3]).pass_s  # a missing row count is measured and added
        assert more[1] == first[1] and set(json.loads(stored.read_text())["pass_s"]) == {"1", "2", "3", "5"}
    finally:
        model.close()


def test_a_profile_from_another_processor_is_not_reused(smollm2_path, tmp_path, monkeypatch):
    """The key holds the CPU's identity: a profile stored under another processor's signature
    (a home folder carried to another machine) is never read; this CPU measures its own."""
    from edgespec.runtime.llama import Model

    monkeypatch.setenv("EDGESPEC_PROFILES", str(tmp_path))
    model = Model(smollm2_path, n_ctx=256)
    try:
        profiles._loaded.clear()
        here = profile(model, [1, 2]).pass_s.copy()
        (mine,) = tmp_path.glob("*.json")
        import edgespec.runtime.llama as rt

        be = rt.backend_info()
        other = backend.Cpu("Some Other CPU", frozenset({"avx2", "avx512f"}))
        monkeypatch.setattr(rt, "_backend", backend.Backend(be.mode, be.variant, be.module, be.others, other))
        assert profiles.profile_path(model) != mine
        profiles._loaded.clear()
        profile(model, [1, 2])
        assert len(list(tmp_path.glob("*.json"))) == 2  # measured again under the other key
        monkeypatch.setattr(rt, "_backend", be)
        profiles._loaded.clear()
        assert profile(model, [1, 2]).pass_s == here  # back on this CPU: its own profile again
    finally:
        model.close()


def test_a_profile_slower_than_the_machine_is_forgotten(smollm2_path, tmp_path, monkeypatch):
    """A profile measured on a loaded machine (stored T(1) much slower than the single-token passes
    a generation times) is marked stale and measured again on next use."""
    from edgespec.runtime.llama import Model

    monkeypatch.setenv("EDGESPEC_PROFILES", str(tmp_path))
    model = Model(smollm2_path, n_ctx=256)
    try:
        profiles._loaded.clear()
        prof = profile(model, [1, 2])
        cm = CostModel(prof.pass_s)
        t1 = prof.pass_s[1]
        assert not cm.check_t1(model, [t1] * 20)  # agrees: kept
        assert not cm.check_t1(model, [t1 / 2] * 3)  # too few passes to judge
        (stored,) = tmp_path.glob("*.json")
        data = json.loads(stored.read_text())
        # as if measured while a compiler shared the cores (every row count alike: a profile whose
        # T(2) came out below its T(1) is invalid on load and measured again at once)
        data["pass_s"] = {k: 3 * v for k, v in data["pass_s"].items()}
        stored.write_text(json.dumps(data))
        profiles._loaded.clear()
        slow = CostModel(profile(model, [1, 2]).pass_s)
        assert slow.check_t1(model, [t1] * 20)
        assert json.loads(stored.read_text())["stale"] is True
        assert profile(model, [1, 2]).pass_s[1] < 2 * t1  # measured again
    finally:
        model.close()


def test_a_long_match_is_drafted_at_once_where_verification_is_dear():
    """Costs shaped like the AMD EPYC's (Gemma: T(2)/T(1) 1.7, rows cheaper in multiples of 8):
    the first 16-token match of a generation is drafted long at once (the measured prior for long
    matches), a 1-token match is not drafted at all, and a long match that keeps failing is
    dropped."""
    cm = CostModel({1: 0.0155, 2: 0.026, 4: 0.034, 8: 0.052, 9: 0.073, 16: 0.091, 17: 0.112})
    policy = auto(cm)
    first = policy.choose(match(16))
    assert first >= 7 and cm.t_ratio(first + 1) < cm.t_ratio(first + 2)  # stops where rows get dear
    policy.observe(first, first)
    assert policy.choose(match(1)) == 0
    failing = auto(cm)
    chosen = []
    for _ in range(40):
        chosen.append(failing.choose(match(16)))
        failing.observe(chosen[-1], 0)
    assert chosen[0] >= 7 and sum(k > 0 for k in chosen[-20:]) <= 3  # only the odd probe


def test_match_prior_steps_down_to_the_tabled_size_and_short_matches_start_uninformed():
    from edgespec.core.adaptive import MATCH_PRIOR, PRIOR_MIN_MATCH, match_prior, size_class, start_prior

    assert match_prior(5) == MATCH_PRIOR[4] and match_prior(40) == MATCH_PRIOR[32] and match_prior(0) == 0.5
    assert size_class(100) == max(MATCH_PRIOR) and size_class(0) == 0
    assert MATCH_PRIOR[1] < MATCH_PRIOR[4] < MATCH_PRIOR[16] < MATCH_PRIOR[64]
    assert start_prior(PRIOR_MIN_MATCH - 1) == 0.5 and start_prior(16) == MATCH_PRIOR[16]
    # below, never more hopeful than measured: 1-token matches start at the table's figure
    assert start_prior(1) == MATCH_PRIOR[1] < 0.5 and start_prior(3) == 0.5 < MATCH_PRIOR[3]


def test_each_bundled_target_starts_from_its_own_table_and_others_from_the_lowest(smollm2_path, gemma_path):
    from edgespec.core.adaptive import MATCH_PRIOR, MEASURED_PRIORS, prior_table
    from edgespec.core.costs import ModelKind

    assert all(MATCH_PRIOR[n] == min(t[n] for t in MEASURED_PRIORS.values()) for n in MATCH_PRIOR)
    assert prior_table(ModelKind("llama", "7B", "Q4_K_M")) is MATCH_PRIOR and prior_table(None) is MATCH_PRIOR
    gemma, smollm2 = ModelKind.of(gemma_path), ModelKind.of(smollm2_path)
    assert gemma == ModelKind("gemma3", "268M", "Q4_K_M") and smollm2 == ModelKind("llama", "135M", "Q4_1")
    cm = CostModel({1: 0.0155, 2: 0.026, 4: 0.034, 8: 0.052, 9: 0.073, 16: 0.091, 17: 0.112})
    first = {}
    for kind in (gemma, smollm2, None):
        cm.target_kind = kind
        first[kind] = auto(cm).choose(match(6))
    # Gemma copies better than SmolLM2: its first 6-token match is drafted longer
    assert first[gemma] > first[smollm2] == first[None]


def test_a_renamed_copy_of_a_target_starts_from_the_same_prior(smollm2_path, tmp_path):
    """The prior is keyed by what the model is (its GGUF metadata), not by its file's name."""
    import os
    import shutil

    from edgespec.core.adaptive import MATCH_PRIOR, MEASURED_PRIORS, prior_table
    from edgespec.core.costs import ModelKind

    copy = tmp_path / "my-assistant-v2.gguf"
    try:
        os.link(smollm2_path, copy)
    except OSError:  # another filesystem
        shutil.copyfile(smollm2_path, copy)
    assert ModelKind.of(copy) == ModelKind.of(smollm2_path)
    assert prior_table(ModelKind.of(copy)) is MEASURED_PRIORS[ModelKind.of(smollm2_path)] is not MATCH_PRIOR
    assert ModelKind.of(tmp_path / "missing.gguf") is None


def test_chain_acceptance_generalises_the_geometric_formula():
    """Per-position acceptance that is the same everywhere gives the paper's E and the same choice;
    acceptance that grows along the draft (a copy) pays for a longer draft than its first token's."""
    assert costs_mod.expected_tokens([0.8] * 7, 7) == pytest.approx(costs_mod.expected_tokens(0.8, 7))
    cm = costs(0.15)
    assert cm.best_gamma([0.8] * 16) == pytest.approx(cm.best_gamma(0.8))
    growing = [0.6, 0.85, 0.9, 0.95] + [0.99] * 12
    assert cm.best_gamma(growing)[0] > cm.best_gamma(0.6)[0]


def test_long_drafts_only_at_profiled_row_counts():
    """Beyond K_MAX rows only the measured row counts are candidates (no trust in interpolation),
    and a copy accepted in full is drafted as long as the curve pays for."""
    pass_s = {k: 0.015 + 0.005 * (k - 1) for k in range(1, profiles.K_MAX + 1)}
    pass_s.update({24: 0.13, 32: 0.16, 64: 0.30})
    cm = CostModel(pass_s, gamma_max=63)
    assert cm.best_gamma(1.0)[0] == 63
    for alpha in (0.9, 0.97, 0.99, 0.999):
        g = cm.best_gamma([alpha] * 63)[0]
        assert g <= profiles.K_MAX - 1 or g + 1 in pass_s
    assert profiles.profile_rows(40) == [*range(1, profiles.K_MAX + 1), 24, 32]


def test_a_short_match_that_keeps_copying_is_drafted_longer():
    """Acceptance is kept by the size a match has grown to: once 4-token matches have been copied
    in full a few times, the next 4-token match is drafted past its first few tokens."""
    cm = CostModel({1: 0.0155, 2: 0.026, 4: 0.034, 8: 0.052, 9: 0.073, 16: 0.091, 17: 0.112})
    policy = auto(cm)
    first = policy.choose(match(4))
    for _ in range(6):
        k = policy.choose(match(4)) or 3
        policy.observe(k, k)
    assert policy.choose(match(4)) >= 7 and policy.choose(match(4)) > first


def test_profile_passes_run_after_real_context(smollm2_path):
    """T(K) is timed after CONTEXT_AT tokens (capped by the context), and the cache is left as it
    was found."""
    from edgespec.runtime.llama import Model

    model = Model(smollm2_path, n_ctx=128)
    try:
        seen = []
        decode = model.decode

        def spy(tokens, n_logits=1, hidden=False):
            seen.append((model.n_past, len(tokens), n_logits))
            return decode(tokens, n_logits, hidden)

        model.decode = spy
        got = profiles.measure_pass_costs(model, [1, 3], repeats=1)
        assert set(got) == {1, 3} and all(t > 0 for t in got.values())
        at = min(profiles.CONTEXT_AT, model.n_ctx - 3 - 1)
        assert seen[0] == (0, at, 0)  # the context, no logits
        assert {s for s in seen[1:]} == {(at, 1, 1), (at, 3, 3)}  # every timed pass after it
        assert model.n_past == 0
        # a cache in use (a conversation the next turn reuses) is kept: filler goes after it
        held = model.tokenize(PROBE_TEXT, add_special=True)[:40]
        decode(held, n_logits=0)
        seen.clear()
        profiles.measure_pass_costs(model, [1, 3], repeats=1)
        assert seen[0] == (40, at - 40, 0) and {s for s in seen[1:]} == {(at, 1, 1), (at, 3, 3)}
        assert model.cached == tuple(held)
    finally:
        model.close()


# The real pair's shape on a 2-core Xeon (NOTES: Qwen2.5-Coder-1.5B T(K) in ms, 0.5B draft c = 0.56).
QWEN15_MS = {1: 61, 2: 100, 3: 118, 4: 112, 5: 150, 8: 200, 9: 215, 16: 250, 17: 305}


def test_costly_draft_model_is_declined_and_says_why_before_drafting():
    policy = auto(CostModel({k: ms / 1000 for k, ms in QWEN15_MS.items()}, c=0.56))
    chosen = [policy.choose(Hint()) for _ in range(40)]
    for k in chosen:
        policy.observe(k, 0)
    assert chosen == [0] * 40  # even 95% acceptance cannot pay at c = 0.56
    d = policy.decline()
    assert d is not None and not d["alpha_measured"] and d["alpha"] == 0.95
    # The best any draft length gives here, from the same cost model gamma auto plans with:
    best = max(policy.costs.speedup(0.95, g) for g in range(1, 17))
    assert d["best_speedup"] == pytest.approx(best, abs=1e-3) and 1.0 < best < policy.margin
    note = policy.fallback_note()
    assert note.startswith("gamma auto: plain decoding on 40 of 40 steps: even at alpha 0.95")
    assert "draft cost c 0.56 of a target pass" in note and note.endswith("needs 1.10x; declined")


def test_poor_measured_acceptance_is_reported_with_its_evidence():
    policy = auto(costs(0.3))
    feed(policy, 200, 0.2)
    d = policy.decline()
    assert d["alpha_measured"] and d["tested"] > 0
    assert d["alpha"] == pytest.approx(policy.alpha_overall, abs=1e-3) and d["alpha"] < 0.4
    assert d["best_speedup"] < policy.margin
    assert f"measured over {d['tested']} tokens" in policy.fallback_note()


def test_nothing_to_draft_is_named_as_such():
    policy = auto(costs(0.3))
    for _ in range(30):
        policy.observe(policy.choose(Hint.nothing()), 0)
    assert policy.fallback_note().endswith("the drafter had nothing to propose on 30 (no match in the context)")


def test_a_few_long_copies_that_made_most_of_the_text_are_not_a_decline():
    """Plain steps on the text between copies are most of the steps but few of the tokens: two
    accepted 16-token copies (34 tokens) against 8 steps with nothing to copy is speculation that ran."""
    policy = auto(costs(0.1))
    for _ in range(4):
        policy.observe(policy.choose(Hint.nothing()), 0)
    for _ in range(2):
        k = policy.choose(match(16))
        assert k == 16
        policy.observe(k, k)
    for _ in range(4):
        policy.observe(policy.choose(Hint.nothing()), 0)
    assert policy.decline() is None and policy.fallback_note() is None
    for _ in range(26):  # now plain steps made as many tokens (34) as the copies
        policy.observe(policy.choose(Hint.nothing()), 0)
    assert policy.fallback_note().endswith("the drafter had nothing to propose on 34 (no match in the context)")


def test_a_decline_where_drafting_pays_on_average_names_the_steps_estimate():
    """Long copies were accepted (alpha high, drafting pays at that alpha), but most of the text came
    from steps whose proposals (1-token matches) were estimated not to pay: the line must not claim
    the measured alpha was too low."""
    policy = auto(costs(0.5))
    for _ in range(2):
        k = policy.choose(match(16))
        assert k > 0
        policy.observe(k, k)
    for _ in range(60):
        assert policy.choose(match(1)) == 0  # a 1-token match is estimated not to pay here
        policy.observe(0, 0)
    d = policy.decline()
    assert d is not None and d["alpha_measured"] and d["best_speedup"] >= d["needs"]
    note = policy.fallback_note()
    assert note.endswith("yet the proposals of those steps were estimated below 1.10x; declined there")
    assert "needs 1.10x; declined" not in note


def test_a_drafter_that_pays_is_not_declined():
    policy = auto(costs(0.1))
    feed(policy, 200, 0.9)
    assert policy.decline() is None and policy.fallback_note() is None


def test_best_gamma_drafting_reports_the_best_length_even_below_plain():
    cm = CostModel({k: ms / 1000 for k, ms in QWEN15_MS.items()}, c=0.56)
    assert cm.best_gamma(0.6) == (0, 1.0)
    g, s = cm.best_gamma(0.6, drafting=True)
    assert g >= 1 and s == pytest.approx(max(cm.speedup(0.6, k) for k in range(1, 64)), abs=1e-9) and s < 1.0


def test_draft_lengths_land_on_the_cheap_tile_row_counts():
    """With the 1.5B's measured curve (NOTES: repacked kernels fill tiles of 4 rows, so T(4) < T(3)
    and T(16) ~ T(12)), every acceptance picks a draft whose pass fills a tile: 3, 15 or 63 drafts,
    never the dearer neighbours."""
    ms = {1: 61, 2: 100, 3: 118, 4: 112, 8: 200, 12: 250, 16: 251, 17: 305, 32: 435, 64: 720}
    cm = CostModel({k: v / 1000 for k, v in ms.items()}, 0.0)
    picks = {a: cm.best_gamma(a)[0] for a in (0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99)}
    assert set(picks.values()) <= {3, 15, 63}, picks
    assert picks[0.6] == 3 and picks[0.95] == 15


def test_a_draft_models_catch_up_is_paid_by_the_step_that_drafts():
    """Issue 30: a draft model's first pass also decodes the committed tokens it has not seen
    (Hint.catch_up_s). Gamma auto adds it to the step's cost, once per step however long the
    draft, declines where it eats the gain, and counts it in the drafting its plans assumed."""
    cm = costs(0.05, c=0.3)
    t1 = cm.seconds(1)
    assert cm.drafting_cost(3, catch_up=0.5) == pytest.approx(3 * 0.3 + 0.5)
    assert cm.step_cost(3, catch_up=0.5) == pytest.approx(cm.step_cost(3) + 0.5)
    assert cm.speedup(0.9, 3, catch_up=0.5) < cm.speedup(0.9, 3)
    policy = auto(cm)
    feed(policy, 60, 0.97)
    assert policy.choose(Hint()) > 0
    assert policy.choose(Hint(catch_up_s=20 * t1)) == 0  # no draft length wins back 20 passes, not even a probe's
    before = policy.planned_draft_s
    g = policy.choose(Hint(catch_up_s=0.5 * t1))
    assert g > 0
    policy.observe(g, g)
    assert policy.planned_draft_s - before == pytest.approx((g * 0.3 + 0.5) * t1)
    assert policy.snapshot()["planned_draft_s"] == policy.planned_draft_s
