"""The OpenAI wire format: request bodies (validated by pydantic), their translation into a
`session.Request` under the server's command-line defaults, and the response objects built from a
finished or running generation. No HTTP and no threads here: `worker` runs the requests, `http`
answers them."""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edgespec.core import drafters
from edgespec.core.drafters.prediction import PREDICTION
from edgespec.core.engine import TOP_LOGPROBS_MAX
from edgespec.core.sampling import SamplingParams
from edgespec.runtime.errors import EdgeSpecError, one_line
from edgespec.service import tools as tooling
from edgespec.service.session import Reply, Request, finite
from edgespec.service.structured import StructuredOutputError, json_object_grammar, json_schema_grammar

Kind = Literal["chat", "completion"]
MAX_BODY = 8 << 20  # bytes
MAX_DEPTH = 64  # nesting of arrays and objects in a body (JSON schemas in tools nest; nothing else does)
GZIP_MAGIC = b"\x1f\x8b"
MAX_STOPS = 16
MIN_RATE_TOKENS = 4  # prompt tokens a prefill must decode for timings.prompt_per_second to be given
FINISH = {"eog": "stop", "stop": "stop", "grammar": "stop", "length": "length", "context": "length", "stopped": "stop"}
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name


# ----------------------------------------------------------------------------- errors
class ApiError(Exception):
    """An error answered in the OpenAI shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.kind = kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


# ----------------------------------------------------------------------------- request bodies
class Body(BaseModel):
    # Unknown fields are ignored, as OpenAI-compatible servers do (clients send many).
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=5.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)  # extension (llama-server, vLLM)
    min_p: float | None = Field(None, ge=0.0, lt=1.0)  # extension
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1)
    logprobs: bool | int | None = None  # chat: true/false; completions: how many alternatives (0-20)
    top_logprobs: int | None = Field(None, ge=0, le=TOP_LOGPROBS_MAX)  # chat: alternatives per token
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repeat_penalty: float | None = Field(None, gt=0.0, le=10.0)  # llama-server's names
    repeat_last_n: int | None = Field(None, ge=-1)
    logit_bias: dict[str, float | bool] | None = None  # token id -> -100..100 (OpenAI); false bans it (llama-server)
    response_format: dict[str, Any] | None = None
    # EdgeSpec / llama-server extensions
    draft: str | None = None  # 'none' or the server's --draft
    gamma: str | int | None = None  # a number or 'auto'
    cache_prompt: bool = True  # llama-server's name: reuse the cached prefix
    ignore_eos: bool = False  # llama-server's name: generate past end-of-generation tokens (and the turn's end)
    prediction: Prediction | None = None  # predicted output: drafted from first where the answer follows it


class Part(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None


class Prediction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["content"]
    content: str | list[Part]


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: str | dict[str, Any] = "{}"  # JSON text (OpenAI); an object is taken too


class MessageToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str | list[Part] | None = None
    tool_calls: list[MessageToolCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool result: the call it answers
    name: str | None = None


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: FunctionDef


class ChatBody(Body):
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Any = None  # 'auto' | 'none' | 'required' | {"type": "function", "function": {"name": ...}}
    parallel_tool_calls: bool | None = None


class CompletionBody(Body):
    prompt: str | list[str] | list[int] | list[list[int]]  # text, or token ids as llama-server takes them
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


def parse(raw: bytes, kind: Kind, content_encoding: str = "") -> ChatBody | CompletionBody:
    """A request body validated as `kind`'s, or an ApiError (413, 415 for a compressed body, or 400
    naming the first bad field)."""
    return validate(load_body(raw, content_encoding), ChatBody if kind == "chat" else CompletionBody)


def validate(data: dict, cls: type[BaseModel]) -> Any:
    """`data` as a `cls` body, or a 400 naming the first bad field."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc.errors()) from None


def load_body(raw: bytes, content_encoding: str = "") -> dict:
    """A request body's JSON object, or an ApiError (413, 415 for a compressed body, 400)."""
    encoding = content_encoding.strip().lower()
    if encoding not in ("", "identity") or raw[:2] == GZIP_MAGIC:
        what = f"Content-Encoding {encoding!r}" if encoding not in ("", "identity") else "a gzip-compressed body"
        raise ApiError(415, f"{what} is not supported: send the JSON body uncompressed", "unsupported_media_type")
    if len(raw) > MAX_BODY:
        raise ApiError(413, f"the request body is larger than {MAX_BODY >> 20} MB")
    try:
        data = json.loads(raw)
    except RecursionError:
        raise ApiError(400, f"the request body nests arrays or objects more than {MAX_DEPTH} levels deep",
                       "invalid_json") from None
    except ValueError as exc:
        msg = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise ApiError(400, f"the request body is not valid JSON: {msg}", "invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", "invalid_json")
    _check_values(data)
    return data


