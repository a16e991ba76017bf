"""Issue 44's findings in `serve` and the web UI, each on the real parts: `serve` as a subprocess on
127.0.0.1 with the bundled SmolLM2, the app in-process through gradio_client, the race generator
on a real pool, Chromium for the chat's buttons."""

from __future__ import annotations

import gzip
import json
import math
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from edgespec.apps.server.protocol import Envelope, sse, summary
from edgespec.core.costs import CostModel
from edgespec.core.sampling import SamplingParams, penalize
from edgespec.service.session import Reply
from tests.conftest import ROOT
from tests.test_server import Served, error_of, free_port, start_server, stop_server
from tests.test_user_defects_server import env_without_key, stop

MODEL = "smollm2-135m"
KEY = "clé-secrète"  # non-ASCII: curl sends its UTF-8 bytes
KEYS = f"{KEY},plain-key"


def auth(key: str = KEY) -> dict[str, bytes]:
    return {"Authorization": f"Bearer {key}".encode()}


def post(served: Served, path: str, body: dict | bytes, key: str = KEY, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(served.url + path, content=content, timeout=120,
                      headers={**auth(key), "Content-Type": "application/json", **headers})


def strict_json(text: str) -> dict:
    """JSON as the OpenAI JS client and jq read it: NaN and Infinity are errors."""
    def reject(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=reject)


@pytest.fixture(scope="module")
def server():
    served = start_server("--target", MODEL, "--draft", "none", "--ctx", "1024", "--flash-attn", "off",
                          "--api-key", KEYS)
    yield served
    stop_server(served)


# ----------------------------------------------------------------------------- 31, 32, 21
def test_models_shows_n_ctx_before_any_generation(server):
    r = httpx.get(server.url + "/v1/models", headers=auth(), timeout=10)
    assert r.status_code == 200 and server.health()["generations"] == 0
    assert r.json()["data"][0]["meta"]["n_ctx"] == 1024


def test_head_health_is_200(server):
    r = httpx.head(server.url + "/health", timeout=10)
    assert r.status_code == 200 and r.content == b""


def test_a_non_ascii_key_is_compared_as_the_bytes_the_client_sends(server):
    assert httpx.get(server.url + "/v1/models", headers=auth(), timeout=10).status_code == 200
    assert httpx.get(server.url + "/v1/models", headers=auth("plain-key"), timeout=10).status_code == 200
    assert httpx.get(server.url + "/v1/models", headers=auth("cle-secrete"), timeout=10).status_code == 401


# ----------------------------------------------------------------------------- 13, 29, 26
def test_a_deeply_nested_body_is_a_400(server):
    for raw in (b"[" * 100_000, b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"):
        err = error_of(r := post(server, "/v1/chat/completions", raw))
        assert r.status_code == 400 and "levels deep" in err["message"], err


def test_a_compressed_body_is_a_415(server):
    body = gzip.compress(json.dumps({"messages": [{"role": "user", "content": "Hi"}]}).encode())
    for headers in ({"Content-Encoding": "gzip"}, {}):
        r = post(server, "/v1/chat/completions", body, **headers)
        err = error_of(r)
        assert r.status_code == 415 and "not supported" in err["message"] and "utf-8" not in err["message"], err
    r = post(server, "/v1/chat/completions", b'{"messages": []}', **{"Content-Encoding": "br"})
    assert r.status_code == 415 and "Content-Encoding 'br'" in error_of(r)["message"]


def test_errors_name_the_field_not_pydantic_union_members(server):
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]})
    err = error_of(r)
    assert r.status_code == 400 and err["param"] == "messages.0.content", err
    assert err["message"] == "messages.0.content: must be a string or a list of content parts", err
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": [{"text": "hi"}]}]})
    err = error_of(r)
    assert err["param"] == "messages.0.content.0.type" and "list[" not in err["message"], err
    r = post(server, "/v1/completions", {"prompt": {"a": 1}})
    err = error_of(r)
    assert err["param"] == "prompt" and ".str" not in err["message"] and "token ids" in err["message"], err


