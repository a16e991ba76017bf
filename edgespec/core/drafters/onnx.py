"""A learned drafter on ONNX Runtime, distilled from its target (`python app.py distill`).

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

A drafter is a folder in the format `edgespec.core.learned_format` owns (drafter.onnx + manifest.json);
input embeddings are read from the target's GGUF at run time (`edgespec.models.gguf_tensors`). The
combined n-gram + learned drafter is `edgespec.core.drafters.combined`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from edgespec.core.drafters import LEARNED, Draft, DraftContext, Hint, register
from edgespec.core.learned_format import EMBEDDING, FEATURE, INPUTS, LOGITS, MANIFEST, NEXT_FEATURE, Manifest, resolve
from edgespec.core.sampling import DRAFT, Noise, SamplingParams, process, sample
from edgespec.models.gguf_tensors import TargetTensors
from edgespec.runtime import env
from edgespec.runtime.errors import EdgeSpecError, one_line

# Execution providers in order of preference: the first one ONNX Runtime offers here is used. CUDA
# only beside a target on a CUDA device (the drafter's tensors then stay on the GPU the target uses;
# beside a CPU target, a GPU round trip per drafted token costs more than the small head saves).
PROVIDERS = ("CUDAExecutionProvider", "DmlExecutionProvider", "CoreMLExecutionProvider", "QNNExecutionProvider",
             "CPUExecutionProvider")


# ----------------------------------------------------------------------------- ONNX Runtime
def pick_providers(available: Sequence[str], forced: str | None = None, device: str = "cpu") -> list[str]:
    """The execution providers to ask for, best first, for a target on `device` (EDGESPEC_ORT_PROVIDER
    forces one)."""
    if forced:
        if forced not in available:
            raise EdgeSpecError(f"ONNX Runtime has no {forced} here (it has: {', '.join(available)})")
        return [forced] if forced == "CPUExecutionProvider" else [forced, "CPUExecutionProvider"]
    cuda = device.upper().startswith("CUDA")
    chosen = [p for p in PROVIDERS if p in available and (cuda or p != "CUDAExecutionProvider")]
    return chosen or ["CPUExecutionProvider"]


def open_session(onnx_path: Path, threads: int = 1, device: str = "cpu"):
    """An ONNX Runtime session on the best provider here for a target on `device`; a corrupt file is
    a one-line error. Without a working CUDA driver ONNX Runtime falls back to the CPU silently:
    `session.get_providers()[0]` says which provider runs (the drafter's name shows it)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    # llama.cpp's threads run right after each draft: spinning ORT workers would steal their cores.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    providers = pick_providers(ort.get_available_providers(), env.text("EDGESPEC_ORT_PROVIDER"), device)
    if not onnx_path.is_file():
        raise EdgeSpecError(f"{onnx_path.parent.name} has no {onnx_path.name}")
    try:
        return ort.InferenceSession(str(onnx_path), opts, providers=providers)
    except Exception as exc:
        raise EdgeSpecError(f"ONNX Runtime cannot load {onnx_path}: {one_line(exc)}") from None


# ----------------------------------------------------------------------------- the drafter
class LearnedDrafter:
    needs_hidden = True

    def __init__(self, folder: str | os.PathLike, target) -> None:
        folder = Path(folder)
        self.folder = folder
        self.manifest = Manifest.read(folder)
        self.manifest.check_target(target.path, folder)
        if int(self.manifest.n_embd) != target.n_embd:
            raise EdgeSpecError(f"the learned drafter {folder.name} expects hidden size {self.manifest.n_embd}, "
                                f"the target has {target.n_embd}")
        self.session = open_session(folder / self.manifest.onnx, device=target.device)
        names = {i.name for i in self.session.get_inputs()}
        if names != set(INPUTS):
            raise EdgeSpecError(f"{folder / self.manifest.onnx} has inputs {sorted(names)}, not {' and '.join(INPUTS)}")
        self.provider = self.session.get_providers()[0]
        self.subset = np.asarray(self.manifest.vocab_subset, dtype=np.int64)
        self.n_vocab = target.n_vocab
        if self.subset.size == 0 or self.subset.max() >= self.n_vocab or self.subset.min() < 0:
            raise EdgeSpecError(f"{folder / MANIFEST}: vocab_subset has ids outside the target's vocabulary")
        self.tensors = TargetTensors(target.path)
        self.name = f"learned:{folder.name}@{self.provider.replace('ExecutionProvider', '')}"
        self.source = LEARNED
        self._sampling = SamplingParams()
        self._noise = Noise(None)
        self._feature: np.ndarray | None = None
        self._feature_len = -1  # context length the feature belongs to
        self._pending: np.ndarray | None = None
        self._cost_s: float | None = None
        # What gamma auto may hope for at best: the held-out greedy acceptance (best draft depth)
        # plus 0.1 for prompts easier than the held-out text; unknown -> no limit.
        best = self.manifest.heldout.best_acceptance()
        self.alpha_max = None if best is None else min(0.95, best + 0.1)

    def begin(self, prompt: Sequence[int], sampling: SamplingParams) -> None:
        self._sampling = sampling
        self._noise = Noise(sampling.seed)
        self._feature, self._feature_len, self._pending = None, -1, None

    def hint(self, context: Sequence[int]) -> Hint:
        if not self.ready(context):
            return Hint.nothing(self.source)
        return Hint(None, self.source, self.draft_cost_s(), self.alpha_max)

    def ready(self, context: Sequence[int]) -> bool:
        """Whether the drafter holds the target's hidden state for the end of `context`."""
        return self._feature is not None and self._feature_len == len(context)

    def step(self, feature: np.ndarray, token: int) -> tuple[np.ndarray, np.ndarray]:
        """One drafter pass: (next feature [1, n_embd], logits over the subset [n_subset])."""
        emb = self.tensors.embedding(int(token))[None, :]
        nxt, logits = self.session.run((NEXT_FEATURE, LOGITS), {FEATURE: feature, EMBEDDING: emb})
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


@register("learned", "a small drafter distilled from the target, on ONNX Runtime (--draft learned:FOLDER_OR_NAME; "
          "make one with: python app.py distill)", takes_model=True)
def _build(ctx: DraftContext) -> LearnedDrafter:
    return LearnedDrafter(resolve(ctx.arg), ctx.target)

