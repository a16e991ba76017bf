"""Edges a new user meets, run as a user runs it: `python app.py ...`,
`serve` and the web UI as real processes on 127.0.0.1, on the bundled SmolLM2. Folders, files and
the UI process must survive every input; bad input is one line and a non-zero status, a 4xx in the
OpenAI error shape, or a message in the UI."""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from edgespec.core import learned_format as fmt
from edgespec.core.sampling import SamplingParams
from edgespec.models import bundled_path
from edgespec.runtime.errors import EdgeSpecError
from tests.conftest import ROOT, run_app
from tests.test_server import free_port, start_server

MODEL = "smollm2-135m"
HI = ("--headless", "--prompt", "hi", "--max-tokens", "4", "--draft", "none")


def one_line_error(res: subprocess.CompletedProcess, *wants: str, code: int = 1) -> str:
    """The command failed with status `code` and one line on stderr holding every one of `wants`."""
    err = res.stderr.strip()
    assert res.returncode == code, (res.returncode, res.stderr[-3000:])
    assert len(err.splitlines()) == 1 and err.startswith("error:"), err[-3000:]
    assert "Traceback" not in err and "GGML_ASSERT" not in res.stdout + res.stderr, err
    for want in wants:
        assert want in err, (want, err)
    return err


@pytest.fixture(scope="module")
def zero_blocks(tmp_path_factory) -> Path:
    """A copy of the bundled SmolLM2 whose llama.block_count says 0 (its tensors are those of 30 layers):
    llama.cpp aborts the whole process (GGML_ASSERT, status 134) on it."""
    data = bytearray(bundled_path(MODEL).read_bytes())
    at = data.find(b"llama.block_count") + len("llama.block_count") + 4  # the key, then its u32 value type
    assert struct.unpack("<I", data[at:at + 4]) == (30,)
    data[at:at + 4] = struct.pack("<I", 0)
    path = tmp_path_factory.mktemp("damaged") / "zeroblocks.gguf"
    path.write_bytes(data)
    return path


# ----------------------------------------------------------------------------- distill --out
def test_distill_refuses_a_folder_whose_manifest_is_not_a_drafters_and_leaves_it_as_it_was(tmp_path):
    """A folder with a manifest.json that is not a drafter's (a browser extension's) is refused, and
    left as it was: the same files, the same permissions."""
    ext = tmp_path / "ext"
    (ext / "icons").mkdir(parents=True)
    (ext / "manifest.json").write_text('{"manifest_version": 3}\n')
    (ext / "background.js").write_text("js\n")
    (ext / "icons" / "a.png").write_bytes(b"png")
    ext.chmod(0o755)
    before = sorted(str(p.relative_to(ext)) for p in ext.rglob("*"))
    res = run_app("distill", "--target", MODEL, "--budget-minutes", "0.2", "--out", str(ext), timeout=180)
    one_line_error(res, f"--out {ext.resolve()}", "is not an EdgeSpec learned drafter's; name a new folder")
    assert sorted(str(p.relative_to(ext)) for p in ext.rglob("*")) == before
    assert (ext / "background.js").read_text() == "js\n" and stat.S_IMODE(ext.stat().st_mode) == 0o755
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ext"]  # nothing set aside or left behind


