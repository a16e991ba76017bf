"""Edges a new user meets on the command line, run as a user runs it: `python app.py ...`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, run_app

HI = ("--headless", "--prompt", "hi", "--max-tokens", "12", "--draft", "none", "--json")


def test_stop_string_inside_a_token_keeps_the_text_before_it():
    """`--stop llo` on "Hello! ..." answers "He", not "" (the token "Hello" is cut, not dropped): the
    answer is the text up to the stop string's first character, as llama-server and OpenAI's API give it."""
    full = json.loads(run_app(*HI).stdout)
    assert full["text"].startswith("Hello"), full["text"]  # the bundled SmolLM2's greeting
    cut = json.loads(run_app(*HI, "--stop", "llo").stdout)
    assert cut["text"] == "He" and cut["finish_reason"] == "stop"
    assert cut["tokens"] == full["tokens"][:1] and cut["stats"]["generated"] == 1


def test_a_prompt_without_headless_answers_in_the_terminal():
    """`app.py --prompt hi` (no --headless) answers in the terminal: a prompt asks for an answer, not the UI."""
    res = run_app("--prompt", "hi", "--max-tokens", "4", "--draft", "none", timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() and "tok/s" in res.stderr


def test_output_into_a_closed_pipe_ends_quietly():
    """`app.py ... | head -c 20` ends like a Unix tool killed by SIGPIPE: status 141, no
    BrokenPipeError traceback, nothing on stderr but what came before."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "app.py"), "--headless", "--draft", "none", "--prompt",
         "Write a long story about a dragon.", "--max-tokens", "200"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ),
    )
    head = proc.stdout.read(20)
    proc.stdout.close()  # what `head -c 20` does once it has its bytes
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert len(head) == 20 and "Traceback" not in err and "BrokenPipe" not in err and "Exception" not in err, err


def test_more_threads_than_cores_is_refused_at_once():
    cores = len(os.sched_getaffinity(0))
    res = run_app("--headless", "--prompt", "hi", "--threads", str(cores + 998), timeout=60)
    err = res.stderr.strip()
    assert res.returncode == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"at most {cores}" in err


def test_measuring_the_cost_profile_says_so(tmp_path):
    """The first use of a set-up measures the cost profile (seconds to minutes) before any text: a
    line on stderr says so (from the session's progress hook,
    not a print inside the library). Resuming an interrupted measurement: tests/test_costs.py."""
    env = {"EDGESPEC_PROFILES": str(tmp_path)}
    first = run_app("--headless", "--prompt", "hi", "--max-tokens", "2", env=env)
    assert first.returncode == 0, first.stderr
    assert "measuring the pass costs of SmolLM2" in first.stderr and list(tmp_path.glob("*.json"))
    again = run_app("--headless", "--prompt", "hi", "--max-tokens", "2", env=env)
    assert again.returncode == 0 and "measuring" not in again.stderr, again.stderr


@pytest.mark.parametrize("args, wants, not_wanted", [
    # a bare name that is no model may be a mistyped drafter: both lists
    (["--draft", "bogus"], ["unknown drafter 'bogus'", "none, ngram, model:..., learned:...", "smollm2-135m"], []),
    (["--draft", "foo:bar"], ["unknown drafter 'foo:bar'", "ngram", "learned:..."], []),
    (["--ctx", "100000000"], ["lower --ctx", "trained for 8192 tokens"], []),
    (["--temperature", "inf"], ["finite"], ["must be >= 0"]),
])
def test_unclear_errors_say_what_to_do(args, wants, not_wanted):
    res = run_app("--headless", "--prompt", "hi", *args, timeout=120)
    err = res.stderr.strip()
    assert res.returncode == 1 and len(err.splitlines()) == 1 and err.startswith("error:"), err
    for want in wants:
        assert want in err, (want, err)
    for unwanted in not_wanted:
        assert unwanted not in err, err


def test_an_empty_folder_as_drafter_says_what_it_lacks(tmp_path):
    """README takes a learned drafter's folder for --draft; an empty folder is refused for what it
    lacks (no manifest.json), not as 'not a file'."""
    res = run_app("--headless", "--prompt", "hi", "--draft", str(tmp_path), timeout=120)
    err = res.stderr.strip()
    assert res.returncode == 1 and len(err.splitlines()) == 1, err
    assert "no manifest.json" in err and "not a file" not in err


def test_a_base_model_says_so_once_and_qa_framing_stops_at_the_next_question():
    """Gemma-3-270M is a base model: asked a question on the default framing it loops question and
    answer to the token limit. It says so once; in qa framing the reply ends at the next "Question:"."""
    q = ("--headless", "--target", "gemma3-270m", "--prompt", "What is the capital of France?", "--max-tokens", "48",
         "--draft", "none")
    raw = run_app(*q)
    assert raw.returncode == 0, raw.stderr
    assert raw.stderr.count("is a base model (no chat template") == 1 and "--framing qa" in raw.stderr
    qa = run_app(*q, "--framing", "qa", "--json")
    out = json.loads(qa.stdout)
    assert out["finish_reason"] == "stop" and "Question" not in out["text"] and "Paris" in out["text"], out["text"]
    assert "base model" not in qa.stderr  # the user chose the framing


def test_a_base_model_chat_says_so_once(tmp_path):
    chat = tmp_path / "chat.jsonl"
    chat.write_text('"Hi there."\n"What is the capital of France?"\n')
    res = run_app("--headless", "--target", "gemma3-270m", "--chat-file", str(chat), "--max-tokens", "8",
                  "--draft", "none")
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("is a base model (no chat template") == 1 and "User:/Assistant: transcript" in res.stderr
