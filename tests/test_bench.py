"""`python app.py bench` (benchmarks.bench): suites, results.json consistency, the session layer's
predicted speedup and stored cost profile, bad input, Ctrl-C, --verify-cost.

End-to-end runs use SmolLM2 with a tiny suite (a few prompts, <= 32 tokens, 1 repeat) and one
thread, so they stay fast on a shared 2-core machine."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, run_app

from benchmarks.bench import BASELINE, REF_LOOKUP, REF_PLAIN, BenchSettings, aggregate
from edgespec.costs import CostModel, profile_rows
from edgespec.engine import first_divergence
from edgespec.errors import EdgeSpecError
from edgespec.session import FRAMINGS, QA_FRAME, Request, frame
from edgespec.suites import load_suite, load_suites, shipped_suites

CODE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
TINY = [
    {"id": "edit1", "category": "code_edit", "prompt": f"Rename add to plus in this code:\n{CODE}"},
    {"question_id": 7, "category": "qa", "turns": ["Repeat this sentence: the cat sat on the mat.", "again"]},
    {"id": "edit2", "category": "code_edit", "prompt": f"Add a docstring to each function:\n{CODE}"},
]


def write_suite(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------- suites
def test_load_suite_reads_both_formats(tmp_path):
    prompts = load_suite(write_suite(tmp_path / "s.jsonl", TINY))
    assert [(p.id, p.category) for p in prompts] == [("edit1", "code_edit"), ("7", "qa"), ("edit2", "code_edit")]
    assert prompts[1].text == "Repeat this sentence: the cat sat on the mat."  # first turn only


def test_shipped_spec_bench_loads_with_filters():
    suites = shipped_suites()
    assert set(suites) == {"code_edit", "code_open", "spec_bench"}
    assert suites["spec_bench"].parent == ROOT / "benchmarks" / "suites"  # package data, found by importlib
    prompts = load_suites([suites["spec_bench"]], ["summarization", "rag"], per_category=2)
    assert [p.category for p in prompts] == ["summarization"] * 2 + ["rag"] * 2
    by_name = load_suites(["spec_bench"], ["summarization", "rag"], per_category=2)  # `--suite spec_bench`
    assert [p.id for p in by_name] == [p.id for p in prompts]
    assert len(load_suite("spec_bench")) == 480
    assert "Apache License" in (suites["spec_bench"].parent / "SPEC_BENCH_LICENSE").read_text()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ('{"id": 1, "category": "a", "prompt": "x"}\n{"id": 2, "category": "a", "prompt": "y"\n', ":2: not valid JSON"),
        ('{"id": 1, "prompt": "x"}\n', ":1: missing field 'category'"),
        ('{"id": 1, "category": "a", "prompt": "x"}\n\n{"category": "a", "prompt": "y"}\n', ":3: missing field 'id'"),
        ('{"id": 1, "category": "a"}\n', ":1: missing field 'prompt'"),
        ('{"question_id": 1, "category": "a", "turns": []}\n', ":1: 'turns' must be a non-empty list"),
        ('{"id": 1, "category": "a", "prompt": "  "}\n', ":1: the prompt is empty"),
        ('[1, 2]\n', ":1: expected a JSON object"),
        ('{"id": 1, "category": "a", "prompt": "x"}\n{"id": 1, "category": "b", "prompt": "y"}\n', ":2: duplicate id '1'"),
        ("\n\n", "suite file has no prompts"),
        ("", "suite file has no prompts"),
    ],
)
def test_bad_suite_names_the_line(tmp_path, content, needle):
    suite = tmp_path / "bad.jsonl"
    suite.write_text(content, encoding="utf-8")
    with pytest.raises(EdgeSpecError, match=None) as exc:
        load_suite(suite) if "duplicate" not in needle else load_suites([suite])
    assert needle in str(exc.value)
    assert "\n" not in str(exc.value)


def test_bad_suite_cli_error_is_one_line(tmp_path):
    suite = tmp_path / "bad.jsonl"
    suite.write_text('{"id": 1, "category": "a", "prompt": "x"}\nnot json\n', encoding="utf-8")
    r = run_app("bench", "--suite", str(suite), "--out", str(tmp_path / "o"), timeout=60)
    assert r.returncode == 1
    assert r.stderr.startswith("error: ") and f"{suite}:2: not valid JSON" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    missing = run_app("bench", "--suite", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o"), timeout=60)
    assert missing.returncode == 1 and "suite file not found" in missing.stderr
    cat = run_app("bench", "--suite", str(write_suite(tmp_path / "s.jsonl", TINY)), "--category", "math",
                  "--out", str(tmp_path / "o"), timeout=60)
    assert cat.returncode == 1 and "no prompts in category 'math'" in cat.stderr
    assert not (tmp_path / "o" / "results.json").exists()


# ------------------------------------------------------------------------------------- settings
@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"gammas": ["fast"]}, "gamma must be a whole number >= 0 or 'auto', got 'fast'"),
        ({"gammas": ["65"]}, "gamma 65 is more than a step can verify"),
        ({"drafts": ["none"]}, "the baseline always runs"),
        ({"framing": "poem"}, f"--framing must be one of {', '.join(FRAMINGS)}"),
        ({"repeats": 0}, "--repeats must be >= 1"),
    ],
)
def test_bad_settings_fail_before_anything_loads(kw, needle):
    with pytest.raises(EdgeSpecError) as exc:
        BenchSettings(suites=["code_edit"], target="no-such-model", **kw)
    assert needle in str(exc.value)


def test_bench_framing_is_the_sessions_question(smollm2, monkeypatch):
    """The bench asks with the session's 'question' framing by default: the chat template when
    there is one, else qa (a base model answers one question instead of continuing the text)."""
    assert BenchSettings(suites=["code_edit"], target="x").framing == "question"
    text = "What is 2 + 2?"
    asked = frame(smollm2, Request(text=text, framing="question"))
    chat = frame(smollm2, Request(text=text, framing="chat")).tokens
    assert asked.framing == "chat" and asked.tokens == chat and text in smollm2.detokenize(chat)
    monkeypatch.setattr(smollm2, "chat_template", lambda: None)  # as a base model (Gemma-3-270M's GGUF)
    asked = frame(smollm2, Request(text=text, framing="question"))
    assert asked.framing == "qa" and asked.stop == ("\nQuestion:",)
    assert asked.tokens == smollm2.tokenize(QA_FRAME.format(prompt=text), add_special=True) != chat


def test_aggregate_is_total_tokens_over_total_seconds():
    def entry(tps: float, gen: int) -> dict:
        return {"tokens_per_s": tps, "generated": gen}

    prompts = [
        {"category": "a", "results": {BASELINE: entry(10, 100), "x": entry(20, 100)}},
        {"category": "a", "results": {BASELINE: entry(10, 50), "x": entry(50, 50)}},
    ]
    cats = aggregate(prompts, [BASELINE, "x"])
    assert cats["a"]["x"]["tokens_per_s"] == pytest.approx(150 / (100 / 20 + 50 / 50))
    assert cats["a"]["x"]["speedup"] == pytest.approx(25 / 10)
    assert cats["overall"]["x"]["prompts"] == 2


# ------------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    suite = write_suite(tmp / "tiny.jsonl", TINY)
    out = tmp / "out"
    r = run_app("bench", "--suite", str(suite), "--target", "smollm2-135m", "--gamma", "auto", "--gamma", "3",
                "--max-tokens", "32", "--repeats", "1", "--threads", "1", "--out", str(out), timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    return r, out, json.loads((out / "results.json").read_text())


def test_bench_writes_results_report_and_plots(tiny_run):
    r, out, res = tiny_run
    assert "Traceback" not in r.stderr
    names = [c["name"] for c in res["meta"]["configs"]]
    assert names == [BASELINE, "ngram g=auto", "ngram g=3", REF_PLAIN, REF_LOOKUP]
    assert [p["id"] for p in res["prompts"]] == ["edit1", "7", "edit2"]
    assert res["meta"]["interrupted"] is False and res["meta"]["prompts_done"] == 3
    assert res["meta"]["framing"] == "chat"  # SmolLM2 has a chat template
    assert set(res["categories"]) == {"code_edit", "qa", "overall"}
    for f in ("report.md", "speedup_by_category.png", "measured_vs_predicted.png", "verify_cost.png"):
        assert (out / f).stat().st_size > 0, f
    assert (out / "speedup_by_category.png").read_bytes()[:4] == b"\x89PNG"
    report = (out / "report.md").read_text()
    assert "| configuration | code_edit | qa | overall |" in report
    assert "ngram g=auto" in report and REF_LOOKUP in report
    assert "ngram g=auto" in r.stdout and "tok/s" in r.stdout
    costs = res["meta"]["verify_cost_s"]
    assert sorted(int(k) for k in costs) == profile_rows() and all(v > 0 for v in costs.values())
    # T(K) in the report is the stored cost profile (kept where EDGESPEC_PROFILES points), not a
    # measurement of the bench's own.
    stored = json.loads(Path(res["meta"]["cost_profile"]).read_text())
    assert Path(res["meta"]["cost_profile"]).parent == Path(os.environ["EDGESPEC_PROFILES"])
    if not res["meta"]["cost_profile_changed"]:
        assert {k: stored["pass_s"][k] for k in costs} == costs
    else:  # re-measured during the run (session.check_t1 judged it stale): said so in the report
        assert "measured again during the run" in (out / "report.md").read_text()


def test_bench_numbers_are_consistent(tiny_run):
    _, _, res = tiny_run
    for p in res["prompts"]:
        base = p["results"][BASELINE]
        assert base["speedup"] == pytest.approx(1.0)
        for name, e in p["results"].items():
            assert len(e["tokens_per_s_runs"]) == 1 and e["tokens_per_s"] == e["tokens_per_s_runs"][0]
            assert e["speedup"] == pytest.approx(e["tokens_per_s"] / base["tokens_per_s"])
            assert 1 <= e["generated"] <= 32 and e["generated"] == len(e["tokens"])
            if e["kind"] == "ours":
                if e["drafted"]:  # auto gamma may decline to draft at all on a short answer
                    assert e["acceptance_rate"] == pytest.approx(e["accepted"] / e["drafted"])
                    assert 0.0 <= e["acceptance_rate"] <= 1.0
                else:
                    assert e["acceptance_rate"] is None and e["accepted"] == 0
                assert e["target_calls"] <= e["generated"] + 1  # every call but an EOG-ending one adds a token
                if name == "ngram g=3":
                    assert e["target_calls"] >= math.ceil(e["generated"] / 4)  # at most 3 drafts + 1 a call
                # tokens produced per call: the answer's, plus the end-of-generation token that ended it
                produced = e["tokens_per_call"] * e["target_calls"]
                assert produced == pytest.approx(e["generated"]) or produced == pytest.approx(e["generated"] + 1)
                assert e["predicted_speedup"] > 0
                # Reply.predicted_speedup: the one cost model over the reported T(K) profile
                if not res["meta"]["cost_profile_changed"]:
                    cm = CostModel({int(k): v for k, v in res["meta"]["verify_cost_s"].items()})
                    hist = {int(k): n for k, n in e["gamma_hist"].items()}
                    expect = cm.predicted_for(hist, e["alpha"], e["draft_s"], e["drafted"])
                    assert e["predicted_speedup"] == pytest.approx(expect, rel=1e-9)
                if name == "ngram g=3":
                    assert set(e["gamma_hist"]) <= {"0", "1", "2", "3"}
            else:
                assert e.get("predicted_speedup") is None  # no drafter, no cost model
            if e["kind"] == "reference":
                own = p["results"][REF_PLAIN]["tokens_per_s"]
                assert e["speedup_vs_own_baseline"] == pytest.approx(e["tokens_per_s"] / own)
    base_s = 1.0 / res["categories"]["overall"][BASELINE]["tokens_per_s"]
    assert res["meta"]["verify_cost_suspect"] is (res["meta"]["verify_cost_s"]["1"] > 2.0 * base_s)
    for cat, row in res["categories"].items():
        ps = [p for p in res["prompts"] if cat == "overall" or p["category"] == cat]
        for name, cell in row.items():
            gen = sum(p["results"][name]["generated"] for p in ps)
            secs = sum(p["results"][name]["generated"] / p["results"][name]["tokens_per_s"] for p in ps)
            assert cell["generated"] == gen and cell["tokens_per_s"] == pytest.approx(gen / secs)
            assert cell["speedup"] == pytest.approx(cell["tokens_per_s"] / row[BASELINE]["tokens_per_s"])


def test_identical_flags_agree_with_the_tokens(tiny_run):
    _, _, res = tiny_run
    for p in res["prompts"]:
        base = p["results"][BASELINE]["tokens"]
        for name, e in p["results"].items():
            same = e["tokens"] == base
            assert e["identical"] is same, (p["id"], name)
            if same:
                assert e["divergences"] == []
            else:
                (d,) = e["divergences"]
                assert d["position"] == first_divergence(base, e["tokens"])
                assert d["top2_gap"] >= 0 and d["near_tie"] == (d["top2_gap"] < 1.5)
        lookup = p["results"][REF_LOOKUP]
        assert lookup["identical_to_own_baseline"] is (lookup["tokens"] == p["results"][REF_PLAIN]["tokens"])
    for cat, row in res["categories"].items():
        n = sum(1 for p in res["prompts"] if cat == "overall" or p["category"] == cat)
        for name, cell in row.items():
            ident = sum(p["results"][name]["identical"] for p in res["prompts"] if cat in ("overall", p["category"]))
            assert cell["identical"] == ident and cell["prompts"] == n


def test_ctrl_c_writes_what_was_finished(tmp_path):
    rows = [{"id": f"p{i}", "category": "c", "prompt": f"Count from {i} to {i + 40}, one number a line."}
            for i in range(6)]
    suite = write_suite(tmp_path / "s.jsonl", rows)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "app.py"), "bench", "--suite", str(suite), "--target", "smollm2-135m",
         "--max-tokens", "32", "--repeats", "1", "--threads", "1", "--no-reference", "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )
    try:
        deadline = time.monotonic() + 240
        while not (out / "results.json").exists():
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "no prompt finished in time"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "interrupted: wrote" in err
    res = json.loads((out / "results.json").read_text())
    assert res["meta"]["interrupted"] is True
    assert 1 <= res["meta"]["prompts_done"] == len(res["prompts"]) < 6
    assert res["categories"]["c"][BASELINE]["prompts"] == len(res["prompts"])
    assert "(interrupted)" in (out / "report.md").read_text()


def test_verify_cost(tmp_path):
    r = run_app("bench", "--verify-cost", "--target", "smollm2-135m", "--max-k", "6", "--repeats", "1",
                "--threads", "1", "--out", str(tmp_path), timeout=200)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "verify_cost.json").read_text())
    assert [row["k"] for row in res["rows"]] == list(range(1, 7))
    assert res["rows"][0]["t_ratio"] == 1.0
    best = max(res["rows"], key=lambda row: row["k"] / row["t_ratio"])
    assert res["best_k"] == best["k"] and res["ceiling_speedup"] == pytest.approx(best["k"] / best["t_ratio"])
    assert f"{res['ceiling_speedup']:.2f}x" in r.stdout
    assert (tmp_path / "verify_cost.png").read_bytes()[:4] == b"\x89PNG"
    bad = run_app("bench", "--verify-cost", "--max-k", "1", timeout=60)
    assert bad.returncode == 1 and "--max-k must be >= 2" in bad.stderr
