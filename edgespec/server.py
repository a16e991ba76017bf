"""OpenAI-compatible HTTP server: `python app.py serve --target T --draft D [--host 127.0.0.1]
[--port 8000] [--api-key KEY] [--ui]`.

Endpoints: /v1/models, /v1/completions, /v1/chat/completions (JSON or server-sent events),
/health; with --ui the Gradio app under /ui, in the same process and on the same loaded model.

How a request runs (the only generation path is `Session.generate`):
  * the handler validates the body (pydantic), builds a `session.Request` from it and the server's
    command-line defaults, and puts a `Job` on the model's bounded queue; a full queue answers 429
    at once, in the OpenAI error shape;
  * one worker thread per loaded model takes jobs one at a time, leases the model's `Session`
    from the pool (shared with the UI, so the UI and the API never decode at the same time), frames
    the prompt, checks it against the context, and runs `Session.generate(req, stop)`, handing each
    step's released tokens to the handler's event loop;
  * the Session keeps the KV cache between requests, so a chat client that resends the
    conversation each turn gets only the new turn prefilled (`timings.cache_n`, `prompt_n`);
  * a client that disconnects (mid-stream, or while waiting) sets the job's stop event: the engine
    ends at the next step and the worker takes the next job;
  * Ctrl-C (SIGINT) or SIGTERM stops every running and waiting job the same way, so each open stream
    ends with its final chunk (finish_reason) and [DONE] before the server exits (130 after Ctrl-C).

Responses carry llama-server's `timings` (prompt_n, cache_n, predicted_per_second, draft_n,
draft_n_accepted, ...) plus acceptance, alpha and mean accepted tokens per target call; streamed
chunks carry per-token provenance in `edgespec` (token ids, text pieces, sources
draft/target/bonus, and the drafter of each accepted draft token).

Security: 127.0.0.1 by default; any other address needs --api-key (then every /v1 request needs
`Authorization: Bearer KEY`, and the UI a login whose password is the key); chat templates from
GGUF metadata are rendered in Jinja's sandbox (runtime.render_chat_template).
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse

from edgespec.args import Parser, add_generation_args, check_address, check_exposure, key_auth
from edgespec.errors import EdgeSpecError
from edgespec.sampling import SamplingParams

DEFAULT_PORT = 8000
DEFAULT_QUEUE = 8
MAX_BODY = 8 << 20  # bytes
MAX_STOPS = 16
POLL_S = 0.25  # how often a waiting handler checks that its client is still there
FINISH = {"eog": "stop", "stop": "stop", "length": "length", "context": "length", "stopped": "stop"}


# ----------------------------------------------------------------------------- errors
class ApiError(Exception):
    """An error answered in the OpenAI shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.kind = kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return " ".join(lines) if lines else type(exc).__name__


# ----------------------------------------------------------------------------- request bodies
def _models():
    """The pydantic request models (built lazily: pydantic is only imported by the server)."""
    from pydantic import BaseModel, ConfigDict, Field

    class Body(BaseModel):
        # Unknown fields are ignored, as OpenAI-compatible servers do (clients send many).
        model_config = ConfigDict(extra="ignore")

        model: str | None = None
        stream: bool = False
        stream_options: dict[str, Any] | None = None
        max_tokens: int | None = Field(None, ge=1)
        max_completion_tokens: int | None = Field(None, ge=1)
        temperature: float | None = Field(None, ge=0.0, le=5.0)
        top_p: float | None = Field(None, gt=0.0, le=1.0)
        top_k: int | None = Field(None, ge=0)  # extension (llama-server, vLLM)
        min_p: float | None = Field(None, ge=0.0, lt=1.0)  # extension
        seed: int | None = None
        stop: str | list[str] | None = None
        n: int = Field(1, ge=1)
        logprobs: bool | int | None = None
        presence_penalty: float = 0.0
        frequency_penalty: float = 0.0
        logit_bias: dict[str, float] | None = None
        # EdgeSpec / llama-server extensions
        draft: str | None = None  # 'none' or the server's --draft
        gamma: str | int | None = None  # a number or 'auto'
        cache_prompt: bool = True  # llama-server's name: reuse the cached prefix
        ignore_eos: bool = False  # llama-server's name: generate past end-of-generation tokens

    class Part(BaseModel):
        model_config = ConfigDict(extra="ignore")
        type: str
        text: str | None = None

    class Message(BaseModel):
        model_config = ConfigDict(extra="ignore")
        role: str
        content: str | list[Part] | None = None

    class ChatBody(Body):
        messages: list[Message] = Field(min_length=1)
        tools: list[Any] | None = None

    class CompletionBody(Body):
        prompt: str | list[str]
        echo: bool = False
        suffix: str | None = None
        best_of: int | None = None

    return ChatBody, CompletionBody


