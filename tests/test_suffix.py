"""The suffix drafter: its index of earlier answers against a brute-force search, frequency-scored
candidates, bounded memory per owner, owners kept apart, and on
the real bundled models: the same proposals as n-gram without earlier answers, earlier answers
drafted and accepted, and output unchanged (greedy equal to plain decoding on the same kernel path,
seeded sampling equal to plain seeded sampling)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from edgespec.core.adaptive import AutoGamma
from edgespec.core.costs import CostModel
from edgespec.core.drafters import Hint
from edgespec.core.drafters.answer_index import MAX_OCC, SIZES, AnswerIndex
from edgespec.core.drafters.answer_store import LEAD, AnswerStore
from edgespec.core.drafters.ngram import NgramDrafter
from edgespec.core.drafters.suffix import ANSWERS, CONTEXT, MISS_STREAK, SuffixDrafter, text_lookup
from edgespec.core.engine import Engine, FixedGamma
from edgespec.core.sampling import SamplingParams
from edgespec.service.session import Reply
from tests.batched_path import BatchedPath
from tests.test_engine import PROMPTS, encode, gen


# ----------------------------------------------------------------------------- the index, no model
def brute_match(records: list[tuple[list[int], list[int]]], context: list[int]) -> tuple[int, list[int]]:
    """(longest ladder size n whose last n context tokens occur in a record ending where an answer
    token follows, every such position in the concatenated token array)."""
    flat, ends = [], []
    for lead, answer in records:
        start = len(flat)
        rec = lead + answer
        flat += rec + [-1]
        ends.append((start, len(lead), len(rec)))
    for n in sorted((s for s in SIZES if s <= len(context)), reverse=True):
        tail = context[-n:]
        found = [start + e for start, lead, body in ends for e in range(max(n - 1, lead - 1), body - 1)
                 if flat[start + e - n + 1 : start + e + 1] == tail]
        if found:
            return n, sorted(found)[-MAX_OCC:]
    return 0, []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=LEAD),
                          st.lists(st.integers(0, 3), min_size=1, max_size=30)), min_size=1, max_size=6),
       st.lists(st.integers(0, 3), min_size=1, max_size=40))
def test_match_agrees_with_brute_force(records, context):
    idx = AnswerIndex.empty()
    for seq, (lead, answer) in enumerate(records):
        idx = idx.added(lead, answer, seq)
    n, occ = idx.match(context)
    assert (n, occ.tolist()) == brute_match(records, context)
    for r, (lead, answer) in enumerate(records):
        assert idx.record(r) == (lead, answer)


def test_walk_follows_the_most_supported_continuation():
    idx = AnswerIndex.empty()
    lead = [90, 91]
    for seq, answer in enumerate(([1, 2, 3, 4, 5], [1, 2, 3, 7, 8], [1, 2, 3, 4, 5], [1, 2, 9])):
        idx = idx.added(lead, answer, seq)
    n, occ = idx.match([50, 90, 91])  # an answer's start: the lead (the chat template's turn header) matches
    assert n == 2 and occ.size == 4
    w = idx.walk(occ, 10)
    # 4 of 4 start 1 2 3; then 2 of 3 go on with 4 (the answer [1, 2, 9] ended a token earlier)
    assert w.tokens == [1, 2, 3, 4, 5]
    assert w.support == [(4, 4), (4, 4), (3, 4), (2, 3), (2, 2)]
    assert [int(idx.tokens[p]) for p in w.at] == w.tokens
    # a tie goes to the most recent occurrence's continuation
    tie = AnswerIndex.empty().added(lead, [1, 6], 0).added(lead, [1, 7], 1)
    assert tie.walk(tie.match([90, 91, 1])[1], 4).tokens == [7]


def test_walk_stops_where_the_occurrences_disagree():
    idx = AnswerIndex.empty()
    for seq, third in enumerate(range(3, 9)):
        idx = idx.added([9], [1, 2, third], seq)
    w = idx.walk(idx.match([9])[1], 8)
    assert w.tokens == [1, 2]  # six different third tokens: none has the support (MIN_PATH) to be proposed


def test_memory_stays_bounded_with_thousands_of_answers(smollm2):
    """3,000 answers from three owners into a store capped at 8,000 tokens per owner: no owner's cache
    ever holds more than the cap, the arrays stay ~120 bytes a token, each owner's newest answers stay
    and its oldest go."""
    store = AnswerStore(cap=8_000)
    caches = [store.cache(smollm2, f"owner-{i}") for i in range(3)]
    rng = np.random.default_rng(0)
    sizes = []
    for i in range(3000):
        answer = [int(t) for t in rng.integers(100, 5000, size=int(rng.integers(20, 60)))]
        caches[i % 3].add([1, 2, 3], [7000 + i % 1000, *answer])
        sizes.append(caches[i % 3].tokens)
        assert max(c.tokens for c in caches) <= 8_000
    assert max(sizes) <= 8_000 and min(sizes[-500:]) > 6_000
    assert store.nbytes <= 3 * 8_000 * (4 + 12 * len(SIZES) + 8)
    newest, oldest = caches[2999 % 3], caches[0]
    assert newest.view().match([1, 2, 3, 7000 + 2999 % 1000])[0] >= 4
    assert oldest.view().match([1, 2, 3, 7000])[0] < 4  # its first answer, long evicted


def test_one_owner_never_evicts_another(smollm2):
    """Issue 44: with a small cap, one key's answers flushed another's (its next request drafted from
    the context again). Each owner has its own cap: however much one adds, another's stays whole."""
    store = AnswerStore(cap=40)
    bob = store.cache(smollm2, "bob")
    bob.add([1, 2], [10, 11, 12, 13, 14, 15])
    before = bob.view()
    alice = store.cache(smollm2, "alice")
    for i in range(50):
        alice.add([1, 2], [100 + i] * 20)
    assert store.cache(smollm2, "bob").view() is before and before.match([1, 2, 10])[0] == 3
    assert alice.tokens <= 40


