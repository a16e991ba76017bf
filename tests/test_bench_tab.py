"""Bench tab: it builds inside a Blocks/Tab from the app's context, offers the suites shipped as
package data, streams status then the report and plots of a real (tiny) run, and a Stop in one
browser session ends that session's run only."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import gradio as gr
import gradio.utils

from edgespec.apps.ui.bench_tab import bench_tab, run_for_session, run_small_suite, stop_for_session, suite_choices
from edgespec.apps.ui.context import AppContext, Defaults
from edgespec.models.loader import RuntimeOptions
from edgespec.service.pool import ModelPool


def make_ctx() -> AppContext:
    return AppContext(ModelPool(RuntimeOptions(n_ctx=2048, n_threads=1)), Defaults())


def write_suite(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_tab_builds_and_lists_the_shipped_suites():
    with gr.Blocks() as app:
        with gr.Tab("Bench"):
            bench_tab(make_ctx())
    listed = suite_choices()
    choices = dict(listed)
    assert set(choices) == {"agent", "agent_heldout", "agent_rewrite", "code_edit", "code_open", "Spec-Bench"}
    assert listed[0][0] == "Spec-Bench"  # offered first: the tab's default suite
    assert all(Path(p).is_file() and p.endswith(".jsonl") for p in choices.values())
    assert any(isinstance(c, gr.Gallery) for c in app.blocks.values())
    # Run and Stop both get the browser session (gr.Request) that keys their stop flag.
    fns = [f.fn for f in app.fns.values()]
    assert len(fns) == 2
    assert all(gradio.utils.get_type_hints(fn).get("request") is gr.Request for fn in fns)


def test_run_small_suite_streams_then_shows_report_and_plots(tmp_path):
    row = {"id": "e1", "category": "code_edit", "prompt": "Rename f to g:\ndef f(x):\n    return x + 1\n"}
    suite = write_suite(tmp_path / "one.jsonl", [row])
    updates = list(run_small_suite(suite, "smollm2-135m", 1, 8, 1, False, threading.Event(), threads=1))
    assert updates[0][0].startswith("Running:")
    status, report, plots = updates[-1]
    assert status.startswith("done: 1 of 1 prompts")
    assert "| configuration | code_edit | overall |" in report and "ngram g=auto" in report
    assert [Path(p).name for p in plots] == ["speedup_by_category.png", "measured_vs_predicted.png", "verify_cost.png"]


def test_stop_ends_only_that_sessions_run(tmp_path):
    """Two browser sessions run the bench at once; Stop in session b ends b's run, a's finishes
    (each session has its own stop flag), and a new run does not clear a Stop pending in another."""
    ctx = make_ctx()
    one = write_suite(tmp_path / "one.jsonl", [{"id": "p0", "category": "c", "prompt": "Say 0."}])
    two = write_suite(tmp_path / "two.jsonl", [{"id": f"p{i}", "category": "c", "prompt": f"Say {i}."} for i in range(2)])
    a = run_for_session(ctx, "session-a", one, "smollm2-135m", 1, 8, 1, False, threads=1)
    assert next(a)[0].startswith("Running:")  # a's models are loading
    assert stop_for_session(ctx, "session-b") is False  # b has no run yet: nothing of a's is touched
    b = run_for_session(ctx, "session-b", two, "smollm2-135m", 2, 8, 1, False, threads=1)
    assert next(b)[0].startswith("Running:")
    assert stop_for_session(ctx, "session-b") is True
    status_b = list(b)[-1][0]
    assert status_b.startswith("stopped: 0 of 2 prompts"), status_b
    status_a, report_a, _ = list(a)[-1]
    assert status_a.startswith("done: 1 of 1 prompts"), status_a
    assert "| configuration | c | overall |" in report_a
