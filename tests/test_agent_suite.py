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


# ----------------------------------------------------------------------------- constrained variants
def test_constrained_rows_hold_what_serve_takes():
    """Every extraction of the agent suites carries a strict JSON schema the grammar engine compiles
    (additionalProperties false, every field required), every tool request OpenAI tools the server takes
    with tool_choice 'required'; the held-out suite's ids are its own."""
    from benchmarks.agent_suite import constraint
    from edgespec.apps.server.protocol import ChatBody, _tools
    from edgespec.service.structured import json_schema_grammar
    from edgespec.service.suites import load_suite, load_suites

    prompts = load_suites(["agent", "agent_heldout"])  # no duplicate ids across them
    heldout = load_suite("agent_heldout")
    assert {p.kind for p in heldout} == {"extract", "tool"} and len(heldout) >= 8
    for p in prompts:
        if p.kind == "extract":
            assert p.schema is not None and p.schema["additionalProperties"] is False, p.id
            assert set(p.schema["required"]) == set(p.schema["properties"]), p.id
            json_schema_grammar(p.schema, strict=True)
            body = constraint(p, True)["response_format"]
            assert body["type"] == "json_schema" and body["json_schema"]["strict"] is True
        elif p.kind == "tool":
            assert p.tools, p.id
            extra = constraint(p, True)
            assert extra["tool_choice"] == "required" and extra["parallel_tool_calls"] is False
            tools, choice = _tools(ChatBody(messages=[{"role": "user", "content": p.text}], **extra))
            assert choice == "required" and [t["function"]["name"] for t in tools] == \
                [t["function"]["name"] for t in p.tools]
            for t in p.tools:  # every function named in the system prompt is offered
                assert t["function"]["name"] in p.system, (p.id, t["function"]["name"])
        else:
            assert p.schema is None and p.tools is None and constraint(p, True) == {}
        assert constraint(p, False) == {}


def test_constrained_answers_are_checked_and_predictions_are_the_files():
    from benchmarks.agent_suite import predicted, valid
    from edgespec.service.suites import load_suite

    rows = {p.id: p for p in load_suite("agent")}
    ticket = rows["agent_extract_1"]
    good = {"ticket_id": "48213", "customer": "Maria Lopez", "product": "Team plan", "severity": "medium",
            "category": "billing", "summary": "Charged twice in March."}
    assert valid(ticket, json.dumps(good), []) is True
    for bad in ({**good, "severity": "urgent"}, {k: v for k, v in good.items() if k != "summary"}, {**good, "x": 1}):
        assert valid(ticket, json.dumps(bad), []) is False
    assert valid(ticket, '{"ticket_id": "48213"', []) is False  # cut at max_tokens
    tool = rows["agent_tool_1"]
    assert valid(tool, "", [{"name": "run_tests", "arguments": '{"path": "tests/test_dates.py"}'}]) is True
    assert valid(tool, "", [{"name": "run_tests", "arguments": "{}"}]) is False
    assert valid(tool, "", [{"name": "delete_repo", "arguments": "{}"}]) is False
    assert valid(tool, '{"tool": "run_tests"}', []) is False  # no call read out of the answer
    assert valid(rows["agent_slug_1"], "anything", []) is None
    file = predicted(rows["agent_slug_1"])
    assert file.startswith("```python\nimport re\n") and file.endswith("```") and file in rows["agent_slug_1"].text
    assert predicted(rows["agent_inventory_1"]).startswith("```python\nfrom dataclasses")
    assert predicted(ticket) is None and predicted(tool) is None


def test_whole_file_rewrites_send_files_of_forty_lines_and_hold_some_out():
    """agent_rewrite: aider's `whole` edit format on files of 40+ lines with a small change asked, the
    file sent as the prediction; the `heldout_` session was never tuned on."""
    from benchmarks.agent_suite import predicted
    from edgespec.service.suites import load_suite

    rows = load_suite("agent_rewrite")
    assert {p.kind for p in rows} == {"rewrite"} and len({p.session for p in rows}) >= 2
    assert sum(p.id.startswith("heldout_") for p in rows) >= 3
    for p in rows:
        file = predicted(p)
        assert file is not None and file.count("\n") >= 40 and file in p.text, p.id
        assert "complete updated file" in p.system and p.max_tokens >= len(file) // 3, p.id  # room for the whole file


def test_suite_lines_refuse_bad_schemas_and_tools(tmp_path):
    import pytest

    from edgespec.runtime.errors import EdgeSpecError
    from edgespec.service.suites import load_suite

    for extra, needle in (({"schema": []}, "'schema' must be a JSON schema"), ({"tools": []}, "'tools' must be"),
                          ({"tools": [{"type": "function"}]}, r"tools\[0\] must be")):
        suite = tmp_path / "s.jsonl"
        suite.write_text(json.dumps({"id": "x", "category": "agent", "prompt": "p", **extra}) + "\n")
        with pytest.raises(EdgeSpecError, match=needle):
            load_suite(suite)
