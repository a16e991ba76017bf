"""Structured output: the grammar specs of service/structured.py (schemas the engine refuses are one
line naming the part), and `response_format` through a real `serve` on 127.0.0.1 driven by the
official openai client: `parse()` with a Pydantic model, json_object, json_schema on
/v1/completions, streamed provenance 'grammar', finish_reason 'length' inside the JSON, 400s that
name the field, and every reply valid under its schema."""

from __future__ import annotations

import json

import httpx
import pytest
from pydantic import BaseModel, Field

from edgespec.core.grammar import GRAMMAR
from edgespec.service.structured import (
    StructuredOutputError,
    closed_objects,
    json_object_grammar,
    json_schema_grammar,
    lark_grammar,
)
from tests.test_server import KEY, Served, error_of, start_server, stop_server

MODEL = "smollm2-135m"


class Ticket(BaseModel):
    title: str = Field(max_length=60)
    priority: str = Field(pattern="^(low|medium|high)$")
    component: str = Field(max_length=30)
    reporter_email: str = Field(max_length=60)


PROMPTS = [
    "Turn this bug report into a ticket (title, priority low/medium/high, component, reporter_email):\n"
    "From: dana.kim@acme.dev - The login page crashes when the password field is empty. Urgent, it blocks "
    "everyone. Component: auth.",
    "Ticket JSON please. Reporter sam@example.org says the CSV export in the reports module drops the last row. "
    "Not urgent.",
    "Make a ticket: the search box (component: search) is slow for long queries; reported by lee@corp.io; "
    "medium priority.",
]


# ----------------------------------------------------------------------------- grammar specs, no model
@pytest.mark.parametrize(("schema", "names"), [
    ({"type": "object", "properties": {"a": {"type": "strin"}}}, ["/properties/a/type", "strin"]),
    ({"type": "object", "properties": {"a": {"type": "string", "if": {}}}}, ["/properties/a/if", "if"]),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}}, ["/properties/a/$ref", "Missing"]),
    ({"type": "string", "format": "no-such-format"}, ["/format", "no-such-format"]),
])
def test_a_schema_the_engine_cannot_handle_is_one_line_naming_the_part(schema, names):
    with pytest.raises(StructuredOutputError) as exc:
        json_schema_grammar(schema)
    msg = str(exc.value)
    assert "\n" not in msg and isinstance(exc.value, ValueError)
    for name in names:
        assert name in msg, msg


def test_strict_refuses_what_the_engine_does_not_enforce_and_lenient_ignores_it():
    schema = {"type": "object", "properties": {"n": {"type": "integer", "if": {"minimum": 1}}}}
    with pytest.raises(StructuredOutputError, match="if"):
        json_schema_grammar(schema, strict=True)
    assert json_schema_grammar(schema, strict=False)
    assert json_object_grammar()


def test_objects_that_list_properties_admit_only_those_keys_unless_they_say_otherwise():
    schema = {"type": "object",
              "properties": {"who": {"type": "object", "properties": {"name": {"type": "string"}}},
                             "tags": {"type": "array", "items": {"properties": {"k": {}}}},
                             "alt": {"anyOf": [{"properties": {"z": {}}}, {"type": "null"}]},
                             "free": {"type": "object", "properties": {"q": {}}, "additionalProperties": True},
                             "pat": {"properties": {"q": {}}, "patternProperties": {"^x": {}}},
                             "any": {"type": "object"},
                             "ref": {"$ref": "#/$defs/Alone"},
                             "both": {"allOf": [{"$ref": "#/$defs/Base"}, {"properties": {"w": {}}}]},
                             "one": {"allOf": [{"properties": {"v": {}}}]}},
              "$defs": {"Alone": {"properties": {"a": {}}}, "Base": {"properties": {"id": {}}}}}
    closed = closed_objects(schema)
    props = closed["properties"]
    assert closed["additionalProperties"] is False
    assert props["who"]["additionalProperties"] is False
    assert props["tags"]["items"]["additionalProperties"] is False
    assert props["alt"]["anyOf"][0]["additionalProperties"] is False
    assert props["free"]["additionalProperties"] is True  # asked for other keys
    assert "additionalProperties" not in props["pat"]  # says which other keys it takes
    assert "additionalProperties" not in props["any"]  # lists no properties: any object
    assert closed["$defs"]["Alone"]["additionalProperties"] is False
    assert props["one"]["allOf"][0]["additionalProperties"] is False  # a single member intersects nothing
    # an intersection keeps its members open, and the definitions they refer to
    assert "additionalProperties" not in props["both"]["allOf"][1]
    assert "additionalProperties" not in closed["$defs"]["Base"]
    assert "additionalProperties" not in schema and "additionalProperties" not in schema["properties"]["who"]


def test_a_schema_grammar_refuses_keys_the_schema_does_not_list(smollm2):
    from llguidance.llamacpp import lltokenizer_from_vocab

    from tests.test_tools import matcher_accepts

    tok = lltokenizer_from_vocab(smollm2._vocab)
    person = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    ok, more = '{"name": "Ann", "age": 31}', '{"name": "Ann", "age": 31, "email": "ann@x.org"}'
    assert matcher_accepts(tok, json_schema_grammar(person), smollm2, ok)
    assert not matcher_accepts(tok, json_schema_grammar(person), smollm2, more)
    assert matcher_accepts(tok, json_schema_grammar({**person, "additionalProperties": True}), smollm2, more)
    assert matcher_accepts(tok, json_object_grammar(), smollm2, more)


