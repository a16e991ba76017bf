"""Adaptive draft length: pick gamma each step to maximise the predicted speedup

    S(gamma) = (1 - alpha^(gamma+1)) / ((1 - alpha) (gamma c + T(gamma+1)/T(1)))

from quantities measured while generating on this machine:
  alpha   acceptance rate of draft tokens (recent steps weigh more),
  T(K)    seconds for a target pass over K rows (so T(K)/T(1) is the verification cost),
  c       seconds to draft one token relative to T(1).
gamma = 0 (plain decoding) is chosen whenever no gamma is predicted to beat it. Because alpha is
only observed while drafting, a short probe draft is sent now and then so a change in the text
(e.g. the model starts copying its input) is noticed.
"""

from __future__ import annotations

import time

import numpy as np

from edgespec.runtime import Model
from edgespec.theory import best_gamma


def measure_pass_costs(model: Model, rows: list[int], repeats: int = 3) -> dict[int, float]:
    """Median seconds of one target pass over K rows (logits on every row), for K in `rows`.

    Decodes filler tokens from position 0 and clears the cache afterwards. Row counts are
    interleaved across repeats so that machine noise hits them alike.
    """
    filler = model.tokenize(" the quick brown fox jumps over the lazy dog" * 8, add_special=False)
    times: dict[int, list[float]] = {k: [] for k in rows}
    for _ in range(repeats + 1):  # the first round warms caches and is discarded
        for k in rows:
            model.reset()
            t = time.perf_counter()
            model.decode(filler[:k], n_logits=k)
            times[k].append(time.perf_counter() - t)
    model.reset()
    return {k: float(np.median(v[1:])) for k, v in times.items()}


