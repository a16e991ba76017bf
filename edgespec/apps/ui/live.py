"""Run one Request on a leased Session on a worker thread and hand the UI what it shows.

The session runs on its own thread so that rendering (HTML, plots, websocket traffic) never sits
between two target calls: tokens/s then measures generation, not the UI. llama.cpp releases the
GIL inside decode, so the two threads really overlap.

Every number shown comes from the session's `Reply` (the one fold of the engine's events, with the
one cost model's predicted and measured speedups); nothing here computes acceptance or speedup.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from edgespec.core.drafters import LEARNED
from edgespec.core.grammar import GRAMMAR
from edgespec.runtime.errors import one_line
from edgespec.service.pool import ModelPool
from edgespec.service.session import Reply, Request


@dataclass(frozen=True)
class StepPoint:
    """One target call, for the live stats panel and plots; every figure is read off the Reply."""

    step: int  # target calls so far
    gamma: int  # draft length the policy chose for this call
    drafted: int  # draft tokens proposed in this call
    accepted: int  # of which accepted
    acceptance: float  # reply.stats.acceptance_rate: accepted / drafted, so far
    alpha: float  # reply.stats.alpha: the paper's alpha, accepted / tested, so far
    tokens_per_call: float  # reply.stats.tokens_per_call
    predicted: float | None  # reply.predicted_speedup (None without a drafter: no cost model)
    measured: float | None  # reply.measured_speedup
    t: float  # seconds since the generation started


@dataclass
class Tracker:
    """What the UI knows about a generation so far: the latest Reply, when each token arrived, one
    point per target call, and an error (one line) if it failed."""

    reply: Reply | None = None
    times: list[float] = field(default_factory=list)  # seconds after the start at which each token arrived
    points: list[StepPoint] = field(default_factory=list)
    error: str | None = None

    @property
    def segments(self) -> list[tuple[str, str]]:
        """(text piece, source) per token; an accepted draft from the learned source shows as
        'learned' and one a grammar forced as 'grammar', so those sources get their own colours."""
        r = self.reply
        if r is None:
            return []
        return [(p, b if s == "draft" and b in (LEARNED, GRAMMAR) else s)
                for p, s, b in zip(r.pieces, r.sources, r.drafted_by, strict=True)]

    @property
    def tokens(self) -> list[int]:
        return [] if self.reply is None else self.reply.tokens

    @property
    def text(self) -> str:
        return "" if self.reply is None else self.reply.text

    @property
    def finish_reason(self) -> str | None:
        return None if self.reply is None else self.reply.finish_reason

    def add(self, step: tuple[int, int, int], reply: Reply, at: float) -> None:
        """Record one target call: `step` = (gamma chosen, drafted, accepted), `reply` the fold so far."""
        self.times.extend([at] * (len(reply.tokens) - len(self.tokens)))
        self.reply = reply
        st = reply.stats
        gamma, drafted, accepted = step
        self.points.append(StepPoint(
            step=st.target_calls, gamma=gamma, drafted=drafted, accepted=accepted,
            acceptance=st.acceptance_rate, alpha=st.alpha, tokens_per_call=st.tokens_per_call,
            predicted=reply.predicted_speedup, measured=reply.measured_speedup, t=at,
        ))


def _snapshot(reply: Reply) -> Reply:
    """A copy the UI thread may read while the session goes on folding into the original."""
    return replace(reply, tokens=list(reply.tokens), sources=list(reply.sources), pieces=list(reply.pieces),
                   drafted_by=list(reply.drafted_by),
                   stats=reply.stats.copy(), policy=dict(reply.policy))


def _worker(pool: ModelPool, target: str, req: Request, stop: threading.Event, out: queue.Queue,
            owner: str | None) -> None:
    try:
        with pool.lease(target, owner=owner) as session:
            prepared = session.prepare(req)  # draft model and cost profile: before the clock starts
            t0 = time.perf_counter()
            for ev, reply in session.generate(req, stop, prepared):
                out.put(("event", ((ev.gamma, ev.drafted, ev.accepted), _snapshot(reply), time.perf_counter() - t0)))
    except Exception as exc:  # the app must survive anything a model or input can throw
        out.put(("error", one_line(exc, typed=True)))
    finally:
        out.put(("done", None))


def stream(pool: ModelPool, target: str, req: Request, stop: threading.Event,
           every_s: float = 0.1, owner: str | None = None) -> Iterator[Tracker]:
    """Run `req` on a session of `target` and yield the growing Tracker at most every `every_s`
    seconds, and once more at the end. If the consumer goes away (browser closed, job cancelled)
    the generation is stopped. `owner` (a browser session) gets back the session whose KV cache
    holds its conversation, when it is still loaded."""
    out: queue.Queue = queue.Queue()
    th = threading.Thread(target=_worker, args=(pool, target, req, stop, out, owner), daemon=True)
    th.start()
    tracker = Tracker()
    finished = False
    try:
        yield tracker  # at once, so the UI shows "loading..." while the model loads
        last_yield = time.perf_counter()
        while not finished:
            kind, payload = out.get()
            while True:
                if kind == "done":
                    finished = True
                elif kind == "error":
                    tracker.error = payload
                elif kind == "event":
                    tracker.add(*payload)
                try:
                    kind, payload = out.get_nowait()
                except queue.Empty:
                    break
            now = time.perf_counter()
            if finished or now - last_yield >= every_s:
                last_yield = now
                yield tracker
    finally:
        if not finished:
            stop.set()
            th.join(timeout=30)
