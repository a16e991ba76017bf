"""Greedy speculative output against plain decoding on one device: the set-up's GPU check
(apps/buildcheck.py), the device check's end-to-end part (benchmarks/device_check.py) and the GPU
tests run this.

Each draft runs at a fixed draft length with no cost model, so nothing is profiled first (a profile
takes minutes on a slow device such as Mesa's lavapipe). At temperature 0 the tokens must equal plain
decoding's, unless the first difference is at a near-tie of the target's two best logits: a pass
over several rows may sum a logit in another order than a single-token pass (on a GPU as on the CPU,
docs/exactness.md), which flips only such a tie. A larger gap there is a fault.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from edgespec.core.engine import Engine, FixedGamma
from edgespec.runtime.exactness import explain_divergence
from edgespec.service.session import Reply, Request, Session, frame

# A prompt that repeats itself, so that the n-gram drafter finds drafts and passes of several rows run.
PROMPT = ("Copy the list exactly.\nred, green, blue, yellow, red, green, blue, yellow, red, green, blue, "
          "yellow, red, green, blue, yellow\nThe list again:\n")


@dataclass
class GreedyRun:
    draft: str  # 'none' (plain), 'ngram', or the draft model's spec
    tokens: list[int]
    text: str
    seconds: float
    target_calls: int
    accepted: int
    drafted: int
    divergence: dict | None = None  # the first difference from plain decoding (exactness.Divergence)

    @property
    def ok(self) -> bool:
        """Equal to plain decoding, or first different at a near-tie."""
        return self.divergence is None or bool(self.divergence["near_tie"])

    def to_dict(self) -> dict:
        return {"draft": self.draft, "tokens": self.tokens, "text": self.text, "seconds": round(self.seconds, 3),
                "target_calls": self.target_calls, "accepted": self.accepted, "drafted": self.drafted,
                "equal_to_plain": self.divergence is None, "divergence": self.divergence, "ok": self.ok}


def greedy_runs(session: Session, drafts: Sequence[str], gamma: int = 4, max_tokens: int = 16,
                text: str = PROMPT) -> list[GreedyRun]:
    """Plain decoding, then each draft of `drafts` at draft length `gamma`, greedy, `max_tokens` tokens
    of raw completion of `text`; each run after the first is compared with it."""
    target = session.target
    runs: list[GreedyRun] = []
    for spec in ("none", *drafts):
        req = Request(text=text, framing="raw", draft=spec, gamma=str(gamma), max_tokens=max_tokens,
                      reuse_prefix=False)
        framed = frame(target, req)
        drafter = session.drafter(spec)
        engine = Engine(target, drafter, FixedGamma(gamma if drafter is not None else 0), None)
        start = time.perf_counter()
        reply = Reply.collect(engine.generate(framed.tokens, req.config(framed.stop)))
        seconds = time.perf_counter() - start
        st = reply.stats
        run = GreedyRun(spec, reply.tokens, reply.text, seconds, st.target_calls, st.accepted, st.drafted)
        if runs:
            div = explain_divergence(target, framed.tokens, runs[0].tokens, reply.tokens)
            run.divergence = None if div is None else div.to_dict()
        runs.append(run)
    return runs
