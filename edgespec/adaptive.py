"""Adaptive draft length: pick gamma each step to maximise the predicted speedup

    S(gamma) = (1 - alpha^(gamma+1)) / ((1 - alpha) (gamma c + T(gamma+1)/T(1)))

  alpha   acceptance rate of draft tokens, measured while generating (recent drafts weigh more),
  T(K)    seconds for a target pass over K rows (so T(K)/T(1) is the verification cost),
  c       seconds to draft one token relative to T(1).
T(K) and c come from the one cost model (`edgespec.costs`, the machine's stored profile), not from
live timings: the choices then depend only on the tokens, so a seeded or greedy run gives the same
text every time. gamma = 0 (plain decoding) is chosen whenever no gamma is predicted to beat it by
`margin`. Because alpha is only observed while drafting, a short probe draft is sent now and then
so a change in the text (e.g. the model starts copying its input) is noticed.
"""

from __future__ import annotations

from edgespec.costs import CostModel
from edgespec.drafters import Hint

# P(the n-gram drafter's first token is accepted | size of the match it copies from), greedy, as
# measured by `python -m benchmarks.ngram_priors` (Gemma-3-270M, 2 prompts of each Spec-Bench
# category that the bench does not use and 2 code edits, 96 tokens each: 2,447 positions). A new
# generation starts from these, worth PRIOR_WEIGHT drafts, instead of knowing nothing: text that has
# matched 6+ tokens is almost always being copied, so the first long match is drafted at once
# rather than after a run of plain steps and probes.
# Used from PRIOR_MIN_MATCH up: below it the first token's acceptance overstates a whole draft's
# (a 3-token match's first token is right 80% of the time, its chain much less often), and a 4-row
# pass that fails on a short match costs 1.2 single-token passes on the AMD EPYC (0.80x on a
# 9-token summary); short matches start from an uninformed 1 of 2 and learn, as before.
MATCH_PRIOR = {1: 0.27, 2: 0.59, 3: 0.80, 4: 0.82, 6: 0.91, 8: 0.93, 12: 0.94, 16: 0.98}
PRIOR_WEIGHT = 2.0
PRIOR_MIN_MATCH = 6


def match_prior(size: int) -> float:
    """MATCH_PRIOR at `size` (the largest tabled size not above it)."""
    best = 0.5
    for n, p in sorted(MATCH_PRIOR.items()):
        if n <= size:
            best = p
    return best


