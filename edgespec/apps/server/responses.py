"""OpenAI's Responses API (POST /v1/responses), the shape agent frameworks and coding agents speak by
default, over the same generation as chat completions: a body becomes the chat body it means (input
items -> messages, instructions -> the system message, function tools, text.format -> response_format),
so drafting, grammars, tool calls, stop handling and the queue are the chat path's; the answer is
written back as a `response` object, or as the API's typed server-sent events.

Responses are not stored: `previous_response_id` is a 400 (send the whole conversation in `input`, as
stateless clients do) and a response says `store: false`. Only function tools and text parts are taken."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from edgespec.apps.server.protocol import FINISH, FUNCTION_NAME, ApiError, ChatBody, Chunks, Envelope, validate

# Body fields the chat path takes under the same names (sampling, EdgeSpec's and llama-server's extensions).
PASSED = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty", "repeat_penalty",
          "repeat_last_n", "logit_bias", "stop", "draft", "gamma", "cache_prompt", "ignore_eos", "prediction",
          "parallel_tool_calls", "model", "stream")
TEXT_TYPES = ("input_text", "output_text", "text")


class ResponsesBody(BaseModel):
    model_config = ConfigDict(extra="allow")  # the chat path's extensions ride along (PASSED)

    model: str | None = None
    input: str | list[dict[str, Any]] = Field(min_length=1)
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None  # 'auto' | 'none' | 'required' | {"type": "function", "name": ...}
    text: dict[str, Any] | None = None  # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    stream: bool = False
    previous_response_id: str | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None


def to_chat(raw: dict) -> tuple[ResponsesBody, ChatBody]:
    """The Responses body and the chat body it means, or a 400 naming the field as the client wrote it."""
    body = validate(raw, ResponsesBody)
    if body.previous_response_id:
        raise ApiError(400, "previous_response_id: this server does not store responses; send the whole "
                       "conversation in input", "unsupported_value", param="previous_response_id")
    chat: dict[str, Any] = {k: raw[k] for k in PASSED if k in raw}
    chat["messages"] = _messages(body)
    if body.max_output_tokens is not None:
        chat["max_tokens"] = body.max_output_tokens
    if body.tools:
        chat["tools"] = [_tool(t, i) for i, t in enumerate(body.tools)]
    if body.tool_choice is not None:
        chat["tool_choice"] = _tool_choice(body.tool_choice)
    fmt = _format(body.text)
    if fmt is not None:
        chat["response_format"] = fmt
    return body, validate(chat, ChatBody)


def _messages(body: ResponsesBody) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": body.instructions}] if body.instructions else []
    if isinstance(body.input, str):
        return [*out, {"role": "user", "content": body.input}]
    for i, item in enumerate(body.input):
        where = f"input.{i}"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ApiError(400, f"{where}.role: must be user, system, developer or assistant, got {role!r}",
                               "invalid_value", param=f"{where}.role")
            out.append({"role": role, "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", where), "type": "function",
                    "function": {"name": _string(item, "name", where), "arguments": item.get("arguments") or "{}"}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)  # the calls of one turn
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, where)
            out.append({"role": "tool", "tool_call_id": _string(item, "call_id", where), "content": text})
        elif kind == "reasoning":  # a reasoning model's summary, sent back by some clients: not for this model
            continue
        else:
            raise ApiError(400, f"{where}.type: {kind!r} items are not supported (message, function_call, "
                           "function_call_output)", "unsupported_value", param=f"{where}.type")
    if not any(m["role"] == "user" for m in out):
        raise ApiError(400, "input: the conversation has no user message", param="input")
    return out


def _string(item: dict, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise ApiError(400, f"{where}.{key}: must be a non-empty string", "invalid_value", param=f"{where}.{key}")
    return value


def _text(content: Any, where: str) -> str:
    """A message's content: a string, or text parts (input_text, output_text) joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where}.content: must be a string or a list of content parts", "invalid_type",
                       param=f"{where}.content")
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_TYPES or not isinstance(part.get("text"), str):
            raise ApiError(400, f"{where}.content.{j}: only text parts are supported (input_text, output_text), "
                           f"got {kind!r}", "unsupported_value", param=f"{where}.content.{j}")
        parts.append(part["text"])
    return "".join(parts)


