"""The agent-suite benchmark end to end: it starts `serve` on 127.0.0.1, sends the suite's first
requests with the official client for plain, ngram and suffix in one pass, and prints the
per-request table and the ratios per kind (no speed is asserted: the numbers are the program's)."""

from __future__ import annotations

import json
import subprocess
import sys

from edgespec.runtime import llamacpp
from tests.conftest import ROOT


def test_agent_suite_through_serve(tmp_path):
    out = tmp_path / "agent"
    res = subprocess.run(
        [sys.executable, "-m", "benchmarks.agent_suite", "--target", "smollm2-135m", "--limit", "3", "--repeats", "1",
         "--max-tokens", "24", "--threads", "1", "--flash-attn", "off", "--ctx", "2048", "--out", str(out),
         "--reference", "llama.cpp:ngram-cache"],
        cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    rows = report["requests"]
    assert [r["id"] for r in rows] == ["agent_inventory_1", "agent_inventory_2", "agent_inventory_3"]
    assert [r["step"] for r in rows] == [1, 2, 3] and {r["session"] for r in rows} == {"inventory"}
    for r in rows:
        for name in ("plain", "ngram", "suffix"):
            c = r["configs"][name]
            assert len(c["rates"]) == 1 and c["tok_s"] > 0 and c["tokens"] > 0
    assert rows[0]["configs"]["suffix"]["accepted_by_source"].get("answers", 0) == 0  # nothing earlier yet
    assert {"edit", "all", "sessions: first requests", "sessions: later requests"} <= set(report["kinds"])
    table = res.stdout
    assert "| agent_inventory_2 | edit | 2 |" in table and "suffix / ngram, all:" in table
    if llamacpp.find_binary() is None:
        assert "llama.cpp reference skipped" in res.stderr
    else:
        assert "llama.cpp ngram-cache" in rows[0]["configs"]