_MODELS: tuple | None = None


def _parse(raw: bytes, kind: Literal["chat", "completion"]):  # noqa: ANN202
    from pydantic import ValidationError

    global _MODELS
    if _MODELS is None:
        _MODELS = _models()
    if len(raw) > MAX_BODY:
        raise ApiError(413, f"the request body is larger than {MAX_BODY >> 20} MB")
    try:
        data = json.loads(raw)
    except ValueError as exc:
        msg = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise ApiError(400, f"the request body is not valid JSON: {msg}", "invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", "invalid_json")
    cls = _MODELS[0] if kind == "chat" else _MODELS[1]
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise ApiError(400, f"{loc}: {err['msg']}{more}", "invalid_type" if "type" in err["type"] else "invalid_value",
                       param=loc) from None


def _text(content: Any, where: str) -> str:
    if content is None:
        raise ApiError(400, f"{where}: content is missing", param=where)
    if isinstance(content, str):
        return content
    parts = []
    for i, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise ApiError(400, f"{where}.content.{i}: only text parts are supported, got {part.type!r}",
                           param=f"{where}.content")
        parts.append(part.text)
    return "".join(parts)


def _unsupported(body: Any) -> None:
    if body.n != 1:
        raise ApiError(400, "n > 1 is not supported (one choice per request)", param="n")
    if body.logprobs:
        raise ApiError(400, "logprobs are not supported", param="logprobs")
    if body.presence_penalty or body.frequency_penalty:
        raise ApiError(400, "presence and frequency penalties are not supported (they would change the target's "
                       "distribution that speculative sampling reproduces)", param="presence_penalty")
    if body.logit_bias:
        raise ApiError(400, "logit_bias is not supported", param="logit_bias")


# ----------------------------------------------------------------------------- jobs and the worker
@dataclass
class Job:
    """One request on its way through a model's queue; the worker talks back through `out`."""

    req: Any  # session.Request
    max_tokens_given: bool
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    stop: threading.Event = field(default_factory=threading.Event)

    def emit(self, kind: str, payload: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.out.put_nowait, (kind, payload))
        except RuntimeError:  # the event loop is gone (server shutting down)
            self.stop.set()


class Busy(Exception):
    pass


class Closing(Exception):
    """The server is shutting down and takes no new jobs."""


