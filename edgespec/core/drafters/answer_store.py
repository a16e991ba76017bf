"""The suffix drafter's earlier answers in memory: one `AnswerCache` per (model, owner), each at most
`cap` tokens (its oldest answers go first), so one owner's requests never evict, nor reveal, another
owner's answers. At most `max_caches` caches are held; beyond, the least recently used one leaves
memory (its file, when it has one, stays).

Keeping answers between runs is not done here (core owns no I/O): a store may be given `files`, an
`AnswerFiles` (service/answer_files.py) that opens one `AnswerLog` per cache, which the cache reads
once and appends each new answer to.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from edgespec.core.drafters.answer_index import SIZES, AnswerIndex
from edgespec.runtime.errors import EdgeSpecError

if TYPE_CHECKING:
    from edgespec.runtime.llama import Model

LEAD = 8  # prompt tokens kept before each answer: the chat template's turn header matches an answer's start
MIN_ANSWER = 4  # shorter answers are not kept (nothing to copy; the server's one-token warm-up)
PRIOR_W = 2.0  # weight of a record's prior, in observations
RECORD_DECAY = 0.5 ** (1 / 512)  # per observation of a record: the owner's recent requests weigh most
DEFAULT_CAP = 1 << 17  # tokens of earlier answers kept per owner (~16 MB with the index)
DEFAULT_CACHES = 16  # (model, owner) caches held in memory at once
PLACES = 1 << 16  # place records kept per owner (forgotten all at once beyond)

Record = tuple[list[int], list[int]]  # (lead: the end of the prompt, answer)


class AnswerLog(Protocol):
    """Where one cache's answers are kept between runs (service/answer_files.py writes them)."""

    def load(self) -> list[Record]:
        """The records kept so far, oldest first (damaged ones left out)."""

    def append(self, record: Record, current: Sequence[Record]) -> None:
        """Keep one more record; `current`: every record the cache holds now (with it), for a log
        that writes itself afresh instead (compaction)."""

    def close(self) -> None:
        """The cache leaves memory: release the log (its lock)."""


class AnswerFiles(Protocol):
    def open(self, model: str, owner: str, n_vocab: int, cap: int) -> AnswerLog | None:
        """The log of `owner`'s answers to `model` (None: kept in memory only)."""


def model_id(target: Model) -> str:
    """Which model answers belong to: its file name, size and vocabulary (answers are its tokens)."""
    return f"{Path(target.path).name}:{target.info.size_bytes}:{target.n_vocab}"


class AnswerCache:
    """One owner's earlier answers to one model, at most `store.cap` tokens, and the record of how
    often each kind of proposal came true at each match size (`estimate`); `log` keeps the answers
    between runs (None: memory only)."""

    def __init__(self, store: AnswerStore, model: str, log: AnswerLog | None) -> None:
        self.store = store
        self.model = model
        self.log = log
        self.index = AnswerIndex.empty()
        self.used = 0  # the store's sequence number at its last use (the least recently used leaves memory)
        self._record: dict[tuple[str, int, bool], tuple[float, float]] = {}
        # first tokens by the place they were proposed at (the kind and the text's last two tokens):
        # in records that repeat a shape, the place tells a key (the same in every record) from a
        # value (different in each), which no match size does
        self._place: dict[tuple, tuple[float, float]] = {}
        if log is not None:
            kept, total = [], 0
            for lead, answer in reversed(log.load()):  # the newest within the cap
                total += len(lead[-LEAD:]) + len(answer) + 1
                if total > store.cap:
                    break
                kept.append((lead, answer))
            for lead, answer in reversed(kept):
                self.index = self.index.added(lead[-LEAD:], answer, store.next_seq())

    @property
    def tokens(self) -> int:
        return int(self.index.tokens.size)

    def view(self) -> AnswerIndex:
        """The index now (immutable: a generation drafts from the one it began with)."""
        return self.index

    def records(self) -> list[Record]:
        return [self.index.record(r) for r in range(self.index.records)]

    def add(self, lead: Sequence[int], answer: Sequence[int]) -> None:
        """Keep one more answer (after `lead`, the end of its prompt), evicting this cache's oldest
        answers to stay within the cap, and append it to the log."""
        if len(answer) < MIN_ANSWER or self.store.cap <= 0:
            return
        lead, answer = [int(t) for t in lead[-LEAD:]], [int(t) for t in answer]
        with self.store.lock:
            self.index = self.index.added(lead, answer, self.store.next_seq())
            self.fit(self.store.cap)
            if self.log is not None:
                self.log.append((lead, answer), self.records())

    def fit(self, cap: int) -> None:
        """Evict the oldest answers until at most `cap` tokens are held."""
        while self.tokens > cap and self.index.records:
            self.index = self.index.evicted()

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None

    def estimate(self, kind: str, size: int, share: float = 1.0, chain: bool = False, place: tuple = ()) -> float:
        """How likely a proposal of `kind` at a match of `size` tokens comes true, when `share` of the
        occurrences it was read from went on this way (agreement of a few occurrences says little;
        disagreement says the text branches here): record * share. `chain`: a token after the first
        of a proposal, the ones before it right (kept apart: a copy under way is likelier right than
        the first token after a lookup, which is where sources part). A first token's `place` record,
        where there is one, updates the size record as a Beta prior."""
        cls = size_class(size)
        r = estimate(self._record.get((kind, cls, chain)), cls)
        at = self._place.get((kind.rstrip("012"), *place)) if place and not chain else None
        if at is not None:
            r = (at[0] + PRIOR_W * r) / (at[1] + PRIOR_W)
        return r * share

    def score(self, outcomes: Sequence[tuple[str, int, int, bool, tuple]]) -> None:
        """Record (kind, match size, position in the proposal, came true, place) for proposals scored
        against committed tokens."""
        with self.store.lock:
            for kind, size, j, ok, place in outcomes:
                key = (kind, size_class(size), j > 0)
                succ, trials = self._record.get(key, (0.0, 0.0))
                self._record[key] = (RECORD_DECAY * succ + ok, RECORD_DECAY * trials + 1.0)
                if j == 0 and place:
                    if len(self._place) >= PLACES:  # bounded: the places of the recent requests
                        self._place.clear()
                    pk = (kind.rstrip("012"), *place)
                    succ, trials = self._place.get(pk, (0.0, 0.0))
                    self._place[pk] = (RECORD_DECAY * succ + ok, RECORD_DECAY * trials + 1.0)