def test_distill_export_replaces_only_its_own_files_and_new_folders_are_not_0700(tmp_path, capfd):
    """An older drafter's folder may hold the user's own notes: they stay, and so do its permissions;
    a new drafter folder gets the umask's permissions; onnxruntime's INFO lines stay out of stderr.
    (`distill.export` on a small trained model: the command's last step, without the minutes before it.)"""
    import numpy as np

    from edgespec.apps import distill
    rng = np.random.default_rng(0)
    n_embd, n_vocab = 32, 64
    seqs = [distill.Record(rng.integers(0, n_vocab, 24).astype(np.int32),
                           rng.standard_normal((24, n_embd)).astype(np.float16),
                           rng.integers(0, n_vocab, 24).astype(np.int32), "corpus", f"q{i}") for i in range(3)]
    table = rng.standard_normal((n_vocab, n_embd)).astype(np.float32)  # token embeddings and output rows
    subset = np.arange(16)
    trainer = distill.Trainer(distill.build_dataset(seqs), lambda ids: table[np.asarray(ids)], table[subset], 32, 0)
    trainer.step(np.arange(8), 1e-3)

    def manifest() -> fmt.Manifest:
        return fmt.Manifest(target={"architecture": "test"}, n_embd=n_embd, vocab_subset=[int(t) for t in subset])

    older = tmp_path / "older"
    older.mkdir()
    (older / fmt.MANIFEST).write_text(json.dumps({"format": fmt.FORMAT, "version": fmt.VERSION, "target": {}}))
    (older / fmt.ONNX_FILE).write_bytes(b"an older graph")
    (older / "NOTES.md").write_text("how I made it\n")
    older.chmod(0o750)
    distill.export(older, trainer, subset, manifest())
    assert (older / "NOTES.md").read_text() == "how I made it\n" and stat.S_IMODE(older.stat().st_mode) == 0o750
    assert fmt.Manifest.read(older).target == {"architecture": "test"}
    assert (older / fmt.ONNX_FILE).read_bytes() != b"an older graph"
    assert sorted(p.name for p in older.iterdir()) == sorted([fmt.MANIFEST, fmt.ONNX_FILE, "NOTES.md"])

    umask = os.umask(0)
    os.umask(umask)
    new = distill.export(tmp_path / "new", trainer, subset, manifest())
    assert stat.S_IMODE(new.stat().st_mode) == 0o777 & ~umask  # a folder like any other, not mkdtemp's 0700
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new", "older"]  # nothing set aside or left behind
    assert "[INFO]" not in capfd.readouterr().err


# ----------------------------------------------------------------------------- catalog paths
PYPI_ENTRY = {"role": "target", "repo": None, "quant": "Q4_K_M", "size_bytes": 10, "license": "test",
              "use": ["chat"], "pairs_with": [], "sha256": "0" * 64,
              "pypi": {"package": "nothing-here-part{n}", "version": "1.0", "parts": 1}}


@pytest.mark.parametrize("field, value", [("file", "../../victim.txt"), ("file", "/tmp/x.gguf"),
                                          ("name", "../../victim")])
def test_a_catalog_entry_that_leads_outside_the_store_is_refused_when_read(tmp_path, field, value):
    """A user catalog's entry whose file or name leads outside the store (`../../victim.txt`, an
    absolute path) is refused by `models remove`, `install` and `list`, and nothing outside is touched."""
    victim, victim_dir = tmp_path / "x" / "victim.txt", tmp_path / "x" / "victim"
    (victim_dir / "parts").mkdir(parents=True)
    victim.write_text("keep me\n")
    (victim_dir / "data").write_text("keep me too\n")
    entry = {**PYPI_ENTRY, "name": "trav", "file": "trav.gguf", field: value}
    catalog = tmp_path / "catalog.json"
    catalog.write_text(json.dumps({"models": [entry]}))
    env = {"EDGESPEC_CATALOG": str(catalog), "EDGESPEC_CACHE": str(tmp_path / "x" / "cache"), "HF_HUB_OFFLINE": "1"}
    for args in (("remove", entry["name"]), ("install", entry["name"]), ("list",)):
        res = run_app("models", *args, env=env, timeout=120)
        one_line_error(res, f"catalog entry {entry['name']!r} in {catalog}")
    assert victim.read_text() == "keep me\n" and (victim_dir / "data").read_text() == "keep me too\n"


# ----------------------------------------------------------------------------- a damaged GGUF
@pytest.mark.parametrize("args", [("--target", "{bad}"), ("--draft", "model:{bad}")])
def test_a_gguf_whose_layer_count_contradicts_its_tensors_is_one_line_not_an_abort(zero_blocks, args):
    args = tuple(a.format(bad=zero_blocks) for a in args)
    res = run_app("--headless", "--prompt", "hi", "--max-tokens", "4", *args, timeout=180)
    one_line_error(res, "damaged GGUF: zeroblocks.gguf says llama.block_count = 0",
                   "tensors are those of 30 layers")


def test_serve_refuses_a_damaged_gguf_in_one_line(zero_blocks):
    res = run_app("serve", "--port", str(free_port()), "--target", str(zero_blocks), "--draft", "none", timeout=180)
    one_line_error(res, "damaged GGUF: zeroblocks.gguf")


