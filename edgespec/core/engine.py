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
Ending: a generation ends at an end-of-generation token, at max_tokens, at a stop string
(GenerationConfig.stop_strings, `StopStrings`: the answer is the text before it, and text that may
begin one is held back from the events), where its grammar is complete, at a full context or when
asked to stop; the step that ends it is counted once, up to the token that ended it.
A grammar (`Constraint`, core/grammar.py) is kept like the KV cache: a draft is cut before the
first token it forbids (no pass over it), every verified row is masked by the state after the
tokens before it, and the committed tokens advance it.
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
from edgespec.core.grammar import GRAMMAR, Constraint
from edgespec.core.sampling import (
    Noise,
    SamplingParams,
    constrain,
    log_softmax,
    penalize,
    verify_greedy,
    verify_match,
    verify_stochastic,
)
from edgespec.core.stats import Stats
from edgespec.runtime.errors import EdgeSpecError
from edgespec.runtime.llama import Model, TextStream

DRAFT, TARGET, BONUS = "draft", "target", "bonus"
# The defaults of the generation settings, written once: the session's Request, the command line
# and the UI read them from here.
DEFAULT_MAX_TOKENS = 256
VERIFIERS = ("rejection", "match")  # the first is the default (GenerationConfig.verifier)
TOP_LOGPROBS_MAX = 20  # OpenAI's limit on top_logprobs
LOGPROB_FLOOR = -9999.0  # what OpenAI reports for a token that cannot occur


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
    max_tokens: int = DEFAULT_MAX_TOKENS
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_at_eog: bool = True
    # 'rejection': modified rejection sampling (min(1, p/q), residual resample); 'match': accept a
    # draft only if the target samples the same token (lossless, lower acceptance; for comparison).
    verifier: str = VERIFIERS[0]
    # Keep the longest prefix of the prompt already in the target's KV cache (False: clear it and
    # prefill everything; logits then do not depend on what ran before, bit for bit).
    reuse_prefix: bool = True
    # The generation ends before any of these strings (finish reason 'stop'; `StopStrings`).
    stop_strings: tuple[str, ...] = ()
    # Log-probabilities of each token and of this many most likely alternatives (0-20; None: off):
    # from the target row that scored the token (`token_logprobs`).
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if self.verifier not in VERIFIERS:
            raise EdgeSpecError(f"verifier must be 'rejection' or 'match', got {self.verifier!r}")
        if self.max_tokens < 1:
            raise EdgeSpecError(f"max tokens must be >= 1, got {self.max_tokens}")
        if any(not s for s in self.stop_strings):
            raise EdgeSpecError("stop strings must not be empty")
        if self.logprobs is not None and not 0 <= self.logprobs <= TOP_LOGPROBS_MAX:
            raise EdgeSpecError(f"top logprobs must be 0 to {TOP_LOGPROBS_MAX}, got {self.logprobs}")


@dataclass
class StepEvent:
    """What one target call produced, as the generation shows it.

    tokens/sources/pieces/drafted_by are aligned: sources[i] is 'draft' (proposed and accepted),
    'target' (sampled by the target after a rejection, or with no draft) or 'bonus' (all drafts
    accepted, one more from the same pass); pieces[i] is the text that token completed (may be ''
    while a multi-byte character is still incomplete); drafted_by[i] names the drafter that proposed a
    'draft' token ('ngram', 'learned', 'model:...') and is '' for the target's own tokens. With stop
    strings (GenerationConfig.stop_strings) these are the tokens that can be shown now: text that
    may begin a stop string is held back to a later event, and never shown if it does begin one
    (`StopStrings`). gamma, drafted and accepted are the step's own.
    """

    tokens: list[int]
    sources: list[str]
    pieces: list[str]
    drafted_by: list[str]
    gamma: int  # draft length asked for this step
    drafted: int  # draft tokens actually proposed (k <= gamma)
    accepted: int
    stats: Stats
    # on the last event: 'eog' | 'length' | 'stop' | 'grammar' (complete) | 'context' | 'stopped'
    finish_reason: str | None = None
    source: str = ""  # who proposed this step's draft (as drafted_by[i] names it); '' when none was drafted
    # aligned with tokens when GenerationConfig.logprobs asked for them (`token_logprobs`), else None each
    logprobs: list[dict | None] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


