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

Memory is bounded: the answers of every owner together hold at most `cap` tokens (the oldest answer is
evicted first), ~120 bytes a token with the index. They may persist under EDGESPEC_CACHE/answers,
one file per model and owner, compacted at twice the cap; a corrupt or foreign file is ignored with
one line on stderr. Answers are kept per owner (DraftContext.owner): the server keys them by API key.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.core.drafters import NGRAM_SIZES, Draft, DraftContext, Hint, register
from edgespec.core.drafters.ngram import NgramDrafter, ngram_sizes
from edgespec.core.sampling import SamplingParams
from edgespec.runtime import firstrun
from edgespec.runtime.errors import EdgeSpecError
from edgespec.runtime.llama import Model

CONTEXT, ANSWERS = "context", "answers"  # Draft.source / Hint.source: token provenance shows them
TEXT = "text"  # record kind of a context candidate found by characters (proposed as CONTEXT)
ALIGNED = "aligned"  # record kinds of an answers candidate that follows one earlier answer (+ skip class)
SIZES = ngram_sizes(1, 32)  # match sizes looked up in earlier answers: 1, 2, 3, 4, 6, 8, ..., 24, 32
WALK_MAX = 32  # longest candidate (tokens) from earlier answers
MAX_OCC = 256  # the most recent occurrences of a match that are scored
ALIGN_WINDOW = 96  # how far past the place it last matched a followed answer may match again (tokens)
SHORT_SKIP = 16  # a followed answer's tokens skipped to match again, up to which the skip is short
MIN_PATH = 0.2  # a candidate ends where fewer than this share of the occurrences still agree
LEAD = 8  # prompt tokens kept before each answer: the chat template's turn header matches an answer's start
MIN_ANSWER = 4  # shorter answers are not kept (nothing to copy; the server's one-token warm-up)
SEP = -1  # ends each answer in the token array
PRIOR_W = 2.0  # weight of a record's prior, in observations
PREFER_CONTEXT = 2.0  # earlier answers propose over the context only when this many times less likely to miss
UNLIKELY = 0.1  # a context candidate whose first token is estimated less likely than this is not proposed
TEXT_CHARS = (4, 32)  # shortest and longest end of the text (bytes) looked up by characters
TEXT_UNDER = 2  # context token matches up to this size are looked up by characters too
BYTES_PER_TOKEN = 4  # a match of 4n bytes is kept with n-token matches (records, priors)
TEXT_SPAN = 64  # bytes of what followed it that are tokenized into a proposal
MISS_STREAK = 3  # answers candidates whose first token failed in a row, after which answers wait for a hit
SURE = 0.95  # estimates compared no higher: a context at least 0.90 sure is never overruled
RECORD_DECAY = 0.5 ** (1 / 512)  # per observation of a record: the owner's recent requests weigh most
DEFAULT_CAP = 1 << 17  # tokens of earlier answers kept in all (~16 MB with the index)
PLACES = 1 << 16  # place records kept per owner (forgotten all at once beyond)
FORMAT = "edgespec-answers"
VERSION = 1

_B = 0x9E3779B97F4A7C15
_POW = np.array([pow(_B, k, 1 << 64) for k in range(SIZES[-1])], dtype=np.uint64)  # B^k mod 2^64
_EMPTY = np.empty(0, dtype=np.int32)


def _hashes(tokens: np.ndarray, n: int) -> np.ndarray:
    """[L - n + 1] hashes of the n-grams of tokens [L], by the position of their last token:
    sum_k (t[p-k] + 1) B^k mod 2^64 (a collision only costs a wasted draft, never a wrong token)."""
    win = np.lib.stride_tricks.sliding_window_view(tokens.astype(np.uint64) + np.uint64(1), n)
    return (win * _POW[n - 1 :: -1]).sum(axis=1, dtype=np.uint64)


def _tail_hashes(context: Sequence[int]) -> np.ndarray:
    """[min(len, 32)] hashes of the context's last n tokens for n = 1, 2, ... (entry n - 1)."""
    tail = np.asarray(context[-SIZES[-1] :], dtype=np.uint64)[::-1] + np.uint64(1)
    return np.cumsum(tail * _POW[: tail.size], dtype=np.uint64)


