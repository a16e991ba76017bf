"""Prompt-lookup (n-gram) drafter: find the latest earlier occurrence of the context's last n
tokens, for the largest n that occurs, and propose what followed it. Grounded tasks (editing code,
summarising, RAG) copy long spans of their input, which this catches at almost no cost.

n runs over a ladder of sizes (every size up to 4, then 6, 8, 12, 16, ...), so the size that
matched also says how far the text is into a copied span: a long match is followed by an accepted
next token far more often than a 1-token one (docs/gamma_auto.md has the measured rates). `hint`
reports it (a copying Hint of that size) so gamma auto can keep acceptance per match size.

The index is incremental: each committed token adds one entry per size, so a step costs
O(number of sizes) dictionary work however long the context is (no rescans of the whole context).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgespec.core.drafters import NGRAM_SIZES, Draft, DraftContext, Hint, register
from edgespec.core.sampling import SamplingParams
from edgespec.runtime.errors import EdgeSpecError


class NgramDrafter:
    name = "ngram"
    needs_hidden = False

    def __init__(self, n_min: int = NGRAM_SIZES[0], n_max: int = NGRAM_SIZES[1]) -> None:
        if not (1 <= n_min <= n_max):
            raise EdgeSpecError(f"n-gram sizes need 1 <= n_min <= n_max, got {n_min}..{n_max}")
        self.n_min = n_min
        self.n_max = n_max
        self.sizes = ngram_sizes(n_min, n_max)
        # One hint per possible match size, made once: `hint` runs every step.
        self._hints = {0: Hint.nothing(), **{n: Hint(n, copies=True) for n in self.sizes}}
        self._tokens: list[int] = []
        # (n-gram) -> position right after its latest occurrence, for occurrences that end before
        # the last committed token (so the continuation is at least one known token).
        self._index: dict[tuple[int, ...], int] = {}
        # The last lookup's result, kept until the context changes: `hint` and `propose` of one
        # step ask for the same match.
        self._found: tuple[int, int] | None = None

    def begin(self, prompt: Sequence[int], sampling: SamplingParams | None = None) -> None:
        self._tokens, self._index, self._found = [], {}, None
        self._extend(prompt)

    def _extend(self, context: Sequence[int]) -> None:
        n_old = len(self._tokens)
        # Context only ever grows within a generation; a cheap check catches a caller that reused
        # the drafter for another text without begin().
        if len(context) < n_old or (n_old and int(context[n_old - 1]) != self._tokens[-1]):
            self._tokens, self._index, self._found = [], {}, None
        toks = self._tokens
        start = len(toks)
        toks.extend(int(t) for t in context[start:])
        if len(toks) > start:
            self._found = None
        # Index n-grams ending at positions end-1 for end in [old_len, len-1]: their continuation
        # toks[end] exists. The n-gram ending at the last token is the query, not an entry.
        for end in range(max(start, 1), len(toks)):
            for n in self.sizes:
                if n > end:
                    break
                self._index[tuple(toks[end - n : end])] = end

    def _lookup(self, context: Sequence[int]) -> tuple[int, int]:
        """(size of the longest matching n-gram, position after its latest occurrence); (0, 0)
        when not even n_min tokens recur."""
        self._extend(context)
        if self._found is None:
            self._found = self._search()
        return self._found

    def _search(self) -> tuple[int, int]:
        toks = self._tokens
        for n in reversed(self.sizes):
            if n <= len(toks):
                pos = self._index.get(tuple(toks[len(toks) - n :]))
                if pos is not None:
                    return n, pos
        return 0, 0

    def hint(self, context: Sequence[int]) -> Hint:
        """The next proposal copies on from a match of `size` tokens (0: nothing to propose)."""
        return self._hints[self._lookup(context)[0]]

    def match_size(self, context: Sequence[int]) -> int:
        """Size of the n-gram the next proposal would copy from (0: no match)."""
        return self._lookup(context)[0]

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        n, pos = self._lookup(context)
        if gamma <= 0 or n == 0:
            return Draft()
        toks = self._tokens
        out = toks[pos : pos + gamma]
        # A copy that reaches the end of the context goes on from its own start (an overlapping
        # copy, as in LZ77): the match says the text repeats with period len(toks) - pos, so a
        # loop ("Summary:\nSummary:\n...", a repeated line) is drafted as far as asked rather
        # than only up to the context's end.
        period = len(toks) - pos
        while len(out) < gamma:
            out.append(out[len(out) - period])
        return Draft(np.asarray(out, dtype=np.int32))

    def commit(self, context: Sequence[int], n_accepted: int) -> None:
        self._extend(context)

    def draft_cost_s(self) -> float:
        return 0.0  # a dictionary lookup: nothing next to a target pass

    def close(self) -> None:
        self._tokens, self._index, self._found = [], {}, None


@register("ngram", "prompt lookup: copies what followed the longest recurring n-gram (--ngram MIN,MAX)",
          options="--ngram MIN,MAX")
def _build(ctx: DraftContext) -> NgramDrafter:
    return NgramDrafter(*ctx.ngram)


def ngram_sizes(n_min: int, n_max: int) -> tuple[int, ...]:
    """Every size up to 4, then 6, 8, 12, 16, 24, 32, ... (and n_max), within [n_min, n_max]."""
    ladder = [1, 2, 3, 4]
    while ladder[-1] < n_max:
        ladder.append(2 * ladder[-2])  # 6, 8, 12, 16, 24, ...
    sizes = {n for n in ladder if n_min <= n <= n_max} | {n_min, n_max}
    return tuple(sorted(sizes))
