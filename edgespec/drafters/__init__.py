"""Drafters propose tokens for the target to verify. One protocol, one file per way of drafting.

A drafter sees only committed tokens (prompt + accepted output), so rejected guesses never leak
into its state; a stateful drafter (a draft model with its own KV cache) rolls itself back in
`propose` by comparing the context it is given with the one it cached.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from edgespec.sampling import SamplingParams


@dataclass
class Draft:
    """Proposed continuation.

    tokens: [k] token ids.
    probs: [k, V] processed draft distributions q_i the tokens were sampled from, or None when the
    drafter is deterministic (q_i is one-hot at tokens[i]; n-gram lookup, greedy drafting).
    """

    tokens: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int32))
    probs: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def head(self, k: int) -> Draft:
        """The first k proposed tokens."""
        return Draft(self.tokens[:k], None if self.probs is None else self.probs[:k])


class Drafter(Protocol):
    name: str

    def begin(self, prompt: Sequence[int], sampling: SamplingParams) -> None:
        """A new generation starts from `prompt`, sampled with `sampling` (drafters that sample
        must use the same settings so that q is processed like p)."""

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        """Propose up to `gamma` tokens to follow `context` (prompt + committed output).

        A drafter that can tell cheaply how promising its next draft is may also define
        `hint(context) -> int` (0: nothing to propose); gamma auto keeps acceptance per hint."""

    def close(self) -> None:
        """Release resources (models, contexts)."""
