"""The Gradio app: Chat, Race, Models and Bench tabs over one shared pool of loaded models."""

import argparse
import time

import gradio as gr

from edgespec.apps.args import KeyLogin
from edgespec.apps.ui.bench_tab import bench_tab
from edgespec.apps.ui.chat import build_chat_tab
from edgespec.apps.ui.context import AppContext, Defaults
from edgespec.apps.ui.models_panel import build_models_tab
from edgespec.apps.ui.race import build_race_tab
from edgespec.apps.ui.render import CSS
from edgespec.core import drafters
from edgespec.models.loader import RuntimeOptions
from edgespec.runtime import env
from edgespec.service.pool import ModelPool

TITLE = "EdgeSpec: speculative generation on this machine"


def build_app(opts: RuntimeOptions | None = None, defaults: Defaults | None = None,
              pool: ModelPool | None = None) -> gr.Blocks:
    """Build (not launch) the app. Start it with `start()` so the CSS that colours tokens is served."""
    pool = pool or ModelPool(opts or RuntimeOptions())
    ctx = AppContext(pool, defaults or Defaults())
    # a local app sends nothing home: no Gradio telemetry or version check
    with gr.Blocks(title="EdgeSpec", analytics_enabled=False) as app:
        gr.Markdown(f"## {TITLE}")
        with gr.Tab("Chat"):
            chat_area = gr.Column()
        with gr.Tab("Race"):
            build_race_tab(ctx)
        with gr.Tab("Models"):
            target, draft = build_models_tab(ctx)
        with gr.Tab("Bench"):
            bench_tab(ctx)
        with chat_area:
            build_chat_tab(ctx, target, draft)

        def forget(request: gr.Request) -> None:
            ctx.forget(request.session_hash or "")

        app.unload(forget)
    app.edgespec = ctx  # tests and launch() reach the pool through the app
    return app


def start(app: gr.Blocks, host: str = "127.0.0.1", port: int | None = None, block: bool = True,
          auth: KeyLogin | None = None) -> str:
    """Launch `app` with the EdgeSpec theme and CSS; returns the local URL. With block=False the
    server runs on a background thread (close it with app.close()); with block=True this waits
    until the server stops, and Ctrl-C closes it and raises KeyboardInterrupt (exit status 130
    through run_command; Gradio's own wait would swallow it and exit 0)."""
    app.edgespec.login = auth  # a logged-in user's requests are its key's, as the API's are
    _, url, _ = app.launch(
        server_name=host, server_port=port, prevent_thread_lock=True, css=CSS, theme=gr.themes.Soft(),
        quiet=not block, footer_links=["api"], auth=auth,
        auth_message="The password is the API key (--api-key or EDGESPEC_API_KEY)." if auth else None,
    )
    if block:
        try:
            while app.is_running:
                time.sleep(0.2)
        except KeyboardInterrupt:
            app.close(verbose=False)
            raise
    return url


def defaults_from_args(args: argparse.Namespace, target: str) -> Defaults:
    """The controls' initial values from a command line's generation options (`python app.py`, and
    `serve --ui`, which passes its loaded target), so the UI starts where the command line points."""
    from edgespec.service.session import parse_ngram

    return Defaults(
        target=target, draft=args.draft, gamma=str(args.gamma), ngram=parse_ngram(args.ngram),
        max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        min_p=args.min_p, seed=args.seed, system=args.system or Defaults.system,
    )


def launch(args: argparse.Namespace) -> int:
    """`python app.py`: open the UI at args.host:args.port with the command line's settings."""
    from edgespec.apps.args import check_exposure, key_auth, runtime_options
    from edgespec.models import DEFAULT_TARGET, resolve
    from edgespec.service.session import parse_gamma

    # the same rule as `serve`: beyond loopback only with a key (here the login password)
    key = args.api_key if args.api_key is not None else env.text("EDGESPEC_API_KEY")
    check_exposure(args.host, key)
    target = args.target or DEFAULT_TARGET
    resolve(target)  # a bad --target, --gamma or --draft fails here, as one line, before a server starts
    parse_gamma(args.gamma)
    drafters.split_spec(args.draft)
    app = build_app(runtime_options(args), defaults_from_args(args, target))
    start(app, args.host, args.port, block=True, auth=key_auth(key) if key else None)
    return 0