# one token as a generation shows it: (id, source, piece, drafter, logprobs or None)
Shown = tuple[int, str, str, str, "dict | None"]


class StopStrings:
    """Ends a generation before any stop string, holding back text that might be the start of one
    so a consumer never shows it. The answer is the text up to the stop string's first character (as
    llama-server and OpenAI's API answer), even where that falls inside a token: the token it falls
    in is kept with its piece cut there (its id and source unchanged); a token that would keep no
    text is dropped with everything after it."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self.longest = max((len(s) for s in self.stops), default=0)
        self.text = ""  # everything released so far (kept only when there are stop strings)
        self.released = 0  # tokens released so far: after a hit, the answer's
        self._held: list[Shown] = []  # not yet released

    def push(self, tokens: list[Shown], done: bool) -> tuple[list[Shown], int | None]:
        """The tokens of one step that can be shown now, and where a stop string was completed: how
        many of `tokens` were produced up to its end (the token that completed it included), None
        when none was. `done`: the generation ends with this step, so nothing is held back."""
        if not self.stops:
            return tokens, None
        before = len(self._held)
        self._held.extend(tokens)
        window = self.text + "".join(sh[2] for sh in self._held)
        first = max(0, len(self.text) - self.longest)
        hits = [(h, h + len(s)) for s in self.stops if (h := window.find(s, first)) >= 0]
        if hits:
            cut, stop_end = min(hits)  # the earliest stop string (the shorter one of two at one place)
            out, end, last = [], len(self.text), 0
            for i, (tok, src, piece, drafted_by, lp) in enumerate(self._held):
                if end < cut:  # the token's text starts before the stop string: keep that part
                    out.append((tok, src, piece[: cut - end], drafted_by, lp))
                end += len(piece)
                if end >= stop_end:
                    last = i  # the token that completed the stop string
                    break
            self._held = []
            self._release(out)
            # no earlier push held a whole stop string, so it was completed by one of these tokens
            return out, last - before + 1
        if done:
            out, self._held = self._held, []
        else:
            out = self._held[: len(self._held) - self._held_back(window)]
            self._held = self._held[len(out) :]
        self._release(out)
        return out, None

    def _held_back(self, window: str) -> int:
        """How many of the held tokens to keep holding: the fewest whose text covers the longest
        end of `window` that is the start of a stop string."""
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(window)), 0, -1):
                if window.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        tail = 0
        for i in range(len(self._held) - 1, -1, -1):
            if tail >= keep:
                return len(self._held) - 1 - i
            tail += len(self._held[i][2])
        return len(self._held)

    def _release(self, out: list[Shown]) -> None:
        self.text += "".join(sh[2] for sh in out)
        self.released += len(out)


@dataclass
class Step:
    """One step of Algorithm 1 as `Engine.step` ran it.

    gamma: draft length asked for; draft: d_1..d_k (k <= gamma) and their q; logits: the target's
    rows [k+1, V] for [x_last, d_1..d_k] (row i scores the token after d_1..d_i); n_accepted: the
    accepted prefix; token: the token after it, the target's correction after a rejection or the
    bonus (row k) when every draft was accepted; rows: the pass's batch size; seconds of the draft,
    target and verify phases.
    """

    gamma: int
    draft: Draft
    logits: np.ndarray
    n_accepted: int
    token: int
    rows: int
    draft_s: float
    target_s: float
    verify_s: float


class Engine:
    """Runs generations of one target with an optional drafter, a gamma policy and a cost model."""

    def __init__(self, target: Model, drafter: Drafter | None = None, policy: GammaPolicy | None = None,
                 costs: CostModel | None = None, grammar: Constraint | None = None) -> None:
        self.target = target
        self.drafter = drafter
        self.policy: GammaPolicy = policy or FixedGamma(0)
        self.costs = costs
        self.grammar = grammar  # one generation's constraint, at its start

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
        """Yield one event per target call until EOG, max_tokens, a stop string, a full context or
        `stop`."""
        cfg = config or GenerationConfig()
        target = self.target
        self._check_prompt(prompt)
        self.policy.start(self.costs)
        cap = self.costs.draft_cap if self.costs is not None else None
        noise = Noise(cfg.sampling.seed)
        stats = Stats(prompt_tokens=len(prompt), target_bytes=target.info.size_bytes)
        stream, stops = TextStream(target), StopStrings(cfg.stop_strings)
        context = [int(t) for t in prompt]
        t0 = time.perf_counter()
        self._prefill(context, cfg, stats)
        stats.prefill_s = time.perf_counter() - t0
        step_end = t0 + stats.prefill_s

        while True:
            room = target.n_ctx - target.n_past - 1  # the batch [x_last, d_1..d_k] needs k+1 slots
            end = "stopped" if stop is not None and stop.is_set() else "context" if room < 0 else None
            if end is not None:
                stats.wall_s = time.perf_counter() - t0
                shown, _ = stops.push([], done=True)
                *cols, lps = _columns(shown)
                yield StepEvent(*cols, 0, 0, 0, stats, end, logprobs=lps)
                return
            remaining = cfg.max_tokens - stats.generated
            limit = min(remaining - 1, room) if cap is None else min(remaining - 1, room, cap)
            s = self.step(context, limit, cfg, noise)
            ev, produced = self._commit(s, context, remaining, cfg, stats, stream, stops)
            now = time.perf_counter()
            if s.rows == 1:
                # the whole plain step, as tokens/s sees it: the pass, the engine's work around it
                # and the consumer's time since the last event
                stats.record_plain_pass(now - step_end)
            step_end = now
            if stats.ttft_s is None and produced:
                stats.ttft_s = now - t0
            stats.wall_s = now - t0
            yield ev
            if ev.done:
                return

    def _check_prompt(self, prompt: Sequence[int]) -> None:
        if len(prompt) == 0:
            raise EdgeSpecError("the prompt is empty")
        if len(prompt) >= self.target.n_ctx:
            raise EdgeSpecError(
                f"the prompt is {len(prompt)} tokens but the context holds {self.target.n_ctx}; "
                "shorten it or raise --ctx"
            )

    def _prefill(self, context: list[int], cfg: GenerationConfig, stats: Stats) -> None:
        """Bring the target's cache to the prompt but its last token and start the drafter. The
        cache keeps the longest prefix of prompt[:-1] it holds; the last prompt token is the first
        step's x_last, so it is always decoded (and counted as prefilled)."""
        target = self.target
        if cfg.reuse_prefix:
            reused = target.reuse(context[:-1])
        else:
            target.reset()
            reused = 0
        if len(context) - 1 > reused:
            target.decode(context[reused:-1], n_logits=0)
        stats.prompt_reused = reused
        stats.prompt_prefilled = len(context) - reused
        if self.drafter is not None:
            self.drafter.begin(context, cfg.sampling)

    def _commit(self, s: Step, context: list[int], remaining: int, cfg: GenerationConfig, stats: Stats,
                stream: TextStream, stops: StopStrings) -> tuple[StepEvent, int]:
        """Keep what step `s` produced: its tokens join `context` and the drafter's view, their text
        is decoded and checked for stop strings, and the step is counted in `stats` once, up to the
        token that ended the generation when one did. Returns the step's event (its timings are the
        caller's) and how many tokens the step added to the context."""
        k, n_acc = len(s.draft), s.n_accepted
        stats.draft_s += s.draft_s
        stats.target_s += s.target_s
        stats.verify_s += s.verify_s
        stats.pass_s.setdefault(s.rows, []).append(s.target_s)
        self.policy.observe(k, n_acc)

        new, sources, drafted_by, finish = self._shown(s, remaining, cfg.stop_at_eog)
        if self.grammar is not None:
            stats.grammar_s = self.grammar.seconds
            if self.grammar.done and finish in (None, "length") and len(new) == n_acc + 1:
                finish = GRAMMAR  # the grammar is complete after the step's tokens: nothing else may follow
        source = (s.draft.source or self.drafter_name) if k else ""
        context.extend(new)
        drafter = self.drafter
        if drafter is not None:
            if self.needs_hidden and finish is None:
                drafter.observe_hidden(self.target.last_hidden[n_acc])
            drafter.commit(context, n_acc)
        pieces = [stream.push(t) for t in new]
        if finish is not None and pieces:
            pieces[-1] += stream.flush()
        lps = ([None] * len(new) if cfg.logprobs is None
               else token_logprobs(self.target, s.logits[: len(new)], new, cfg.logprobs))
        shown, end = stops.push(list(zip(new, sources, pieces, drafted_by, lps, strict=True)), finish is not None)
        if end is not None:  # a stop string ends the answer where it begins; the step counts to its end
            finish, answer = "stop", stops.released - stats.generated
        else:
            end = None if finish is None else len(new) + (finish == "eog")
            answer = len(new)
        stats.record_step(k, n_acc, answer, end, s.draft.provenance(self.drafter_name))
        *cols, lps = _columns(shown)
        return StepEvent(*cols, s.gamma, k, n_acc, stats, finish, source, logprobs=lps), len(new)

    def step(self, context: list[int], limit: int, cfg: GenerationConfig, noise: Noise) -> Step:
        """One step of Algorithm 1 from `context` (prompt + committed tokens; the target's cache
        holds all of it but the last token, x_last): draft at most `limit` tokens, score them in one
        target pass, accept a prefix and sample the token after it. On return the cache holds x_last
        and the accepted drafts; committing the tokens is the caller's (`generate`)."""
        t0 = time.perf_counter()
        gamma, draft = self._draft(context, limit)  # d_1..d_k ~ q_1..q_k, k <= gamma
        grammar = self.grammar
        if grammar is not None:  # a draft the grammar forbids is rejected without a pass over it
            draft = draft.cut(grammar.admitted(draft.tokens))
        t1 = time.perf_counter()
        n_past = self.target.n_past
        batch = [context[-1], *draft.tokens.tolist()]  # [x_last, d_1..d_k]
        logits = self._score(batch)  # p_1..p_{k+1} in parallel: [k+1, V]
        logits = penalize(logits, context, draft.tokens.tolist(), cfg.sampling)  # row i given context + d_1..d_i
        t2 = time.perf_counter()
        if grammar is not None:  # row i: what the grammar allows after d_1..d_i
            logits = constrain(logits, grammar.masks(draft.tokens))
        if cfg.sampling.greedy:  # accepted prefix n, then the correction (n < k) or bonus (n = k)
            n, token = verify_greedy(logits, draft.tokens)
        elif cfg.verifier == "match":
            n, token = verify_match(logits, draft.tokens, cfg.sampling, noise.at(len(context)))
        else:  # r < min(1, p/q) per draft; a rejection resamples from norm(max(0, p - q))
            n, token = verify_stochastic(logits, draft.tokens, draft.probs, cfg.sampling, noise.at(len(context)))
        self.target.truncate(n_past + 1 + n)  # drop the rejected drafts from the KV cache
        if grammar is not None:
            grammar.advance([*draft.tokens[:n].tolist(), token])
        return Step(gamma, draft, logits, n, token, len(batch), t1 - t0, t2 - t1, time.perf_counter() - t2)

    def _draft(self, context: list[int], limit: int) -> tuple[int, Draft]:
        """This step's draft length and draft (`propose_draft`); none without a drafter."""
        if self.drafter is None:
            return 0, Draft()
        return propose_draft(self.drafter, self.policy, context, limit)

    def _score(self, batch: list[int]) -> np.ndarray:
        """The target's logits rows [k+1, V] for the batch [x_last, d_1..d_k] (and its hidden
        states, `target.last_hidden`, for a drafter that reads them)."""
        return self.target.decode(batch, n_logits=len(batch), hidden=self.needs_hidden)

    def _shown(self, s: Step, remaining: int, stop_at_eog: bool) -> tuple[list[int], list[str], list[str], str | None]:
        """A step's tokens as the generation keeps them, with their sources and drafted_by (StepEvent)
        and the finish reason: up to an end-of-generation token, at most `remaining`."""
        n, k = s.n_accepted, len(s.draft)
        new = s.draft.tokens[:n].tolist() + [s.token]
        sources = [DRAFT] * n + [BONUS if (k and n == k) else TARGET]
        drafted_by = s.draft.provenance(self.drafter_name)[:n] + [""]
        finish = None
        if stop_at_eog:
            for i, tok in enumerate(new):
                if self.target.is_eog(tok):  # it ends the reply; what the step verified after it does not count
                    new, sources, drafted_by, finish = new[:i], sources[:i], drafted_by[:i], "eog"
                    break
        if len(new) >= remaining:
            new, sources, drafted_by = new[:remaining], sources[:remaining], drafted_by[:remaining]
            finish = finish or "length"
        return new, sources, drafted_by, finish