def test_the_least_recently_used_cache_leaves_memory_beyond_the_limit(smollm2):
    store = AnswerStore(cap=1000, max_caches=2)
    store.cache(smollm2, "a").add([1], [5, 6, 7, 8])
    store.cache(smollm2, "b").add([1], [5, 6, 7, 8])
    store.cache(smollm2, "a")  # used again: b is now the least recent
    store.cache(smollm2, "c")
    assert store.cache(smollm2, "a").tokens > 0 and store.cache(smollm2, "b").tokens == 0


def test_owners_and_models_are_kept_apart(smollm2, gemma):
    store = AnswerStore()
    store.cache(smollm2, "alice").add([1, 2], [10, 11, 12, 13, 14])
    assert store.cache(smollm2, "alice").view().match([1, 2, 10])[0] == 3
    assert store.cache(smollm2, "bob").view().records == 0
    assert store.cache(gemma, "alice").view().records == 0
    assert AnswerStore(cap=0).cache(smollm2, "alice") is None  # --answers-tokens 0 keeps none


def test_gamma_auto_plans_with_the_drafters_confidence():
    costs = CostModel({1: 1.0, 2: 1.6, 3: 2.1, 4: 2.5, 8: 4.4, 16: 5.4}, gamma_max=15)  # the 1.5B's T(K) on Zen 5
    g = AutoGamma()
    g.start(costs)
    sure = g.choose(Hint(2, ANSWERS, copies=True, confidence=(0.97,) * 6))
    assert sure == 6  # as long as the proposal, at the confidence given
    assert g.choose(Hint(2, ANSWERS, copies=True, confidence=(0.3, 0.3))) == 0
    assert g.choose(Hint(2, CONTEXT, copies=True)) == 0  # a 2-token context match: the uninformed prior


# ----------------------------------------------------------------------------- on the real models
def generate(model, drafter, text: str, gamma: int = 4, max_tokens: int = 64, **kw) -> Reply:
    cfg = gen(max_tokens, **kw)  # plain steps on the batched kernel path too (tests/batched_path.py)
    reply = Reply.collect(Engine(BatchedPath(model), drafter, FixedGamma(gamma)).generate(encode(model, text), cfg))
    if drafter is not None:
        drafter.close()  # as the session does after every generation: the answer joins the cache
    return reply


QUESTIONS = [
    "Write a Python function that returns the square of a number.",
    "Write a Python function that returns the cube of a number.",
    "Write a Python function that returns the double of a number.",
]


