"""Earlier answers through the real server (`serve --draft suffix`, 127.0.0.1, the official `openai`
client): a key's answers draft its later requests and never another key's, the sources show in
the per-token provenance and in `timings`, `--answers shared` lets every client use one cache, and
a request may pick any drafter that loads no model. Neither the prefix cache nor its counters tell
one key what another's prompt was, and one key's answers never evict another's."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.test_server import start_server, stop_server

ALICE, BOB = "alice-key-1", "bob-key-2"
MODEL = "smollm2-135m"
FIXED = {"gamma": 4}  # a fixed draft length: what is drafted does not hang on this machine's cost profile
# one thread: two llama.cpp threads on a loaded 2-core machine wait on each other
FIRST = "Write a Python function that returns the square of a number."
SECOND = "Write a Python function that returns the cube of a number."


@pytest.fixture(scope="module")
def server():
    served = start_server("--target", MODEL, "--draft", "suffix", "--ctx", "1024", "--flash-attn", "off", "--threads", "1",
                          "--api-key", f"{ALICE},{BOB}")
    yield served
    stop_server(served)


def client(served, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key=key, max_retries=0, timeout=900)


def ask(served, key: str, text: str, max_tokens: int = 64, **kw):
    return client(served, key).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=max_tokens, temperature=0,
        extra_body={**FIXED, **kw.pop("extra_body", {})}, **kw)


def from_answers(r) -> tuple[int, int]:
    t = r.model_extra["timings"]
    return t["draft_n_by_source"].get("answers", 0), t["draft_n_accepted_by_source"].get("answers", 0)


def test_a_keys_answers_draft_for_that_key_only(server):
    first = ask(server, ALICE, FIRST)
    assert from_answers(first) == (0, 0)  # nothing earlier to learn from
    second = ask(server, ALICE, SECOND)
    drafted, accepted = from_answers(second)
    assert accepted > 0, second.model_extra["timings"]
    t, prov = second.model_extra["timings"], second.model_extra["edgespec"]
    assert sum(t["draft_n_accepted_by_source"].values()) == t["draft_n_accepted"]
    assert prov["drafted_by"].count("answers") == accepted  # each accepted token names its source
    assert set(prov["drafted_by"]) <= {"", "context", "answers"}
    # Bob has asked nothing yet: Alice's answers never draft for him, whatever he asks
    other = ask(server, BOB, SECOND)
    assert from_answers(other) == (0, 0)
    assert other.usage.completion_tokens > 0  # (fast mode: its text may differ from Alice's at near-ties)


def test_streamed_chunks_name_the_source(server):
    ask(server, BOB, FIRST)
    stream = client(server, BOB).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": SECOND}], max_tokens=64, temperature=0,
        extra_body=FIXED, stream=True)
    drafters, timings = [], None
    for chunk in stream:
        extra = chunk.model_extra or {}
        drafters += (extra.get("edgespec") or {}).get("drafted_by", [])
        timings = extra.get("timings") or timings
    assert drafters.count("answers") == timings["draft_n_accepted_by_source"]["answers"] > 0


def test_every_key_is_checked(server):
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                   headers={"Authorization": "Bearer mallory"},
                   content=json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
    assert r.status_code == 401
    assert ask(server, BOB, "Say hi.", max_tokens=4).choices[0].message.content is not None


def test_one_keys_prompt_is_never_reused_for_another(server):
    """Issue 44: after key A sent "My bank PIN is 4821...", key B's guesses read cache_n 33 for
    "...PIN is 4821", 31 for "...PIN is 48", 29 for "...PIN is 9999" (and prompt_ms followed): B
    recovered A's prompt token by token. Now a request of B right after A's reuses nothing (counters 0,
    every prompt token prefilled, whatever A wrote), while B's own prefix is still reused for B."""
    seen = {}
    for secret in ("My bank PIN is 4821. Remember it.", "Tell me a short story about a dragon."):
        for guess in ("My bank PIN is 4821", "My bank PIN is 48", "My bank PIN is 9999"):
            ask(server, ALICE, secret, max_tokens=1)
            r = ask(server, BOB, guess, max_tokens=1)
            t = r.model_extra["timings"]
            seen[secret, guess] = (t["cache_n"], r.usage.prompt_tokens_details.cached_tokens, t["prompt_n"],
                                   r.usage.prompt_tokens)
    for (_, guess), (cache_n, cached, prompt_n, prompt_tokens) in seen.items():
        assert cache_n == cached == 0 and prompt_n == prompt_tokens, (guess, seen)
    # the same work for B whatever A wrote: its prefill time has nothing of A's text to depend on
    assert len({(g, v) for (_, g), v in seen.items()}) == 3
    again = ask(server, BOB, "My bank PIN is 9999", max_tokens=1)  # B after B: B's own prompt is reused
    assert again.model_extra["timings"]["cache_n"] > 0


def test_one_keys_answers_never_evict_anothers():
    """Issue 44: with --answers-tokens 40, key B's repeated request drafted from its earlier answer, and
    after one request of key A it drafted from the context again (A's answer had evicted B's). The cap
    is per key now."""
    served = start_server("--target", MODEL, "--draft", "suffix", "--ctx", "1024", "--flash-attn", "off", "--threads",
                          "1", "--api-key", f"{ALICE},{BOB}", "--answers-tokens", "40")
    try:
        ask(served, BOB, FIRST, max_tokens=24)
        assert from_answers(ask(served, BOB, FIRST, max_tokens=24))[1] > 0
        ask(served, ALICE, SECOND, max_tokens=24)
        assert from_answers(ask(served, BOB, FIRST, max_tokens=24))[1] > 0
    finally:
        stop_server(served)


def test_a_request_picks_a_drafter_that_loads_no_model(server):
    r = ask(server, ALICE, "Repeat exactly: alpha beta gamma delta epsilon zeta eta theta.",
            extra_body={"draft": "ngram"})
    assert set(r.model_extra["timings"]["draft_n_by_source"]) <= {"ngram"}
    assert r.model_extra["timings"]["drafter"] == "ngram"
    bad = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, headers={"Authorization": f"Bearer {ALICE}"},
                     content=json.dumps({"messages": [{"role": "user", "content": "hi"}], "draft": "model:gemma3-270m"}))
    assert bad.status_code == 400 and "suffix" in bad.json()["error"]["message"]


def test_shared_answers_serve_every_client():
    """--answers shared (a single-user desktop): one cache, whatever key a client sends."""
    served = start_server("--target", MODEL, "--draft", "suffix", "--ctx", "1024", "--flash-attn", "off", "--threads", "1",
                          "--answers", "shared")
    try:
        ask(served, "one-client", FIRST)
        assert from_answers(ask(served, "another-client", SECOND))[1] > 0
    finally:
        stop_server(served)


@pytest.mark.slow  # a server in exact mode (its cost profile probes batch invariance)
def test_exact_mode_drafting_from_earlier_answers_equals_plain():
    """--exact: batch-invariant kernels, so greedy text drafted from earlier answers is plain decoding's,
    token for token."""
    served = start_server("--target", MODEL, "--draft", "suffix", "--ctx", "1024", "--exact", "--threads", "1")
    try:
        spec = [ask(served, ALICE, q) for q in (FIRST, SECOND, FIRST)]
        plain = [ask(served, BOB, q, extra_body={"draft": "none"}) for q in (FIRST, SECOND, FIRST)]
        for s, p in zip(spec, plain, strict=True):
            assert s.model_extra["edgespec"]["tokens"] == p.model_extra["edgespec"]["tokens"]
        assert sum(from_answers(s)[1] for s in spec) > 0
    finally:
        stop_server(served)
