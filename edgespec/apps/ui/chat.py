"""Chat tab: multi-turn chat with streamed, source-highlighted replies and a live stats panel.

A turn is one `Request` (the conversation so far, framing auto: the model's chat template, or
User:/Assistant: lines for a base model without one) run on a leased `Session`; the drafter
choices come from the drafter registry. The lease asks for the session this browser session used
last, whose KV cache still holds the conversation, so a turn prefills only itself (prefix reuse)."""

import html
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from types import SimpleNamespace
from typing import Any

import gradio as gr

from edgespec.apps.ui import render
from edgespec.apps.ui.context import AppContext, Defaults, default_kind, drafter_choices, drafter_help, drafter_spec
from edgespec.apps.ui.live import Tracker, stream
from edgespec.core.sampling import SamplingParams
from edgespec.runtime.errors import EdgeSpecError, one_line
from edgespec.service.session import Request
from edgespec.service.structured import json_schema_grammar

# How often a streaming reply refreshes the page. Generation shares the CPU with the browser that
# shows it: with the bubble, both plots and the reply data refreshed 10 times a second, the real
# 1.5B decoded at about half its terminal speed on a 2-core machine, most of it for redrawing the
# plots. The text refreshes 5 times a second, the plots once a second, and the reply data (in a
# closed accordion) once, at the end; each reaches its final state with the last update.
TEXT_EVERY_S = 0.2
PLOTS_EVERY_S = 1.0


def chat_messages(turns: list[dict], highlight: bool) -> list[dict[str, str]]:
    """Chatbot messages for the stored turns, each reply followed by its stats line."""
    msgs: list[dict[str, str]] = []
    for t in turns:
        msgs.append({"role": "user", "content": t["user"]})
        body = render.segments_html(t["segments"]) if highlight else t["reply"]
        sep = "" if highlight else "\n\n"
        stats = f'<div class="es-stats">{html.escape(t["stats"])}</div>' if t["stats"] else ""
        msgs.append({"role": "assistant", "content": body + sep + stats})
    return msgs


def conversation(turns: list[dict]) -> list[dict[str, str]]:
    """The conversation so far; the last turn's reply is the one to generate."""
    msgs: list[dict[str, str]] = []
    for t in turns[:-1]:
        msgs += [{"role": "user", "content": t["user"]}, {"role": "assistant", "content": t["reply"]}]
    msgs.append({"role": "user", "content": turns[-1]["user"]})
    return msgs


def details(tr: Tracker) -> dict[str, Any]:
    """The last reply as data: per-token [text, source] segments, token ids, stats, speedups and
    one point per target call (all read off the Reply)."""
    r = tr.reply
    return {
        "segments": [[p, s] for p, s in tr.segments],
        "tokens": list(tr.tokens),
        "prompt_tokens": r.stats.prompt_tokens if r is not None else 0,
        "finish_reason": tr.finish_reason,
        "framing": r.framing if r is not None else None,
        "drafter": r.drafter if r is not None else None,
        "gamma": r.gamma if r is not None else None,
        "stats": r.stats.to_dict() if r is not None else {},
        "speedup": {"predicted": r.predicted_speedup if r is not None else None,
                    "measured": r.measured_speedup if r is not None else None},
        "policy": json.loads(json.dumps(r.policy, default=str)) if r is not None else {},  # str keys for JSON
        "steps": [asdict(p) for p in tr.points],
        "stats_line": render.stats_line(tr),
        "error": tr.error,
    }