def test_without_earlier_answers_it_drafts_what_ngram_drafts(smollm2):
    for text in QUESTIONS[:2]:
        ngram = generate(smollm2, NgramDrafter(), text)
        suffix = generate(smollm2, SuffixDrafter(None), text)
        assert suffix.tokens == ngram.tokens
        assert suffix.stats.drafted_hist == ngram.stats.drafted_hist
        assert (suffix.stats.drafted, suffix.stats.accepted) == (ngram.stats.drafted, ngram.stats.accepted)
        assert set(suffix.stats.source_drafted) <= {CONTEXT}


def test_earlier_answers_are_drafted_and_accepted(smollm2):
    """The second question's answer repeats the first one's shape (a code block, the sentence after
    it), which its prompt does not hold: tokens from earlier answers are drafted and accepted there.
    A drafter with no earlier answers drafts none, and another owner's answers are not used."""
    store = AnswerStore()
    first = generate(smollm2, SuffixDrafter(store.cache(smollm2, "alice")), QUESTIONS[0])
    assert first.stats.source_drafted.get(ANSWERS, 0) == 0
    second = generate(smollm2, SuffixDrafter(store.cache(smollm2, "alice")), QUESTIONS[1])
    assert second.stats.source_accepted.get(ANSWERS, 0) >= 5
    assert ANSWERS in second.drafted_by
    stranger = generate(smollm2, SuffixDrafter(store.cache(smollm2, "bob")), QUESTIONS[1])
    assert stranger.stats.source_drafted.get(ANSWERS, 0) == 0
    assert stranger.tokens == second.tokens
    assert second.stats.target_calls < stranger.stats.target_calls


def test_greedy_output_equals_plain_with_earlier_answers(smollm2):
    """On the same kernel path as plain decoding (tests/test_engine.py; SmolLM2's Q4_1 logits do not
    depend on the batch there), what the drafter proposes never changes the greedy text, whichever
    source proposed it. (Gemma's K-quant logits move with the batch in the fast build, for n-gram
    drafts as well; exact mode is tested through the server, tests/test_server_answers.py.)"""
    store = AnswerStore()
    drafted_from_answers = 0
    for text in [*QUESTIONS, *PROMPTS[:1]]:
        ref = generate(smollm2, None, text)
        for gamma in (1, 4, 8):
            drafter = SuffixDrafter(store.cache(smollm2, f"g{gamma}"), text=text_lookup(smollm2))
            spec = generate(smollm2, drafter, text, gamma)
            assert spec.tokens == ref.tokens, f"gamma={gamma} {text[:30]!r}"
            drafted_from_answers += spec.stats.source_accepted.get(ANSWERS, 0)
    assert drafted_from_answers > 0


def test_seeded_sampling_equals_plain_seeded_sampling(smollm2):
    """Lossless at T > 0: draws are keyed by position, and SmolLM2's logits do not depend on the batch
    on this path, so a seeded run drafting from earlier answers prints what seeded plain sampling does."""
    sampling = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=5)
    store = AnswerStore()
    cache = store.cache(smollm2, "alice")
    from_answers = 0
    for text in QUESTIONS:
        ref = generate(smollm2, None, text, sampling=sampling)
        for gamma in (3, 6):
            spec = generate(smollm2, SuffixDrafter(cache, text=text_lookup(smollm2)), text, gamma, sampling=sampling)
            assert spec.tokens == ref.tokens, (gamma, text)
            from_answers += spec.stats.source_accepted.get(ANSWERS, 0)
    assert from_answers > 0


def test_drafting_is_cheap_per_step(smollm2):
    """Not a speed assertion on the machine: the drafter's own work per step stays far below a
    target pass (it is timed by the engine as draft_s), with a thousand earlier answers."""
    store = AnswerStore()
    cache = store.cache(smollm2, "alice")
    rng = np.random.default_rng(1)
    for _ in range(1000):
        cache.add([1, 2, 3], [int(t) for t in rng.integers(100, 3000, size=60)])
    reply = generate(smollm2, SuffixDrafter(cache, text=text_lookup(smollm2)), QUESTIONS[0], max_tokens=48)
    assert reply.stats.draft_s < reply.stats.target_s


