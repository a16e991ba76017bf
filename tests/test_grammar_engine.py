"""A grammar inside speculation, on the real bundled SmolLM2 and llguidance: greedy speculative output
equals constrained plain decoding for every drafter, seeded sampling equals seeded constrained plain
sampling, the rejection sampler reproduces the constrained distribution when a sampled draft is cut
at a forbidden token, a forbidden draft token gets no row in the verify pass, the tokens a schema
forces are drafted with provenance 'grammar', and the generation ends where the JSON does."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import BaseModel, Field

from edgespec.core.adaptive import AutoGamma
from edgespec.core.costs import CostModel
from edgespec.core.drafters import Draft, Hint
from edgespec.core.drafters.grammar import GrammarDrafter
from edgespec.core.drafters.model import ModelDrafter
from edgespec.core.drafters.ngram import NgramDrafter
from edgespec.core.drafters.suffix import SuffixDrafter, text_lookup
from edgespec.core.engine import Engine, FixedGamma, GenerationConfig
from edgespec.core.grammar import GRAMMAR, Constraint
from edgespec.core.sampling import Noise, SamplingParams, constrain, process, sample, verify_stochastic
from edgespec.core.stats import Stats
from edgespec.runtime.grammar import grammar_tokenizer
from edgespec.runtime.llama import Model
from edgespec.service.session import Reply
from edgespec.service.structured import json_schema_grammar, lark_grammar
from tests.batched_path import BatchedPath
from tests.test_engine import encode


class Contact(BaseModel):
    name: str = Field(max_length=40)
    email: str = Field(max_length=60)
    age: int
    city: str = Field(max_length=40)


SCHEMA = json_schema_grammar(Contact.model_json_schema())
TEXTS = [
    "Extract the contact as JSON with the keys name, email, age and city.\n\n"
    "Maria Lopez (maria.lopez@example.com) is 34 and lives in Valencia.",
    "Return JSON (name, email, age, city) for: John Smith, 52, Boston, john.smith@mail.com",
    "Who is this? Give name, email, age and city as JSON.\nPriya Natarajan, priya.n@corp.io, age 29, from Chennai.",
]


def constrained(model: Model, spec: str = SCHEMA) -> Constraint:
    return Constraint(grammar_tokenizer(model), spec)


def run(model: Model, drafter, text: str, gamma: int = 4, spec: str = SCHEMA, max_tokens: int = 96,
        wrap: bool = True, **kw) -> Reply:
    """One constrained generation on the batched kernel path (tests/batched_path.py): `drafter`
    None is constrained plain decoding; `wrap` puts the grammar's forced tokens ahead of the
    drafter's, as a session does."""
    grammar = constrained(model, spec)
    if drafter is not None and wrap:
        drafter = GrammarDrafter(grammar, drafter)
    engine = Engine(BatchedPath(model), drafter, FixedGamma(gamma), None, grammar)
    return Reply.collect(engine.generate(encode(model, text), GenerationConfig(max_tokens=max_tokens, **kw)))


@pytest.fixture(scope="module")
def plain(smollm2):
    """Constrained plain decoding of each text (the reference every speculative run must equal)."""
    return [run(smollm2, None, text) for text in TEXTS]


def test_constrained_plain_decoding_gives_valid_json_and_ends_with_it(plain):
    for ref in plain:
        assert ref.finish_reason == "grammar", ref.text
        Contact.model_validate_json(ref.text)  # the schema holds (pydantic validates it)
        assert ref.text == json.dumps(json.loads(ref.text), ensure_ascii=False)  # one line, ', ' and ': '


def drafter_of(kind: str, model: Model):
    if kind == "ngram":
        return NgramDrafter(1, 3)
    return SuffixDrafter(None, text=text_lookup(model)) if kind == "suffix" else None


@pytest.mark.parametrize("kind", ["ngram", "suffix", "grammar only"])
def test_greedy_speculative_equals_constrained_plain(smollm2, plain, kind):
    forced = 0
    for text, ref in zip(TEXTS, plain, strict=True):
        for gamma in (2, 6):
            inner = drafter_of(kind, smollm2)
            spec = run(smollm2, inner, text, gamma) if inner is not None else _forced_only(smollm2, text, gamma)
            assert spec.tokens == ref.tokens, (kind, gamma, text[:30])
            assert spec.finish_reason == ref.finish_reason
            assert spec.stats.target_calls < ref.stats.target_calls
            forced += spec.stats.source_accepted.get(GRAMMAR, 0)
    assert forced > 0


def _forced_only(model: Model, text: str, gamma: int) -> Reply:
    grammar = constrained(model)
    engine = Engine(BatchedPath(model), GrammarDrafter(grammar, None), FixedGamma(gamma), None, grammar)
    return Reply.collect(engine.generate(encode(model, text), GenerationConfig(max_tokens=96)))


