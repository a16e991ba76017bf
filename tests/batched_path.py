"""A target that decodes every scoring call with at least `min_rows` rows (tests of exactness).

llama.cpp's CPU kernels may sum a token's logits in another order when it is decoded inside a batch
than alone (README, "Exactness"). Greedy speculative output can then differ from plain decoding at a
near-tie without any fault in the engine. Wrapping the target in `BatchedPath` puts plain decoding
on the batched path too: a call with fewer rows decodes filler tokens after its own, and rolls them
out of the cache again; the caller gets only its own rows back. The engine is unaware of it; with it,
greedy speculative and plain output must be equal token for token.

The filler goes after the call's tokens, not before: re-decoding the newest committed tokens in front
would replace their keys and values, and where those came from the prompt's batch (over 32 rows:
ggml's own kernels, which sum otherwise than the small-batch ones) the reference's cache was no longer
the one speculation runs on. On an AVX2-only EPYC (haswell module) the prompt's last token but one,
decoded again in a 2-row batch, got logits up to 0.72 away from its prompt-batch ones, and 32 tokens on
a ',' that led '"}' by 0.11 trailed it by 0.46: the reference closed a constrained JSON one token early
and four grammar tests failed there.
A filler row cannot change the rows before it (attention is causal), and it leaves the cache as a call
of its own rows would. Where the context has no room for the filler, the newest tokens are
re-decoded in front as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class BatchedPath:
    """`target` with every decode that returns logits at least `min_rows` rows long."""

    def __init__(self, target, min_rows: int = 2) -> None:
        self.target = target
        self.min_rows = min_rows
        self.padded_calls = 0  # calls that were padded (tests check the wrapper did its job)

    def __getattr__(self, name: str):
        return getattr(self.target, name)

    def decode(self, tokens: Sequence[int], n_logits: int = 1, hidden: bool = False) -> np.ndarray:
        t = self.target
        pad = self.min_rows - len(tokens) if n_logits > 0 else 0
        if pad <= 0:
            return t.decode(tokens, n_logits, hidden)
        self.padded_calls += 1
        if t.n_past + len(tokens) + pad <= t.n_ctx:  # filler after the call's rows, then rolled back
            end = t.n_past + len(tokens)
            rows = len(tokens) if hidden else n_logits
            logits = t.decode(list(tokens) + [tokens[-1]] * pad, n_logits=rows + pad, hidden=hidden)
            t.truncate(end)
            if hidden:
                t.last_hidden = t.last_hidden[:rows]
            return logits[:rows]
        pad = min(pad, t.n_past)  # no room at the end of the context: the newest tokens again in front
        if pad <= 0:
            return t.decode(tokens, n_logits, hidden)
        before = list(t.cached[t.n_past - pad :])
        t.truncate(t.n_past - pad)
        if hidden:  # hidden states need logits on every row: take them all and drop the padding's
            logits = t.decode(before + list(tokens), n_logits=pad + len(tokens), hidden=True)
            t.last_hidden = t.last_hidden[pad:]
            return logits[pad:]
        return t.decode(before + list(tokens), n_logits=n_logits)
