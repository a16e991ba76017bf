"""OpenAI's Responses API through the real server (`serve` on 127.0.0.1, bundled SmolLM2, n-gram drafts, the
official `openai` client): a response is the chat completion its body means, text and function calls, whole
and as typed events; structured output through text.format; what it cannot take is a 400 in OpenAI's shape."""

from __future__ import annotations

import json

import pytest

from tests.test_server import error_of, start_server, stop_server
from tests.test_server_tools import ASK, EARLIER, WEATHER

KEY = "responses-key"
MODEL = "smollm2-135m"
FIXED = {"gamma": 4}
TOOL = {"type": "function", **WEATHER["function"]}  # the Responses shape: no "function" wrapper


def as_items(messages: list[dict]) -> list[dict]:
    """A chat conversation as Responses input items (what a client sends back from earlier responses)."""
    items: list[dict] = []
    for m in messages:
        if m.get("tool_calls"):
            items += [{"type": "function_call", "call_id": c["id"], "name": c["function"]["name"],
                       "arguments": c["function"]["arguments"]} for c in m["tool_calls"]]
        elif m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
        elif m["role"] == "assistant":
            items.append({"type": "message", "role": "assistant",
                          "content": [{"type": "output_text", "text": m["content"]}]})
        else:
            items.append({"role": m["role"], "content": [{"type": "input_text", "text": m["content"]}]})
    return items


@pytest.fixture(scope="module")
def server():
    served = start_server("--target", MODEL, "--draft", "ngram", "--ctx", "2048", "--flash-attn", "off",
                          "--threads", "1", "--api-key", KEY, timeout=600)
    served.client = served.client.with_options(api_key=KEY)
    yield served
    stop_server(served)


def respond(server, **kw):
    return server.client.responses.create(model=MODEL, temperature=0, extra_body=FIXED, **kw)


def chat(server, messages, **kw):
    return server.client.chat.completions.create(model=MODEL, messages=messages, temperature=0, extra_body=FIXED, **kw)


def test_a_response_is_the_chat_completion_it_means(server):
    system = "You are a terse assistant."
    question = "Name three colours of the rainbow."
    want = chat(server, [{"role": "system", "content": system}, {"role": "user", "content": question}], max_tokens=24)
    r = respond(server, instructions=system, input=question, max_output_tokens=24)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    assert r.output_text == want.choices[0].message.content and r.output_text
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"
    assert r.usage.input_tokens == want.usage.prompt_tokens and r.usage.output_tokens == want.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    status = "incomplete" if want.choices[0].finish_reason == "length" else "completed"
    assert r.status == status and (r.incomplete_details is None) == (status == "completed")
    assert r.store is False
    # input items with text parts, the same conversation
    again = respond(server, input=[{"role": "developer", "content": system},
                                   {"type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]}],
                    max_output_tokens=24)
    assert again.output_text == r.output_text


def test_function_calls_and_their_outputs(server):
    want = chat(server, [*EARLIER, ASK], tools=[WEATHER], max_tokens=48)
    (want_call,) = want.choices[0].message.tool_calls
    r = respond(server, input=as_items([*EARLIER, ASK]), tools=[TOOL], max_output_tokens=48)
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == json.loads(want_call.function.arguments) == {"city": "London"}
    assert r.output_text == "" and r.status == "completed"
    # streamed: the same call as one item, the events numbered from 0, the last one the whole response
    events = list(server.client.responses.create(model=MODEL, temperature=0, extra_body=FIXED, stream=True,
                                                 input=as_items([*EARLIER, ASK]), tools=[TOOL], max_output_tokens=48))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed", kinds
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(d.type, d.name, d.arguments) for d in done] == [("function_call", "get_weather", call.arguments)]
    assert events[-1].response.output[0].arguments == call.arguments
    # the call's output back in the input: the reply after it is the chat path's
    result = {"role": "tool", "tool_call_id": "call_z", "content": '{"temp_c": 11, "sky": "rain"}'}
    turn = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_z", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "London"}'}}]}
    after = chat(server, [*EARLIER, ASK, turn, result], tools=[WEATHER], tool_choice="none", max_tokens=32)
    r2 = respond(server, input=as_items([*EARLIER, ASK, turn, result]), tools=[TOOL], tool_choice="none",
                 max_output_tokens=32)
    assert r2.output_text == after.choices[0].message.content and r2.output_text


def test_streamed_text_is_the_whole_response(server):
    kw = dict(input="Write one sentence about the sea.", max_output_tokens=32)
    whole = respond(server, **kw)
    with server.client.responses.stream(model=MODEL, temperature=0, extra_body=FIXED, **kw) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == whole.output_text and deltas
    kinds = [e.type for e in events]
    order = ["response.output_item.added", "response.content_part.added", "response.output_text.delta",
             "response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert [k for k in dict.fromkeys(kinds) if k in order] == order, kinds
    assert kinds[-1] == ("response.incomplete" if whole.status == "incomplete" else "response.completed")


def test_text_format_holds_the_answer_to_a_schema(server):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    r = respond(server, input="Invent a person. Reply in JSON.", max_output_tokens=64,
                text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}})
    value = json.loads(r.output_text)
    assert set(value) == {"name", "age"} and isinstance(value["age"], int), r.output_text


@pytest.mark.parametrize("body, param, words", [
    ({"input": "hi", "previous_response_id": "resp_x"}, "previous_response_id", "does not store responses"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
     "input.0.content.0", "only text parts"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools.0.type", "only function tools"),
    ({"input": [{"type": "file_search_call", "id": "x"}]}, "input.0.type", "not supported"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input.0.role", "must be user"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input.0.call_id", "non-empty string"),
    ({"input": []}, "input", "at least 1"),
    ({"input": [{"role": "developer", "content": "Be brief."}]}, "input", "no user message"),
    ({"input": "hi", "tools": [{"type": "function", "name": "bad name"}]}, "tools.0.name", "letters, digits"),
    ({"input": "hi", "temperature": 9}, "temperature", "less than or equal"),
])
def test_what_it_cannot_take_is_a_400(server, body, param, words):
    r = server.post("/v1/responses", body, key=KEY)
    err = error_of(r)
    assert r.status_code == 400 and err["param"] == param and words in err["message"], r.text
