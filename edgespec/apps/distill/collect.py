"""Collection: the target reads a corpus (the long documents of the training prompts, and offline
text with --corpus) and its own greedy answers to training prompts; every position gives (token,
final hidden state, the target's argmax), with hidden states returned beside the logits by
llama.cpp."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from edgespec.apps.distill import corpus
from edgespec.apps.distill.config import DistillConfig
from edgespec.runtime.errors import EdgeSpecError


@dataclass
class Record:
    """One text the target read during collection, position by position."""

    tokens: np.ndarray  # [L] int32
    hidden: np.ndarray  # [L, n_embd] float16: final hidden state at each position
    argmax: np.ndarray  # [L] int32: the target's greedy next token at each position
    kind: str  # 'corpus' (a suite's document) | 'offline' (--corpus) | 'generated' (the target's answer)
    qid: str
    seconds: float = 0.0  # what producing and reading it took



def split_prompts(suites: Sequence[str], holdout: int):
    """(training prompts, held-out prompt ids): the first `holdout` of each category are held out."""
    from edgespec.service.suites import load_suites

    prompts = load_suites(list(suites))
    seen: dict[str, int] = {}
    train, held = [], []
    for pr in prompts:
        seen[pr.category] = seen.get(pr.category, 0) + 1
        (held if seen[pr.category] <= holdout else train).append(pr)
    if not train:
        raise EdgeSpecError(f"no training prompts left after holding out {holdout} per category")
    return train, [pr.id for pr in held]


def read_with_hidden(model, tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """The target's hidden states [L, n_embd] and argmax [L] over `tokens` (fresh context)."""
    model.reset()
    hid, arg = [], []
    for start in range(0, len(tokens), model.n_batch):
        chunk = tokens[start : start + model.n_batch]
        logits = model.decode(chunk, n_logits=len(chunk), hidden=True)
        arg.append(np.argmax(logits, axis=1).astype(np.int32))
        hid.append(model.last_hidden.astype(np.float16))
    return np.concatenate(hid), np.concatenate(arg)


def collect(model, session, train, cfg: DistillConfig, deadline: float, tick: Callable[[str, int], None]) -> list[Record]:
    """Corpus reading and self-generation, alternating, until `deadline`."""
    from edgespec.core.sampling import SamplingParams
    from edgespec.service.session import Request

    rng = np.random.default_rng(cfg.seed)
    order = list(rng.permutation(len(train)))
    framing = "question"  # the session's: the chat template, else 'Question: ...\nAnswer:'
    seqs: list[Record] = []
    n_tok = 0
    docs = [i for i in order if len(train[i].text) > 1200]  # long documents: read as corpus
    asks = [i for i in order if len(train[i].text) <= 1200]  # questions: the target answers
    # --corpus: offline text (corpus.py) read in its share of the collection time; the suite's
    # documents and questions alternate in the rest.
    extra = corpus.stream(cfg.corpus, cfg.seed) if cfg.corpus else None
    began, reading = time.monotonic(), 0.0
    turn = 0
    while time.monotonic() < deadline and (docs or asks or extra is not None):
        t_item = time.monotonic()
        offline = False
        if extra is not None and (reading <= cfg.corpus_share * (t_item - began) or not (docs or asks)):
            item = next(extra, None)
            if item is None:
                extra = None
                continue
            qid, text = item
            toks = model.tokenize(text, add_special=True)
            start = int(rng.integers(0, len(toks) - cfg.max_doc_tokens + 1)) if len(toks) > cfg.max_doc_tokens else 0
            toks = toks[start : start + cfg.max_doc_tokens]  # a window: not always the licence header
            kind, offline = "offline", True
        elif docs and (turn % 3 == 0 or not asks):
            turn += 1
            pr = train[docs.pop()]
            qid = pr.id
            toks = model.tokenize(pr.text, add_special=True)[: cfg.max_doc_tokens]
            kind = "corpus"
        else:
            turn += 1
            pr = train[asks.pop()]
            qid = pr.id
            req = Request(text=pr.text, framing=framing, draft="ngram", max_tokens=cfg.max_new_tokens,
                          sampling=SamplingParams(0.0))
            from edgespec.service.session import frame

            prompt = frame(model, req).tokens
            if len(prompt) + cfg.max_new_tokens >= model.n_ctx:
                continue
            reply = session.run(req)
            toks = prompt + reply.tokens
            kind = "generated"
        if len(toks) < 4 or len(toks) >= model.n_ctx:
            continue
        hid, arg = read_with_hidden(model, toks)
        spent = time.monotonic() - t_item
        if offline:
            reading += spent
        seqs.append(Record(np.asarray(toks, dtype=np.int32), hid, arg, kind, qid, spent))
        n_tok += len(toks)
        tick(kind, n_tok)
    if not seqs:
        raise EdgeSpecError("the budget ran out before any training data was collected; raise --budget-minutes")
    return seqs


def collection_rates(seqs: Sequence[Record]) -> dict[str, dict]:
    """Tokens, seconds and tokens/s of the collected text by kind: what each source really gave."""
    out: dict[str, dict] = {}
    for s in seqs:
        row = out.setdefault(s.kind, {"texts": 0, "tokens": 0, "seconds": 0.0})
        row["texts"] += 1
        row["tokens"] += len(s.tokens)
        row["seconds"] += s.seconds
    for row in out.values():
        row["seconds"] = round(row["seconds"], 1)
        row["tokens_per_s"] = round(row["tokens"] / row["seconds"], 1) if row["seconds"] else None
    return out
