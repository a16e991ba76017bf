"""Logits -> processed distribution, sampling, and the two verifiers.

The same `process` is applied to the target's logits (p) and to a draft model's logits (q): the
"standardized sampling" of Leviathan et al., so that speculative sampling reproduces exactly the
distribution a user would get by sampling the target alone with these settings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from edgespec.runtime.errors import EdgeSpecError

# For top-p, first look at this many best tokens; sort the whole vocabulary only if they do not
# already hold top_p of the mass (a full sort of a large vocabulary every step costs about as much as
# a small target's pass; docs/gamma_auto.md).
_TOP_P_CANDIDATES = 2048


SEED_LIMIT = 2**64  # seeds are 64-bit, as in llama.cpp; a larger one would wrap onto a smaller one
DEFAULT_PENALTY_LAST_N = 64  # llama.cpp's repeat_last_n: the tokens repetition penalties look back over


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy (argmax); top_k 0, top_p 1 and min_p 0 switch those filters off.
    The logit bias and the repetition penalties (`penalize`) act on the logits before any of them, the
    bias first, as in llama.cpp's sampler chain: logit_bias holds (token id, value) pairs added to those
    tokens' logits (-inf bans one); repeat_penalty 1 and frequency/presence 0 are off; the penalties look
    back over the last `penalty_last_n` tokens of the context, prompt included (0: none, -1: all), as
    llama.cpp's do."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None  # None or negative (-1, as llama.cpp's clients write it): a random seed
    repeat_penalty: float = 1.0  # a seen token's logit divided by it (multiplied when negative)
    frequency_penalty: float = 0.0  # minus this times the token's count in the window
    presence_penalty: float = 0.0  # minus this once for a token in the window
    penalty_last_n: int = DEFAULT_PENALTY_LAST_N
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit); ids checked against a vocabulary by the session

    def __post_init__(self) -> None:
        if self.seed is not None and self.seed < 0:
            object.__setattr__(self, "seed", None)
        if self.seed is not None and self.seed >= SEED_LIMIT:
            raise EdgeSpecError(f"seed must be below 2^64 ({SEED_LIMIT}), got {self.seed}; -1 means a random seed")
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise EdgeSpecError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise EdgeSpecError(f"top-k must be >= 0 (0 = off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise EdgeSpecError(f"top-p must be in (0, 1], got {self.top_p}")
        if not (0.0 <= self.min_p < 1.0):
            raise EdgeSpecError(f"min-p must be in [0, 1), got {self.min_p}")
        if not (np.isfinite(self.repeat_penalty) and self.repeat_penalty > 0):
            raise EdgeSpecError(f"repeat penalty must be a finite number > 0 (1 = off), got {self.repeat_penalty}")
        for name in ("frequency_penalty", "presence_penalty"):
            if not np.isfinite(getattr(self, name)):
                raise EdgeSpecError(f"{name.replace('_', ' ')} must be a finite number, got {getattr(self, name)}")
        if self.penalty_last_n < -1:
            raise EdgeSpecError(f"the penalties' window must be >= 0 tokens, or -1 for all, got {self.penalty_last_n}")
        for tok, value in self.logit_bias:
            if tok < 0:
                raise EdgeSpecError(f"logit bias: token id {tok} is negative")
            if np.isnan(value) or value == np.inf:
                raise EdgeSpecError(f"logit bias of token {tok} must be a number or -inf (a ban), got {value}")

    @property
    def repeats_penalized(self) -> bool:
        """Whether the repetition penalties change anything."""
        on = self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
        return on and self.penalty_last_n != 0

    @property
    def penalized(self) -> bool:
        """Whether `penalize` changes anything."""
        return bool(self.logit_bias) or self.repeats_penalized

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


# What a uniform draw is for; each (position, purpose) pair gets its own independent number.
SAMPLE, ACCEPT, RESIDUAL, DRAFT = 0, 1, 2, 3

# u(row, purpose) -> a uniform in [0, 1) for verification row `row` of the current step.
Uniforms = Callable[[int, int], float]


class Noise:
    """Uniform random numbers keyed by (seed, absolute token position, purpose).

    A stream that is consumed in order would make a seeded output depend on how many draws each
    step happened to make, i.e. on the draft lengths (which differ with gamma, the drafter and
    gamma auto's cost profile). Keyed draws do not: the token at position i is decided by the draws for i alone, so
    the same seed gives the same text whatever was drafted (see `verify_stochastic`).
    """

    def __init__(self, seed: int | None) -> None:
        self.seed = int(np.random.SeedSequence().entropy) if seed is None else int(seed)

    def uniform(self, pos: int, purpose: int) -> float:
        key = [self.seed % SEED_LIMIT, pos, purpose]
        hi, lo = np.random.SeedSequence(key).generate_state(2, np.uint32)
        return ((int(hi) >> 5) * 67108864 + (int(lo) >> 6)) / 9007199254740992.0  # 53 bits

    def at(self, pos0: int) -> Uniforms:
        """Draws for a step whose first verification row decides the token at position pos0."""
        return lambda row, purpose: self.uniform(pos0 + row, purpose)


def penalize(logits: np.ndarray, context: Sequence[int], draft: Sequence[int], params: SamplingParams) -> np.ndarray:
    """The verification rows [k+1, V] with the logit bias and then the repetition penalties applied,
    row i given the tokens before it: `context` and draft[:i] (llama.cpp's logit-bias and penalties
    samplers, on every row a target pass scores, so speculation stays lossless with respect to the
    biased and penalised distribution). `logits` itself is returned when neither is set, else a
    float32 copy."""
    if not params.penalized:
        return logits
    out = np.array(logits, dtype=np.float32)
    if params.logit_bias:
        add_bias(out, params)
    if not params.repeats_penalized:
        return out
    tokens = np.asarray([*context, *draft], dtype=np.int64)
    n = tokens.size if params.penalty_last_n < 0 else params.penalty_last_n
    for i in range(out.shape[0]):
        end = len(context) + i
        ids, counts = np.unique(tokens[max(0, end - n):end], return_counts=True)
        x = out[i, ids]
        x = np.where(x <= 0, x * params.repeat_penalty, x / params.repeat_penalty)
        out[i, ids] = x - counts * params.frequency_penalty - params.presence_penalty
    return out


def add_bias(rows: np.ndarray, params: SamplingParams) -> None:
    """Add the logit bias to the last axis of `rows` ([V] or [n, V]) in place; a token listed twice
    gets both values (llama.cpp's logit-bias sampler does the same). Ids past the rows' width are
    skipped: a draft model's vocabulary may be a little shorter than its target's."""
    width = rows.shape[-1]
    for tok, value in params.logit_bias:
        if tok < width:
            rows[..., tok] += value


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """[n, V] logits -> [n, V] float64 log-probabilities (a masked -inf stays -inf)."""
    x = logits.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def process(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Logits [V] -> probabilities [V] (float64, sums to 1) after temperature, top-k, top-p, min-p.

    Filters are applied in that order; tokens they remove get probability exactly 0.
    """
    x = np.asarray(logits, dtype=np.float64) / params.temperature
    vocab = x.shape[0]
    if 0 < params.top_k < vocab:
        kth = np.partition(x, vocab - params.top_k)[vocab - params.top_k]
        x = np.where(x >= kth, x, -np.inf)
        # Ties at the k-th value would let more than k tokens through; keep the lowest ids.
        kept = np.flatnonzero(np.isfinite(x))
        if kept.size > params.top_k:
            order = kept[np.argsort(-x[kept], kind="stable")]
            x[order[params.top_k :]] = -np.inf
    x -= x.max()
    probs = np.exp(x)
    probs /= probs.sum()
    if params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    if params.min_p > 0.0:
        probs = np.where(probs >= params.min_p * probs.max(), probs, 0.0)
        probs /= probs.sum()
    return probs


def _top_p(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (at least one)."""
    n = probs.shape[0]
    if n > _TOP_P_CANDIDATES:
        cand = np.argpartition(-probs, _TOP_P_CANDIDATES)[:_TOP_P_CANDIDATES]
        if probs[cand].sum() < top_p:
            cand = np.arange(n)
    else:
        cand = np.arange(n)
    order = cand[np.argsort(-probs[cand], kind="stable")]
    cum = np.cumsum(probs[order])
    n_keep = int(np.searchsorted(cum, top_p, side="left")) + 1
    out = np.zeros_like(probs)
    keep = order[: min(n_keep, order.size)]
    out[keep] = probs[keep]
    return out / out.sum()


def constrain(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Rows of logits [k+1, V] with the tokens a grammar forbids (allowed[i] False) set to -inf: the
    target's distribution restricted to the grammar, before temperature and the filters (as llama.cpp
    and vLLM apply a grammar), so p_i = process(constrained[i]) is what every verifier sees."""
    return np.where(allowed, logits, -np.inf).astype(np.float32, copy=False)


def sample(probs: np.ndarray, u: float) -> int:
    """The token id at quantile u in [0, 1) of a probability vector (inverse CDF; only ids with
    probability > 0 can come out)."""
    cdf = np.cumsum(probs)
    return min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), probs.shape[0] - 1)


def verify_greedy(target_logits: np.ndarray, draft: np.ndarray) -> tuple[int, int]:
    """Greedy verification: accept drafts while they equal the target's argmax.

    target_logits: [k+1, V], row i scores the token after the context plus draft[:i].
    draft: [k] proposed token ids.
    Returns (n_accepted, next_token): next_token is the target's argmax after the accepted prefix,
    a correction if n_accepted < k, else the bonus token. No softmax is computed.
    """
    k = len(draft)
    best = np.argmax(target_logits, axis=1)
    mismatch = np.flatnonzero(best[:k] != np.asarray(draft))
    n = int(mismatch[0]) if mismatch.size else k
    return n, int(best[n])


def verify_stochastic(
    target_logits: np.ndarray,
    draft: np.ndarray,
    draft_probs: np.ndarray | None,
    params: SamplingParams,
    u: Uniforms,
) -> tuple[int, int]:
    """Modified rejection sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023).

    target_logits: [k+1, V] raw target logits; p_i = process(target_logits[i]).
    draft: [k] proposed ids; draft_probs: [k, V] the processed draft distributions q_i they were
    sampled from, or None for a deterministic drafter (q_i = one-hot at draft[i], e.g. n-gram).
    Accept draft[i] with probability min(1, p_i(d)/q_i(d)); on the first rejection emit a sample of
    norm(max(0, p_i - q_i)); if all k are accepted emit a bonus sample of p_k. draft_probs may have
    a row k: the distribution of a (k+1)-th draft that a grammar refused before verification (p_k of
    it is 0, so it would have been rejected for sure): after k acceptances the residual of that row
    is emitted, exactly what verifying it would have given (`Draft.cut`).
    Returns (n_accepted, next_token). The emitted tokens are distributed exactly as the target's.

    For a one-hot q the rule reads: accept d with probability p(d), else sample p with d removed
    (max(0, p - onehot(d)) normalised). Sampling p with the position's SAMPLE draw and accepting d
    iff that sample is d has exactly those probabilities, so that is how it is computed: the
    emitted token is then the one plain sampling with the same seed would emit, drafted or not.
    """
    if draft_probs is None:
        return verify_match(target_logits, draft, params, u)
    for i, d in enumerate(np.asarray(draft).tolist()):
        p = process(target_logits[i], params)
        q_d = float(draft_probs[i][d])
        if q_d > 0.0 and u(i, ACCEPT) * q_d < p[d]:
            continue
        residual = np.maximum(p - draft_probs[i], 0.0)
        if residual.sum() <= 0.0:  # p == q: rejection has probability 0, but be safe
            residual = p
        return i, sample(residual, u(i, RESIDUAL))
    k = len(draft)
    if len(draft_probs) > k:  # a refused (k+1)-th draft: rejected without a pass over it
        p = process(target_logits[k], params)
        residual = np.maximum(p - draft_probs[k], 0.0)
        return k, sample(residual if residual.sum() > 0.0 else p, u(k, RESIDUAL))
    return k, sample(process(target_logits[k], params), u(k, SAMPLE))


def verify_match(
    target_logits: np.ndarray,
    draft: np.ndarray,
    params: SamplingParams,
    u: Uniforms,
) -> tuple[int, int]:
    """Exact-match verification (what llama.cpp's server and Llama.generate do): the target samples
    its own token at each position and a draft is accepted only if it is that token. Lossless; for
    a one-hot (n-gram) draft it is the rejection sampler itself, but a sampled draft d ~ q is
    accepted with probability p(d) instead of min(1, p(d)/q(d)), so with a draft model acceptance
    is lower. Kept for comparison.
    """
    for i, d in enumerate(np.asarray(draft).tolist()):
        tok = sample(process(target_logits[i], params), u(i, SAMPLE))
        if tok != d:
            return i, tok
    k = len(draft)
    return k, sample(process(target_logits[k], params), u(k, SAMPLE))
