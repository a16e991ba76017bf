"""Token log-probabilities through `serve` (OpenAI's `logprobs` / `top_logprobs`), with speculation on.

Every figure comes from the target's own row for the token, so a drafted token reads what plain
decoding gives it; these tests compare the two on the bundled SmolLM2 and check both of OpenAI's
shapes (chat's `content` list, the completions API's columns), streamed and not, and the errors."""

from __future__ import annotations

import json
import math

import httpx
import pytest

from tests.test_server import KEY, MODEL, error_of, start_server, stop_server

REPEAT = "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog near the river bank."


@pytest.fixture(scope="module")
def server():
    served = start_server("--target", MODEL, "--draft", "ngram", "--ctx", "1024", "--flash-attn", "off",
                          "--api-key", KEY)
    yield served
    stop_server(served)


def _chat(server, draft: str, **kw):
    return server.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": REPEAT}], max_tokens=32, temperature=0,
        extra_body={"draft": draft, "gamma": 3}, **kw)


def test_chat_logprobs_are_the_targets_with_or_without_drafts(server):
    plain = _chat(server, "none", logprobs=True, top_logprobs=3)
    spec = _chat(server, "ngram", logprobs=True, top_logprobs=3)
    assert spec.usage.completion_tokens == plain.usage.completion_tokens
    assert spec.model_extra["timings"]["draft_n_accepted"] > 0  # the n-gram drafter's tokens were kept
    for reply in (plain, spec):
        content = reply.choices[0].logprobs.content
        assert len(content) == reply.usage.completion_tokens
        # the tokens spell the answer, byte for byte
        assert bytes(b for c in content for b in c.bytes).decode() == reply.choices[0].message.content
        for c in content:
            tops = [t.logprob for t in c.top_logprobs]
            assert len(tops) == 3 and tops == sorted(tops, reverse=True) and all(t <= 0 for t in tops)
            assert c.token == c.top_logprobs[0].token and c.logprob == tops[0]  # greedy: the most likely one
    sources = spec.model_extra["edgespec"]["sources"]
    for i, (a, b) in enumerate(zip(plain.choices[0].logprobs.content, spec.choices[0].logprobs.content, strict=True)):
        assert a.token == b.token
        # a verify pass's rows and single-token passes agree to the batched kernels' rounding
        assert math.isclose(a.logprob, b.logprob, abs_tol=0.05), (i, sources[i], a.logprob, b.logprob)


def test_streamed_logprobs_cover_every_token_once(server):
    stream = _chat(server, "ngram", logprobs=True, stream=True)
    entries, text = [], ""
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        if choice.logprobs is not None:
            entries += choice.logprobs.content
    assert entries and "".join(e.token for e in entries) == text
    assert all(e.top_logprobs == [] for e in entries)  # none asked for


def test_completions_logprobs_in_the_older_columns(server):
    body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 12, "temperature": 0,
            "logprobs": 2}
    r = server.post("/v1/completions", body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    n = r.json()["usage"]["completion_tokens"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert "".join(lp["tokens"]) == choice["text"]
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(n)]
    assert all(len(alts) <= 2 and max(alts.values()) == chosen  # greedy: the chosen token is the likeliest
               for alts, chosen in zip(lp["top_logprobs"], lp["token_logprobs"], strict=True))
    # streamed: the same columns, with offsets into the whole text
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True},
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    streamed = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]]
    assert sum((x["tokens"] for x in streamed), []) == lp["tokens"]
    assert sum((x["text_offset"] for x in streamed), []) == lp["text_offset"]


def test_no_logprobs_unless_asked_and_bad_values_are_400s(server):
    assert _chat(server, "ngram").choices[0].logprobs is None
    for body, param in (({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
                        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                        ({"logprobs": 30}, "logprobs")):
        r = server.post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                                 "max_tokens": 4, **body})
        assert r.status_code == 400, (body, r.text)
        err = error_of(r)
        assert param in (err["param"] or "") + err["message"], (body, err)