class AutoGamma:
    label = "auto"

    def __init__(
        self,
        gamma_max: int = 16,
        halflife_tokens: float = 16.0,
        probe_every: int = 8,
        probe_gamma: int = 2,
        probe_min_hint: int = 8,
        margin: float = 1.10,
    ) -> None:
        self.gamma_max = gamma_max
        self.decay = 0.5 ** (1.0 / halflife_tokens)
        self.probe_every = probe_every
        self.probe_gamma = probe_gamma
        # With hints, probe only where the drafter matched a long span (text that has started to
        # repeat); a failed probe on a short match costs a pass for nothing: on SmolLM2, where a
        # 3-row pass costs 1.9 single-token passes, that was ~3% of open-ended generation.
        self.probe_min_hint = probe_min_hint
        self.margin = margin  # predicted speedup must beat plain decoding by this factor
        self.start(None)

    def start(self, costs: CostModel | None) -> None:
        """A new generation: forget acceptance (the previous text says little about the next)."""
        self.costs = costs
        # Acceptance as a geometric process: successes = accepted drafts, trials = accepted +
        # rejections; alpha_hat = successes / trials (MLE), with a weak prior of 0.5. Kept per
        # context: with a drafter that gives a hint (the n-gram drafter's matched size; a 16-token
        # match is followed by an accepted token far more often than a 1-token one), per hint;
        # otherwise per outcome of the last draft (drafts come in runs: a model copying its input
        # accepts whole drafts, then stops copying).
        self._succ: dict[tuple, float] = {}
        self._trials: dict[tuple, float] = {}
        self._state = 0  # 1 if the last draft was accepted in full
        self._key: tuple = ("state", 0)
        self._since_draft = 0
        self.last_choice = 0
        self.last_predicted = 1.0
        self._steps = 0
        self._steps_plain = 0
        self._probe_interval = self.probe_every
        self._probing = False

    # ------------------------------------------------------------------ estimates
    def _prior(self, key: tuple) -> tuple[float, float]:
        """(successes, trials) before anything was observed in `key`'s context: the measured
        acceptance by match size for long n-gram matches, else an uninformed 1 of 2."""
        if key[0] == "hint" and key[1] in ("", "ngram") and key[2] and key[2] >= PRIOR_MIN_MATCH:
            return PRIOR_WEIGHT * match_prior(key[2]), PRIOR_WEIGHT
        return 1.0, 2.0

    @property
    def alpha(self) -> float:
        """Acceptance rate expected for the next draft (in the context of the last `choose`)."""
        succ0, trials0 = self._prior(self._key)
        return self._succ.get(self._key, succ0) / self._trials.get(self._key, trials0)

    @property
    def alpha_overall(self) -> float:
        return (1.0 + sum(self._succ.values())) / (2.0 + sum(self._trials.values()))

    # ------------------------------------------------------------------ policy
    def choose(self, hint: int | Hint | None) -> int:
        """Draft length for the next step; `hint` is what the drafter knows before drafting (the
        n-gram drafter's matched size, 0 when it has nothing to propose), None, or a `Hint` naming
        the source that will propose and its cost c (a combined drafter: alpha is kept per source)."""
        source, c, alpha_max = "", None, 0.95
        costs = self.costs
        if isinstance(hint, Hint):
            if hint.draft_cost_s is not None and costs is not None:
                c = hint.draft_cost_s / costs.seconds(1)
            if hint.alpha_max is not None:
                alpha_max = hint.alpha_max
            source, hint = hint.source, hint.size
        self._key = ("hint", source, hint) if hint is not None else ("state", source, self._state)
        if costs is None or hint == 0:
            g = 0  # no costs known (plain decoding is the safe choice), or nothing to draft
        else:
            g, s = costs.best_gamma(self.alpha, self.gamma_max, c=c)
            self.last_predicted = s
            if s < self.margin:
                g = 0
            probe_here = hint is None or hint >= self.probe_min_hint
            if g == 0 and probe_here and self._since_draft >= self._probe_interval and self._could_pay(costs, c, alpha_max):
                g = self.probe_gamma if costs.draft_cap is None else min(self.probe_gamma, costs.draft_cap)
                self._probing = g > 0
        self.last_choice = g
        self._steps += 1
        self._steps_plain += g == 0
        return g

    def fit(self, available: int) -> int:
        """How many of the `available` draft tokens to verify when the drafter offered fewer than
        asked (an n-gram continuation can be short): the best length up to `available`, drafting
        being paid for already (c = 0), or 0 when none is predicted to pay."""
        if self.costs is None or self._probing or available <= 0:
            return available
        g, s = self.costs.best_gamma(self.alpha, min(available, self.gamma_max), c=0.0)
        return g if s >= self.margin else 0

    def _could_pay(self, costs: CostModel, c: float | None = None, alpha_max: float = 0.95) -> bool:
        """Viability (the paper's alpha > c, with verification cost): would speculation pay even
        at the best acceptance the source can reach (nearly every draft, unless the drafter says
        less)? If not, probing for alpha only costs time."""
        return costs.best_gamma(alpha_max, self.gamma_max, c=c)[1] >= self.margin

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
            # Forget per draft token, not per step, so a run of long accepted drafts does not
            # outweigh the next few rejections.
            trials = n_accepted + (1 if n_accepted < k else 0)
            d = self.decay**trials
            key = self._key
            succ0, trials0 = self._prior(key)
            self._succ[key] = d * self._succ.get(key, succ0) + n_accepted
            self._trials[key] = d * self._trials.get(key, trials0) + trials
            self._state = int(n_accepted == k)
            self._since_draft = 0
        else:
            self._since_draft += 1

    def fallback_note(self) -> str | None:
        """Says so when the policy has been running plain decoding because nothing would pay."""
        if self._steps_plain * 2 < self._steps:
            return None
        return (
            f"gamma auto: plain decoding on {self._steps_plain} of {self._steps} steps; no draft length was "
            f"predicted to beat it (alpha {self.alpha_overall:.2f}, T(2)/T(1) {self._t_ratio(2):.2f}"
            f"{f', draft cost c {self.costs.c:.2f}' if self.costs and self.costs.c else ''})"
        )

    def _t_ratio(self, rows: int) -> float:
        return float(rows) if self.costs is None else self.costs.t_ratio(rows)

    def snapshot(self) -> dict:
        return {
            "steps": self._steps,
            "plain_steps": self._steps_plain,
            "fallback": self.fallback_note(),
            "alpha": self.alpha_overall,
            "c": None if self.costs is None else self.costs.c,
            "gamma": self.last_choice,
            "predicted_speedup": self.last_predicted,
            "t_ratio": {str(k): round(self._t_ratio(k), 3) for k in (2, 3, 5, 9, self.gamma_max + 1)},
        }