def test_models_info_does_not_call_a_damaged_gguf_a_compatible_draft(zero_blocks, tmp_path):
    repo = tmp_path / "hf" / "models--edgespec-test--damaged"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    snap = repo / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (snap / "zeroblocks.gguf").symlink_to(zero_blocks)
    env = {"HF_HUB_CACHE": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    res = run_app("models", "info", MODEL, "--json", env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert not any("zeroblocks" in d for d in info["drafts"] + info["drafts_for"]), info["drafts"]
    assert any("zeroblocks" in n and "damaged GGUF" in n for n in info["does_not_pair"]), info["does_not_pair"]
    one_line_error(run_app("models", "info", "hf:edgespec-test/damaged:zeroblocks.gguf", env=env, timeout=120),
                   "damaged GGUF")


@pytest.mark.slow
def test_the_web_ui_shows_a_damaged_gguf_as_an_error_and_keeps_running(zero_blocks):
    """Typed into the Target field, a GGUF that makes llama.cpp abort is an error in the UI, and the
    UI process keeps serving."""
    from gradio_client import Client

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "EDGESPEC_API_KEY"}
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port), "--target", MODEL],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the UI did not start"
            time.sleep(0.2)
        client = Client(f"http://127.0.0.1:{port}", verbose=False)
        status = client.predict(str(zero_blocks), "", api_name="/load_models")
        assert "es-error" in status and "damaged GGUF" in status, status
        # message, system, drafter, gamma, max tokens, temperature, top-k, top-p, min-p, seed, highlight, target, draft
        out = client.predict("hi", "", "none", "auto", 4, 0.0, 0, 1.0, 0.0, -1, True, str(zero_blocks), "",
                             api_name="/chat")
        assert "damaged GGUF" in out[-1], out[-1]
        out = client.predict("Say hi.", "", "none", "auto", 4, 0.0, 0, 1.0, 0.0, -1, True, MODEL, "", api_name="/chat")
        assert out[-1] == "" and out[2]["tokens"], out[-1]
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(timeout=30)


# ----------------------------------------------------------------------------- tracebacks
@pytest.mark.parametrize("flag", ["--prompt", "--system"])
def test_invalid_utf8_on_the_command_line_is_one_line(flag):
    bad = os.fsdecode(b"bad \xff")  # what Python makes of the bytes a shell passes
    args = ("--headless", "--max-tokens", "4", "--draft", "none", "--prompt", bad if flag == "--prompt" else "hi",
            *((flag, bad) if flag == "--system" else ()))
    one_line_error(run_app(*args, timeout=120), f"{flag} is not valid UTF-8 text (byte 0xff")


@pytest.mark.parametrize("args", [
    ("models", "info", "hf:a/b:c:d"),
    ("models", "pull", "hf:a/b:../x.gguf"),
    ("models", "install", "hf:a/b:.."),
    ("--headless", "--prompt", "hi", "--target", "hf:a/b:c:d"),
])
def test_hub_names_whose_file_part_leaves_the_repo_are_one_line(args):
    one_line_error(run_app(*args, env={"HF_HUB_OFFLINE": "1"}, timeout=120), "bad file name")


def test_a_hub_name_with_a_bad_file_is_an_error_in_the_ui_install_box(monkeypatch):
    from edgespec.models import install

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    with pytest.raises(EdgeSpecError, match="bad file name '../x.gguf'"):
        install("hf:a/b:../x.gguf")


@pytest.mark.parametrize("cache", ["file", "/proc/edgespec-cache"])
def test_an_unusable_edgespec_cache_is_one_line_for_models_install(tmp_path, cache):
    if cache == "file":
        cache = tmp_path / "file"
        cache.write_text("not a folder\n")
    res = run_app("models", "install", "qwen2.5-coder-0.5b", env={"EDGESPEC_CACHE": str(cache)}, timeout=120)
    one_line_error(res, "cannot make the model store", "set EDGESPEC_CACHE")


@pytest.mark.parametrize("out", ["file", "/proc/edgespec-derived"])
def test_models_derive_into_an_unusable_folder_is_one_line(tmp_path, out):
    if out == "file":
        out = tmp_path / "file"
        out.write_text("not a folder\n")
    one_line_error(run_app("models", "derive", "--out", str(out), timeout=120), "cannot make the folder",
                   "choose another --out")
    if isinstance(out, Path):
        assert out.read_text() == "not a folder\n"


