"""The one cost model: what a target pass over K rows costs on this machine, what drafting costs,
and the speedup those predict. gamma auto plans with it, the live UI panel and the bench report
read it; nothing else measures or extrapolates T(K).

    T(K)   seconds of one target pass over K rows (T(K)/T(1) is the verification cost)
    c      seconds to draft one token / T(1) (`CostModel.c`: the drafter's own `draft_cost_s`)
    E      tokens per target call: (1 - alpha^(gamma+1)) / (1 - alpha)   (`expected_tokens`, Eq. 1 of
           Leviathan et al. 2023)
    S      E / (gamma c + T(gamma+1)/T(1))   (`CostModel.speedup`; Theorem 3.8 with the verification
           cost made explicit: the paper's idealised T(gamma+1) = T(1) is `CostModel.flat`)

T(K) comes from the stored profile of the target (`edgespec.runtime.profiles`: measured the first
time a model runs with a given set-up, kept on disk, and in exact mode capped to the rows proven
batch-invariant). A profile measured while something else loaded the machine is checked against
the single-token passes every generation times anyway (`check_t1`), and measured again when
stored T(1) is clearly slower than what the machine does now. A session bends the profile's
T(K)/T(1) toward the passes its generations timed (`PassLog`, `CostModel.calibrate`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from edgespec.models.inspect import inspect_gguf
from edgespec.runtime import llama as runtime
from edgespec.runtime.errors import EdgeSpecError
from edgespec.runtime.llama import Model, parameter_label
from edgespec.runtime.profiles import GAMMA_MAX, K_MAX, forget, profile, profile_rows

STALE_FACTOR = 1.6  # stored T(1) this much slower than observed single-token passes: re-measure (the profile is
# timed after CONTEXT_AT tokens, so short chats see cheaper single-token passes than it; a factor above
# that gap and below what a loaded machine costs, docs/gamma_auto.md)
MIN_OBSERVED = 8  # single-token passes needed before a profile is judged
# Gamma auto plans with the passes it observes (`PassLog`, `CostModel.calibrate`): the stored profile
# is the fastest of a few back-to-back passes at one context length on a quiet machine, and real
# steps of the 1.5B on Zen 3 cost 13-26% more than it for 2-17 rows against T(1) (docs/gamma_auto.md).
PASSES_KEPT = 64  # the most recent passes kept per row count
PASSES_WEIGHT = 8  # observed passes of one row count that weigh as much as the profile's own
CORRECTION_RANGE = (0.5, 2.0)  # the most the observed passes move T(K)/T(1) from the profile's


def expected_tokens(alpha: float | Sequence[float], gamma: int) -> float:
    """Tokens per target call when `gamma` tokens are drafted: (1 - alpha^(gamma+1)) / (1 - alpha)
    at acceptance alpha (Eq. 1), or, given per-position acceptances (draft token j accepted with
    probability alpha[j-1] once tokens 1..j-1 were: a copy whose later tokens are likelier right),
    1 + sum_j prod_{i<=j} alpha[i-1], which is Eq. 1 when every alpha[j] is the same."""
    if isinstance(alpha, (int, float)):
        if alpha >= 1.0:
            return float(gamma + 1)
        return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)
    total, p = 1.0, 1.0
    for a in alpha[:gamma]:
        p *= a
        total += p
    return total


@dataclass(frozen=True)
class ModelKind:
    """What a GGUF model is, read from its metadata rather than its file name (a renamed copy is the
    same kind): what acceptance measured on one model carries over to, gamma auto's prior."""

    architecture: str  # general.architecture, e.g. 'gemma3'
    size: str  # the parameter count as model names give it (runtime.llama.parameter_label), e.g. '268M'
    quant: str  # the file type, e.g. 'Q4_K_M'

    @classmethod
    def of(cls, path: str | os.PathLike, size: int | None = None, mtime_ns: int | None = None) -> ModelKind | None:
        """The kind of the GGUF file at `path`, None when its header cannot be read; `size` and
        `mtime_ns` as a loaded model recorded them (runtime.model_file), else read from the file."""
        try:
            if size is None or mtime_ns is None:
                st = os.stat(path)
                size, mtime_ns = st.st_size, st.st_mtime_ns
            return _kind(os.path.realpath(path), size, mtime_ns)
        except (OSError, EdgeSpecError):
            return None


