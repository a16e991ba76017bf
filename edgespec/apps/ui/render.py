"""Text, HTML and plot data the UI shows; pure functions of a Tracker and its Reply (no Gradio here)."""

from __future__ import annotations

import html
from collections.abc import Sequence

import pandas as pd

from edgespec.apps.ui.live import Tracker

SOURCE_CLASS = {"draft": "tok-draft", "learned": "tok-learned", "grammar": "tok-grammar", "target": "tok-target",
                "bonus": "tok-bonus"}

CSS = """
.es-out { white-space: pre-wrap; line-height: 1.55; }
.tok-draft { background: #bbf7d0; color: #14532d; border-radius: 3px; }
.tok-learned { background: #e9d5ff; color: #3b0764; border-radius: 3px; }
.tok-bonus { background: #bae6fd; color: #0c4a6e; border-radius: 3px; }
.tok-grammar { background: #fde68a; color: #713f12; border-radius: 3px; }
.tok-target { box-shadow: inset 0 0 0 1px #9ca3af; border-radius: 3px; box-decoration-break: clone;
  -webkit-box-decoration-break: clone; }
.dark .tok-draft { background: #166534; color: #ecfdf5; }
.dark .tok-learned { background: #6b21a8; color: #faf5ff; }
.dark .tok-bonus { background: #075985; color: #f0f9ff; }
.dark .tok-grammar { background: #a16207; color: #fefce8; }
.dark .tok-target { box-shadow: inset 0 0 0 1px #6b7280; }
.es-legend span { padding: 1px 6px; margin-right: 8px; }
.es-stats { font-size: 0.82em; opacity: 0.8; margin-top: 6px; }
.es-error { color: #b91c1c; font-weight: 600; }
.es-plot-legend { font-size: 0.85em; margin: 4px 0 -4px 0; }
.race-col .es-out { min-height: 12em; max-height: 28em; overflow-y: auto; font-size: 0.92em; }
.race-speed { font-size: 1.6em; font-weight: 700; }
"""

LEGEND = (
    '<div class="es-legend">'
    '<span class="tok-draft">accepted draft token (n-gram or draft model)</span>'
    '<span class="tok-learned">accepted draft token (learned drafter)</span>'
    '<span class="tok-grammar">accepted draft token (forced by the JSON schema or grammar)</span>'
    '<span class="tok-target">target token (plain step or correction after a rejection)</span>'
    '<span class="tok-bonus">bonus token (all drafts accepted, one more from the same target pass)</span>'
    "</div>"
)


def segments_html(segments: Sequence[tuple[str, str]]) -> str:
    """Per-token (text, source) pairs as one block of spans, one span per run of a source.

    Newlines become <br> so the block has no blank line: Markdown renderers then pass the whole
    block through as HTML instead of parsing its text.
    """
    runs: list[tuple[str, str]] = []
    for piece, src in segments:
        if runs and runs[-1][1] == src:
            runs[-1] = (runs[-1][0] + piece, src)
        else:
            runs.append((piece, src))
    spans = "".join(
        f'<span class="{SOURCE_CLASS[src]}">{html.escape(text).replace(chr(10), "<br>")}</span>'
        for text, src in runs
        if text
    )
    return f'<div class="es-out">{spans}</div>'


ACCEPTANCE = "acceptance (per drafted token)"  # Stats.acceptance_rate: accepted / drafted
ALPHA = "alpha (per tested token)"  # Stats.alpha: the paper's alpha, accepted / (accepted + rejections)


