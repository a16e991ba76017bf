"""`python app.py distill`: learn a tiny drafter from the target itself and export it to ONNX.

  1. collect  the target reads a corpus (the long documents of the training prompts) and its own
              greedy answers to training prompts; every position gives (token, final hidden state,
              the target's argmax), with hidden states returned beside the logits by llama.cpp.
  2. subset   FR-Spec: the most frequent target tokens in that data (ties and the rest by token id,
              a proxy for BPE merge order) form the drafter's output vocabulary.
  3. train    numpy, Adam: an MLP maps (hidden state h_t, input embedding of x_{t+1}) to h_{t+1};
              loss = cross-entropy against the target's distribution over the subset (the target's
              own output rows applied to h_{t+1}) + a small feature-regression term. Half the
              inputs are the drafter's own predicted feature instead of h_t, as at draft depth >= 2.
  4. export   an ONNX graph built with the onnx package (input normalisation folded into the first
              layer), checked against the numpy model in ONNX Runtime, and a manifest; written to a
              temporary folder and renamed into place, so an interrupted run leaves nothing half-done.

Prompts used for evaluation are never trained on: by default the first `--holdout` prompts of each
category of each suite are excluded (the bench's `--per-category N` takes the first N), and the
manifest lists the question ids used.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from edgespec.apps import corpus
from edgespec.core import learned_format as fmt
from edgespec.core.drafters.onnx import open_session
from edgespec.models.gguf_tensors import TargetTensors, target_fingerprint
from edgespec.runtime.errors import EdgeSpecError, one_line

DEFAULT_SUITE = "spec_bench"


@dataclass
class DistillConfig:
    target: str
    out: str | None = None
    suites: list[str] = field(default_factory=lambda: [DEFAULT_SUITE])
    budget_minutes: float = 20.0
    holdout: int = 5  # first N prompts of each category are never used
    vocab: int = 16384
    hidden: int = 1024
    max_new_tokens: int = 96
    max_doc_tokens: int = 768
    collect_share: float = 0.45  # of the budget; training gets the rest minus export
    corpus: str | None = None  # offline text to read besides the suites ('python' or a path; edgespec.apps.corpus)
    corpus_share: float = 0.5  # of the collection time, for reading the corpus
    seed: int = 0
    n_ctx: int = 2048
    threads: int | None = None
    lr: float = 2e-3  # Adam's peak learning rate (no flag: 0 makes an untrained drafter, for tests)

    def __post_init__(self) -> None:
        if not self.budget_minutes > 0:
            raise EdgeSpecError(f"--budget-minutes must be > 0, got {self.budget_minutes}")
        if not math.isfinite(self.budget_minutes):
            raise EdgeSpecError(f"--budget-minutes must be a finite number of minutes, got {self.budget_minutes}")
        if self.max_new_tokens < 1:
            raise EdgeSpecError(f"--max-new-tokens must be >= 1 (the length of each self-generated answer), "
                                f"got {self.max_new_tokens}")
        if self.vocab < 16:
            raise EdgeSpecError(f"--vocab must be >= 16, got {self.vocab}")
        if self.hidden < 8:
            raise EdgeSpecError(f"--hidden must be >= 8, got {self.hidden}")
        if self.holdout < 0:
            raise EdgeSpecError(f"--holdout must be >= 0, got {self.holdout}")


@dataclass
class Record:
    """One text the target read during collection, position by position."""

    tokens: np.ndarray  # [L] int32
    hidden: np.ndarray  # [L, n_embd] float16: final hidden state at each position
    argmax: np.ndarray  # [L] int32: the target's greedy next token at each position
    kind: str  # 'corpus' (a suite's document) | 'offline' (--corpus) | 'generated' (the target's answer)
    qid: str
    seconds: float = 0.0  # what producing and reading it took


# ----------------------------------------------------------------------------- data
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
    # --corpus: offline text (edgespec.apps.corpus) read in its share of the collection time; the suite's
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


# ----------------------------------------------------------------------------- model
class MLP:
    """f_next = W2 silu(W1 z + b1) + b2 + A z, z = [(h - mu_h)/sd_h ; (e - mu_e)/sd_e]."""

    def __init__(self, n_embd: int, hidden: int, rng: np.random.Generator) -> None:
        d_in = 2 * n_embd
        self.p = {
            "W1": (rng.standard_normal((d_in, hidden)) / np.sqrt(d_in)).astype(np.float32),
            "b1": np.zeros(hidden, dtype=np.float32),
            "W2": (rng.standard_normal((hidden, n_embd)) * (0.5 / np.sqrt(hidden))).astype(np.float32),
            "b2": np.zeros(n_embd, dtype=np.float32),
            "A": np.zeros((d_in, n_embd), dtype=np.float32),
        }
        self.m = {k: np.zeros_like(v) for k, v in self.p.items()}
        self.v = {k: np.zeros_like(v) for k, v in self.p.items()}
        self.t = 0

    def forward(self, z: np.ndarray) -> tuple[np.ndarray, tuple]:
        p = self.p
        a = z @ p["W1"] + p["b1"]
        sig = 1.0 / (1.0 + np.exp(-a))
        s = a * sig
        f = s @ p["W2"] + p["b2"] + z @ p["A"]
        return f, (z, a, sig, s)

    def backward(self, df: np.ndarray, cache: tuple) -> dict[str, np.ndarray]:
        z, a, sig, s = cache
        p = self.p
        ds = df @ p["W2"].T
        da = ds * (sig * (1.0 + a * (1.0 - sig)))
        return {"W1": z.T @ da, "b1": da.sum(0), "W2": s.T @ df, "b2": df.sum(0), "A": z.T @ df}

    def adam(self, grads: dict[str, np.ndarray], lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
             wd: float = 1e-4) -> None:
        self.t += 1
        for k, g in grads.items():
            self.m[k] = b1 * self.m[k] + (1 - b1) * g
            self.v[k] = b2 * self.v[k] + (1 - b2) * g * g
            mh = self.m[k] / (1 - b1**self.t)
            vh = self.v[k] / (1 - b2**self.t)
            self.p[k] -= lr * (mh / (np.sqrt(vh) + eps) + (wd * self.p[k] if k[0] in "WA" else 0.0))


@dataclass
class Dataset:
    h: np.ndarray  # [N, n_embd] float32 hidden at i
    e_tok: np.ndarray  # [N] token x_{i+1}
    h_next: np.ndarray  # [N, n_embd] hidden at i+1 (the target)
    prev: np.ndarray  # [N] index of the example for position i-1 in the same sequence, or -1
    argmax_next: np.ndarray  # [N] the target's greedy token at i+1 (what a draft must hit)


def build_dataset(seqs: Sequence[Record]) -> Dataset:
    hs, toks, hn, prev, am = [], [], [], [], []
    base = 0
    for s in seqs:
        n = len(s.tokens) - 1  # examples i = 0..L-2
        if n <= 0:
            continue
        hs.append(s.hidden[:n])
        toks.append(s.tokens[1:])
        hn.append(s.hidden[1:])
        pv = np.arange(base - 1, base + n - 1)
        pv[0] = -1
        prev.append(pv)
        am.append(s.argmax[1:])
        base += n
    return Dataset(np.concatenate(hs).astype(np.float32), np.concatenate(toks), np.concatenate(hn).astype(np.float32),
                   np.concatenate(prev), np.concatenate(am))


class Trainer:
    def __init__(self, data: Dataset, emb_of: Callable[[np.ndarray], np.ndarray], head: np.ndarray,
                 hidden: int, seed: int) -> None:
        self.data = data
        self.emb_of = emb_of  # token ids -> input embeddings
        self.head = head  # [n_subset, n_embd] the target's output rows for the subset
        rng = np.random.default_rng(seed)
        self.rng = rng
        n_embd = head.shape[1]
        e_all = emb_of(data.e_tok[: min(len(data.e_tok), 20000)])
        self.mu_h, self.sd_h = data.h.mean(0), data.h.std(0) + 1e-4
        self.mu_e, self.sd_e = e_all.mean(0), e_all.std(0) + 1e-4
        self.var_h = float(data.h_next.var())
        self.mlp = MLP(n_embd, hidden, rng)
        self.feat_weight = 0.1
        self.steps = 0
        self.loss = float("nan")

    def z(self, h: np.ndarray, e: np.ndarray) -> np.ndarray:
        return np.concatenate([(h - self.mu_h) / self.sd_h, (e - self.mu_e) / self.sd_e], axis=1).astype(np.float32)

    def predict(self, h: np.ndarray, e: np.ndarray) -> np.ndarray:
        return self.mlp.forward(self.z(h, e))[0]

    def step(self, idx: np.ndarray, lr: float) -> float:
        d = self.data
        h = d.h[idx].copy()
        # Half the batch starts from the drafter's own prediction of h_i (as at draft depth >= 2).
        own = (self.rng.random(len(idx)) < 0.5) & (d.prev[idx] >= 0)
        if own.any():
            j = d.prev[idx[own]]
            h[own] = self.predict(d.h[j], self.emb_of(d.e_tok[j]))
        e = self.emb_of(d.e_tok[idx])
        f, cache = self.mlp.forward(self.z(h, e))
        target = d.h_next[idx]
        lg = f @ self.head.T
        tl = target @ self.head.T
        q = _softmax(lg)
        p = _softmax(tl)
        b = len(idx)
        ce = float(-(p * np.log(q + 1e-12)).sum(1).mean() + (p * np.log(p + 1e-12)).sum(1).mean())  # KL(p||q)
        diff = f - target
        mse = float((diff**2).mean() / self.var_h)
        dlg = (q - p) / b
        df = dlg @ self.head + self.feat_weight * 2.0 * diff / (diff.size * self.var_h)
        self.mlp.adam(self.mlp.backward(df.astype(np.float32), cache), lr)
        self.steps += 1
        self.loss = ce + self.feat_weight * mse
        return self.loss

    def accuracy(self, d: Dataset, subset: np.ndarray) -> float | None:
        """Share of examples of `d` where the drafter's argmax is the target's greedy token (depth 1)."""
        if len(d.h) == 0:
            return None
        hits = 0
        for s in range(0, len(d.h), 512):
            j = np.arange(s, min(s + 512, len(d.h)))
            f = self.predict(d.h[j], self.emb_of(d.e_tok[j]))
            hits += int((subset[np.argmax(f @ self.head.T, axis=1)] == d.argmax_next[j]).sum())
        return hits / len(d.h)

    def export_params(self) -> dict[str, np.ndarray]:
        """The MLP with input normalisation folded in: z = x * s + o, so x W = ..."""
        p = self.mlp.p
        scale = np.concatenate([1.0 / self.sd_h, 1.0 / self.sd_e]).astype(np.float32)
        offset = np.concatenate([-self.mu_h / self.sd_h, -self.mu_e / self.sd_e]).astype(np.float32)
        return {
            "W1": (p["W1"] * scale[:, None]).astype(np.float32),
            "b1": (p["b1"] + offset @ p["W1"]).astype(np.float32),
            "W2": p["W2"],
            "b2": (p["b2"] + offset @ p["A"]).astype(np.float32),
            "A": (p["A"] * scale[:, None]).astype(np.float32),
        }


def _softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=1, keepdims=True)
    return x


def chain_acceptance(trainer: Trainer, seqs: Sequence[Record], subset: np.ndarray, depth: int = 4,
                     max_starts: int = 400) -> list[float]:
    """On held-out generated text (the target's own greedy output), the share of draft positions
    1..depth accepted by greedy verification, drafting from the target's hidden state."""
    hits = np.zeros(depth)
    tried = np.zeros(depth)
    starts = 0
    for s in seqs:
        if s.kind != "generated":
            continue
        L = len(s.tokens)
        for i in range(max(0, L - 97), L - depth - 1, 3):  # positions in the generated part
            f = s.hidden[i : i + 1].astype(np.float32)
            tok = s.tokens[i + 1]
            for k in range(depth):
                f = trainer.predict(f, trainer.emb_of(np.array([tok])))
                d = subset[int(np.argmax(f @ trainer.head.T))]
                want = s.argmax[i + 1 + k]
                tried[k] += 1
                if d != want:
                    break
                hits[k] += 1
                tok = d
            starts += 1
            if starts >= max_starts:
                break
    return [round(float(hits[k] / tried[k]), 4) if tried[k] else None for k in range(depth)]


# ----------------------------------------------------------------------------- export
def build_onnx(params: dict[str, np.ndarray], head: np.ndarray):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    n_embd = head.shape[1]
    inits = [numpy_helper.from_array(np.ascontiguousarray(v), name=k) for k, v in params.items()]
    inits.append(numpy_helper.from_array(np.ascontiguousarray(head.T.astype(np.float32)), name="head_T"))
    nodes = [
        helper.make_node("Concat", list(fmt.INPUTS), ["z"], axis=1),
        helper.make_node("MatMul", ["z", "W1"], ["a0"]),
        helper.make_node("Add", ["a0", "b1"], ["a"]),
        helper.make_node("Sigmoid", ["a"], ["sig"]),
        helper.make_node("Mul", ["a", "sig"], ["s"]),
        helper.make_node("MatMul", ["s", "W2"], ["f0"]),
        helper.make_node("MatMul", ["z", "A"], ["skip"]),
        helper.make_node("Add", ["f0", "skip"], ["f1"]),
        helper.make_node("Add", ["f1", "b2"], [fmt.NEXT_FEATURE]),
        helper.make_node("MatMul", [fmt.NEXT_FEATURE, "head_T"], [fmt.LOGITS]),
    ]
    graph = helper.make_graph(
        nodes, "edgespec_learned_drafter",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", n_embd]) for name in fmt.INPUTS],
        [helper.make_tensor_value_info(fmt.NEXT_FEATURE, TensorProto.FLOAT, ["batch", n_embd]),
         helper.make_tensor_value_info(fmt.LOGITS, TensorProto.FLOAT, ["batch", head.shape[0]])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="edgespec-distill")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def quantize_weights(model, block_size: int = 32):
    """8-bit weight-only quantization of every MatMul (ONNX Runtime's MatMulNBits, symmetric blocks
    of 32, int8 compute): the drafter reads ~4x fewer bytes per token, which is its cost on a CPU.
    Measured on the Gemma drafter: 0.65 ms per pass instead of 2.6 ms, same argmax."""
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer
    from onnxruntime.quantization.quant_utils import QuantFormat

    # the quantizer's module turns on INFO logging for the whole process when imported (a line per
    # MatMul on stderr, under the progress bar); its own loggers only need to say warnings
    logging.getLogger("onnxruntime").setLevel(logging.WARNING)
    cfg = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=True, accuracy_level=4, bits=8,
                                       quant_format=QuantFormat.QOperator)
    q = MatMulNBitsQuantizer(model, algo_config=cfg)
    q.process()
    return q.model.model


def check_out(out: Path) -> Path:
    """The resolved output folder, checked before any work: a folder whose parent can be created and
    written (a probe folder is made and removed there), and that is new, empty or an older drafter,
    so that the export at the end of the budget cannot fail or replace someone else's files."""
    out = out.expanduser().resolve()
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise EdgeSpecError(f"--out {out} is an existing file, not a drafter folder; name a new folder")
        try:
            empty = not any(out.iterdir())
        except OSError as exc:
            raise EdgeSpecError(f"cannot read the folder --out {out} ({exc.strerror or one_line(exc)}); "
                                "choose another --out") from None
        if not empty and not (out / fmt.MANIFEST).is_file():
            raise EdgeSpecError(f"--out {out} is a folder with other files and no drafter ({fmt.MANIFEST}) in it; "
                                "name a new folder")
        if not empty and not fmt.is_drafter_folder(out):
            # a manifest.json of something else (a browser extension, a web app): not ours to replace
            raise EdgeSpecError(f"--out {out} is a folder with other files and its {fmt.MANIFEST} is not an EdgeSpec "
                                "learned drafter's; name a new folder")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EdgeSpecError(f"cannot create the folder {out.parent} for the drafter ({exc.strerror or one_line(exc)}); "
                            "choose another --out") from None
    try:
        Path(tempfile.mkdtemp(prefix=f".{out.name}.probe-", dir=out.parent)).rmdir()
    except OSError as exc:
        raise EdgeSpecError(f"cannot write the drafter to {out}: {out.parent} takes no new folders "
                            f"({exc.strerror or one_line(exc)}); choose another --out") from None
    return out


def export(out: Path, trainer: Trainer, subset: np.ndarray, manifest: fmt.Manifest,
           heldout: Dataset | None = None) -> Path:
    """Write drafter.onnx + manifest.json into a temporary sibling folder, check the graph against
    the numpy model in ONNX Runtime, then move it into place: a new folder is renamed into place; in
    an existing one (empty, or an older drafter) only those two files are replaced, so nothing else
    in it is deleted and the folder keeps its permissions."""
    import onnx

    out = check_out(out)
    tmp = _new_folder(out.parent, f".{out.name}.part-")
    try:
        model = build_onnx(trainer.export_params(), trainer.head)
        onnx.save(model, str(tmp / fmt.ONNX_FILE))
        manifest.write(tmp)
        sess = open_session(tmp / fmt.ONNX_FILE)
        d = trainer.data
        j = np.arange(min(8, len(d.h)))
        h, e = d.h[j], trainer.emb_of(d.e_tok[j])
        got_f, got_l = sess.run(fmt.OUTPUTS, dict(zip(fmt.INPUTS, (h, e), strict=True)))
        want_f = trainer.predict(h, e)
        err = float(np.abs(got_f - want_f).max() / (np.abs(want_f).max() + 1e-9))
        if err > 1e-3:
            raise EdgeSpecError(f"the exported ONNX graph disagrees with the trained model (relative error {err:.2e})")
        # 8-bit weights, kept only if they pick the same draft token as float32 on held-out data
        check = heldout if heldout is not None and len(heldout.h) else d
        k = np.arange(min(512, len(check.h)))
        h, e = check.h[k], trainer.emb_of(check.e_tok[k])
        feed = dict(zip(fmt.INPUTS, (h, e), strict=True))
        want = sess.run((fmt.LOGITS,), feed)[0].argmax(1)
        onnx.save(quantize_weights(model), str(tmp / "int8.onnx"))
        got = open_session(tmp / "int8.onnx").run((fmt.LOGITS,), feed)[0].argmax(1)
        agree = float((got == want).mean())
        manifest.weights = {"format": "int8 MatMulNBits, block 32" if agree >= 0.98 else "float32",
                            "int8_argmax_agreement": round(agree, 4)}
        if agree >= 0.98:
            (tmp / "int8.onnx").replace(tmp / fmt.ONNX_FILE)
        else:
            (tmp / "int8.onnx").unlink()
        manifest.write(tmp)
        if out.exists():
            for name in (fmt.ONNX_FILE, fmt.MANIFEST):  # the manifest last: it names the graph it goes with
                os.replace(tmp / name, out / name)
            tmp.rmdir()
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _new_folder(parent: Path, prefix: str) -> Path:
    """A new, uniquely named folder in `parent` with the permissions the umask gives (tempfile's
    mkdtemp makes 0700 folders, and this one becomes the user's drafter folder)."""
    path = parent / f"{prefix}{os.getpid()}-{secrets.token_hex(6)}"
    path.mkdir()
    return path


# ----------------------------------------------------------------------------- the command
def run(cfg: DistillConfig, log: Callable[[str], None] = print) -> Path:
    from tqdm import tqdm

    from edgespec.models.loader import RuntimeOptions, load_model
    from edgespec.service.session import Session

    t_start = time.monotonic()
    budget_s = cfg.budget_minutes * 60.0
    end = t_start + budget_s
    train_prompts, held_ids = split_prompts(cfg.suites, cfg.holdout)
    out = check_out(Path(cfg.out)) if cfg.out else None  # before anything is loaded or trained
    opts = RuntimeOptions(n_ctx=cfg.n_ctx, n_threads=cfg.threads)
    model = load_model(cfg.target, opts)
    session = Session(model, opts)
    tensors = TargetTensors(model.path)
    if tensors.n_embd != model.n_embd or tensors.n_vocab < model.n_vocab:
        raise EdgeSpecError(f"{Path(model.path).name}: GGUF embeddings ({tensors.n_vocab}x{tensors.n_embd}) do not match "
                            f"the model ({model.n_vocab}x{model.n_embd})")
    out = out or check_out(fmt.store_dir() / Path(model.path).stem)
    log(f"distilling a drafter for {Path(model.path).name} into {out} (budget {cfg.budget_minutes:g} min; "
        f"{len(train_prompts)} training prompts, {len(held_ids)} held out)")

    bar = tqdm(total=round(budget_s), unit="s", desc="collect", file=sys.stderr,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s [ETA {remaining}] {postfix}")

    def tick(info: str) -> None:
        bar.n = min(round(time.monotonic() - t_start), bar.total)
        bar.set_postfix_str(info, refresh=True)

    try:
        collect_end = t_start + cfg.collect_share * budget_s
        seqs = collect(model, session, train_prompts, cfg, collect_end,
                       lambda kind, n: tick(f"{n} tokens read ({kind})"))
        rng = np.random.default_rng(cfg.seed)
        # every 10th sequence (at least one once there are two) is held out for the manifest's figures
        held_at = set(range(9, len(seqs), 10)) or ({len(seqs) - 1} if len(seqs) >= 2 else set())
        held = [s for i, s in enumerate(seqs) if i in held_at]
        fit = [s for i, s in enumerate(seqs) if i not in held_at]
        eog = [t for t in range(model.n_vocab) if model.is_eog(t)][:8]
        subset = choose_subset(fit, model.n_vocab, cfg.vocab, eog, tensors.token_scores())
        head = tensors.output_rows(subset)
        data = build_dataset(fit)
        heldout = build_dataset(held) if held else None
        trainer = Trainer(data, tensors.cached_embeddings, head, cfg.hidden, cfg.seed)
        bar.set_description("train")
        export_reserve = min(30.0, 0.1 * budget_s)
        train_end = end - export_reserve
        t_train0 = time.monotonic()
        span = max(train_end - t_train0, 1.0)
        batch = 256
        while time.monotonic() < train_end:
            frac = (time.monotonic() - t_train0) / span
            lr = cfg.lr * min(1.0, (trainer.steps + 1) / 50) * 0.5 * (1 + np.cos(np.pi * min(frac, 1.0)))
            idx = rng.integers(0, len(data.h), batch)
            trainer.step(idx, max(lr, cfg.lr / 100))
            if trainer.steps % 10 == 0:
                tick(f"step {trainer.steps}, loss {trainer.loss:.3f}")
        if trainer.steps == 0:
            raise EdgeSpecError("the budget left no time to train; raise --budget-minutes")
        bar.set_description("export")
        tick("evaluating")
        top1 = trainer.accuracy(heldout, subset) if heldout is not None else None
        chain = chain_acceptance(trainer, held, subset)
        coverage = float(np.isin(heldout.argmax_next, subset).mean()) if heldout is not None else None
        manifest = fmt.Manifest(
            target_file=Path(model.path).name,
            target=target_fingerprint(model.path),  # what LearnedDrafter checks
            n_embd=model.n_embd,
            n_vocab=model.n_vocab,
            vocab_subset=[int(t) for t in subset],
            design={
                "kind": "mlp-feature-regression",
                "inputs": "target final hidden state (or own prediction) + input embedding of the next token",
                "hidden": cfg.hidden,
                "head": f"target output rows for {len(subset)} most frequent tokens (FR-Spec)",
                "parameters": int(sum(v.size for v in trainer.mlp.p.values())),
            },
            training={
                "suites": cfg.suites,
                "held_out_ids": held_ids,
                "corpus_ids": sorted({s.qid for s in fit if s.kind == "corpus"}),
                "generated_ids": sorted({s.qid for s in fit if s.kind == "generated"}),
                "offline_corpus": cfg.corpus,
                "collection": collection_rates(seqs),
                "tokens": int(sum(len(s.tokens) for s in fit)),
                "examples": int(len(data.h)),
                "steps": trainer.steps,
                "batch": batch,
                "final_loss": round(trainer.loss, 4),
                "seconds": round(time.monotonic() - t_start, 1),
            },
            heldout=fmt.Heldout(
                sequences=len(held),
                tokens=int(sum(len(s.tokens) for s in held)),
                top1_agreement=None if top1 is None else round(top1, 4),
                subset_coverage=None if coverage is None else round(coverage, 4),
                chain_acceptance=chain,
            ),
        )
        path = export(out, trainer, subset, manifest, heldout)
        bar.n = bar.total
        bar.close()
    except BaseException:
        bar.close()
        raise
    finally:
        session.close()
    log(f"wrote {path} ({summary(manifest)})")
    log(f"use it: python app.py --target {cfg.target} --draft learned:{path}   (or ngram+learned:{path})")
    return path


def summary(manifest: fmt.Manifest) -> str:
    """The run's figures in words; a figure the held-out data could not give is said so, not None."""
    tr, h = manifest.training, manifest.heldout
    parts = [f"{tr['tokens']} training tokens, {tr['steps']} steps, {tr['seconds']:.0f} s"]
    rates = [f"{kind} {row['tokens_per_s']} tok/s" for kind, row in sorted(tr.get("collection", {}).items())
             if row.get("tokens_per_s")]
    if rates:
        parts.append("collected at " + ", ".join(rates))
    if h.top1_agreement is None:
        parts.append("too little text to hold any out for evaluation (raise --budget-minutes)")
    else:
        parts.append(f"held-out top-1 agreement {100 * h.top1_agreement:.1f}%")
        if h.subset_coverage is not None:
            parts.append(f"the vocabulary subset covers {100 * h.subset_coverage:.1f}% of the target's tokens")
    depths = [f"{100 * a:.0f}%" for a in h.chain_acceptance if a is not None]
    if depths:
        parts.append(f"greedy acceptance at draft depth 1..{len(depths)}: {', '.join(depths)}")
    else:
        parts.append("no held-out generated answer to measure acceptance by draft depth")
    return "; ".join(parts)


def add_args(ap: argparse.ArgumentParser) -> None:
    """The command's flags; every default is DistillConfig's."""
    d = {f.name: f.default for f in fields(DistillConfig)}
    ap.add_argument("--target", required=True, help="target model: .gguf path or bundled name")
    ap.add_argument("--out", default=None, help="drafter folder (default: the drafter store, named after the target)")
    ap.add_argument("--suite", action="append", default=[], help=f"prompt suite (.jsonl or shipped name; repeatable; default {DEFAULT_SUITE})")
    ap.add_argument("--budget-minutes", type=float, default=d["budget_minutes"],
                    help=f"whole run, collection + training + export (default {d['budget_minutes']:g})")
    ap.add_argument("--holdout", type=int, default=d["holdout"],
                    help=f"first N prompts of each category are never trained on (default {d['holdout']})")
    ap.add_argument("--vocab", type=int, default=d["vocab"], help=f"output vocabulary subset size (FR-Spec; default {d['vocab']})")
    ap.add_argument("--hidden", type=int, default=d["hidden"], help=f"MLP width (default {d['hidden']})")
    ap.add_argument("--corpus", default=d["corpus"],
                    help="also read offline text: 'python' (the installed Python sources) or a file/folder; "
                         "reading is batched, so it can give more tokens per minute than generating")
    ap.add_argument("--max-new-tokens", type=int, default=d["max_new_tokens"],
                    help=f"length of each self-generated answer (default {d['max_new_tokens']})")
    ap.add_argument("--seed", type=int, default=d["seed"])
    ap.add_argument("--ctx", type=int, default=d["n_ctx"])
    ap.add_argument("--threads", type=int, default=d["threads"])
    ap.add_argument("--lr", type=float, default=d["lr"], help=argparse.SUPPRESS)  # tests: 0 = an untrained drafter


def main(argv: Sequence[str] | None = None) -> int:
    from edgespec.apps.args import Parser

    ap = Parser(prog="python app.py distill", description="learn a small ONNX drafter from a target model")
    add_args(ap)
    args = ap.parse_args(argv)
    return run_args(args)


def run_args(args: argparse.Namespace) -> int:
    from edgespec.runtime.errors import run_command

    def go() -> int:
        cfg = DistillConfig(target=args.target, out=args.out, suites=args.suite or [DEFAULT_SUITE],
                            budget_minutes=args.budget_minutes, holdout=args.holdout, corpus=args.corpus, vocab=args.vocab,
                            hidden=args.hidden, max_new_tokens=args.max_new_tokens, seed=args.seed,
                            n_ctx=args.ctx, threads=args.threads, lr=args.lr)
        try:
            run(cfg)
        except KeyboardInterrupt:
            print("\nno drafter was written", file=sys.stderr)
            raise
        return 0

    return run_command(go)


if __name__ == "__main__":
    sys.exit(main())
