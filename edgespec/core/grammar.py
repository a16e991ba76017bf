"""The grammar state of one constrained generation (llguidance's matcher), kept in step with the
committed tokens the way the target's KV cache is.

Per step the engine asks it for three things (engine.py, `Engine.step`):
    n      = admitted(draft)          # how many drafts the grammar allows in a row: the rest is cut
    allowed = masks(draft[:n])        # [n+1, V] bool: row i = the tokens allowed after draft[:i]
    advance(accepted + [token])       # the committed tokens move the state on
so every verified row's distribution is the target's restricted to what the grammar allows after
the tokens before it (sampling.constrain), and the verifiers run on it unchanged: greedy output is
constrained plain decoding's, and rejection sampling reproduces the constrained distribution.
`forced()` is the continuation the grammar admits alone (a key, '": "', a closing brace), which the
grammar drafter proposes for free (drafters/grammar.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import llguidance
import numpy as np

from edgespec.runtime.errors import EdgeSpecError

_SPECIAL = b"\xff"  # how llguidance writes a special token in bytes (it is no text to tokenize)
GRAMMAR = "grammar"  # provenance of the tokens a grammar forces (Draft.sources, drafted_by, stats)


class Constraint:
    """An llguidance matcher for grammar `spec` (an llguidance grammar string) over a vocabulary
    (`tokenizer`, runtime.grammar.grammar_tokenizer), at the state after the committed tokens."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, spec: str) -> None:
        self.matcher = llguidance.LLMatcher(tokenizer, spec, log_level=0)
        self.tokenizer = tokenizer
        self.n_vocab = tokenizer.vocab_size
        self._words = (self.n_vocab + 31) // 32
        self.seconds = 0.0  # spent computing masks and forced tokens (Stats.grammar_s)
        self._check()

    def _check(self) -> None:
        if self.matcher.is_error():
            raise EdgeSpecError(f"the grammar cannot be used: {' '.join(self.matcher.get_error().split())}")

    @property
    def done(self) -> bool:
        """The grammar is complete and admits nothing more (but an end-of-generation token)."""
        return self.matcher.is_stopped()

    def admitted(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, in a row from the current state, the grammar allows."""
        return self.matcher.validate_tokens([int(t) for t in tokens]) if len(tokens) else 0

    def forced(self) -> list[int]:
        """The tokens the grammar forces from the current state (none where it admits a choice), then
        the rest of the text it forces in the model's own tokenization. llguidance stops its forced
        tokens where the forced text could still be split more than one way, e.g. before the ' "'
        that opens a string value after '": ' (' "' + 'tests' or ' "t' + 'ests'); that rest, cut into
        tokens as the tokenizer cuts it alone, is what the model writes nearly always, and where it
        is not, the verifier refuses it like any other draft token."""
        t0 = time.perf_counter()
        m = self.matcher
        out = m.compute_ff_tokens()  # none once the grammar is complete
        taken = sum(self._take(t) for t in out)  # the state after them (given back below)
        rest = m.compute_ff_bytes() if not m.is_stopped() else b""
        if rest and _SPECIAL not in rest:
            more = self.tokenizer.tokenize_bytes(rest)
            out = [*out, *more[: m.validate_tokens(more)]]
        if taken:
            m.rollback(taken)
        self.seconds += time.perf_counter() - t0
        return out

    def masks(self, draft: Sequence[int]) -> np.ndarray:
        """[k+1, V] bool for a draft of k admitted tokens: row i holds the tokens the grammar allows
        after draft[:i]. The state is the same on return."""
        t0 = time.perf_counter()
        m = self.matcher
        bits = np.empty((len(draft) + 1, self._words), dtype=np.int32)
        taken = 0
        for i in range(len(draft) + 1):
            m.unsafe_compute_mask_ptr(bits[i].ctypes.data, bits[i].nbytes)
            if i < len(draft):
                taken += self._take(int(draft[i]))
        if taken:
            m.rollback(taken)
        allowed = np.unpackbits(bits.view(np.uint8), axis=1, count=self.n_vocab, bitorder="little").view(bool)
        self.seconds += time.perf_counter() - t0
        return allowed

    def advance(self, tokens: Sequence[int]) -> int:
        """The generation committed `tokens` (each one allowed where it stands). Returns how many the
        state took: none after the grammar is complete (an end-of-generation token there)."""
        return sum(self._take(int(t)) for t in tokens)

    def _take(self, token: int) -> int:
        # llguidance does not always count a token given to a complete grammar, so a rollback by
        # the number given would undo one too many: such tokens are not given to it at all
        if self.matcher.is_stopped():
            return 0
        if not self.matcher.consume_token(token):
            self._check()
        return 1

    def rollback(self, n: int) -> None:
        """Undo the last `n` tokens the state took (`advance`'s count; a speculative state given back)."""
        if n:
            self.matcher.rollback(n)