@functools.lru_cache(maxsize=32)
def _kind(path: str, size: int, mtime_ns: int) -> ModelKind:
    # size and mtime are part of the key so that a rewritten file is read again
    info = inspect_gguf(path)
    return ModelKind(info["architecture"] or "?", parameter_label(info["n_params"]), info["file_type_name"] or "?")


class PassLog:
    """The target passes generations timed (`Stats.pass_s`: seconds by row count), the most recent
    PASSES_KEPT of each row count: what `CostModel.calibrate` plans with besides the profile."""

    def __init__(self) -> None:
        self.passes: dict[int, list[float]] = {}

    def add(self, pass_s: dict[int, Sequence[float]]) -> None:
        for k, times in pass_s.items():
            kept = self.passes.setdefault(int(k), [])
            kept.extend(float(t) for t in times if np.isfinite(t) and t > 0)
            del kept[:-PASSES_KEPT]


class CostModel:
    """T(K) for K = 1..k_max+1, c and the predicted speedup. Built from the stored profile by
    `for_target`, or from given costs (tests, what-if predictions)."""

    def __init__(self, pass_s: dict[int, float], c: float = 0.0, max_rows: int | None = None,
                 gamma_max: int = GAMMA_MAX) -> None:
        """pass_s: seconds for some row counts (must include 1); linear in between and extended
        beyond the largest along the last segment's slope."""
        if 1 not in pass_s:
            raise ValueError("pass_s needs T(1)")
        if not all(np.isfinite(t) and t > 0 for t in pass_s.values()):  # stored ones are checked on load
            raise ValueError(f"pass_s must be positive, finite seconds: {pass_s}")
        self.gamma_max = gamma_max
        ks = np.array(sorted(pass_s))
        ts = np.array([pass_s[k] for k in ks])
        rows = np.arange(gamma_max + 2)
        if ks.size == 1:
            table = ts[0] * np.maximum(rows, 1)  # cost linear in rows: the worst case
        else:
            table = np.interp(rows, ks, ts)
            slope = max((ts[-1] - ts[-2]) / (ks[-1] - ks[-2]), 0.0)
            beyond = rows > ks[-1]
            table[beyond] = ts[-1] + slope * (rows[beyond] - ks[-1])
        self._table = table  # [gamma_max + 2] seconds, index = rows
        self._profile_table = table  # what `calibrate` bends
        # Draft lengths worth considering: every one whose rows are up to K_MAX, beyond that only
        # where a row count was measured (the curve between sparse points is not known to be
        # linear: just past a multiple of 8 a pass costs a step more, LONG_ROWS).
        self._lengths = [g for g in range(1, gamma_max + 1) if g + 1 <= K_MAX or g + 1 in pass_s]
        self.c = float(c)
        self.max_rows = max_rows
        self.target_kind: ModelKind | None = None  # what the target is (for_target): gamma auto's prior

    @classmethod
    def flat(cls, c: float = 0.0, gamma_max: int = K_MAX - 1) -> CostModel:
        """The paper's idealised machine: a pass over any number of rows costs what one row does
        (T(K) = T(1), a GPU-like verification), drafting c per token."""
        return cls({1: 1.0, 2: 1.0}, c, gamma_max=gamma_max)

    @classmethod
    def for_target(cls, target: Model, draft_cost_s: float = 0.0, gamma_max: int = GAMMA_MAX,
                   progress: Callable[[float], None] | None = None) -> CostModel:
        """From the stored profile of `target`; draft_cost_s = seconds to draft one token;
        progress(fraction) while a missing profile is measured (`profile`)."""
        rows = profile_rows(gamma_max + 1)
        prof = profile(target, rows, progress)
        model = cls({k: prof.pass_s[k] for k in rows}, 0.0, prof.max_rows if runtime.mode() == "exact" else None,
                    gamma_max)
        model.c = model.draft_cost(draft_cost_s)
        model.target_kind = ModelKind.of(*target.file.identity)
        return model

    def calibrate(self, log: PassLog) -> None:
        """Bend T(K)/T(1) toward what observed passes cost. For each row count with observed passes,
        the ratio of their median to the profile's T(K), over that ratio at one row, is the
        correction; it counts as much as the profile once PASSES_WEIGHT passes were seen (weight
        n/(n + PASSES_WEIGHT)); row counts between observed ones are corrected by linear
        interpolation, those beyond the largest as it is. T(1) itself stays the profile's (c is a
        share of it), and nothing changes before single-row passes were observed."""
        ones = log.passes.get(1, [])
        if not ones:
            return
        base = self._profile_table
        r1 = float(np.median(ones)) / base[1]
        ks, corr = [1], [1.0]
        for k in sorted(log.passes):
            seen = log.passes[k]
            if k < 2 or k >= base.size or not seen:
                continue
            r = float(np.median(seen)) / base[k] / r1
            w = len(seen) / (len(seen) + PASSES_WEIGHT)
            ks.append(k)
            corr.append(float(np.clip(1.0 + w * (r - 1.0), *CORRECTION_RANGE)))
        if len(ks) == 1:
            return
        rows = np.arange(base.size)
        self._table = base * np.interp(rows, ks, corr)  # held at the ends: 1 up to one row

    @property
    def _slope(self) -> float:
        """Seconds a row adds beyond the table (its last step)."""
        t = self._table
        return float(t[-1] - t[-2]) if t.size > 2 else float(t[-1])

    def seconds(self, rows: int) -> float:
        """T(rows): seconds of one target pass over `rows` rows (beyond the table, along its last slope)."""
        rows = max(rows, 1)
        last = self.gamma_max + 1
        if rows <= last:
            return float(self._table[rows])
        return float(self._table[last] + self._slope * (rows - last))

    def draft_cost(self, seconds_per_token: float) -> float:
        """c: seconds of drafting one token as a share of T(1), a single-token target pass. The one
        definition: the cost model's own c, a hint's per-source cost and a run's measured drafting
        cost (seconds drafting per drafted token) are all this."""
        return seconds_per_token / self.seconds(1)

    def t_ratio(self, rows: int) -> float:
        """T(rows)/T(1), the verification cost in single-token passes."""
        return self.seconds(rows) / self.seconds(1)

    @property
    def draft_cap(self) -> int | None:
        """Longest draft a pass may verify in exact mode (rows proven batch-invariant, minus one);
        None when drafts are not capped."""
        return None if self.max_rows is None else max(0, self.max_rows - 1)

    def speedup(self, alpha: float | Sequence[float], gamma: int, c: float | None = None,
                catch_up: float = 0.0, free: int = 0) -> float:
        """Predicted speedup over plain decoding of drafting `gamma` tokens at acceptance alpha, or
        at per-position acceptances alpha[j-1] (token j given 1..j-1 accepted; `expected_tokens`):
        E / `step_cost`, c the model's unless given."""
        if gamma <= 0:
            return 1.0
        return expected_tokens(alpha, gamma) / self.step_cost(gamma, c, catch_up, free)

    def drafting_cost(self, gamma: int, c: float | None = None, catch_up: float = 0.0, free: int = 0) -> float:
        """What drafting `gamma` tokens costs, in single-token target passes: gamma c, plus
        `catch_up` (a draft model's decoding of the committed tokens it has not seen, Hint.catch_up_s
        through `draft_cost`), which a step pays however many tokens it drafts. The first `free`
        tokens cost nothing (Hint.certain: a grammar's forced tokens), nor does the catch-up when
        they are all the draft."""
        paid = max(0, gamma - free)
        return paid * (self.c if c is None else c) + (catch_up if paid else 0.0)

    def step_cost(self, gamma: int, c: float | None = None, catch_up: float = 0.0, free: int = 0) -> float:
        """What a step that drafts `gamma` tokens costs, in single-token passes: its drafting
        (`drafting_cost`: gamma c + catch-up) and the verification T(gamma+1)/T(1)."""
        return self.drafting_cost(gamma, c, catch_up, free) + self.t_ratio(gamma + 1)

    def best_gamma(self, alpha: float | Sequence[float], gamma_max: int | None = None,
                   c: float | None = None, catch_up: float = 0.0, *, drafting: bool = False,
                   free: int = 0) -> tuple[int, float]:
        """The draft length in [0, min(gamma_max, draft_cap)] with the highest predicted speedup
        (alpha: one acceptance rate, or per-position acceptances as for `speedup`; c, catch_up and
        free as for `step_cost`); with `drafting`, the best length of at least 1 even when it is
        slower than plain decoding (what a drafter would give here, to say why it was declined)."""
        cap = self.gamma_max if gamma_max is None else gamma_max
        if self.draft_cap is not None:
            cap = min(cap, self.draft_cap)
        best, best_s = 0, (0.0 if drafting else 1.0)
        for g in self._lengths:
            if g > cap or (not isinstance(alpha, (int, float)) and g > len(alpha)):
                break
            s = self.speedup(alpha, g, c, catch_up, free)
            if s > best_s:
                best, best_s = g, s
        if 0 < best < free <= cap and free in self._lengths:
            # A draft cut inside a run of certain tokens leaves the rest to the next step, which pays a
            # pass for them however few they are. Weigh getting through the run in this step (free + 1
            # tokens) against two steps (this one, then the rest with its own bonus: free + 2 tokens).
            whole = self.speedup(alpha, free, c, catch_up, free)
            two = (free + 2) / (self.step_cost(best, c, catch_up, free) + self.t_ratio(free - best + 1))
            if whole >= two:
                best, best_s = free, whole
        return best, best_s

    def predicted_for(self, drafted_hist: dict[int, int], alpha: float) -> float:
        """What the formula predicts for a run's draft lengths (`Stats.drafted_hist`, steps by draft
        length) at its measured alpha: each step that drafted k tokens yields E(alpha, k) tokens and
        costs `step_cost(k)` single-token passes, so S = sum n_k E(alpha, k) / sum n_k step_cost(k).
        c is the model's (the one gamma auto planned with), not the run's drafting time."""
        if not drafted_hist:
            return 1.0
        tokens = sum(n * expected_tokens(alpha, k) for k, n in drafted_hist.items())
        return tokens / sum(n * self.step_cost(k) for k, n in drafted_hist.items())

    def measured_speedup(self, tokens: int, calls: int, seconds: float, t1: float | None = None) -> float:
        """Speedup that happened: tokens/s over the plain rate 1/T(1). T(1) is what a plain step
        cost while generating (`t1`, mean wall time of the plain steps) when known, else the profile's;
        either way no more than a step took on average (a pass never costs less than one row), so
        a generation is never credited with more than its tokens per target call."""
        if calls == 0 or seconds <= 0:
            return 0.0
        t_plain = min(self.seconds(1) if t1 is None else t1, seconds / calls)
        return tokens / seconds * t_plain

    def check_t1(self, target: Model, observed_s: Sequence[float]) -> bool:
        """Judge the stored profile by the single-token passes a generation timed. If stored T(1)
        is STALE_FACTOR slower than their median, it was measured on a loaded machine: forget it
        (the next generation measures again). Returns True when it was forgotten."""
        if len(observed_s) < MIN_OBSERVED:
            return False
        if self.seconds(1) > STALE_FACTOR * float(np.median(observed_s)):
            forget(target)
            return True
        return False
