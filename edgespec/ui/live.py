"""Run one generation on a worker thread and turn its events into what the UI shows.

The engine runs on its own thread so that rendering (HTML, plots, websocket traffic) never sits
between two target calls: tokens/s then measures generation, not the UI. llama.cpp releases the
GIL inside decode, so the two threads really overlap.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from edgespec.engine import Engine, GenerationConfig, StepEvent
from edgespec.errors import EdgeSpecError
from edgespec.factory import parse_gamma
from edgespec.theory import walltime_speedup
from edgespec.ui.pool import ModelPool, Slot


@dataclass
class Request:
    """One generation as the UI asks for it."""

    target: str
    drafter: str  # 'none' | 'ngram' | draft model name/path
    gamma: str  # a number or 'auto'
    config: GenerationConfig
    ngram: tuple[int, int] = (1, 16)
    messages: list[dict[str, str]] | None = None  # chat: rendered with the model's template
    text: str | None = None  # raw prompt (race), tokenized as is


@dataclass
class StepPoint:
    """One target call, for the live stats plots. Speedups are relative to plain decoding."""

    step: int
    gamma: int
    drafted: int
    accepted: int
    alpha: float
    tokens_per_call: float
    predicted: float
    measured: float
    t: float  # seconds since the generation started


@dataclass
class Tracker:
    """What the UI knows about a generation so far: per-token segments, per-step points, stats."""

    segments: list[tuple[str, str]] = field(default_factory=list)  # (text piece, source) per token
    tokens: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # seconds after the start at which each token arrived
    points: list[StepPoint] = field(default_factory=list)
    last: StepEvent | None = None
    drafter: str = ""
    gamma_label: str = ""
    prompt_tokens: int = 0
    error: str | None = None

    @property
    def text(self) -> str:
        return "".join(p for p, _ in self.segments)

    @property
    def finish_reason(self) -> str | None:
        return None if self.last is None else self.last.finish_reason

    def add(self, ev: StepEvent, point: StepPoint | None, at: float) -> None:
        self.last = ev
        self.segments.extend(zip(ev.pieces, ev.sources, strict=True))
        self.tokens.extend(ev.tokens)
        self.times.extend([at] * len(ev.tokens))
        if point is not None:
            self.points.append(point)


class _Alpha:
    """Per-token acceptance as the paper defines it: accepted drafts over accepted drafts plus
    rejections (drafts after the first rejection of a step were never tested)."""

    def __init__(self) -> None:
        self.succ = 0
        self.trials = 0

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted:
            self.succ += accepted
            self.trials += accepted + (1 if accepted < drafted else 0)

    @property
    def value(self) -> float:
        return self.succ / self.trials if self.trials else 0.0


def _predicted(engine: Engine, alpha: float, costs: dict[int, float], ev: StepEvent) -> tuple[float, float | None]:
    """(predicted speedup from the paper's formula, seconds of a 1-row target pass)."""
    policy = engine.gamma
    snap = getattr(policy, "snapshot", None)
    if snap is not None:
        return float(snap()["predicted_speedup"]), policy.cost(1) or costs.get(1)
    t1 = costs.get(1)
    g = getattr(policy, "gamma", 0)
    if engine.drafter is None or g == 0 or not t1:
        return 1.0, t1
    st = ev.stats
    c = (st.draft_s / st.drafted) / t1 if st.drafted else 0.0
    return walltime_speedup(alpha, g, c, costs[g + 1] / t1), t1


def _worker(pool: ModelPool, req: Request, stop: threading.Event, out: queue.Queue) -> None:
    try:
        with pool.lease(req.target) as slot:
            _generate(slot, pool, req, stop, out)
    except EdgeSpecError as exc:
        out.put(("error", str(exc)))
    except Exception as exc:  # the app must survive anything a model or input can throw
        out.put(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        out.put(("done", None))


def _generate(slot: Slot, pool: ModelPool, req: Request, stop: threading.Event, out: queue.Queue) -> None:
    model = slot.model
    gamma = parse_gamma(req.gamma)
    drafter = slot.drafter(req.drafter, pool.opts, req.ngram)
    engine = Engine(model, drafter, gamma)
    fixed = gamma if isinstance(gamma, int) else None
    rows = [1] if not fixed or drafter is None else [1, fixed + 1]
    costs = slot.costs(rows)
    if req.messages is not None:
        prompt = model.tokenize(model.apply_chat_template(req.messages), add_special=True, parse_special=True)
    else:
        prompt = model.tokenize(req.text or "", add_special=True)
    calibrate = getattr(engine.gamma, "calibrate", None)
    if calibrate is not None and drafter is not None:
        calibrate(model, drafter)  # now, so its timed passes stay out of the recorded token times
    out.put(("start", (engine.drafter_name, getattr(engine.gamma, "label", str(gamma)), len(prompt))))
    t0 = time.perf_counter()
    alpha = _Alpha()
    try:
        for ev in engine.generate(prompt, req.config, stop):
            at = time.perf_counter() - t0
            alpha.observe(ev.drafted, ev.accepted)
            point = None
            if ev.tokens:
                predicted, t1 = _predicted(engine, alpha.value, costs, ev)
                st = ev.stats
                point = StepPoint(
                    step=st.target_calls,
                    gamma=ev.gamma,
                    drafted=ev.drafted,
                    accepted=ev.accepted,
                    alpha=alpha.value,
                    tokens_per_call=st.tokens_per_call,
                    predicted=predicted,
                    measured=st.tokens_per_s * t1 if t1 else 0.0,
                    t=at,
                )
            out.put(("event", (ev, point, at)))
    finally:
        if drafter is not None and req.drafter in ("none", "ngram"):
            drafter.close()


def stream(
    pool: ModelPool,
    req: Request,
    stop: threading.Event,
    every_s: float = 0.1,
) -> Iterator[Tracker]:
    """Start the generation and yield the growing Tracker at most every `every_s` seconds, and once
    more at the end. If the consumer goes away (browser closed, job cancelled) the generation is
    stopped."""
    out: queue.Queue = queue.Queue()
    th = threading.Thread(target=_worker, args=(pool, req, stop, out), daemon=True)
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
                elif kind == "start":
                    tracker.drafter, tracker.gamma_label, tracker.prompt_tokens = payload
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
