"""Chat templates rendered in Jinja's sandbox.

Chat templates come from the GGUF file, i.e. from whoever published the model, so they are run
in Jinja's immutable sandbox: no attribute of Python internals (__class__, __globals__, ...), no
mutation of the messages, no unsafe callables; and, beyond the sandbox's defaults, no string or
list multiplication or power that builds huge values. A refused or failing template is one line.
`runtime.Model.apply_chat_template` renders a model's own template with `render_chat_template`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from edgespec.runtime.errors import EdgeSpecError, one_line

if TYPE_CHECKING:
    from jinja2 import Template
    from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_TEMPLATE_VALUE = 1 << 20  # largest sequence a template may build with * (characters/items)


@lru_cache(maxsize=1)
def _template_env() -> ImmutableSandboxedEnvironment:
    import json
    from datetime import datetime

    from jinja2.exceptions import SecurityError, TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Env(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**"])

        def call_binop(self, context, operator, left, right):  # noqa: ANN001, ANN201
            if operator == "**" and isinstance(right, int | float) and abs(right) > 64:
                raise SecurityError("the template raised a number to a huge power")
            if operator == "*":
                for seq, times in ((left, right), (right, left)):
                    if isinstance(seq, str | list | tuple) and isinstance(times, int) and \
                            len(seq) * times > MAX_TEMPLATE_VALUE:
                        raise SecurityError("the template built a huge string or list")
            return super().call_binop(context, operator, left, right)

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = Env(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent,
                                                                                 ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


@lru_cache(maxsize=16)
def _compile_template(template: str) -> Template:
    return _template_env().from_string(template)


def render_chat_template(template: str, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True,
                         bos_token: str = "", eos_token: str = "", name: str = "this model",
                         tools: Sequence[dict[str, Any]] | None = None) -> str:
    """Render a chat template (Jinja, as stored in GGUF metadata) in the sandbox; any refusal or
    failure is an EdgeSpecError naming the model. `tools` (OpenAI function tools) go to the template
    as `tools`, as transformers and llama-server pass them; a template without a tools section
    ignores them."""
    try:
        from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
    except ImportError:  # pragma: no cover - jinja2 comes with gradio
        raise EdgeSpecError("rendering chat templates needs jinja2 (pip install jinja2)") from None
    try:
        compiled = _compile_template(template)
    except TemplateSyntaxError as exc:
        raise EdgeSpecError(f"the chat template of {name} is not valid Jinja: {exc.message}") from None
    try:
        extra = {} if tools is None else {"tools": [dict(t) for t in tools]}
        return compiled.render(messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token, eos_token=eos_token, **extra)
    except SecurityError as exc:
        raise EdgeSpecError(f"the chat template of {name} was refused by the sandbox: {one_line(exc)}") from None
    except TemplateError as exc:
        raise EdgeSpecError(f"the chat template of {name} failed: {one_line(exc)}") from None
    except RecursionError:
        raise EdgeSpecError(f"the chat template of {name} recursed too deeply") from None
    except Exception as exc:  # a template can raise anything its expressions raise
        raise EdgeSpecError(f"the chat template of {name} failed: {one_line(exc, typed=True)}") from None


# Stands in for message i's content while the template renders, to find where contents land (private-use
# characters: no chat text or template marker holds them).
_SLOT = "\ue000{}\ue001"
_SLOT_RE = re.compile("\ue000(\\d+)\ue001")


def chat_parts(template: str, messages: Sequence[dict[str, str]], rendered: str, **kw: object) -> list[tuple[str, bool]]:
    """`rendered` (the template's output for `messages`) cut into (text, is the template's own) parts,
    so that a message's content is tokenized as text and only the template's markers may become
    control tokens. Where the contents land is found by rendering the template again with a slot in
    place of each content; a content is matched as given or with its edge whitespace trimmed (templates
    that `trim` it). A template that moves contents any other way is refused in one line."""
    texted = [i for i, m in enumerate(messages) if isinstance(m.get("content"), str)]  # not a tool call's null
    slotted = render_chat_template(
        template, [{**m, "content": _SLOT.format(i)} if i in texted else m for i, m in enumerate(messages)], **kw)
    pieces = _SLOT_RE.split(slotted)  # template text, slot number, template text, ...
    texts, slots = pieces[0::2], [int(i) for i in pieces[1::2]]
    name = kw.get("name", "this model")
    if slots != texted:
        raise EdgeSpecError(f"the chat template of {name} does not place each message once, in order, so a message "
                            "holding its control-token text cannot be kept apart from its markers; remove that text")
    changed = EdgeSpecError(f"the chat template of {name} changes message contents, so a message holding its "
                            "control-token text cannot be kept apart from its markers; remove that text")
    if not rendered.startswith(texts[0]):
        raise changed
    parts: list[tuple[str, bool]] = [(texts[0], True)]
    pos = len(texts[0])
    for i, after in zip(slots, texts[1:], strict=True):
        content = str(messages[i].get("content", ""))
        found = next((c for c in dict.fromkeys((content, content.strip(), content.lstrip(), content.rstrip()))
                      if rendered.startswith(c + after, pos)), None)
        if found is None:
            raise changed
        parts += [(found, False), (after, True)]
        pos += len(found) + len(after)
    if pos != len(rendered):
        raise changed
    return parts