def test_distill_with_an_endless_budget_is_one_line():
    one_line_error(run_app("distill", "--target", MODEL, "--budget-minutes", "inf", timeout=60),
                   "--budget-minutes must be a finite number of minutes")


def test_a_catalog_entry_with_a_size_that_is_no_number_is_refused_naming_it(tmp_path):
    catalog = tmp_path / "catalog.json"
    catalog.write_text(json.dumps({"models": [{**PYPI_ENTRY, "name": "big-one", "file": "big.gguf",
                                               "size_bytes": "big"}]}))
    one_line_error(run_app("models", "list", env={"EDGESPEC_CATALOG": str(catalog)}, timeout=120),
                   "catalog entry 'big-one'", "size_bytes must be a whole number of bytes, got 'big'")


# ----------------------------------------------------------------------------- the server
@pytest.fixture(scope="module")
def served():
    s = start_server("--target", MODEL, "--draft", "none", "--ctx", "512")
    yield s
    s.proc.kill()
    s.proc.wait(timeout=30)


def chat(served, **body) -> httpx.Response:
    return httpx.post(served.url + "/v1/chat/completions", timeout=120,
                      json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **body})


def openai_error(r: httpx.Response, status: int, *wants: str) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error", err
    for want in wants:
        assert want in err["message"], (want, err)
    return err


@pytest.mark.parametrize("fmt_", [{"type": "json_object"},
                                  {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}])
def test_serve_honours_a_json_response_format(served, fmt_):
    """A JSON response_format constrains the reply to JSON (tests/test_structured.py has the rest); a
    type it does not know is a 400 naming the field; type 'text' is served."""
    r = chat(served, response_format=fmt_)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].startswith("{")
    err = openai_error(chat(served, response_format={"type": "yaml"}), 400, "'yaml'")
    assert err["param"] == "response_format.type"
    assert chat(served, response_format={"type": "text"}).status_code == 200


def test_serve_seed_minus_one_is_random_and_seeds_beyond_64_bits_are_refused(served):
    texts = set()
    for _ in range(3):
        r = chat(served, seed=-1, temperature=1.5, max_tokens=12,
                 messages=[{"role": "user", "content": "Tell me a story about a cat."}])
        assert r.status_code == 200, r.text
        texts.add(r.json()["choices"][0]["message"]["content"])
    assert len(texts) > 1, texts  # seed -1: a new seed each request
    fixed = {chat(served, seed=7, temperature=1.5, max_tokens=12).json()["choices"][0]["message"]["content"]
             for _ in range(2)}
    assert len(fixed) == 1
    openai_error(chat(served, seed=2**64, temperature=1.0), 400, "seed must be below 2^64")