def test_token_id_prompts_are_served_like_their_text(server, smollm2):
    text = "The capital of France is"
    ids = smollm2.tokenize(text, add_special=True)
    common = {"max_tokens": 8, "temperature": 0, "draft": "none"}
    by_text = post(server, "/v1/completions", {"prompt": text, **common}).json()
    for prompt in (ids, [ids]):
        by_ids = post(server, "/v1/completions", {"prompt": prompt, **common}).json()
        assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]
        assert by_ids["usage"]["prompt_tokens"] == len(ids)
    r = post(server, "/v1/completions", {"prompt": [1, 2, 10**9], **common})
    assert r.status_code == 400 and "token id 1000000000 is not in" in error_of(r)["message"]
    r = post(server, "/v1/completions", {"prompt": [[1, 2], [3]], **common})
    assert r.status_code == 400 and "one prompt per request" in error_of(r)["message"]


# ----------------------------------------------------------------------------- 43
def test_a_last_assistant_message_is_continued(server, smollm2):
    user = {"role": "user", "content": "Count from 1 to 10, separated by commas."}
    started = "1, 2, 3, 4,"
    body = {"messages": [user, {"role": "assistant", "content": started}], "max_tokens": 12, "temperature": 0}
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["choices"][0]["message"]["content"].lstrip().startswith("5"), out["choices"][0]
    rendered = smollm2.apply_chat_template([user]) + started  # no end of turn after the started answer
    assert out["usage"]["prompt_tokens"] == len(smollm2.tokenize(rendered, add_special=False, parse_special=True))


def test_a_later_system_message_says_what_is_allowed(server):
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
            {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Bye"}]
    r = post(server, "/v1/chat/completions", {"messages": msgs})
    err = error_of(r)
    assert r.status_code == 400 and err["param"] == "messages.2.role", err
    assert "may only open the conversation" in err["message"] and "put it first" in err["message"], err


# ----------------------------------------------------------------------------- 40
def test_repetition_penalties_are_honoured(server):
    body = {"prompt": "cat cat cat cat cat cat cat cat cat cat cat cat", "max_tokens": 12, "temperature": 0,
            "draft": "none"}
    plain = post(server, "/v1/completions", body).json()["choices"][0]["text"]
    for extra in ({"repeat_penalty": 1.5}, {"frequency_penalty": 1.0}, {"presence_penalty": 1.5}):
        r = post(server, "/v1/completions", {**body, **extra})
        assert r.status_code == 200, (extra, r.text)
        text = r.json()["choices"][0]["text"]
        assert text != plain, (extra, plain, text)  # the exact arithmetic: the test below
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "frequency_penalty": 3})
    assert r.status_code == 400 and error_of(r)["param"] == "frequency_penalty"


