"""The FastAPI app: routes, the API key, errors in the OpenAI shape, and the two ways a generation
is answered (one JSON object, or server-sent events as the worker releases tokens). A handler puts
a `Job` on the model's queue and waits on it; a client that leaves stops the job.

Handlers are module-level functions that find the `Server` on `request.app.state`; their
annotations are module-level names, since FastAPI resolves the string annotations that
`from __future__ import annotations` makes in the module's globals."""

from __future__ import annotations

import asyncio
import hmac
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, StreamingResponse
from starlette.exceptions import HTTPException

from edgespec.apps.args import api_keys, key_auth, key_owner
from edgespec.apps.server import responses
from edgespec.apps.server.protocol import (
    ApiError,
    ChatBody,
    Chunks,
    CompletionBody,
    Envelope,
    Kind,
    load_body,
    log_summary,
    parse,
    sse,
    to_request,
)
from edgespec.apps.server.worker import Busy, Closing, Job, Message, ModelSlot
from edgespec.runtime.errors import one_line
from edgespec.service.session import Request

if TYPE_CHECKING:
    import gradio as gr

POLL_S = 0.25  # how often a waiting handler checks that its client is still there


class Server:
    """The served model(s) and the request defaults from the command line. `api_key` is one key or
    several separated by commas; with `shared_answers` every client's requests draft from one cache
    of earlier answers (a single-user desktop), else each API key has its own (`owner`)."""

    def __init__(self, slot: ModelSlot, defaults: Request, api_key: str | None, draft_spec: str,
                 shared_answers: bool = False) -> None:
        self.slot = slot
        self.defaults = defaults  # a session.Request built from the command line
        self.api_key = api_key
        self.keys = api_keys(api_key)
        self.draft_spec = draft_spec
        self.shared_answers = shared_answers

    def slot_for(self, model: str | None) -> ModelSlot:
        if model is None or model == "" or model in self.slot.aliases:
            return self.slot
        raise ApiError(404, f"the model {model!r} does not exist here; this server serves {self.slot.id!r} "
                       "(GET /v1/models)", "model_not_found", "model")

    def request(self, body: ChatBody | CompletionBody) -> tuple[Request, bool]:
        """A session.Request from a validated body and the server's defaults; (request, max_tokens given)."""
        return to_request(body, self.defaults, self.draft_spec)

    def check_key(self, request: HTTPRequest) -> None:
        if not self.keys:
            return
        token = _bearer(request)
        if not token:
            raise ApiError(401, "missing API key: send the header 'Authorization: Bearer KEY'", "invalid_api_key",
                           kind="authentication_error")
        if not any(hmac.compare_digest(token, k.encode()) for k in self.keys):
            raise ApiError(401, "incorrect API key", "invalid_api_key", kind="authentication_error")

    def owner(self, request: HTTPRequest) -> str:
        """Whose earlier answers the request's drafter uses (Request.owner): a digest of the bearer
        token the client sent (checked or not; the key itself is never kept), '' without one or
        when the answers are shared."""
        token = b"" if self.shared_answers else _bearer(request)
        return key_owner(token) if token else ""

    def model_card(self) -> dict:
        slot = self.slot
        return {"id": slot.id, "object": "model", "created": slot.created, "owned_by": "edgespec",
                "meta": {"n_ctx": slot.n_ctx or None, "draft": self.draft_spec}}


