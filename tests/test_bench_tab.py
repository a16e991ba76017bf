"""Bench tab: it builds inside a Blocks/Tab and its run function streams status, then the report
and plots of a real (tiny) run."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import gradio as gr

from edgespec.ui.bench_tab import bench_tab, run_small_suite, suite_choices


def test_tab_builds_and_lists_the_shipped_suites():
    with gr.Blocks() as app:
        with gr.Tab("Bench"):
            bench_tab()
    labels = [label for label, _ in suite_choices()]
    assert "code_edit" in labels
    assert any(isinstance(c, gr.Gallery) for c in app.blocks.values())


def test_run_small_suite_streams_then_shows_report_and_plots(tmp_path):
    suite = tmp_path / "one.jsonl"
    row = {"id": "e1", "category": "code_edit", "prompt": "Rename f to g:\ndef f(x):\n    return x + 1\n"}
    suite.write_text(json.dumps(row) + "\n", encoding="utf-8")
    updates = list(run_small_suite(str(suite), "smollm2-135m", 1, 8, 1, False, threading.Event(), threads=1))
    assert updates[0][0].startswith("Running:")
    status, report, plots = updates[-1]
    assert status.startswith("done: 1 of 1 prompts")
    assert "| configuration | code_edit | overall |" in report and "ngram g=auto" in report
    assert [Path(p).name for p in plots] == ["speedup_by_category.png", "measured_vs_predicted.png", "verify_cost.png"]


def test_stop_ends_the_run_and_says_so(tmp_path):
    suite = tmp_path / "two.jsonl"
    rows = [{"id": f"p{i}", "category": "c", "prompt": f"Say {i}."} for i in range(2)]
    suite.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    stop = threading.Event()
    gen = run_small_suite(str(suite), "smollm2-135m", 2, 8, 1, False, stop, threads=1)
    assert next(gen)[0].startswith("Running:")  # models are still loading
    stop.set()
    status, _, _ = list(gen)[-1]
    assert status.startswith("stopped: 0 of 2 prompts")
