"""Suffix drafter (`--draft suffix`): the n-gram drafter's copy from the current context (prompt +
committed output), plus a bounded cache of this model's earlier answers to the same user, where a
continuation is scored by how often it followed the matched text (SuffixDecoding, Oliaro et al.
2024, as in vLLM's Arctic Inference; llama.cpp's ngram-cache keeps a dynamic cache of the same kind).

Each step looks up these candidates:
  context  the longest recurring n-gram of prompt + output and what followed its latest occurrence
           (`NgramDrafter`, unchanged); where that match is 2 tokens or less (or none), also the
           longest end of the text in bytes (4 to 32) that occurs earlier, and what followed it,
           tokenized (`TextLookup`: a copy the reply tokenizes otherwise, such as a name after a
           quote); it proposes, as 'context', where its estimate beats the token match's;
  answers  the longest suffix of the context (up to 32 tokens) found in earlier answers, continued
           token by token with what most of its occurrences went on with; or, while the text
           follows one earlier answer (a record with the same keys, a repeated edit block), with that
           answer's own continuation after the place it last matched ('aligned').
Every committed token scores both candidates of the step before it, drafted or not, so each kind
keeps a record of how often its proposals come true at each match size, pooled over the owner's
requests. A step proposes from the context unless the answers' first token is at least
PREFER_CONTEXT times less likely to miss (or the context has no match, or one whose first token is
less than UNLIKELY at this place), also where both propose the same first token; after MISS_STREAK
answers candidates in a row that missed, answers wait for one to come true. An answers or text
candidate gives gamma auto its per-token confidence (Hint.confidence); for answers r * agree / seen,
r the record at the match size that token continues, agree of the seen occurrences going on this way
(agreement can only lower the record's figure: how often a match in earlier answers is continued
right depends on the match's size, hardly on how many occurrences agree; docs/suffix_drafter.md has
the measurement).

Earlier answers are kept per owner (DraftContext.owner: the server keys them by API key) and per
model, each owner's at most a cap of tokens (`answer_store.py`; their n-gram index: `answer_index.py`;
their files between runs: service/answer_files.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from edgespec.core.drafters import NGRAM_SIZES, Draft, DraftContext, Hint, register
from edgespec.core.drafters.answer_index import AnswerIndex
from edgespec.core.drafters.answer_store import LEAD, STORE, AnswerCache, estimate, size_class
from edgespec.core.drafters.ngram import NgramDrafter
from edgespec.core.sampling import SamplingParams
from edgespec.runtime.llama import Model

CONTEXT, ANSWERS = "context", "answers"  # Draft.source / Hint.source: token provenance shows them
TEXT = "text"  # record kind of a context candidate found by characters (proposed as CONTEXT)
ALIGNED = "aligned"  # record kinds of an answers candidate that follows one earlier answer (+ skip class)
WALK_MAX = 32  # longest candidate (tokens) from earlier answers
ALIGN_WINDOW = 96  # how far past the place it last matched a followed answer may match again (tokens)
SHORT_SKIP = 16  # a followed answer's tokens skipped to match again, up to which the skip is short
PREFER_CONTEXT = 2.0  # earlier answers propose over the context only when this many times less likely to miss
UNLIKELY = 0.1  # a context candidate whose first token is estimated less likely than this is not proposed
TEXT_CHARS = (4, 32)  # shortest and longest end of the text (bytes) looked up by characters
TEXT_UNDER = 2  # context token matches up to this size are looked up by characters too
BYTES_PER_TOKEN = 4  # a match of 4n bytes is kept with n-token matches (records, priors)
TEXT_SPAN = 64  # bytes of what followed it that are tokenized into a proposal
MISS_STREAK = 3  # answers candidates whose first token failed in a row, after which answers wait for a hit
SURE = 0.95  # estimates compared no higher: a context at least 0.90 sure is never overruled


@dataclass(frozen=True)
class Candidate:
    """What one source would propose at a step: its record kind, match size, tokens, estimated
    acceptance per token (answers only) and of its first token; for an answers candidate, where its
    tokens sit in the index and where the matched text ends there (to follow that answer). `size`
    is the match size its records are kept by."""

    source: str
    kind: str
    size: int
    tokens: list[int]
    first: float
    confidence: tuple[float, ...] = ()
    at: tuple[int, ...] = ()
    end: int = -1
    match: int = 0  # an answers candidate's matched tokens (`size` may count more: the run before a skip)
    place: tuple[int, ...] = ()  # the text's last two tokens where it was proposed


@dataclass(frozen=True)
class Plan:
    """A step's candidates, looked up once for `hint` and `propose` of the same context length."""

    length: int
    context: Candidate | None
    answers: Candidate | None
    chosen: Candidate | None
    text: Candidate | None = None


