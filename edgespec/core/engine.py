"""The speculative step loop. Owns no UI and no I/O: it yields one `StepEvent` per target call.

One step (Leviathan et al. 2023, Alg. 1; `Engine.step`):
    draft   = drafter.propose(context, gamma)             # d_1..d_k
    logits  = target.decode([x_last, d_1..d_k])           # one batched pass, rows [k+1, V]
    n, tok  = verify(logits, draft)                       # accepted prefix + correction/bonus
    target.truncate(...)                                  # drop rejected drafts from the KV cache
KV discipline: between steps the target's cache holds every committed token except the newest
one, which is the first row of the next step's batch. `--draft none` is the same loop with k = 0.
Prefix reuse: a generation starts from whatever the target's cache already holds (the previous
generation's prompt and output, also between steps of the discipline above): it keeps the longest
cached prefix of prompt[:-1] (`Model.reuse`) and prefills only the rest, so a chat turn decodes the
new turn, not the whole conversation. GenerationConfig.reuse_prefix=False clears the cache first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from edgespec.core.costs import CostModel
from edgespec.core.drafters import Draft, Drafter, Hint
from edgespec.core.sampling import Noise, SamplingParams, verify_greedy, verify_match, verify_stochastic
from edgespec.core.stats import Stats
from edgespec.runtime.errors import EdgeSpecError
from edgespec.runtime.llama import Model, TextStream

DRAFT, TARGET, BONUS = "draft", "target", "bonus"


class GammaPolicy(Protocol):
    """Chooses the draft length of each step and learns from what happened. Called in this order:
    start once per generation; per step choose (before drafting), fit (when the drafter offered
    fewer tokens than asked) and observe (after verification)."""

    label: str  # 'auto' or the fixed length, for stats

    def start(self, costs: CostModel | None) -> None:
        """A new generation, planned with `costs` (None: no cost model, e.g. no drafter)."""

    def choose(self, hint: Hint) -> int:
        """Draft length for the next step; `hint` is the drafter's (Drafter.hint)."""

    def fit(self, available: int) -> int:
        """How many of `available` (< the chosen length) draft tokens to verify."""

    def observe(self, k: int, n_accepted: int) -> None:
        """k tokens were drafted and n_accepted of them accepted."""

    def snapshot(self) -> dict:
        """What the policy knows now (estimated alpha, predicted speedup, ...), for stats."""


class FixedGamma:
    """Always draft `gamma` tokens (fewer if the drafter has fewer)."""

    def __init__(self, gamma: int) -> None:
        if gamma < 0:
            raise EdgeSpecError(f"gamma must be >= 0, got {gamma}")
        self.gamma = gamma
        self.label = str(gamma)
        self._costs: CostModel | None = None

    def start(self, costs: CostModel | None) -> None:
        self._costs = costs

    def choose(self, hint: Hint) -> int:
        return self.gamma

    def fit(self, available: int) -> int:
        return available

    def observe(self, k: int, n_accepted: int) -> None:
        pass

    def snapshot(self) -> dict:
        costs = self._costs
        return {"gamma": self.gamma, "t_ratio": None if costs is None else round(costs.t_ratio(self.gamma + 1), 3)}


@dataclass
class GenerationConfig:
    max_tokens: int = 256
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # Decode every step with at least this many rows. 2 puts the baseline on the same (batched)
    # kernel path as verification, which is how the engine's exactness is tested (README).
    min_batch_rows: int = 1
    stop_at_eog: bool = True
    # 'rejection': modified rejection sampling (min(1, p/q), residual resample); 'match': accept a
    # draft only if the target samples the same token (lossless, lower acceptance; for comparison).
    verifier: str = "rejection"
    # Keep the longest prefix of the prompt already in the target's KV cache (False: clear it and
    # prefill everything; logits then do not depend on what ran before, bit for bit).
    reuse_prefix: bool = True

    def __post_init__(self) -> None:
        if self.verifier not in ("rejection", "match"):
            raise EdgeSpecError(f"verifier must be 'rejection' or 'match', got {self.verifier!r}")
        if self.max_tokens < 1:
            raise EdgeSpecError(f"max tokens must be >= 1, got {self.max_tokens}")


@dataclass
class StepEvent:
    """What one target call produced.

    tokens/sources/pieces/drafters are aligned: sources[i] is 'draft' (proposed and accepted),
    'target' (sampled by the target after a rejection, or with no draft) or 'bonus' (all drafts
    accepted, one more from the same pass); pieces[i] is the text that token completed (may be ''
    while a multi-byte character is still incomplete); drafters[i] names the drafter that proposed a
    'draft' token ('ngram', 'learned', 'model:...') and is '' for the target's own tokens.
    """

    tokens: list[int]
    sources: list[str]
    pieces: list[str]
    drafters: list[str]
    gamma: int  # draft length asked for this step
    drafted: int  # draft tokens actually proposed (k <= gamma)
    accepted: int
    stats: Stats
    finish_reason: str | None = None  # 'eog' | 'length' | 'context' | 'stopped' on the last event
    source: str = ""  # who proposed this step's draft (as drafters[i] names it); '' when none was drafted

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def produced(self) -> int:
        """Tokens this step produced up to the generation's end: its tokens, plus the
        end-of-generation token that ended it (not shown)."""
        return len(self.tokens) + (self.finish_reason == "eog")