class AutoGamma:
    label = "auto"

    def __init__(
        self,
        gamma_max: int = 16,
        halflife_tokens: float = 16.0,
        probe_every: int = 8,
        probe_gamma: int = 2,
        margin: float = 1.10,
    ) -> None:
        self.gamma_max = gamma_max
        self.decay = 0.5 ** (1.0 / halflife_tokens)
        self.cost_decay = 0.5 ** (1.0 / 256)  # pass costs are a machine property: forget slowly
        self.probe_every = probe_every
        self.probe_gamma = probe_gamma
        self.margin = margin  # predicted speedup must beat plain decoding by this factor
        # Acceptance as a geometric process: successes = accepted drafts, trials = accepted +
        # rejections; alpha_hat = successes / trials (MLE), with a weak prior of 0.5. Drafts come in
        # runs (a model copying its input accepts whole drafts, then stops copying), so alpha is
        # kept separately for steps after a fully accepted draft and after a rejection.
        self._succ = np.array([1.0, 1.0])
        self._trials = np.array([2.0, 2.0])
        self._state = 0  # 1 if the last draft was accepted in full
        self._t_sum = np.zeros(gamma_max + 2)  # decayed sums of pass seconds per row count K
        self._t_n = np.zeros(gamma_max + 2)
        self._draft_s = 0.0
        self._draft_n = 0.0
        self._since_draft = 0
        self.last_choice = 0
        self.last_predicted = 1.0
        self._calibrated_for: Model | None = None
        self._steps = 0
        self._steps_plain = 0
        self._probe_interval = probe_every
        self._probing = False

    # ------------------------------------------------------------------ estimates
    @property
    def alpha(self) -> float:
        """Acceptance rate expected for the next draft (given how the last one went)."""
        return float(self._succ[self._state] / self._trials[self._state])

    @property
    def alpha_overall(self) -> float:
        return float(self._succ.sum() / self._trials.sum())

    def _costs(self) -> np.ndarray | None:
        """Seconds of a target pass for 0..gamma_max+1 rows: measured means, linear in between,
        extended beyond the largest measured count along the last segment's slope."""
        seen = np.flatnonzero(self._t_n > 0.05)
        if seen.size == 0:
            return None
        means = self._t_sum[seen] / self._t_n[seen]
        rows = np.arange(self.gamma_max + 2)
        if seen.size == 1:
            # One measurement: assume cost grows linearly with rows (the compute-bound worst case).
            return means[0] * np.maximum(rows, 1) / seen[0]
        table = np.interp(rows, seen, means)
        slope = (means[-1] - means[-2]) / (seen[-1] - seen[-2])
        beyond = rows > seen[-1]
        table[beyond] = means[-1] + max(slope, 0.0) * (rows[beyond] - seen[-1])
        return table

    def cost(self, rows: int) -> float | None:
        """Mean seconds of a target pass over `rows` rows (None before anything was measured)."""
        table = self._costs()
        return None if table is None else float(table[min(rows, self.gamma_max + 1)])

    def t_ratio(self, rows: int) -> float:
        table = self._costs()
        if table is None:
            return float(rows)
        return float(table[min(rows, self.gamma_max + 1)] / table[1])

    @property
    def c(self) -> float:
        t1 = self.cost(1)
        if not self._draft_n or not t1:
            return 0.0
        return (self._draft_s / self._draft_n) / t1

    def calibrate(self, model: Model) -> None:
        """Seed T(K) with a few timed passes on `model` (once per loaded model; cached on it)."""
        if self._calibrated_for is model:
            return
        self._calibrated_for = model
        costs = getattr(model, "_pass_costs", None)
        if costs is None:
            rows = sorted({1, 2, 3, 5, 9, self.gamma_max + 1})
            costs = measure_pass_costs(model, rows, repeats=2)
            model._pass_costs = costs
        for k, t in costs.items():
            if k <= self.gamma_max + 1:
                self._t_sum[k] += 2 * t
                self._t_n[k] += 2

    # ------------------------------------------------------------------ policy
    def choose(self) -> int:
        table = self._costs()
        if table is None:
            g = 0  # measure T(1) first
        else:
            g, s = best_gamma(self.alpha, self.c, lambda k: table[k] / table[1], self.gamma_max)
            self.last_predicted = s
            if s < self.margin:
                g = 0
            if g == 0 and self._since_draft >= self._probe_interval and self._could_pay(table):
                g = self.probe_gamma
                self._probing = True
        self.last_choice = g
        self._steps += 1
        self._steps_plain += g == 0
        return g

    def _could_pay(self, table: np.ndarray) -> bool:
        """Viability (the paper's alpha > c, with verification cost): would speculation pay even
        if nearly every draft were accepted? If not, probing for alpha only costs time. Unknown
        batch costs (only one row count measured) are worth a probe."""
        if np.count_nonzero(self._t_n > 0.05) < 2:
            return True
        _, s = best_gamma(0.95, self.c, lambda k: table[k] / table[1], self.gamma_max)
        return s >= self.margin

    def observe(self, k: int, n_accepted: int, rows: int, target_s: float, draft_s: float) -> None:
        if rows <= self.gamma_max + 1:
            self._t_sum *= self.cost_decay
            self._t_n *= self.cost_decay
            self._t_sum[rows] += target_s
            self._t_n[rows] += 1.0
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
            st = self._state
            self._succ[st] = d * self._succ[st] + n_accepted
            self._trials[st] = d * self._trials[st] + trials
            self._draft_s = self.decay * self._draft_s + draft_s
            self._draft_n = self.decay * self._draft_n + k
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
            f"predicted to beat it (alpha {self.alpha_overall:.2f}, T(2)/T(1) {self.t_ratio(2):.2f})"
        )

    def snapshot(self) -> dict:
        return {
            "steps": self._steps,
            "plain_steps": self._steps_plain,
            "fallback": self.fallback_note(),
            "alpha": self.alpha_overall,
            "c": self.c,
            "gamma": self.last_choice,
            "predicted_speedup": self.last_predicted,
            "t_ratio": {int(k): round(self.t_ratio(int(k)), 3) for k in np.flatnonzero(self._t_n > 0.05)},
        }