def test_greedy_with_a_draft_model_equals_constrained_plain(smollm2, smollm2_path, plain):
    draft = Model(smollm2_path, n_ctx=2048, flash_attn="off")
    try:
        for text, ref in zip(TEXTS[:2], plain[:2], strict=True):
            spec = run(smollm2, ModelDrafter(draft, smollm2), text, 4)
            assert spec.tokens == ref.tokens
            assert {GRAMMAR, "model:" + draft.info.description} <= set(spec.drafted_by)
    finally:
        draft.close()


def test_seeded_sampling_equals_seeded_constrained_plain_sampling(smollm2):
    """Draws are keyed by position and n-gram drafts are one-hot, so a seeded constrained run that
    drafts prints what seeded constrained plain sampling prints (the constraint changes nothing of that)."""
    sampling = SamplingParams(temperature=0.9, top_p=0.95, seed=11)
    for text in TEXTS[:2]:
        ref = run(smollm2, None, text, sampling=sampling)
        Contact.model_validate_json(ref.text)
        for gamma in (3, 6):
            assert run(smollm2, NgramDrafter(1, 3), text, gamma, sampling=sampling).tokens == ref.tokens


def test_forced_tokens_are_drafted_with_provenance_grammar(smollm2, plain):
    reply = run(smollm2, NgramDrafter(1, 3), TEXTS[0], 8)
    assert GRAMMAR in reply.drafted_by
    st = reply.stats
    assert st.source_accepted[GRAMMAR] >= 8  # the keys and their punctuation at least
    assert st.source_accepted[GRAMMAR] >= 0.9 * st.source_drafted[GRAMMAR]
    text = "".join(p for p, b in zip(reply.pieces, reply.drafted_by, strict=True) if b == GRAMMAR)
    for key in ("name", "email", "age", "city"):
        assert key in text  # each key was forced, not sampled
    assert st.grammar_s > 0


def test_forced_text_the_vocabulary_could_split_two_ways_is_drafted_as_the_tokenizer_splits_it(smollm2):
    """llguidance's forced tokens stop before the ' "' that opens a string value after '": ' (it could
    begin a longer token); the rest of the forced text is drafted in the tokenizer's own split, and
    every proposed token is one the grammar admits in a row."""
    c = constrained(smollm2)
    c.advance(smollm2.tokenize('{"name": "Maria Lopez", "email', add_special=False))
    forced = c.forced()
    assert smollm2.detokenize(forced) == '": "'
    assert c.matcher.compute_ff_tokens() != forced  # more than llguidance's own forced tokens
    assert c.admitted(forced) == len(forced)
    c.advance(smollm2.tokenize('": "m', add_special=False))
    assert c.forced() == []  # inside a free string value: nothing is forced


def test_a_rollback_after_the_grammar_is_complete_gives_back_what_it_took(smollm2):
    """A draft that runs past the end of the JSON (its closing brace, then an end-of-generation token
    given separately, as a drafter's tokens are after the forced ones) is taken back exactly: the
    state is the one before it."""
    c = constrained(smollm2)
    c.advance(smollm2.tokenize('{"name": "John Smith", "email": "john.smith@mail.com", "age": 52, "city":',
                               add_special=False))
    tail = smollm2.tokenize(' "Boston"}', add_special=False)
    taken = c.advance(tail[:1]) + c.advance([*tail[1:], smollm2.info.eos])
    assert c.done and taken == len(tail)  # the end-of-generation token after the complete JSON is not taken
    assert c.forced() == []  # nothing follows a complete grammar
    c.rollback(taken)
    assert not c.done and c.admitted(tail) == len(tail)
    masks = c.masks(tail)  # a verify pass's rows past the end: the state is unchanged after it too
    assert masks.shape[0] == len(tail) + 1 and c.admitted(tail) == len(tail)


class Scripted:
    """A drafter that proposes a fixed continuation (the tokens under test), and nothing after."""

    name = "scripted"
    needs_hidden = False

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def begin(self, prompt, sampling) -> None:
        self.start = len(prompt)

    def hint(self, context) -> Hint:
        return Hint()

    def propose(self, context, gamma: int) -> Draft:
        done = len(context) - self.start
        return Draft(np.asarray(self.tokens[done : done + gamma], dtype=np.int32))

    def commit(self, context, n_accepted: int) -> None:
        pass

    def draft_cost_s(self) -> float:
        return 0.0

    def close(self) -> None:
        pass