def test_each_verified_row_is_penalised_given_the_tokens_before_it():
    """Lossless speculation with penalties: row i of one pass over [x, d1..dk] gets exactly the
    penalties a plain step would give it after context + d1..d(i-1)."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 50)).astype(np.float32)
    context, draft = [3, 7, 7, 9, 3, 1], [7, 2, 2, 9]
    params = SamplingParams(repeat_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2, penalty_last_n=6)
    rows = penalize(logits, context, draft, params)
    for i in range(5):
        alone = penalize(logits[i:i + 1], context + draft[:i], [], params)
        assert np.array_equal(rows[i], alone[0])
    seen = context + draft[:2]
    window = seen[-6:]
    tok = 7
    x = float(logits[2, tok])
    x = x * 1.3 if x <= 0 else x / 1.3
    assert rows[2, tok] == pytest.approx(x - window.count(tok) * 0.4 - 0.2)
    assert rows[2, 40] == logits[2, 40]  # never seen: untouched
    assert penalize(logits, context, draft, SamplingParams()) is logits


# ----------------------------------------------------------------------------- 41, 17
def test_prompt_rate_only_where_the_prefill_decoded_enough_tokens(server):
    body = {"messages": [{"role": "user", "content": "Name three rivers in Europe and say where each one flows."}],
            "max_tokens": 4, "temperature": 0}
    first = post(server, "/v1/chat/completions", body).json()["timings"]
    again = post(server, "/v1/chat/completions", body).json()["timings"]
    if first["prompt_n"] > 8:  # not all cached from an earlier test
        assert first["prompt_per_second"] > 0 and first["prompt_per_token_ms"] > 0
    assert again["prompt_n"] == 1 and again["prompt_per_second"] is None and again["prompt_per_token_ms"] is None


def nan_reply() -> Reply:
    """A finished reply whose cost model holds non-finite figures. A stored profile with them is now refused on
    load (CostModel validates), so the table is corrupted after construction: the output must stay valid JSON
    whatever figure reaches it."""
    costs = CostModel({1: 0.01, 2: 0.012})
    costs._table[:] = math.nan
    costs._table[2] = math.inf
    reply = Reply(text="x", tokens=[1], sources=["target"], pieces=["x"], drafted_by=[""], finish_reason="eog",
                  costs=costs, drafter="ngram", gamma="auto")
    reply.stats.target_calls = 1
    reply.stats.drafted = 2
    reply.stats.accepted = 1
    reply.stats.drafted_hist[2] = 1
    return reply


def test_non_finite_figures_never_reach_json():
    reply = nan_reply()
    s = summary(reply)
    assert s["timings"]["speedup_predicted"] is None
    env = Envelope.new("chat", MODEL)
    for event in (sse(env.final_chunk(s)), sse(env.completion(s)), sse(env.usage_chunk(s))):
        strict_json(event[len("data: "):])
    out = reply.to_dict()  # what --json prints
    assert out["speedup"]["predicted"] is None
    strict_json(json.dumps(out))


# ----------------------------------------------------------------------------- 42, 14
def test_one_log_line_per_request_and_two_ctrl_c_exit_quietly():
    served = start_server("--target", MODEL, "--draft", "none", "--ctx", "512", "--flash-attn", "off")
    try:
        r = httpx.post(served.url + "/v1/chat/completions", timeout=120,
                       json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 5})
        assert r.status_code == 200
        with httpx.stream("POST", served.url + "/v1/completions", timeout=120,
                          json={"prompt": "One, two,", "max_tokens": 5, "stream": True}) as s:
            assert s.status_code == 200 and list(s.iter_lines())
        bad = httpx.post(served.url + "/v1/chat/completions", timeout=60, json={"messages": []})
        assert bad.status_code == 400
        time.sleep(0.5)
        served.proc.send_signal(signal.SIGINT)
        time.sleep(0.1)
        served.proc.send_signal(signal.SIGINT)
        code = served.proc.wait(timeout=30)
        err = served.stderr()
    finally:
        stop(served.proc)
    assert code == 130, err
    assert "Traceback" not in err and "CancelledError" not in err and err.rstrip().endswith("interrupted"), err
    lines = [ln for ln in err.splitlines() if "prompt tokens" in ln]
    assert len(lines) == 2, err
    assert " chat: " in lines[0] and " completion: " in lines[1]
    for ln in lines:
        assert "127.0.0.1" in ln and "tok/s" in ln and "draft none" in ln and "cached" in ln, ln
    assert "Say hi" not in err  # no text of a request in the log
    assert any(" chat: 400 messages: " in ln for ln in err.splitlines()), err


# ----------------------------------------------------------------------------- 30
def test_serve_prints_an_ipv6_address_in_brackets_and_refuses_an_empty_host():
    res = subprocess.run([sys.executable, str(ROOT / "app.py"), "serve", "--host", ""], capture_output=True,
                         text=True, timeout=60, cwd=ROOT, env=env_without_key())
    assert res.returncode == 1 and res.stderr.startswith("error: --host is empty") and res.stderr.count("\n") == 1
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "serve", "--host", "::1", "--port", str(port),
                             "--target", MODEL, "--draft", "none"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env_without_key())
    try:
        banner = proc.stderr.readline()
        while banner and "EdgeSpec server on" not in banner:
            banner = proc.stderr.readline()
    finally:
        stop(proc)
    assert f"http://[::1]:{port}/v1" in banner, banner


# ----------------------------------------------------------------------------- 15
def hub_copy(root: Path, smollm2_path: Path) -> str:
    """The bundled SmolLM2 as a Hub model in a Hugging Face cache under `root`; its hf: name."""
    repo = root / "models--someone--tiny"
    snap = repo / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    shutil.copyfile(smollm2_path, snap / "tiny.gguf")
    return "hf:someone/tiny:tiny.gguf"


def test_a_removed_model_keeps_serving_and_remove_says_it_is_in_use(tmp_path, smollm2_path, monkeypatch):
    cache = tmp_path / "hf"
    spec = hub_copy(cache, smollm2_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    served = start_server("--target", spec, "--draft", "none", "--ctx", "512", "--flash-attn", "off")
    body = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 6, "temperature": 0}
    try:
        first = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=120)
        assert first.status_code == 200
        remove = [sys.executable, "-m", "edgespec.models", "remove", spec]
        res = subprocess.run(remove, capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert res.returncode == 1 and "is in use" in res.stderr and res.stderr.count("\n") == 1, res.stderr
        assert (cache / "models--someone--tiny" / "snapshots" / ("a" * 40) / "tiny.gguf").is_file()
        res = subprocess.run([*remove, "--force"], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert res.returncode == 0 and "removed" in res.stdout, res.stderr
        assert not list(cache.rglob("*.gguf"))
        for _ in range(2):  # from memory; the cost profile's key does not look at the file again
            again = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=120)
            assert again.status_code == 200, again.text
            assert again.json()["choices"][0]["message"]["content"]
    finally:
        stop_server(served)


# ----------------------------------------------------------------------------- the web UI: 36, 34, 20
@pytest.fixture()
def ui(tmp_path, monkeypatch):
    from edgespec.apps.ui import Defaults, build_app, start
    from edgespec.models.loader import RuntimeOptions

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    blocks = build_app(RuntimeOptions(n_ctx=512), Defaults(target=MODEL, draft="none", max_tokens=400))
    url = start(blocks, port=free_port(), block=False)
    yield blocks, url
    blocks.close()
    blocks.edgespec.pool.close()


def test_the_models_tab_removes_a_model_and_refuses_one_in_use(ui, tmp_path, smollm2_path):
    from gradio_client import Client

    _, url = ui
    spec = hub_copy(tmp_path / "hf", smollm2_path)
    client = Client(url, verbose=False)
    status = client.predict(spec, "", api_name="/load_models")
    assert "es-error" not in status, status
    shown = client.predict(spec, api_name="/remove_model")[0]
    assert "es-error" in shown and "is in use" in shown, shown
    assert list((tmp_path / "hf").rglob("*.gguf"))

    (tmp_path / "hf" / "models--someone--tiny").rename(tmp_path / "loaded")  # keep the loaded one aside
    spec = hub_copy(tmp_path / "hf", smollm2_path)
    shown, target, _, table = client.predict(spec, api_name="/remove_model")
    assert shown.startswith(f"removed {spec}") and "tiny.gguf" in shown, shown
    assert not list((tmp_path / "hf").rglob("*.gguf"))
    shown = client.predict(MODEL, api_name="/remove_model")[0]
    assert "es-error" in shown and "bundled" in shown


def race_outputs(ctx, cols, max_tokens: int = 4) -> list[tuple]:
    from edgespec.apps.ui.race import race

    return list(race(ctx, "Name three colours.", max_tokens, True, cols, "test-session"))


def test_the_race_checks_every_column_before_the_first_runs():
    from edgespec.apps.ui.context import AppContext, Defaults
    from edgespec.apps.ui.race import Column
    from edgespec.models.loader import RuntimeOptions
    from edgespec.service.pool import ModelPool

    pool = ModelPool(RuntimeOptions(n_ctx=512))
    ctx = AppContext(pool, Defaults(target=MODEL))
    good = Column("plain one", MODEL, "none", "0")
    outs = race_outputs(ctx, [good, Column("n-gram", MODEL, "ngram", "auto"), Column("third", MODEL, "ngram", "banana")])
    assert len(outs) == 1 and pool.loaded() == []  # nothing ran
    *htmls, status, _, _ = outs[0]
    assert status.startswith("error: column 3: gamma must be a whole number") and "Nothing was run" in status
    assert "third" in htmls[2] and "banana" in htmls[2]
    outs = race_outputs(ctx, [good, Column("typo", "smollm2-135", "none", "0"), None])
    assert len(outs) == 1 and "column 2: unknown model 'smollm2-135'" in outs[0][3]


def test_a_waiting_race_column_shows_its_label_and_an_off_one_says_off():
    from edgespec.apps.ui.context import AppContext, Defaults
    from edgespec.apps.ui.race import Column
    from edgespec.models.loader import RuntimeOptions
    from edgespec.service.pool import ModelPool

    pool = ModelPool(RuntimeOptions(n_ctx=512))
    ctx = AppContext(pool, Defaults(target=MODEL))
    try:
        outs = race_outputs(ctx, [Column("plain one", MODEL, "none", "0"), None,
                                  Column("my n-gram", MODEL, "none", "0")])  # no drafter: no cost profile to measure
    finally:
        pool.close()
    *htmls, status, _, _ = outs[0]
    assert status.startswith("Recording column 1 (1 of 2)")
    assert "my n-gram" in htmls[2] and "waiting" in htmls[2] and "off" not in htmls[2], htmls[2]
    assert "column 2" in htmls[1] and "off" in htmls[1]
    *htmls, status, _, summary = outs[-1]
    assert [c["label"] for c in summary["columns"]] == ["plain one", "my n-gram"]
    assert "my n-gram" in htmls[2] and "tok/s" in htmls[2] and "off" in htmls[1]


def test_a_generation_cleared_while_it_runs_ends_on_an_empty_conversation(smollm2_path):
    """Clear stops the running reply, and that reply's own last update is the empty conversation:
    an update it sent just before may reach the browser after Clear's, and must not be the last."""
    import gradio as gr

    from edgespec.apps.ui import Defaults
    from edgespec.apps.ui.chat import _handlers
    from edgespec.apps.ui.context import AppContext
    from edgespec.models.loader import RuntimeOptions
    from edgespec.service.pool import ModelPool

    pool = ModelPool(RuntimeOptions(n_ctx=512))
    ctx = AppContext(pool, Defaults(target=str(smollm2_path), draft="none", max_tokens=400))
    send_fn, _, _, clear_fn = _handlers(ctx)
    request = gr.Request(session_hash="s1")
    try:
        outs = send_fn("Tell me a long story about a dragon and a knight.", [], "", "none", "0", 400, 0.0, 0, 1.0,
                       0.0, 0, True, str(smollm2_path), "", "", request)
        for out in outs:
            if out[2] and out[2][-1]["reply"]:
                break  # text is streaming
        assert out[2] and out[2][-1]["reply"], "no text before the end"
        assert clear_fn(request)[:2] == ([], [])
        rest = list(outs)
        assert rest, "the cleared reply must say its last word"
        assert rest[-1][1:3] == ([], []), rest[-1][1:3]  # chatbot and turns empty
        assert rest[-1][0] == ""  # the message does not come back into the box either
        assert pool.active() == 0
    finally:
        pool.close()


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.mark.browser
@pytest.mark.skipif(not Path(CHROMIUM).is_file(), reason="Debian's chromium is not installed")
def test_clear_right_after_stop_and_regenerate_stays_clear(ui):
    from playwright.sync_api import sync_playwright

    from tests.test_ui_browser import ARGS

    blocks, url = ui
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            page.locator("#es-msg textarea").fill("Tell me a long story about a dragon and a knight.")
            page.locator("#es-send").click()
            page.wait_for_function("document.querySelector('#es-chatbot').innerText.includes('tok/s')",
                                   timeout=90_000)
            page.locator("#es-stop").click()
            page.locator("#es-regen").click()
            time.sleep(0.3)
            page.locator("#es-clear").click()
            for wait_s in (4, 6):
                time.sleep(wait_s)
                assert "dragon" not in page.locator("#es-chatbot").inner_text()
            assert blocks.edgespec.pool.active() == 0  # the regenerated reply was stopped, not left running
        finally:
            browser.close()