def _check_values(data: dict) -> None:
    """400 for a body nested deeper than MAX_DEPTH (no field of these bodies is; deep values would
    exhaust the stack of whatever walks them) or holding a string that is not Unicode text (JSON's
    \\uD800 escapes decode to lone surrogates, which UTF-8, the tokenizer's input, cannot hold)."""
    todo: list[tuple[Any, str, int]] = [(data, "", 0)]
    while todo:
        value, where, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise ApiError(400, f"the request body nests arrays or objects more than {MAX_DEPTH} levels deep",
                           "invalid_json")
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ApiError(400, f"{where or 'the body'}: a string holds a lone UTF-16 surrogate (a \\ud800-\\udfff "
                               "escape without its pair), which is no character", "invalid_value",
                               param=where or None) from None
            continue
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            todo.append((key, where, depth + 1))  # a key is checked as a string of its object
            todo.append((item, f"{where}.{key}" if where else str(key), depth + 1))


# pydantic's names for the members of a union, as a client would say them
_TYPE_WORDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
               "list[str]": "a list of strings", "list[int]": "a list of token ids",
               "list[list[int]]": "a list of token-id lists", "list[Part]": "a list of content parts",
               "dict[str,any]": "an object", "none": "null"}


def _validation_error(errors: list[dict]) -> ApiError:
    """One line for pydantic's errors, naming the field as the client wrote it: pydantic adds the
    name of each union member it tried (messages.0.content.str), which is no field of the body.
    Where every member failed at the field itself, say what it may be; where one member went
    deeper (a list of parts with a bad part), that member's error is the one the client needs."""
    found = [(_body_path(e["loc"]), e) for e in errors]
    (path, _), err = max(found, key=lambda f: len(f[0][0]))
    where = ".".join(path)
    members = [m for (p, m), _ in found if p == path and m is not None]
    others = {".".join(p) for (p, _), _ in found if p != path[:len(p)]}
    more = f" (and {len(others)} more)" if others else ""
    if len(members) > 1:
        words = list(dict.fromkeys(_TYPE_WORDS.get(m, m) for m in members))
        return ApiError(400, f"{where}: must be {' or '.join(words)}{more}", "invalid_type", param=where)
    return ApiError(400, f"{where}: {err['msg']}{more}", "invalid_type" if "type" in err["type"] else "invalid_value",
                    param=where)


def _body_path(loc: tuple) -> tuple[list[str], str | None]:
    """`loc` without the union members' names (no field of these bodies is called 'str' or
    'list[Part]'), and the first such name, if any."""
    path: list[str] = []
    member = None
    for part in loc:
        if isinstance(part, str) and (part in _TYPE_WORDS or "[" in part):
            member = member or part
        else:
            path.append(str(part))
    return path, member


# ----------------------------------------------------------------------------- body -> session.Request
def to_request(body: ChatBody | CompletionBody, defaults: Request, draft_spec: str) -> tuple[Request, bool]:
    """The session.Request of a validated body, the server's command-line `defaults` filling what it
    does not set; returns (request, whether the body gave max_tokens)."""
    _unsupported(body)
    draft = _draft(body, defaults, draft_spec)
    stops = _stops(body, defaults)
    max_tokens = body.max_completion_tokens or body.max_tokens
    d = defaults
    prediction = None if body.prediction is None else _text(body.prediction.content, "prediction")
    try:
        common = dict(draft=draft, gamma=d.gamma if body.gamma is None else str(body.gamma),
                      max_tokens=max_tokens or d.max_tokens, sampling=_sampling(body, d.sampling), stop=stops,
                      reuse_prefix=d.reuse_prefix and body.cache_prompt, stop_at_eog=not body.ignore_eos,
                      ngram=d.ngram, verifier=d.verifier, prediction=prediction or None,
                      grammar=_grammar(body), logprobs=_logprobs(body))
        if isinstance(body, CompletionBody):
            return Request(**_prompt(body), framing="raw", **common), max_tokens is not None
        system, messages = _conversation(body)
        tools, choice = _tools(body)
        if tools and common["grammar"] is not None and tooling.must_call(choice):
            raise ApiError(400, "tool_choice: a required tool call and response_format cannot both hold (the reply "
                           "is either a call or the format's text); drop one", "invalid_value", param="tool_choice")
        framing = d.framing if d.framing in ("auto", "chat", "transcript") else "auto"
        return (Request(messages=messages, system=d.system if system is None else system, framing=framing,
                        tools=tools, tool_choice=choice, parallel_tool_calls=body.parallel_tool_calls is True,
                        **common), max_tokens is not None)
    except EdgeSpecError as exc:
        raise ApiError(400, one_line(exc)) from None


