"""Tools in a conversation (`edgespec.service.tools`): reading calls out of finished and streamed text,
rendering tools, calls and results through the real models' chat templates (SmolLM2's has no place
for them; Qwen2.5's has, when the real pair is installed), and the grammar of a required call checked
by llguidance with the bundled model's own tokenizer."""

from __future__ import annotations

import json

import pytest

from edgespec.models import resolve_local
from edgespec.models.loader import RuntimeOptions
from edgespec.runtime.errors import EdgeSpecError
from edgespec.service import tools
from edgespec.service.session import Request, Session, frame, with_tool_grammar

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


# ----------------------------------------------------------------------------- reading calls
def test_parse_calls_out_of_text():
    content, calls = tools.parse_tool_calls(CALL)
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert calls[0].id.startswith("call_") and len(calls[0].id) > 10
    content, calls = tools.parse_tool_calls("Let me check.\n" + CALL + "\n" + CALL.replace("Paris", "Oslo"))
    assert content == "Let me check." and [json.loads(c.arguments)["city"] for c in calls] == ["Paris", "Oslo"]
    assert calls[0].id != calls[1].id


def test_text_that_is_no_call_stays_text():
    for text in ["Just an answer.", "<tool_call>\nnot json\n</tool_call>", '<tool_call>{"arguments": {}}</tool_call>',
                 "a < b and <tool_ is not a tag"]:
        assert tools.parse_tool_calls(text) == (text, [])
    # an answer that ended before the closing tag: a complete body still counts, a cut one does not
    content, calls = tools.parse_tool_calls('<tool_call>\n{"name": "get_time", "arguments": {}}')
    assert content is None and calls[0].name == "get_time" and calls[0].arguments == "{}"
    cut = '<tool_call>\n{"name": "get_time", "argu'
    assert tools.parse_tool_calls(cut) == (cut, [])


def streamed(text: str, size: int, hidden: str, names: tuple[str, ...] = ()) -> tuple[str, list]:
    """`text` pushed through a ToolCallStream `size` characters at a time: (the text shown, the calls),
    checking that `hidden` never shows; the calls and text must be what the whole text gives."""
    reader = tools.ToolCallStream(names)
    shown, calls = "", []
    for i in range(0, len(text), size):
        part, done = reader.push(text[i : i + size])
        assert hidden not in part
        shown, calls = shown + part, calls + done
    part, done = reader.push("", done=True)
    shown, calls = shown + part, calls + done
    content, whole = tools.parse_tool_calls(text, names)
    assert shown.strip() == content and [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole]
    return content, calls


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 1000])
def test_streamed_text_gives_what_the_whole_text_gives(size):
    text = "Checking both.\n" + CALL + "\n" + CALL.replace("Paris", "Rome") + "\n"
    streamed(text, size, "<")  # nothing of a tag is ever shown


def test_streamed_text_that_only_looked_like_a_tag_is_released():
    reader = tools.ToolCallStream()
    assert reader.push("x <tool") == ("x ", [])  # may begin a call: held
    assert reader.push("box> y") == ("<toolbox> y", [])
    assert reader.push(" <", done=True) == (" <", [])


FENCED = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Lyon"\n  }\n}\n```'
NAMES = ("get_weather", "get_time")


