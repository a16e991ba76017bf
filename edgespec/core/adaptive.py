"""Adaptive draft length: pick gamma each step to maximise the predicted speedup

    S(gamma) = (1 - alpha^(gamma+1)) / ((1 - alpha) (gamma c + T(gamma+1)/T(1)))

  alpha   acceptance rate of draft tokens, measured while generating (recent drafts weigh more),
  T(K)    seconds for a target pass over K rows (so T(K)/T(1) is the verification cost),
  c       seconds to draft one token relative to T(1); a draft model also pays, once per step, for
          decoding the committed tokens it has not seen (Hint.catch_up_s), added to the denominator.
T(K) and c come from the one cost model (`edgespec.core.costs`, the machine's stored profile), not from
live timings: the choices then depend only on the tokens, so a seeded or greedy run gives the same
text every time. gamma = 0 (plain decoding) is chosen whenever no gamma is predicted to beat it by
`margin`. Because alpha is only observed while drafting, a short probe draft is sent now and then
so a change in the text (e.g. the model starts copying its input) is noticed.

For n-gram drafts, acceptance is not one alpha but one per draft position (token j given 1..j-1
accepted; `costs.expected_tokens`), read by the size the match has grown to (MATCH_PRIOR).
A drafter that estimates its own acceptance per position (Hint.confidence: the suffix drafter's
candidates from earlier answers, calibrated by its record of what came true) is planned with those
estimates as given, and never probed (its estimate is already evidence). Tokens a hint calls
certain (Hint.certain: a grammar's forced tokens) lead the plan at acceptance 1 and no drafting
cost, and are no evidence about the drafter's own tokens after them.
Drafts run as long as the cost profile goes (`costs.GAMMA_MAX`), at row counts it measured.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import NamedTuple

from edgespec.core.costs import CostModel, ModelKind
from edgespec.core.drafters import Hint
from edgespec.core.stats import tested_drafts

# P(a token copied from an n-gram match is accepted | size of the match), greedy, per target: the
# prior gamma auto starts each generation from. Measured by `python -m benchmarks.ngram_replay
# --table --target T` (docs/gamma_auto.md has the prompts and what the tables show), pooled over
# draft positions, keyed by what the target is (architecture, size, quantization, from its GGUF
# metadata), so a renamed copy of a model starts from its table.
# A draft copies on from its match, so once its first j-1 tokens were right, its j-th token continues
# a match of size h+j-1: acceptance along a draft is read at growing sizes. The replay's chain table
# bears that out, and it is why a copy can be drafted long.
MEASURED_PRIORS = {
    ModelKind("gemma3", "268M", "Q4_K_M"): {1: 0.355, 2: 0.546, 3: 0.647, 4: 0.860, 6: 0.916, 8: 0.952, 12: 0.944,
                                            16: 0.984, 24: 0.992, 32: 0.994, 48: 0.994, 64: 0.996},
    ModelKind("llama", "135M", "Q4_1"): {1: 0.212, 2: 0.490, 3: 0.618, 4: 0.747, 6: 0.768, 8: 0.870, 12: 0.935,
                                         16: 0.960, 24: 0.978, 32: 0.987, 48: 0.983, 64: 0.991},
}
# Any other target starts from the lowest of the measured tables at each size: a prior that is too
# high costs more than one too low (a failed draft wastes a verification of its rows, a missed one
# only the tokens it would have won; in replay the other target's table cost both).
MATCH_PRIOR = {n: min(t[n] for t in MEASURED_PRIORS.values()) for n in next(iter(MEASURED_PRIORS.values()))}
_SIZES = sorted(MATCH_PRIOR)
# Gamma auto learns acceptance per size class within a generation, starting from the target's
# table, worth PRIOR_WEIGHT drafted tokens, from PRIOR_MIN_MATCH up. Below it a size starts
# uninformed (0.5), or at the table's figure where that is lower (1- and 2-token matches): the
# first token of a short match is right less often than a whole draft needs, and on a short
# answer a failed draft costs more than the copy can win back.
PRIOR_WEIGHT = 2.0
PRIOR_MIN_MATCH = 6


def prior_table(target: ModelKind | None) -> dict[int, float]:
    """The measured table for what the target is, else the conservative MATCH_PRIOR."""
    return MEASURED_PRIORS.get(target, MATCH_PRIOR) if target is not None else MATCH_PRIOR


def size_class(size: int) -> int:
    """The tabled match size that `size` falls in (the largest one not above it; 0 below all)."""
    i = bisect.bisect_right(_SIZES, size)
    return _SIZES[i - 1] if i else 0


def match_prior(size: int, table: dict[int, float] = MATCH_PRIOR) -> float:
    """`table` at `size` (the largest tabled size not above it), 0.5 for sizes below the table."""
    return table.get(size_class(size), 0.5)


def start_prior(size: int, table: dict[int, float] = MATCH_PRIOR) -> float:
    """What gamma auto expects of a copied token before anything was observed at its size: the
    measured acceptance from PRIOR_MIN_MATCH up; below, an uninformed 0.5 unless the table says
    less. (At 0.5 every generation tried a 2-token draft at each of the sizes 1-4 once: on the real
    1.5B's open-ended answers those failed nearly always, docs/gamma_auto.md.)"""
    measured = match_prior(size, table)
    return measured if size >= PRIOR_MIN_MATCH else min(0.5, measured)


@dataclass(frozen=True)
class Context:
    """What gamma auto keeps one acceptance rate for: the context a draft is made in.

    kind 'state': a drafter that tells nothing before drafting (a draft model); acceptance per
    outcome of its last draft (`last_full`: it was accepted in full), as drafts come in runs (a
    model copying its input accepts whole drafts, then stops copying).
    kind 'hint': a drafter that names a size class but does not copy; acceptance per `size`.
    kind 'match': an n-gram copy from a match of `size` tokens; acceptance is kept per size class
    (`SizeClass`) and read at growing sizes along the draft.
    kind 'confidence': the drafter's own per-token estimates (`confidence`), taken as given.
    `source` is the drafter's source that will propose ('' = the drafter)."""

    kind: str
    source: str = ""
    size: int | None = None
    last_full: int | None = None
    confidence: tuple[float, ...] = ()


class SizeClass(NamedTuple):
    """n-gram acceptance is kept per source and size class (`size_class`) of the match a token continues."""

    source: str
    size: int


class PlanKey(NamedTuple):
    """A plan holds until the next draft is verified, for the same context and draft costs."""

    context: Context
    c: float | None
    catch_up: float
    certain: int = 0


@dataclass
class Evidence:
    """Acceptance as a geometric process: `successes` = accepted draft tokens, `trials` = accepted +
    rejections, both decayed (recent drafts weigh more); the rate is successes / trials (MLE). It
    starts from a prior worth PRIOR_WEIGHT trials."""

    successes: float
    trials: float

    @classmethod
    def prior(cls, rate: float) -> Evidence:
        return cls(PRIOR_WEIGHT * rate, PRIOR_WEIGHT)

    @property
    def rate(self) -> float:
        return self.successes / self.trials

    def add(self, hits: float, n: int, decay: float) -> None:
        """`hits` successes in `n` trials, older evidence (the prior included) decaying by `decay` per trial."""
        d = decay**n
        self.successes = d * self.successes + hits
        self.trials = d * self.trials + n


class AutoGamma:
    label = "auto"

    def __init__(
        self,
        gamma_max: int | None = None,
        halflife_tokens: float = 16.0,
        probe_every: int = 8,
        probe_gamma: int = 2,
        probe_min_hint: int = 8,
        margin: float = 1.10,
    ) -> None:
        self.gamma_max = gamma_max  # None: as long as the cost profile goes (costs.GAMMA_MAX)
        self.decay = 0.5 ** (1.0 / halflife_tokens)
        self.probe_every = probe_every
        self.probe_gamma = probe_gamma
        # With hints, probe only where the drafter matched a long span (text that has started to
        # repeat); a failed probe on a short match costs a pass over its rows for nothing, and on
        # open-ended text short matches are most of the steps (docs/gamma_auto.md).
        self.probe_min_hint = probe_min_hint
        self.margin = margin  # predicted speedup must beat plain decoding by this factor
        self.start(None)

    def start(self, costs: CostModel | None) -> None:
        """A new generation: forget acceptance (the previous text says little about the next)."""
        self.costs = costs
        self._table = prior_table(costs.target_kind if costs is not None else None)
        # Acceptance per context (`Context`), from a weak prior of 0.5.
        self._contexts: dict[Context, Evidence] = {}
        # n-gram matches: acceptance per source and size class, every drafted token counted at the
        # size its match had grown to (MATCH_PRIOR's comment), from the measured prior.
        self._sizes: dict[SizeClass, Evidence] = {}
        self._plans: dict[PlanKey, tuple[int, float]] = {}  # -> best_gamma, until observe
        # decline's best_gamma by its arguments: the reply's policy is read after every step, and
        # on the steps that do not draft nothing it depends on changes (issue 44, item 39)
        self._decline_plan: tuple[tuple, tuple[int, float]] | None = None
        self._state = 0  # 1 if the last draft was accepted in full
        self._key = Context("state", last_full=0)
        self._since_draft = 0
        self.last_choice = 0
        self.last_predicted = 1.0
        self._steps = 0
        self._steps_plain = 0
        self._steps_nothing = 0  # steps whose drafter had nothing to propose (hint 0)
        self._tested = 0  # draft tokens verified (accepted + first rejections): alpha's evidence
        self._drafting_tokens = 0  # tokens the steps that drafted produced (accepted + correction/bonus)
        self._probe_interval = self.probe_every
        self._probing = False
        self._draft_costs: tuple[float | None, float] = (None, 0.0)  # the last choose's (c, catch-up)
        self._certain = 0  # the last hint's certain tokens (Hint.certain)
        self._nothing = False  # the last hint had nothing to propose after them
        self._planned_draft = 0.0  # drafting the steps that drafted cost by the plans, in T(1)s
        self._plain_catch_up = 0.0  # catch-ups (in T(1)s) that drafting would have cost on the plain steps

    # ------------------------------------------------------------------ estimates
    def _size_alpha(self, source: str, size: int) -> float:
        cls = size_class(size)
        ev = self._sizes.get(SizeClass(source, cls))
        return (ev or Evidence.prior(start_prior(cls, self._table))).rate

    def _alphas(self) -> float | list[float]:
        """Acceptance for the next draft in the context of the last `choose`: per draft position
        for an n-gram match (token j continues a match of size + j - 1), else one rate; per
        position after the hint's certain tokens (1 each) when it has some."""
        if not self._certain:
            return self._own_alphas()
        if self._nothing:
            return [1.0] * self._certain
        own = self._own_alphas()
        return ([1.0] * self._certain + (own if isinstance(own, list) else [own] * self._cap()))[: self._cap()]

    def _own_alphas(self) -> float | list[float]:
        """`_alphas` of the drafter's own tokens (after the certain ones)."""
        key = self._key
        if key.kind == "confidence":  # the drafter's own per-token estimates, as long as its proposal
            return list(key.confidence[: self._cap()])
        if key.kind == "match":
            return [self._size_alpha(key.source, key.size + j) for j in range(self._cap())]
        return (self._contexts.get(key) or Evidence.prior(0.5)).rate

    @property
    def alpha(self) -> float:
        """Acceptance rate expected for the next draft's first token (context of the last `choose`)."""
        a = self._alphas()
        return a if isinstance(a, float) else a[0]

    @property
    def alpha_overall(self) -> float:
        succ = sum(e.successes for e in self._contexts.values()) + sum(e.successes for e in self._sizes.values())
        trials = sum(e.trials for e in self._contexts.values()) + sum(e.trials for e in self._sizes.values())
        return (1.0 + succ) / (2.0 + trials)

    # ------------------------------------------------------------------ policy
    def choose(self, hint: Hint) -> int:
        """Draft length for the next step; `hint` is what the drafter knows before drafting: the
        size of a copying drafter's match (acceptance kept per size), nothing to propose (size 0),
        the source that will propose (alpha kept per source) and its cost c, or nothing (Hint())."""
        costs = self.costs
        c = None if hint.draft_cost_s is None or costs is None else costs.draft_cost(hint.draft_cost_s)
        catch_up = costs.draft_cost(hint.catch_up_s) if costs is not None and hint.catch_up_s else 0.0
        self._draft_costs = (c, catch_up)
        alpha_max = 0.95 if hint.alpha_max is None else hint.alpha_max
        source, size = hint.source, hint.size
        self._certain, self._nothing = hint.certain, size == 0
        if hint.confidence and size:
            self._key = Context("confidence", source, confidence=hint.confidence)
        elif size is None:
            self._key = Context("state", source, last_full=self._state)
        else:
            self._key = Context("match" if hint.copies and size else "hint", source, size)
        if costs is None or (size == 0 and not hint.certain):
            g = 0  # no costs known (plain decoding is the safe choice), or nothing to draft
        else:
            plan_key = PlanKey(self._key, c, catch_up, hint.certain)
            plan = self._plans.get(plan_key)
            if plan is None:  # estimates change only when a draft was verified (observe)
                plan = self._plans[plan_key] = costs.best_gamma(self._alphas(), self._cap(), c, catch_up,
                                                                free=hint.certain)
            g, s = plan
            self.last_predicted = s
            if s < self.margin:
                g = 0
            probe_here = not hint.confidence and (size is None or size >= self.probe_min_hint)
            if g == 0 and probe_here and self._since_draft >= self._probe_interval and self._could_pay(costs, c, alpha_max, catch_up):
                g = self.probe_gamma if costs.draft_cap is None else min(self.probe_gamma, costs.draft_cap)
                self._probing = g > 0
        self.last_choice = g
        self._steps += 1
        self._steps_plain += g == 0
        self._steps_nothing += size == 0 and not hint.certain
        if g == 0:
            self._plain_catch_up += catch_up
        return g

    def fit(self, available: int) -> int:
        """How many of the `available` draft tokens to verify when the drafter offered fewer than
        asked (an n-gram continuation can be short): the best length up to `available`, drafting
        being paid for already (c = 0), or 0 when none is predicted to pay."""
        if self.costs is None or self._probing or available <= 0:
            return available
        g, s = self.costs.best_gamma(self._alphas(), min(available, self._cap()), c=0.0, free=self._certain)
        return g if s >= self.margin else 0

    def _could_pay(self, costs: CostModel, c: float | None = None, alpha_max: float = 0.95,
                   catch_up: float = 0.0) -> bool:
        """Viability (the paper's alpha > c, with verification cost and the draft's catch-up):
        would speculation pay even at the best acceptance the source can reach (nearly every
        draft, unless the drafter says less)? If not, probing for alpha only costs time."""
        return costs.best_gamma(alpha_max, self._cap(), c, catch_up)[1] >= self.margin

    def _cap(self) -> int:
        """Longest draft considered: gamma_max, within what the cost profile covers."""
        profiled = self.costs.gamma_max if self.costs is not None else 16
        return profiled if self.gamma_max is None else min(self.gamma_max, profiled)

    def observe(self, k: int, n_accepted: int) -> None:
        """Learn from one step's outcome (tokens only: planning from live timings would make the
        output depend on machine noise, module docstring)."""
        if self._probing and k > 0:
            # A probe that fails makes the next one wait twice as long (bounded cost on text that
            # never copies); one that is fully accepted resumes normal probing.
            full = n_accepted == k
            self._probe_interval = self.probe_every if full else min(2 * self._probe_interval, 128)
        self._probing = False
        if k > 0:
            self._plans.clear()
            if self.costs is not None:
                self._planned_draft += self.costs.drafting_cost(k, *self._draft_costs, free=self._certain)
            # the certain tokens are no evidence of the drafter's own: count what followed them
            certain = min(self._certain, k)
            self._drafting_tokens += n_accepted + 1
            self._state = int(n_accepted == k)
            self._since_draft = 0
            if n_accepted < certain or k == certain:
                return  # the drafter's own tokens were not reached (or there were none)
            k, n_accepted = k - certain, n_accepted - certain
            tested = tested_drafts(k, n_accepted)  # the accepted drafts and the first rejected one
            self._tested += tested
            key = self._key
            if key.kind == "match":
                # Token j of the draft was a trial at size class(size + j - 1); the first
                # rejected token is the last trial.
                for j in range(tested):
                    cls = size_class(key.size + j)
                    self._count(self._sizes, SizeClass(key.source, cls), start_prior(cls, self._table), j < n_accepted, 1)
            elif key.kind == "confidence":
                pass  # the drafter keeps the record its estimates come from
            else:
                # Forget per draft token, not per step, so a run of long accepted drafts does not
                # outweigh the next few rejections.
                self._count(self._contexts, key, 0.5, n_accepted, tested)
        else:
            self._since_draft += 1

    def _count(self, evidence: dict, key: Context | SizeClass, prior: float, hits: float, n: int) -> None:
        """Add `hits` successes in `n` trials to key's evidence (started from `prior` if it has none)."""
        ev = evidence.get(key)
        if ev is None:
            ev = evidence[key] = Evidence.prior(prior)
        ev.add(hits, n, self.decay)

    def decline(self) -> dict | None:
        """Why gamma auto ran plain decoding for most of the text (plain steps made at least as many
        tokens as the steps that drafted), from the one cost model:
        the acceptance it measured (or, when it never drafted, the best it assumed reachable), the
        drafter's cost c, and the best speedup those give on this machine's T(K). None otherwise."""
        # Plain steps make one token each: they gave most of the text when they outnumber the tokens
        # of the steps that drafted (a few long accepted copies are speculation that ran, not a decline).
        if self.costs is None or self._steps == 0 or self._steps_plain < self._drafting_tokens:
            return None
        measured = self._tested > 0
        alpha = self.alpha_overall if measured else 0.95
        # what resuming drafting would have cost on the plain steps, on average (a draft model's catch-up)
        catch_up = self._plain_catch_up / self._steps_plain if self._steps_plain else 0.0
        cap = self._cap()
        args = (alpha, cap, catch_up)
        if self._decline_plan is None or self._decline_plan[0] != args:
            self._decline_plan = (args, self.costs.best_gamma(alpha, cap, catch_up=catch_up, drafting=True))
        gamma, speedup = self._decline_plan[1]
        return {"plain_steps": self._steps_plain, "steps": self._steps, "nothing_to_draft": self._steps_nothing,
                "alpha": round(alpha, 3), "alpha_measured": measured, "tested": self._tested,
                "c": round(self.costs.c, 3), "catch_up": round(catch_up, 3), "t_ratio_2": round(self._t_ratio(2), 3),
                "best_gamma": gamma, "best_speedup": round(speedup, 3), "needs": self.margin}

    def fallback_note(self, d: dict | None = None) -> str | None:
        """The decline in one line, e.g. 'gamma auto: plain decoding on 60 of 64 steps: alpha 0.91
        (measured over 33 tokens), draft cost c 0.56 of a target pass: best 0.97x here (gamma 3),
        needs 1.10x; declined'."""
        d = d or self.decline()
        if d is None:
            return None
        head = f"gamma auto: plain decoding on {d['plain_steps']} of {d['steps']} steps"
        if d["nothing_to_draft"] * 2 >= d["steps"]:
            return f"{head}: the drafter had nothing to propose on {d['nothing_to_draft']} (no match in the context)"
        pays = d["best_gamma"] and d["best_speedup"] >= d["needs"]
        if d["alpha_measured"]:
            alpha = f"alpha {d['alpha']:.2f} (measured over {d['tested']} tokens)"
        elif pays:  # it could have paid at the assumed alpha: no draft was tried, but not for that reason
            alpha = f"alpha not measured (no draft tried; assumed {d['alpha']:.2f})"
        else:
            alpha = f"even at alpha {d['alpha']:.2f} (not measured: probing could not pay)"
        best = (f"best {d['best_speedup']:.2f}x here (gamma {d['best_gamma']})" if d["best_gamma"]
                else "no draft length can be verified here")
        cost = f"draft cost c {d['c']:.2f} of a target pass"
        if d["catch_up"]:
            cost += f" and {d['catch_up']:.2f} per step catching up"
        figures = f"{alpha}, {cost}, T(2)/T(1) {d['t_ratio_2']:.2f}: {best}"
        if pays:
            # drafting pays at that alpha, but the estimate for what the drafter offered on those
            # steps (a short match, an uncertain state) did not
            return f"{head}: {figures}, yet the proposals of those steps were estimated below {d['needs']:.2f}x; declined there"
        return f"{head}: {figures}, needs {d['needs']:.2f}x; declined"

    @property
    def planned_draft_s(self) -> float:
        """Seconds of drafting the plans assumed for the steps that drafted (their draft lengths at
        the c and catch-up they were planned with), to set beside what drafting took (Stats.draft_s)."""
        return 0.0 if self.costs is None else self._planned_draft * self.costs.seconds(1)

    def _t_ratio(self, rows: int) -> float:
        return float(rows) if self.costs is None else self.costs.t_ratio(rows)

    def snapshot(self) -> dict:
        decline = self.decline()
        return {
            "steps": self._steps,
            "plain_steps": self._steps_plain,
            "fallback": self.fallback_note(decline),
            "decline": decline,
            "alpha": self.alpha_overall,
            "c": None if self.costs is None else self.costs.c,
            # what drafting cost by the plans (c per token and the draft's catch-up), beside
            # Stats.draft_s, what it took
            "planned_draft_s": self.planned_draft_s,
            "gamma": self.last_choice,
            "predicted_speedup": self.last_predicted,
            "t_ratio": {str(k): round(self._t_ratio(k), 3) for k in (2, 3, 5, 9, 17, self._cap() + 1)},
        }
