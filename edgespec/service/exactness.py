"""Where and why greedy speculative output differs from plain decoding.

llama.cpp's CPU kernels can give a token decoded alone slightly different logits than the same
token decoded inside a batch (README, "Exactness"). When the target's two best logits are that
close, the argmax can flip. `explain_divergence` locates the first differing token of two greedy
runs and measures the target's top-2 logit gap there, on the plain single-token path.

Exact mode's batch-invariance probe (how many rows a pass may have and still match single-token
decoding) is `edgespec.runtime.profiles.probe_batch_invariance`: the cost profile stores its
answer and the cost model below this layer reads it, so it lives with the profile.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from edgespec.core.engine import first_divergence
from edgespec.runtime.llama import Model

# A divergence is a "near-tie" when the top-2 logit gap at that position is below this. Measured
# |single - batched| logit differences reach 1.2 on K-quant models (NOTES), so gaps under ~1.5 can
# flip; larger gaps would point at a bug in the engine rather than at kernel arithmetic.
NEAR_TIE = 1.5


@dataclass
class Divergence:
    position: int  # index into the generated tokens
    baseline_token: int
    candidate_token: int
    top2_gap: float  # logit(top1) - logit(top2) of the target at that position, plain decoding
    near_tie: bool

    def to_dict(self) -> dict:
        return asdict(self)


def top2_gap(model: Model, context: Sequence[int]) -> tuple[float, int, int]:
    """Decode `context` (prefill, then its last token alone) and return the target's top-2 logit gap
    for the next token with the two token ids. Leaves the model's cache reset."""
    model.reset()
    if len(context) > 1:
        model.decode(list(context[:-1]), n_logits=0)
    row = np.array(model.decode([context[-1]], n_logits=1)[0])
    model.reset()
    top = np.argpartition(-row, 2)[:2]
    top = top[np.argsort(-row[top])]
    return float(row[top[0]] - row[top[1]]), int(top[0]), int(top[1])


def explain_divergence(
    model: Model, prompt: Sequence[int], baseline: Sequence[int], candidate: Sequence[int]
) -> Divergence | None:
    """None if the two generations are identical; else the first difference and its top-2 gap.
    A generation that ended (end-of-generation token) where the other went on shows token -1."""
    pos = first_divergence(baseline, candidate)
    if pos is None:
        return None
    gap, _, _ = top2_gap(model, [*prompt, *baseline[:pos]])

    def at(seq: Sequence[int]) -> int:
        return int(seq[pos]) if pos < len(seq) else -1

    return Divergence(pos, at(baseline), at(candidate), gap, gap < NEAR_TIE)