def create_app(server: Server, ui: gr.Blocks | None = None) -> FastAPI:
    """The FastAPI app for `server`; `ui` (a gradio Blocks) is mounted under /ui."""
    app = FastAPI(title="EdgeSpec", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    app.state.has_ui = ui is not None
    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(Exception, on_internal_error)
    app.add_api_route("/health", health, methods=["GET", "HEAD"])  # uptime checkers send HEAD
    app.add_api_route("/", root, methods=["GET"])
    app.add_api_route("/v1/models", list_models, methods=["GET"])
    app.add_api_route("/v1/models/{model_id:path}", get_model, methods=["GET"])
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    app.add_api_route("/v1/responses", responses_api, methods=["POST"])
    if ui is not None:
        import gradio as gr

        from edgespec.apps.ui.render import CSS

        auth = None if server.api_key is None else key_auth(server.api_key, server.shared_answers)
        ui.edgespec.login = auth  # a logged-in user's requests are its key's, as the API's are
        app = gr.mount_gradio_app(app, ui, path="/ui", css=CSS, theme=gr.themes.Soft(), auth=auth,
                                  auth_message="The password is the server's API key." if auth else None)
    return app


def _server(request: HTTPRequest) -> Server:
    return request.app.state.server


def _bearer(request: HTTPRequest) -> bytes:
    """The token of an 'Authorization: Bearer TOKEN' header as the client sent its bytes, b"" without
    one. Starlette decodes headers as Latin-1, so encoding back gives the bytes; a key is compared
    as its UTF-8 bytes, which is what curl sends for a key with non-ASCII characters."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip().encode("latin-1") if scheme.lower() == "bearer" else b""


# ----------------------------------------------------------------------------- errors
def error_response(err: ApiError) -> JSONResponse:
    headers = {"Retry-After": "1"} if err.status in (429, 503) else None
    if err.status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


async def on_api_error(request: HTTPRequest, exc: ApiError) -> JSONResponse:
    return error_response(exc)


async def on_http_error(request: HTTPRequest, exc: HTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    msg = f"{request.method} {request.url.path}: {exc.detail}"
    return error_response(ApiError(exc.status_code, msg, code))


async def on_validation_error(request: HTTPRequest, exc: RequestValidationError) -> JSONResponse:
    return error_response(ApiError(400, one_line(exc)))


async def on_internal_error(request: HTTPRequest, exc: Exception) -> JSONResponse:
    msg = one_line(exc, typed=True)
    print(f"edgespec server: internal error: {msg}", file=sys.stderr)
    return error_response(ApiError(500, f"internal error: {msg}", "internal_error", kind="server_error"))


def shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down", "server_shutting_down", kind="server_error")


# ----------------------------------------------------------------------------- routes
async def health(request: HTTPRequest) -> dict:
    slot = _server(request).slot
    return {"status": "ok", "model": slot.id, "busy": slot.running, "queued": slot.waiting,
            "queue_limit": slot.queue_size, "generations": slot.generations, "stopped": slot.stopped}


async def root(request: HTTPRequest) -> Any:
    if request.app.state.has_ui:
        return RedirectResponse("/ui/")
    return {"name": "EdgeSpec", "api": "/v1", "models": [_server(request).slot.id], "health": "/health"}


async def list_models(request: HTTPRequest) -> dict:
    server = _server(request)
    server.check_key(request)
    return {"object": "list", "data": [server.model_card()]}


async def get_model(model_id: str, request: HTTPRequest) -> dict:
    server = _server(request)
    server.check_key(request)
    server.slot_for(model_id)
    return server.model_card()


async def chat_completions(request: HTTPRequest) -> Any:
    return await generate(request, "chat")


async def completions(request: HTTPRequest) -> Any:
    return await generate(request, "completion")


async def responses_api(request: HTTPRequest) -> Any:
    return await generate(request, "responses")


# ----------------------------------------------------------------------------- one generation
async def generate(request: HTTPRequest, kind: Kind | Literal["responses"]) -> Any:
    """A generation request, with its line in the server's log (stderr) once it is answered."""
    t0 = time.perf_counter()
    client = request.client.host if request.client else "-"

    def log(what: str) -> None:
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {client} {kind}: {what}, {time.perf_counter() - t0:.2f} s",
              file=sys.stderr, flush=True)

    try:
        return await _generate(request, kind, lambda s: log(log_summary(s)))
    except ApiError as err:
        log(f"{err.status} {err.message}")
        raise