def test_lark_grammar_is_checked():
    assert lark_grammar('start: "yes" | "no"')
    with pytest.raises(StructuredOutputError, match="the grammar"):
        lark_grammar("start: 'a' |")
    with pytest.raises(StructuredOutputError, match="empty"):
        lark_grammar("  ")


# ----------------------------------------------------------------------------- through serve
@pytest.fixture(scope="module")
def served():
    s = start_server("--target", MODEL, "--draft", "ngram", "--ctx", "1024", "--flash-attn", "off", "--api-key", KEY,
                     timeout=420)  # the first start measures the cost profile
    yield s
    stop_server(s)


def _parse(served: Served):
    completions = served.client.chat.completions
    return completions.parse if hasattr(completions, "parse") else served.client.beta.chat.completions.parse


def test_openai_parse_with_a_pydantic_model_returns_a_valid_object(served):
    for text in PROMPTS:
        done = _parse(served)(model=MODEL, messages=[{"role": "user", "content": text}], response_format=Ticket,
                              max_tokens=200)
        choice = done.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Ticket), choice.message.content
        assert Ticket.model_validate_json(choice.message.content) == choice.message.parsed


def test_every_reply_is_valid_under_its_schema_and_forced_tokens_are_drafted(served):
    # what OpenAI's strict mode takes (and its client sends for a Pydantic model): no properties beyond the
    # schema's (a schema that says nothing of other keys is read so too: closed_objects)
    strict = {**Ticket.model_json_schema(), "additionalProperties": False}
    schema = {"type": "json_schema", "json_schema": {"name": "ticket", "schema": strict, "strict": True}}
    forced = 0
    for text in PROMPTS:
        for seed in (1, 2):
            r = served.post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": text}],
                                                     "response_format": schema, "max_tokens": 200,
                                                     "temperature": 0.7, "seed": seed})
            assert r.status_code == 200, r.text
            body = r.json()
            Ticket.model_validate_json(body["choices"][0]["message"]["content"])
            assert body["choices"][0]["finish_reason"] == "stop"
            forced += body["timings"]["draft_n_accepted_by_source"].get(GRAMMAR, 0)
            assert GRAMMAR in body["edgespec"]["drafted_by"]
    assert forced > 0


def test_json_object_and_completions_endpoint(served):
    r = served.post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "A JSON "
                                             "object describing a cat, please."}], "max_tokens": 120,
                                             "response_format": {"type": "json_object"}})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"]["content"].startswith("{")
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
              "additionalProperties": False}
    r = served.post("/v1/completions", {"model": MODEL, "prompt": "Q: Is the sea salty? Reply in JSON.\nA: ",
                                        "max_tokens": 20, "response_format": {"type": "json_schema", "json_schema":
                                                                              {"name": "a", "schema": schema}}})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert json.loads(choice["text"])["answer"] in ("yes", "no") and choice["finish_reason"] == "stop"


def test_streamed_chunks_carry_grammar_provenance(served):
    schema = {"type": "json_schema", "json_schema": {"name": "ticket", "schema": Ticket.model_json_schema()}}
    text, drafted_by, finish = "", [], None
    with httpx.stream("POST", f"{served.url}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": MODEL, "messages": [{"role": "user", "content": PROMPTS[0]}], "stream": True,
                            "max_tokens": 200, "response_format": schema}, timeout=120) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            choice = chunk["choices"][0]
            text += choice["delta"].get("content") or ""
            drafted_by += chunk.get("edgespec", {}).get("drafted_by", [])
            finish = choice["finish_reason"] or finish
    Ticket.model_validate_json(text)
    assert GRAMMAR in drafted_by and finish == "stop"


def test_max_tokens_inside_the_json_says_length(served):
    r = served.post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": PROMPTS[0]}],
                                             "max_tokens": 5, "response_format": {"type": "json_schema", "json_schema":
                                             {"name": "t", "schema": Ticket.model_json_schema()}}})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(("fmt", "param", "words"), [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties":
                                                                      {"a": {"type": "strin"}}}}},
     "response_format.json_schema.schema", ["/properties/a/type", "strin"]),
    ({"type": "json_schema", "json_schema": "nope"}, "response_format.json_schema", ["must be an object"]),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "object"}, "strict": "yes"}},
     "response_format.json_schema.strict", ["true or false"]),
    ({"type": "xml"}, "response_format.type", ["json_schema", "'xml'"]),
])
def test_a_bad_response_format_is_a_400_naming_the_field(served, fmt, param, words):
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
                       ("/v1/completions", {"prompt": "Hi"})):
        r = served.post(path, {"model": MODEL, "max_tokens": 4, "response_format": fmt, **body})
        assert r.status_code == 400, r.text
        err = error_of(r)
        assert err["param"] == param
        for word in words:
            assert word in err["message"], err
