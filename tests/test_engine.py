"""The step loop on the real bundled models.

Exactness of the engine's logic: with flash attention off and every step decoded with at least two
rows (tests/batched_path.py), the target sees the same kernel path whether it verifies drafts or
decodes plainly, so greedy speculative output must equal the greedy reference token for token,
whatever the drafter does.
"""

from __future__ import annotations

import threading

import pytest

from edgespec.core.drafters.ngram import NgramDrafter
from edgespec.core.engine import BONUS, DRAFT, TARGET, Engine, FixedGamma, GenerationConfig
from edgespec.core.sampling import SamplingParams
from edgespec.runtime.errors import EdgeSpecError
from edgespec.service.session import Reply
from tests.batched_path import BatchedPath

PROMPTS = [
    "Rewrite this code with type hints:\n\ndef add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n\nAnswer:\n",
    "Summarize: Alice went to the market to buy apples. She bought ten apples and went home. Summary:",
    "Write a short poem about the moon.",
]


def encode(model, text: str) -> list[int]:
    """Instruct models get their chat template; base models the raw text."""
    if model.chat_template():
        return model.tokenize(model.apply_chat_template([{"role": "user", "content": text}]), parse_special=True)
    return model.tokenize(text)


def gen(max_tokens: int = 48, **kw) -> GenerationConfig:
    return GenerationConfig(max_tokens=max_tokens, **kw)


@pytest.mark.parametrize("model_name", ["smollm2", "gemma"])
def test_greedy_speculative_equals_same_path_reference(model_name, request):
    model = request.getfixturevalue(model_name)
    for text in PROMPTS:
        prompt = encode(model, text)
        plain = BatchedPath(model)
        ref = Reply.collect(Engine(plain, None).generate(prompt, gen()))
        assert ref.stats.drafted == 0 and set(ref.sources) == {TARGET}
        assert plain.padded_calls == ref.stats.target_calls  # every plain step ran on the batched path
        for gamma in (1, 4):
            spec = Reply.collect(Engine(BatchedPath(model), NgramDrafter(1, 3), FixedGamma(gamma)).generate(prompt, gen()))
            assert spec.tokens == ref.tokens, f"{model_name} gamma={gamma} prompt={text[:30]!r}"
            assert spec.text == ref.text
            assert spec.stats.target_calls <= ref.stats.target_calls


def test_events_account_for_every_token(gemma):
    prompt = encode(gemma, PROMPTS[0])
    events = list(Engine(gemma, NgramDrafter(), FixedGamma(4)).generate(prompt, gen(64)))
    stats = events[-1].stats
    assert sum(len(e.tokens) for e in events) == stats.generated == 64
    assert sum(e.sources.count(DRAFT) for e in events) == stats.accepted > 0
    assert stats.drafted == sum(e.drafted for e in events)
    for e in events[:-1]:
        # every step ends with exactly one token from the target: a correction or the bonus
        assert e.sources[-1] in (TARGET, BONUS) and e.sources[:-1] == [DRAFT] * e.accepted
        assert (e.sources[-1] == BONUS) == (e.drafted > 0 and e.accepted == e.drafted)
    assert stats.target_calls == len(events)
    # KV discipline: the cache holds every committed token but the newest
    assert gemma.n_past == len(prompt) + stats.generated - 1


def test_same_seed_same_text(smollm2):
    prompt = encode(smollm2, PROMPTS[2])
    cfg = GenerationConfig(max_tokens=40, sampling=SamplingParams(temperature=0.9, top_p=0.95, seed=7))
    runs = [Reply.collect(Engine(smollm2, NgramDrafter(), FixedGamma(3)).generate(prompt, cfg)) for _ in range(2)]
    assert runs[0].tokens == runs[1].tokens
    other = Reply.collect(
        Engine(smollm2, NgramDrafter(), FixedGamma(3)).generate(
            prompt, GenerationConfig(max_tokens=40, sampling=SamplingParams(temperature=0.9, top_p=0.95, seed=8))
        )
    )
    assert other.tokens != runs[0].tokens


def test_seeded_sampling_does_not_depend_on_drafting(smollm2):
    """Random draws are keyed by token position, so a seeded n-gram speculative run emits exactly
    what seeded plain sampling emits, for any gamma, wherever the logits do not depend on the batch
    (SmolLM2's Q4_1 kernels; Gemma's K-quant ones move logits between batch sizes in the fast
    build, see tests/test_exact_mode.py for Gemma)."""
    model, model_name = smollm2, "smollm2"
    sampling = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=3)
    for text in PROMPTS[:2]:
        prompt = encode(model, text)
        ref = Reply.collect(Engine(BatchedPath(model), None).generate(prompt, gen(40, sampling=sampling)))
        for gamma in (1, 3, 6):
            spec = Reply.collect(Engine(BatchedPath(model), NgramDrafter(1, 3), FixedGamma(gamma)).generate(prompt, gen(40, sampling=sampling)))
            assert spec.tokens == ref.tokens, f"{model_name} gamma={gamma} prompt={text[:30]!r}"
        assert spec.stats.accepted > 0 or "poem" in text


