"""Earlier answers and their n-gram index (the suffix drafter's memory, `suffix.py`): every record's
tokens in one array, and per match size the sorted hashes of the n-grams an answer token follows, so
the longest suffix of a context that occurs in earlier answers is found by bisection, and what its
occurrences went on with is read by `walk`. Immutable: adding or evicting makes a new index. No I/O."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgespec.core.drafters.ngram import ngram_sizes

SIZES = ngram_sizes(1, 32)  # match sizes looked up in earlier answers: 1, 2, 3, 4, 6, 8, ..., 24, 32
MAX_OCC = 256  # the most recent occurrences of a match that are scored
MIN_PATH = 0.2  # a candidate ends where fewer than this share of the occurrences still agree
SEP = -1  # ends each answer in the token array

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
