"""The Gradio app driven through gradio_client against a real launched server and real models."""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import pytest
from gradio_client import Client

from edgespec.apps.ui import Defaults, build_app, start
from edgespec.models.loader import RuntimeOptions
from edgespec.service.session import Request, Session

OPTS = RuntimeOptions(n_ctx=512)
SYSTEM = "You are a helpful assistant."
COPY_PROMPT = ("Copy this text exactly: The quick brown fox jumps over the lazy dog. "
               "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app():
    blocks = build_app(OPTS, Defaults(target="smollm2-135m", max_tokens=32))
    url = start(blocks, port=free_port(), block=False)
    yield blocks, url
    blocks.close()


@pytest.fixture(scope="module")
def reference():
    """A second SmolLM2 session with the app's options: what the session layer itself says."""
    session = Session.load("smollm2-135m", OPTS)
    yield session
    session.close()


def chat_args(message: str, *, drafter: str = "ngram", gamma: str = "3", max_tokens: int = 32,
              target: str = "smollm2-135m", draft: str = "") -> tuple:
    # message, system, drafter, gamma, max tokens, temperature, top-k, top-p, min-p, seed, highlight, target, draft
    return (message, SYSTEM, drafter, gamma, max_tokens, 0.0, 0, 1.0, 0.0, -1, True, target, draft)


def session_run(session: Session, message: str, gamma: int, max_tokens: int) -> tuple[list[int], list[str], list[str]]:
    """(tokens, sources, pieces) of the same chat turn run straight through a Session."""
    req = Request(messages=[{"role": "user", "content": message}], system=SYSTEM, draft="ngram", gamma=str(gamma),
                  ngram=Defaults().ngram, max_tokens=max_tokens)  # the app's n-gram sizes
    reply = session.run(req)
    return reply.tokens, reply.sources, reply.pieces


def bubble(chatbot: list[dict]) -> str:
    """The last chat bubble's content (Gradio may wrap it as a list of parts)."""
    content = chatbot[-1]["content"]
    return content[0]["text"] if isinstance(content, list) else content


def run_job(client: Client, args: tuple, log: list | None = None):
    """Submit /chat, collect every streamed update (with its arrival time) and the final outputs."""
    job = client.submit(*args, api_name="/chat")
    for out in job:
        if log is not None:
            log.append((time.perf_counter(), out))
    return job.result(timeout=120)


@pytest.mark.slow
def test_chat_streams_and_segments_match_the_session_reply(app, reference):
    _, url = app
    client = Client(url, verbose=False)
    updates: list = []
    final = run_job(client, chat_args(COPY_PROMPT, max_tokens=48), updates)
    msg, chatbot, details, live, _, _, error = final
    assert error == "" and details["error"] is None
    assert msg == ""
    # Streamed: the client saw the reply part-way through, not only empty and complete. While it
    # streams only the bubble changes; the reply data comes once, complete, with the last update.
    bubbles = [bubble(out[1]) for _, out in updates if out[1] and out[1][-1]["role"] == "assistant"]
    assert any('class="tok-' in b and b != bubble(chatbot) for b in bubbles), bubbles
    assert sum(bool(isinstance(out[2], dict) and out[2].get("segments")) for _, out in updates) == 1

    tokens, sources, pieces = session_run(reference, COPY_PROMPT, gamma=3, max_tokens=48)
    assert "draft" in sources, "the copy prompt should get n-gram drafts accepted"
    assert details["tokens"] == tokens
    assert [s for _, s in details["segments"]] == sources
    assert [p for p, _ in details["segments"]] == pieces
    stats = details["stats"]
    assert stats["accepted"] >= sources.count("draft")  # drafts accepted past an end-of-generation token are cut
    assert stats["generated"] == len(tokens)

    # The chat bubble highlights exactly the accepted-draft runs.
    html = bubble(chatbot)
    runs = [s for i, s in enumerate(sources) if (i == 0 or sources[i - 1] != s) and pieces[i] != ""]
    assert html.count('class="tok-draft"') == runs.count("draft")
    pct = round(100 * stats["acceptance_rate"])
    assert "tok/s" in html and f"acceptance (per drafted token) {pct}% ({stats['accepted']}/{stats['drafted']})" in html
    assert f"alpha (per tested token) {stats['alpha']:.2f}" in html
    assert "tok-target" in html  # the target's own tokens carry the outlined class
    assert "gamma chosen" in live and "acceptance (per drafted token)" in live and "alpha (per tested token)" in live
    assert details["framing"] == "chat"


def test_stop_cancels_a_long_generation(app):
    _, url = app
    client = Client(url, verbose=False)
    job = client.submit(*chat_args("Write a very long story about a dragon.", drafter="none", max_tokens=400),
                        api_name="/chat")
    deadline = time.perf_counter() + 60
    while time.perf_counter() < deadline:
        outs = job.outputs()
        # while it streams, the bubble's stats line counts the tokens (the reply data comes at the end)
        shown = re.search(r"\| (\d+) tokens \|", bubble(outs[-1][1])) if outs and outs[-1][1] else None
        if shown and int(shown.group(1)) >= 3:
            break
        time.sleep(0.05)
    else:
        pytest.fail("no tokens streamed within 60 s")
    t = time.perf_counter()
    client.predict(api_name="/stop")
    details = job.result(timeout=30)[2]
    assert time.perf_counter() - t < 10
    assert details["finish_reason"] == "stopped"
    assert 3 <= len(details["tokens"]) < 400


@pytest.mark.slow
def test_two_concurrent_sessions_do_not_corrupt_each_other(app, reference):
    blocks, url = app
    prompts = ["Count from one to thirty in words, separated by commas.",
               "List the months of the year, one per line, then the days of the week."]
    results: list = [None, None]
    # Warm two instances first, so that neither session spends its start loading a model.
    pool = blocks.edgespec.pool
    with pool.lease("smollm2-135m") as a, pool.lease("smollm2-135m") as b:
        assert a.target is not b.target
        for session in (a, b):
            session.prepare(Request(text="warm up", draft="ngram", gamma="3"))  # the cost profile

    clients = [Client(url, verbose=False) for _ in prompts]  # before the clock starts: connecting takes a while
    jobs = [c.submit(*chat_args(p, max_tokens=48), api_name="/chat") for c, p in zip(clients, prompts, strict=True)]

    def follow(i: int) -> None:
        results[i] = jobs[i].result(timeout=120)

    busy: list[int] = []

    def watch() -> None:
        while any(th.is_alive() for th in threads):
            busy.append(pool.active())
            time.sleep(0.005)

    threads = [threading.Thread(target=follow, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    watcher = threading.Thread(target=watch)
    watcher.start()
    for th in threads:
        th.join(timeout=180)
    watcher.join()
    for i in range(2):
        tokens, sources, pieces = session_run(reference, prompts[i], gamma=3, max_tokens=48)
        details = results[i][2]
        assert details["tokens"] == tokens
        assert [s for _, s in details["segments"]] == sources
        assert "".join(p for p, _ in details["segments"]) == "".join(pieces)
    # They really ran at the same time: both sessions held a model instance at once.
    assert max(busy) == 2, f"at most {max(busy)} generation(s) ran at once"


def one_line_error(text: str) -> None:
    assert text.startswith("error: ") and "\n" not in text and "Traceback" not in text, text


@pytest.mark.slow
def test_errors_are_shown_and_the_app_keeps_running(app, tmp_path):
    _, url = app
    client = Client(url, verbose=False)
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"this is not a model" * 10)
    out = client.predict(*chat_args("hello", target=str(bad)), api_name="/chat")
    assert "not a GGUF file" in out[-1] and out[2]["error"]
    one_line_error(out[-1])

    long_msg = "word " * 700  # far beyond the 512-token context
    out = client.predict(*chat_args(long_msg), api_name="/chat")
    assert "context holds 512" in out[-1]
    one_line_error(out[-1])
    assert out[0] == long_msg  # the failed message is handed back for editing

    out = client.predict(*chat_args("hello", gamma="lots"), api_name="/chat")
    assert "gamma must be a whole number" in out[-1]
    one_line_error(out[-1])

    status = client.predict("smollm2-135m", "gemma3-270m", api_name="/load_models")
    assert "incompatible pair" in status and "smollm2" in status.lower()

    # No Hub access on the test machines: the download reports why instead of hanging or crashing.
    fetched = client.predict("qwen2.5-0.5b-instruct", api_name="/download")[0]
    assert "es-error" in fetched and "qwen2.5-0.5b-instruct" in fetched.lower()

    out = client.predict(*chat_args("Say hello.", max_tokens=8), api_name="/chat")
    assert out[-1] == "" and 1 <= len(out[2]["tokens"]) <= 8


@pytest.mark.slow
def test_race_tab_gives_three_columns_and_a_chart(app):
    _, url = app
    client = Client(url, verbose=False)
    cols = [
        (True, "plain", "smollm2-135m", "none", "0"),
        (True, "n-gram gamma 2", "smollm2-135m", "ngram", "2"),
        (True, "n-gram gamma 4", "smollm2-135m", "ngram", "4"),
    ]
    flat = [v for c in cols for v in c]
    *htmls, status, chart, summary = client.predict(
        "List: red, green, blue, red, green, blue, red, green, blue. Repeat the list twice.", 24, True, *flat,
        api_name="/race",
    )
    assert len(htmls) == 3
    assert summary["method"].startswith("sequential runs")
    assert [c["label"] for c in summary["columns"]] == ["plain", "n-gram gamma 2", "n-gram gamma 4"]
    for html, col in zip(htmls, summary["columns"], strict=True):
        assert col["error"] is None and col["generated"] > 0 and col["tokens_per_s"] > 0
        assert 'class="es-out"' in html and "tok/s" in html and col["label"] in html
    assert summary["columns"][0]["speedup"] == pytest.approx(1.0)
    assert chart["y_lim"][0] == 0  # bars start at zero
    bars = chart["value"]["data"]
    assert len(bars) == 3 and all(row[1] > 0 for row in bars)
    assert [row[0].split(" ", 2)[2] for row in bars] == [c["label"] for c in summary["columns"]]
    assert status.startswith("Done.")


@pytest.mark.slow
def test_models_panel_pair_drives_the_chat_draft_model(app):
    """Same-vocabulary pair (Q8_0 target derived from the bundled Q4_1 draft): the Models panel loads
    and checks it, and the chat drafts with that model."""
    from edgespec.models.derive import derive_pair

    _, url = app
    target, draft = derive_pair()
    client = Client(url, verbose=False)
    status = client.predict(str(target), "smollm2-135m", api_name="/load_models")
    assert "es-error" not in status and "same vocabulary" in status
    out = client.predict(*chat_args("Name three colours.", drafter="model", gamma="3", max_tokens=12,
                                    target=str(target), draft="smollm2-135m"), api_name="/chat")
    details = out[2]
    assert details["error"] is None and details["drafter"].startswith("model:")
    assert details["stats"]["drafted"] > 0 and "draft" in [s for _, s in details["segments"]]

    out = client.predict(*chat_args("hi", drafter="model", draft=""), api_name="/chat")
    assert "pick one in the Models tab" in out[-1]
    one_line_error(out[-1])


@pytest.mark.slow
@pytest.mark.parametrize(("target", "framing"), [("smollm2-135m", "chat"), ("gemma3-270m", "transcript")])
def test_chat_works_with_both_bundled_models(app, target, framing):
    """SmolLM2 chats through its chat template; Gemma-3-270M (a base model, no template) through
    User:/Assistant: lines, and a second turn continues the same conversation."""
    _, url = app
    client = Client(url, verbose=False)
    out = client.predict(*chat_args("What is the capital of France?", gamma="auto", max_tokens=24, target=target),
                         api_name="/chat")
    msg, chatbot, details, *_, error = out
    assert error == "" and details["error"] is None, error
    assert details["framing"] == framing
    assert details["tokens"] and details["stats"]["generated"] >= len(details["tokens"])
    reply = "".join(p for p, _ in details["segments"])
    assert "User:" not in reply  # the transcript's stop string never reaches the screen
    assert len(chatbot) == 2

    out = client.predict(*chat_args("And of Italy?", gamma="auto", max_tokens=16, target=target), api_name="/chat")
    assert out[-1] == "" and out[2]["error"] is None and out[2]["tokens"]
    assert len(out[1]) == 4 and out[2]["prompt_tokens"] > details["prompt_tokens"]


@pytest.mark.slow
@pytest.mark.parametrize("gamma", ["0", "auto"])
def test_live_measured_speedup_never_exceeds_tokens_per_target_call(app, gamma):
    """The live panel's speedups are the Reply's: measured can never beat tokens per target call
    (a reply at about one token per call never shows much more than 1x)."""

    _, url = app
    client = Client(url, verbose=False)
    out = client.predict(*chat_args(COPY_PROMPT, gamma=gamma, max_tokens=40), api_name="/chat")
    _, _, details, live, _, speed_plot, error = out
    assert error == "" and details["steps"], error
    for p in details["steps"]:
        assert p["measured"] is not None and p["predicted"] is not None
        assert p["measured"] <= p["tokens_per_call"] + 1e-9, p
    assert details["speedup"]["measured"] <= details["stats"]["tokens_per_call"] + 1e-9
    m = re.search(r"([\d.]+) tokens per target call \| speedup predicted ([\d.]+)x, measured ([\d.]+)x", live)
    assert m, live
    assert float(m.group(3)) <= float(m.group(1)) + 0.005
    if gamma == "0":
        assert details["stats"]["drafted"] == 0 and details["stats"]["tokens_per_call"] <= 1.0
        assert details["speedup"]["predicted"] == pytest.approx(1.0)


def test_a_logged_in_user_drafts_from_its_keys_answers_only():
    """Issue 44: under `serve --ui --api-key A,B` the web UI built its requests with no owner, so every
    user drafted from one store of earlier answers (B's chats from A's). A logged-in user's requests
    are its key's, as the API's are; a user name belongs to the key it first logged in with."""
    import httpx

    from edgespec.apps.args import key_auth, key_owner

    blocks = build_app(OPTS, Defaults(target="smollm2-135m", max_tokens=32))
    url = start(blocks, port=free_port(), block=False, auth=key_auth("ui-key-a,ui-key-b"))
    first = "Write a Python function that returns the square of a number."
    second = "Write a Python function that returns the cube of a number."

    def chat(user: str, key: str, text: str) -> dict:  # a fresh browser session: a conversation of one turn
        out = run_job(Client(url, verbose=False, auth=(user, key)), chat_args(text, drafter="suffix", gamma="4",
                                                                               max_tokens=48))
        assert out[-1] == "", out[-1]
        return out[2]["stats"]

    try:
        chat("alice", "ui-key-a", first)
        assert chat("alice", "ui-key-a", second)["source_accepted"].get("answers", 0) > 0
        assert chat("bob", "ui-key-b", second)["source_drafted"].get("answers", 0) == 0
        assert blocks.edgespec.owner("alice") == key_owner("ui-key-a") != blocks.edgespec.owner("bob")
        refused = httpx.post(url.rstrip("/") + "/login", data={"username": "alice", "password": "ui-key-b"}, timeout=30)
        assert refused.status_code == 400
    finally:
        blocks.close()


def test_a_reply_format_holds_the_reply_to_a_schema_and_its_forced_tokens_are_drafted(app):
    """The Chat tab's Reply format box: a JSON schema holds the reply to it, the tokens it forces are
    drafted and shown in their own colour; text that is not JSON, or a schema the engine cannot
    hold a reply to, is a visible one-line error."""
    _, url = app
    client = Client(url, verbose=False)
    schema = ('{"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, '
              '"country": {"enum": ["France", "Germany", "Italy"]}}, "required": ["city", "country"], '
              '"additionalProperties": false}')
    out = client.predict(*chat_args("Where is the Eiffel tower?", max_tokens=40), schema, api_name="/chat")
    assert out[-1] == "", out[-1]
    data = out[2]
    reply = json.loads("".join(text for text, _ in data["segments"]))
    assert set(reply) == {"city", "country"} and reply["country"] in ("France", "Germany", "Italy")
    assert "grammar" in {source for _, source in data["segments"]}, data["segments"]
    assert "tok-grammar" in bubble(out[1])
    for bad, says in (("{city", "the reply format is not JSON"), ('{"type": "strin"}', "strin")):
        out = client.predict(*chat_args("Where is the Eiffel tower?", max_tokens=8), bad, api_name="/chat")
        assert says in out[-1], out[-1]
        one_line_error(out[-1])
