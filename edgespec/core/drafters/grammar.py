"""Tokens a grammar forces, drafted for free around another drafter's proposal.

Where the grammar admits one continuation only (a schema's next key, '": "', a closing brace, the
rest of an enum value), its tokens are proposed with certainty and no drafting cost (Hint.certain),
then the other drafter proposes from the context those tokens extend (an n-gram copy of a value
from the prompt), cut where the grammar forbids, then what the grammar forces after that: all of it
verified in one pass, so the output stays the target's (constrained) own. Provenance 'grammar'
marks the forced tokens (Draft.sources, token_drafted_by, the stats' draft_n_by_source).

Not in the registry: a session wraps a request's drafter in this when the request has a grammar.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from edgespec.core.drafters import Draft, Drafter, Hint
from edgespec.core.grammar import GRAMMAR, Constraint
from edgespec.core.sampling import SamplingParams


class GrammarDrafter:
    """`inner`'s proposals with the grammar's forced tokens ahead of and after them. The state of
    `grammar` is the committed context's (the engine keeps it); proposing leaves it so."""

    def __init__(self, grammar: Constraint, inner: Drafter | None) -> None:
        self.grammar = grammar
        self.inner = inner
        self.name = inner.name if inner is not None else GRAMMAR
        self.needs_hidden = inner is not None and inner.needs_hidden
        self._head: list[int] = []  # the forced tokens the last hint saw (proposed first)
        self._head_at = -1  # for the context of this length
        self._proposed_head = 0  # forced tokens ahead of the inner drafter's in the last proposal

    def begin(self, prompt: Sequence[int], sampling: SamplingParams) -> None:
        self._head_at = -1
        if self.inner is not None:
            self.inner.begin(prompt, sampling)

    def _forced(self, context: Sequence[int]) -> list[int]:
        if self._head_at != len(context):
            self._head, self._head_at = self.grammar.forced(), len(context)
        return self._head

    def hint(self, context: Sequence[int]) -> Hint:
        """The inner drafter's hint for the context the forced tokens extend, with them as certain."""
        head = self._forced(context)
        own = self.inner.hint([*context, *head]) if self.inner is not None else Hint.nothing(GRAMMAR)
        return replace(own, certain=len(head)) if head else own

    def observe_hidden(self, hidden: np.ndarray) -> None:
        if self.inner is not None:
            self.inner.observe_hidden(hidden)

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        head = self._forced(context)[:gamma]
        self._proposed_head = len(head)
        if self.inner is None or len(head) == gamma:
            return Draft(np.asarray(head, dtype=np.int32), None, GRAMMAR, (GRAMMAR,) * len(head))
        grammar = self.grammar
        taken = grammar.advance(head)
        own = self.inner.propose([*context, *head], gamma - len(head))
        n = grammar.admitted(own.tokens)
        own = own.cut(n)
        taken += grammar.advance(own.tokens)
        # after the drafter's tokens, what the grammar forces next (not after a sampled draft the
        # grammar cut: the verifier needs the refused token's distribution right after its prefix)
        tail = [] if own.probs is not None and len(own.probs) > n else grammar.forced()[: gamma - len(head) - n]
        grammar.rollback(taken)
        tokens = [*head, *own.tokens.tolist(), *tail]
        source = own.source or self.inner.name
        sources = (GRAMMAR,) * len(head) + tuple(own.provenance(self.inner.name)) + (GRAMMAR,) * len(tail)
        return Draft(np.asarray(tokens, dtype=np.int32), _probs(own, head, tail), source if n else GRAMMAR, sources)

    def commit(self, context: Sequence[int], n_accepted: int) -> None:
        """The inner drafter hears how many of its own tokens were accepted (after the forced ones)."""
        if self.inner is not None:
            self.inner.commit(context, max(0, n_accepted - self._proposed_head))
        self._proposed_head = 0

    def draft_cost_s(self) -> float:
        return self.inner.draft_cost_s() if self.inner is not None else 0.0

    def close(self) -> None:
        """Nothing of its own: the inner drafter's life is the session's (it may be kept for later requests)."""


def _probs(own: Draft, head: list[int], tail: list[int]) -> np.ndarray | None:
    """The draft's q rows: one-hot at the forced tokens around a sampled drafter's rows (None when
    the drafter is deterministic too)."""
    if own.probs is None:
        return None
    width = own.probs.shape[1]
    rows = np.zeros((len(head) + len(own.probs) + len(tail), width), dtype=own.probs.dtype)
    rows[len(head) : len(head) + len(own.probs)] = own.probs
    forced = [*enumerate(head), *((len(head) + len(own.probs) + i, t) for i, t in enumerate(tail))]
    for i, t in forced:
        rows[i, t] = 1.0
    return rows