def _unsupported(body: Body) -> None:
    if body.n != 1:
        raise ApiError(400, "n > 1 is not supported (one choice per request)", param="n")


def _logprobs(body: Body) -> int | None:
    """How many alternatives each token's log-probability comes with, None when none are asked:
    chat takes `logprobs: true` with `top_logprobs`, completions a number in `logprobs` (OpenAI's two
    shapes)."""
    chat = isinstance(body, ChatBody)
    lp = body.logprobs
    if chat and body.top_logprobs is not None and lp is not True:
        raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    if lp is None or lp is False:
        return None
    if lp is True:
        return (body.top_logprobs or 0) if chat else 0
    if not 0 <= lp <= TOP_LOGPROBS_MAX:
        raise ApiError(400, f"logprobs must be 0 to {TOP_LOGPROBS_MAX}, got {lp}", param="logprobs")
    return lp


def _grammar(body: Body) -> str | None:
    """The grammar `response_format` asks for (service.structured), None for text; a schema the
    grammar engine cannot handle is a 400 naming the field and the part of the schema."""
    fmt = body.response_format
    kind = "text" if fmt is None else fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return json_object_grammar()
    if kind != "json_schema":
        raise ApiError(400, f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
                       param="response_format.type")
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict):
        raise ApiError(400, "response_format.json_schema must be an object ({\"name\", \"schema\", \"strict\"})",
                       param="response_format.json_schema")
    schema, strict = spec.get("schema", {"type": "object"}), spec.get("strict") or False
    if not isinstance(strict, bool):
        raise ApiError(400, f"response_format.json_schema.strict must be true or false, got {strict!r}",
                       param="response_format.json_schema.strict")
    try:
        return json_schema_grammar(schema, strict=strict)
    except StructuredOutputError as exc:
        raise ApiError(400, f"response_format.json_schema.schema: {exc}", "invalid_schema",
                       param="response_format.json_schema.schema") from None


def _draft(body: Body, defaults: Request, draft_spec: str) -> str:
    """The body's drafter: 'none', the server's own, or a registered drafter that loads no model
    (ngram, suffix: built per request at no cost, so a client can compare them on one server)."""
    if body.draft is None:
        return defaults.draft
    if body.draft in ("none", draft_spec):
        return body.draft
    cheap = [k.name for k in drafters.kinds().values() if not k.takes_model]
    if body.draft not in cheap:
        raise ApiError(400, f"draft must be 'none', this server's drafter {draft_spec!r} or one of "
                       f"{', '.join(cheap)}, got {body.draft!r}", param="draft")
    return body.draft


def _stops(body: Body, defaults: Request) -> tuple[str, ...]:
    if body.stop is None:
        return defaults.stop
    stops = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop)
    if len(stops) > MAX_STOPS:
        raise ApiError(400, f"at most {MAX_STOPS} stop sequences", param="stop")
    if any(not s for s in stops):
        raise ApiError(400, "stop sequences must not be empty", param="stop")
    return stops


def _sampling(body: Body, s: SamplingParams) -> SamplingParams:
    """The body's sampling settings over the defaults `s` (SamplingParams checks their ranges)."""
    return SamplingParams(
        s.temperature if body.temperature is None else body.temperature,
        s.top_k if body.top_k is None else body.top_k,
        s.top_p if body.top_p is None else body.top_p,
        s.min_p if body.min_p is None else body.min_p,
        s.seed if body.seed is None else body.seed,
        s.repeat_penalty if body.repeat_penalty is None else body.repeat_penalty,
        s.frequency_penalty if body.frequency_penalty is None else body.frequency_penalty,
        s.presence_penalty if body.presence_penalty is None else body.presence_penalty,
        s.penalty_last_n if body.repeat_last_n is None else body.repeat_last_n,
        s.logit_bias if body.logit_bias is None else _logit_bias(body.logit_bias),
    )


