"""Drafter choices in the UI come from the drafter registry: a plug-in named in EDGESPEC_DRAFTERS
shows up in Chat and Race with no UI change, and a chat reply drafts with it."""

from __future__ import annotations

import socket

import gradio as gr
import pytest
from gradio_client import Client

from edgespec.apps.ui import Defaults, build_app, start
from edgespec.models.loader import RuntimeOptions

PLUGIN = "tests.drafter_plugin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def components(blocks: gr.Blocks, kind: type) -> list:
    return [b for b in blocks.blocks.values() if isinstance(b, kind)]


def choice_values(component) -> list[str]:
    return [c[1] if isinstance(c, (tuple, list)) else c for c in component.choices]


def test_builtin_drafters_are_offered_from_the_registry():
    from edgespec.core.drafters import kinds

    blocks = build_app(RuntimeOptions(n_ctx=512), Defaults(draft="ngram"))
    (radio,) = [r for r in components(blocks, gr.Radio) if r.elem_id == "es-drafter"]
    assert choice_values(radio) == ["none", *kinds()]
    assert radio.value == "ngram"


@pytest.mark.slow
def test_a_plugin_drafter_appears_in_the_choices_and_drafts_a_chat_reply(monkeypatch):
    monkeypatch.setenv("EDGESPEC_DRAFTERS", PLUGIN)
    blocks = build_app(RuntimeOptions(n_ctx=512), Defaults(target="smollm2-135m", draft="repeat", max_tokens=24))
    (radio,) = [r for r in components(blocks, gr.Radio) if r.elem_id == "es-drafter"]
    assert "repeat" in choice_values(radio) and radio.value == "repeat"
    race_drafters = [d for d in components(blocks, gr.Dropdown) if d.label.startswith("drafter:")]
    assert len(race_drafters) == 3 and all("repeat" in choice_values(d) for d in race_drafters)

    url = start(blocks, port=free_port(), block=False)
    try:
        client = Client(url, verbose=False)
        # message, system, drafter, gamma, max tokens, temperature, top-k, top-p, min-p, seed, highlight, target, draft
        out = client.predict("Write a row of twenty dots: ....................", "You are a helpful assistant.",
                             "repeat", "3", 24, 0.0, 0, 1.0, 0.0, -1, True, "smollm2-135m", "", api_name="/chat")
        details, error = out[2], out[-1]
        assert error == "" and details["error"] is None, error
        assert details["drafter"] == "repeat" and details["gamma"] == "3"
        assert details["stats"]["drafted"] > 0 and details["tokens"]
    finally:
        blocks.close()