class ModelSlot:
    """One served target: its pool key, a bounded job queue and one worker thread, so one
    generation runs at a time and at most `queue_size` wait."""

    def __init__(self, model_id: str, key: str, pool: Any, queue_size: int, aliases: Sequence[str] = ()) -> None:
        self.id = model_id
        self.key = key
        self.pool = pool
        self.queue_size = queue_size
        self.aliases = {model_id, *aliases}
        self.created = int(time.time())
        self.n_ctx = 0
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

    def _work(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            if job.stop.is_set():  # the client left while waiting, or the server is shutting down
                job.emit("done", None)
                with self._lock:
                    self.pending -= 1
                    self._live.pop(id(job), None)
                continue
            self.running = True
            try:
                self._run(job)
            except ApiError as exc:
                job.emit("error", exc)
            except BaseException as exc:  # the worker must survive anything a request can throw
                status = 400 if isinstance(exc, EdgeSpecError) else 500
                job.emit("error", ApiError(status, _one_line(exc), None if status == 400 else "internal_error",
                                           kind="invalid_request_error" if status == 400 else "server_error"))
            finally:
                with self._lock:
                    self.running = False
                    self.pending -= 1
                    self._live.pop(id(job), None)

    def _run(self, job: Job) -> None:
        req = job.req
        with self.pool.lease(self.key) as session:
            self.n_ctx = session.target.n_ctx
            framed, engine = session.prepare(req)
            n_prompt = len(framed.tokens)
            n_ctx = session.target.n_ctx
            if n_prompt >= n_ctx:
                raise ApiError(400, f"this model's context holds {n_ctx} tokens, but the prompt is {n_prompt} tokens; "
                               "shorten it (or restart the server with a larger --ctx)", "context_length_exceeded",
                               "messages")
            if n_prompt + req.max_tokens > n_ctx:
                if job.max_tokens_given:
                    raise ApiError(400, f"this model's context holds {n_ctx} tokens, but {n_prompt + req.max_tokens} "
                                   f"were requested ({n_prompt} in the prompt, max_tokens {req.max_tokens}); lower "
                                   "max_tokens or shorten the prompt", "context_length_exceeded", "max_tokens")
                req = replace(req, max_tokens=n_ctx - n_prompt)
            job.emit("start", n_prompt)
            shown = 0
            reply = None
            for _, reply in session.generate(req, job.stop, (framed, engine)):
                n = len(reply.tokens)
                if n > shown:
                    job.emit("delta", {"tokens": reply.tokens[shown:n], "pieces": reply.pieces[shown:n],
                                       "sources": reply.sources[shown:n], "drafters": reply.drafted_by[shown:n]})
                    shown = n
            self.generations += 1
            if reply is not None and reply.finish_reason == "stopped":
                self.stopped += 1
            job.emit("done", None if reply is None else _summary(reply))


def _summary(reply: Any) -> dict:
    """What the final response says about a finished generation (computed on the worker thread)."""
    st = reply.stats
    prompt_s = st.prefill_s
    decode_s = st.decode_s
    timings = {
        # llama-server's names
        "cache_n": st.prompt_reused,
        "prompt_n": st.prompt_prefilled,
        "prompt_ms": 1000 * prompt_s,
        "prompt_per_token_ms": 1000 * prompt_s / st.prompt_prefilled if st.prompt_prefilled else 0.0,
        "prompt_per_second": st.prompt_prefilled / prompt_s if prompt_s > 0 else 0.0,
        "predicted_n": st.generated,
        "predicted_ms": 1000 * decode_s,
        "predicted_per_token_ms": 1000 * decode_s / st.generated if st.generated else 0.0,
        "predicted_per_second": st.tokens_per_s,
        "draft_n": st.drafted,
        "draft_n_accepted": st.accepted,
        # EdgeSpec's (stats.Stats, one definition each)
        "acceptance": st.acceptance_rate,
        "alpha": st.alpha,
        "mean_accepted": st.mean_accepted,
        "tokens_per_call": st.tokens_per_call,
        "target_calls": st.target_calls,
        "ttft_ms": None if st.ttft_s is None else 1000 * st.ttft_s,
        "speedup_measured": reply.measured_speedup,
        "speedup_predicted": reply.predicted_speedup,
        "drafter": reply.drafter,
        "gamma": reply.gamma,
    }
    return {
        "text": reply.text,
        "tokens": list(reply.tokens),
        "sources": list(reply.sources),
        "drafters": list(reply.drafted_by),
        "finish": reply.finish_reason,
        "usage": {"prompt_tokens": st.prompt_tokens, "completion_tokens": st.generated,
                  "total_tokens": st.prompt_tokens + st.generated,
                  "prompt_tokens_details": {"cached_tokens": st.prompt_reused}},
        "timings": timings,
        "framing": reply.framing,
    }


# ----------------------------------------------------------------------------- the server
class Server:
    """The served model(s) and the request defaults from the command line."""

    def __init__(self, slot: ModelSlot, defaults: Any, api_key: str | None, draft_spec: str) -> None:
        self.slot = slot
        self.defaults = defaults  # a session.Request built from the command line
        self.api_key = api_key
        self.draft_spec = draft_spec

    def slot_for(self, model: str | None) -> ModelSlot:
        if model is None or model == "" or model in self.slot.aliases:
            return self.slot
        raise ApiError(404, f"the model {model!r} does not exist here; this server serves {self.slot.id!r} "
                       "(GET /v1/models)", "model_not_found", "model")

    def request(self, body: Any, kind: str) -> tuple[Any, bool]:
        """A session.Request from a validated body and the server's defaults; (request, max_tokens given)."""
        from edgespec.session import Request

        _unsupported(body)
        d = self.defaults
        draft = d.draft
        if body.draft is not None:
            if body.draft not in ("none", self.draft_spec):
                raise ApiError(400, f"draft must be 'none' or this server's drafter {self.draft_spec!r}, got "
                               f"{body.draft!r}", param="draft")
            draft = body.draft
        stops = d.stop
        if body.stop is not None:
            stops = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop)
            if len(stops) > MAX_STOPS:
                raise ApiError(400, f"at most {MAX_STOPS} stop sequences", param="stop")
            if any(not s for s in stops):
                raise ApiError(400, "stop sequences must not be empty", param="stop")
        max_tokens = body.max_completion_tokens or body.max_tokens
        s = d.sampling
        try:
            sampling = SamplingParams(
                s.temperature if body.temperature is None else body.temperature,
                s.top_k if body.top_k is None else body.top_k,
                s.top_p if body.top_p is None else body.top_p,
                s.min_p if body.min_p is None else body.min_p,
                s.seed if body.seed is None else body.seed,
            )
            common = dict(draft=draft, gamma=d.gamma if body.gamma is None else str(body.gamma),
                          max_tokens=max_tokens or d.max_tokens, sampling=sampling, stop=stops,
                          reuse_prefix=d.reuse_prefix and body.cache_prompt, stop_at_eog=not body.ignore_eos,
                          ngram=d.ngram, verifier=d.verifier)
            if kind == "completion":
                if body.echo or body.suffix or (body.best_of or 1) > 1:
                    raise ApiError(400, "echo, suffix and best_of are not supported", param="echo")
                prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
                if len(prompts) != 1:
                    raise ApiError(400, "give one prompt per request (a string)", param="prompt")
                return Request(text=prompts[0], framing="raw", **common), max_tokens is not None
            if body.tools:
                raise ApiError(400, "tools are not supported", param="tools")
            system_parts, messages = [], []
            for i, m in enumerate(body.messages):
                text = _text(m.content, f"messages.{i}")
                if m.role in ("system", "developer"):
                    if messages:
                        raise ApiError(400, f"messages.{i}: system messages must come before the conversation",
                                       param=f"messages.{i}.role")
                    system_parts.append(text)
                elif m.role in ("user", "assistant"):
                    messages.append({"role": m.role, "content": text})
                else:
                    raise ApiError(400, f"messages.{i}: role {m.role!r} is not supported (system, user, assistant)",
                                   param=f"messages.{i}.role")
            if not messages:
                raise ApiError(400, "messages: the conversation has no user message", param="messages")
            framing = d.framing if d.framing in ("auto", "chat", "transcript") else "auto"
            system = "\n\n".join(system_parts) if system_parts else d.system
            return Request(messages=messages, system=system, framing=framing, **common), max_tokens is not None
        except EdgeSpecError as exc:
            raise ApiError(400, _one_line(exc)) from None