def test_serve_answers_a_lone_surrogate_with_400(served):
    raw = json.dumps({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi @ there"}]})
    raw = raw.replace("@", "\\ud800")  # JSON's escape for a lone surrogate, which json.dumps would not write
    r = httpx.post(served.url + "/v1/chat/completions", content=raw, timeout=60,
                   headers={"Content-Type": "application/json"})
    err = openai_error(r, 400, "lone UTF-16 surrogate")
    assert err["param"] == "messages.0.content"
    assert chat(served).status_code == 200  # and it serves on


def test_cli_seeds_minus_one_is_random_and_beyond_64_bits_is_one_line():
    assert SamplingParams(temperature=1.0, seed=-1).seed is None and SamplingParams(seed=-5).seed is None
    one_line_error(run_app(*HI, "--temperature", "1", "--seed", str(2**64), timeout=120), "seed must be below 2^64")


# ----------------------------------------------------------------------------- empty values, threads
@pytest.mark.parametrize("flag, want", [("--draft", "--draft none for plain decoding"),
                                        ("--rpc", "leave --rpc out to run on this machine"),
                                        ("--target", "leave --target out")])
def test_an_empty_value_is_refused_not_taken_for_the_default(flag, want):
    res = run_app("--headless", "--prompt", "hi", "--max-tokens", "4", flag, "", timeout=60)
    one_line_error(res, f"argument {flag}: empty value", want, code=2)


def test_quant_report_refuses_more_threads_than_cores_at_once(tmp_path):
    cores = len(os.sched_getaffinity(0))
    t0 = time.monotonic()
    res = run_app("quant", "report", "--reference", str(bundled_path(MODEL)), str(bundled_path(MODEL)),
                  "--prompts", str(ROOT / "edgespec" / "apps" / "quant" / "prompts.txt"), "--threads", str(cores + 97),
                  "--out", str(tmp_path / "r"), timeout=120)
    one_line_error(res, f"--threads must be at most {cores}")
    assert time.monotonic() - t0 < 30 and not list(tmp_path.iterdir())


# ----------------------------------------------------------------------------- no drafts, no speedup
def test_a_run_that_drafted_nothing_measures_1x():
    """A run that drafted nothing did plain decoding's work: 1.00x, whatever its step timings (one
    stalled step would put their mean far from their median)."""
    from edgespec.core.costs import CostModel
    from edgespec.core.stats import Stats
    from edgespec.service.session import Reply

    stalled = [0.01] * 9 + [0.5]  # one decode stalled by the machine
    st = Stats(generated=10, target_calls=10, wall_s=sum(stalled), plain_pass_s=stalled)
    assert Reply(stats=st, costs=CostModel({1: 0.01, 2: 0.02})).measured_speedup == 1.0


def test_the_bench_gives_a_configuration_that_drafted_nothing_1x():
    """A configuration that drafted nothing is 1.00x per prompt, per category and in the summary line
    ('drafted nothing'), even where its timing came out faster than the baseline's."""
    from edgespec.core.stats import Stats
    from edgespec.service.bench import runner as bench
    from edgespec.service.bench.report import summary_lines

    cfgs = [bench.Config(bench.BASELINE, "baseline"), bench.Config("ngram", "ours", "ngram", "auto")]
    rates = {bench.BASELINE: 50.0, "ngram": 86.0}  # the same work, timed while the machine was busier

    def run(cfg, text, tokens, max_tokens=None, stop=None, owner=""):
        return bench.Run([1, 2, 3], rates[cfg.name], Stats(generated=3, target_calls=4, wall_s=0.1))

    runner = SimpleNamespace(s=SimpleNamespace(repeats=1, greedy=True, max_tokens=3), configs=cfgs, run=run,
                             cost_models={}, target=SimpleNamespace(detokenize=lambda t: "abc"))
    row = bench.bench_prompt(runner, SimpleNamespace(id="p1", category="c", text="x"), [1], None)
    assert row["results"]["ngram"]["speedup"] == 1.0 and row["results"]["ngram"]["tokens_per_s"] == 86.0
    cats = bench.aggregate([row], [c.name for c in cfgs])
    assert cats["overall"]["ngram"]["speedup"] == 1.0
    res = {"categories": cats, "prompts": [row], "meta": {"configs": [vars(c) for c in cfgs]}}
    line = [ln for ln in summary_lines(res) if ln.startswith("ngram")][0]
    assert "1.00x" in line and "drafted nothing" in line, line


# ----------------------------------------------------------------------------- an unwritable cache
@pytest.mark.slow
def test_an_unwritable_profile_folder_is_said_once_and_not_measured_again_in_the_process(smollm2_path, tmp_path,
                                                                                         monkeypatch, capsys):
    from edgespec.apps.cli import profile_progress
    from edgespec.runtime import profiles
    from edgespec.runtime.llama import Model

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("EDGESPEC_PROFILES", str(blocked / "profiles"))
    show = profile_progress(str(smollm2_path))
    show(0.0)
    show(0.5)
    err = capsys.readouterr().err
    assert "kept for next time" not in err and "not kept" in err and err.count("cannot be written") == 1, err
    measured = []
    for _ in range(2):  # the UI's pool and the bench load a model again with the same set-up
        calls: list[float] = []
        model = Model(smollm2_path, n_ctx=1024, flash_attn="off")
        try:
            profiles.profile(model, rows=[1, 2], progress=calls.append)
        finally:
            model.close()
        measured.append(bool(calls))
    assert measured == [True, False], "measured again in the same process"


# ----------------------------------------------------------------------------- catalog names, context
def test_a_catalog_name_given_twice_is_refused_naming_it(tmp_path):
    catalog = tmp_path / "catalog.json"
    entry = {**PYPI_ENTRY, "name": "Gemma3-270M", "file": "g.gguf"}
    catalog.write_text(json.dumps({"models": [entry]}))
    one_line_error(run_app("models", "list", env={"EDGESPEC_CATALOG": str(catalog)}, timeout=120),
                   f"catalog entry 'Gemma3-270M' in {catalog} has the name of an entry in")


def test_a_context_beyond_the_trained_one_gets_a_note():
    res = run_app(*HI, "--ctx", "8704", timeout=180)
    assert res.returncode == 0, res.stderr
    assert "note: --ctx 8704 is more than the 8192 tokens SmolLM2-135M-Instruct.Q4_1.gguf was trained for" in res.stderr


# ----------------------------------------------------------------------------- the decline line
def test_the_decline_line_does_not_say_needs_when_the_best_would_pay():
    """When no draft was tried (1-token matches were estimated not to pay) though drafting would pay
    at the assumed alpha, the line says so, not 'needs 1.10x; declined' beside a best above 1.10x."""
    from edgespec.core.adaptive import AutoGamma
    from edgespec.core.costs import CostModel
    from edgespec.core.drafters import Hint

    policy = AutoGamma()
    policy.start(CostModel({k: 0.01 * (1 + 0.5 * (k - 1)) for k in (1, 2, 3, 5, 9, 17)}))
    for _ in range(40):
        policy.observe(policy.choose(Hint(1, copies=True)), 0)
    d = policy.decline()
    assert d is not None and not d["alpha_measured"] and d["best_speedup"] >= d["needs"]
    note = policy.fallback_note()
    assert "needs 1.10x; declined" not in note and "probing could not pay" not in note, note
    assert "alpha not measured (no draft tried; assumed 0.95)" in note
    assert note.endswith("yet the proposals of those steps were estimated below 1.10x; declined there")


# ----------------------------------------------------------------------------- --chat-file
@pytest.mark.parametrize("content, args, wants", [
    (None, (), ["chat file is a directory"]),
    ('"hi"\n{"role": "user", "content": "  "}\n', (), ["{file}:2: the user message is empty"]),
    ('"hi"\n{"role": "system", "content": "Be brief."}\n', (), ["{file}:2: a system message goes first, once"]),
    ('{"role": "system", "content": "Be brief."}\n"hi"\n', ("--system", "Be long."),
     ["{file}:1: a system message here and --system as well; give one of them"]),
])
def test_chat_file_mistakes_are_one_line_before_anything_is_generated(tmp_path, content, args, wants):
    path = tmp_path / "chat.jsonl"
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    res = run_app("--headless", "--chat-file", str(path), "--max-tokens", "4", "--draft", "none", *args, timeout=120)
    err = one_line_error(res, *(w.format(file=path) for w in wants))
    assert "or use --system" not in err and res.stdout == ""  # no turn was answered first


# ----------------------------------------------------------------------------- errors that name the right thing
@pytest.mark.parametrize("args, wants", [
    (("bench", "--suite", "/tmp", "--out", "{tmp}/b"), ["--suite /tmp is a folder", "spec_bench"]),
    (("models", "remove", ""), ["models remove needs a model name"]),
    (("distill", "--target", MODEL, "--max-new-tokens", "0"), ["--max-new-tokens must be >= 1"]),
    (("quant", "report", "--reference", "{model}", "{model}", "--prompts", "{prompts}", "--ppl-tokens", "0",
      "--out", "{tmp}/r"), ["--ppl-tokens must be >= 2"]),
    (("quant", "report", "--reference", "{model}", "{model}", "--prompts", "{prompts}", "--gamma", "-1",
      "--out", "{tmp}/r"), ["--gamma must be >= 1"]),
])
def test_errors_name_what_is_wrong_and_come_before_any_work(tmp_path, args, wants):
    subs = {"tmp": tmp_path, "model": bundled_path(MODEL), "prompts": ROOT / "edgespec" / "apps" / "quant" / "prompts.txt"}
    t0 = time.monotonic()
    res = run_app(*(a.format(**subs) for a in args), timeout=120)
    one_line_error(res, *wants)
    assert time.monotonic() - t0 < 30  # refused before any model is loaded
    assert not list(tmp_path.iterdir())


def test_prompt_file_dash_reads_stdin():
    res = subprocess.run([sys.executable, str(ROOT / "app.py"), "--headless", "--prompt-file", "-", "--max-tokens",
                          "4", "--draft", "none", "--json"], input="Say hi.", capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["tokens"]
    assert "note: --ctx" not in res.stderr  # the default context is within the trained one


# ----------------------------------------------------------------------------- RPC
def _rpc_built() -> bool:
    from edgespec.runtime import backend, rpc
    try:
        backend.rpc_module(rpc.llama_version())
        return True
    except EdgeSpecError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _rpc_built(), reason="llama.cpp's RPC backend is not built (scripts/setup.sh builds it)")
def test_rpc_timeout_holds_for_a_server_that_accepts_and_never_answers():
    sock = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        try:
            while True:
                held.append(sock.accept()[0])  # and never a byte back
        except OSError:
            return

    threading.Thread(target=accept, daemon=True).start()
    ep = f"127.0.0.1:{sock.getsockname()[1]}"
    try:
        t0 = time.monotonic()
        res = run_app(*HI, "--rpc", ep, env={"EDGESPEC_RPC_TIMEOUT": "5"}, timeout=120)
        took = time.monotonic() - t0
    finally:
        sock.close()
        for c in held:
            c.close()
    one_line_error(res, f"the RPC server at {ep} accepted the connection but did not answer within 5 s")
    assert took < 25, took


def test_rpc_help_says_fast_mode_only_and_exact_is_refused_in_one_line():
    helptext = " ".join(run_app("--help", timeout=60).stdout.split())
    assert "--exact cannot run over RPC" in helptext and "nearly tie" in helptext, helptext
    doc = " ".join((ROOT / "docs" / "rpc.md").read_text().split())
    assert "Same output, fast mode only." in doc and "`--exact` with `--rpc` is refused in one line" in doc
    one_line_error(run_app(*HI, "--rpc", "127.0.0.1:50052", "--exact", timeout=60), "--exact cannot run with --rpc")


# ----------------------------------------------------------------------------- cosmetic
def test_models_help_names_the_command_it_was_run_as():
    assert run_app("models", "--help", timeout=60).stdout.startswith("usage: python app.py models")
    assert run_app("quant", "--help", timeout=60).stdout.startswith("usage: python app.py quant")


def test_the_ui_sends_no_analytics_and_the_chat_tab_names_its_target():
    from edgespec.apps.ui import Defaults, build_app
    from edgespec.models.loader import RuntimeOptions

    blocks = build_app(RuntimeOptions(n_ctx=512), Defaults(target=MODEL))
    try:
        assert blocks.analytics_enabled is False and blocks.config["analytics_enabled"] is False
        lines = [b.value for b in blocks.blocks.values() if getattr(b, "elem_id", None) == "es-chat-target"]
        assert lines == [f"Target model: `{MODEL}` (change it in the Models tab)"], lines
    finally:
        blocks.close()


def test_stalls_that_hit_every_kind_of_step_do_not_read_as_a_slowdown():
    """In the web UI on 2 cores the browser's redraws stall some passes, plain and verifying alike.
    A run whose drafts were all rejected produced one token a step, as plain decoding does, and its
    steps were stalled as often as plain ones: it ran at plain decoding's rate, so it measures 1.00x.
    Taking the plain rate from the plain steps' median (the stalls left out) read about 0.6x here."""
    from edgespec.core.costs import CostModel
    from edgespec.core.stats import Stats
    from edgespec.service.session import Reply

    step = [0.01, 0.01, 0.01, 0.03, 0.01, 0.03]  # the same stall pattern for both kinds of step
    plain, verifying = step * 5, step * 5        # verifying one draft token costs a plain step here
    st = Stats(generated=60, target_calls=60, drafted=30, accepted=0, wall_s=sum(plain) + sum(verifying),
               plain_pass_s=plain)
    assert Reply(stats=st, costs=CostModel({1: 0.01, 2: 0.01})).measured_speedup == pytest.approx(1.0)
