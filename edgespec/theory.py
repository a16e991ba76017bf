"""Formulas from "Fast Inference from Transformers via Speculative Decoding" (Leviathan, Kalman,
Matias 2023). Notation: alpha = expected acceptance rate, gamma = draft length, c = cost of one
draft step relative to one target step, t_ratio = T(gamma+1)/T(1), the cost of verifying gamma+1
rows in one target pass relative to decoding one token (1 in the paper's idealised model).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def expected_tokens(alpha: float, gamma: int) -> float:
    """E[tokens per target call] = (1 - alpha^(gamma+1)) / (1 - alpha)   (Eq. 1)."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def expected_tokens_chain(alphas: Sequence[float], gamma: int) -> float:
    """E[tokens per target call] when draft token j is accepted with probability alphas[j-1] given
    that tokens 1..j-1 were: 1 + sum_j prod_{i<=j} alphas[i-1] (Eq. 1 when every alphas[j] = alpha).
    For drafts whose later tokens are likelier to be right once the earlier ones were (a copy)."""
    total, p = 1.0, 1.0
    for a in alphas[:gamma]:
        p *= a
        total += p
    return total


def walltime_speedup(alpha: float, gamma: int, c: float, t_ratio: float = 1.0) -> float:
    """Expected speedup over plain decoding (Theorem 3.8, with the verification cost made explicit):
    (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + T(gamma+1)/T(1)))."""
    return expected_tokens(alpha, gamma) / (gamma * c + t_ratio)


def expected_operations(alpha: float, gamma: int, c_hat: float) -> float:
    """Factor by which total arithmetic grows (Theorem 3.11):
    (1 - alpha)(gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1)), c_hat = draft/target ops per token."""
    return (gamma * c_hat + gamma + 1) / expected_tokens(alpha, gamma)


def acceptance(p: np.ndarray, q: np.ndarray) -> float:
    """alpha for one position: sum_x min(p(x), q(x)) = 1 - D_LK(p, q)   (Corollary 3.6)."""
    return float(np.minimum(p, q).sum())


def d_lk(p: np.ndarray, q: np.ndarray) -> float:
    """D_LK(p, q) = sum_x |p(x) - M(x)| with M = (p+q)/2, i.e. half the L1 distance."""
    return float(0.5 * np.abs(np.asarray(p) - np.asarray(q)).sum())


def viable(alpha: float, c: float) -> bool:
    """Speculation can help (with gamma = 1) only when alpha > c   (Corollary 3.9)."""
    return alpha > c


def gamma1_speedup(alpha: float, c: float) -> float:
    """Speedup with a single draft token: (1 + alpha) / (1 + c)."""
    return (1.0 + alpha) / (1.0 + c)


def best_gamma(alpha: float, c: float, t_ratio: Callable[[int], float], gamma_max: int) -> tuple[int, float]:
    """The gamma in [0, gamma_max] with the highest predicted speedup, and that speedup.
    gamma = 0 (plain decoding) has speedup 1 by definition."""
    best, best_s = 0, 1.0
    for g in range(1, gamma_max + 1):
        s = walltime_speedup(alpha, g, c, t_ratio(g + 1))
        if s > best_s:
            best, best_s = g, s
    return best, best_s


def simulate_tokens_per_step(alpha: float, gamma: int, steps: int, rng: np.random.Generator) -> float:
    """Monte-Carlo check of Eq. 1: each draft is accepted independently with probability alpha until
    the first rejection; every step also yields one target token."""
    accepted = rng.random((steps, gamma)) < alpha
    first_reject = np.where(accepted.all(axis=1), gamma, np.argmin(accepted, axis=1))
    return float((first_reject + 1).mean())
