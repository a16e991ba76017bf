"""Race tab: one prompt, up to three configurations side by side, with honest speeds.

These machines have few cores, so running three generations at once would split the CPU between
them and measure nothing useful. Each configuration runs alone, one after another, with every
token's arrival time recorded; the columns then replay those recorded times in sync.
"""

import html
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from edgespec.apps.ui import render
from edgespec.apps.ui.context import AppContext
from edgespec.apps.ui.live import Tracker, stream
from edgespec.core import drafters
from edgespec.core.stats import speedup
from edgespec.runtime.errors import EdgeSpecError, one_line
from edgespec.service.session import Request

N_COLUMNS = 3
FRAME_S = 0.1  # replay refresh interval
MAX_TOKENS = 128  # a column's answer at most, whatever the chat's setting: three columns run one after another
METHOD = (
    "**Method:** each column ran **alone**, one after another, on all {cores} cores of this machine; "
    "every token's arrival time was recorded, and the columns below **replay those recorded timings "
    "in sync** at real speed. No column ran at the same time as another."
)
DEFAULT_PROMPT = (
    "Here is a list of items: apples, bananas, cherries, dates, elderberries, figs, grapes. "
    "Repeat the list exactly, one item per line, then say which ones are red."
)


# Gradio recognises a progress parameter by its default being a gr.Progress instance.
PROGRESS = gr.Progress()

@dataclass
class Column:
    label: str
    target: str
    drafter: str
    gamma: str


# The demo on the real pair (`python app.py models install coder-pair`): a code edit, where the
# n-gram drafter copies the unchanged lines and the 0.5B draft model shows its acceptance and cost.
PAIR = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
PAIR_PROMPT = (
    "Add a `discount` parameter (a fraction, default 0.0) to `compute_total` and apply it to the subtotal "
    "before tax. Change nothing else.\n\n```python\ndef compute_total(items, tax_rate):\n    subtotal = 0.0\n"
    "    for item in items:\n        subtotal += item[\"price\"] * item[\"quantity\"]\n    tax = subtotal * tax_rate\n"
    "    return subtotal + tax\n\n\ndef print_receipt(items, tax_rate):\n    for item in items:\n"
    "        print(f\"{item['name']:20s} {item['quantity']:3d} x {item['price']:8.2f}\")\n"
    "    print(f\"{'total':20s} {compute_total(items, tax_rate):16.2f}\")\n```\n\nWrite the complete modified code."
)


def pair_installed() -> bool:
    from edgespec.models import resolve_local

    return all(resolve_local(name) is not None for name in PAIR)


def default_columns(target: str) -> list[Column]:
    """With the coder pair installed (and the default or a pair target): 1.5B plain | 1.5B + n-gram |
    1.5B + 0.5B draft model. Otherwise higher-precision target | quantized target | quantized +
    n-gram speculation, the Q8_0 baseline being the derived SmolLM2 file when it has been made
    (button below), else the bundled model."""
    from edgespec.models import DEFAULT_TARGET
    from edgespec.models.derive import DERIVED_DIR

    if target in (DEFAULT_TARGET, *PAIR) and pair_installed():
        big, small = PAIR
        return [Column("1.5B plain", big, "none", "0"), Column("1.5B + n-gram", big, "ngram", "auto"),
                Column("1.5B + 0.5B draft", big, f"model:{small}", "auto")]
    q8 = DERIVED_DIR / "SmolLM2-135M-Instruct.Q8_0-from-Q4_1.gguf"
    has_q8 = q8.is_file() and target == "smollm2-135m"  # the Q8_0 file holds SmolLM2's weights only
    return [
        Column("baseline target" + (" (Q8_0)" if has_q8 else ""), str(q8) if has_q8 else target, "none", "0"),
        Column("quantized target", target, "none", "0"),
        Column("quantized + n-gram speculative", target, "ngram", "auto"),
    ]


def drafter_specs() -> tuple[list[str], str]:
    """The race's drafter choices and the dropdown's label, from the drafter registry: a kind that
    takes a model is typed as NAME:MODEL (or just a draft model's path or name)."""
    kinds = drafters.kinds()
    choices = ["none", *(k for k, v in kinds.items() if not v.takes_model)]
    forms = ["none", *(f"{k}:MODEL" if v.takes_model else k for k, v in kinds.items()), "a draft model path"]
    return choices, "drafter: " + " | ".join(forms)


def column_html(col: Column, segments: list[tuple[str, str]], speed: str, note: str = "") -> str:
    head = (
        f"<div><b>{html.escape(col.label)}</b><br><small>{html.escape(Path(col.target).name)} | drafter "
        f"{html.escape(col.drafter)}{'' if col.drafter == 'none' else ' | gamma ' + html.escape(col.gamma)}"
        f"</small></div><div class=\"race-speed\">{html.escape(speed)}</div>"
    )
    foot = f'<div class="es-stats">{html.escape(note)}</div>' if note else ""
    return head + render.segments_html(segments) + foot


