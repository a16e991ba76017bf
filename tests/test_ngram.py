"""Prompt-lookup drafter: proposals agree with a brute-force search; the index is incremental."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from edgespec.core.drafters import Hint
from edgespec.core.drafters.ngram import NgramDrafter, ngram_sizes


def brute_force(tokens: list[int], gamma: int, sizes: tuple[int, ...]) -> tuple[int, list[int]]:
    """(matched size, continuation) by scanning every earlier position; the continuation is copied
    token by token from the text as it grows, so a copy that reaches the end reads its own output."""
    for n in sorted(sizes, reverse=True):
        if n > len(tokens):
            continue
        suffix = tokens[len(tokens) - n :]
        for end in range(len(tokens) - 1, n - 1, -1):  # latest occurrence first
            if tokens[end - n : end] == suffix:
                text = list(tokens)
                for i in range(gamma):
                    text.append(text[end + i])
                return n, text[len(tokens) :]
    return 0, []


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 5), min_size=1, max_size=60),
    st.integers(1, 8),
    st.integers(1, 3),
    st.integers(0, 3),
)
def test_matches_brute_force_while_growing(tokens, gamma, n_min, extra):
    n_max = n_min + extra
    d = NgramDrafter(n_min, n_max)
    assert set(d.sizes) >= {n for n in range(n_min, min(n_max, 4) + 1)} | {n_max}
    d.begin(tokens[:1])
    for i in range(1, len(tokens) + 1):  # the context grows one token per step, as in generation
        size, cont = brute_force(tokens[:i], gamma, d.sizes)
        assert d.hint(tokens[:i]) == (Hint(size, copies=True) if size else Hint.nothing())
        assert d.propose(tokens[:i], gamma).tokens.tolist() == cont


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=1, max_size=120), st.integers(1, 16))
def test_long_sizes_match_brute_force(tokens, gamma):
    """The default ladder 1,2,3,4,6,8,12,16 on repetitive text, where long matches are common."""
    d = NgramDrafter()
    assert d.sizes == ngram_sizes(1, 16) == (1, 2, 3, 4, 6, 8, 12, 16)
    d.begin(tokens[:1])
    for i in range(1, len(tokens) + 1):
        size, cont = brute_force(tokens[:i], gamma, d.sizes)
        assert d.hint(tokens[:i]) == (Hint(size, copies=True) if size else Hint.nothing())
        assert d.propose(tokens[:i], gamma).tokens.tolist() == cont


def test_copies_the_continuation():
    d = NgramDrafter(1, 3)
    ctx = [5, 6, 7, 8, 9, 1, 2, 5, 6]
    d.begin(ctx)
    assert d.propose(ctx, 3).tokens.tolist() == [7, 8, 9]
    assert d.propose(ctx, 0).tokens.tolist() == []


def test_a_loop_is_drafted_as_far_as_asked():
    """Greedy small models fall into loops ("Summary:\nSummary:\n..."): the match is 3 tokens back,
    and the draft goes on around the loop instead of stopping at the end of the context."""
    d = NgramDrafter()
    ctx = [9, 4, 1, 2, 3, 1, 2, 3, 1, 2, 3]
    d.begin(ctx)
    assert d.hint(ctx) == Hint(6, copies=True)
    assert d.propose(ctx, 10).tokens.tolist() == [1, 2, 3, 1, 2, 3, 1, 2, 3, 1]


def test_restarts_on_a_different_context():
    d = NgramDrafter(1, 2)
    d.begin([1, 2, 3, 1])
    assert d.propose([1, 2, 3, 1], 2).tokens.tolist() == [2, 3]
    assert d.propose([7, 8, 7], 2).tokens.tolist() == [8, 7]


class CountingIndex(dict):
    """The drafter's n-gram index, counting the entries written into it."""

    writes = 0

    def __setitem__(self, key, value) -> None:
        self.writes += 1
        super().__setitem__(key, value)


def test_step_cost_does_not_grow_with_context():
    """Each step indexes only the new tokens: one entry per n-gram size per committed token, in the
    same index, however long the context (an index rebuilt every step writes the whole context)."""
    d = NgramDrafter(1, 4)
    ctx = list(range(50_000))
    d.begin(ctx)
    index = d._index = CountingIndex(d._index)
    for step in range(1, 101):
        ctx.append(step % 7)
        d.propose(ctx, 4)
        assert d._index is index, "the index was replaced instead of extended"
        assert index.writes == step * len(d.sizes)