@dataclass(frozen=True)
class Walk:
    """A candidate read from earlier answers: tokens [k], per token (occurrences that went on with
    it, occurrences that went on at all) and its position in `AnswerIndex.tokens` in the most recent
    occurrence that agreed all along."""

    tokens: list[int]
    support: list[tuple[int, int]]
    at: list[int]


@dataclass(frozen=True)
class AnswerIndex:
    """Earlier answers and their n-gram index. Immutable: adding or evicting makes a new one, so a
    generation reads the index it began with while another thread adds to the cache.

    tokens: [N] int32, the records (up to LEAD prompt tokens, then the answer) each followed by SEP.
    starts, leads, seqs: [R] where each record starts, its prompt tokens, its order of arrival.
    keys[i], ends[i]: [M_i] for size SIZES[i], the hash of every indexed n-gram and the position of
    its last token, sorted by (hash, position). An n-gram is indexed where an answer token follows it.
    """

    tokens: np.ndarray
    starts: np.ndarray
    leads: np.ndarray
    seqs: np.ndarray
    keys: tuple[np.ndarray, ...]
    ends: tuple[np.ndarray, ...]

    @classmethod
    def empty(cls) -> AnswerIndex:
        none = np.empty(0, dtype=np.int64)
        return cls(_EMPTY, none, none, none, tuple(np.empty(0, np.uint64) for _ in SIZES),
                   tuple(_EMPTY for _ in SIZES))

    @property
    def records(self) -> int:
        return int(self.starts.size)

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays: what the cache's memory grows with."""
        arrays = (self.tokens, self.starts, self.leads, self.seqs, *self.keys, *self.ends)
        return sum(a.nbytes for a in arrays)

    def added(self, lead: Sequence[int], answer: Sequence[int], seq: int) -> AnswerIndex:
        """This index with one more record (`lead` prompt tokens, then `answer`)."""
        start = self.tokens.size
        rec = np.asarray([*lead, *answer], dtype=np.int32)
        body = rec.size
        keys, ends = [], []
        for i, n in enumerate(SIZES):
            first = max(n - 1, len(lead) - 1)  # the n-gram's last token; an answer token follows it
            if first > body - 2:
                keys.append(self.keys[i])
                ends.append(self.ends[i])
                continue
            h = _hashes(rec, n)[first - (n - 1) : body - 1 - (n - 1)]
            p = np.arange(start + first, start + body - 1, dtype=np.int32)
            order = np.lexsort((p, h))
            at = np.searchsorted(self.keys[i], h[order], side="right")  # after older equal hashes
            keys.append(np.insert(self.keys[i], at, h[order]))
            ends.append(np.insert(self.ends[i], at, p[order]))
        return AnswerIndex(np.concatenate([self.tokens, rec, np.asarray([SEP], dtype=np.int32)]),
                           np.append(self.starts, start), np.append(self.leads, len(lead)),
                           np.append(self.seqs, seq), tuple(keys), tuple(ends))

    def evicted(self) -> AnswerIndex:
        """This index without its oldest record."""
        cut = int(self.starts[1]) if self.records > 1 else self.tokens.size
        keys, ends = [], []
        for k, e in zip(self.keys, self.ends, strict=True):
            keep = e >= cut
            keys.append(k[keep])
            ends.append((e[keep] - cut).astype(np.int32))
        return AnswerIndex(self.tokens[cut:].copy(), self.starts[1:] - cut, self.leads[1:].copy(),
                           self.seqs[1:].copy(), tuple(keys), tuple(ends))

    def record(self, r: int) -> tuple[list[int], list[int]]:
        """Record r's (lead, answer)."""
        start = int(self.starts[r])
        end = int(self.starts[r + 1]) - 1 if r + 1 < self.records else self.tokens.size - 1
        lead = start + int(self.leads[r])
        return self.tokens[start:lead].tolist(), self.tokens[lead:end].tolist()

    def record_end(self, pos: int) -> int:
        """Position of the SEP that ends the record holding `pos`."""
        r = int(np.searchsorted(self.starts, pos, side="right"))
        return int(self.starts[r]) - 1 if r < self.records else self.tokens.size - 1

    def match(self, context: Sequence[int]) -> tuple[int, np.ndarray]:
        """(size of the longest suffix of `context` indexed, the positions of its last token in its
        most recent MAX_OCC occurrences, ascending); (0, []) when not even one token is."""
        avail = min(len(context), SIZES[-1])
        if not self.tokens.size or not avail:
            return 0, _EMPTY
        h = _tail_hashes(context)
        # A suffix that occurs has every shorter suffix occurring too (indexed at the same
        # position), so the longest one is found by bisection over the sizes.
        lo, hi = 0, bisect.bisect_right(SIZES, avail) - 1
        best: tuple[int, np.ndarray] = (0, _EMPTY)
        while lo <= hi:
            mid = (lo + hi) // 2
            n, keys = SIZES[mid], self.keys[mid]
            a = int(keys.searchsorted(h[n - 1], side="left"))
            if a < keys.size and keys[a] == h[n - 1]:
                b = int(keys.searchsorted(h[n - 1], side="right"))
                best = (n, self.ends[mid][max(a, b - MAX_OCC) : b])
                lo = mid + 1
            else:
                hi = mid - 1
        return best

    def walk(self, occ: np.ndarray, limit: int) -> Walk:
        """The most supported continuation of the occurrences ending at `occ` (ascending), up to
        `limit` tokens: at each token the one most of them go on with (a tie: the most recent one's),
        until fewer than MIN_PATH of them agree all along or every one has reached its answer's end."""
        toks = self.tokens
        out: list[int] = []
        support: list[tuple[int, int]] = []
        at: list[int] = []
        share = 1.0
        pos = occ
        while len(out) < limit and pos.size:
            if pos.size == 1:  # one occurrence: copy it up to its answer's end
                p = int(pos[0]) + 1
                seg = toks[p : p + limit - len(out)]
                stop = np.flatnonzero(seg == SEP)
                seg = seg[: stop[0]] if stop.size else seg
                out += seg.tolist()
                support += [(1, 1)] * seg.size
                at += range(p, p + seg.size)
                break
            nxt = toks[pos + 1]
            live = nxt != SEP
            if not live.all():
                pos, nxt = pos[live], nxt[live]
                if not pos.size:
                    break
            tok = int(nxt[-1])  # the most recent occurrence's token
            agree = int(np.count_nonzero(nxt == tok))
            if agree < nxt.size:
                values, counts = np.unique(nxt, return_counts=True)
                top = int(counts.max())
                if top > agree:
                    best = set(values[counts == top].tolist())
                    tok = next(int(t) for t in nxt[::-1] if int(t) in best)
                    agree = top
            share *= agree / nxt.size
            if share < MIN_PATH:
                break
            pos = pos[nxt == tok] + 1
            out.append(tok)
            support.append((agree, int(nxt.size)))
            at.append(int(pos[-1]))
        return Walk(out, support, at)