def test_a_forbidden_draft_token_gets_no_row_in_the_verify_pass(smollm2):
    """The grammar allows "yes" or "no"; the draft's third token starts "maybe": the pass verifies
    the two before it and nothing after, and the text is what constrained plain decoding gives."""
    spec = json_schema_grammar({"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
                                "required": ["answer"], "additionalProperties": False})
    head = smollm2.tokenize('{"answer": "', add_special=False)
    tokens = head + smollm2.tokenize('maybe"}', add_special=False)
    grammar = constrained(smollm2, spec)
    assert grammar.admitted(tokens) == len(head)
    prompt = encode(smollm2, "Is the sky blue? Answer in JSON.")
    engine = Engine(smollm2, Scripted(tokens), FixedGamma(len(tokens)), None, grammar)
    cfg = GenerationConfig(max_tokens=16)
    engine._prefill(list(prompt), cfg, Stats())
    step = engine.step(list(prompt), len(tokens), cfg, Noise(0))
    assert len(step.draft) == len(head) and step.rows == len(head) + 1 and step.logits.shape[0] == step.rows
    reply = Reply.collect(Engine(BatchedPath(smollm2), Scripted(tokens), FixedGamma(8), None,
                                 constrained(smollm2, spec)).generate(prompt, cfg))
    ref = Reply.collect(Engine(BatchedPath(smollm2), None, None, None, constrained(smollm2, spec)).generate(prompt, cfg))
    assert json.loads(reply.text)["answer"] in ("yes", "no") and reply.tokens == ref.tokens


def test_rejection_sampling_cut_at_a_forbidden_token_follows_the_constrained_distribution():
    """A sampled draft d ~ q whose token the grammar forbids is cut before verification; the token
    emitted there is drawn from the residual of q (Draft.cut), so the emitted tokens follow the
    constrained target distribution exactly: chi-square against process(masked logits)."""
    from scipy.stats import chisquare

    rng = np.random.default_rng(3)
    vocab, trials = 8, 30_000
    logits = rng.normal(size=(3, vocab)).astype(np.float32)
    allowed = np.ones((3, vocab), dtype=bool)
    allowed[0, [1, 4]] = False  # the grammar forbids tokens 1 and 4 first, 2 and 6 second
    allowed[1, [2, 6]] = False
    q = rng.dirichlet(np.ones(vocab), size=2)  # a draft model that knows nothing of the grammar
    params = SamplingParams(temperature=1.0)
    masked = constrain(logits, allowed)
    p0, p1 = process(masked[0], params), process(masked[1], params)
    first = int(np.argmax(p0))  # the second position is checked after this first token
    counts = np.zeros((2, vocab))
    for _ in range(trials):
        tokens = [sample(q[0], rng.random())]
        tokens.append(sample(q[1], rng.random()))
        n = 0 if not allowed[0, tokens[0]] else 1 if not allowed[1, tokens[1]] else 2
        draft = Draft(np.asarray(tokens, dtype=np.int32), q).cut(n)
        k, tok = verify_stochastic(masked, draft.tokens, draft.probs, params, lambda row, purpose: rng.random())
        out = [*draft.tokens[:k].tolist(), tok]
        counts[0, out[0]] += 1
        if len(out) > 1 and out[0] == first:
            counts[1, out[1]] += 1
    assert counts[0][p0 == 0].sum() == 0
    assert chisquare(counts[0][p0 > 0], p0[p0 > 0] * counts[0].sum()).pvalue > 1e-4
    assert counts[1][p1 == 0].sum() == 0 and counts[1].sum() > 500
    assert chisquare(counts[1][p1 > 0], p1[p1 > 0] * counts[1].sum()).pvalue > 1e-4


def test_max_tokens_inside_the_json_is_length(smollm2):
    reply = run(smollm2, NgramDrafter(1, 3), TEXTS[0], 4, max_tokens=6)
    assert reply.finish_reason == "length" and len(reply.tokens) == 6


def test_a_lark_grammar_constrains_and_ends(smollm2):
    spec = lark_grammar('start: "The answer is " ("yes" | "no") "."')
    reply = run(smollm2, NgramDrafter(1, 3), "Is water wet?", 4, spec=spec)
    # it ends where the grammar does: at once, or at the end-of-generation token the grammar forced there
    assert reply.text in ("The answer is yes.", "The answer is no.") and reply.finish_reason in ("grammar", "eog")
    assert reply.stats.source_accepted.get(GRAMMAR, 0) >= 3  # "The answer is " was forced


def test_gamma_auto_plans_certain_tokens_at_no_cost_and_learns_nothing_from_them():
    """Hint.certain: 4 forced tokens are drafted even where drafting costs twice a target pass per
    token (they cost nothing), and their acceptance is no evidence about the drafter's own tokens."""
    policy = AutoGamma()
    policy.start(CostModel.flat(c=2.0))
    assert policy.choose(Hint.nothing(GRAMMAR)) == 0
    assert policy.choose(Hint(0, GRAMMAR, certain=4)) == 4
    before = policy.alpha_overall
    policy.observe(4, 4)
    assert policy.alpha_overall == before
    # a drafter's own (paid) tokens after them are not worth it at c = 2: only the certain ones
    assert policy.choose(Hint(None, "model", certain=3)) == 3
