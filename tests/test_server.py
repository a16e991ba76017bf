"""The OpenAI-compatible server over real HTTP on 127.0.0.1, driven by the official `openai` client
and raw httpx: completions, streaming with per-token provenance, stop sequences, seeds, prefix
reuse across chat turns, load with a bounded queue, faults and the API key.

One server (bundled SmolLM2, n-gram drafter, --api-key, --ui) is started per module as a real
subprocess (`python app.py serve ...`); the hostile-template test starts its own.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from edgespec.service.session import Request, frame
from tests.conftest import ROOT, run_app

KEY = "test-key-123"
MODEL = "smollm2-135m"
CTX = 1024
QUEUE = 4
FIXED = {"gamma": 3}  # fixed draft length: runs compared token for token see the same batches


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    def __init__(self, proc: subprocess.Popen, port: int, log: str) -> None:
        self.proc = proc
        self.port = port
        self.log = log
        self.url = f"http://127.0.0.1:{port}"
        self.client = openai.OpenAI(base_url=f"{self.url}/v1", api_key=KEY, max_retries=0, timeout=120)

    def post(self, path: str, body: dict | str | bytes, key: str | None = KEY, **kw) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        content = body if isinstance(body, str | bytes) else json.dumps(body)
        return httpx.post(self.url + path, content=content, headers={**headers, "Content-Type": "application/json"},
                          timeout=120, **kw)

    def stderr(self) -> str:
        """What serve wrote to stderr so far (its banner, one line per request, errors)."""
        return Path(self.log).read_text()

    def health(self) -> dict:
        r = httpx.get(self.url + "/health", timeout=10)
        assert r.status_code == 200
        return r.json()

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")


def start_server(*args: str, timeout: float = 180) -> Served:
    port = free_port()
    # serve logs a line per request: a file, not a pipe nobody reads (a full pipe would block it)
    log = tempfile.NamedTemporaryFile("w+", prefix="serve-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "serve", "--port", str(port), *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True, env=os.environ.copy())
    served = Served(proc, port, log.name)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {Path(log.name).read_text()[-2000:]}")
        try:
            if httpx.get(served.url + "/health", timeout=2).status_code == 200:
                return served
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("server did not start")


def stop_server(served: Served) -> None:
    served.proc.terminate()
    try:
        served.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        served.proc.kill()


@pytest.fixture(scope="module")
def server():
    served = start_server("--target", MODEL, "--draft", "ngram", "--ctx", str(CTX), "--queue", str(QUEUE),
                          "--flash-attn", "off", "--api-key", KEY, "--ui")
    yield served
    stop_server(served)


def chat(server: Served, text: str, **kw):
    model = kw.pop("model", MODEL)
    return server.client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}], **kw)


def error_of(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"]), body
    assert "Traceback" not in body["error"]["message"] and "\n" not in body["error"]["message"]
    return body["error"]


# ----------------------------------------------------------------------------- the API
def test_models_health_and_ui(server):
    ids = [m.id for m in server.client.models.list().data]
    assert ids == [MODEL]
    h = server.health()
    assert h["status"] == "ok" and h["model"] == MODEL and h["queue_limit"] == QUEUE
    ui = httpx.get(server.url + "/ui/", timeout=30, follow_redirects=True)
    assert ui.status_code == 200 and "gradio" in ui.text.lower()


def test_chat_completion_with_stats_and_provenance(server, smollm2):
    # a sentence to repeat: the n-gram drafter finds it in the prompt and must be accepted
    text = "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog near the river bank."
    t0 = time.monotonic()
    r = chat(server, text, max_tokens=48, temperature=0, extra_body=FIXED)
    elapsed = time.monotonic() - t0
    answer = r.choices[0].message.content
    assert isinstance(answer, str) and answer.strip() and r.choices[0].finish_reason in ("stop", "length")
    t, prov = r.model_extra["timings"], r.model_extra["edgespec"]
    src = prov["sources"]
    # The prompt as the session frames a conversation (SmolLM2's chat template), tokenized here;
    # its last token is always decoded, never taken from the cache.
    prompt = frame(smollm2, Request(messages=[{"role": "user", "content": text}])).tokens
    assert r.usage.prompt_tokens == len(prompt) == t["prompt_n"] + t["cache_n"] and t["prompt_n"] >= 1
    assert r.usage.prompt_tokens_details.cached_tokens == t["cache_n"]
    assert t["predicted_n"] == r.usage.completion_tokens == len(prov["tokens"])
    # Target calls from the sources: every step ends in one token of the target's (a correction,
    # its own token, or the bonus); an end-of-generation token ends the last one and is not shown.
    eog = prov["finish_reason"] == "eog"
    steps, drafts = src.count("target") + src.count("bonus") + eog, src.count("draft")
    assert t["target_calls"] == steps
    # an accepted draft that is the end-of-generation token counts as accepted, but is not shown
    assert drafts <= t["draft_n_accepted"] <= drafts + eog
    cut = sum(a == "draft" and b == "target" for a, b in zip(src, src[1:], strict=False))  # steps with a rejection
    assert t["draft_n_accepted"] + cut <= t["draft_n"] <= FIXED["gamma"] * steps
    assert t["acceptance"] == pytest.approx(t["draft_n_accepted"] / t["draft_n"] if t["draft_n"] else 0.0)
    assert t["mean_accepted"] == pytest.approx(t["draft_n_accepted"] / steps)
    # timed inside the request
    assert 0 <= t["prompt_ms"] and 0 < t["predicted_ms"] and t["prompt_ms"] + t["predicted_ms"] < 1000 * elapsed
    assert t["predicted_per_second"] >= t["predicted_n"] / elapsed
    assert len(src) == len(prov["drafted_by"]) == len(prov["tokens"])
    assert set(src) <= {"draft", "target", "bonus"}
    for s, d in zip(src, prov["drafted_by"], strict=True):
        assert (d == "ngram") if s == "draft" else (d == "")
    # speculation ran in the server: drafts were proposed, accepted, and shown as such
    assert t["draft_n"] > 0 and drafts > 0 and t["acceptance"] > 0


def test_streaming_matches_the_plain_response_and_carries_provenance(server):
    prompt = "List the days of the week, one per line."
    plain = chat(server, prompt, max_tokens=40, temperature=0, extra_body=FIXED)
    chunks = list(chat(server, prompt, max_tokens=40, temperature=0, extra_body=FIXED, stream=True,
                       stream_options={"include_usage": True}))
    text, sources, drafters, tokens = "", [], [], []
    finals = []
    for c in chunks:
        if c.choices and c.choices[0].delta.content:
            ext = c.model_extra["edgespec"]
            assert "".join(ext["pieces"]) == c.choices[0].delta.content
            text += c.choices[0].delta.content
            sources += ext["sources"]
            drafters += ext["drafted_by"]
            tokens += ext["tokens"]
        if c.choices and c.choices[0].finish_reason:
            finals.append(c)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert text == plain.choices[0].message.content
    assert tokens == plain.model_extra["edgespec"]["tokens"] and sources == plain.model_extra["edgespec"]["sources"]
    assert drafters == plain.model_extra["edgespec"]["drafted_by"]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == plain.choices[0].finish_reason
    timings = finals[0].model_extra["timings"]
    assert timings["predicted_n"] == len(tokens) and timings["draft_n_accepted"] >= sources.count("draft")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(tokens)


def test_stop_sequences(server):
    prompt = "Tell me about the planets of the solar system."
    ref = chat(server, prompt, max_tokens=60, temperature=0, extra_body=FIXED).choices[0].message.content
    words = ref.split(" ")
    stop = " " + next(w for w in words[len(words) // 2:] if len(w) > 3)
    cut = ref.index(stop)
    for stream in (False, True):
        if stream:
            got = "".join(c.choices[0].delta.content or "" for c in chat(
                server, prompt, max_tokens=60, temperature=0, stop=[stop, "@@@"], extra_body=FIXED, stream=True)
                if c.choices)
        else:
            r = chat(server, prompt, max_tokens=60, temperature=0, stop=stop, extra_body=FIXED)
            got = r.choices[0].message.content
            assert r.choices[0].finish_reason == "stop" and r.model_extra["edgespec"]["finish_reason"] == "stop"
        assert ref.startswith(got) and stop not in got and len(got) >= cut - 12, (stop, got)


def test_same_seed_same_text_at_temperature(server):
    def run(seed: int) -> str:
        return chat(server, "Write a short poem about the sea.", max_tokens=40, temperature=0.9, top_p=0.95,
                    seed=seed, extra_body={**FIXED, "top_k": 50}).choices[0].message.content

    a = run(11)
    chat(server, "Something else in between.", max_tokens=8)  # the cache now holds another request
    assert run(11) == a
    assert run(12) != a


def test_completions_endpoint(server):
    r = server.client.completions.create(model=MODEL, prompt="1, 2, 3, 4, 5,", max_tokens=12, temperature=0)
    assert r.choices[0].text and r.model_extra["timings"]["predicted_n"] == r.usage.completion_tokens
    chunks = list(server.client.completions.create(model=MODEL, prompt="1, 2, 3, 4, 5,", max_tokens=12,
                                                   temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text


def test_turn_five_prefills_far_fewer_tokens(server):
    messages = [{"role": "system", "content": "You are brief."}]
    timings = []
    for q in ["What is a bicycle?", "Who invented it?", "What is a derailleur?", "Name a famous race.",
              "How long is that race?"]:
        messages.append({"role": "user", "content": q})
        r = server.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
        timings.append((r.model_extra["timings"], r.usage))
    (t1, u1), (t5, u5) = timings[0], timings[-1]
    assert u5.prompt_tokens > 2 * u1.prompt_tokens
    assert t5["cache_n"] > 0 and t5["prompt_n"] < u5.prompt_tokens / 3 and t5["prompt_n"] <= 2 * t1["prompt_n"]
    fresh = server.client.chat.completions.create(model=MODEL, messages=messages[:-1], max_tokens=4,
                                                  extra_body={"cache_prompt": False})
    assert fresh.model_extra["timings"]["cache_n"] == 0
    assert fresh.model_extra["timings"]["prompt_n"] == fresh.usage.prompt_tokens == u5.prompt_tokens


# ----------------------------------------------------------------------------- load
PROMPTS = [f"Say the number {n} in words, then stop." for n in (3, 17, 42, 99, 256, 1000, 7, 64)]


def test_fifty_requests_from_eight_clients(server):
    body = {"model": MODEL, "max_tokens": 8, "temperature": 0, "cache_prompt": False, **FIXED}
    ref = {}
    for p in PROMPTS:
        r = server.post("/v1/chat/completions", {**body, "messages": [{"role": "user", "content": p}]})
        assert r.status_code == 200
        ref[p] = r.json()["choices"][0]["message"]["content"]
    results: list[tuple[str, httpx.Response]] = []
    lock = threading.Lock()
    counter = iter(range(50))

    def client() -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            p = PROMPTS[i % len(PROMPTS)]
            for _ in range(200):  # a client that honours 429 + Retry-After (shortened to 0.1 s here)
                r = server.post("/v1/chat/completions", {**body, "messages": [{"role": "user", "content": p}]})
                with lock:
                    results.append((p, r))
                if r.status_code != 429:
                    break
                time.sleep(0.1)

    threads = [threading.Thread(target=client) for _ in range(8)]
    t0 = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    ok = [(p, r) for p, r in results if r.status_code == 200]
    busy = [r for _, r in results if r.status_code != 200]
    for r in busy:
        assert r.status_code == 429 and r.headers.get("retry-after")
        err = error_of(r)
        assert err["code"] == "queue_full" and "busy" in err["message"]
    assert len(ok) == 50, f"{len(ok)} of 50 completed in {time.monotonic() - t0:.0f}s"
    assert busy, f"8 clients and room for {1 + QUEUE}: some requests must have been turned away"
    print(f"load: {len(ok)} completed, {len(busy)} got 429, {time.monotonic() - t0:.1f}s")
    for p, r in ok:  # no response holds another's text
        assert r.json()["choices"][0]["message"]["content"] == ref[p]
    assert len({r.json()["id"] for _, r in ok}) == len(ok)
    h = server.health()
    assert h["status"] == "ok" and not h["busy"] and h["queued"] == 0


def test_memory_is_flat_over_a_hundred_generations(server):
    body = {"model": MODEL, "max_tokens": 4, "temperature": 0.7}

    def generations(n: int) -> None:
        for i in range(n):
            r = server.post("/v1/chat/completions",
                            {**body, "messages": [{"role": "user", "content": f"Count to {i % 13}."}]})
            assert r.status_code == 200

    generations(10)
    after_10 = server.rss_kb()
    generations(90)
    after_100 = server.rss_kb()
    assert after_100 <= after_10 * 1.05, (after_10, after_100)


# ----------------------------------------------------------------------------- faults
def test_disconnect_mid_stream_frees_the_model_at_once(server):
    stopped = server.health()["stopped"]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a very long story."}],
            "max_tokens": 900, "ignore_eos": True, "stream": True}
    lines = 0
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            lines += line.startswith("data: ")
            if lines >= 4:
                break
    t0 = time.monotonic()
    r = chat(server, "Hi", max_tokens=4)
    assert r.choices[0].message.content is not None
    assert time.monotonic() - t0 < 5, "the next request waited for the abandoned one"  # 900 tokens take far longer
    h = server.health()
    assert h["stopped"] == stopped + 1 and not h["busy"]


def test_bad_requests_are_openai_shaped_4xx(server):
    r = server.post("/v1/chat/completions", "{not json")
    assert r.status_code == 400 and error_of(r)["code"] == "invalid_json"
    r = server.post("/v1/chat/completions", "[1, 2]")
    assert r.status_code == 400 and "JSON object" in error_of(r)["message"]
    for body, param in [
        ({"model": MODEL, "messages": "hello"}, "messages"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": "many"}, "max_tokens"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "top_p": 0}, "top_p"),
        ({"model": MODEL, "messages": [{"role": "function", "content": "hi"}]}, "messages.0.role"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "draft": "model:/etc/passwd"}, "draft"),
        ({"model": MODEL, "messages": []}, "messages"),
    ]:
        r = server.post("/v1/chat/completions", body)
        assert r.status_code == 400, (body, r.text)
        assert error_of(r)["param"] == param, (body, r.text)
    r = server.post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "assistant", "content": "hi"}]})
    assert r.status_code == 400 and "no user message" in error_of(r)["message"]  # (a last assistant message
    # after a user's is continued: tests/test_user_defects_4_server.py)
    with pytest.raises(openai.NotFoundError) as exc:
        chat(server, "hi", model="gpt-17")
    assert exc.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as exc:
        chat(server, "hi", max_tokens=5000)
    assert exc.value.code == "context_length_exceeded" and str(CTX) in str(exc.value)
    r = httpx.get(server.url + "/v1/nothing", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 404 and error_of(r)["code"] == "not_found"
    assert server.health()["status"] == "ok"


def test_api_key_is_required_on_v1(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for key in (None, "wrong-key"):
        r = server.post("/v1/chat/completions", body, key=key)
        assert r.status_code == 401 and error_of(r)["code"] == "invalid_api_key"
    r = httpx.get(server.url + "/v1/models")
    assert r.status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="nope", max_retries=0).models.list()
    assert httpx.get(server.url + "/health").status_code == 200  # health stays open, like llama-server's


def test_binding_beyond_localhost_without_a_key_is_refused():
    res = run_app("serve", "--host", "0.0.0.0", "--port", str(free_port()), timeout=60)
    assert res.returncode == 1
    assert res.stderr.strip().count("\n") == 0 and "refusing to listen on 0.0.0.0 without --api-key" in res.stderr


@pytest.mark.parametrize("model_id", ["", "   "])
def test_serve_refuses_a_blank_model_id(model_id):
    # before anything loads; a server that started instead ends the test through TimeoutExpired
    res = run_app("serve", "--port", str(free_port()), "--model-id", model_id, timeout=30)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: --model-id is empty"), res.stderr


def test_hostile_chat_template_fails_cleanly(tmp_path, smollm2_path):
    hostile = tmp_path / "hostile.gguf"
    template = "{{ cycler.__init__.__globals__.os.popen('touch " + str(tmp_path / "pwned") + "').read() }}"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", "--chat-template", template, "--force",
                    str(smollm2_path), str(hostile)], check=True, capture_output=True, timeout=120)
    res = run_app("--headless", "--target", str(hostile), "--prompt", "hi", "--max-tokens", "2")
    assert res.returncode == 1 and res.stderr.strip().count("\n") == 0
    assert "refused by the sandbox" in res.stderr
    served = start_server("--target", str(hostile), "--draft", "none", "--ctx", "512")
    try:
        r = served.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, key=None)
        assert r.status_code == 400 and "refused by the sandbox" in error_of(r)["message"]
        r = served.post("/v1/completions", {"prompt": "Hello", "max_tokens": 2}, key=None)  # raw text still works
        assert r.status_code == 200
    finally:
        stop_server(served)
    assert not (tmp_path / "pwned").exists()
