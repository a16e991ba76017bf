"""Tools in a conversation (OpenAI function calling): how the model is shown them, how its calls are
read back, and the grammar that makes it call one.

The call format is the one Qwen2.5's and Hermes' chat templates teach their models:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

- `render`: a conversation with tools, assistant tool calls and tool results, through the model's own
  chat template. What the template cannot show is written in as text first (llama-server and
  minja do the same): tools it has no section for are described in the system message, assistant
  tool calls it drops become the call text above, `tool` messages it cannot take become user
  messages wrapping the result in <tool_response>.
- `parse_tool_calls` reads the calls out of a finished answer; `ToolCallStream` out of a streamed
  one, holding back text that may be the start of a call. Given the request's tool names, both also
  read the object above without the tags (bare or in a ```json fence), as models write it when the
  choice is theirs.
- `tool_call_grammar`: an llguidance (lark) grammar admitting only calls of the given functions
  whose arguments follow each function's JSON schema (tool_choice 'required' or a named function),
  laid out as `response_format` JSON is (`{"key": value, "key": value}`), so its keys and separators
  are forced tokens.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgespec.runtime.errors import EdgeSpecError
from edgespec.service.structured import JSON_LAYOUT, closed_objects

if TYPE_CHECKING:
    from edgespec.runtime.llama import Model

OPEN, CLOSE = "<tool_call>", "</tool_call>"
# tool_choice values besides a function's name
AUTO, NONE, REQUIRED = "auto", "none", "required"
EMPTY_PARAMETERS = {"type": "object", "properties": {}}
_PROBE = "edgespec_probe"


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the function's name and its arguments as JSON text (OpenAI's shape)."""

    name: str
    arguments: str
    id: str = ""

    @classmethod
    def new(cls, name: str, arguments: Any) -> ToolCall:
        args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        return cls(name, args, "call_" + uuid.uuid4().hex[:24])

    def to_openai(self, index: int | None = None) -> dict:
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}

    def same_as(self) -> tuple[str, str]:
        """What two calls share when one repeats the other: the name and the arguments as a value (key
        order and spacing aside)."""
        try:
            args = json.dumps(json.loads(self.arguments), sort_keys=True, ensure_ascii=False)
        except ValueError:
            args = self.arguments
        return self.name, args


def call_text(name: str, arguments: Any) -> str:
    """A call written the way the model writes one (what `parse_tool_calls` reads)."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{OPEN}\n{body}\n{CLOSE}"


# ----------------------------------------------------------------------------- tool_choice
def choice_name(choice: str | dict) -> str | None:
    """The function a tool_choice names ({"type": "function", "function": {"name": ...}}), else None."""
    return choice["function"]["name"] if isinstance(choice, dict) else None


def check_choice(tools: Sequence[dict] | None, choice: str | dict) -> None:
    """A tool_choice the tools allow, or an EdgeSpecError saying why not."""
    name = choice_name(choice)
    if name is None and choice not in (AUTO, NONE, REQUIRED):
        raise EdgeSpecError(f"tool_choice must be 'auto', 'none', 'required' or a function, got {choice!r}")
    names = [t["function"]["name"] for t in tools or ()]
    if (name is not None or choice == REQUIRED) and not names:
        raise EdgeSpecError("tool_choice asks for a tool call, but the request has no tools")
    if name is not None and name not in names:
        raise EdgeSpecError(f"tool_choice names the function {name!r}, which is not among the tools "
                            f"({', '.join(names)})")


def must_call(choice: str | dict) -> bool:
    """Whether the answer must be a tool call (its output is then constrained)."""
    return choice == REQUIRED or choice_name(choice) is not None


def shown_tools(tools: Sequence[dict] | None, choice: str | dict) -> list[dict] | None:
    """The tools the model is shown: none with tool_choice 'none'."""
    return None if not tools or choice == NONE else list(tools)


def has_tool_turns(messages: Sequence[dict]) -> bool:
    """Whether a conversation holds assistant tool calls or tool results."""
    return any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)


# ----------------------------------------------------------------------------- reading calls
def _read_call(body: str) -> ToolCall | None:
    """The call in the text between the tags, None when it is not one (`_call_of`)."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return _call_of(obj)


