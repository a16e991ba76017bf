"""Jobs and the worker: one thread per served model takes requests from a bounded queue one at a
time, leases the model's Session from the pool (shared with the UI), checks the prompt against the
context and runs `Session.generate`, handing each step's released tokens to the handler's event
loop. A job's stop event ends its generation at the next step (client gone, server shutting down)."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from edgespec.apps.server.protocol import ApiError, summary
from edgespec.runtime.errors import EdgeSpecError, one_line
from edgespec.service.pool import ModelPool
from edgespec.service.session import Request

# What the worker tells a handler, in order: ("start", prompt tokens), ("delta", released tokens
# with their provenance)..., then ("done", summary, or None if it never ran) or ("error", ApiError).
Event = Literal["start", "delta", "done", "error"]
Message = tuple[Event, Any]


@dataclass
class Job:
    """One request on its way through a model's queue; the worker talks back through `out`."""

    req: Request
    max_tokens_given: bool
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue[Message] = field(default_factory=asyncio.Queue)
    stop: threading.Event = field(default_factory=threading.Event)

    def emit(self, kind: Event, payload: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.out.put_nowait, (kind, payload))
        except RuntimeError:  # the event loop is gone (server shutting down)
            self.stop.set()


class Busy(Exception):
    """The queue is full."""


class Closing(Exception):
    """The server is shutting down and takes no new jobs."""


class ModelSlot:
    """One served target: its pool key, a bounded job queue and one worker thread, so one
    generation runs at a time and at most `queue_size` wait."""

    def __init__(self, model_id: str, key: str, pool: ModelPool, queue_size: int, aliases: Sequence[str] = (),
                 n_ctx: int = 0) -> None:
        self.id = model_id
        self.key = key
        self.pool = pool
        self.queue_size = queue_size
        self.aliases = {model_id, *aliases}
        self.created = int(time.time())
        self.n_ctx = n_ctx  # the loaded context's size (/v1/models), 0 until known
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self.pending = 0  # jobs accepted and not finished: waiting + running
        self.running = False
        self.generations = 0
        self.stopped = 0
        self.closing = False
        self._live: dict[int, Job] = {}  # jobs accepted and not finished, by id()
        self._thread = threading.Thread(target=self._work, name=f"edgespec-worker-{model_id}", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._lock:
            if self.closing:
                raise Closing()
            if self.pending >= 1 + self.queue_size:
                raise Busy()
            self.pending += 1
            self._live[id(job)] = job
        self.jobs.put(job)

    def stop_all(self) -> None:
        """Shutting down: take no new jobs; the running one ends at its next step, waiting ones at once."""
        with self._lock:
            self.closing = True
            live = list(self._live.values())
        for job in live:
            job.stop.set()

    @property
    def waiting(self) -> int:
        return max(0, self.pending - int(self.running))

    def close(self) -> None:
        self.jobs.put(None)

    def _finished(self, job: Job) -> None:
        with self._lock:
            self.running = False
            self.pending -= 1
            self._live.pop(id(job), None)

    def _work(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            if job.stop.is_set():  # the client left while waiting, or the server is shutting down
                job.emit("done", None)
                self._finished(job)
                continue
            self.running = True
            try:
                self._run(job)
            except ApiError as exc:
                job.emit("error", exc)
            except BaseException as exc:  # the worker must survive anything a request can throw
                job.emit("error", _as_api_error(exc))
            finally:
                self._finished(job)

    def _run(self, job: Job) -> None:
        with ExitStack() as held:
            try:
                session = held.enter_context(self.pool.lease(self.key))
            except EdgeSpecError as exc:  # the server's model, not the client's request
                raise ApiError(503, f"the model cannot be loaded: {one_line(exc)}", "model_unavailable",
                               kind="server_error") from None
            self.n_ctx = session.target.n_ctx
            framed, engine = session.prepare(job.req)
            req = _fit(job.req, len(framed.tokens), self.n_ctx, job.max_tokens_given)
            job.emit("start", len(framed.tokens))
            shown = 0
            reply = None
            for _, reply in session.generate(req, job.stop, (framed, engine)):
                n = len(reply.tokens)
                if n > shown:
                    delta = {"tokens": reply.tokens[shown:n], "pieces": reply.pieces[shown:n],
                             "sources": reply.sources[shown:n], "drafted_by": reply.drafted_by[shown:n]}
                    if reply.logprobs:
                        delta["logprobs"] = reply.logprobs[shown:n]
                    job.emit("delta", delta)
                    shown = n
            self.generations += 1
            if reply is not None and reply.finish_reason == "stopped":
                self.stopped += 1
            job.emit("done", None if reply is None else summary(reply))


def _fit(req: Request, n_prompt: int, n_ctx: int, max_tokens_given: bool) -> Request:
    """`req` with max_tokens cut to the room the context leaves after the prompt, or a 400 when the
    prompt does not fit, or the client's own max_tokens does not."""
    if n_prompt >= n_ctx:
        raise ApiError(400, f"this model's context holds {n_ctx} tokens, but the prompt is {n_prompt} tokens; "
                       "shorten it (or restart the server with a larger --ctx)", "context_length_exceeded",
                       "messages")
    if n_prompt + req.max_tokens <= n_ctx:
        return req
    if max_tokens_given:
        raise ApiError(400, f"this model's context holds {n_ctx} tokens, but {n_prompt + req.max_tokens} "
                       f"were requested ({n_prompt} in the prompt, max_tokens {req.max_tokens}); lower "
                       "max_tokens or shorten the prompt", "context_length_exceeded", "max_tokens")
    return replace(req, max_tokens=n_ctx - n_prompt)


def _as_api_error(exc: BaseException) -> ApiError:
    """A failed generation's error: the user's (400) for an EdgeSpecError, else an internal one."""
    if isinstance(exc, EdgeSpecError):
        return ApiError(400, one_line(exc))
    return ApiError(500, one_line(exc), "internal_error", kind="server_error")
