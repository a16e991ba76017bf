"""Grammar specs for structured output: a JSON schema, any JSON object or a Lark grammar, turned
into the grammar engine's spec string (what `Request.grammar` holds and `core.grammar.Constraint`
compiles for a target's vocabulary) by the engine's own compilers (llguidance), and checked by the
engine before any generation starts, so a schema it cannot handle is a one-line error naming the
part of the schema, not a failure in the middle of a reply.

JSON is laid out in one fixed way, `{"key": value, "key": value}` (", " between items, ": " after
keys, no other whitespace): what small models write on one line, and the layout that lets a
schema's keys and punctuation be forced tokens the engine drafts for free (docs/structured_output.md).
"""

from __future__ import annotations

import re
from typing import Any

import llguidance

from edgespec.runtime.errors import EdgeSpecError

# The JSON layout every schema is compiled with (module docstring); llguidance's JsonCompileOptions.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class StructuredOutputError(EdgeSpecError, ValueError):
    """A schema or grammar the grammar engine cannot handle; the message is one line naming the part."""


def json_schema_grammar(schema: dict, *, strict: bool = True) -> str:
    """The grammar of JSON documents valid under `schema`. strict: every keyword must be one the
    engine enforces (an unimplemented one is an error naming it); not strict: keywords the engine
    does not implement are ignored (the output still has the schema's shape, as OpenAI's non-strict
    mode promises no more)."""
    if not isinstance(schema, dict):
        raise StructuredOutputError(f"a JSON schema must be an object, got {type(schema).__name__}")
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            schema, defaults=JSON_LAYOUT, overrides={"lenient": not strict})
    except (ValueError, TypeError) as exc:
        raise StructuredOutputError(f"the schema is not valid JSON: {_line(str(exc))}") from None
    _check(grammar, "the schema", schema)
    return grammar


def json_object_grammar() -> str:
    """The grammar of any JSON object (`response_format` `{"type": "json_object"}`)."""
    return json_schema_grammar({"type": "object"})


def lark_grammar(text: str) -> str:
    """The grammar a Lark text defines (llguidance's Lark dialect, whose `%json` embeds a schema)."""
    if not text.strip():
        raise StructuredOutputError("the grammar is empty")
    grammar = llguidance.LLMatcher.grammar_from_lark(text)
    _check(grammar, "the grammar")
    return grammar


def _check(grammar: str, what: str, schema: dict | None = None) -> None:
    """Raise StructuredOutputError with the engine's reason when it refuses `grammar`."""
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if not error:
        return
    reason = _line(error)
    where = _locate(schema, reason) if schema is not None else None
    raise StructuredOutputError(f"{what}{f' at {where}' if where else ''}: {reason}")


def _line(text: str) -> str:
    return " ".join(text.split())


def _locate(schema: Any, reason: str) -> str | None:
    """The JSON pointer (`/properties/age/type`) of the schema part the engine's `reason` names: the
    first place holding a key or string value that the reason quotes or ends with ('Invalid type:
    strin', 'Unimplemented keys: ["if"]', 'Unknown format: foo'). None when no part matches."""
    names = re.findall(r'"([^"]+)"|\'([^\']+)\'', reason)
    needles = [a or b for a, b in names] or [reason.rsplit(":", 1)[-1].strip()]
    for needle in needles:
        found = _find(schema, needle, "")
        if found is not None:
            return found or "/"
    return None


def _find(node: Any, needle: str, path: str) -> str | None:
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{path}/{_escape(str(key))}"
            if key == needle or value in (needle, f"#{needle}"):  # a $ref's pointer is quoted without its '#'
                return here
            found = _find(value, needle, here)
            if found is not None:
                return found
    elif isinstance(node, list):
        for i, value in enumerate(node):
            if value == needle:
                return f"{path}/{i}"
            found = _find(value, needle, f"{path}/{i}")
            if found is not None:
                return found
    return None


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")