def test_the_surer_source_proposes_where_both_propose_the_same_token(smollm2):
    """The prompt holds 52 -> 7 once (a short context match, wrong here as often as not); an earlier
    answer goes on 50 51 52 -> 7 8 9 53, and answers have come true at that size: both propose 7, and
    what follows it (and the confidence gamma auto plans with) is the answer's."""
    cache = AnswerStore().cache(smollm2, "alice")
    cache.add([1, 2], [50, 51, 52, 7, 8, 9, 53])
    cache.score([(CONTEXT, 1, 0, i < 3, ()) for i in range(10)] + [(ANSWERS, 3, 0, True, ())] * 10)
    d = SuffixDrafter(cache)
    prompt = [30, 52, 7, 31, 32, 33, 34, 35, 50, 51, 52]
    d.begin(prompt)
    hint = d.hint(prompt)
    assert hint.source == ANSWERS and hint.confidence and hint.confidence[0] > 0.8
    assert d.propose(prompt, 4).tokens.tolist() == [7, 8, 9, 53]


def test_a_context_match_wrong_at_this_place_again_and_again_is_not_proposed(smollm2):
    """Where the context's proposals keep failing after the same two tokens (a record's value after
    its key), the context does not propose there; it is still scored, so the place can recover."""
    cache = AnswerStore().cache(smollm2, "alice")
    prompt = [40, 41, 60, 61, 42, 43, 44, 40, 41]  # the context proposes 60 61 after 40 41
    place = (40, 41)
    cache.score([(CONTEXT, 2, 0, False, place)] * 30)
    d = SuffixDrafter(cache)
    d.begin(prompt)
    assert d.hint(prompt).size == 0 and len(d.propose(prompt, 4)) == 0
    before = cache.estimate(CONTEXT, 2, place=place)
    d.commit(prompt + [60], 0)  # the target wrote what the context would have proposed
    assert cache.estimate(CONTEXT, 2, place=place) > before


def test_a_copy_tokenized_otherwise_is_found_by_its_characters(smollm2):
    """A name copied into a JSON string after a quote is tokenized otherwise than in the prompt: no
    token n-gram matches the reply's end, the characters do, and what followed them is proposed in
    the model's tokens."""
    prompt = smollm2.tokenize("Ticket 48252\nFrom: Samuel Okafor <s.okafor@example.com>\nMy order is late.\n\n",
                              add_special=False)
    reply = smollm2.tokenize('{"customer": "Samu', add_special=False)
    context = prompt + reply
    d = SuffixDrafter(None, text=text_lookup(smollm2))
    d.begin(prompt)
    assert d.context.match_size(context) <= 2
    hint = d.hint(context)
    assert hint.source == CONTEXT and hint.confidence  # proposed with the record's confidence
    proposal = smollm2.detokenize(d.propose(context, 8).tokens.tolist())
    assert proposal and "el Okafor <s.okafor@example.com>".startswith(proposal), proposal


def test_earlier_answers_wait_after_missing_again_and_again_in_a_generation(smollm2):
    """Free text that an earlier answer began like (an explanation) parts from it at once: after
    MISS_STREAK answers candidates in a row whose first token did not come true, earlier answers stop
    proposing in this generation until one comes true again (they are still looked up and scored)."""
    cache = AnswerStore().cache(smollm2, "alice")
    cache.add([1, 2], [50, 51, 52, 53, 54, 55, 56, 57])
    # earlier answers, matched fresh or followed, have come true so far
    cache.score([(kind, size, 0, True, ()) for kind in (ANSWERS, "aligned0", "aligned1", "aligned2")
                 for size in (1, 2, 3, 4)] * 40)
    d = SuffixDrafter(cache)
    context = [30, 31, 32, 50]
    d.begin(context)
    for miss in range(MISS_STREAK):
        assert d.hint(context).source == ANSWERS, miss
        context = context + [90 + miss, 50]  # the text went on otherwise, then reached 50 again
        d.commit(context[:-1], 0)
        d.commit(context, 0)
    assert d.hint(context).source != ANSWERS
    assert cache.estimate("aligned0", 1) > 0.8  # by the record answers would still propose: the streak stops them
    d.commit(context + [51], 0)  # the answer's next token came true: answers propose again
    context = context + [51]
    assert d.hint(context).source == ANSWERS