async def _generate(request: HTTPRequest, kind: Kind | Literal["responses"], log: Callable[[dict], None]) -> Any:
    """Validate, queue, wait for the worker to start (so a refusal is an HTTP error, not a broken
    stream), then stream the tokens or wait for the whole reply; `log` gets the summary. A Responses
    request runs as the chat request it means (responses.to_chat) and is answered in its own shape."""
    server = _server(request)
    server.check_key(request)
    raw, encoding = await request.body(), request.headers.get("content-encoding", "")
    if kind == "responses":
        rbody, body = responses.to_chat(load_body(raw, encoding))
    else:
        body = parse(raw, kind, encoding)
    slot = server.slot_for(body.model)
    req, given = server.request(body)
    job = Job(replace(req, owner=server.owner(request)), given, asyncio.get_running_loop())
    submit(slot, job)
    try:
        await started(job, slot, request)
    except BaseException:
        job.stop.set()
        raise
    env = Envelope.new("chat" if kind == "responses" else kind, server.slot.id, tools=req.call_names())
    shaper = responses.Shaper(rbody, body, env) if kind == "responses" else None
    if body.stream:
        usage = bool((body.stream_options or {}).get("include_usage"))
        events = stream(job, env, usage, log) if shaper is None else response_events(job, shaper, log)
        return StreamingResponse(events, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    s = await finished(job, request)
    log(s)
    return env.completion(s) if shaper is None else shaper.response(s)


def submit(slot: ModelSlot, job: Job) -> None:
    try:
        slot.submit(job)
    except Busy:
        raise ApiError(429, f"the server is busy: one generation is running and {slot.queue_size} are waiting "
                       "(the queue is full); retry shortly", "queue_full", kind="rate_limit_error") from None
    except Closing:
        raise shutting_down() from None


async def next_message(job: Job, request: HTTPRequest) -> Message:
    """The worker's next message, giving up (and stopping the job) if the client leaves."""
    while True:
        try:
            return await asyncio.wait_for(job.out.get(), POLL_S)
        except TimeoutError:
            if await request.is_disconnected():
                job.stop.set()
                raise ApiError(499, "client closed the request") from None


async def started(job: Job, slot: ModelSlot, request: HTTPRequest) -> None:
    """Wait until the worker starts `job`: its error if it refuses it, 503/499 if it never runs."""
    what, payload = await next_message(job, request)
    if what == "error":
        raise payload
    if what == "done":  # stopped before it started
        raise shutting_down() if slot.closing else ApiError(499, "client closed the request")


async def finished(job: Job, request: HTTPRequest) -> dict:
    """The summary of a started job, once it is done."""
    while True:
        what, payload = await next_message(job, request)
        if what == "error":
            raise payload
        if what == "done":
            break
    if payload is None:
        raise ApiError(499, "client closed the request")
    return payload


async def stream(job: Job, env: Envelope, include_usage: bool, log: Callable[[dict], None]) -> AsyncIterator[str]:
    """A started job as server-sent events: a chunk per step's tokens (`Chunks`), the final chunk, [DONE]."""
    chunks = Chunks(env)
    try:
        if env.kind == "chat":
            yield sse(env.chunk("", None, role=True))
        while True:
            what, payload = await job.out.get()
            if what == "delta":
                for chunk in chunks.delta(payload):
                    yield sse(chunk)
            elif what == "error":
                yield sse(payload.body())
                break
            elif what == "done":
                if payload is not None:
                    log(payload)
                    for chunk in chunks.final(payload):
                        yield sse(chunk)
                    if include_usage:
                        yield sse(env.usage_chunk(payload))
                break
        yield sse("[DONE]")
    finally:
        job.stop.set()  # a client that went away mid-stream frees the model at the next step


async def response_events(job: Job, shaper: responses.Shaper, log: Callable[[dict], None]) -> AsyncIterator[str]:
    """A started job as the Responses API's typed events (responses.StreamState); no [DONE] line, as
    OpenAI's Responses streams end at response.completed."""
    state = shaper.stream()
    try:
        for event in state.start():
            yield event
        while True:
            what, payload = await job.out.get()
            if what == "delta":
                for event in state.delta(payload):
                    yield event
            elif what == "error":
                for event in state.error(payload):
                    yield event
                break
            elif what == "done":
                if payload is not None:
                    log(payload)
                    for event in state.final(payload):
                        yield event
                break
    finally:
        job.stop.set()
