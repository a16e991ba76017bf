"""A small GGUF model drafts for a larger one with the same vocabulary.

The draft model keeps its own KV cache (the draft `Model` knows which tokens it holds). Between
steps it holds a prefix of the committed context plus whatever it drafted last time; `propose`
finds how much of that is still committed, drops the rest (rejected drafts) and continues from
there, so accepted tokens are never decoded twice. Between generations the cache is kept too:
`begin` reuses the longest cached prefix of the new prompt (the previous chat turn, a shared
system prompt) and prefills only the rest, like the target's prefix reuse.

What drafting costs: the first pass of a proposal decodes every committed token the draft's cache
lacks (the target's correction or bonus token, and all the tokens of plain steps since the draft
model last drafted) and drafts the first token; each further token is a one-row pass. From the draft
model's own stored T(K) profile that is T_d(m) + (gamma - 1) T_d(1) for m catch-up rows: T_d(1) per
token (`draft_cost_s`, gamma auto's c) and the catch-up's T_d(m) - T_d(1) (`Hint.catch_up_s`), which
gamma auto adds to a step's cost. `spent_s` and `estimated_s` keep what proposing took and what
the profile says it costs, to check the one against the other.

At temperature > 0 the drafts are sampled from q = process(draft logits) with the same sampling
settings as the target, and q is returned so the verifier can run the lossless rejection sampler.
At temperature 0 drafting is greedy and q is one-hot (returned as None).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import numpy as np

from edgespec.core import costs
from edgespec.core.drafters import Draft, DraftContext, Hint, register
from edgespec.core.sampling import DRAFT, Noise, SamplingParams, add_bias, process, sample
from edgespec.models.loader import load_model
from edgespec.models.pairing import check_compatible, size_warning
from edgespec.runtime import profiles
from edgespec.runtime.llama import Model


class ModelDrafter:
    name = "model"
    needs_hidden = False

    def __init__(self, draft: Model, target: Model, p_min: float = 0.0) -> None:
        """p_min > 0 stops a draft early once the draft model's top probability falls below it
        (llama.cpp's cutoff); 0 drafts the full gamma the policy asked for."""
        check_compatible(target, draft)
        warning = size_warning(target, draft)
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
        self.draft = draft
        self.p_min = p_min
        self.target_vocab = target.n_vocab
        self.name = f"model:{draft.info.description}"
        self._committed = 0  # cached tokens known to be committed context
        self.reused = 0  # prompt tokens the last `begin` found in the draft's cache
        self._sampling = SamplingParams()
        self._noise = Noise(None)
        self._pass_costs: costs.CostModel | None = None  # the draft model's T(K), once draft_cost_s read it
        self.spent_s = 0.0  # seconds `propose` spent drafting, over the drafter's life
        self.estimated_s = 0.0  # what those proposals cost by the draft's profile (`proposal_cost_s`)

    def begin(self, prompt: Sequence[int], sampling: SamplingParams) -> None:
        # Same sampling settings as the target (standardized sampling); the draft's draws are keyed
        # by the seed and the token position, so a seeded generation is reproducible.
        self._sampling = sampling
        self._noise = Noise(sampling.seed)
        # The draft reads the prompt now, as part of prompt processing (like the target's prefill),
        # not inside the first drafting step; what its cache already holds is kept.
        head = [int(t) for t in prompt[:-1]]
        self.reused = self.draft.reuse(head)
        if len(head) > self.reused:
            self.draft.decode(head[self.reused :], n_logits=0)
        self._committed = len(head)

    @property
    def _cached(self) -> list[int]:
        """The tokens in the draft's KV cache (a copy; tests)."""
        return list(self.draft.cached)

    def _sync(self, context: Sequence[int]) -> None:
        """Keep the longest cached prefix that matches `context`, leaving its last token uncached."""
        self.draft.reuse(context[: len(context) - 1], start=self._committed)

    def hint(self, context: Sequence[int]) -> Hint:
        """Nothing about acceptance; what the next proposal's catch-up costs (once the draft's
        costs are loaded: `draft_cost_s`)."""
        if self._pass_costs is None:
            return Hint()
        return Hint(catch_up_s=self.proposal_cost_s(self._catch_up_rows(context), 1) - self.draft_cost_s())

    def _catch_up_rows(self, context: Sequence[int]) -> int:
        """Rows of the next proposal's first pass: the committed tokens the draft's cache lacks
        (the last one always: it is the input that drafts the first token)."""
        n = len(context) - 1
        return len(context) - self.draft.common_prefix(context[:n], min(self._committed, n))

    def proposal_cost_s(self, rows: int, passes: int) -> float:
        """Seconds of a proposal by the draft's profile: a first pass over `rows` rows (the catch-up
        and the first draft), then `passes` - 1 one-row passes. The first pass costs at least a one-row
        pass, so a catch-up is never negative: a noisy profile may have T_d(2) below T_d(1), and the
        plans (`hint`) and this account (`estimated_s`) price it the same way."""
        pc = self._pass_costs or self._load_costs()
        return max(pc.seconds(rows), pc.seconds(1)) + (passes - 1) * pc.seconds(1)

    def _load_costs(self) -> costs.CostModel:
        """The draft model's stored T(K) profile (measured on first use), as a cost model."""
        rows = profiles.profile_rows()
        prof = profiles.profile(self.draft, rows)
        self._pass_costs = costs.CostModel({k: prof.pass_s[k] for k in rows})
        return self._pass_costs

    def commit(self, context: Sequence[int], n_accepted: int) -> None:
        self._sync(context)
        self._committed = self.draft.n_past  # the cache now holds committed tokens only

    def draft_cost_s(self) -> float:
        """T_d(1): each draft token but the first is a one-row pass (the first's extra rows are the
        catch-up, `hint`)."""
        return (self._pass_costs or self._load_costs()).seconds(1)

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        if gamma <= 0:
            return Draft()
        self._sync(context)
        # After drafting the cache holds context + gamma - 1 drafts.
        gamma = min(gamma, self.draft.n_ctx - len(context) + 1)
        if gamma <= 0:
            return Draft()
        # (not all of `context` is known to be committed: a grammar's forced tokens may lead it)
        feed = [int(t) for t in context[self.draft.n_past :]]
        greedy = self._sampling.greedy
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        rows, passes, start = len(feed), 0, time.perf_counter()
        for i in range(gamma):
            row = np.array(self.draft.decode(feed, n_logits=1)[0], dtype=np.float32)
            passes += 1
            if self.target_vocab < row.shape[0]:
                row[self.target_vocab :] = -np.inf  # ids the target lacks can never be accepted
            if self._sampling.logit_bias:  # as the target's rows are biased: a banned token is not drafted
                add_bias(row, self._sampling)
            if greedy:
                tok = int(np.argmax(row))
                if self.p_min > 0.0 and _top_prob(row) < self.p_min and i > 0:
                    break
            else:
                q = process(row, self._sampling)
                if self.p_min > 0.0 and q.max() < self.p_min and i > 0:
                    break
                tok = sample(q, self._noise.uniform(len(context) + i, DRAFT))
                probs.append(_fit(q, self.target_vocab))
            tokens.append(tok)
            if i + 1 < gamma:
                feed = [tok]
        self.spent_s += time.perf_counter() - start
        if self._pass_costs is not None:
            self.estimated_s += self.proposal_cost_s(rows, passes)
        return Draft(np.asarray(tokens, dtype=np.int32), None if greedy else np.stack(probs))

    def close(self) -> None:
        self.draft.close()


@register("model", "a small GGUF model with the target's vocabulary (--draft model:PATH_OR_NAME, or just the name)",
          takes_model=True)
def _build(ctx: DraftContext) -> ModelDrafter:
    return ModelDrafter(load_model(ctx.arg, ctx.opts.local()), ctx.target)  # the drafter stays on this machine


def _top_prob(logits: np.ndarray) -> float:
    x = logits - logits.max()
    return float(1.0 / np.exp(x).sum())


def _fit(q: np.ndarray, n: int) -> np.ndarray:
    """Resize a draft distribution to the target's vocabulary (sizes may differ by up to 128)."""
    if q.shape[0] == n:
        return q
    if q.shape[0] > n:
        return q[:n]
    return np.concatenate([q, np.zeros(n - q.shape[0])])

