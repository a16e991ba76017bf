"""A target that decodes every scoring call with at least `min_rows` rows (tests of exactness).

llama.cpp's CPU kernels may sum a token's logits in another order when it is decoded inside a batch
than alone (README, "Exactness"). Greedy speculative output can then differ from plain decoding at a
near-tie without any fault in the engine. Wrapping the target in `BatchedPath` puts plain decoding
on the batched path too: a call with fewer rows rolls the newest committed tokens out of the cache
and decodes them again in front, and the caller gets only its own rows back. The engine is unaware
of it; with it, greedy speculative and plain output must be equal token for token.
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
        pad = min(self.min_rows - len(tokens), t.n_past) if n_logits > 0 else 0
        if pad <= 0:
            return t.decode(tokens, n_logits, hidden)
        before = list(t.cached[t.n_past - pad :])
        t.truncate(t.n_past - pad)
        self.padded_calls += 1
        if hidden:  # hidden states need logits on every row: take them all and drop the padding's
            logits = t.decode(before + list(tokens), n_logits=pad + len(tokens), hidden=True)
            t.last_hidden = t.last_hidden[pad:]
            return logits[pad:]
        return t.decode(before + list(tokens), n_logits=n_logits)
