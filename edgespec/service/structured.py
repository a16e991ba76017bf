"""Grammar specs for structured output: a JSON schema, any JSON object or a Lark grammar, turned
into the grammar engine's spec string (what `Request.grammar` holds and `core.grammar.Constraint`
compiles for a target's vocabulary) by the engine's own compilers (llguidance), and checked by the
engine before any generation starts, so a schema it cannot handle is a one-line error naming the
part of the schema, not a failure in the middle of a reply.

JSON is laid out in one fixed way, `{"key": value, "key": value}` (", " between items, ": " after
keys, no other whitespace): what small models write on one line, and the layout that lets a
schema's keys and punctuation be forced tokens the engine drafts for free (docs/structured_output.md).

An object schema that lists `properties` and says nothing of other keys (no `additionalProperties`,
`patternProperties` or `unevaluatedProperties`) admits only the keys it lists, as llama.cpp's server
and xgrammar (vLLM) read such schemas: JSON Schema itself would admit any further key, and a small
model then writes keys the caller never asked for, or writes them on until max_tokens cuts the JSON
off. `"additionalProperties": true` (or a schema) asks for further keys (`closed_objects`).
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
            closed_objects(schema), defaults=JSON_LAYOUT, overrides={"lenient": not strict})
    except (ValueError, TypeError) as exc:
        raise StructuredOutputError(f"the schema is not valid JSON: {_line(str(exc))}") from None
    _check(grammar, "the schema", schema)
    return grammar


# the keywords that say which keys beyond `properties` an object schema admits
_OTHER_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
# keywords whose value is a schema, or a list or a map of schemas, that an instance's value is held to
_SUBSCHEMA = ("additionalProperties", "items", "contains", "not", "propertyNames", "unevaluatedItems")
_SUBSCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")


def closed_objects(schema: Any) -> Any:
    """A copy of `schema` in which every object schema that lists `properties` and says nothing of
    other keys has `"additionalProperties": false` (module docstring); `schema` itself is left as it
    is. Left open, so that no intersection loses an instance: the members of an `allOf` of two or more
    schemas, a schema with an `allOf` or a `$ref` beside its `properties`, and the definitions such
    members refer to."""
    shared = set()  # "$ref"s used by members of an allOf of two or more: they are intersected
    _refs_in_intersections(schema, shared)
    return _close(schema, True, "#", shared)


def _refs_in_intersections(node: Any, out: set) -> None:
    if isinstance(node, dict):
        members = node.get("allOf")
        if isinstance(members, list) and len(members) > 1:
            for m in members:
                if isinstance(m, dict) and isinstance(m.get("$ref"), str):
                    out.add(m["$ref"])
        for value in node.values():
            _refs_in_intersections(value, out)
    elif isinstance(node, list):
        for value in node:
            _refs_in_intersections(value, out)


def _close(node: Any, closable: bool, pointer: str, shared: set) -> Any:
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for key in _SUBSCHEMA:
        if isinstance(node.get(key), dict):
            out[key] = _close(node[key], True, f"{pointer}/{key}", shared)
    for key in _SUBSCHEMA_LISTS:
        if isinstance(node.get(key), list):
            out[key] = [_close(v, True, f"{pointer}/{key}/{i}", shared) for i, v in enumerate(node[key])]
    if isinstance(node.get("items"), list):  # draft 4-7's tuple form
        out["items"] = [_close(v, True, f"{pointer}/items/{i}", shared) for i, v in enumerate(node["items"])]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            definitions = key in ("$defs", "definitions")
            out[key] = {}
            for name, v in node[key].items():
                here = f"{pointer}/{key}/{_escape(name)}"
                out[key][name] = _close(v, not (definitions and here in shared), here, shared)
    members = node.get("allOf")
    if isinstance(members, list):
        out["allOf"] = [_close(v, len(members) == 1, f"{pointer}/allOf/{i}", shared) for i, v in enumerate(members)]
    if (closable and isinstance(node.get("properties"), dict) and not any(k in node for k in _OTHER_KEYS)
            and "allOf" not in node and "$ref" not in node):
        out["additionalProperties"] = False
    return out


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