class TextLookup:
    """The context as bytes, to find a copy whose tokens differ from the text's own: a value copied
    into a JSON string after a quote ('"Sam' 'uel' where the prompt has ' Samuel'), which no token
    n-gram matches. The longest end of the text (TEXT_CHARS bytes) that occurs earlier is found, and
    the bytes after its latest occurrence are tokenized as the proposal (its last token dropped: it
    may be cut short)."""

    def __init__(self, piece: Callable[[int], bytes], tokenize: Callable[[str], list[int]]) -> None:
        self.piece = piece
        self.tokenize = tokenize
        self._bytes = bytearray()
        self._tokens = 0

    def begin(self, prompt: Sequence[int]) -> None:
        self._bytes, self._tokens = bytearray(), 0
        self._extend(prompt)

    def _extend(self, context: Sequence[int]) -> None:
        for t in context[self._tokens :]:
            self._bytes += self.piece(int(t))
        self._tokens = len(context)

    def lookup(self, context: Sequence[int]) -> tuple[int, list[int]]:
        """(bytes matched, proposed tokens) for `context`; (0, []) when nothing matches."""
        self._extend(context)
        b = self._bytes
        n = len(b)
        lo, hi = TEXT_CHARS[0], min(TEXT_CHARS[1], n - 1)
        # where an end of `size` bytes occurs earlier, every shorter end does: search the size in halves
        found = (0, -1)
        while lo <= hi:
            size = (lo + hi) // 2
            at = b.rfind(b[n - size :], 0, n - 1)  # an occurrence that ends before the text does
            if at >= 0:
                found, lo = (size, at), size + 1
            else:
                hi = size - 1
        size, at = found
        follow = bytes(b[at + size : at + size + TEXT_SPAN]) if size else b""
        if not follow or follow[0] & 0xC0 == 0x80:  # nothing after it, or inside a character
            return 0, []
        return size, self.tokenize(follow.decode("utf-8", "ignore"))[:-1]