LOGIT_BIAS_MAX = 100.0  # OpenAI's range for a bias, either way


def _logit_bias(bias: dict[str, float | bool]) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias (token ids as strings, each to a number from -100 to 100) as SamplingParams
    takes it; `false` bans the token, as llama-server reads it. The ids are checked against the
    model's vocabulary when the request is prepared (session.check_logit_bias)."""
    out = []
    for key, value in bias.items():
        if not key.strip().isdigit():
            raise ApiError(400, f"logit_bias: keys are token ids, got {key!r}", param="logit_bias")
        if value is True:
            raise ApiError(400, f"logit_bias[{key!r}]: a bias is a number from -100 to 100, or false to ban the token",
                           param="logit_bias")
        if value is False:
            value = -math.inf
        elif not -LOGIT_BIAS_MAX <= value <= LOGIT_BIAS_MAX:
            raise ApiError(400, f"logit_bias[{key!r}]: a bias is from -100 to 100, got {value}", param="logit_bias")
        out.append((int(key), float(value)))
    return tuple(out)


def _prompt(body: CompletionBody) -> dict[str, Any]:
    """The Request's prompt: {"text": ...} or {"tokens": [...]} (one prompt: a string, token ids,
    or a list holding one of them)."""
    if body.echo or body.suffix or (body.best_of or 1) > 1:
        raise ApiError(400, "echo, suffix and best_of are not supported", param="echo")
    p = body.prompt
    if isinstance(p, str):
        return {"text": p}
    if p and all(isinstance(t, int) for t in p):
        return {"tokens": list(p)}
    if len(p) != 1:
        raise ApiError(400, f"give one prompt per request (a string or a list of token ids), got {len(p)}",
                       param="prompt")
    return {"text": p[0]} if isinstance(p[0], str) else {"tokens": list(p[0])}


def _conversation(body: ChatBody) -> tuple[str | None, list[dict[str, Any]]]:
    """(the system messages joined, or None; the user/assistant/tool turns) of a chat body; an
    assistant turn's tool calls keep OpenAI's shape with their arguments parsed (chat templates
    write them as JSON values). A last assistant message is the start of the answer, which the
    reply continues."""
    system_parts: list[str] = []
    messages: list[dict[str, Any]] = []
    for i, m in enumerate(body.messages):
        if m.role == "assistant" and m.tool_calls:
            messages.append(_calls_turn(m, f"messages.{i}"))
            continue
        text = _text(m.content, f"messages.{i}")
        if m.role in ("system", "developer"):
            if messages:
                raise ApiError(400, f"messages.{i}: a {m.role} message may only open the conversation (before the "
                               "first user or assistant message); put it first, or send it as a user message",
                               param=f"messages.{i}.role")
            system_parts.append(text)
        elif m.role in ("user", "assistant"):
            messages.append({"role": m.role, "content": text})
        elif m.role == "tool":
            messages.append(_tool_turn(m, text, f"messages.{i}"))
        else:
            raise ApiError(400, f"messages.{i}: role {m.role!r} is not supported (system, user, assistant, tool)",
                           param=f"messages.{i}.role")
    if not any(m["role"] == "user" for m in messages):
        raise ApiError(400, "messages: the conversation has no user message", param="messages")
    return ("\n\n".join(system_parts) if system_parts else None), messages


def _calls_turn(m: Message, where: str) -> dict[str, Any]:
    """An assistant turn with tool calls (its content may be null)."""
    return {"role": "assistant", "content": "" if m.content is None else _text(m.content, where),
            "tool_calls": [_history_call(c, f"{where}.tool_calls.{j}") for j, c in enumerate(m.tool_calls or ())]}


def _tool_turn(m: Message, text: str, where: str) -> dict[str, Any]:
    """A tool result, answering the call its tool_call_id names."""
    if not m.tool_call_id:
        raise ApiError(400, f"{where}: a tool message needs the tool_call_id of the call it answers",
                       param=f"{where}.tool_call_id")
    return {"role": "tool", "content": text, "tool_call_id": m.tool_call_id, **({"name": m.name} if m.name else {})}