def build_chat_tab(ctx: AppContext, target: gr.Dropdown, draft_model: gr.Dropdown) -> None:
    """Chat components inside the current Tab; `target` and `draft_model` live in the Models tab."""
    d = ctx.defaults
    w = _components(d)
    send_fn, regen_fn, stop_fn, clear_fn = _handlers(ctx)
    settings = [w.system, w.kind, w.gamma, w.max_tokens, w.temperature, w.top_k, w.top_p, w.min_p, w.seed,
                w.highlight, target, draft_model, w.schema]
    outs = [w.chatbot, w.turns, w.reply_data, w.live, w.steps_plot, w.speed_plot, w.error]
    gen_opts = dict(concurrency_limit=8, concurrency_id="generate", show_progress="hidden")
    w.msg.submit(send_fn, [w.msg, w.turns, *settings], [w.msg, *outs], api_visibility="private", **gen_opts)
    w.send.click(send_fn, [w.msg, w.turns, *settings], [w.msg, *outs], api_name="chat", **gen_opts)
    w.regen.click(regen_fn, [w.turns, *settings], outs, api_name="regenerate", **gen_opts)
    w.stop.click(stop_fn, None, w.error, api_name="stop", concurrency_limit=None, queue=False)
    # Clear stops the running generation, which then ends on an empty conversation itself: its
    # last update may otherwise land after Clear's and bring the conversation back (Stop,
    # Regenerate, Clear within a second). Gradio's `cancels` would close it before that last word.
    w.clear.click(clear_fn, None, outs, api_name="clear", queue=False)
    w.highlight.change(chat_messages, [w.turns, w.highlight], w.chatbot, api_visibility="private", queue=False)
    target.change(lambda t: _target_line((t or d.target).strip()), target, w.target_line, api_visibility="private",
                  queue=False)


def _components(d: Defaults) -> SimpleNamespace:
    """The tab's components, laid out: the conversation on the left, sampling and drafting settings
    and the live stats on the right, the last reply as data below."""
    choices = drafter_choices()
    kind0 = default_kind(d.draft)
    w = SimpleNamespace(turns=gr.State([]))
    with gr.Row():
        with gr.Column(scale=3):
            w.target_line = gr.Markdown(_target_line(d.target), elem_id="es-chat-target")
            gr.HTML(render.LEGEND)
            w.highlight = gr.Checkbox(value=True, label="Highlight token sources (off: plain Markdown)")
            w.chatbot = gr.Chatbot(height=460, label="Chat", elem_id="es-chatbot", buttons=["copy"])
            w.error = gr.Markdown("", elem_classes="es-error", elem_id="es-chat-error")
            w.msg = gr.Textbox(placeholder="Message (Enter sends)", show_label=False, elem_id="es-msg")
            with gr.Row():
                w.send = gr.Button("Send", variant="primary", elem_id="es-send")
                w.stop = gr.Button("Stop", variant="stop", elem_id="es-stop")
                w.regen = gr.Button("Regenerate", elem_id="es-regen")
                w.clear = gr.Button("Clear", elem_id="es-clear")
            w.system = gr.Textbox(d.system, label="System prompt", lines=2)
        with gr.Column(scale=2):
            with gr.Accordion("Sampling and drafting", open=True):
                w.kind = gr.Radio(choices, value=kind0 if kind0 in [v for _, v in choices] else "none",
                                  label="Drafter", info=drafter_help(), elem_id="es-drafter")
                w.gamma = gr.Textbox(d.gamma, label="gamma (draft length): a number, or auto")
                w.max_tokens = gr.Slider(1, 4096, value=d.max_tokens, step=1, label="max tokens")
                w.temperature = gr.Slider(0.0, 2.0, value=d.temperature, step=0.05, label="temperature (0 = greedy)")
                w.top_k = gr.Number(d.top_k, precision=0, label="top-k (0 = off)")
                w.top_p = gr.Slider(0.01, 1.0, value=d.top_p, step=0.01, label="top-p")
                w.min_p = gr.Slider(0.0, 0.99, value=d.min_p, step=0.01, label="min-p")
                w.seed = gr.Number(-1 if d.seed is None else d.seed, precision=0, label="seed (-1 = random)")
            with gr.Accordion("Reply format (JSON schema)", open=False):
                w.schema = gr.Textbox("", lines=4, show_label=False, elem_id="es-schema",
                                      placeholder='Blank: free text. A JSON schema, e.g. {"type": "object", '
                                      '"properties": {"city": {"type": "string"}}, "required": ["city"]}, holds '
                                      "the reply to it; the tokens it forces are drafted for free (amber).")
            gr.Markdown("### Live stats")
            w.live = gr.Markdown("No steps yet.", elem_id="es-live")
            gr.HTML(render.plot_legend(render.STEP_COLORS))
            w.steps_plot = gr.LinePlot(
                None, x="step", y="value", color="series", color_map=render.STEP_COLORS, height=200,
                label="per target call", x_title="target call", y_title="", elem_id="es-steps-plot",
            )
            gr.HTML(render.plot_legend(render.SPEED_COLORS))
            w.speed_plot = gr.LinePlot(
                None, x="step", y="speedup", color="series", color_map=render.SPEED_COLORS, height=200,
                label="speedup vs plain decoding", x_title="target call", y_title="x", elem_id="es-speed-plot",
            )
    with gr.Accordion("Last reply as data (tokens and their sources)", open=False):
        w.reply_data = gr.JSON(label="segments [text, source] per token, stats")
    return w


