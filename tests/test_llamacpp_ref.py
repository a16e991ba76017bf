"""llama.cpp's own speculation as a bench reference (edgespec.runtime.llamacpp, `bench --reference`).

The program is real: `llama-speculative-simple` built by scripts/build_reference.sh. Where it has
not been built, the tests that run it are skipped (saying how to build it); the missing-binary path
of the bench is tested either way."""

from __future__ import annotations

import json

import pytest
from conftest import run_app
from test_bench import TINY, write_suite

from edgespec.runtime import llamacpp
from edgespec.runtime.errors import EdgeSpecError
from edgespec.service.session import Request, frame

BINARY = llamacpp.find_binary()
needs_binary = pytest.mark.skipif(BINARY is None, reason=llamacpp.missing_message())

ARTICLE = (
    "The river town kept its old stone bridge long after the new road went around it. Children "
    "fished from its arches in summer, and in winter the ice piled against the piers until the "
    "spring floods carried it away."
)


@pytest.mark.parametrize(
    ("spec", "types"),
    [
        ("llama.cpp:ngram-simple", ["ngram-simple"]),
        ("llama.cpp:ngram-mod, ngram-cache", ["ngram-mod", "ngram-cache"]),
        ("llama.cpp", list(llamacpp.SPEC_TYPES)),
        ("llama.cpp:draft-simple,draft-simple/4/3/0.5", ["draft-simple", "draft-simple/4/3/0.5"]),
    ],
)
def test_parse_reference(spec, types):
    assert llamacpp.parse_reference(spec) == types


def test_draft_simple_settings():
    assert llamacpp.draft_settings("draft-simple") == []  # the program's own defaults
    assert llamacpp.draft_settings("draft-simple/4/3/0.5") == [
        "--spec-draft-n-max", "4", "--spec-draft-n-min", "3", "--spec-draft-p-min", "0.5"]
    for bad in ("draft-simple/4/5/0.5", "draft-simple/4/3", "draft-simple/x/3/0.5", "draft-simple/4/3/1.5"):
        with pytest.raises(EdgeSpecError, match="draft-simple"):
            llamacpp.draft_settings(bad)


@needs_binary
def test_reference_folder_has_no_amx_kernels():
    """The app never loads the AMX variant; the program beside it must not either (on an AMX Xeon its
    loader would pick it and die)."""
    modules = sorted(p.name for p in BINARY.parent.glob("libggml-cpu-*"))
    assert modules and not any("sapphirerapids" in m for m in modules)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [("llama.cpp:ngram-fast", "unknown llama.cpp speculation type 'ngram-fast'"),
     ("llama.cpp:draft-simple/4/9/0.5", "need 1 <= N_MAX, 0 <= N_MIN <= N_MAX"),
     ("vllm:ngram", "--reference takes llama.cpp:TYPE")],
)
def test_bad_reference_is_a_one_line_error_before_loading(tmp_path, spec, needle):
    with pytest.raises(EdgeSpecError, match=needle):
        llamacpp.parse_reference(spec)
    suite = write_suite(tmp_path / "s.jsonl", TINY)
    r = run_app("bench", "--suite", str(suite), "--reference", spec, "--out", str(tmp_path / "o"),
                "--target", "no-such-model.gguf", timeout=60)
    assert r.returncode == 1 and needle in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_missing_program_runs_the_rest_and_says_how_to_build(tmp_path):
    suite = write_suite(tmp_path / "s.jsonl", TINY[:1])
    r = run_app("bench", "--suite", str(suite), "--reference", "llama.cpp:ngram-simple", "--no-reference",
                "--max-tokens", "12", "--repeats", "1", "--threads", "1", "--out", str(tmp_path / "o"),
                timeout=300, env={"EDGESPEC_LLAMA_SPECULATIVE": str(tmp_path / "nowhere" / "llama-speculative-simple")})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "llama.cpp reference skipped" in r.stderr and llamacpp.BUILD_HINT in r.stderr
    res = json.loads((tmp_path / "o" / "results.json").read_text())
    assert [c["kind"] for c in res["meta"]["configs"]] == ["baseline", "ours"]