def test_stop_event_ends_generation(smollm2):
    stop = threading.Event()
    events = []
    for ev in Engine(smollm2, None).generate(encode(smollm2, PROMPTS[2]), GenerationConfig(max_tokens=500), stop):
        events.append(ev)
        if len(events) == 3:
            stop.set()
    assert events[-1].finish_reason == "stopped" and len(events) == 4


def test_stops_at_end_of_generation(smollm2):
    prompt = encode(smollm2, "What is 2+2? Answer with a number only.")
    res = Reply.collect(Engine(smollm2, NgramDrafter(), FixedGamma(2)).generate(prompt, gen(100)))
    assert res.finish_reason == "eog"
    assert not any(smollm2.is_eog(t) for t in res.tokens)


def test_context_limit(smollm2_path):
    from edgespec.runtime.llama import Model

    m = Model(smollm2_path, n_ctx=256, flash_attn="off")
    prompt = m.tokenize("word " * 200)
    res = Reply.collect(Engine(m, NgramDrafter(), FixedGamma(8)).generate(prompt, GenerationConfig(max_tokens=1000)))
    assert res.finish_reason == "context"
    assert len(prompt) + len(res.tokens) <= m.n_ctx + 1
    with pytest.raises(EdgeSpecError, match="context holds"):
        next(Engine(m, None).generate(m.tokenize("word " * 300), GenerationConfig()))
    with pytest.raises(EdgeSpecError, match="empty"):
        next(Engine(m, None).generate([], GenerationConfig()))
    m.close()


def test_counts_stop_at_the_end_of_generation(smollm2):
    """A repeated chat question: the n-gram drafter copies the earlier answer, its end-of-turn token
    and the next turn's header in one step. Only drafts up to the end-of-generation token count
    (not those the drafter copied past it), and the end token counts as produced."""
    q = "What is 2+2? Answer with a number only."
    first = encode(smollm2, q)
    answer = Reply.collect(Engine(smollm2, None).generate(first, GenerationConfig(max_tokens=40, reuse_prefix=False)))
    msgs = [{"role": "user", "content": q}, {"role": "assistant", "content": answer.text}, {"role": "user", "content": q}]
    prompt = smollm2.tokenize(smollm2.apply_chat_template(msgs), parse_special=True)

    def run(stop_at_eog: bool) -> Reply:
        cfg = GenerationConfig(max_tokens=40, stop_at_eog=stop_at_eog, reuse_prefix=False)
        return Reply.collect(Engine(smollm2, NgramDrafter(), FixedGamma(10)).generate(prompt, cfg))

    ended, going_on = run(True), run(False)  # the same steps; the second goes past the end token
    end = next(i for i, t in enumerate(going_on.tokens) if smollm2.is_eog(t))
    assert ended.finish_reason == "eog" and ended.tokens == going_on.tokens[:end]
    st = ended.stats
    assert going_on.stats.accepted > end + 1  # the drafter did copy past the end token
    assert st.accepted == going_on.sources[: end + 1].count(DRAFT)
    assert st.generated == end and st.produced == end + 1
    assert st.accepted <= min(st.drafted, st.produced) and st.tokens_per_call >= 1


def test_plain_decoding_is_one_token_per_target_call(smollm2):
    """The call that produces the end-of-generation token counts it: plain decoding makes exactly
    one token per target call."""
    res = Reply.collect(Engine(smollm2, None).generate(encode(smollm2, "What is 2+2? Answer with a number only."),
                                                       GenerationConfig(max_tokens=40)))
    st = res.stats
    assert res.finish_reason == "eog" and st.target_calls == st.generated + 1
    assert st.tokens_per_call == 1.0 and st.produced == st.target_calls


def test_the_engine_ends_at_a_stop_string_and_counts_to_its_end(gemma):
    """GenerationConfig.stop_strings: the engine ends the generation where the stop string begins
    (finish reason 'stop' on its last event), with the tokens of the run without it up to there, and
    counts the steps once, up to the token that completed the stop string, like a step cut by an
    end-of-generation token."""
    prompt = encode(gemma, PROMPTS[0])
    full = Reply.collect(Engine(gemma, NgramDrafter(), FixedGamma(4)).generate(prompt, gen(64)))
    stop = next(full.text[i : i + 3] for i in range(8, len(full.text) - 3) if full.text[i] == "\n")
    at = full.text.index(stop)
    events = list(Engine(gemma, NgramDrafter(), FixedGamma(4)).generate(prompt, gen(64, stop_strings=(stop,))))
    cut = Reply.collect(iter(events))
    assert cut.finish_reason == "stop" == events[-1].finish_reason and cut.text == full.text[:at]
    assert cut.tokens == full.tokens[: len(cut.tokens)] and cut.sources == full.sources[: len(cut.sources)]
    ends = [len("".join(full.pieces[: i + 1])) for i in range(len(full.tokens))]
    produced = next(i + 1 for i, e in enumerate(ends) if e >= at + len(stop))
    st = cut.stats
    assert st.generated == len(cut.tokens) and st.produced == produced and st.target_calls == len(events)
    assert st.accepted == full.sources[:produced].count(DRAFT)
    with pytest.raises(EdgeSpecError, match="stop strings"):
        GenerationConfig(stop_strings=("",))