def _history_call(call: MessageToolCall, where: str) -> dict[str, Any]:
    """An earlier tool call as the chat template gets it: OpenAI's shape, the arguments a JSON value."""
    args: Any = call.function.arguments
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            raise ApiError(400, f"{where}.function.arguments: not valid JSON", "invalid_value",
                           param=f"{where}.function.arguments") from None
    return {"id": call.id or "", "type": "function", "function": {"name": call.function.name, "arguments": args}}


def _tools(body: ChatBody) -> tuple[list[dict[str, Any]] | None, str | dict[str, Any]]:
    """The body's tools (OpenAI's shape, checked) and its tool_choice, or a 400 naming the bad field."""
    tools = None
    if body.tools:
        tools, seen = [], set()
        for i, tool in enumerate(body.tools):
            fn, where = tool.function, f"tools.{i}.function"
            if not FUNCTION_NAME.match(fn.name):
                raise ApiError(400, f"{where}.name: a function's name is 1 to 64 letters, digits, '_' or '-', "
                               f"got {fn.name!r}", "invalid_value", param=f"{where}.name")
            if fn.name in seen:
                raise ApiError(400, f"{where}.name: two tools are named {fn.name!r}", "invalid_value",
                               param=f"{where}.name")
            seen.add(fn.name)
            if fn.parameters is not None and fn.parameters.get("type", "object") != "object":
                raise ApiError(400, f"{where}.parameters: must be the JSON schema of an object (type 'object'), got "
                               f"type {fn.parameters.get('type')!r}", "invalid_value", param=f"{where}.parameters")
            tools.append({"type": "function", "function": fn.model_dump(exclude_none=True)})
    choice = tooling.AUTO if body.tool_choice is None else body.tool_choice
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if not isinstance(name, str):
            raise ApiError(400, "tool_choice: give 'auto', 'none', 'required' or "
                           '{"type": "function", "function": {"name": ...}}', "invalid_value", param="tool_choice")
        choice = {"type": "function", "function": {"name": name}}
    try:
        tooling.check_choice(tools, choice)
    except EdgeSpecError as exc:
        raise ApiError(400, one_line(exc), "invalid_value", param="tool_choice") from None
    if tools and tooling.must_call(choice):
        _check_grammar(tools, choice)
    return tools, choice


def _check_grammar(tools: list[dict[str, Any]], choice: str | dict[str, Any]) -> None:
    """A 400 naming the tool whose schema the grammar engine cannot hold its arguments to."""
    from llguidance import LLMatcher

    for i, tool in enumerate(tools):
        name = tool["function"]["name"]
        if tooling.choice_name(choice) not in (None, name):
            continue
        error = LLMatcher.validate_grammar(tooling.tool_call_grammar([tool], name))
        if error:
            raise ApiError(400, f"tools.{i}.function.parameters: the schema cannot constrain a call: "
                           f"{error.strip().splitlines()[0]}", "invalid_value", param=f"tools.{i}.function.parameters")


def _text(content: str | list[Part] | None, where: str) -> str:
    if content is None:
        raise ApiError(400, f"{where}: content is missing", param=where)
    if isinstance(content, str):
        return content
    parts = []
    for i, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise ApiError(400, f"{where}.content.{i}: only text parts are supported, got {part.type!r}",
                           param=f"{where}.content")
        parts.append(part.text)
    return "".join(parts)