def _tool(tool: dict, i: int) -> dict:
    """A Responses function tool ({type, name, parameters, ...}) in the chat shape ({type, function})."""
    if tool.get("type") != "function":
        raise ApiError(400, f"tools.{i}.type: only function tools are supported here, got {tool.get('type')!r}",
                       "unsupported_value", param=f"tools.{i}.type")
    name = tool.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.match(name):
        raise ApiError(400, f"tools.{i}.name: a function's name is 1 to 64 letters, digits, '_' or '-', got {name!r}",
                       "invalid_value", param=f"tools.{i}.name")
    fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    return {"type": "function", "function": fn}


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _format(text: dict | None) -> dict | None:
    """text.format as chat's response_format."""
    fmt = (text or {}).get("format")
    if fmt is None or not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return fmt
    schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": schema}


class Shaper:
    """One response's objects: the whole `response`, or its stream of typed events (each numbered)."""

    def __init__(self, body: ResponsesBody, chat: ChatBody, env: Envelope) -> None:
        self.body, self.chat, self.env = body, chat, env
        self.id = "resp_" + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.seq = 0

    def response(self, s: dict | None, output: list[dict] | None = None, status: str | None = None) -> dict:
        """The response object; `s` is the generation's summary (None: not finished yet)."""
        if s is not None and output is None:
            output = self.output(s)
        if status is None:
            status = "in_progress" if s is None else "incomplete" if FINISH.get(s["finish"]) == "length" else "completed"
        b = self.body
        out = {"id": self.id, "object": "response", "created_at": self.created, "status": status, "error": None,
               "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
               "instructions": b.instructions, "max_output_tokens": b.max_output_tokens, "model": self.env.model,
               "output": output or [], "parallel_tool_calls": self.chat.parallel_tool_calls is True,
               "previous_response_id": None, "reasoning": {"effort": None, "summary": None}, "store": False,
               "temperature": self.chat.temperature, "text": b.text or {"format": {"type": "text"}},
               "tool_choice": b.tool_choice or "auto", "tools": b.tools or [], "top_p": self.chat.top_p,
               "truncation": "disabled", "metadata": b.metadata or {}, "usage": None}
        if s is not None:
            u = s["usage"]
            out["usage"] = {"input_tokens": u["prompt_tokens"], "output_tokens": u["completion_tokens"],
                            "total_tokens": u["total_tokens"],
                            "input_tokens_details": {"cached_tokens": u["prompt_tokens_details"]["cached_tokens"]},
                            "output_tokens_details": {"reasoning_tokens": 0}}
            out["timings"] = s["timings"]
            out["edgespec"] = {"tokens": s["tokens"], "sources": s["sources"], "drafted_by": s["drafted_by"],
                               "finish_reason": s["finish"], "framing": s["framing"]}
        return out

    def output(self, s: dict) -> list[dict]:
        """The output items of a finished answer: its text as a message (if any, or if it made no call),
        then its function calls."""
        message = self.env.completion(s)["choices"][0]["message"]
        items = []
        text = message.get("content") or ""
        if text or not message.get("tool_calls"):
            items.append(self._message(text, "completed"))
        items += [self._call(c) for c in message.get("tool_calls") or ()]
        return items

    def _message(self, text: str | None, status: str, item_id: str | None = None) -> dict:
        return {"type": "message", "id": item_id or "msg_" + uuid.uuid4().hex[:24], "status": status,
                "role": "assistant", "content": [] if text is None else [_part(text)]}

    @staticmethod
    def _call(call: dict) -> dict:
        fn = call["function"]
        return {"type": "function_call", "id": "fc_" + call["id"].removeprefix("call_"), "call_id": call["id"],
                "name": fn["name"], "arguments": fn["arguments"], "status": "completed"}

    def event(self, kind: str, **fields: Any) -> str:
        """One server-sent event of the Responses stream."""
        obj = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(obj, ensure_ascii=False, allow_nan=False)}\n\n"

    def stream(self) -> StreamState:
        return StreamState(self)


