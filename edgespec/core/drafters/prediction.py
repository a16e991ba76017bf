"""Predicted outputs (OpenAI's `prediction: {"type": "content", "content": ...}`): the text the client
expects the answer to be, e.g. the file an edit rewrites, as a draft source of its own (provenance
`prediction`). Verified like any draft, so the output is the target's own.

The drafter follows the answer through the predicted tokens: from the start, while each committed
token is the next predicted one; after a token that differs (the edit itself), from the place where
the answer's last tokens occur in the prediction again (the longest of them, nearest after the place
it last followed). While it follows, it proposes what comes next in the prediction; elsewhere the
drafter it wraps (the server's, e.g. n-gram lookup) proposes, so a prediction goes first where it
matches and costs nothing where it does not.

Its hint gives gamma auto a per-token confidence, the share of its proposals that came true in this
generation (from a prior of PRIOR over PRIOR_WEIGHT tokens): a prediction that keeps matching is
drafted long, one that does not is soon drafted short.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgespec.core.drafters import Draft, Drafter, Hint
from edgespec.core.drafters.ngram import ngram_sizes
from edgespec.core.sampling import SamplingParams

PREDICTION = "prediction"  # Draft.source / Hint.source: token provenance and stats show it
SIZES = ngram_sizes(2, 16)  # how many of the answer's last tokens are looked up to find the place again
PRIOR, PRIOR_WEIGHT = 0.9, 4.0  # a client's prediction is mostly right (it sends the file it expects back)
LONG_MATCH = 8  # a match this long places the answer even before where it last followed
MAX_PLAN = 64  # longest proposal the hint gives estimates for (gamma auto's profile goes less far)


class PredictionDrafter:
    """Proposes the predicted tokens where the answer follows them, else what `inner` proposes."""

    def __init__(self, predicted: Sequence[int], inner: Drafter | None = None) -> None:
        self.pred = [int(t) for t in predicted]
        self.inner = inner
        self.name = PREDICTION if inner is None else f"{PREDICTION}+{inner.name}"
        self.needs_hidden = inner is not None and inner.needs_hidden
        # n-gram of the prediction -> positions right after each occurrence, ascending
        self._index: dict[tuple[int, ...], list[int]] = {}
        for n in SIZES:
            for end in range(n, len(self.pred)):
                self._index.setdefault(tuple(self.pred[end - n : end]), []).append(end)
        self._reset(0)

    def _reset(self, start: int) -> None:
        self._start = start  # where the answer begins in the context
        self._seen = start  # context tokens followed so far
        self._at: int | None = 0  # the next predicted token, while the answer follows the prediction
        self._last = 0  # where it last followed
        self._hits, self._trials = PRIOR * PRIOR_WEIGHT, PRIOR_WEIGHT
        self._offered: int | None = None  # where the last proposal (or would-be proposal) started

    def begin(self, prompt: Sequence[int], sampling: SamplingParams) -> None:
        self._reset(len(prompt))
        if self.inner is not None:
            self.inner.begin(prompt, sampling)

    # ------------------------------------------------------------------ following the answer
    def _follow(self, context: Sequence[int]) -> None:
        """Move along the prediction with the tokens committed since the last call."""
        for t in context[self._seen :]:
            if self._at is not None and self._at < len(self.pred) and self.pred[self._at] == int(t):
                self._at += 1
                self._last = self._at
            else:
                self._at = None
        self._seen = len(context)
        if self._at is None or self._at >= len(self.pred):
            self._at = self._find(context[self._start :])

    def _find(self, answer: Sequence[int]) -> int | None:
        """The place after the longest end of `answer` found in the prediction (nearest after the
        place it last followed, else the first), None when not even SIZES[0] tokens are."""
        for n in reversed(SIZES):
            if n > len(answer):
                continue
            ends = self._index.get(tuple(int(t) for t in answer[len(answer) - n :]))
            after = [e for e in ends or () if e >= self._last]
            if after:
                return after[0]
            if ends and n >= LONG_MATCH:  # the answer went back in the prediction (a long match only)
                return ends[-1]
        return None

    @property
    def confidence(self) -> float:
        """Estimated chance that a proposed token is accepted once the ones before it were."""
        return self._hits / self._trials

    # ------------------------------------------------------------------ the protocol
    def hint(self, context: Sequence[int]) -> Hint:
        self._follow(context)
        self._offered = self._at
        if self._at is not None:
            left = min(len(self.pred) - self._at, MAX_PLAN)  # predicted tokens it can propose
            return Hint(left, PREDICTION, 0.0, copies=True, confidence=(self.confidence,) * left)
        if self.inner is None:
            return Hint.nothing(PREDICTION)
        return self.inner.hint(context)

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        self._follow(context)
        if self._at is not None:
            return Draft(np.asarray(self.pred[self._at : self._at + gamma], dtype=np.int32), None, PREDICTION)
        if self.inner is None or gamma <= 0:
            return Draft()
        d = self.inner.propose(context, gamma)
        return Draft(d.tokens, d.probs, d.source or self.inner.name)

    def observe_hidden(self, hidden: np.ndarray) -> None:
        if self.inner is not None:
            self.inner.observe_hidden(hidden)

    def commit(self, context: Sequence[int], n_accepted: int) -> None:
        # Every step scores what the prediction offered, drafted or not: the tokens that came true
        # and the first that did not.
        at, self._offered = self._offered, None
        if at is not None:
            new = [int(t) for t in context[self._seen :]]
            ahead = self.pred[at:]
            agreed = next((j for j, (a, b) in enumerate(zip(ahead, new, strict=False)) if a != b),
                          min(len(ahead), len(new)))
            tested = min(agreed + 1, len(new), len(ahead))
            self._hits += agreed
            self._trials += tested
        self._follow(context)
        if self.inner is not None:
            self.inner.commit(context, n_accepted)

    def draft_cost_s(self) -> float:
        return self.inner.draft_cost_s() if self.inner is not None else 0.0

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()