# ----------------------------------------------------------------------------- responses
def summary(reply: Reply) -> dict:
    """What the final response says about a finished generation (computed on the worker thread)."""
    st = reply.stats
    drafted, accepted = st.source_drafted.get(PREDICTION, 0), st.source_accepted.get(PREDICTION, 0)
    prompt_s = st.prefill_s
    decode_s = st.decode_s
    # The prefill decodes all prompt tokens but the last (the first step's x_last): a rate over a
    # few of them measures the call's fixed cost, not prompt processing.
    decoded = st.prompt_prefilled - 1
    rated = decoded >= MIN_RATE_TOKENS and prompt_s > 0
    timings = {
        # llama-server's names
        "cache_n": st.prompt_reused,
        "prompt_n": st.prompt_prefilled,
        "prompt_ms": 1000 * prompt_s,
        "prompt_per_token_ms": 1000 * prompt_s / decoded if rated else None,
        "prompt_per_second": decoded / prompt_s if rated else None,
        "predicted_n": st.generated,
        "predicted_ms": 1000 * decode_s,
        "predicted_per_token_ms": 1000 * decode_s / st.generated if st.generated else 0.0,
        "predicted_per_second": st.tokens_per_s,
        "draft_n": st.drafted,
        "draft_n_accepted": st.accepted,
        # by the source that proposed the draft (the suffix drafter: 'context' or 'answers')
        "draft_n_by_source": dict(st.source_drafted),
        "draft_n_accepted_by_source": dict(st.source_accepted),
        "grammar_ms": 1000 * st.grammar_s,  # a response_format's masks and forced tokens
        # EdgeSpec's (stats.Stats, one definition each)
        "acceptance": st.acceptance_rate,
        "alpha": st.alpha,
        "mean_accepted": st.mean_accepted,
        "tokens_per_call": st.tokens_per_call,
        "target_calls": st.target_calls,
        "ttft_ms": None if st.ttft_s is None else 1000 * st.ttft_s,
        "speedup_measured": reply.measured_speedup,
        "speedup_predicted": reply.predicted_speedup,
        "drafter": reply.drafter,
        "gamma": reply.gamma,
    }
    return finite({
        "text": reply.text,
        "tokens": list(reply.tokens),
        "sources": list(reply.sources),
        "drafted_by": list(reply.drafted_by),
        "logprobs": list(reply.logprobs) or None,
        "finish": reply.finish_reason,
        "usage": {"prompt_tokens": st.prompt_tokens, "completion_tokens": st.generated,
                  "total_tokens": st.prompt_tokens + st.generated,
                  "prompt_tokens_details": {"cached_tokens": st.prompt_reused},
                  # predicted outputs, as OpenAI reports them: predicted tokens the answer kept, and
                  # those proposed from the prediction and rejected
                  "completion_tokens_details": {"accepted_prediction_tokens": accepted,
                                                "rejected_prediction_tokens": drafted - accepted}},
        "timings": timings,
        "framing": reply.framing,
    })


def log_summary(s: dict) -> str:
    """What `serve`'s line for a finished generation says (llama-server and Ollama print one per
    request): tokens in (and how many the cache held) and out, speed, the drafter and its
    acceptance, how it ended. `s` is the `summary`; no text of the request or the answer."""
    t, u = s["timings"], s["usage"]
    rate = "-" if t["predicted_per_second"] is None else f"{t['predicted_per_second']:.1f}"
    drafted = (f", acceptance {t['acceptance']:.2f} ({t['draft_n_accepted']}/{t['draft_n']})"
               if t["draft_n"] and t["acceptance"] is not None else "")
    return (f"{u['prompt_tokens']} prompt tokens ({t['cache_n']} cached) -> {u['completion_tokens']} tokens, "
            f"{rate} tok/s, draft {t['drafter']}{drafted}, finish {s['finish']}")


