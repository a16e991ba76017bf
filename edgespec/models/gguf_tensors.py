"""A target's tensors read straight from its GGUF file: input embeddings and output rows
(dequantized on demand), the tokenizer's scores, and the fingerprint that ties a learned drafter
to the model it was distilled from. Used by the learned drafter at run time and by `distill`."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from edgespec.runtime.errors import EdgeSpecError

# What a fingerprint holds; a learned drafter is refused when any of these differ.
FINGERPRINT_KEYS = ("architecture", "n_vocab", "n_embd", "tokens_sha256", "weights_sha256")


class TargetTensors:
    """The target's token embeddings and output rows, read (dequantized on demand) from its GGUF."""

    def __init__(self, gguf_path: str | os.PathLike) -> None:
        import gguf

        self.path = str(gguf_path)
        try:
            reader = gguf.GGUFReader(self.path)
        except Exception as exc:
            raise EdgeSpecError(f"cannot read {Path(self.path).name} as GGUF: {exc}") from None
        tensors = {t.name: t for t in reader.tensors}
        if "token_embd.weight" not in tensors:
            raise EdgeSpecError(f"{Path(self.path).name} has no token_embd.weight tensor")
        self._reader = reader
        self._embd = tensors["token_embd.weight"]
        self._out = tensors.get("output.weight", self._embd)  # tied output layer when absent
        self.n_embd = int(self._embd.shape[0])
        self.n_vocab = int(self._embd.shape[1])
        self._cache: dict[int, np.ndarray] = {}

    def _rows(self, tensor, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        from gguf.quants import dequantize

        data = tensor.data[np.asarray(ids, dtype=np.int64)]
        return np.asarray(dequantize(data, tensor.tensor_type), dtype=np.float32).reshape(len(ids), self.n_embd)

    def embeddings(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Input embeddings [len(ids), n_embd] (as stored; the model's own input scaling is not applied)."""
        return self._rows(self._embd, ids)

    def embedding(self, token: int) -> np.ndarray:
        """One token's input embedding, dequantized once and kept (the drafter's per-step lookup)."""
        row = self._cache.get(token)
        if row is None:
            row = self._cache[token] = self.embeddings([token])[0]
        return row

    def cached_embeddings(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Input embeddings [len(ids), n_embd] through the same cache, missing rows dequantized in one
        call (the distiller's batches)."""
        missing = [int(t) for t in np.unique(np.asarray(ids)) if int(t) not in self._cache]
        if missing:
            self._cache.update(zip(missing, self.embeddings(missing), strict=True))
        return np.stack([self._cache[int(t)] for t in ids])

    def output_rows(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        return self._rows(self._out, ids)

    def token_scores(self) -> np.ndarray | None:
        """The tokenizer's per-token scores (SentencePiece log-probabilities: higher = more
        frequent), when the GGUF has them."""
        f = self._reader.fields.get("tokenizer.ggml.scores")
        if f is None or len(f.data) != self.n_vocab:
            return None
        return np.asarray([f.parts[i][0] for i in f.data], dtype=np.float32)

    def fingerprint(self) -> dict:
        """What identifies the target for a drafter (FINGERPRINT_KEYS): architecture, sizes, and
        hashes of the token list and of the embedding and output tensors (a drafter learned one
        model's features)."""
        fields = self._reader.fields
        arch = _field_str(fields.get("general.architecture"))
        tok = hashlib.sha256()
        tf = fields.get("tokenizer.ggml.tokens")
        if tf is not None:
            for i in tf.data:
                tok.update(bytes(tf.parts[i]))
                tok.update(b"\0")
        weights = hashlib.sha256()
        weights.update(memoryview(np.ascontiguousarray(self._embd.data)).cast("B"))
        if self._out is not self._embd:
            weights.update(memoryview(np.ascontiguousarray(self._out.data)).cast("B"))
        return dict(zip(FINGERPRINT_KEYS, (arch, self.n_vocab, self.n_embd, tok.hexdigest()[:16],
                                           weights.hexdigest()[:16]), strict=True))


def _field_str(field) -> str | None:
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8", "replace")


@lru_cache(maxsize=4)
def _fingerprint(path: str, mtime: float) -> dict:
    return TargetTensors(path).fingerprint()


def target_fingerprint(path: str | os.PathLike) -> dict:
    """The GGUF's fingerprint, computed once per file version (hashing the tensors takes a while)."""
    p = Path(path)
    return _fingerprint(str(p.resolve()), p.stat().st_mtime)
