"""Can this draft model propose tokens for that target? The rule llama.cpp uses
(common/speculative.cpp): same vocabulary type, same BOS/EOS ids and add-BOS/add-EOS flags,
vocabulary sizes within 128 of each other, and identical token text for every id >= 5 that both
have. The first few ids are control tokens that families renumber freely, so they are skipped.
"""

from __future__ import annotations

from pathlib import Path

from edgespec.errors import EdgeSpecError
from edgespec.runtime import Model

MAX_VOCAB_SIZE_DIFFERENCE = 128
FIRST_CHECKED_TOKEN = 5


def check_compatible(target: Model, draft: Model) -> None:
    """Raise EdgeSpecError naming the first difference if `draft` cannot draft for `target`."""
    t, d = target.info, draft.info
    tn, dn = Path(t.path).name, Path(d.path).name
    if t.vocab_type != d.vocab_type:
        raise EdgeSpecError(f"draft {dn} and target {tn} use different tokenizer types ({d.vocab_type} vs {t.vocab_type})")
    for what, a, b in (("add-BOS", d.add_bos, t.add_bos), ("add-EOS", d.add_eos, t.add_eos),
                       ("BOS id", d.bos, t.bos), ("EOS id", d.eos, t.eos)):
        if a != b:
            raise EdgeSpecError(f"draft {dn} and target {tn} differ in {what}: {a} vs {b}")
    if abs(t.n_vocab - d.n_vocab) > MAX_VOCAB_SIZE_DIFFERENCE:
        raise EdgeSpecError(
            f"draft {dn} and target {tn} vocabularies differ in size by more than "
            f"{MAX_VOCAB_SIZE_DIFFERENCE}: {d.n_vocab} vs {t.n_vocab}"
        )
    for i in range(FIRST_CHECKED_TOKEN, min(t.n_vocab, d.n_vocab)):
        a, b = draft.token_text(i), target.token_text(i)
        if a != b:
            raise EdgeSpecError(f"draft and target vocabularies differ at token {i}: {a!r} vs {b!r}")


def size_warning(target: Model, draft: Model) -> str | None:
    """A one-line warning when the draft is not smaller than the target (speculation cannot pay)."""
    if draft.info.size_bytes >= target.info.size_bytes:
        return (
            f"the draft ({draft.info.size_bytes / 1e6:.0f} MB) is not smaller than the target "
            f"({target.info.size_bytes / 1e6:.0f} MB): drafting will likely cost more than it saves"
        )
    return None
