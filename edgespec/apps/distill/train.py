"""Training, in NumPy with Adam: an MLP maps (hidden state h_t, input embedding of x_{t+1}) to
h_{t+1}; loss = cross-entropy against the target's distribution over the subset (the target's own
output rows applied to h_{t+1}) + a small feature-regression term. Half the inputs are the
drafter's own predicted feature instead of h_t, as at draft depth >= 2."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from edgespec.apps.distill.collect import Record
from edgespec.runtime.errors import EdgeSpecError


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



BATCH = 256  # examples per training step


def fit(trainer: Trainer, lr: float, until: float, seed: int, tick: Callable[[str], None]) -> None:
    """Train until time.monotonic() reaches `until`: peak learning rate `lr` after a 50-step warm-up,
    cosine decay over the time there is, never below lr/100; tick(info) every 10 steps."""
    rng = np.random.default_rng(seed)
    t0 = time.monotonic()
    span = max(until - t0, 1.0)
    while time.monotonic() < until:
        frac = (time.monotonic() - t0) / span
        lr_now = lr * min(1.0, (trainer.steps + 1) / 50) * 0.5 * (1 + np.cos(np.pi * min(frac, 1.0)))
        idx = rng.integers(0, len(trainer.data.h), BATCH)
        trainer.step(idx, max(lr_now, lr / 100))
        if trainer.steps % 10 == 0:
            tick(f"step {trainer.steps}, loss {trainer.loss:.3f}")
    if trainer.steps == 0:
        raise EdgeSpecError("the budget left no time to train; raise --budget-minutes")