@dataclass(frozen=True)
class Envelope:
    """What every object of one response shares (id, object type, creation time, model), and the
    objects: a whole completion, or the chunks of a stream."""

    kind: Kind
    id: str
    created: int
    model: str
    tools: tuple[str, ...] = ()  # the tools the request offered: the answer's calls of them are read out of its text

    @classmethod
    def new(cls, kind: Kind, model: str, tools: tuple[str, ...] = ()) -> Envelope:
        rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        return cls(kind, rid, int(time.time()), model, tools)

    def _object(self, obj: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": "edgespec", "choices": choices}

    def completion(self, s: dict) -> dict:
        """The whole response to a request that did not stream; `s` is its `summary`."""
        finish = FINISH.get(s["finish"], "stop")
        prov = {"tokens": s["tokens"], "sources": s["sources"], "drafted_by": s["drafted_by"],
                "finish_reason": s["finish"], "framing": s["framing"]}
        if self.kind == "chat":
            content, calls = tooling.parse_tool_calls(s["text"], self.tools) if self.tools else (s["text"], [])
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = [c.to_openai() for c in calls]
                finish = _call_finish(s["finish"])
            choice = {"index": 0, "message": message, "logprobs": self.logprobs(s["logprobs"]),
                      "finish_reason": finish}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": s["text"], "logprobs": self.logprobs(s["logprobs"]), "finish_reason": finish}
            obj = "text_completion"
        return {**self._object(obj, [choice]), "usage": s["usage"], "timings": s["timings"], "edgespec": prov}

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.kind == "chat" else "text_completion"

    def chunk(self, text: str | None, finish: str | None, extra: dict | None = None, role: bool = False,
              calls: list[dict] | None = None, logprobs: list[dict] | None = None, offset: int = 0) -> dict:
        lps = self.logprobs(logprobs, offset)
        if self.kind == "chat":
            delta: dict = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            if calls:
                delta["tool_calls"] = calls
            choice = {"index": 0, "delta": delta, "logprobs": lps, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": lps, "finish_reason": finish}
        return {**self._object(self.chunk_object, [choice]), **(extra or {})}

    def logprobs(self, entries: list[dict] | None, offset: int = 0) -> dict | None:
        """A choice's `logprobs` for tokens' entries (engine.token_logprobs), None when none were asked:
        chat's {"content": [...]}, or the completions API's older columns, with each token's place in
        the text counted from `offset` (a stream's text so far)."""
        if not entries:
            return None
        if self.kind == "chat":
            return {"content": entries, "refusal": None}
        offsets = []
        for e in entries:
            offsets.append(offset)
            offset += len(e["token"])
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{a["token"]: a["logprob"] for a in e["top_logprobs"]} for e in entries],
                "text_offset": offsets}

    def delta_chunk(self, delta: dict, offset: int = 0) -> dict:
        """A chunk of newly released tokens with their provenance (the worker's "delta" message)."""
        delta = dict(delta)
        lps = delta.pop("logprobs", None)
        return self.chunk("".join(delta["pieces"]), None, {"edgespec": delta}, logprobs=lps, offset=offset)

    def final_chunk(self, s: dict, finish: str | None = None) -> dict:
        """The chunk with finish_reason and timings that ends a stream; `s` is the `summary`."""
        return self.chunk(None if self.kind == "chat" else "", finish or FINISH.get(s["finish"], "stop"),
                          {"timings": s["timings"],
                           "edgespec": {"finish_reason": s["finish"], "framing": s["framing"],
                                        "tokens": [], "pieces": [], "sources": [], "drafted_by": []}})

    def usage_chunk(self, s: dict) -> dict:
        """The last chunk when the client asked for stream_options.include_usage."""
        return {**self._object(self.chunk_object, []), "usage": s["usage"]}


class Chunks:
    """The chunks of one streamed response, from the worker's messages: a chunk per delta with its
    provenance; with tools, the text is read for tool calls as it comes (`tools.ToolCallStream`), so a
    chunk shows only text that cannot be the start of a call, and each completed call is a chunk of
    its own with a `tool_calls` delta (the whole call: id, name and arguments)."""

    def __init__(self, env: Envelope) -> None:
        self.env = env
        self.reader = tooling.ToolCallStream(env.tools) if env.tools and env.kind == "chat" else None
        self.offset = 0  # characters of text streamed so far (the completions API's text_offset)

    def delta(self, delta: dict) -> list[dict]:
        offset, self.offset = self.offset, self.offset + sum(map(len, delta["pieces"]))
        if self.reader is None:
            return [self.env.delta_chunk(delta, offset)]
        return self._read("".join(delta["pieces"]), delta, done=False)

    def final(self, s: dict) -> list[dict]:
        """The chunks that end a stream: what the reader still held, then finish_reason and timings."""
        if self.reader is None:
            return [self.env.final_chunk(s)]
        empty = {"tokens": [], "pieces": [], "sources": [], "drafted_by": []}
        held = [c for c in self._read("", empty, done=True) if c["choices"][0]["delta"]]
        return [*held, self.env.final_chunk(s, _call_finish(s["finish"]) if self.reader.calls else None)]

    def _read(self, text: str, delta: dict, done: bool) -> list[dict]:
        shown, calls = self.reader.push(text, done)
        first = self.reader.calls - len(calls)
        delta = dict(delta)
        # a delta's token log-probabilities go with its first chunk, whatever of its text shows
        out = [self.env.chunk(shown or None, None, {"edgespec": delta}, logprobs=delta.pop("logprobs", None))]
        out += [self.env.chunk(None, None, calls=[c.to_openai(first + i)]) for i, c in enumerate(calls)]
        return out


def _call_finish(finish: str) -> str:
    """finish_reason of an answer that made tool calls: 'tool_calls', unless it was cut short."""
    return "tool_calls" if FINISH.get(finish, "stop") == "stop" else FINISH[finish]


def sse(obj: dict | str) -> str:
    """One server-sent event."""
    return f"data: {obj if isinstance(obj, str) else json.dumps(finite(obj), ensure_ascii=False, allow_nan=False)}\n\n"
