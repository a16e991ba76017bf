"""Can this draft model propose tokens for that target? The rule llama.cpp uses
(common/speculative.cpp): same vocabulary type, same BOS/EOS ids and add-BOS/add-EOS flags,
vocabulary sizes within 128 of each other, and identical token text for every id >= 5 that both
have. The first few ids are control tokens that families renumber freely, so they are skipped.

This is the one definition of the rule: check_compatible applies it to loaded models, and
edgespec.models.inspect.pairing_from_metadata to GGUF headers, with the same messages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edgespec.runtime.errors import EdgeSpecError

if TYPE_CHECKING:
    from edgespec.runtime.llama import Model

MAX_VOCAB_SIZE_DIFFERENCE = 128
FIRST_CHECKED_TOKEN = 5
# llama_vocab_type (llama.h) -> (tokenizer.ggml.model that GGUF files use for it, llama.cpp's name for the algorithm).
VOCAB_TYPES = {0: ("none", "no vocabulary"), 1: ("llama", "SPM"), 2: ("gpt2", "BPE"), 3: ("bert", "WPM"),
               4: ("t5", "UGM"), 5: ("rwkv", "RWKV"), 6: ("plamo2", "PLaMo2")}
# llama.cpp (llama-vocab.cpp) reads "no_vocab" as type 0 too.
GGUF_TOKENIZER_TYPES = {gguf_name: vt for vt, (gguf_name, _) in VOCAB_TYPES.items()} | {"no_vocab": 0}
UNKNOWN_VOCAB_TYPE = -1  # a tokenizer.ggml.model that llama.cpp does not know (it refuses to load such a file)


def vocab_type_name(vocab_type: int | None) -> str:
    """A readable name for llama.cpp's vocab type, e.g. 2 -> 'gpt2 (BPE)'."""
    if vocab_type in VOCAB_TYPES:
        gguf_name, algorithm = VOCAB_TYPES[vocab_type]
        return f"{gguf_name} ({algorithm})"
    return "missing" if vocab_type is None else f"unknown ({vocab_type})"


def vocab_type_of(tokenizer_model: str | None) -> int | None:
    """llama.cpp's vocab type for a GGUF's tokenizer.ggml.model (None when the key is absent)."""
    if tokenizer_model is None:
        return None
    return GGUF_TOKENIZER_TYPES.get(tokenizer_model, UNKNOWN_VOCAB_TYPE)


@dataclass(frozen=True)
class VocabFacts:
    """What the rule compares apart from the token texts, from a loaded model or a GGUF header."""

    file: str  # file name, for messages
    vocab_type: int | None
    add_bos: bool
    add_eos: bool
    bos: int | None
    eos: int | None
    n_vocab: int


def header_difference(target: VocabFacts, draft: VocabFacts) -> str | None:
    """The first difference in tokenizer type, BOS/EOS or vocabulary size as a one-line reason, else None."""
    tn, dn = target.file, draft.file
    if target.vocab_type != draft.vocab_type:
        return (f"draft {dn} and target {tn} use different tokenizer types: "
                f"{vocab_type_name(draft.vocab_type)} vs {vocab_type_name(target.vocab_type)}")
    for what, a, b in (("add-BOS", draft.add_bos, target.add_bos), ("add-EOS", draft.add_eos, target.add_eos),
                       ("BOS id", draft.bos, target.bos), ("EOS id", draft.eos, target.eos)):
        if a != b:
            return f"draft {dn} and target {tn} differ in {what}: {a} vs {b}"
    if abs(target.n_vocab - draft.n_vocab) > MAX_VOCAB_SIZE_DIFFERENCE:
        return (f"draft {dn} and target {tn} vocabularies differ in size by more than "
                f"{MAX_VOCAB_SIZE_DIFFERENCE}: {draft.n_vocab} vs {target.n_vocab}")
    return None


def token_difference(target_text: Callable[[int], str], draft_text: Callable[[int], str],
                     n_target: int, n_draft: int) -> str | None:
    """The first id >= FIRST_CHECKED_TOKEN whose token text differs, as a one-line reason, else None."""
    for i in range(FIRST_CHECKED_TOKEN, min(n_target, n_draft)):
        a, b = draft_text(i), target_text(i)
        if a != b:
            return f"draft and target vocabularies differ at token {i}: {a!r} vs {b!r}"
    return None


def _facts(model: Model) -> VocabFacts:
    i = model.info
    return VocabFacts(Path(i.path).name, i.vocab_type, i.add_bos, i.add_eos, i.bos, i.eos, i.n_vocab)


def check_compatible(target: Model, draft: Model) -> None:
    """Raise EdgeSpecError naming the first difference if `draft` cannot draft for `target`."""
    why = header_difference(_facts(target), _facts(draft)) or token_difference(
        target.token_text, draft.token_text, target.n_vocab, draft.n_vocab)
    if why:
        raise EdgeSpecError(why)


def size_warning(target: Model, draft: Model) -> str | None:
    """A one-line warning when the draft is not smaller than the target (speculation cannot pay)."""
    if draft.info.size_bytes >= target.info.size_bytes:
        return (
            f"the draft ({draft.info.size_bytes / 1e6:.0f} MB) is not smaller than the target "
            f"({target.info.size_bytes / 1e6:.0f} MB): drafting will likely cost more than it saves"
        )
    return None
