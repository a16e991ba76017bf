"""`python app.py serve`: the command line, loading the model before the server starts, and
serving until a signal, after which every open stream ends with its final chunk and [DONE]."""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from edgespec.apps.args import (
    Parser,
    add_generation_args,
    api_keys,
    check_address,
    check_exposure,
    request_from_args,
    runtime_options,
    url_host,
)
from edgespec.apps.server.http import Server, create_app
from edgespec.apps.server.worker import ModelSlot
from edgespec.runtime import env
from edgespec.runtime.errors import EdgeSpecError
from edgespec.service.pool import ModelPool

if TYPE_CHECKING:
    import uvicorn

DEFAULT_PORT = 8000
DEFAULT_QUEUE = 8


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="python app.py serve",
                description="EdgeSpec's OpenAI-compatible server (/v1/chat/completions, /v1/completions, /v1/models, "
                "/health). Generation options below are the defaults of requests that do not set them.")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; any other "
                    "address needs --api-key)")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    ap.add_argument("--api-key", default=env.text("EDGESPEC_API_KEY"),
                    help="require 'Authorization: Bearer KEY' on /v1 requests (default: $EDGESPEC_API_KEY)")
    ap.add_argument("--queue", type=int, default=DEFAULT_QUEUE,
                    help=f"requests that may wait while one generates; more get 429 (default {DEFAULT_QUEUE})")
    ap.add_argument("--ui", action="store_true", help="also serve the web UI under /ui (same model, same process)")
    ap.add_argument("--model-id", default=None, help="the model's id in the API (default: the --target name)")
    ap.add_argument("--answers", choices=["key", "shared"], default="key",
                    help="earlier answers the suffix drafter learns from: kept per API key the client sends (default), "
                    "or shared by every client (a single-user desktop)")
    ap.add_argument("--answers-tokens", type=int, default=None, metavar="N",
                    help="earlier answers kept in memory, in tokens, for each key (a key's oldest go first, never "
                    "another key's; default 131072, about 16 MB; 0 keeps none)")
    ap.add_argument("--answers-persist", action="store_true",
                    help="keep earlier answers between runs under $EDGESPEC_CACHE/answers (one file per model and key, "
                    "at most twice --answers-tokens each)")
    add_generation_args(ap)
    return ap


def load(args: argparse.Namespace) -> tuple[Server, ModelPool]:
    """Load the target (and drafter, and its cost profile) and build the Server and its pool."""
    from edgespec.core import drafters
    from edgespec.models import DEFAULT_TARGET, resolve

    if args.queue < 0:
        raise EdgeSpecError(f"--queue must be >= 0, got {args.queue}")
    from edgespec.core.drafters.answer_store import DEFAULT_CACHES, DEFAULT_CAP, STORE
    from edgespec.service.answer_files import AnswerFiles, default_folder

    cap = DEFAULT_CAP if args.answers_tokens is None else args.answers_tokens
    if cap < 0:
        raise EdgeSpecError(f"--answers-tokens must be >= 0, got {cap}")
    # every key's cache stays in memory (a key's answers are never dropped for another key's)
    STORE.configure(cap, AnswerFiles(default_folder()) if args.answers_persist else None,
                    max(DEFAULT_CACHES, len(api_keys(args.api_key)) + 1))
    target = args.target or DEFAULT_TARGET
    defaults = request_from_args(args, "(server defaults)")
    drafters.split_spec(args.draft)
    path = resolve(target)  # downloads a catalog/hf: model once, before the server starts
    pool = ModelPool(runtime_options(args), per_key=1, max_slots=2)
    key = pool.key(str(path))
    with pool.lease(key) as session:
        # draft model, cost profile and llama.cpp's buffers now, not in the first request; raw text,
        # so that a model whose chat template fails still serves /v1/completions
        warm = replace(defaults, text="Hello", framing="raw", system=None, max_tokens=1, stop=())
        session.run(warm)
        n_ctx = session.target.n_ctx
    slot = ModelSlot(args.model_id or target, key, pool, args.queue,
                     aliases=(target, Path(path).name, Path(path).stem, str(path)), n_ctx=n_ctx)
    return Server(slot, defaults, args.api_key, args.draft, shared_answers=args.answers == "shared"), pool


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
        from edgespec.apps.ui import build_app
        from edgespec.apps.ui.app import defaults_from_args

        ui = build_app(pool.opts, defaults_from_args(args, server.slot.key), pool)
    app = create_app(server, ui)
    import uvicorn

    where = f"http://{url_host(args.host)}:{args.port}"
    print(f"EdgeSpec server on {where}/v1 (model {server.slot.id!r}, draft {args.draft}, queue {server.slot.queue_size}"
          f"{', API key required' if args.api_key else ''}){f'; UI at {where}/ui' if ui is not None else ''}",
          file=sys.stderr, flush=True)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=2)
    with signals_restored():
        try:
            ended_by = run_until_signalled(config, server.slot)
        finally:
            server.slot.close()
            pool.close()
    if ended_by == signal.SIGINT:
        raise KeyboardInterrupt  # run_command: "interrupted", exit status 130
    if ended_by is not None:
        signal.raise_signal(ended_by)  # SIGTERM: end as its handler says (killed by it, by default)
    return 0


def run_until_signalled(config: uvicorn.Config, slot: ModelSlot) -> int | None:
    """Serve until SIGINT or SIGTERM, then end cleanly: every running and waiting generation is
    stopped (it ends at its next step), so open streams send their final chunk and [DONE] within
    uvicorn's graceful shutdown instead of being cancelled mid-response. Returns the signal that
    ended it (SIGINT if there was one), None if none did.

    The signal handler stays in place after uvicorn returns, until `signals_restored` ends, once
    the models are freed, and a second Ctrl-C while shutting down is taken as the first: uvicorn
    would re-raise the captured signals, or Python's handler raise KeyboardInterrupt, inside the
    event loop's teardown, and its force_exit cancels the app's lifespan (tracebacks all three)."""
    import uvicorn

    class Uvicorn(uvicorn.Server):
        ended_by: int | None = None

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(sig, self.handle_exit)
            yield

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # a signal handler: only flags here; the jobs are stopped from the event loop, in shutdown()
            self.ended_by = signal.SIGINT if sig == signal.SIGINT else self.ended_by or sig
            if not self.should_exit:  # a second signal changes nothing: uvicorn's force_exit would skip
                super().handle_exit(sig, frame)  # the app's lifespan shutdown (a CancelledError traceback);
            # the shutdown is short anyway: the jobs stop at their next step, within timeout_graceful_shutdown

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            slot.stop_all()
            await super().shutdown(sockets)

    userver = Uvicorn(config)
    userver.run()
    return userver.ended_by


@contextlib.contextmanager
def signals_restored() -> Iterator[None]:
    """The SIGINT and SIGTERM handlers as they were before the block, once it ends."""
    main = threading.current_thread() is threading.main_thread()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
