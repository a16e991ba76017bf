"""Whether and where batched passes give other logits than single-token decoding.

llama.cpp's CPU kernels can give a token decoded alone slightly different logits than the same
token decoded inside a batch (README, "Exactness"). When the target's two best logits are that
close, the argmax can flip. Two tools, both about the runtime's arithmetic:

* `probe_batch_invariance`: how many rows a pass may have and still give bit-identical logits to
  decoding the same tokens one at a time. Exact mode caps drafts to it; the cost profile
  (`profiles.profile`) runs it once and stores the answer.
* `explain_divergence`: the first differing token of two greedy runs and the target's top-2 logit
  gap there, on the plain single-token path (a near-tie, or a fault in the engine?).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from edgespec.runtime.llama import Model

# A divergence is a "near-tie" when the top-2 logit gap at that position is below this: set just
# above the largest |single - batched| logit difference measured on K-quant models
# (docs/exactness.md), so a larger gap points at a bug in the engine rather than at kernel arithmetic.
NEAR_TIE = 1.5


# A real paragraph for the batch-invariance probe (positions in real text, not a repeated phrase).
PROBE_TEXT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, counting the steps out of "
    "habit rather than need. At the top he trimmed the wick, polished the great lens with a soft cloth, "
    "and wrote the weather in a ledger that nobody had read for thirty years. Ships no longer relied on "
    "his light; satellites told them where the rocks were. Still, on foggy nights, a fishing boat would "
    "sometimes sound its horn as it passed, two short blasts and a long one, and he liked to think it was "
    "a greeting. In the winter the storms came from the north-west and the spray reached the gallery "
    "windows, leaving salt crusted on the glass that took him a whole morning to scrub away."
)


def probe_batch_invariance(model: Model, max_rows: int, contexts: Sequence[int] = (24, 96),
                           progress: Callable[[float], None] | None = None) -> int:
    """Largest K <= max_rows such that passes of 2..K rows give logits bit-identical to decoding
    the same tokens one at a time (1 if not even 2 rows do), after `contexts` tokens of real text.
    Leaves the model's cache reset. progress(fraction) after each context."""
    toks = model.tokenize(PROBE_TEXT, add_special=True)
    best = max_rows
    for i, n_ctx in enumerate(contexts):
        if progress is not None:
            progress(i / len(contexts))
        n_ctx = min(n_ctx, len(toks) - max_rows)
        model.reset()
        model.decode(toks[:n_ctx], n_logits=0)
        singles = np.stack([np.array(model.decode([toks[n_ctx + i]], n_logits=1)[0]) for i in range(max_rows)])
        for k in range(2, best + 1):
            model.truncate(n_ctx)
            if not np.array_equal(model.decode(toks[n_ctx : n_ctx + k], n_logits=k), singles[:k]):
                best = k - 1
                break
    model.reset()
    if progress is not None:
        progress(1.0)
    return best


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where two token sequences differ (None if one prefixes the other
    and they have equal length)."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    if diff.size:
        return int(diff[0])
    return None if len(a) == len(b) else n


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
