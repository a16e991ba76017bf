"""Edges of the fourth sweep (issue 44) on the command line, models, cost profiles and environment
variables, run as a user runs them: `python app.py ...` and `python -m edgespec.models ...` as real
processes on the bundled SmolLM2. Bad input is one line and a non-zero status, never a traceback."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.runtime import env
from edgespec.runtime.errors import EdgeSpecError
from tests.conftest import ROOT, run_app
from tests.test_user_defects_3 import HI, MODEL, one_line_error


def shell(command: str, extra_env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `command` in bash from the project's folder (for redirections: >&-, 2>&-, > /dev/full, pipes)."""
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, **(extra_env or {})})


PY = f"'{sys.executable}'"
APP = f"{PY} app.py"


# ----------------------------------------------------------------------------- 9: cost profiles on load
@pytest.mark.parametrize("pass_s", [
    {1: 0.0, 2: 0.02},  # a ZeroDivisionError in draft_cost
    {1: math.nan, 2: 0.02},
    {1: math.inf, 2: 0.02},
    {1: -0.01, 2: 0.02},
    {1: 1e300, 2: 1e-9},  # "predicted 11.87x"
    {1: 0.01, 2: 0.5},  # one pass over 2 rows dearer than 50 single ones
])
def test_an_invalid_stored_profile_is_measured_again(smollm2, pass_s, capfd):
    """A stored profile with a zero, NaN, infinite, negative or implausible T(K) is not planned with:
    it is measured again (and stored valid), with one line saying why."""
    from edgespec.core.costs import CostModel
    from edgespec.runtime import profiles

    path = profiles.profile_path(smollm2)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pass_s": {str(k): v for k, v in pass_s.items()}, "max_rows": None}))
    profiles._loaded.pop(smollm2, None)
    cost = CostModel.for_target(smollm2, 0.001, gamma_max=2)
    assert all(math.isfinite(cost.seconds(k)) and 0 < cost.seconds(k) < 1 for k in (1, 2, 3))
    assert 0 < cost.c < math.inf
    stored = json.loads(path.read_text())["pass_s"]
    assert profiles.invalid({int(k): v for k, v in stored.items()}) is None
    err = capfd.readouterr().err
    assert f"the stored cost profile {path.name} is invalid" in err and "measuring it again" in err


def test_profile_validation_names_what_is_wrong():
    from edgespec.runtime.profiles import invalid

    assert invalid({1: 0.010, 2: 0.013, 3: 0.018, 24: 0.09}) is None
    assert invalid({}) is None  # nothing measured yet (an interrupted measurement)
    assert "T(1) = 0.0 s" in invalid({1: 0.0, 2: 0.01})
    assert "T(2) = nan s" in invalid({1: 0.01, 2: math.nan})
    assert "below T(1)" in invalid({1: 1.0, 2: 1e-9})


# ----------------------------------------------------------------------------- 10, 12: standard streams
def test_closed_stdout_is_refused_before_anything_loads():
    """`app.py --prompt ... >&-` and `--json >&-` were an AttributeError and a silent exit 0."""
    for extra in ("", "--json"):
        res = shell(f"{APP} {' '.join(HI)} {extra} >&-", timeout=60)
        one_line_error(res, "standard output is closed")


def test_a_full_stdout_is_one_line_and_status_1():
    """`> /dev/full`: an OSError traceback before."""
    res = shell(f"{APP} {' '.join(HI)} > /dev/full")
    one_line_error(res, "cannot write to standard output: No space left on device")
    res = shell(f"{APP} {' '.join(HI)} --json > /dev/full")
    one_line_error(res, "cannot write to standard output")


def test_a_closed_stderr_still_answers_on_stdout():
    """`2>&-`: exit 1 with no output at all before; now the answer on stdout and status 0, and nothing
    meant for stderr lands in stdout."""
    res = shell(f"{APP} {' '.join(HI)} --json 2>&-")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["tokens"]


def test_models_info_into_a_closed_pipe_ends_quietly():
    """`python -m edgespec.models info smollm2-135m | head -1`: a BrokenPipeError traceback before."""
    res = shell(f"{PY} -m edgespec.models info {MODEL} | head -1; exit ${{PIPESTATUS[0]}}", timeout=60)
    assert res.returncode == 141, res.stderr
    assert res.stdout.startswith("path:") and len(res.stdout.splitlines()) == 1
    assert res.stderr == ""
    full = shell(f"{PY} -m edgespec.models info {MODEL} > /dev/full", timeout=60)
    one_line_error(full, "cannot write to standard output")


# ----------------------------------------------------------------------------- 11, 24, 25: model names
def test_a_model_name_too_long_for_a_file_is_one_line():
    long = "a" * 300
    one_line_error(run_app("models", "info", long, timeout=60), "model name too long")
    one_line_error(run_app("--headless", "--prompt", "hi", "--target", long, timeout=60), "model name too long")
    one_line_error(run_app("--headless", "--prompt", "hi", "--draft", long + ".gguf", timeout=120),
                   "model name too long")


