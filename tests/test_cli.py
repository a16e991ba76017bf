"""The headless CLI contract, run as a user runs it: `python app.py --headless ...`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, run_app

CODE_PROMPT = "Add a docstring to this function:\n\ndef area(w, h):\n    return w * h\n\nAnswer:\n"


def test_json_output_contract():
    t0 = time.monotonic()
    res = run_app("--headless", "--target", "gemma3-270m", "--draft", "ngram", "--gamma", "4",
                  "--prompt", CODE_PROMPT, "--max-tokens", "40", "--json")
    elapsed = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert set(out) >= {"text", "tokens", "token_sources", "stats"}
    assert len(out["tokens"]) == len(out["token_sources"]) == 40
    src = out["token_sources"]
    assert set(src) <= {"draft", "target", "bonus"}
    s = out["stats"]
    # The counters, from the tokens' sources: every step ends in one token of the target's (its
    # correction after a rejection, its own token when nothing was drafted, or the bonus after a
    # draft accepted in full), and no step drafts past the token budget.
    drafts, steps = src.count("draft"), src.count("target") + src.count("bonus")
    hist = {int(k): n for k, n in s["drafted_hist"].items()}  # steps by the number of tokens drafted
    rejected = src.count("target") - hist.get(0, 0)  # target tokens of steps that drafted
    assert s["generated"] == 40 and s["target_calls"] == steps == sum(hist.values())
    assert s["accepted"] == drafts and s["rejections"] == rejected
    assert rejected >= sum(a == "draft" and b == "target" for a, b in zip(src, src[1:], strict=False))
    assert s["drafted"] == sum(k * n for k, n in hist.items()) and max(hist) <= 4
    assert s["acceptance_rate"] == pytest.approx(drafts / s["drafted"])
    assert s["alpha"] == pytest.approx(drafts / (drafts + rejected))
    assert s["mean_accepted"] == pytest.approx(drafts / steps) and s["tokens_per_call"] == pytest.approx(40 / steps)
    assert 0 < s["wall_s"] < elapsed and s["tokens_per_s"] >= 40 / elapsed  # timed inside the process
    assert s["alpha"] >= s["acceptance_rate"]  # drafts after a rejection are never tested
    assert out["finish_reason"] == "length" and out["framing"] == "raw"  # the bundled Gemma is a base model
    assert out["backend"]["cpu_variant"] and out["speedup"]["measured"] <= s["tokens_per_call"] + 1e-9
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
        (["--prompt", "hi", "--ctx", "64"], "context size"),
        (["--prompt", "hi", "--gamma", "1000"], "gamma 1000"),
        (["--prompt", "hi", "--exact", "--flash-attn", "on"], "flash attention"),
        (["--prompt", "hi", "--raw", "--system", "be brief"], "system message"),
        (["--target", "gemma3-270m", "--prompt", "hi", "--system", "be brief"], "system message"),
        (["--target", "gemma3-270m", "--prompt", "hi", "--chat"], "no chat template"),
        (["--prompt", "hi", "--draft", "model"], "needs a model"),
        (["--prompt", "hi", "--ngram", "3,1"], "n-gram"),
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


def test_default_command_on_the_default_model_prints_text():
    """SmolLM2 is an instruct model: without its chat template it ends at once and prints nothing.
    Framing auto uses the template, as llama.cpp's CLI turns on conversation mode."""
    res = run_app("--headless", "--prompt", "Explain speculative decoding in one paragraph.", "--max-tokens", "64")
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.split()) >= 10, res.stdout


def test_empty_output_says_why():
    """A generation that produces nothing says why instead of printing nothing and exiting 0."""
    args = ("--headless", "--target", "gemma3-270m", "--prompt", "Hello", "--max-tokens", "4")
    first = json.loads(run_app(*args, "--json").stdout)["text"]
    assert first
    res = run_app(*args, "--stop", first[0])  # stops before the first character it would print
    assert res.returncode == 0 and res.stdout.strip() == ""
    assert "no text" in res.stderr and "stop string" in res.stderr


def test_stop_strings_end_the_reply_before_them():
    args = ("--headless", "--target", "gemma3-270m", "--prompt", "1, 2, 3, 4, 5, 6, 7,", "--max-tokens", "40", "--json")
    full = json.loads(run_app(*args).stdout)
    assert " 10" in full["text"], full["text"]
    cut = json.loads(run_app(*args, "--stop", " 10").stdout)
    assert cut["finish_reason"] == "stop" and " 10" not in cut["text"]
    assert full["text"].startswith(cut["text"]) and len(cut["tokens"]) == len(cut["token_sources"])


def test_plugin_drafter_is_one_file_and_appears_in_the_cli():
    env = {"EDGESPEC_DRAFTERS": "tests.drafter_plugin"}
    res = run_app("--help", env=env)
    assert "repeat" in res.stdout
    res = run_app("--headless", "--target", "gemma3-270m", "--draft", "repeat", "--gamma", "2", "--prompt",
                  "a a a a a a a a a a a a", "--max-tokens", "12", "--json", env=env)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["draft"] == "repeat" and out["stats"]["drafted"] > 0


@pytest.mark.parametrize("args, message", [
    (["--port", "99999"], "between 1 and 65535"),
    (["--host", "999.1.1.1"], "--host"),
])
def test_bad_ui_address_is_one_line(args, message):
    res = run_app(*args, timeout=120)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and message in res.stderr


def test_port_in_use_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = run_app("--port", str(port), timeout=120)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and f":{port}" in res.stderr


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.5, 1.0, 1.5, 3.0, 6.0])
def test_ctrl_c_exits_130_at_every_stage(delay):
    """Whatever Ctrl-C lands in (start-up, model load, generation), the command ends at once with
    status 130 and no traceback, during model load too (while llama.cpp's log callback is installed)."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "app.py"), "--headless", "--target", "gemma3-270m", "--prompt",
         "Once upon a time", "--max-tokens", "4000", "--ctx", "8192"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
        # as from a terminal: the test runner may itself run with SIGINT ignored (a background job)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(delay)
    t = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 130, (delay, err[-500:])
    assert time.perf_counter() - t < 10
    assert "Traceback" not in err and "Exception ignored" not in err, err