class SuffixDrafter:
    name = "suffix"
    needs_hidden = False

    def __init__(self, cache: AnswerCache | None, n_min: int = NGRAM_SIZES[0], n_max: int = NGRAM_SIZES[1],
                 text: TextLookup | None = None) -> None:
        self.context = NgramDrafter(n_min, n_max)
        self.text = text
        self.cache = cache
        self._index = AnswerIndex.empty()
        self._plan: Plan | None = None
        self._follow: int | None = None  # position in the index of the last token the text agreed with
        self._run = 0  # tokens the text agreed with the followed answer in a row, up to there
        self._misses = 0  # answers candidates in a row whose first token did not come true (this generation)
        self._committed: Sequence[int] | None = None  # the engine's context, for the answer at the end
        self._prompt: list[int] = []

    def begin(self, prompt: Sequence[int], sampling: SamplingParams | None = None) -> None:
        self.context.begin(prompt, sampling)
        if self.text is not None:
            self.text.begin(prompt)
        self._index = self.cache.view() if self.cache is not None else AnswerIndex.empty()
        self._plan, self._follow, self._committed, self._run, self._misses = None, None, None, 0, 0
        self._prompt = [int(t) for t in prompt]

    # ------------------------------------------------------------------ the candidates
    def _estimate(self, kind: str, size: int, share: float = 1.0, chain: bool = False, place: tuple = ()) -> float:
        if self.cache is None:
            return estimate(None, size_class(size)) * share
        return self.cache.estimate(kind, size, share, chain, place)

    def _context_candidate(self, context: Sequence[int]) -> Candidate | None:
        n = self.context.match_size(context)
        if not n:
            return None
        # scored against what is committed even when not drafted (the answers' rival at later steps)
        toks = self.context.propose(context, WALK_MAX).tokens.tolist()
        place = _place(context)
        return Candidate(CONTEXT, CONTEXT, n, toks, self._estimate(CONTEXT, n, place=place), place=place)

    def _text_candidate(self, context: Sequence[int]) -> Candidate | None:
        matched, toks = self.text.lookup(context) if self.text is not None else (0, [])
        if not toks:
            return None
        size = matched // BYTES_PER_TOKEN  # kept with token matches of about as much text
        place = _place(context)
        # the match does not grow along the copy: every token after the first has the same estimate
        first, chained = self._estimate(TEXT, size, place=place), self._estimate(TEXT, size, chain=True)
        return Candidate(CONTEXT, TEXT, size, toks, first, (first,) + (chained,) * (len(toks) - 1), place=place)

    def _answers_candidate(self, context: Sequence[int]) -> Candidate | None:
        idx = self._index
        if not idx.records:
            return None
        size, occ = idx.match(context)
        if not size:
            return None
        kind = ANSWERS
        f = self._follow
        if f is not None:  # still in the answer it followed: its next match within the window, that record only
            near = occ[(occ >= f) & (occ <= min(f + ALIGN_WINDOW, idx.record_end(f)))]
            if near.size:
                # kept apart by how much of that answer the text skipped to match again: none (a copy
                # going on), a few tokens (a value that differs between records), more
                skipped = int(near[0]) - size + 1 - (f + 1)
                occ, kind = near[:1], ALIGNED + ("0" if skipped <= 0 else "1" if skipped <= SHORT_SKIP else "2")
        w = idx.walk(occ, WALK_MAX)
        if not w.tokens:
            return None
        # Following an answer, the tokens the text agreed with it in a row count as matched, before a
        # skip too: a record's next key after its value is as sure as the run of keys before it.
        n = size if kind == ANSWERS else max(size, self._run) if kind == ALIGNED + "0" else size + self._run
        place = _place(context)
        conf = tuple(self._estimate(kind, n + j, a / s, j > 0, place) for j, (a, s) in enumerate(w.support))
        return Candidate(ANSWERS, kind, n, w.tokens, conf[0], conf, tuple(w.at), w.at[0] - 1, size, place)

    def _step(self, context: Sequence[int]) -> Plan:
        plan = self._plan
        if plan is not None and plan.length == len(context):
            return plan
        ctx = self._context_candidate(context)
        ans = self._answers_candidate(context)
        # A context candidate wrong at this place again and again (a record's value: not in the text)
        # does not propose; it is still scored, so the place's record can recover.
        chosen = ctx if ctx is not None and ctx.first >= UNLIKELY else None
        # Where the tokens match little, the characters may match more (a copy tokenized otherwise).
        txt = self._text_candidate(context) if chosen is None or chosen.size <= TEXT_UNDER else None
        if txt is not None and (chosen is None or txt.first > chosen.first):
            chosen = txt
        # The context is the text as it is now (the file being edited), earlier answers are history:
        # they propose only where they at least halve the odds of a miss, or the context has nothing.
        # That holds where both propose the same next token too: what follows it, and how sure gamma
        # auto is of it, are the surer source's (an id's digits after a record's key: the prompt holds
        # them once, a short match, while earlier answers go on from the whole key).
        if ans is not None and self._misses < MISS_STREAK and (
                chosen is None or (1 - min(ans.first, SURE)) * PREFER_CONTEXT < 1 - min(chosen.first, SURE)):
            chosen = ans
        self._plan = Plan(len(context), ctx, ans, chosen, txt)
        return self._plan

    # ------------------------------------------------------------------ the protocol
    def hint(self, context: Sequence[int]) -> Hint:
        c = self._step(context).chosen
        if c is None:
            return Hint.nothing(CONTEXT)
        if c.kind == CONTEXT:  # as the n-gram drafter hints: gamma auto's measured table per size
            return Hint(c.size, CONTEXT, copies=True)
        return Hint(c.size, c.source, copies=True, confidence=c.confidence)  # answers, or text (as context)

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        c = self._step(context).chosen
        if c is None or gamma <= 0:
            return Draft()
        if c.kind == CONTEXT:
            return Draft(self.context.propose(context, gamma).tokens, None, CONTEXT)
        return Draft(np.asarray(c.tokens[:gamma], dtype=np.int32), None, c.source)

    def commit(self, context: Sequence[int], n_accepted: int) -> None:
        self.context.commit(context, n_accepted)
        self._committed = context
        plan, self._plan = self._plan, None
        if plan is None or self.cache is None:
            return
        new = context[plan.length :]
        outcomes: list[tuple[str, int, int, bool]] = []
        for cand in (plan.context, plan.text, plan.answers):
            if cand is not None:
                agreed = _agreed(cand.tokens, new)
                grows = cand.kind != TEXT  # a token match grows by a token per token; bytes matched stay
                # the tokens that came true, then the first that did not (if one was committed)
                outcomes += [(cand.kind, cand.size + j * grows, j, j < agreed, cand.place)
                             for j in range(min(agreed + 1, len(new), len(cand.tokens)))]
        ans = plan.answers
        if ans is not None:  # follow that answer from the last place the text agreed with it
            agreed = _agreed(ans.tokens, new)
            self._misses = 0 if agreed else self._misses + 1
            if agreed:
                if ans.kind == ALIGNED + "0":
                    self._run += agreed
                else:  # a fresh match (its tokens), or one after a skip (the run before it as well)
                    self._run = (ans.match if ans.kind == ANSWERS else ans.size) + agreed
                self._follow = ans.at[agreed - 1]
            elif self._follow is None:  # where the text first matched an earlier answer
                self._follow, self._run = ans.end, ans.match
            # else a miss: keep following from where the text last agreed (a jump on a miss loses the place)
        self.cache.score(outcomes)

    def draft_cost_s(self) -> float:
        return 0.0  # lookups: well under a millisecond a step, nothing next to a target pass

    def close(self) -> None:
        """The generation is over: its answer joins the owner's cache."""
        committed, self._committed = self._committed, None
        if self.cache is not None and committed is not None:
            self.cache.add(self._prompt[-LEAD:], committed[len(self._prompt) :])
        self.context.close()
        self._plan, self._index = None, AnswerIndex.empty()


def _place(context: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(t) for t in context[-2:])


def _agreed(tokens: Sequence[int], new: Sequence[int]) -> int:
    """How many leading tokens of `tokens` equal those of `new`."""
    n = 0
    for a, b in zip(tokens, new, strict=False):
        if a != b:
            break
        n += 1
    return n


@register("suffix", "the context's n-gram copy plus this user's earlier answers, frequency-scored (SuffixDecoding)",
          options="--ngram MIN,MAX (its context copy)")
def _build(ctx: DraftContext) -> SuffixDrafter:
    return SuffixDrafter(STORE.cache(ctx.target, ctx.owner), *ctx.ngram, text=text_lookup(ctx.target))


def text_lookup(target: Model) -> TextLookup:
    """A TextLookup in `target`'s tokens."""
    return TextLookup(target.token_bytes, lambda t: target.tokenize(t, add_special=False))