def test_a_set_named_as_a_model_says_what_it_is():
    """`models info coder-pair` was "unknown model 'coder-pair'; did you mean coder-pair?"."""
    want = ("coder-pair is a set of models", "models install coder-pair",
            "--target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b")
    one_line_error(run_app("models", "info", "coder-pair", timeout=60), *want)
    one_line_error(run_app("--headless", "--prompt", "hi", "--target", "coder-pair", timeout=60), *want)


def test_every_name_models_list_shows_is_one_models_info_and_target_take():
    """The derived target was listed as SmolLM2-135M-Instruct.Q8_0-from-Q4_1.gguf, a name --target and
    `models info` rejected."""
    from edgespec.models import resolve_local
    from edgespec.models.derive import derive_pair

    derived, _ = derive_pair()
    listing = run_app("models", "list", timeout=120)
    assert listing.returncode == 0, listing.stderr
    installed = listing.stdout.split("Installed:\n", 1)[1].split("\nPairs", 1)[0]
    names = [line.split()[0] for line in installed.splitlines() if line.strip() and line.strip() != "(none)"]
    assert derived.name in names
    for name in names:
        path = resolve_local(name)
        assert path is not None and path.is_file(), name
    info = run_app("models", "info", derived.name, "--json", timeout=120)
    assert info.returncode == 0, info.stderr
    assert Path(json.loads(info.stdout)["path"]) == derived


# ----------------------------------------------------------------------------- 16, 18, 22: environment
def test_an_empty_variable_is_an_unset_one(monkeypatch):
    """EDGESPEC_CACHE="" put profiles into ./profiles of the working directory; the set-up reads it as unset."""
    from edgespec.core.learned_format import store_dir
    from edgespec.models import pypi
    from edgespec.runtime import firstrun, profiles

    monkeypatch.setenv("EDGESPEC_CACHE", "")
    monkeypatch.delenv("EDGESPEC_PROFILES", raising=False)
    monkeypatch.delenv("EDGESPEC_DRAFTER_STORE", raising=False)
    home = Path.home() / ".cache" / "edgespec"
    assert profiles.profile_dir() == home / "profiles"
    assert firstrun.cache_dir() == pypi.cache_root() == home
    assert store_dir() == home / "drafters"
    for name in ("EDGESPEC_PROFILES", "EDGESPEC_GPU_LAYERS", "EDGESPEC_RPC_TIMEOUT", "EDGESPEC_KERNELS"):
        monkeypatch.setenv(name, " ")
    assert profiles.profile_dir() == home / "profiles"
    assert env.gpu_layers() is None and env.kernels() == "smallbatch"


def test_environment_variables_are_read_in_one_place():
    """Every EDGESPEC_* variable is read through edgespec.runtime.env (one rule: empty = unset)."""
    import re

    reads = re.compile(r"environ(\.get\(|\[)\s*[\"'](EDGESPEC_|GGML_CPU_SMALLBATCH)[A-Z_]*[\"']\s*[\],)](?!\s*=[^=])")
    found = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "edgespec").rglob("*.py") if p.name != "env.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if reads.search(line)]
    assert not found, found


@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("YES", True), ("on", True),
                                       ("0", False), ("false", False), ("No", False), ("off", False)])
def test_yes_no_variables_take_every_usual_spelling(monkeypatch, tmp_path, value, on):
    """EDGESPEC_RECALIBRATE=true|yes was silently ignored (only 1 worked): a stored profile is read
    only where it does not ask for a new measurement."""
    from edgespec.runtime.profiles import Profile

    stored = tmp_path / "profile.json"
    stored.write_text(json.dumps({"pass_s": {"1": 0.01, "2": 0.012}, "max_rows": None}))
    monkeypatch.setenv("EDGESPEC_RECALIBRATE", value)
    assert env.recalibrate() is on
    assert (Profile.read(stored) is None) is on
    monkeypatch.setenv("GGML_CPU_SMALLBATCH", value)
    assert env.smallbatch_switch() is on


@pytest.mark.parametrize("name, value, accepted", [
    ("EDGESPEC_KERNELS", "garbage", ("smallbatch", "stock")),
    ("EDGESPEC_KERNELS", "off", ("smallbatch", "stock")),
    ("EDGESPEC_RECALIBRATE", "maybe", ("true", "yes", "false")),
    ("GGML_CPU_SMALLBATCH", "sometimes", ("true", "off")),
    ("EDGESPEC_GPU_LAYERS", "all", ("whole number",)),
])
def test_an_unknown_value_is_one_line_naming_the_accepted_ones(name, value, accepted):
    res = run_app(*HI, env={name: value}, timeout=60)
    one_line_error(res, f"{name}={value!r}" if name != "EDGESPEC_GPU_LAYERS" else name, *accepted)