def _call_of(obj: Any, names: Sequence[str] = ()) -> ToolCall | None:
    """The call a parsed JSON value is, None when it is not one ({"name": str, "arguments": ...};
    with `names`, a name among them and arguments that are an object)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    if names and obj["name"] not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if names and not isinstance(args, dict):
        return None
    return ToolCall.new(obj["name"], args)


def parse_tool_calls(text: str, names: Sequence[str] = ()) -> tuple[str | None, list[ToolCall]]:
    """(the text outside the calls, stripped, None when nothing is left; the calls) of a finished answer.
    A call whose body is no call object stays in the text; a last call whose closing tag never came
    (the answer ended first) counts when its body is complete. With `names` (the request's tools), a
    call written without the tags also counts (`ToolCallStream`)."""
    stream = ToolCallStream(names)
    content, calls = stream.push(text, done=True)
    if not calls:
        return text, []
    return content.strip() or None, calls


# where a call may open: the tag anywhere; a code fence or a JSON object at the start of a line
_OPENING = re.compile(r"<tool_call>|(?m:^)[ \t]*(```|\{)")
_FENCE = re.compile(r"```(?:json)?[ \t]*\n\s*")
_FENCE_END = "```"
_WS = " \t\r\n"


class ToolCallStream:
    """Reads calls out of text as it streams: `push` returns the text to show now and the calls
    completed now. Text that may be the start of a call is held back until it is not, a call's text
    until it is complete; once a call was made, text between calls that is only white space is not
    shown.

    A call is what the template teaches (`<tool_call>` JSON `</tool_call>`) or, given the request's
    tool `names`, the same JSON object without the tags, alone or in a ```json fence, at the start of
    a line: `{"name": "<one of names>", "arguments": {...}}`. Qwen2.5-Coder writes its calls that way
    when the choice is its own (tool_choice 'auto'); llama-server's Hermes parser reads the same forms.
    The name must be one of the tools', so a JSON example in an answer stays text.

    A call identical to an earlier one of the same answer (same name, same arguments) is a repeat:
    small models, once they have made a call, tend to make it again and again until max_tokens. It
    is dropped, text and all, and `repeated` tells the generation to end there (Session.generate)."""

    def __init__(self, names: Sequence[str] = ()) -> None:
        self._names = tuple(names)
        self._buf = ""
        self._line_start = True  # the held text begins a line
        self.calls = 0  # calls completed so far
        self.repeated = False  # a call repeated an earlier one
        self._made: set[tuple[str, str]] = set()

    def push(self, text: str, done: bool = False) -> tuple[str, list[ToolCall]]:
        self._buf += text
        shown: list[str] = []
        calls: list[ToolCall] = []

        def show(n: int) -> None:
            if n:
                shown.append(self._buf[:n])
                self._line_start = self._buf[n - 1] == "\n"
                self._buf = self._buf[n:]

        while self._buf:
            at, kind = self._opening()
            if at < 0:
                show(len(self._buf) - (0 if done else self._held_tail()))
                break
            show(at)
            status, used, call = self._read(kind, done)
            if status == "wait":
                break
            if status == "call":
                if call.same_as() in self._made:
                    self.repeated = True
                else:
                    self._made.add(call.same_as())
                    calls.append(call)
                self._buf, self._line_start = self._buf[used:], True
            else:  # not a call: its opening is text
                show(used)
        if calls or self.calls:
            shown = [t for t in shown if t.strip()]
        self.calls += len(calls)
        out = "".join(shown)
        return ("" if (self.calls and not out.strip()) else out), calls

    def _opening(self) -> tuple[int, str]:
        """Where the first possible call in the held text opens, and how ('tag', 'fence', 'json')."""
        for m in _OPENING.finditer(self._buf):
            if m.group(1) is None:
                return m.start(), "tag"
            if self._names and (m.start() > 0 or self._line_start):
                return m.start(1), "fence" if m.group(1) == "```" else "json"
        return -1, ""

    def _held_tail(self) -> int:
        """Length of the end of the held text that may still become an opening."""
        keep = _partial_tail(self._buf, OPEN)
        if self._names:
            line = self._buf.rfind("\n") + 1
            if line or self._line_start:
                rest = self._buf[line:].lstrip(" \t")
                if _FENCE_END.startswith(rest):  # blank so far, or a fence begun
                    keep = max(keep, len(self._buf) - line)
        return keep

    def _read(self, kind: str, done: bool) -> tuple[str, int, ToolCall | None]:
        """What the held text, from an opening, is: ('call', characters used, the call), ('text',
        characters to show, None), or ('wait', 0, None) until more text comes."""
        buf = self._buf
        if kind == "tag":
            end = buf.find(CLOSE)
            if end < 0 and not done:
                return "wait", 0, None
            body = buf[len(OPEN) : end if end >= 0 else len(buf)]
            used = end + len(CLOSE) if end >= 0 else len(buf)
            call = _read_call(body)
            return ("call", used, call) if call else ("text", used, None)
        start = 0
        if kind == "fence":
            m = _FENCE.match(buf)
            if m is None or m.end() == len(buf):
                may = m is not None or _may_open_fence(buf)
                return ("wait", 0, None) if may and not done else ("text", 1, None)
            if buf[m.end()] != "{":
                return "text", 1, None
            start = m.end()
        obj = buf[start:]
        if not _may_open_call(obj, self._names):
            return "text", 1, None
        try:
            value, end = json.JSONDecoder().raw_decode(obj)
        except ValueError:
            return ("text", 1, None) if done else ("wait", 0, None)
        call = _call_of(value, self._names)
        if call is None:
            return "text", 1, None
        used = start + end
        if kind == "fence":  # the closing fence, after white space, goes with the call
            rest = buf[used:]
            tail = rest.lstrip(_WS)
            if not done and _FENCE_END.startswith(tail) and len(tail) < len(_FENCE_END):
                return "wait", 0, None
            if tail.startswith(_FENCE_END):
                used += len(rest) - len(tail) + len(_FENCE_END)
        return "call", used, call


def _may_open_fence(text: str) -> bool:
    """Whether `text` (from a ```) may still become a JSON fence's opening."""
    body = text[3:]
    return any(f.startswith(body) for f in ("json", "\n")) or (body.startswith("json") and not body[4:].strip(" \t"))


def _may_open_call(text: str, names: Sequence[str]) -> bool:
    """Whether `text` (from its '{') may be, or still become, the start of {"name": "<one of names>", ..."""
    i, n = 1, len(text)
    for literal in ('"name"', ":", '"'):
        while i < n and text[i] in _WS:
            i += 1
        part = text[i : i + len(literal)]
        if not literal.startswith(part):
            return False
        if len(part) < len(literal):
            return True
        i += len(literal)
    end = text.find('"', i)
    if end < 0:
        return any(name.startswith(text[i:]) for name in names)
    return text[i:end] in names


def _partial_tail(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper start of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


# ----------------------------------------------------------------------------- the grammar
def tool_call_grammar(tools: Sequence[dict], name: str | None = None, *, parallel: bool = True,
                      tags_are_tokens: bool = False) -> str:
    """An llguidance lark grammar for one call (or several, one after another, with `parallel`) of
    the function `name`, or of any of `tools` when None: the call format above, the arguments held to
    the function's `parameters` schema, its objects closed to keys they do not list unless they say
    otherwise (`structured.closed_objects`). `tags_are_tokens`: the model's vocabulary has <tool_call>
    and </tool_call> as single special tokens (Qwen2.5), which the grammar must then name as tokens."""
    fns = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    if not fns:
        raise EdgeSpecError(f"no tool is named {name!r}")
    calls = [{"type": "object",
              "properties": {"name": {"const": f["name"]}, "arguments": closed_objects(f.get("parameters") or EMPTY_PARAMETERS)},
              "required": ["name", "arguments"], "additionalProperties": False} for f in fns]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    # the layout every schema gets (structured.JSON_LAYOUT, the one the call format shows): without
    # it %json admits any whitespace, so no separator after a key is forced and only single tokens
    # here and there are drafted for free
    schema = {"x-guidance": JSON_LAYOUT, **schema}
    open_, close = (OPEN, CLOSE) if tags_are_tokens else (json.dumps(OPEN), json.dumps(CLOSE))
    more = ' ("\\n" call)*' if parallel else ""
    return (f"start: call{more}\n"
            f'call: {open_} "\\n" body "\\n" {close}\n'
            f"body: %json {json.dumps(schema, ensure_ascii=False)}\n")


def tags_are_tokens(model: Model) -> bool:
    """Whether the model's vocabulary has the call tags as tokens of their own (added tokens, which
    llguidance, like llama.cpp, takes as special tokens when they look like <...>)."""
    def single(tag: str) -> bool:
        ids = model.tokenize(tag, add_special=False, parse_special=True)
        return len(ids) == 1 and model.token_text(ids[0]) == tag

    return single(OPEN) and single(CLOSE)


# ----------------------------------------------------------------------------- rendering
@dataclass(frozen=True)
class TemplateCaps:
    """What a chat template shows of tools, found by rendering probes (as minja does for llama-server):
    the `tools` list, an assistant message's `tool_calls`, a `tool` message's content."""

    tools: bool
    tool_calls: bool
    tool_responses: bool


TEXT_ONLY = TemplateCaps(False, False, False)  # a transcript (no template): everything written in as text
_caps: dict[str, TemplateCaps] = {}


def template_caps(model: Model) -> TemplateCaps:
    template = model.chat_template() or ""
    caps = _caps.get(template)
    if caps is None:
        caps = _caps[template] = TemplateCaps(*_probe(model))
        if len(_caps) > 16:
            _caps.pop(next(iter(_caps)))
    return caps


def _probe(model: Model) -> tuple[bool, bool, bool]:
    def shows(marker: str, messages: list[dict], tools: list[dict] | None = None) -> bool:
        try:
            return marker in model.apply_chat_template(messages, tools=tools)
        except EdgeSpecError:
            return False

    fn = {"type": "function", "function": {"name": _PROBE + "_fn", "description": "", "parameters": EMPTY_PARAMETERS}}
    call = {"id": "call_1", "type": "function", "function": {"name": _PROBE + "_call", "arguments": {}}}
    user = {"role": "user", "content": "hi"}
    asks = {"role": "assistant", "content": "", "tool_calls": [call]}
    return (shows(_PROBE + "_fn", [user], [fn]),
            shows(_PROBE + "_call", [user, asks, {"role": "user", "content": "ok"}]),
            shows(_PROBE + "_result", [user, asks, {"role": "tool", "tool_call_id": "call_1",
                                                   "content": _PROBE + "_result"}]))


def tools_prompt(tools: Sequence[dict]) -> str:
    """The tools described in words and JSON, for a template without a tools section."""
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou can call functions to help answer. Their signatures, one JSON object per line, "
            f"are inside <tools></tools>:\n<tools>\n{listed}\n</tools>\n\n"
            "To call one, answer with a JSON object giving its name and its arguments inside "
            f"{OPEN}{CLOSE} tags, one call per pair of tags:\n"
            f'{OPEN}\n{{"name": <function name>, "arguments": <arguments as a JSON object>}}\n{CLOSE}')


def polyfill(messages: Sequence[dict], tools: Sequence[dict] | None, caps: TemplateCaps) -> list[dict]:
    """`messages` (system first, if any) with what the template cannot show written in as text: the
    tools in the system message, tool calls in the assistant's text, tool results as user turns."""
    out: list[dict] = []
    for m in messages:
        m = dict(m)
        if m.get("content") is None:
            m["content"] = ""
        if m["role"] == "assistant" and m.get("tool_calls") and not caps.tool_calls:
            written = [call_text(c["function"]["name"], c["function"]["arguments"]) for c in m.pop("tool_calls")]
            m["content"] = "\n".join(([m["content"]] if m["content"] else []) + written)
        elif m["role"] == "tool" and not caps.tool_responses:
            text = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("tool_result"):  # consecutive results: one user turn
                out[-1]["content"] += "\n" + text
                continue
            m = {"role": "user", "content": text, "tool_result": True}
        out.append(m)
    for m in out:
        m.pop("tool_result", None)
    if tools and not caps.tools:
        prompt = tools_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{prompt}" if out[0]["content"] else prompt
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def render(model: Model, messages: Sequence[dict], tools: Sequence[dict] | None) -> list[tuple[str, bool]]:
    """The prompt of a conversation with tools (module docstring), as `Model.chat_parts` cuts it: the
    messages' contents apart from the template's own markers."""
    caps = template_caps(model)
    return model.chat_parts(polyfill(messages, tools, caps), tools=(tools or None) if caps.tools else None)
