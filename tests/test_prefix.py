"""Prefix reuse: a generation keeps what the KV cache already holds and decodes only the rest.

Real bundled models, no mocks. The cache bookkeeping lives in runtime.Model (`cached`, `reuse`);
the engine, the draft-model drafter, sessions, conversations and the UI pool build on it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgespec.core.drafters.ngram import NgramDrafter
from edgespec.core.engine import Engine, FixedGamma, GenerationConfig
from edgespec.models.loader import RuntimeOptions
from edgespec.runtime.chat_template import render_chat_template
from edgespec.runtime.errors import EdgeSpecError
from edgespec.runtime.llama import Model
from edgespec.service.session import Conversation, Reply, Request, Session, frame
from tests.conftest import run_app

TEXT = ("The history of the bicycle begins in the early nineteenth century, when inventors in Germany and France "
        "built wooden running machines that riders pushed along with their feet.")
TURNS = ["What is a bicycle?", "Who invented it?", "What is a derailleur?", "Name a famous race.",
         "How long is that race?", "Thanks. Summarise our chat in one line."]


class _Borrowed(Session):
    """A Session over a fixture's model that leaves the model open when closed."""

    def close(self) -> None:
        for d in self._kept.values():
            d.close()
        self._kept.clear()


def test_model_tracks_the_tokens_in_its_cache(smollm2):
    toks = smollm2.tokenize(TEXT)
    smollm2.reset()
    smollm2.decode(toks[:10], n_logits=0)
    smollm2.decode(toks[10:12], n_logits=2)
    assert smollm2.cached == tuple(toks[:12]) and smollm2.n_past == 12
    smollm2.truncate(7)
    assert smollm2.cached == tuple(toks[:7])
    assert smollm2.reuse(toks[:5] + [99, 98]) == 5 and smollm2.cached == tuple(toks[:5])
    assert smollm2.reuse(toks) == 5  # a longer text keeps all of a matching cache
    smollm2.reset()
    assert smollm2.cached == () and smollm2.n_past == 0


def test_logits_after_reusing_a_prefix_equal_a_fresh_prefill(smollm2, smollm2_path):
    """Keep A+B of a cache holding A+B+X (another turn's tokens), decode C: the logits equal those of
    a fresh context fed A, B and C in the same batches."""
    toks = smollm2.tokenize(TEXT)
    a, b, c = toks[:20], toks[20:27], toks[27:]
    other = smollm2.tokenize(" and then something else entirely happened to them", add_special=False)
    smollm2.reset()
    smollm2.decode(a, n_logits=0)
    smollm2.decode(b, n_logits=1)
    smollm2.decode(other, n_logits=3)
    assert smollm2.reuse(a + b + c) == len(a) + len(b)
    after = np.array(smollm2.decode(c, n_logits=len(c)))

    fresh = Model(smollm2_path, n_ctx=2048, flash_attn="off")
    try:
        fresh.decode(a, n_logits=0)
        fresh.decode(b, n_logits=1)
        expected = np.array(fresh.decode(c, n_logits=len(c)))
    finally:
        fresh.close()
    np.testing.assert_array_equal(after, expected)


def test_engine_reuses_the_cached_prefix_and_counts_it(smollm2):
    prompt = smollm2.tokenize(TEXT)
    cfg = GenerationConfig(max_tokens=12)
    first = Reply.collect(Engine(smollm2, NgramDrafter(), FixedGamma(3)).generate(prompt, cfg))
    # the same prompt again: everything but its last token is in the cache, and the output is the
    # same (the same K/V, the same batches from there on)
    again = Reply.collect(Engine(smollm2, NgramDrafter(), FixedGamma(3)).generate(prompt, cfg))
    assert again.tokens == first.tokens
    st = again.stats
    assert (st.prompt_reused, st.prompt_prefilled, st.prompt_tokens) == (len(prompt) - 1, 1, len(prompt))
    # a prompt that extends prompt + output reuses all of it
    longer = prompt + first.tokens + smollm2.tokenize(" Later,", add_special=False)
    ext = Reply.collect(Engine(smollm2, None).generate(longer, cfg))
    assert ext.stats.prompt_reused == len(prompt) + len(first.tokens) - 1
    assert ext.stats.prompt_prefilled == len(longer) - ext.stats.prompt_reused
    # reuse off: everything is prefilled
    off = Reply.collect(Engine(smollm2, None).generate(longer, GenerationConfig(max_tokens=4, reuse_prefix=False)))
    assert (off.stats.prompt_reused, off.stats.prompt_prefilled) == (0, len(longer))
    d = off.stats.to_dict()
    assert d["prompt_reused"] == 0 and d["prompt_prefilled"] == len(longer)


def test_turn_five_prefills_far_fewer_tokens_than_a_fresh_run(smollm2):
    session = _Borrowed(smollm2, RuntimeOptions(n_ctx=2048))
    convo = Conversation(Request(text="-", system="You are brief.", max_tokens=24, draft="ngram"))
    stats = []
    for user in TURNS[:5]:
        stats.append(convo.run(session, user).stats)
    first, fifth = stats[0], stats[-1]
    assert fifth.prompt_tokens > 3 * first.prompt_tokens / 2  # the conversation grew...
    assert fifth.prompt_reused > 0 and fifth.prompt_reused + fifth.prompt_prefilled == fifth.prompt_tokens
    # ... but turn 5 decodes only its own turn: the end of the last reply and the new question
    assert fifth.prompt_prefilled < fifth.prompt_tokens / 3
    assert fifth.prompt_prefilled <= 2 * first.prompt_prefilled
    # the same turn without reuse prefills the whole conversation
    fresh = session.run(replace_reuse(convo.request(TURNS[5])))
    assert fresh.stats.prompt_reused == 0 and fresh.stats.prompt_prefilled == fresh.stats.prompt_tokens
    assert fresh.stats.prompt_tokens > 4 * fifth.prompt_prefilled
    session.close()


