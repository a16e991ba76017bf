"""The drafter's output vocabulary (FR-Spec): the target tokens the collected data shows most often."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgespec.apps.distill.collect import Record


def choose_subset(seqs: Sequence[Record], n_vocab: int, size: int, always: Sequence[int],
                  scores: np.ndarray | None = None) -> np.ndarray:
    """FR-Spec vocabulary: the most frequent target tokens (argmax and text), then tokens the data
    did not show, by the tokenizer's score (SentencePiece log-probability) when it has one, else by
    id (BPE merge order)."""
    counts = np.zeros(n_vocab, dtype=np.int64)
    for s in seqs:
        np.add.at(counts, s.argmax, 1)
        np.add.at(counts, s.tokens, 1)
    size = min(size, n_vocab)
    prior = np.arange(n_vocab, dtype=np.float64) if scores is None else -np.asarray(scores[:n_vocab], dtype=np.float64)
    order = np.lexsort((prior, -counts))  # by count desc, then score desc / id asc
    chosen = set(int(t) for t in always if 0 <= t < n_vocab)
    out = list(chosen)
    for t in order:
        if len(out) >= size:
            break
        if int(t) not in chosen:
            out.append(int(t))
    return np.asarray(sorted(out[:size]), dtype=np.int64)