def speed_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Bar-chart data: one bar per column, labelled with its speedup over the first column."""
    df = pd.DataFrame(
        [(f"{i + 1}. {r['speedup']:.2f}x {r['label']}", r["tokens_per_s"]) for i, r in enumerate(rows)],
        columns=["configuration", "tokens_per_s"],
    )
    return df.astype({"configuration": "str", "tokens_per_s": "float64"})


def build_race_tab(ctx: AppContext) -> None:
    d = ctx.defaults
    cols0 = default_columns(d.target)
    cores = len(os.sched_getaffinity(0))
    drafter_choices, drafter_label = drafter_specs()
    gr.Markdown(METHOD.format(cores=cores), elem_id="race-method")
    prompt = gr.Textbox(PAIR_PROMPT if cols0[0].target == PAIR[0] else DEFAULT_PROMPT, lines=3, label="Prompt",
                        elem_id="race-prompt")
    with gr.Row():
        max_tokens = gr.Slider(8, 1024, value=min(d.max_tokens, MAX_TOKENS), step=1, label="max tokens per column", elem_id="race-max-tokens")
        chat_fmt = gr.Checkbox(True, label="as a chat turn (the target's chat template, or User:/Assistant: "
                               "lines for a base model); off: the prompt as raw text")
        run = gr.Button("Race", variant="primary", elem_id="race-run")
        stop = gr.Button("Stop", variant="stop")
        derive = gr.Button("Make Q8_0 SmolLM2 baseline")
    controls: list[gr.components.Component] = []
    outputs: list[gr.HTML] = []
    with gr.Row():
        for i, c in enumerate(cols0):
            with gr.Column(elem_classes="race-col"):
                on = gr.Checkbox(True, label=f"column {i + 1}")
                label = gr.Textbox(c.label, label="label")
                tgt = gr.Dropdown([c.target], value=c.target, allow_custom_value=True,
                                  label="target (.gguf path, bundled or edgespec/models/ name)")
                drf = gr.Dropdown(drafter_choices, value=c.drafter, allow_custom_value=True, label=drafter_label)
                gam = gr.Textbox(c.gamma, label="gamma (number or auto)")
                controls += [on, label, tgt, drf, gam]
                outputs.append(gr.HTML(column_html(c, [], "-"), elem_id=f"race-col-{i + 1}"))
    status = gr.Markdown("", elem_id="race-status")
    chart = gr.BarPlot(None, x="configuration", y="tokens_per_s", label="tokens/s (speedup vs column 1)",
                       y_title="tokens/s", x_title="", x_label_angle=-10, height=300, elem_id="race-chart")
    with gr.Accordion("Race result as data", open=False):
        summary = gr.JSON(label="race result")

    def race_fn(request: gr.Request, prompt_: str, max_tokens_: float, chat_: bool, *rest: Any) -> Iterator[tuple]:
        # The request comes first: Gradio inserts it at its parameter index, which *rest would swallow.
        cols = [
            Column(str(rest[i + 1]).strip() or f"column {i // 5 + 1}", str(rest[i + 2] or "").strip(),
                   str(rest[i + 3] or "none").strip(), str(rest[i + 4] or "auto").strip()) if rest[i] else None
            for i in range(0, 5 * N_COLUMNS, 5)
        ]
        yield from race(ctx, prompt_, int(max_tokens_), bool(chat_), cols, request.session_hash or "",
                        ctx.owner(request.username))

    def stop_fn(request: gr.Request) -> None:
        ctx.stop(request.session_hash or "", "race")

    def derive_fn(progress: gr.Progress = PROGRESS) -> tuple:
        from edgespec.models.derive import derive_pair

        progress(0.1, desc="requantizing SmolLM2-135M to Q8_0")
        try:
            q8, _ = derive_pair()
        except EdgeSpecError as exc:
            return gr.skip(), gr.skip(), f"error: {exc}"
        return str(q8), "baseline target (Q8_0)", f"made {q8}"

    run.click(race_fn, [prompt, max_tokens, chat_fmt, *controls], [*outputs, status, chart, summary],
              api_name="race", concurrency_limit=1, concurrency_id="race", show_progress="hidden")
    stop.click(stop_fn, None, None, api_name="race_stop", queue=False)
    derive.click(derive_fn, None, [controls[2], controls[1], status], api_name="derive_q8")


def race(ctx: AppContext, prompt: str, max_tokens: int, chat: bool, cols: list[Column | None],
         session: str, owner: str = "") -> Iterator[tuple]:
    """Record each column alone, then replay them together; yields the race tab's outputs. `cols`
    has one entry per column of the tab, None for a column that is off. Every column is checked
    (its settings and its target) before the first one runs: a bad one is reported at once, not
    after the others' minutes of recording. `owner`: whose requests they are (the login's, Request.owner)."""
    off = [column_html(Column(f"column {i + 1}", "-", "none", "-"), [], "off") for i in range(N_COLUMNS)]
    htmls = [off[i] if col is None else column_html(col, [], "waiting") for i, col in enumerate(cols)]
    on = [(i, col) for i, col in enumerate(cols) if col is not None]
    if not on:
        yield (*htmls, "error: enable at least one column", gr.skip(), gr.skip())
        return
    if not prompt.strip():
        yield (*htmls, "error: the prompt is empty", gr.skip(), gr.skip())
        return
    reqs, errors = {}, []
    for i, col in on:
        try:
            reqs[i] = Request(messages=[{"role": "user", "content": prompt}] if chat else None,
                              text=None if chat else prompt, framing="auto" if chat else "raw",
                              draft=col.drafter, gamma=col.gamma, ngram=ctx.defaults.ngram, max_tokens=max_tokens,
                              reuse_prefix=False, owner=owner)  # every column pays its own prefill
            kind, arg = drafters.split_spec(col.drafter)
            for model in [col.target] + ([arg] if kind == "model" else []):  # named right, on this machine
                ctx.pool.key(model)
        except EdgeSpecError as exc:
            errors.append(f"column {i + 1}: {one_line(exc)}")
            htmls[i] = column_html(col, [], "not run", f"error: {one_line(exc)}")
    if errors:
        yield (*htmls, "error: " + "; ".join(errors) + ". Nothing was run: fix the column and race again.",
               gr.skip(), gr.skip())
        return
    stop = ctx.new_stop(session, "race")
    runs: list[tuple[int, Column, Tracker]] = []
    load = os.getloadavg()[0]
    for n, (i, col) in enumerate(on):
        if stop.is_set():
            break
        others = ctx.pool.active()
        tr = Tracker()
        for tr in stream(ctx.pool, col.target, reqs[i], stop, every_s=0.25):
            htmls[i] = column_html(col, [], f"recording... {len(tr.tokens)} tokens")
            yield (*htmls, f"Recording column {i + 1} ({n + 1} of {len(on)}) alone...", gr.skip(), gr.skip())
        if others:
            tr.error = (tr.error or "") + f" (note: {others} other generation(s) were running during this recording)"
        runs.append((i, col, tr))
        htmls[i] = column_html(col, [], "recorded", tr.error or "")
        load = max(load, os.getloadavg()[0])
    yield from replay(runs, htmls, load_note(load))


def load_note(load: float) -> str:
    """Say so when other programs were competing for the CPU while the columns were recorded."""
    cores = len(os.sched_getaffinity(0))
    if load <= 0.75 * cores + 1:
        return ""
    return (f" Note: the system load average reached {load:.1f} on {cores} cores while recording; other programs "
            "competed for the CPU, so absolute speeds are lower than on an idle machine.")


def replay(runs: list[tuple[int, Column, Tracker]], htmls: list[str], note: str = "") -> Iterator[tuple]:
    """Show the recorded generations side by side, each token appearing at its recorded time;
    `runs`: (the column's place in the tab, the column, its recording)."""
    t_end = max((tr.times[-1] for _, _, tr in runs if tr.times), default=0.0)
    t0 = time.perf_counter()
    while True:
        tau = time.perf_counter() - t0
        done = tau >= t_end
        for i, col, tr in runs:
            n = len(tr.times) if done else sum(1 for t in tr.times if t <= tau)
            finished = done or not tr.times or tau >= tr.times[-1]
            if finished and tr.reply is not None:
                speed = f"{tr.reply.stats.tokens_per_s:.1f} tok/s"
                foot = render.stats_line(tr)
            else:
                speed = f"{n / tau:.1f} tok/s" if tau > 0 and n else "..."
                foot = "replaying recorded timings"
            if tr.error and tr.reply is None:
                speed, foot = "failed", f"error: {tr.error}"
            htmls[i] = column_html(col, tr.segments[:n], speed, foot)
        if done:
            break
        yield (*htmls, "Replaying the recorded timings in sync...", gr.skip(), gr.skip())
        time.sleep(FRAME_S)
    rows = []
    base = None
    for _, col, tr in runs:
        r = tr.reply
        tps = r.stats.tokens_per_s if r is not None else 0.0
        base = tps if base is None else base
        rows.append({
            "label": col.label, "target": col.target, "drafter": r.drafter if r is not None else col.drafter,
            "gamma": r.gamma if r is not None else col.gamma, "framing": r.framing if r is not None else None,
            "tokens_per_s": tps,
            "speedup": speedup(tps, base),
            "generated": len(tr.tokens), "text": tr.text, "error": tr.error,
            "finish_reason": tr.finish_reason,
        })
    summary = {"method": "sequential runs, recorded per-token timings replayed in sync", "columns": rows,
               "load_note": note.strip()}
    errs = [f"column {i + 1}: {r['error']}" for (i, _, _), r in zip(runs, rows, strict=True) if r["error"]]
    status = "Done. " + ("; ".join(errs) if errs else "Bars: decode tokens/s; speedup relative to column 1.") + note
    top = max((r["tokens_per_s"] for r in rows), default=0.0)
    chart = gr.BarPlot(speed_frame(rows), y_lim=[0, 1.15 * top or 1.0])  # bars start at zero
    yield (*htmls, status, chart, summary)
