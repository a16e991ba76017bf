"""The session layer: one request type, one prompt-framing function, stop strings, one fold."""

from __future__ import annotations

import pytest

from edgespec.engine import Stats, StepEvent
from edgespec.errors import EdgeSpecError
from edgespec.loader import RuntimeOptions
from edgespec.session import TRANSCRIPT_STOP, Request, Session, StopStrings, frame, parse_gamma


def event(pieces: list[str], done: bool = False) -> StepEvent:
    n = len(pieces)
    return StepEvent(list(range(n)), ["target"] * n, pieces, [""] * n, 0, 0, 0, Stats(), "length" if done else None)


def feed(stops: list[str], steps: list[list[str]]) -> tuple[str, bool, list[str]]:
    f = StopStrings(stops)
    shown: list[str] = []
    for i, pieces in enumerate(steps):
        out, hit = f.push(event(pieces, done=i == len(steps) - 1))
        shown.append("".join(p for _, _, p, _ in out))
        if hit:
            return f.text, True, shown
    return f.text, False, shown


def test_stop_string_inside_one_step():
    text, hit, _ = feed(["\nUser:"], [["Hello", " there", "\n", "User", ":", " more"]])
    assert hit and text == "Hello there"


def test_stop_string_across_steps_is_never_shown_in_part():
    text, hit, shown = feed(["\nUser:"], [["Hi", "\n"], ["User"], [":", " x"]])
    assert hit and text == "Hi"
    assert shown[0] == "Hi"  # the newline waits: it may start the stop string
    assert shown[1] == ""


def test_held_text_is_released_when_it_is_not_a_stop():
    text, hit, shown = feed(["\nUser:"], [["Hi", "\n"], ["Use"], ["d it"]])
    assert not hit and text == "Hi\nUsed it" and shown == ["Hi", "", "\nUsed it"]


def test_no_stop_strings_release_everything_at_once():
    _, hit, shown = feed([], [["a", "b"], ["c"]])
    assert not hit and shown == ["ab", "c"]


@pytest.mark.parametrize("kw, msg", [
    ({}, "one of them"),
    ({"text": "  "}, "empty"),
    ({"messages": [{"role": "assistant", "content": "hi"}]}, "end with the user"),
    ({"text": "hi", "framing": "poem"}, "framing"),
    ({"text": "hi", "framing": "raw", "system": "be brief"}, "system message"),
    ({"text": "hi", "gamma": "1000"}, "gamma 1000"),
    ({"text": "hi", "gamma": "-1"}, "gamma"),
    ({"text": "hi", "max_tokens": 0}, "max tokens"),
    ({"text": "hi", "stop": ("",)}, "stop strings"),
])
def test_bad_requests_are_one_line(kw, msg):
    with pytest.raises(EdgeSpecError, match=msg):
        Request(**kw)


def test_gamma_is_always_a_policy():
    assert parse_gamma("auto").label == "auto" and parse_gamma(4).label == "4" and parse_gamma("0").label == "0"


def test_framing_follows_the_model(smollm2, gemma):
    chat = frame(smollm2, Request(text="Hi"))
    text = smollm2.detokenize(chat.tokens)  # special tokens render empty
    assert chat.framing == "chat" and "user\nHi" in text and text.rstrip().endswith("assistant")
    assert frame(gemma, Request(text="Hi")).framing == "raw"
    convo = Request(messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                              {"role": "user", "content": "How are you?"}], system="Be brief.")
    tr = frame(gemma, convo)
    assert tr.framing == "transcript" and tr.stop == (TRANSCRIPT_STOP,)
    assert gemma.detokenize(tr.tokens).endswith("Be brief.\n\nUser: Hi\nAssistant: Hello!\nUser: How are you?\nAssistant:")
    qa = frame(gemma, Request(text="Why?", framing="qa"))
    assert gemma.detokenize(qa.tokens).endswith("Question: Why?\nAnswer:")
    with pytest.raises(EdgeSpecError, match="no chat template"):
        frame(gemma, Request(text="Hi", framing="chat"))
    with pytest.raises(EdgeSpecError, match="system message"):
        frame(gemma, Request(text="Hi", system="Be brief."))


def test_a_base_model_chats_and_stops_at_the_next_user_turn(gemma_path):
    session = Session.load(str(gemma_path), RuntimeOptions(n_ctx=1024))
    try:
        reply = session.run(Request(messages=[{"role": "user", "content": "What colour is the sky?"}],
                                    max_tokens=64))
        assert reply.framing == "transcript" and reply.tokens
        assert "User:" not in reply.text
        assert len(reply.tokens) == len(reply.sources) == len(reply.pieces) and reply.text == "".join(reply.pieces)
        d = reply.to_dict()
        assert d["stats"]["generated"] >= len(reply.tokens) and d["backend"]["cpu_variant"]
    finally:
        session.close()