def model_id(target: Model) -> str:
    """Which model answers belong to: its file name, size and vocabulary (answers are its tokens)."""
    return f"{Path(target.path).name}:{target.info.size_bytes}:{target.n_vocab}"


class AnswerCache:
    """One owner's earlier answers to one model, and the record of how often each kind of proposal
    came true at each match size (`estimate`), optionally persisted to `path`."""

    def __init__(self, store: AnswerStore, model: str, n_vocab: int, path: Path | None) -> None:
        self.store = store
        self.model = model
        self.n_vocab = n_vocab
        self.path = path
        self.index = AnswerIndex.empty()
        self._record: dict[tuple[str, int, bool], tuple[float, float]] = {}
        # first tokens by the place they were proposed at (the kind and the text's last two tokens):
        # in records that repeat a shape, the place tells a key (the same in every record) from a
        # value (different in each), which no match size does
        self._place: dict[tuple, tuple[float, float]] = {}
        self._file_tokens = 0  # tokens in the persisted file (compacted at twice the cap)
        self._rewrite = False  # the file must be written afresh (ignored, or over its bound)
        if path is not None:
            self._load(path)

    @property
    def tokens(self) -> int:
        return int(self.index.tokens.size)

    def view(self) -> AnswerIndex:
        """The index now (immutable: a generation drafts from the one it began with)."""
        return self.index

    def add(self, lead: Sequence[int], answer: Sequence[int]) -> None:
        """Keep one more answer (after `lead`, the end of its prompt); evicts the oldest answers
        of every owner to stay within the store's cap, and appends it to the persisted file."""
        if len(answer) < MIN_ANSWER or self.store.cap <= 0:
            return
        lead, answer = [int(t) for t in lead[-LEAD:]], [int(t) for t in answer]
        with self.store.lock:
            self.index = self.index.added(lead, answer, self.store.next_seq())
            self.store.make_room()
            self._persist(lead, answer)

    def estimate(self, kind: str, size: int, share: float = 1.0, chain: bool = False, place: tuple = ()) -> float:
        """How likely a proposal of `kind` at a match of `size` tokens comes true, when `share` of the
        occurrences it was read from went on this way (agreement of a few occurrences says little;
        disagreement says the text branches here): record * share. `chain`: a token after the first
        of a proposal, the ones before it right (kept apart: a copy under way is likelier right than
        the first token after a lookup, which is where sources part). A first token's `place` record,
        where there is one, updates the size record as a Beta prior."""
        cls = _size_class(size)
        r = _estimate(self._record.get((kind, cls, chain)), cls)
        at = self._place.get((kind.rstrip("012"), *place)) if place and not chain else None
        if at is not None:
            r = (at[0] + PRIOR_W * r) / (at[1] + PRIOR_W)
        return r * share

    def score(self, outcomes: Sequence[tuple[str, int, int, bool, tuple]]) -> None:
        """Record (kind, match size, position in the proposal, came true, place) for proposals scored
        against committed tokens."""
        with self.store.lock:
            for kind, size, j, ok, place in outcomes:
                key = (kind, _size_class(size), j > 0)
                succ, trials = self._record.get(key, (0.0, 0.0))
                self._record[key] = (RECORD_DECAY * succ + ok, RECORD_DECAY * trials + 1.0)
                if j == 0 and place:
                    if len(self._place) >= PLACES:  # bounded: the places of the recent requests
                        self._place.clear()
                    pk = (kind.rstrip("012"), *place)
                    succ, trials = self._place.get(pk, (0.0, 0.0))
                    self._place[pk] = (RECORD_DECAY * succ + ok, RECORD_DECAY * trials + 1.0)

    # ------------------------------------------------------------------ persistence
    def _load(self, path: Path) -> None:
        if not path.exists():
            return
        records: list[tuple[list[int], list[int]]] = []
        line_no = 1
        try:
            with path.open(encoding="utf-8") as f:
                header = json.loads(f.readline() or "null")
                if not isinstance(header, dict) or header.get("format") != FORMAT:
                    return self._ignore(path, "not an EdgeSpec answers file")
                if header.get("version") != VERSION:
                    return self._ignore(path, f"format version {header.get('version')!r}, this EdgeSpec reads {VERSION}")
                if header.get("model") != self.model:
                    return self._ignore(path, f"made for another model ({header.get('model')!r})")
                for line_no, line in enumerate(f, 2):  # noqa: B007 - named in the error below
                    obj = json.loads(line)
                    lead, answer = obj["lead"], obj["answer"]
                    if not (_tokens_ok(lead, self.n_vocab) and _tokens_ok(answer, self.n_vocab)) or not answer:
                        raise ValueError("token ids out of the model's vocabulary")
                    records.append((lead, answer))
        except (OSError, UnicodeDecodeError) as exc:
            return self._ignore(path, f"unreadable ({exc})")
        except (ValueError, KeyError, TypeError) as exc:
            return self._ignore(path, f"corrupt at line {line_no} ({type(exc).__name__}: {exc})")
        self._file_tokens = sum(len(a) + len(b) for a, b in records)
        kept, total = [], 0
        for lead, answer in reversed(records):  # the newest within the cap
            total += len(lead) + len(answer) + 1
            if total > self.store.cap:
                break
            kept.append((lead, answer))
        for lead, answer in reversed(kept):
            self.index = self.index.added(lead[-LEAD:], answer, self.store.next_seq())
        self._rewrite = len(kept) < len(records)

    def _ignore(self, path: Path, why: str) -> None:
        print(f"edgespec: ignoring the earlier answers in {path}: {why}", file=sys.stderr)
        self._rewrite = True

    def _persist(self, lead: list[int], answer: list[int]) -> None:
        path = self.path
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            if self._rewrite or self._file_tokens + len(answer) > 2 * self.store.cap:
                tmp = path.with_suffix(".tmp")
                with _private(tmp, "w") as f:
                    f.write(json.dumps({"format": FORMAT, "version": VERSION, "model": self.model}) + "\n")
                    for r in range(self.index.records):
                        rl, ra = self.index.record(r)
                        f.write(json.dumps({"lead": rl, "answer": ra}) + "\n")
                os.replace(tmp, path)
                self._file_tokens = self.tokens
                self._rewrite = False
                return
            new = not path.exists()
            with _private(path, "a") as f:
                if new:
                    f.write(json.dumps({"format": FORMAT, "version": VERSION, "model": self.model}) + "\n")
                f.write(json.dumps({"lead": lead, "answer": answer}) + "\n")
            self._file_tokens += len(lead) + len(answer)
        except OSError as exc:
            print(f"edgespec: cannot keep earlier answers in {path} ({exc.strerror}); keeping them in memory only",
                  file=sys.stderr)
            self.path = None