def test_the_small_batch_switch_is_a_yes_no_value_that_json_and_the_profile_follow(smollm2_path):
    """GGML_CPU_SMALLBATCH=true|yes turned the kernels off (C's atoi) while --json said "smallbatch" and
    the kernels' profile was used. Now it is written back as 1/0 for the C side, --json says which
    kernels compute, and the profile is keyed on it."""
    from edgespec.runtime import backend

    kernels = backend.kernels_dir()
    if env.kernels() == "stock" or kernels is None or not backend.cpu_modules(kernels):
        pytest.skip("no small-batch kernel modules here (the set-up says why)")
    child = ("import json, os, sys; from edgespec.runtime import llama as runtime, profiles; "
             f"m = runtime.Model({str(smollm2_path)!r}, n_ctx=256); "
             "print(json.dumps([runtime.backend_info().kernels, os.environ.get('GGML_CPU_SMALLBATCH'), "
             "profiles.profile_path(m).name]))")
    seen = {}
    for value in ("yes", "true", "off", "0", None):
        extra = {k: v for k, v in os.environ.items() if k not in ("GGML_CPU_SMALLBATCH", "EDGESPEC_KERNELS")}
        if value is not None:
            extra["GGML_CPU_SMALLBATCH"] = value
        res = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120, cwd=ROOT,
                             env=extra)
        assert res.returncode == 0, res.stderr[-2000:]
        seen[value] = json.loads(res.stdout.strip().splitlines()[-1])
    assert seen["yes"][:2] == seen["true"][:2] == ["smallbatch", "1"]
    assert seen["off"][:2] == seen["0"][:2] == ["stock", "0"]
    assert seen[None][0] == "smallbatch"
    assert seen["yes"][2] == seen[None][2] != seen["off"][2] == seen["0"][2]


# ----------------------------------------------------------------------------- 23: --draft NAME:ARG
def test_a_drafter_argument_is_never_ignored():
    from edgespec.core.drafters import split_spec

    for spec in ("ngram:3", "suffix:foo", "suffix:"):
        with pytest.raises(EdgeSpecError, match="takes no argument"):
            split_spec(spec)
    with pytest.raises(EdgeSpecError, match="lower case; did you mean ngram"):
        split_spec("NGRAM")
    with pytest.raises(EdgeSpecError, match="lower case; did you mean suffix:x"):
        split_spec("Suffix:x")
    assert split_spec("ngram") == ("ngram", "") and split_spec("model:smollm2-135m") == ("model", "smollm2-135m")
    one_line_error(run_app(*HI[:-2], "--draft", "ngram:3", timeout=120), "drafter 'ngram:3'", "takes no argument",
                   "--ngram MIN,MAX")
    one_line_error(run_app(*HI[:-2], "--draft", "Suffix", timeout=120), "did you mean suffix?")


# ----------------------------------------------------------------------------- 19, 27: distill --corpus
def test_distill_checks_its_corpus_before_it_collects(tmp_path):
    """Random bytes were accepted as training text; a missing corpus was noticed only after collection began."""
    noise = tmp_path / "noise.txt"
    noise.write_bytes(bytes(range(256)) * 12)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9 ".encode("latin-1") * 400)
    for corpus, want in ((noise, "is binary, not text"), (latin1, "is not UTF-8 text"),
                         (tmp_path / "missing", "no such file or folder")):
        res = run_app("distill", "--target", MODEL, "--corpus", str(corpus), "--budget-minutes", "0.1",
                      "--out", str(tmp_path / "d"), timeout=120)
        one_line_error(res, f"--corpus {corpus}", want)
    assert not (tmp_path / "d").exists()


# ----------------------------------------------------------------------------- 28, 33: bench
def test_bench_refuses_empty_out_and_suite_and_lists_every_shipped_suite():
    from edgespec.service.suites import shipped_suites

    one_line_error(run_app("bench", "--suite", "code_edit", "--out", "", timeout=60), "--out", "empty value",
                   code=2)
    one_line_error(run_app("bench", "--suite", "", "--out", "x", timeout=60), "--suite", "empty value", code=2)
    text = " ".join(run_app("bench", "--help", timeout=60).stdout.split())
    assert {"agent", "code_open", "code_edit", "spec_bench"} <= set(shipped_suites())
    for name in shipped_suites():
        assert name in text, name


# ----------------------------------------------------------------------------- 37: README
def test_readme_stays_under_400_lines_with_its_commands_and_layout():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 400
    assert "bash scripts/setup.sh && .venv/bin/python app.py" in readme
    assert "bash scripts/test.sh" in readme and "## Layout" in readme


def test_every_environment_variable_is_documented():
    text = (ROOT / "docs" / "environment.md").read_text(encoding="utf-8")
    assert [name for name in env.VARIABLES if f"`{name}`" not in text] == []