def estimate(record: tuple[float, float] | None, size: int) -> float:
    """A record's rate of proposals that came true, from a prior size/(size+3) worth PRIOR_W
    observations (a longer match is likelier continued; cautious until measured)."""
    succ, trials = record or (0.0, 0.0)
    return (succ + PRIOR_W * size / (size + 3)) / (trials + PRIOR_W)


def size_class(size: int) -> int:
    """The ladder size `size` falls in (the largest of SIZES not above it)."""
    return SIZES[max(0, bisect.bisect_right(SIZES, size) - 1)]


class AnswerStore:
    """The process's earlier answers: one `AnswerCache` per (model, owner), each at most `cap`
    tokens, at most `max_caches` of them in memory; `files` (None: memory only) keeps them between
    runs."""

    def __init__(self, cap: int = DEFAULT_CAP, files: AnswerFiles | None = None,
                 max_caches: int = DEFAULT_CACHES) -> None:
        self.lock = threading.RLock()
        self._caches: dict[tuple[str, str], AnswerCache] = {}
        self._seq = 0
        self.configure(cap, files, max_caches)

    def configure(self, cap: int = DEFAULT_CAP, files: AnswerFiles | None = None,
                  max_caches: int = DEFAULT_CACHES) -> None:
        """Set the cap per owner (tokens; 0 keeps no answers), where answers are kept between runs
        (None: memory only) and how many caches memory holds. Caches made before keep their logs."""
        if cap < 0:
            raise EdgeSpecError(f"the earlier-answers cap must be >= 0 tokens, got {cap}")
        if max_caches < 1:
            raise EdgeSpecError(f"the earlier-answers store must hold at least one cache, got {max_caches}")
        with self.lock:
            self.cap = cap
            self.files = files
            self.max_caches = max_caches
            for c in self._caches.values():
                c.fit(cap)
            self._make_room(0)

    def cache(self, target: Model, owner: str) -> AnswerCache | None:
        """The cache of `owner`'s answers to `target` (None when the cap is 0)."""
        if self.cap <= 0:
            return None
        mid = model_id(target)
        with self.lock:
            c = self._caches.get((mid, owner))
            if c is None:
                self._make_room(1)
                log = self.files.open(mid, owner, target.n_vocab, self.cap) if self.files is not None else None
                c = self._caches[mid, owner] = AnswerCache(self, mid, log)
            c.used = self.next_seq()
            return c

    def _make_room(self, more: int) -> None:
        """Let the least recently used caches leave memory until `more` fit within max_caches."""
        while self._caches and len(self._caches) + more > self.max_caches:
            key = min(self._caches, key=lambda k: self._caches[k].used)
            self._caches.pop(key).close()

    @property
    def tokens(self) -> int:
        """Tokens held by every cache (answers, their leads and separators)."""
        return sum(c.tokens for c in self._caches.values())

    @property
    def nbytes(self) -> int:
        return sum(c.index.nbytes for c in self._caches.values())

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def clear(self) -> None:
        """Forget every answer in memory and release the logs (files stay)."""
        with self.lock:
            for c in self._caches.values():
                c.close()
            self._caches.clear()


STORE = AnswerStore()  # this process's earlier answers (`serve` configures it from its options)
