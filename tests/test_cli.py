"""The headless CLI contract, run as a user runs it: `python app.py --headless ...`."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_app

CODE_PROMPT = "Add a docstring to this function:\n\ndef area(w, h):\n    return w * h\n\nAnswer:\n"


def test_json_output_contract():
    res = run_app("--headless", "--target", "gemma3-270m", "--draft", "ngram", "--gamma", "4",
                  "--prompt", CODE_PROMPT, "--max-tokens", "40", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert set(out) >= {"text", "tokens", "token_sources", "stats"}
    assert len(out["tokens"]) == len(out["token_sources"]) == 40
    assert set(out["token_sources"]) <= {"draft", "target", "bonus"}
    s = out["stats"]
    for key in ("tokens_per_s", "acceptance_rate", "mean_accepted", "target_calls", "drafted", "accepted", "wall_s"):
        assert key in s
    assert s["accepted"] == out["token_sources"].count("draft")
    assert s["target_calls"] < 40  # the n-gram drafter copied some of the code
    assert 0 < s["acceptance_rate"] <= 1 and s["tokens_per_s"] > 0


def test_baseline_and_streaming_text():
    res = run_app("--headless", "--draft", "none", "--chat", "--prompt", "What is 2+2? Answer with a number only.",
                  "--max-tokens", "20")
    assert res.returncode == 0, res.stderr
    assert "4" in res.stdout
    assert "tok/s" in res.stderr and "drafter none" in res.stderr


def test_seeded_sampling_is_reproducible():
    args = ("--headless", "--chat", "--prompt", "Tell me about cats.", "--max-tokens", "24",
            "--temperature", "0.8", "--top-p", "0.9", "--seed", "11", "--json")
    a, b = (json.loads(run_app(*args).stdout) for _ in range(2))
    assert a["tokens"] == b["tokens"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target", "/nonexistent/model.gguf", "--prompt", "hi"], "not found"),
        (["--target", "gemma-270", "--prompt", "hi"], "unknown model"),
        (["--prompt", ""], "empty"),
        (["--prompt", "hi", "--temperature", "-1"], "temperature"),
        (["--prompt", "hi", "--top-p", "0"], "top-p"),
        (["--prompt", "hi", "--top-p", "1.5"], "top-p"),
        (["--prompt", "hi", "--gamma", "-2"], "gamma"),
        (["--prompt", "hi", "--gamma", "lots"], "gamma"),
        (["--prompt", "word " * 400, "--ctx", "256"], "context holds"),
        (["--prompt", "hi", "--draft", "gemma3-270m"], "differ"),
        (["--prompt", "hi", "--max-tokens", "x"], "max-tokens"),
        ([], "--prompt"),
    ],
)
def test_bad_input_is_one_line(args, message):
    res = run_app("--headless", *args, timeout=120)
    assert res.returncode != 0
    err = res.stderr.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1 and err.startswith("error:"), err
    assert message in err


def test_bad_model_files(tmp_path, smollm2_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(smollm2_path.read_bytes()[:3_000_000])
    for path, message in ((junk, "not a GGUF"), (cut, "")):
        res = run_app("--headless", "--target", str(path), "--prompt", "hi")
        assert res.returncode != 0 and "Traceback" not in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and message in res.stderr