def _private(path: Path, mode: str):  # noqa: ANN202 - a text file object
    """Open a file only its owner may read (answers can hold anything a user sent)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "a" else os.O_TRUNC)
    return os.fdopen(os.open(path, flags, 0o600), mode, encoding="utf-8")


def _tokens_ok(tokens: object, n_vocab: int) -> bool:
    return isinstance(tokens, list) and all(type(t) is int and 0 <= t < n_vocab for t in tokens)


def _estimate(record: tuple[float, float] | None, size: int) -> float:
    """A record's rate of proposals that came true, from a prior size/(size+3) worth PRIOR_W
    observations (a longer match is likelier continued; cautious until measured)."""
    succ, trials = record or (0.0, 0.0)
    return (succ + PRIOR_W * size / (size + 3)) / (trials + PRIOR_W)


def _size_class(size: int) -> int:
    """The ladder size `size` falls in (the largest of SIZES not above it)."""
    return SIZES[max(0, bisect.bisect_right(SIZES, size) - 1)]


class AnswerStore:
    """The process's earlier answers, one `AnswerCache` per (model, owner), at most `cap` tokens in
    all; `folder` (None: memory only) keeps them between runs."""

    def __init__(self, cap: int = DEFAULT_CAP, folder: Path | None = None) -> None:
        self.lock = threading.RLock()
        self._caches: dict[tuple[str, str], AnswerCache] = {}
        self._seq = 0
        self.configure(cap, folder)

    def configure(self, cap: int = DEFAULT_CAP, folder: Path | None = None) -> None:
        """Set the cap (tokens; 0 keeps no answers) and the persistence folder (None: memory only).
        Caches made before keep their files."""
        if cap < 0:
            raise EdgeSpecError(f"the earlier-answers cap must be >= 0 tokens, got {cap}")
        with self.lock:
            self.cap = cap
            self.folder = folder
            self.make_room()

    @staticmethod
    def default_folder() -> Path:
        """EDGESPEC_CACHE/answers (~/.cache/edgespec/answers)."""
        return firstrun.cache_dir() / "answers"

    def cache(self, target: Model, owner: str) -> AnswerCache | None:
        """The cache of `owner`'s answers to `target` (None when the cap is 0)."""
        if self.cap <= 0:
            return None
        mid = model_id(target)
        with self.lock:
            c = self._caches.get((mid, owner))
            if c is None:
                path = None
                if self.folder is not None:
                    name = hashlib.sha256(f"{mid}\0{owner}".encode()).hexdigest()[:24]
                    path = Path(self.folder) / f"{name}.jsonl"
                c = self._caches[mid, owner] = AnswerCache(self, mid, target.n_vocab, path)
                self.make_room()
            return c

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

    def make_room(self) -> None:
        """Evict the oldest answers of any owner until the store holds at most `cap` tokens."""
        with self.lock:
            total = self.tokens
            while total > self.cap:
                oldest = min((c for c in self._caches.values() if c.index.records),
                             key=lambda c: int(c.index.seqs[0]))
                before = oldest.tokens
                oldest.index = oldest.index.evicted()
                total -= before - oldest.tokens

    def clear(self) -> None:
        """Forget every answer in memory (files stay)."""
        with self.lock:
            self._caches.clear()


STORE = AnswerStore()  # this process's earlier answers (`serve` configures it from its options)


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
            return _estimate(None, _size_class(size)) * share
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
