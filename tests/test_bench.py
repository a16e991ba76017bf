"""`python app.py bench` (edgespec.service.bench.runner): suites, results.json consistency, the session layer's
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

from benchmarks.ceiling import bench_rows
from edgespec.core.costs import CostModel
from edgespec.core.stats import Stats
from edgespec.runtime.errors import EdgeSpecError
from edgespec.runtime.exactness import first_divergence
from edgespec.runtime.profiles import profile_rows
from edgespec.service.bench.runner import (
    BASELINE,
    REF_LOOKUP,
    REF_PLAIN,
    TIMED_FIGURES,
    BenchSettings,
    aggregate,
    pooled,
)
from edgespec.service.session import FRAMINGS, QA_FRAME, Request, frame
from edgespec.service.suites import load_suite, load_suites, shipped_suites

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


def test_agent_suite_carries_what_agents_send(tmp_path):
    """The agent suite's lines carry a system message, an answer budget, a kind and a session; each
    session edits one file in turn, and the fields are checked like the others."""
    prompts = load_suite("agent")
    assert {p.category for p in prompts} == {"agent"}
    assert {p.kind for p in prompts} == {"edit", "diff", "rewrite", "tool", "extract"}
    assert all(p.system and p.max_tokens and 64 <= p.max_tokens <= 160 and p.session for p in prompts)
    sessions: dict[str, list[str]] = {}
    for p in prompts:
        sessions.setdefault(p.session, []).append(p.id)
    assert sum(len(v) >= 3 for v in sessions.values()) >= 4  # files edited several times, tool loops, a pipeline
    bad = write_suite(tmp_path / "bad.jsonl", [{"id": "x", "category": "agent", "prompt": "p", "max_tokens": 0}])
    with pytest.raises(EdgeSpecError, match=r"bad.jsonl:1: 'max_tokens' must be a whole number >= 1"):
        load_suite(bad)


def test_shipped_spec_bench_loads_with_filters():
    suites = shipped_suites()
    assert set(suites) == {"agent", "agent_heldout", "agent_rewrite", "code_edit", "code_open", "spec_bench"}
    assert suites["spec_bench"].parent == ROOT / "edgespec" / "service" / "suites"  # package data, found by importlib
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


# Two generations with hand-counted steps. A: 4 steps of 2 drafts, two accepting both (3 tokens
# each), two accepting the first (2 each): 10 tokens, 8 drafted, 6 accepted, 2 rejections; depth 1
# tested 4 times, accepted 4; depth 2 tested 4, accepted 2. B: 1 step of 4 drafts, the first rejected.
GEN_A = Stats(generated=10, target_calls=4, drafted=8, accepted=6, rejections=2, draft_s=0.08, wall_s=1.0,
              drafted_hist={2: 4}, accepted_hist={1: 2, 2: 2}, depth_tested=[4, 4], depth_accepted=[4, 2])
GEN_B = Stats(generated=1, target_calls=1, drafted=4, accepted=0, rejections=1, draft_s=0.02, wall_s=1.0,
              drafted_hist={4: 1}, accepted_hist={0: 1}, depth_tested=[1], depth_accepted=[0])


def _check_pooled_ab(row: dict) -> None:
    """The figures of GEN_A and GEN_B together, counted by hand: 12 drafted, 6 accepted, 3 rejections,
    5 calls, 11 tokens (the mean of the two acceptances, 0.375, is not the pooled 0.5)."""
    st = row["stats"]
    assert (st["drafted"], st["accepted"], st["target_calls"], st["generated"]) == (12, 6, 5, 11)
    assert st["acceptance_rate"] == pytest.approx(0.5)
    assert st["alpha"] == pytest.approx(2 / 3)  # 6 / (6 + 3)
    assert st["tokens_per_call"] == pytest.approx(2.2) and st["mean_accepted"] == pytest.approx(1.2)
    assert st["alpha_by_depth"] == pytest.approx([4 / 5, 2 / 4])
    assert st["drafted_hist"] == {"2": 4, "4": 1} and st["accepted_hist"] == {"0": 1, "1": 2, "2": 2}


def test_pooled_figures_are_those_of_all_generations():
    # T(K) = T(1) = 10 ms, drafting c = 0.1 passes a token: a step of k drafts costs 1 + 0.1 k passes.
    costs = CostModel({1: 0.01, 64: 0.01}, c=0.1)
    row = pooled([GEN_A, GEN_B], costs)
    _check_pooled_ab(row)
    assert not set(TIMED_FIGURES) & set(row["stats"])  # the row's one rate is its own tokens_per_s
    # at alpha 2/3: E(2) = 1 + 2/3 + 4/9 = 19/9, E(4) = 211/81; 4 E(2) + E(4) = 895/81 tokens for
    # 4 * 1.2 + 1.4 = 6.2 passes
    assert row["predicted_speedup"] == pytest.approx(895 / 81 / 6.2)
    assert row["draft_cost"] == pytest.approx(0.1 / 12 / 0.01)  # 0.1 s drafting 12 tokens, over T(1)
    plain = pooled([Stats(generated=5, target_calls=5, drafted_hist={0: 5}, wall_s=1.0)], costs)
    assert plain["predicted_speedup"] == 1.0 and plain["draft_cost"] is None
    assert "predicted_speedup" not in pooled([GEN_A], None)  # no cost model (baseline, llama.cpp)


def test_aggregate_pools_rates_and_stats_over_prompts():
    def entry(tps: float, gen: int, st: Stats) -> dict:
        return {"tokens_per_s": tps, "generated": gen, "stats": st.to_dict()}

    base = Stats(generated=100, target_calls=100, drafted_hist={0: 100}, wall_s=1.0)
    prompts = [
        {"category": "a", "results": {BASELINE: entry(10, 100, base), "x": entry(20, 100, GEN_A)}},
        {"category": "a", "results": {BASELINE: entry(10, 50, base), "x": entry(50, 50, GEN_B)}},
    ]
    cats = aggregate(prompts, [BASELINE, "x"], {"x": CostModel({1: 0.01, 64: 0.01}, c=0.1)})
    # 150 tokens in 100/20 + 50/50 = 6 seconds
    assert cats["a"]["x"]["tokens_per_s"] == pytest.approx(25.0) and cats["a"]["x"]["speedup"] == pytest.approx(2.5)
    assert cats["overall"]["x"]["prompts"] == 2
    assert not set(TIMED_FIGURES) & set(cats["a"]["x"]["stats"])  # one rate per cell: its tokens_per_s
    _check_pooled_ab(cats["a"]["x"])
    assert cats["a"]["x"]["predicted_speedup"] == pytest.approx(895 / 81 / 6.2)
    assert "predicted_speedup" not in cats["a"][BASELINE] and cats["a"][BASELINE]["stats"]["target_calls"] == 200


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


def decode_seconds(e: dict) -> float:
    """Seconds a prompt's run spent on its answer (wall time after the prompt), from the run's own
    timings: our engine's (baseline and ours, one repeat); the llama-cpp-python reference keeps only
    its rate."""
    if e["kind"] in ("baseline", "ours"):
        return e["stats"]["wall_s"] - e["stats"]["prefill_s"]
    return e["generated"] / e["tokens_per_s"]


def test_bench_numbers_are_consistent(tiny_run):
    _, _, res = tiny_run
    for p in res["prompts"]:
        base = p["results"][BASELINE]
        assert base["speedup"] == pytest.approx(1.0)
        for name, e in p["results"].items():
            assert len(e["tokens_per_s_runs"]) == 1 and e["tokens_per_s"] == e["tokens_per_s_runs"][0]
            if e.get("no_drafts"):  # ours, plain on every run: the baseline's work, 1.00x (not a noise ratio)
                assert e["kind"] == "ours" and e["stats"]["drafted"] == 0 and e["speedup"] == 1.0
            else:  # answer tokens per second of the run over the baseline's on the same prompt
                want = e["generated"] / decode_seconds(e) / (base["generated"] / decode_seconds(base))
                assert e["speedup"] == pytest.approx(want), name
            assert 1 <= e["generated"] <= 32 and e["generated"] == len(e["tokens"])
            if e["kind"] in ("baseline", "ours"):
                st = e["stats"]  # one repeat: the Stats of the one run
                assert st["generated"] == e["generated"]
                assert e["tokens_per_s"] == pytest.approx(e["generated"] / decode_seconds(e)), name
                assert sum(st["drafted_hist"].values()) == st["target_calls"]  # every call is one step
                assert st["target_calls"] <= e["generated"] + 1  # every call but an EOG-ending one adds a token
                assert 0 <= st["accepted"] <= st["drafted"] and st["rejections"] <= st["target_calls"]
                longest = max(int(k) for k in st["drafted_hist"])
                assert len(st["alpha_by_depth"]) <= longest  # no depth beyond the longest draft is tested
                if st["drafted"]:  # auto gamma may decline to draft at all on a short answer
                    # drafts after a step's first rejection are never tested: alpha >= acceptance
                    assert 0.0 <= st["acceptance_rate"] <= st["alpha"] <= 1.0
                else:
                    assert st["accepted"] == st["rejections"] == 0 and st["alpha_by_depth"] == []
                if e["kind"] == "baseline":
                    assert st["drafted_hist"] == {"0": st["target_calls"]} and st["tokens_per_call"] == pytest.approx(1.0)
                if name == "ngram g=3":
                    assert st["target_calls"] >= math.ceil(e["generated"] / 4)  # at most 3 drafts + 1 a call
                    assert set(st["drafted_hist"]) <= {"0", "1", "2", "3"}
            if e["kind"] == "ours":
                assert e["predicted_speedup"] > 0 and (e["draft_cost"] is None) is (e["stats"]["drafted"] == 0)
                if set(e["stats"]["drafted_hist"]) == {"0"}:
                    assert e["predicted_speedup"] == pytest.approx(1.0)  # plain steps only: plain speed
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
            es = [p["results"][name] for p in ps]
            assert cell["generated"] == sum(e["generated"] for e in es)
            # all the prompts' answer tokens over all their decode seconds (not a mean of rates)
            rate = cell["generated"] / sum(decode_seconds(e) for e in es)
            assert cell["tokens_per_s"] == pytest.approx(rate), (cat, name)
            if all(e.get("no_drafts") for e in es):
                assert cell["speedup"] == 1.0 and cell["no_drafts"]
            else:  # over the baseline's rate on the same prompts
                bs = [p["results"][BASELINE] for p in ps]
                base_rate = sum(e["generated"] for e in bs) / sum(decode_seconds(e) for e in bs)
                assert cell["speedup"] == pytest.approx(rate / base_rate), (cat, name)
            if "stats" in cell:  # counters of the prompts, summed
                for key in ("generated", "target_calls", "drafted", "accepted", "rejections"):
                    assert cell["stats"][key] == sum(e["stats"][key] for e in es), (cat, name, key)


def test_ceiling_reads_the_bench_results(tiny_run):
    """benchmarks.ceiling --bench: a row for each configuration that drafted, from the overall cell."""
    _, _, res = tiny_run
    rows = bench_rows(CostModel({int(k): v for k, v in res["meta"]["verify_cost_s"].items()}), res)
    drafted = [n for n, c in res["categories"]["overall"].items() if c.get("draft_cost") is not None]
    assert drafted  # the n-gram drafter copies from the code it is asked to edit
    assert len(rows) == 2 + len(drafted) and all(any(f"| {n} |" in r for r in rows) for n in drafted)


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
    t1 = res["rows"][0]["seconds"]
    assert res["rows"][0]["t_ratio"] == 1.0 and res["rows"][0]["ceiling_speedup"] == 1.0  # K = 1: no drafts
    for row in res["rows"]:  # K tokens at perfect acceptance for one pass over K rows
        assert row["ceiling_speedup"] == pytest.approx(row["k"] * t1 / row["seconds"])
    best = max(res["rows"], key=lambda row: row["ceiling_speedup"])
    assert res["best_k"] == best["k"] and res["ceiling_speedup"] == best["ceiling_speedup"]
    assert f"{res['ceiling_speedup']:.2f}x" in r.stdout
    assert (tmp_path / "verify_cost.png").read_bytes()[:4] == b"\x89PNG"
    bad = run_app("bench", "--verify-cost", "--max-k", "1", timeout=60)
    assert bad.returncode == 1 and "--max-k must be >= 2" in bad.stderr


def test_an_earlier_run_is_not_replaced_without_force(tmp_path):
    """`bench --out EXISTING_DIR` replaced the earlier run's report.md and results (issue 44): it is
    refused in one line before anything runs, and --force lets the run go on."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text('{"earlier": true}')
    suite = str(write_suite(tmp_path / "s.jsonl", TINY))
    r = run_app("bench", "--suite", suite, "--out", str(out), timeout=60)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert f"{out} already holds an earlier run (results.json); add --force" in r.stderr
    assert (out / "results.json").read_text() == '{"earlier": true}'
    (out / "verify_cost.md").write_text("earlier")
    cost = run_app("bench", "--verify-cost", "--out", str(out), timeout=60)
    assert cost.returncode == 1 and "already holds an earlier run (verify_cost.md)" in cost.stderr
    forced = run_app("bench", "--suite", suite, "--category", "math", "--out", str(out), "--force", timeout=60)
    assert forced.returncode == 1 and "no prompts in category 'math'" in forced.stderr  # past the check