def propose_draft(drafter: Drafter, policy: GammaPolicy, context: list[int], limit: int) -> tuple[int, Draft]:
    """A step's draft: the length the policy chooses (0 to `limit`) and the drafter's proposal, cut
    to what the policy wants verified when the drafter offered fewer tokens than asked. The engine
    drafts with this, and so does a replay of its loop over recorded outputs (benchmarks.ngram_replay)."""
    gamma = max(0, min(policy.choose(drafter.hint(context)), limit))
    if gamma == 0:
        return 0, Draft()
    draft = drafter.propose(context, gamma)
    if 0 < len(draft) < gamma:
        draft = draft.head(policy.fit(len(draft)))
    return gamma, draft


def _columns(shown: list[Shown]) -> tuple[list[int], list[str], list[str], list[str], list[dict | None]]:
    """Shown tokens as StepEvent's aligned lists: tokens, sources, pieces, drafted_by, logprobs."""
    if not shown:
        return [], [], [], [], []
    tokens, sources, pieces, drafted_by, lps = zip(*shown, strict=True)
    return list(tokens), list(sources), list(pieces), list(drafted_by), list(lps)


def token_logprobs(target: Model, rows: np.ndarray, tokens: Sequence[int], top: int) -> list[dict]:
    """Each token's log-probability and its `top` most likely alternatives, from the target's row
    that scored it (rows[i] scores tokens[i]; with penalties and a grammar's mask applied, before
    temperature and truncation: the model's own distribution, as OpenAI reports it). A drafted
    token gets the same figure plain decoding would give it: its row is the target's, whoever
    proposed it. Entries in OpenAI's shape: {"token", "logprob", "bytes", "top_logprobs"}; a
    token the mask forbids reads LOGPROB_FLOOR (OpenAI's -9999.0) rather than -inf."""
    out = []
    for lp, tok in zip(log_softmax(rows), tokens, strict=True):
        entry = _logprob_entry(target, int(tok), lp[tok])
        alts = []
        if top:
            idx = np.argpartition(-lp, top - 1)[:top]
            alts = [_logprob_entry(target, int(i), lp[i]) for i in idx[np.argsort(-lp[idx], kind="stable")]]
        entry["top_logprobs"] = alts
        out.append(entry)
    return out


def _logprob_entry(target: Model, token: int, logprob: float) -> dict:
    raw = target.token_bytes(token)
    return {"token": raw.decode("utf-8", "replace"), "logprob": max(float(logprob), LOGPROB_FLOOR),
            "bytes": list(raw)}

