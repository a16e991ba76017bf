"""What the UI shows, as pure functions of a Reply (no model, no server)."""

from __future__ import annotations

import re
from pathlib import Path

from edgespec.apps.ui import render
from edgespec.apps.ui.live import Tracker
from edgespec.core.costs import CostModel
from edgespec.core.stats import Stats
from edgespec.runtime.errors import EdgeSpecError, one_line
from edgespec.service.session import Reply

UI_DIR = Path(__file__).resolve().parent.parent / "edgespec" / "apps" / "ui"


def reply_with(**stats) -> Reply:
    st = Stats(**stats)
    costs = CostModel({1: 0.010, 2: 0.012, 3: 0.014, 4: 0.016})
    r = Reply(stats=st, drafter="ngram", gamma="auto", framing="chat", costs=costs)
    r.add([1, 2, 3], ["target", "draft", "bonus"], ["a", "b\n", "c"], ["", "ngram", ""], st, None)
    return r


def test_target_tokens_are_outlined_as_the_legend_says():
    body = re.search(r"(?m)^\.tok-target\s*\{([^}]*)\}", render.CSS)
    assert body is not None and re.search(r"\b(border|outline|box-shadow)\s*:", body.group(1)), body
    assert 'class="tok-target"' in render.LEGEND
    html = render.segments_html([("Hello", "target"), (" world", "draft"), ("!", "bonus")])
    assert '<span class="tok-target">Hello</span>' in html
    assert 'class="tok-draft"' in html and 'class="tok-bonus"' in html


def test_the_two_acceptance_figures_have_distinct_names_everywhere():
    # 8 drafted, 5 accepted, 2 steps cut short: acceptance 5/8, alpha 5/7.
    r = reply_with(generated=10, target_calls=5, drafted=8, accepted=5, rejections=2, wall_s=1.0, prefill_s=0.1,
                   drafted_hist={2: 4, 0: 1})
    tr = Tracker()
    tr.add((2, 2, 1), r, 0.5)
    line = render.stats_line(tr)
    assert "acceptance (per drafted token) 62% (5/8)" in line
    assert "alpha (per tested token) 0.71" in line
    summary = render.live_summary(tr)
    assert "acceptance (per drafted token) 62%" in summary and "alpha (per tested token) 0.71" in summary
    series = set(render.steps_frame(tr)["series"])
    assert {"acceptance (per drafted token)", "alpha (per tested token)"} <= series
    assert set(render.STEP_COLORS) >= series
    p = tr.points[-1]
    assert p.acceptance == r.stats.acceptance_rate and p.alpha == r.stats.alpha


def test_live_speedups_are_the_replys_and_measured_never_beats_tokens_per_call():
    # A run that drafted almost nothing: gamma 0 nearly always, 1.03 tokens per target call.
    r = reply_with(generated=103, target_calls=100, drafted=6, accepted=3, rejections=3, wall_s=1.2, prefill_s=0.2,
                   drafted_hist={0: 97, 2: 3}, plain_pass_s=[0.004] * 50)
    tr = Tracker()
    tr.add((0, 0, 0), r, 1.0)
    p = tr.points[-1]
    assert p.predicted == r.predicted_speedup and p.measured == r.measured_speedup
    assert p.measured <= p.tokens_per_call + 1e-12
    m = re.search(r"speedup predicted ([\d.]+)x, measured ([\d.]+)x", render.live_summary(tr))
    assert m and float(m.group(2)) <= 1.03 + 0.005
    frame = render.speedup_frame(tr)
    assert set(frame["series"]) == {"predicted (paper formula)", "measured"}


def test_plain_decoding_has_no_cost_model_and_says_so():
    st = Stats(generated=4, target_calls=4, wall_s=0.1)
    r = Reply(stats=st, drafter="none", gamma="0", framing="transcript")
    r.add([1, 2, 3, 4], ["target"] * 4, ["a", "b", "c", "d"], [""] * 4, st, "eog")
    tr = Tracker()
    tr.add((0, 0, 0), r, 0.1)
    assert "no drafter" in render.live_summary(tr)
    assert render.speedup_frame(tr) is None
    line = render.stats_line(tr)
    assert "acceptance" not in line and "drafter none" in line and "framing transcript" in line


def test_errors_are_one_line():
    assert one_line(EdgeSpecError("the prompt is empty")) == "the prompt is empty"
    msg = one_line(RuntimeError("first line\n  Traceback (most recent call last):\n  more"), typed=True)
    assert "\n" not in msg and msg.startswith("RuntimeError: first line")
    tr = Tracker(error="the prompt is 900 tokens but the context holds 512")
    assert render.stats_line(tr) == "error: the prompt is 900 tokens but the context holds 512"


def test_ui_code_does_not_probe_protocols():
    for path in sorted(UI_DIR.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"\b(getattr|hasattr)\(", text), f"{path.name} probes with getattr/hasattr"