def replace_reuse(req: Request) -> Request:
    from dataclasses import replace

    return replace(req, reuse_prefix=False)


def test_draft_model_reuses_its_cache(smollm2_path):
    """The GGUF draft-model drafter keeps its cache between generations too (here SmolLM2 drafts
    for itself, the cheapest same-vocabulary pair)."""
    from edgespec.core.drafters.model import ModelDrafter

    target = Model(smollm2_path, n_ctx=1024, flash_attn="off")
    draft = Model(smollm2_path, n_ctx=1024, flash_attn="off")
    try:
        drafter = ModelDrafter(draft, target)
        prompt = target.tokenize(TEXT)
        cfg = GenerationConfig(max_tokens=16)
        first = Reply.collect(Engine(target, drafter, FixedGamma(3)).generate(prompt, cfg))
        assert drafter.reused == 0 and first.stats.accepted > 0  # a model drafting for itself
        longer = prompt + first.tokens + target.tokenize(" Then", add_special=False)
        second = Reply.collect(Engine(target, drafter, FixedGamma(3)).generate(longer, cfg))
        # the draft never decoded the last step's own tokens (at most gamma + 1 of them)
        assert drafter.reused >= len(prompt) + len(first.tokens) - 4
        assert second.stats.prompt_reused >= len(prompt) + len(first.tokens) - 1
        context = longer + second.tokens
        assert list(draft.cached[: drafter._committed]) == context[: drafter._committed]
    finally:
        target.close()
        draft.close()


def test_ui_pool_gives_an_owner_its_own_session_back():
    from edgespec.service.pool import ModelPool

    pool = ModelPool(RuntimeOptions(n_ctx=256), per_key=2)
    try:
        with pool.lease("smollm2-135m", owner="alice") as a, pool.lease("smollm2-135m", owner="bob") as b:
            assert a is not b
        for _ in range(2):
            with pool.lease("smollm2-135m", owner="bob") as again:
                assert again is b
            with pool.lease("smollm2-135m", owner="alice") as again:
                assert again is a
    finally:
        pool.close()


def test_cli_chat_file_keeps_the_conversation(tmp_path):
    conv = tmp_path / "conv.jsonl"
    conv.write_text('{"role": "system", "content": "You are brief."}\n"What is a bicycle?"\n\n'
                    '{"role": "user", "content": "Who invented it?"}\n"Name a famous race."\n')
    res = run_app("--headless", "--chat-file", str(conv), "--max-tokens", "16", "--json")
    assert res.returncode == 0, res.stderr
    turns = [json.loads(line) for line in res.stdout.splitlines()]
    assert [t["turn"] for t in turns] == [1, 2, 3] and turns[1]["user"] == "Who invented it?"
    s1, s3 = turns[0]["stats"], turns[2]["stats"]
    assert s1["prompt_reused"] == 0 and s3["prompt_reused"] > s1["prompt_tokens"]
    assert s3["prompt_prefilled"] < s3["prompt_tokens"] / 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('"hi"\n{"role": "tool", "content": "x"}\n')
    res = run_app("--headless", "--chat-file", str(bad))
    assert res.returncode == 1 and res.stderr.strip().count("\n") == 0 and f"{bad}:2" in res.stderr


HOSTILE = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ self.__init__.__globals__ }}",
    "{% set x = messages.append({'role': 'user'}) %}",
    "{{ 'x' * 100000000 }}",
    "{{ lipsum.__globals__['os'] }}",
]


@pytest.mark.parametrize("template", HOSTILE)
def test_hostile_chat_templates_are_refused_in_one_line(template):
    with pytest.raises(EdgeSpecError, match="chat template of m.gguf was refused by the sandbox") as exc:
        render_chat_template(template, [{"role": "user", "content": "hi"}], name="m.gguf")
    assert "\n" not in str(exc.value)


def chatml(msgs: list[dict[str, str]]) -> str:
    """ChatML, written out: what SmolLM2's template must render (and llama.cpp's built-in ChatML writes)."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs) + "<|im_start|>assistant\n"


def test_model_chat_template_renders_chatml(smollm2):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]
    assert smollm2.apply_chat_template(msgs) == chatml(msgs)
    # without a system message SmolLM2's own template adds its default one
    default = {"role": "system", "content": "You are a helpful AI assistant named SmolLM, trained by Hugging Face"}
    assert smollm2.apply_chat_template(msgs[1:]) == chatml([default, *msgs[1:]])
    with pytest.raises(EdgeSpecError, match="failed: no tools here"):
        render_chat_template("{{ raise_exception('no tools here') }}", msgs)
    assert frame(smollm2, Request(messages=msgs[1:], system="Be brief.")).tokens == smollm2.tokenize(
        chatml(msgs), add_special=True, parse_special=True)