def test_calls_written_without_the_tags():
    """Qwen2.5-Coder-1.5B, left to choose (tool_choice 'auto'), answers the weather question with the
    call in a ```json fence, not in <tool_call> tags: FENCED is its answer, token for token."""
    for text in (FENCED, FENCED[len("```json\n"):-len("\n```")], "```\n" + FENCED[len("```json\n"):]):
        content, calls = tools.parse_tool_calls(text, NAMES)
        assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Lyon"})]
    content, calls = tools.parse_tool_calls("I'll look both up.\n" + FENCED + "\n" + FENCED.replace("Lyon", "Oslo"), NAMES)
    assert content == "I'll look both up." and [json.loads(c.arguments)["city"] for c in calls] == ["Lyon", "Oslo"]
    # without the request's names (or with a name not among them), an object like a call is text
    assert tools.parse_tool_calls(FENCED) == (FENCED, [])
    for text in (FENCED.replace("get_weather", "get_weathe"), FENCED.replace("get_weather", "get_weather_now"),
                 '{"name": "get_weather", "arguments": "not json"}', '{"name": "get_weather", "arguments": [1]}',
                 'Use `{"name": "get_weather", "arguments": {}}` to ask.',  # not at the start of a line
                 '```json\n{"name": "get_weather", "argu'):  # cut short: no call
        assert tools.parse_tool_calls(text, NAMES) == (text, []), text


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 1000])
def test_streamed_untagged_calls_give_what_the_whole_text_gives(size):
    text = ("Here is a config:\n```json\n{\"name\": \"build\", \"debug\": true}\n```\n```python\nx = {1: 2}\n```\n"
            "Checking.\n" + FENCED + "\n" + FENCED.replace("Lyon", "Rome")[len("```json\n"):-len("\n```")] + "\n")
    content, calls = streamed(text, size, '"get_weather"', NAMES)  # nothing of a call is ever shown
    assert [json.loads(c.arguments)["city"] for c in calls] == ["Lyon", "Rome"]
    assert content.startswith("Here is a config:\n```json\n{\"name\": \"build\"") and content.endswith("Checking.")


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_a_repeated_call_is_dropped_and_ends_the_answer(size):
    """A small model that has made a call makes it again until max_tokens: a call with the name and
    arguments of an earlier one (key order and spacing aside) is no second call, and `repeated` says
    so, tagged or not; a call that differs in any argument is a call of its own."""
    again = '<tool_call>\n{"arguments": {"city":"Paris"},  "name": "get_weather"}\n</tool_call>'
    text = "Checking.\n" + CALL + "\n" + again + "\n" + CALL.replace("Paris", "Rome") + "\n" + CALL + "\n"
    content, calls = streamed(text, size, "<")
    assert content == "Checking." and [json.loads(c.arguments)["city"] for c in calls] == ["Paris", "Rome"]
    reader = tools.ToolCallStream(NAMES)
    assert reader.push(FENCED + "\n")[1] and not reader.repeated
    assert reader.push(FENCED.replace("Lyon", "Oslo") + "\n")[1] and not reader.repeated
    assert reader.push(FENCED + "\n", done=True) == ("", []) and reader.repeated


def test_streamed_code_is_held_only_while_it_may_be_a_call():
    reader = tools.ToolCallStream(NAMES)
    assert reader.push("Sure:\n``") == ("Sure:\n", [])  # may open a fence
    assert reader.push("`py") == ("```py", [])  # a python block: shown at once
    assert reader.push("thon\n{") == ("thon\n", [])  # a brace at a line's start: held
    assert reader.push('"a": 1}') == ('{"a": 1}', [])  # its first key is not "name"
    assert reader.push('\n{"name": "get_w') == ("\n", [])  # the start of a call of get_weather: held
    assert reader.push('all"') == ('{"name": "get_wall"', [])  # no tool is named so
    assert reader.push("", done=True) == ("", [])


def test_an_answer_ends_at_its_first_repeated_call(smollm2):
    """Shown a list of calls, the bundled 135M model goes on writing calls, coming back to cities it
    already asked for: with the request's tools the answer ends at the first repeat (finish 'stop',
    before max_tokens) and reads as calls that differ; without tools the same text runs to max_tokens."""
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>\n'
    text = "".join(call % c for c in ("Paris", "Oslo", "Rome", "Lima", "Paris", "Oslo"))
    session = Session(smollm2, RuntimeOptions(n_ctx=2048))
    plain = session.run(Request(text=text, framing="raw", max_tokens=120, draft="none"))
    assert plain.finish_reason == "length"
    made = session.run(Request(text=text, framing="raw", tools=[WEATHER], max_tokens=120, draft="none"))
    assert made.finish_reason == "stop" and made.stats.generated < 120
    assert plain.text.startswith(made.text)  # the same answer, cut
    _, calls = tools.parse_tool_calls(made.text, ["get_weather"])
    assert len(calls) >= 2 and len({c.same_as() for c in calls}) == len(calls)