@pytest.mark.slow
@needs_binary
def test_program_copies_with_accepted_drafts_on_our_prompt_tokens(gemma):
    """The program gets our exact prompt tokens (it reports their count; `generate` checks it)
    and copies the paragraph."""
    toks = frame(gemma, Request(text=f"Repeat this paragraph word for word.\n\n{ARTICLE}\n\n{ARTICLE}\n\n",
                                framing="raw")).tokens
    spec = llamacpp.LlamaCppSpeculative(BINARY, gemma, "ngram-simple")
    run = spec.generate(toks, 40)
    # n_predict may pass -n: with Gemma 3's sliding-window cache the program verifies through
    # checkpoints and finishes a restored draft before it checks the limit (its own counters of
    # drafted/accepted tokens skip those steps, so they are not asserted on)
    assert run.n_predict >= 40 and run.decode_s > 0
    assert run.text.strip().startswith(ARTICLE[:60])  # it copies the paragraph
    bad = toks[1:]  # no BOS: the program would add one, so the tokens would differ
    with pytest.raises(EdgeSpecError, match="start with the model's BOS"):
        spec.generate(bad, 4)


@pytest.mark.slow
@needs_binary
def test_bench_puts_llama_cpp_rows_beside_ours(tmp_path):
    suite = write_suite(tmp_path / "s.jsonl", TINY[:1])
    out = tmp_path / "o"
    r = run_app("bench", "--suite", str(suite), "--target", "gemma3-270m", "--reference", "llama.cpp:ngram-simple,ngram-mod",
                "--no-reference", "--max-tokens", "24", "--repeats", "1", "--out", str(out), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    kinds = {c["name"]: c["kind"] for c in res["meta"]["configs"]}
    assert kinds["llama.cpp ngram-simple"] == "llama.cpp" and kinds["llama.cpp ngram-mod"] == "llama.cpp"
    p = res["prompts"][0]["results"]
    base = p["baseline"]
    for name in ("llama.cpp ngram-simple", "llama.cpp ngram-mod"):
        e = p[name]
        assert e["tokens_per_s"] > 0 and e["speedup"] == pytest.approx(e["tokens_per_s"] / base["tokens_per_s"])
        assert isinstance(e["identical"], bool)
        # the baseline stops at the limit or at the qa frame's next "Question:" (the program has no
        # such stop, and may run a little past the limit)
        assert 1 <= base["generated"] <= 24 and e["identical"] == e["text"].startswith(base["text"])
    vs = res["versus_llamacpp"]
    assert len(vs) == 1 and vs[0]["best_reference"] in ("llama.cpp ngram-simple", "llama.cpp ngram-mod")
    best = p[vs[0]["best_reference"]]["tokens_per_s"]
    assert vs[0]["ratio"] == pytest.approx(p[vs[0]["config"]]["tokens_per_s"] / best)
    report = (out / "report.md").read_text()
    assert "## EdgeSpec vs llama.cpp's own speculation" in report and "ngram-mod" in report
    assert "EdgeSpec vs best llama.cpp type" in r.stdout


@pytest.mark.slow
@needs_binary
def test_draft_model_mode_runs_with_the_draft_beside_the_target(smollm2):
    """--spec-type draft-simple with -md: SmolLM2 drafting for itself is accepted nearly always, and
    its greedy text is the target's own."""
    toks = frame(smollm2, Request(text="List the days of the week.", framing="chat")).tokens
    plain = llamacpp.LlamaCppSpeculative(BINARY, smollm2, "ngram-simple").generate(toks, 24)
    spec = llamacpp.LlamaCppSpeculative(BINARY, smollm2, "draft-simple/4/1/0.0", draft_model=smollm2.path)
    run = spec.generate(toks, 24)
    assert run.n_drafted > 0 and run.n_accept >= 0.8 * run.n_drafted
    assert run.text[:40] == plain.text[:40]
    with pytest.raises(EdgeSpecError, match="needs a draft model"):
        llamacpp.LlamaCppSpeculative(BINARY, smollm2, "draft-simple")