def stats_line(tr: Tracker) -> str:
    """`12.3 tok/s | 120 tokens | TTFT 0.05 s | acceptance (per drafted token) 69% (83/120) | ...`,
    every figure read off the Reply."""
    r = tr.reply
    if r is None:
        return f"error: {tr.error}" if tr.error else "loading..."
    st = r.stats
    parts = [
        f"{st.tokens_per_s:.1f} tok/s",
        f"{st.generated} tokens",
        f"TTFT {st.ttft_s:.2f} s" if st.ttft_s is not None else "TTFT -",
    ]
    if st.drafted:
        parts.append(f"{ACCEPTANCE} {100 * st.acceptance_rate:.0f}% ({st.accepted}/{st.drafted})")
        parts.append(f"{ALPHA} {st.alpha:.2f}")
    parts.append(f"{st.tokens_per_call:.2f} tokens per target call")
    if r.measured_speedup is not None and r.predicted_speedup is not None:
        parts.append(f"speedup {r.measured_speedup:.2f}x measured, {r.predicted_speedup:.2f}x predicted")
    parts.append(f"drafter {r.drafter}" + (f" (gamma {r.gamma})" if r.drafter != "none" else ""))
    if r.policy.get("fallback"):  # why gamma auto drafted little or nothing (adaptive.AutoGamma.decline)
        parts.append(r.policy["fallback"])
    parts.append(f"framing {r.framing}")
    if r.device:
        parts.append(f"device {r.device}")
    reason = r.finish_reason
    if reason == "stopped":
        parts.append("stopped")
    elif reason == "context":
        parts.append("context full: clear the chat or start with a larger --ctx")
    if tr.error:
        parts.append(f"error: {tr.error}")
    return " | ".join(parts)


def live_summary(tr: Tracker) -> str:
    """Markdown for the live stats panel (the latest target call's figures, from the Reply)."""
    if not tr.points:
        return "No steps yet."
    p = tr.points[-1]
    parts = [f"**step {p.step}**", f"gamma chosen {p.gamma}"]
    if tr.reply is not None and tr.reply.stats.drafted:
        parts += [f"{ACCEPTANCE} {100 * p.acceptance:.0f}%", f"{ALPHA} {p.alpha:.2f}"]
    parts.append(f"{p.tokens_per_call:.2f} tokens per target call")
    if p.predicted is not None and p.measured is not None:
        parts.append(f"speedup predicted {p.predicted:.2f}x, measured {p.measured:.2f}x")
    else:
        parts.append("no drafter: plain decoding")
    return " | ".join(parts)


STEP_COLORS = {"gamma chosen": "#7c3aed", "tokens per target call": "#0284c7", ACCEPTANCE: "#16a34a",
               ALPHA: "#ca8a04"}
SPEED_COLORS = {"predicted (paper formula)": "#ea580c", "measured": "#0f172a"}


def plot_legend(colors: dict[str, str]) -> str:
    """Legend for a line plot (Gradio's own legend shows no series names)."""
    items = "".join(
        f'<span style="border-bottom: 3px solid {c}; margin-right: 12px">{html.escape(name)}</span>'
        for name, c in colors.items()
    )
    return f'<div class="es-plot-legend">{items}</div>'


def steps_frame(tr: Tracker) -> pd.DataFrame | None:
    """Long-format rows (step, value, series) for gamma, tokens per call and acceptance; None
    before the first step (a plot first given an empty frame never draws its lines)."""
    if not tr.points:
        return None
    drafting = tr.reply is not None and tr.reply.stats.drafted > 0
    rows = []
    for p in tr.points:
        rows.append((p.step, float(p.gamma), "gamma chosen"))
        rows.append((p.step, p.tokens_per_call, "tokens per target call"))
        if drafting:
            rows.append((p.step, p.acceptance, ACCEPTANCE))
            rows.append((p.step, p.alpha, ALPHA))
    return _frame(rows, ["step", "value", "series"])


def speedup_frame(tr: Tracker) -> pd.DataFrame | None:
    """Long-format rows (step, speedup, series) for the paper's prediction and the measurement."""
    if not tr.points:
        return None
    rows = []
    for p in tr.points:
        if p.predicted is not None:
            rows.append((p.step, p.predicted, "predicted (paper formula)"))
        if p.measured:
            rows.append((p.step, p.measured, "measured"))
    return _frame(rows, ["step", "speedup", "series"]) if rows else None


def _frame(rows: list[tuple], columns: list[str]) -> pd.DataFrame:
    """(int x, float y, str series) rows with explicit dtypes, so the plot's y axis is numeric."""
    df = pd.DataFrame(rows, columns=columns)
    return df.astype({columns[0]: "int64", columns[1]: "float64", columns[2]: "str"})
