"""The reference that is not ours: llama-cpp-python's high-level `Llama`, plain and with its built-in
prompt lookup (`Llama(draft_model=LlamaPromptLookupDecoding(...))`), on the same prompt tokens.

What is timed matches the engine's `Stats.tokens_per_s`: decode time only. `Llama.generate`
evaluates the whole prompt before it yields the first token, so the clock starts when the first
token arrives and the rate is (generated - 1) tokens over the time to the last one (the engine's
rate counts n tokens over n decode steps; both are steps-per-second after prompt processing).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from edgespec.runtime import llama as runtime
from edgespec.runtime.errors import EdgeSpecError
from edgespec.runtime.llama import Model


@dataclass
class RefRun:
    tokens: list[int]
    decode_s: float  # seconds from the first generated token to the last one
    ttft_s: float

    @property
    def generated(self) -> int:
        return len(self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return max(self.generated - 1, 0) / max(self.decode_s, 1e-9)


class Reference:
    """One llama-cpp-python `Llama` context over the target file, with or without prompt lookup."""

    def __init__(
        self,
        target: Model,
        *,
        lookup: bool,
        n_ctx: int,
        n_threads: int | None,
        flash_attn: bool,
        num_pred_tokens: int = 10,
        max_ngram_size: int = 2,
    ) -> None:
        runtime.lib()  # import llama_cpp through the runtime so llama.cpp's log stays captured
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        draft = LlamaPromptLookupDecoding(max_ngram_size=max_ngram_size, num_pred_tokens=num_pred_tokens) if lookup else None
        kwargs = {"n_threads": n_threads, "n_threads_batch": n_threads} if n_threads else {}
        try:
            self.llm = Llama(
                model_path=str(target.path),
                n_ctx=n_ctx,
                n_batch=min(n_ctx, 2048),
                draft_model=draft,
                flash_attn=flash_attn,
                verbose=False,
                **kwargs,
            )
        except (ValueError, RuntimeError) as exc:
            raise EdgeSpecError(f"llama-cpp-python could not load {target.path}: {exc}") from None
        self.target = target
        self.lookup = lookup

    def generate(self, prompt: Sequence[int], max_tokens: int, temperature: float, seed: int | None) -> RefRun:
        """Generate up to `max_tokens` tokens after `prompt` (stops at end-of-generation)."""
        llm = self.llm
        if seed is not None:
            llm.set_seed(seed)
        tokens: list[int] = []
        t0 = time.perf_counter()
        t_first = t_last = t0
        # Same sampler settings as the engine's defaults: only temperature (0 = argmax).
        gen = llm.generate(
            list(prompt), temp=temperature, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True
        )
        for tok in gen:
            now = time.perf_counter()
            if self.target.is_eog(int(tok)):
                break
            if not tokens:
                t_first = now
            tokens.append(int(tok))
            t_last = now
            if len(tokens) >= max_tokens:
                break
        gen.close()
        return RefRun(tokens, t_last - t_first, t_first - t0)

    def close(self) -> None:
        self.llm.close()