def _part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class StreamState:
    """The events of one streamed response, from the chat chunks of the worker's messages (`Chunks`, which
    reads tool calls out of the text as it comes): the message item opens at the first text, each call is
    an item of its own, and response.completed carries the whole response."""

    def __init__(self, shaper: Shaper) -> None:
        self.sh = shaper
        self.chunks = Chunks(shaper.env)
        self.items: list[dict] = []  # finished output items
        self.msg_id: str | None = None  # the open message item
        self.text = ""

    def start(self) -> Iterator[str]:
        r = self.sh.response(None)
        yield self.sh.event("response.created", response=r)
        yield self.sh.event("response.in_progress", response=r)

    def delta(self, payload: dict) -> Iterator[str]:
        for chunk in self.chunks.delta(payload):
            yield from self._chunk(chunk)

    def final(self, s: dict) -> Iterator[str]:
        for chunk in self.chunks.final(s):
            yield from self._chunk(chunk)
        yield from self._close_message()
        if not self.items:  # an empty answer is still a message
            yield from self._open_message()
            yield from self._close_message()
        r = self.sh.response(s, self.items)
        yield self.sh.event("response.incomplete" if r["status"] == "incomplete" else "response.completed", response=r)

    def error(self, err: ApiError) -> Iterator[str]:
        e = err.body()["error"]
        yield self.sh.event("error", code=e.get("code"), message=e["message"], param=e.get("param"))
        r = self.sh.response(None, self.items, status="failed")
        r["error"] = {"code": e.get("code") or "server_error", "message": e["message"]}
        yield self.sh.event("response.failed", response=r)

    def _chunk(self, chunk: dict) -> Iterator[str]:
        delta = chunk["choices"][0]["delta"]
        text = delta.get("content")
        if text:
            if self.msg_id is None:
                yield from self._open_message()
            self.text += text
            yield self.sh.event("response.output_text.delta", item_id=self.msg_id, output_index=len(self.items),
                                content_index=0, delta=text, logprobs=[])
        for call in delta.get("tool_calls") or ():
            yield from self._close_message()
            item = self.sh._call(call)
            index = len(self.items)
            yield self.sh.event("response.output_item.added", output_index=index,
                                item={**item, "arguments": "", "status": "in_progress"})
            yield self.sh.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                                delta=item["arguments"])
            yield self.sh.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                arguments=item["arguments"], name=item["name"])
            yield self.sh.event("response.output_item.done", output_index=index, item=item)
            self.items.append(item)

    def _open_message(self) -> Iterator[str]:
        self.msg_id = "msg_" + uuid.uuid4().hex[:24]
        index = len(self.items)
        yield self.sh.event("response.output_item.added", output_index=index,
                            item=self.sh._message(None, "in_progress", self.msg_id))
        yield self.sh.event("response.content_part.added", item_id=self.msg_id, output_index=index, content_index=0,
                            part=_part(""))

    def _close_message(self) -> Iterator[str]:
        if self.msg_id is None:
            return
        index, item_id, text = len(self.items), self.msg_id, self.text
        yield self.sh.event("response.output_text.done", item_id=item_id, output_index=index, content_index=0,
                            text=text, logprobs=[])
        yield self.sh.event("response.content_part.done", item_id=item_id, output_index=index, content_index=0,
                            part=_part(text))
        item = self.sh._message(text, "completed", item_id)
        yield self.sh.event("response.output_item.done", output_index=index, item=item)
        self.items.append(item)
        self.msg_id, self.text = None, ""
