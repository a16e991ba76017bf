"""The server's answer at a stop string that begins inside a token: `"stop": ["o"]` answers the text
before the first "o" (never "", plain or streamed) and completion_tokens counts the tokens shown,
over real HTTP on 127.0.0.1."""

from __future__ import annotations

import pytest

from tests.test_server import MODEL, start_server, stop_server


@pytest.fixture(scope="module")
def plain_server():
    served = start_server("--target", MODEL, "--draft", "none", "--ctx", "1024", "--api-key", "k")
    served.client.api_key = "k"
    yield served
    stop_server(served)


def test_the_answer_is_the_text_before_the_stop_string(plain_server):
    def ask(**kw):
        return plain_server.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=12, temperature=0, **kw)

    full = ask().choices[0].message.content
    assert "o" in full, full
    r = ask(stop=["o"])
    assert r.choices[0].message.content == full[: full.index("o")] != ""
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == len(r.model_extra["edgespec"]["tokens"]) >= 1
    streamed = "".join(c.choices[0].delta.content or "" for c in ask(stop=["o"], stream=True) if c.choices)
    assert streamed == full[: full.index("o")]