def create_app(server: Server, ui: Any = None):  # noqa: ANN201 - a FastAPI app
    """The FastAPI app for `server`; `ui` (a gradio Blocks) is mounted under /ui."""
    # (handlers are annotated with module-level names: FastAPI resolves the string annotations
    # that `from __future__ import annotations` makes in the module's globals)
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import RedirectResponse, StreamingResponse
    from starlette.exceptions import HTTPException

    app = FastAPI(title="EdgeSpec", docs_url=None, redoc_url=None, openapi_url=None)
    slot = server.slot

    def error_response(err: ApiError) -> JSONResponse:
        headers = {"Retry-After": "1"} if err.status in (429, 503) else None
        if err.status == 401:
            headers = {"WWW-Authenticate": "Bearer"}
        return JSONResponse(err.body(), status_code=err.status, headers=headers)

    @app.exception_handler(ApiError)
    async def _api_error(request: HTTPRequest, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(HTTPException)
    async def _http_error(request: HTTPRequest, exc: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        msg = f"{request.method} {request.url.path}: {exc.detail}"
        return error_response(ApiError(exc.status_code, msg, code))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: HTTPRequest, exc: RequestValidationError) -> JSONResponse:
        return error_response(ApiError(400, _one_line(exc)))

    @app.exception_handler(Exception)
    async def _internal(request: HTTPRequest, exc: Exception) -> JSONResponse:
        print(f"edgespec server: internal error: {type(exc).__name__}: {_one_line(exc)}", file=sys.stderr)
        return error_response(ApiError(500, f"internal error: {type(exc).__name__}: {_one_line(exc)}",
                                       "internal_error", kind="server_error"))

    def check_key(request: HTTPRequest) -> None:
        if server.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise ApiError(401, "missing API key: send the header 'Authorization: Bearer KEY'", "invalid_api_key",
                           kind="authentication_error")
        if not hmac.compare_digest(token.strip().encode(), server.api_key.encode()):
            raise ApiError(401, "incorrect API key", "invalid_api_key", kind="authentication_error")

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": slot.id, "busy": slot.running, "queued": slot.waiting,
                "queue_limit": slot.queue_size, "generations": slot.generations, "stopped": slot.stopped}

    @app.get("/")
    async def root() -> Any:
        if ui is not None:
            return RedirectResponse("/ui/")
        return {"name": "EdgeSpec", "api": "/v1", "models": [slot.id], "health": "/health"}

    def model_card() -> dict:
        return {"id": slot.id, "object": "model", "created": slot.created, "owned_by": "edgespec",
                "meta": {"n_ctx": slot.n_ctx or None, "draft": server.draft_spec}}

    @app.get("/v1/models")
    async def models(request: HTTPRequest) -> dict:
        check_key(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: HTTPRequest) -> dict:
        check_key(request)
        server.slot_for(model_id)
        return model_card()

    async def next_message(job: Job, request: HTTPRequest) -> tuple[str, Any]:
        """The worker's next message, giving up (and stopping the job) if the client leaves."""
        while True:
            try:
                return await asyncio.wait_for(job.out.get(), POLL_S)
            except TimeoutError:
                if await request.is_disconnected():
                    job.stop.set()
                    raise ApiError(499, "client closed the request") from None

    def shutting_down() -> ApiError:
        return ApiError(503, "the server is shutting down", "server_shutting_down", kind="server_error")

    async def handle(request: HTTPRequest, kind: Literal["chat", "completion"]) -> Any:
        check_key(request)
        body = _parse(await request.body(), kind)
        target = server.slot_for(body.model)
        req, given = server.request(body, kind)
        job = Job(req, given, asyncio.get_running_loop())
        try:
            target.submit(job)
        except Busy:
            raise ApiError(429, f"the server is busy: one generation is running and {target.queue_size} are waiting "
                           "(the queue is full); retry shortly", "queue_full", kind="rate_limit_error") from None
        except Closing:
            raise shutting_down() from None
        try:
            what, payload = await next_message(job, request)
            if what == "error":
                raise payload
            if what == "done":  # stopped before it started
                raise shutting_down() if target.closing else ApiError(499, "client closed the request")
        except BaseException:
            job.stop.set()
            raise
        rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        if body.stream:
            usage = bool((body.stream_options or {}).get("include_usage"))
            return StreamingResponse(stream(job, kind, rid, created, usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        while True:
            what, payload = await next_message(job, request)
            if what == "error":
                raise payload
            if what == "done":
                break
        if payload is None:
            raise ApiError(499, "client closed the request")
        return complete(payload, kind, rid, created)

    def complete(s: dict, kind: str, rid: str, created: int) -> dict:
        finish = FINISH.get(s["finish"], "stop")
        prov = {"tokens": s["tokens"], "sources": s["sources"], "drafters": s["drafters"],
                "finish_reason": s["finish"], "framing": s["framing"]}
        if kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": s["text"]}, "logprobs": None,
                      "finish_reason": finish}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": s["text"], "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        return {"id": rid, "object": obj, "created": created, "model": slot.id, "system_fingerprint": "edgespec",
                "choices": [choice], "usage": s["usage"], "timings": s["timings"], "edgespec": prov}

    def sse(obj: dict | str) -> str:
        return f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n"

    async def stream(job: Job, kind: str, rid: str, created: int, include_usage: bool) -> AsyncIterator[str]:
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"

        def chunk(text: str | None, finish: str | None, extra: dict | None = None, role: bool = False) -> dict:
            if kind == "chat":
                delta: dict = {"role": "assistant"} if role else {}
                if text is not None:
                    delta["content"] = text
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            out = {"id": rid, "object": obj, "created": created, "model": slot.id, "system_fingerprint": "edgespec",
                   "choices": [choice]}
            if extra:
                out.update(extra)
            return out

        try:
            if kind == "chat":
                yield sse(chunk("", None, role=True))
            while True:
                what, payload = await job.out.get()
                if what == "delta":
                    yield sse(chunk("".join(payload["pieces"]), None, {"edgespec": payload}))
                elif what == "error":
                    yield sse(payload.body())
                    break
                elif what == "done":
                    if payload is not None:
                        yield sse(chunk(None if kind == "chat" else "", FINISH.get(payload["finish"], "stop"),
                                        {"timings": payload["timings"],
                                         "edgespec": {"finish_reason": payload["finish"], "framing": payload["framing"],
                                                      "tokens": [], "pieces": [], "sources": [], "drafters": []}}))
                        if include_usage:
                            yield sse({"id": rid, "object": obj, "created": created, "model": slot.id,
                                       "system_fingerprint": "edgespec", "choices": [], "usage": payload["usage"]})
                    break
            yield sse("[DONE]")
        finally:
            job.stop.set()  # a client that went away mid-stream frees the model at the next step

    @app.post("/v1/chat/completions")
    async def chat_completions(request: HTTPRequest) -> Any:
        return await handle(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: HTTPRequest) -> Any:
        return await handle(request, "completion")

    if ui is not None:
        import gradio as gr

        from edgespec.ui.render import CSS

        auth = None if server.api_key is None else key_auth(server.api_key)
        app = gr.mount_gradio_app(app, ui, path="/ui", css=CSS, theme=gr.themes.Soft(), auth=auth,
                                  auth_message="The password is the server's API key." if auth else None)
    return app


# ----------------------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="python app.py serve",
                description="EdgeSpec's OpenAI-compatible server (/v1/chat/completions, /v1/completions, /v1/models, "
                "/health). Generation options below are the defaults of requests that do not set them.")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; any other "
                    "address needs --api-key)")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    ap.add_argument("--api-key", default=os.environ.get("EDGESPEC_API_KEY") or None,
                    help="require 'Authorization: Bearer KEY' on /v1 requests (default: $EDGESPEC_API_KEY)")
    ap.add_argument("--queue", type=int, default=DEFAULT_QUEUE,
                    help=f"requests that may wait while one generates; more get 429 (default {DEFAULT_QUEUE})")
    ap.add_argument("--ui", action="store_true", help="also serve the web UI under /ui (same model, same process)")
    ap.add_argument("--model-id", default=None, help="the model's id in the API (default: the --target name)")
    add_generation_args(ap)
    return ap


