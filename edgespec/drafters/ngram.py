"""Prompt-lookup (n-gram) drafter: find the latest earlier occurrence of the context's last n
tokens and propose what followed it. Grounded tasks (editing code, summarising, RAG) copy long
spans of their input, which this catches at almost no cost.

The index is incremental: each committed token adds one entry per n-gram size, so a step costs
O(n_max) dictionary work however long the context is (no rescans of the whole context).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgespec.drafters import Draft
from edgespec.errors import EdgeSpecError
from edgespec.sampling import SamplingParams


class NgramDrafter:
    name = "ngram"

    def __init__(self, n_min: int = 1, n_max: int = 4) -> None:
        if not (1 <= n_min <= n_max):
            raise EdgeSpecError(f"n-gram sizes need 1 <= n_min <= n_max, got {n_min}..{n_max}")
        self.n_min = n_min
        self.n_max = n_max
        self._tokens: list[int] = []
        # (n-gram) -> position right after its latest occurrence, for occurrences that end before
        # the last committed token (so the continuation is at least one known token).
        self._index: dict[tuple[int, ...], int] = {}

    def begin(self, prompt: Sequence[int], sampling: SamplingParams | None = None) -> None:
        self._tokens = []
        self._index = {}
        self._extend(prompt)

    def _extend(self, context: Sequence[int]) -> None:
        n_old = len(self._tokens)
        # Context only ever grows within a generation; a cheap check catches a caller that reused
        # the drafter for another text without begin().
        if len(context) < n_old or (n_old and int(context[n_old - 1]) != self._tokens[-1]):
            self._tokens, self._index = [], {}
        toks = self._tokens
        start = len(toks)
        toks.extend(int(t) for t in context[start:])
        # Index n-grams ending at positions end-1 for end in [old_len, len-1]: their continuation
        # toks[end] exists. The n-gram ending at the last token is the query, not an entry.
        for end in range(max(start, 1), len(toks)):
            for n in range(self.n_min, min(self.n_max, end) + 1):
                self._index[tuple(toks[end - n : end])] = end

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        self._extend(context)
        toks = self._tokens
        if gamma <= 0:
            return Draft()
        for n in range(min(self.n_max, len(toks)), self.n_min - 1, -1):
            pos = self._index.get(tuple(toks[len(toks) - n :]))
            if pos is not None:
                cont = toks[pos : pos + gamma]
                return Draft(np.asarray(cont, dtype=np.int32))
        return Draft()

    def close(self) -> None:
        self._tokens, self._index = [], {}