def _request(
    turns_: list[dict], system_: str, kind_: str, gamma_: str, max_tokens_: float, temperature_: float,
    top_k_: float, top_p_: float, min_p_: float, seed_: float, draft_: str, ngram: tuple[int, int], owner: str = "",
    schema_: str = "",
) -> Request:
    """The Request for the last turn from the settings as the browser sent them (raises on bad ones:
    a reply format that is not JSON, or a schema the grammar engine cannot hold a reply to)."""
    sampling = SamplingParams(
        float(temperature_), int(top_k_ or 0), float(top_p_), float(min_p_),
        None if seed_ is None or int(seed_) < 0 else int(seed_),
    )
    return Request(
        messages=conversation(turns_),
        system=(system_ or "").strip() or None,
        draft=drafter_spec(kind_, draft_),
        gamma=(gamma_ or "auto").strip(),
        ngram=ngram,
        max_tokens=int(max_tokens_),
        sampling=sampling,
        owner=owner,
        grammar=_schema_grammar(schema_),
    )


def _schema_grammar(text: str | None) -> str | None:
    """The grammar of the Reply format box: None when blank, else its JSON schema's."""
    if not (text or "").strip():
        return None
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EdgeSpecError(f"the reply format is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    return json_schema_grammar(schema)


def _handlers(ctx: AppContext) -> tuple[Callable[..., Iterator[tuple]], Callable[..., Iterator[tuple]],
                                        Callable[[gr.Request], str], Callable[[gr.Request], tuple]]:
    """The Send, Regenerate, Stop and Clear handlers (Gradio passes each input in order, then the request)."""
    d = ctx.defaults

    def run(
        turns_: list[dict], system_: str, kind_: str, gamma_: str, max_tokens_: float,
        temperature_: float, top_k_: float, top_p_: float, min_p_: float, seed_: float,
        highlight_: bool, target_: str, draft_: str, schema_: str, request: gr.Request,
    ) -> Iterator[tuple]:
        session = request.session_hash or ""
        cleared_before = ctx.clears(session, "chat")
        turn = turns_[-1]
        tr = Tracker()
        try:
            req = _request(turns_, system_, kind_, gamma_, max_tokens_, temperature_, top_k_, top_p_, min_p_, seed_,
                           draft_, d.ngram, ctx.owner(request.username), schema_)
        except (EdgeSpecError, TypeError, ValueError) as exc:
            tr.error = one_line(exc, typed=True)
            turns_.pop()
            yield _outputs(turns_, tr, highlight_)
            return
        target = (target_ or d.target).strip()
        stop_ev = ctx.new_stop(session, "chat")
        # the browser session's own model session when idle: its KV cache holds this conversation
        plotted = time.perf_counter()
        for tr in stream(ctx.pool, target, req, stop_ev, every_s=TEXT_EVERY_S, owner=request.session_hash):
            if ctx.clears(session, "chat") != cleared_before:
                break
            turn["segments"] = list(tr.segments)
            turn["reply"] = tr.text
            turn["stats"] = render.stats_line(tr)
            if tr.error and not tr.tokens and tr.finish_reason is None and turns_ and turns_[-1] is turn:
                # Nothing was generated (bad model, prompt too long): keep the failed turn out of
                # the history, or every later turn would fail the same way.
                turns_.pop()
            plots = time.perf_counter() - plotted >= PLOTS_EVERY_S
            if plots:
                plotted = time.perf_counter()
            yield _outputs(turns_, tr, highlight_, plots=plots, data=False)
        if ctx.clears(session, "chat") != cleared_before:
            # Clear was pressed while this ran: an update of ours may have been applied after
            # Clear's, so the last word is an empty conversation again.
            yield _cleared()
            return
        yield _outputs(turns_, tr, highlight_)  # everything in its final state

    def send_fn(
        message: str, turns_: list[dict], system_: str, kind_: str, gamma_: str, max_tokens_: float,
        temperature_: float, top_k_: float, top_p_: float, min_p_: float, seed_: float,
        highlight_: bool, target_: str, draft_: str, schema_: str, request: gr.Request,
    ) -> Iterator[tuple]:
        settings_ = (system_, kind_, gamma_, max_tokens_, temperature_, top_k_, top_p_, min_p_, seed_)
        if not (message or "").strip():
            yield ("", chat_messages(turns_, highlight_), turns_, gr.skip(), gr.skip(), gr.skip(), gr.skip(),
                   "error: type a message first")
            return
        before = len(turns_)
        cleared_before = ctx.clears(request.session_hash or "", "chat")
        turns_ = turns_ + [{"user": message, "reply": "", "segments": [], "stats": ""}]
        for out in run(turns_, *settings_, highlight_, target_, draft_, schema_, request):
            failed = len(out[1]) == before and ctx.clears(request.session_hash or "", "chat") == cleared_before
            yield (message if failed else "", *out)  # a failed message goes back into the box

    def regen_fn(
        turns_: list[dict], system_: str, kind_: str, gamma_: str, max_tokens_: float,
        temperature_: float, top_k_: float, top_p_: float, min_p_: float, seed_: float,
        highlight_: bool, target_: str, draft_: str, schema_: str, request: gr.Request,
    ) -> Iterator[tuple]:
        settings_ = (system_, kind_, gamma_, max_tokens_, temperature_, top_k_, top_p_, min_p_, seed_)
        if not turns_:
            yield (chat_messages(turns_, highlight_), turns_, gr.skip(), gr.skip(), gr.skip(), gr.skip(),
                   "error: nothing to regenerate")
            return
        turns_ = turns_[:-1] + [{"user": turns_[-1]["user"], "reply": "", "segments": [], "stats": ""}]
        yield from run(turns_, *settings_, highlight_, target_, draft_, schema_, request)

    def stop_fn(request: gr.Request) -> str:
        ctx.stop(request.session_hash or "", "chat")
        return ""

    def clear_fn(request: gr.Request) -> tuple:
        ctx.clear(request.session_hash or "", "chat")
        return _cleared()

    return send_fn, regen_fn, stop_fn, clear_fn


def _cleared() -> tuple:
    """The chat tab's outputs for an empty conversation."""
    return [], [], None, "No steps yet.", None, None, ""


def _outputs(turns_: list[dict], tr: Tracker, highlight_: bool, plots: bool = True, data: bool = True) -> tuple:
    """The chat tab's outputs for tracker `tr`; `plots` and `data` False leave the plots and the reply
    data as they are (gr.skip) while a reply streams (TEXT_EVERY_S)."""
    err = f"error: {tr.error}" if tr.error else ""
    return (
        chat_messages(turns_, highlight_), turns_, details(tr) if data else gr.skip(), render.live_summary(tr),
        render.steps_frame(tr) if plots else gr.skip(), render.speedup_frame(tr) if plots else gr.skip(), err,
    )


def _target_line(target: str) -> str:
    """Which model answers in the Chat tab (it is chosen in the Models tab)."""
    return f"Target model: `{target.replace('`', '')}` (change it in the Models tab)"