def load(args: argparse.Namespace) -> tuple[Server, Any]:
    """Load the target (and drafter, and its cost profile) and build the Server and its pool."""
    from edgespec import drafters
    from edgespec.session import Request, runtime_options
    from edgespec.pool import ModelPool
    from models import DEFAULT_TARGET, resolve

    if args.queue < 0:
        raise EdgeSpecError(f"--queue must be >= 0, got {args.queue}")
    target = args.target or DEFAULT_TARGET
    defaults = Request.from_args(args, "(server defaults)")
    drafters.split_spec(args.draft)
    path = resolve(target)  # downloads a catalog/hf: model once, before the server starts
    pool = ModelPool(runtime_options(args), per_key=1, max_slots=2)
    key = pool.key(str(path))
    with pool.lease(key) as session:
        # draft model, cost profile and llama.cpp's buffers now, not in the first request; raw text,
        # so that a model whose chat template fails still serves /v1/completions
        warm = replace(defaults, text="Hello", framing="raw", system=None, max_tokens=1, stop=())
        session.run(warm)
    slot = ModelSlot(args.model_id or target, key, pool, args.queue,
                     aliases=(target, Path(path).name, Path(path).stem, str(path)))
    return Server(slot, defaults, args.api_key, args.draft), pool


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    if args.model_id is not None and not args.model_id.strip():
        raise EdgeSpecError("--model-id is empty; give the name clients send as 'model', or leave it out to use "
                            "the --target name")
    check_exposure(args.host, args.api_key)
    check_address(args.host, args.port)
    server, pool = load(args)
    ui = None
    if args.ui:
        from edgespec.session import parse_ngram
        from edgespec.ui import build_app
        from edgespec.ui.context import Defaults

        ui = build_app(pool.opts, Defaults(
            target=server.slot.key, draft=args.draft, gamma=str(args.gamma), ngram=parse_ngram(args.ngram),
            max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            min_p=args.min_p, seed=args.seed, system=args.system or Defaults.system), pool)
    app = create_app(server, ui)
    import uvicorn

    where = f"http://{args.host}:{args.port}"
    print(f"EdgeSpec server on {where}/v1 (model {server.slot.id!r}, draft {args.draft}, queue {server.slot.queue_size}"
          f"{', API key required' if args.api_key else ''}){f'; UI at {where}/ui' if ui is not None else ''}",
          file=sys.stderr, flush=True)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=2)
    try:
        interrupted = run_until_signalled(config, server.slot)
    finally:
        server.slot.close()
        pool.close()
    if interrupted:
        raise KeyboardInterrupt  # run_command: "interrupted", exit status 130
    return 0


def run_until_signalled(config: Any, slot: ModelSlot) -> bool:
    """Serve until SIGINT or SIGTERM, then end cleanly: every running and waiting generation is
    stopped (it ends at its next step), so open streams send their final chunk and [DONE] within
    uvicorn's graceful shutdown instead of being cancelled mid-response. True if SIGINT ended it."""
    import uvicorn

    class Uvicorn(uvicorn.Server):
        interrupted = False

        def handle_exit(self, sig: int, frame: Any) -> None:
            # a signal handler: only flags here; the jobs are stopped from the event loop, in shutdown()
            self.interrupted = self.interrupted or sig == signal.SIGINT
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            slot.stop_all()
            await super().shutdown(sockets)

    userver = Uvicorn(config)
    userver.run()
    return userver.interrupted
