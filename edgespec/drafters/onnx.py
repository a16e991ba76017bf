"""A learned drafter on ONNX Runtime, distilled from its target (`python app.py distill`), and the
combined drafter that uses n-gram lookup where the text repeats and the learned drafter elsewhere.

Design (EAGLE-style feature regression with a frozen FR-Spec head; README "Learned drafter"):

    f_next = MLP([norm(f); norm(e(x))])            f: the target's final hidden state at the position
    logits = f_next @ W_sub^T                         that produced x, or the drafter's own f_next
    d      = argmax / sample over the vocab subset    e(x): the target's input embedding of x
                                                      W_sub: the target's output rows for the subset

The target's own output layer (restricted to the most frequent tokens, FR-Spec) turns the predicted
feature into logits, so the drafter learns only where the target's hidden state goes next. The
target hands over its hidden state for free beside the verification logits (runtime.decode with
hidden=True); the drafter then chains its own predicted features for the rest of the draft. Its
state is the last hidden state the target gave it and the context length it belongs to, so it
stays in step with accepted tokens by construction (a step whose hidden state it did not see,
e.g. the first one, is a plain step).

A drafter is a folder: drafter.onnx (inputs feature, embedding [B, n_embd]; outputs next_feature
[B, n_embd], logits [B, n_subset]) and manifest.json (target fingerprint, vocab subset, training
data, held-out acceptance). Input embeddings are read from the target's GGUF at run time.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from edgespec.drafters import Draft, DraftContext, Hint, register
from edgespec.drafters.ngram import NgramDrafter
from edgespec.errors import EdgeSpecError, one_line
from edgespec.sampling import DRAFT, Noise, SamplingParams, process, sample

FORMAT = "edgespec-learned-drafter"
VERSION = 1
ONNX_FILE = "drafter.onnx"
MANIFEST = "manifest.json"
# Execution providers in order of preference: the first one ONNX Runtime offers here is used.
PROVIDERS = ("CUDAExecutionProvider", "DmlExecutionProvider", "CoreMLExecutionProvider", "QNNExecutionProvider",
             "CPUExecutionProvider")


def store_dir() -> Path:
    """Where `distill` puts drafters by default and where `--draft learned:NAME` finds them."""
    return Path(os.environ.get("EDGESPEC_DRAFTER_STORE") or Path.home() / ".cache" / "edgespec" / "drafters")


def resolve(spec: str) -> Path:
    """A drafter folder (or its drafter.onnx / manifest.json), or a name in the drafter store."""
    p = Path(spec).expanduser()
    if p.is_file() and p.name in (ONNX_FILE, MANIFEST):
        p = p.parent
    if p.is_dir():
        return p
    named = store_dir() / spec
    if "/" not in spec and named.is_dir():
        return named
    known = sorted(d.name for d in store_dir().glob("*") if (d / MANIFEST).is_file()) if store_dir().is_dir() else []
    hint = f" (drafters in {store_dir()}: {', '.join(known)})" if known else " (make one with: python app.py distill)"
    raise EdgeSpecError(f"no learned drafter at {spec!r}{hint}")


# ----------------------------------------------------------------------------- the target's GGUF
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
        """What identifies the target for a drafter: architecture, sizes, and hashes of the token
        list and of the embedding and output tensors (a drafter learned one model's features)."""
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
        return {
            "architecture": arch,
            "n_vocab": self.n_vocab,
            "n_embd": self.n_embd,
            "tokens_sha256": tok.hexdigest()[:16],
            "weights_sha256": weights.hexdigest()[:16],
        }


def _field_str(field) -> str | None:
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8", "replace")


@lru_cache(maxsize=4)
def _fingerprint(path: str, mtime: float) -> dict:
    return TargetTensors(path).fingerprint()


def target_fingerprint(path: str | os.PathLike) -> dict:
    p = Path(path)
    return _fingerprint(str(p.resolve()), p.stat().st_mtime)


# ----------------------------------------------------------------------------- manifest
def read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    if not path.is_file():
        raise EdgeSpecError(f"{folder} has no {MANIFEST}: not a learned drafter (make one with: python app.py distill)")
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise EdgeSpecError(f"{path} is not readable JSON: {exc}") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise EdgeSpecError(f"{path} is not an EdgeSpec learned-drafter manifest")
    if m.get("version") != VERSION:
        raise EdgeSpecError(f"{path} has format version {m.get('version')}; this EdgeSpec reads version {VERSION}")
    for key in ("target", "vocab_subset", "n_embd"):
        if key not in m:
            raise EdgeSpecError(f"{path} lacks {key!r}")
    return m


def check_target(manifest: dict, target_path: str, folder: Path) -> None:
    """One line naming the first mismatch between the drafter's target and this one."""
    want = manifest["target"]
    have = target_fingerprint(target_path)
    for key in ("architecture", "n_vocab", "n_embd", "tokens_sha256", "weights_sha256"):
        if want.get(key) != have.get(key):
            made_for = manifest.get("target_file", "another model")
            raise EdgeSpecError(
                f"the learned drafter {folder.name} was made for {made_for}, not {Path(target_path).name}: "
                f"{key} is {want.get(key)} there and {have.get(key)} here"
            )


def pick_providers(available: Sequence[str], forced: str | None = None) -> list[str]:
    """The execution providers to ask for, best first (EDGESPEC_ORT_PROVIDER forces one)."""
    if forced:
        if forced not in available:
            raise EdgeSpecError(f"ONNX Runtime has no {forced} here (it has: {', '.join(available)})")
        return [forced] if forced == "CPUExecutionProvider" else [forced, "CPUExecutionProvider"]
    chosen = [p for p in PROVIDERS if p in available]
    return chosen or ["CPUExecutionProvider"]


def open_session(onnx_path: Path, threads: int = 1):
    """An ONNX Runtime session on the best provider here; a corrupt file is a one-line error."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    # llama.cpp's threads run right after each draft: spinning ORT workers would steal their cores.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    providers = pick_providers(ort.get_available_providers(), os.environ.get("EDGESPEC_ORT_PROVIDER") or None)
    if not onnx_path.is_file():
        raise EdgeSpecError(f"{onnx_path.parent.name} has no {onnx_path.name}")
    try:
        return ort.InferenceSession(str(onnx_path), opts, providers=providers)
    except Exception as exc:
        raise EdgeSpecError(f"ONNX Runtime cannot load {onnx_path}: {one_line(exc)}") from None


# ----------------------------------------------------------------------------- drafters
class LearnedDrafter:
    needs_hidden = True

    def __init__(self, folder: str | os.PathLike, target) -> None:
        folder = Path(folder)
        self.folder = folder
        self.manifest = read_manifest(folder)
        check_target(self.manifest, target.path, folder)
        if int(self.manifest["n_embd"]) != target.n_embd:
            raise EdgeSpecError(f"the learned drafter {folder.name} expects hidden size {self.manifest['n_embd']}, "
                                f"the target has {target.n_embd}")
        self.session = open_session(folder / self.manifest.get("onnx", ONNX_FILE))
        names = {i.name for i in self.session.get_inputs()}
        if names != {"feature", "embedding"}:
            raise EdgeSpecError(f"{folder / ONNX_FILE} has inputs {sorted(names)}, not feature and embedding")
        self.provider = self.session.get_providers()[0]
        self.subset = np.asarray(self.manifest["vocab_subset"], dtype=np.int64)
        self.n_vocab = target.n_vocab
        if self.subset.size == 0 or self.subset.max() >= self.n_vocab or self.subset.min() < 0:
            raise EdgeSpecError(f"{folder / MANIFEST}: vocab_subset has ids outside the target's vocabulary")
        self.tensors = TargetTensors(target.path)
        self.name = f"learned:{folder.name}@{self.provider.replace('ExecutionProvider', '')}"
        self.source = "learned"
        self._sampling = SamplingParams()
        self._noise = Noise(None)
        self._feature: np.ndarray | None = None
        self._feature_len = -1  # context length the feature belongs to
        self._pending: np.ndarray | None = None
        self._cost_s: float | None = None
        # What gamma auto may hope for at best: the held-out greedy acceptance (best draft depth)
        # plus 0.1 for prompts easier than the held-out text; unknown -> no limit.
        chain = [a for a in (self.manifest.get("heldout") or {}).get("chain_acceptance") or [] if a is not None]
        self.alpha_max = min(0.95, max(chain) + 0.1) if chain else None

    def begin(self, prompt: Sequence[int], sampling: SamplingParams) -> None:
        self._sampling = sampling
        self._noise = Noise(sampling.seed)
        self._feature, self._feature_len, self._pending = None, -1, None

    def hint(self, context: Sequence[int]) -> Hint:
        if not self.ready(context):
            return Hint(0, self.source)
        return Hint(None, self.source, self.draft_cost_s(), self.alpha_max)

    def ready(self, context: Sequence[int]) -> bool:
        """Whether the drafter holds the target's hidden state for the end of `context`."""
        return self._feature is not None and self._feature_len == len(context)

    def step(self, feature: np.ndarray, token: int) -> tuple[np.ndarray, np.ndarray]:
        """One drafter pass: (next feature [1, n_embd], logits over the subset [n_subset])."""
        emb = self.tensors.embedding(int(token))[None, :]
        nxt, logits = self.session.run(("next_feature", "logits"), {"feature": feature, "embedding": emb})
        return nxt, logits[0]

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        if gamma <= 0 or not self.ready(context):
            return Draft(source=self.source)
        feature, token = self._feature, int(context[-1])
        greedy = self._sampling.greedy
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        for i in range(gamma):
            feature, logits = self.step(feature, token)
            if greedy:
                token = int(self.subset[int(np.argmax(logits))])
            else:
                full = np.full(self.n_vocab, -np.inf, dtype=np.float32)
                full[self.subset] = logits
                q = process(full, self._sampling)
                token = sample(q, self._noise.uniform(len(context) + i, DRAFT))
                probs.append(q)
            tokens.append(token)
        return Draft(np.asarray(tokens, dtype=np.int32), None if greedy else np.stack(probs), self.source)

    def observe_hidden(self, hidden: np.ndarray) -> None:
        self._pending = np.asarray(hidden, dtype=np.float32).reshape(1, -1)

    def commit(self, context: Sequence[int], n_accepted: int) -> None:
        self._feature, self._pending = self._pending, None
        self._feature_len = len(context) if self._feature is not None else -1

    def draft_cost_s(self) -> float:
        """Median seconds of one drafter pass (embedding lookup + ONNX Runtime run + argmax)."""
        if self._cost_s is None:
            f = np.zeros((1, self.tensors.n_embd), dtype=np.float32)
            times = []
            for i in range(12):
                t0 = time.perf_counter()
                _, logits = self.step(f, int(self.subset[i % len(self.subset)]))
                int(np.argmax(logits))
                times.append(time.perf_counter() - t0)
            self._cost_s = float(np.median(times[2:]))
        return self._cost_s

    def close(self) -> None:
        self._feature = self._pending = None


class CombinedDrafter:
    """n-gram lookup where the context has a long recurring match (copying text), the learned drafter
    elsewhere. Each step names its source in a Hint, so gamma auto keeps alpha and c per source."""

    needs_hidden = True

    def __init__(self, ngram: NgramDrafter, learned: LearnedDrafter, long_match: int = 3) -> None:
        self.ngram = ngram
        self.learned = learned
        self.long_match = long_match
        self.name = f"ngram+{learned.name}"

    def begin(self, prompt: Sequence[int], sampling: SamplingParams) -> None:
        self.ngram.begin(prompt, sampling)
        self.learned.begin(prompt, sampling)

    def _source(self, context: Sequence[int]) -> tuple[str, int]:
        n = self.ngram.hint(context)
        if n >= self.long_match or (n > 0 and not self.learned.ready(context)):
            return "ngram", n
        return ("learned", -1) if self.learned.ready(context) else ("none", 0)

    def hint(self, context: Sequence[int]) -> Hint:
        src, n = self._source(context)
        if src == "ngram":
            return Hint(n, "ngram", 0.0)
        if src == "learned":
            return self.learned.hint(context)
        return Hint(0, "none")

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        src, _ = self._source(context)
        if src == "ngram":
            d = self.ngram.propose(context, gamma)
            return Draft(d.tokens, d.probs, "ngram")
        if src == "learned":
            return self.learned.propose(context, gamma)
        return Draft()

    def observe_hidden(self, hidden: np.ndarray) -> None:
        self.learned.observe_hidden(hidden)

    def commit(self, context: Sequence[int], n_accepted: int) -> None:
        self.ngram.commit(context, n_accepted)
        self.learned.commit(context, n_accepted)

    def draft_cost_s(self) -> float:
        return self.learned.draft_cost_s()

    def close(self) -> None:
        self.ngram.close()
        self.learned.close()


@register("learned", "a small drafter distilled from the target, on ONNX Runtime (--draft learned:FOLDER_OR_NAME; "
          "make one with: python app.py distill)", takes_model=True)
def _build(ctx: DraftContext) -> LearnedDrafter:
    return LearnedDrafter(resolve(ctx.arg), ctx.target)


@register("ngram+learned", "n-gram lookup on long matches, the learned drafter elsewhere (--draft ngram+learned:FOLDER_OR_NAME)",
          takes_model=True)
def _build_combined(ctx: DraftContext) -> CombinedDrafter:
    return CombinedDrafter(NgramDrafter(*ctx.ngram), LearnedDrafter(resolve(ctx.arg), ctx.target))