# ----------------------------------------------------------------------------- choices and grammar
def test_tool_choice_is_checked():
    tools.check_choice([WEATHER], {"type": "function", "function": {"name": "get_weather"}})
    with pytest.raises(EdgeSpecError, match="'nope', which is not among the tools"):
        tools.check_choice([WEATHER], {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(EdgeSpecError, match="no tools"):
        tools.check_choice(None, "required")
    with pytest.raises(EdgeSpecError, match="must be 'auto'"):
        tools.check_choice([WEATHER], "sometimes")
    with pytest.raises(EdgeSpecError, match="no tools"):
        Request(text="hi", tool_choice="required")


def matcher_accepts(tokenizer, grammar: str, model, text: str) -> bool:
    import llguidance

    m = llguidance.LLMatcher(tokenizer, grammar)
    assert not m.is_error(), m.get_error()
    return m.consume_tokens(model.tokenize(text, add_special=False, parse_special=True)) and m.is_accepting()


def test_a_required_call_forces_its_keys_and_separators(smollm2):
    """The call's JSON has response_format's one layout, so once the function is named the grammar
    forces everything up to the first argument's value (drafted for free); with any whitespace
    allowed it forced nothing after the name's closing quote."""
    from edgespec.core.grammar import Constraint
    from edgespec.runtime.grammar import grammar_tokenizer

    req = with_tool_grammar(smollm2, Request(messages=[{"role": "user", "content": "hi"}], tools=[WEATHER],
                                             tool_choice="required"))
    c = Constraint(grammar_tokenizer(smollm2), req.grammar)
    c.advance(smollm2.tokenize('<tool_call>\n{"name": "get_weather', add_special=False, parse_special=True))
    assert smollm2.detokenize(c.forced()) == '", "arguments": {"city": "'
    assert not matcher_accepts(grammar_tokenizer(smollm2), req.grammar, smollm2, CALL.replace('": "P', '":"P'))


def test_the_grammar_admits_a_call_of_the_named_function_with_schema_arguments(smollm2):
    from llguidance.llamacpp import lltokenizer_from_vocab

    tok = lltokenizer_from_vocab(smollm2._vocab)
    assert not tools.tags_are_tokens(smollm2)  # SmolLM2 writes the tags as text
    one = with_tool_grammar(smollm2, Request(messages=[{"role": "user", "content": "hi"}], tools=[WEATHER, TIME],
                                             tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    assert one.grammar is not None
    assert matcher_accepts(tok, one.grammar, smollm2, CALL)
    assert matcher_accepts(tok, one.grammar, smollm2, CALL.replace('"Paris"}', '"Paris", "days": 3}'))
    assert not matcher_accepts(tok, one.grammar, smollm2, CALL.replace("get_weather", "get_time"))  # another function
    assert not matcher_accepts(tok, one.grammar, smollm2, CALL.replace('"Paris"', "3"))  # city must be a string
    assert not matcher_accepts(tok, one.grammar, smollm2, CALL.replace('"city"', '"town"'))  # city is required
    assert not matcher_accepts(tok, one.grammar, smollm2, "Sure! " + CALL)  # no text before the call
    # a key the parameters do not list (they say nothing of others: closed, as llama.cpp's server reads them)
    assert not matcher_accepts(tok, one.grammar, smollm2, CALL.replace('"Paris"}', '"Paris", "type": "object"}'))
    open_ = {"type": "function", "function": {**WEATHER["function"], "parameters": {
        **WEATHER["function"]["parameters"], "additionalProperties": True}}}
    other = with_tool_grammar(smollm2, Request(messages=[{"role": "user", "content": "hi"}], tools=[open_],
                                               tool_choice="required"))
    assert matcher_accepts(tok, other.grammar, smollm2, CALL.replace('"Paris"}', '"Paris", "type": "object"}'))
    assert "additionalProperties" not in WEATHER["function"]["parameters"]  # the caller's tools are left as they are
    any_ = with_tool_grammar(smollm2, Request(messages=[{"role": "user", "content": "hi"}], tools=[WEATHER, TIME],
                                              tool_choice="required", parallel_tool_calls=True))
    both = CALL + '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    assert matcher_accepts(tok, any_.grammar, smollm2, both)
    # one call unless several are asked for
    single = with_tool_grammar(smollm2, Request(messages=[{"role": "user", "content": "hi"}], tools=[WEATHER, TIME],
                                                tool_choice="required"))
    assert matcher_accepts(tok, single.grammar, smollm2, CALL) and not matcher_accepts(tok, single.grammar, smollm2, both)
    # auto and none leave the output free
    for choice in ("auto", "none"):
        assert with_tool_grammar(smollm2, Request(messages=[{"role": "user", "content": "hi"}], tools=[WEATHER],
                                                  tool_choice=choice)).grammar is None


# ----------------------------------------------------------------------------- rendering
HISTORY = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 18}'},
]


def test_a_template_without_tools_gets_them_written_in(smollm2):
    caps = tools.template_caps(smollm2)
    assert not caps.tools and not caps.tool_calls  # SmolLM2's ChatML template shows content only
    req = Request(messages=HISTORY, tools=[WEATHER], system="Be brief.")
    text = smollm2.render_special(frame(smollm2, req).tokens)
    assert text.index("Be brief.") < text.index('"name": "get_weather"') < text.index("What is the weather")
    assert CALL in text  # the earlier call, as the model would write it
    assert '{"temp_c": 18}' in text and text.endswith("<|im_start|>assistant\n")
    # tool_choice none: the tools are not shown, the history still is
    hidden = smollm2.render_special(frame(smollm2, Request(messages=HISTORY, tools=[WEATHER], tool_choice="none")).tokens)
    assert "get_weather" in hidden and "<tools>" not in hidden


def test_a_base_model_transcript_gets_tools_calls_and_results(gemma):
    text = gemma.detokenize(frame(gemma, Request(messages=HISTORY, tools=[WEATHER], framing="transcript")).tokens)
    assert "<tools>" in text and "Assistant: <tool_call>" in text and "User: <tool_response>" in text
    assert text.endswith("Assistant:")


def test_prefix_of_a_tool_conversation_stays_put(smollm2):
    """The next turn's prompt begins with this turn's (prefix reuse across tool turns)."""
    first = frame(smollm2, Request(messages=HISTORY[:1], tools=[WEATHER])).tokens
    second = frame(smollm2, Request(messages=HISTORY, tools=[WEATHER])).tokens
    assert second[: len(first)] == first


QWEN = resolve_local("qwen2.5-coder-1.5b")


@pytest.mark.slow
@pytest.mark.skipif(QWEN is None, reason="the real pair is not installed: python app.py models install coder-pair")
def test_qwen_renders_tools_calls_and_results_in_its_own_sections():
    from edgespec.runtime.llama import Model

    qwen = Model(QWEN, n_ctx=512, flash_attn="off")
    try:
        caps = tools.template_caps(qwen)
        assert caps == tools.TemplateCaps(True, True, True)
        assert tools.tags_are_tokens(qwen)
        text = qwen.render_special(frame(qwen, Request(messages=HISTORY, tools=[WEATHER])).tokens)
        assert "# Tools" in text and '"name": "get_weather"' in text and "<tool_response>" in text
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
        # the grammar names the tags as Qwen's own tokens, so the call the model writes is admitted
        from llguidance.llamacpp import lltokenizer_from_vocab

        tok = lltokenizer_from_vocab(qwen._vocab)
        req = with_tool_grammar(qwen, Request(messages=HISTORY[:1], tools=[WEATHER], tool_choice="required"))
        assert "start: call" in req.grammar and "<tool_call> " in req.grammar
        assert matcher_accepts(tok, req.grammar, qwen, CALL)
        assert not matcher_accepts(tok, req.grammar, qwen, CALL.replace("get_weather", "get_time"))
    finally:
        qwen.close()