@dataclass
class Step:
    """One step of Algorithm 1 as `Engine.step` ran it.

    gamma: draft length asked for; draft: d_1..d_k (k <= gamma) and their q; logits: the target's
    rows [k+1, V] for [x_last, d_1..d_k] (row i scores the token after d_1..d_i); n_accepted: the
    accepted prefix; token: the token after it, the target's correction after a rejection or the
    bonus (row k) when every draft was accepted; rows: the pass's batch size, `pad` padding rows
    (GenerationConfig.min_batch_rows) included; seconds of the draft, target and verify phases.
    """

    gamma: int
    draft: Draft
    logits: np.ndarray
    n_accepted: int
    token: int
    rows: int
    pad: int
    draft_s: float
    target_s: float
    verify_s: float


class Engine:
    """Runs generations of one target with an optional drafter, a gamma policy and a cost model."""

    def __init__(self, target: Model, drafter: Drafter | None = None, policy: GammaPolicy | None = None,
                 costs: CostModel | None = None) -> None:
        self.target = target
        self.drafter = drafter
        self.policy: GammaPolicy = policy or FixedGamma(0)
        self.costs = costs

    @property
    def drafter_name(self) -> str:
        return "none" if self.drafter is None else self.drafter.name

    @property
    def needs_hidden(self) -> bool:
        """Whether verification must also return the target's hidden states (a learned drafter)."""
        return self.drafter is not None and self.drafter.needs_hidden

    def generate(
        self,
        prompt: Sequence[int],
        config: GenerationConfig | None = None,
        stop: threading.Event | None = None,
    ) -> Iterator[StepEvent]:
        """Yield one event per target call until EOG, max_tokens, a full context or `stop`."""
        cfg = config or GenerationConfig()
        target = self.target
        drafter = self.drafter
        if len(prompt) == 0:
            raise EdgeSpecError("the prompt is empty")
        if len(prompt) >= target.n_ctx:
            raise EdgeSpecError(
                f"the prompt is {len(prompt)} tokens but the context holds {target.n_ctx}; "
                "shorten it or raise --ctx"
            )
        self.policy.start(self.costs)
        cap = self.costs.draft_cap if self.costs is not None else None
        noise = Noise(cfg.sampling.seed)
        hidden = self.needs_hidden
        stats = Stats(prompt_tokens=len(prompt), target_bytes=target.info.size_bytes)
        stream = TextStream(target)
        context = [int(t) for t in prompt]
        t0 = time.perf_counter()

        # The cache keeps the longest prefix of prompt[:-1] it holds; the last prompt token is the
        # first step's x_last, so it is always decoded (and counted as prefilled).
        if cfg.reuse_prefix:
            reused = target.reuse(context[:-1])
        else:
            target.reset()
            reused = 0
        if len(context) - 1 > reused:
            target.decode(context[reused:-1], n_logits=0)
        stats.prompt_reused = reused
        stats.prompt_prefilled = len(context) - reused
        if drafter is not None:
            drafter.begin(context, cfg.sampling)
        stats.prefill_s = time.perf_counter() - t0
        step_end = t0 + stats.prefill_s

        while True:
            room = target.n_ctx - target.n_past - 1  # the batch [x_last, d_1..d_k] needs k+1 slots
            end = "stopped" if stop is not None and stop.is_set() else "context" if room < 0 else None
            if end is not None:
                stats.wall_s = time.perf_counter() - t0
                yield StepEvent([], [], [], [], 0, 0, 0, stats, end)
                return
            remaining = cfg.max_tokens - stats.generated
            limit = min(remaining - 1, room) if cap is None else min(remaining - 1, room, cap)
            s = self.step(context, limit, cfg, noise)
            k, n_acc = len(s.draft), s.n_accepted
            stats.draft_s += s.draft_s
            stats.target_s += s.target_s
            stats.verify_s += s.verify_s
            stats.pass_s.setdefault(s.rows, []).append(s.target_s)
            self.policy.observe(k, n_acc)

            new, sources, by, finish = self._shown(s, remaining, cfg.stop_at_eog)
            source = (s.draft.source or self.drafter_name) if k else ""
            stats.record_step(k, n_acc, len(new), finish == "eog", finish is not None, source)
            context.extend(new)
            if drafter is not None:
                if hidden and finish is None:
                    drafter.observe_hidden(target.last_hidden[s.pad + n_acc])
                drafter.commit(context, n_acc)
            pieces = [stream.push(t) for t in new]
            if finish is not None and pieces:
                pieces[-1] += stream.flush()
            now = time.perf_counter()
            if s.rows == 1:
                # the whole plain step, as tokens/s sees it: the pass, the engine's work around it
                # and the consumer's time since the last event
                stats.record_plain_pass(now - step_end)
            step_end = now
            if stats.ttft_s is None and new:
                stats.ttft_s = now - t0
            stats.wall_s = now - t0
            yield StepEvent(new, sources, pieces, by, s.gamma, k, n_acc, stats, finish, source)
            if finish is not None:
                return

    def step(self, context: list[int], limit: int, cfg: GenerationConfig, noise: Noise) -> Step:
        """One step of Algorithm 1 from `context` (prompt + committed tokens; the target's cache
        holds all of it but the last token, x_last): draft at most `limit` tokens, score them in one
        target pass, accept a prefix and sample the token after it. On return the cache holds x_last
        and the accepted drafts; committing the tokens is the caller's (`generate`)."""
        t0 = time.perf_counter()
        gamma, draft = self._draft(context, limit)  # d_1..d_k ~ q_1..q_k, k <= gamma
        t1 = time.perf_counter()
        n_past = self.target.n_past
        batch, pad = self._batch(context, draft, cfg.min_batch_rows)  # [x_last, d_1..d_k]
        logits = self._score(batch, pad, len(draft))  # p_1..p_{k+1} in parallel: [k+1, V]
        t2 = time.perf_counter()
        if cfg.sampling.greedy:  # accepted prefix n, then the correction (n < k) or bonus (n = k)
            n, token = verify_greedy(logits, draft.tokens)
        elif cfg.verifier == "match":
            n, token = verify_match(logits, draft.tokens, cfg.sampling, noise.at(len(context)))
        else:  # r < min(1, p/q) per draft; a rejection resamples from norm(max(0, p - q))
            n, token = verify_stochastic(logits, draft.tokens, draft.probs, cfg.sampling, noise.at(len(context)))
        self.target.truncate(n_past + 1 + n)  # drop the rejected drafts from the KV cache
        return Step(gamma, draft, logits, n, token, len(batch), pad, t1 - t0, t2 - t1, time.perf_counter() - t2)

    def _draft(self, context: list[int], limit: int) -> tuple[int, Draft]:
        """The draft length the policy chooses (0 to `limit`) and the drafter's proposal, cut to
        what the policy wants verified when the drafter offered fewer tokens than asked."""
        drafter = self.drafter
        if drafter is None:
            return 0, Draft()
        gamma = max(0, min(self.policy.choose(drafter.hint(context)), limit))
        if gamma == 0:
            return 0, Draft()
        draft = drafter.propose(context, gamma)
        if 0 < len(draft) < gamma:
            draft = draft.head(self.policy.fit(len(draft)))
        return gamma, draft

    def _batch(self, context: list[int], draft: Draft, min_rows: int) -> tuple[list[int], int]:
        """The rows of the verification pass, [x_last, d_1..d_k], and how many committed tokens
        precede them as padding (GenerationConfig.min_batch_rows: they are rolled out of the cache
        and decoded again, so that a plain step runs on the batched kernel path; tests)."""
        batch = [context[-1], *draft.tokens.tolist()]
        if len(batch) >= min_rows:
            return batch, 0
        pad = min(min_rows - len(batch), self.target.n_past)
        self.target.truncate(self.target.n_past - pad)
        return context[len(context) - 1 - pad : -1] + batch, pad

    def _score(self, batch: list[int], pad: int, k: int) -> np.ndarray:
        """The target's logits rows [k+1, V] for a batch [padding, x_last, d_1..d_k]."""
        if self.needs_hidden:  # every row is an output then (runtime.decode), so drop the padding's rows
            return self.target.decode(batch, n_logits=len(batch), hidden=True)[pad:]
        return self.target.decode(batch, n_logits=k + 1)

    def _shown(self, s: Step, remaining: int, stop_at_eog: bool) -> tuple[list[int], list[str], list[str], str | None]:
        """A step's tokens as the generation keeps them, with their sources and drafters (StepEvent)
        and the finish reason: up to an end-of-generation token, at most `remaining`."""
        n, k = s.n_accepted, len(s.draft)
        new = s.draft.tokens[:n].tolist() + [s.token]
        sources = [DRAFT] * n + [BONUS if (k and n == k) else TARGET]
        by = ([s.draft.source or self.drafter.name] * n if n else []) + [""]
        finish = None
        if stop_at_eog:
            for i, tok in enumerate(new):
                if self.target.is_eog(tok):  # it ends the reply; what the step verified after it does not count
                    new, sources, by, finish = new[:i], sources[:i], by[:i], "eog"
                    break
        if len(new) >= remaining:
            new, sources, by = new[:remaining], sources[:remaining], by[:remaining]
            finish = finish or "length"
        return new, sources, by, finish


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where two token sequences differ (None if one prefixes the other
    and they have equal length)."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    if diff.size:
        return int(diff[0])
    return None if len(a) == len(b) else n
