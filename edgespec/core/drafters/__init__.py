"""Drafters propose tokens for the target to verify: one protocol, one file per way of drafting,
and a registry that maps a name to a drafter, so a new drafter is one file plus one line in
`DRAFTER_MODULES` (or, for a plug-in outside this package, a module named in EDGESPEC_DRAFTERS).

A drafter sees only committed tokens (prompt + accepted output), so rejected guesses never leak
into its state; `commit` tells it after every step what is committed now, and a stateful drafter
(a draft model with its own KV cache) rolls itself back to that.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from edgespec.core.sampling import SamplingParams
from edgespec.runtime import env
from edgespec.runtime.errors import EdgeSpecError

if TYPE_CHECKING:
    from edgespec.models.loader import RuntimeOptions
    from edgespec.runtime.llama import Model

NGRAM_SIZES = (1, 16)  # the n-gram drafter's default (smallest, largest) match size: --ngram 1,16

# The drafters that ship with EdgeSpec; each module registers itself with `register` on import.
DRAFTER_MODULES = ("edgespec.core.drafters.ngram", "edgespec.core.drafters.model", "edgespec.core.drafters.onnx",
                   "edgespec.core.drafters.combined", "edgespec.core.drafters.suffix")

# The source a learned drafter names on its drafts and hints (Draft.source, Hint.source): token
# provenance shows it, so a combined run's two sources can be told apart.
LEARNED = "learned"


@dataclass
class Draft:
    """Proposed continuation.

    tokens: [k] token ids.
    probs: [k, V] processed draft distributions q_i the tokens were sampled from, or None when the
    drafter is deterministic (q_i is one-hot at tokens[i]; n-gram lookup, greedy drafting). After
    `cut`, a row k: the distribution of the refused token that followed (the verifier resamples from
    its residual, sampling.verify_stochastic).
    source: which drafter proposed it, for token provenance ('' = the drafter's name).
    sources: per token, when the draft mixes sources (a grammar's forced tokens around another
    drafter's, drafters/grammar.py); empty: every token is `source`'s.
    """

    tokens: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int32))
    probs: np.ndarray | None = None
    source: str = ""
    sources: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.tokens)

    def head(self, k: int) -> Draft:
        """The first k proposed tokens (the rest not verified, so the token after them is the target's own)."""
        return Draft(self.tokens[:k], None if self.probs is None else self.probs[:k], self.source, self.sources[:k])

    def cut(self, k: int) -> Draft:
        """The first k proposed tokens where the (k+1)-th was refused (a grammar forbids it): as
        `head`, but a sampled draft keeps that token's distribution as probs' row k, since the token
        after an accepted prefix is then the rejection's residual (verify_stochastic)."""
        if k >= len(self):
            return self
        probs = None if self.probs is None else self.probs[: k + 1]
        return Draft(self.tokens[:k], probs, self.source, self.sources[:k])

    def provenance(self, default: str) -> list[str]:
        """Who proposed each token (`default`: the drafter's name, for tokens that name none)."""
        if self.sources:
            return [s or default for s in self.sources]
        return [self.source or default] * len(self)


@dataclass(frozen=True)
class Hint:
    """What a drafter knows cheaply before drafting (`Drafter.hint`), for gamma auto to keep
    acceptance per context. Every drafter returns one; what differs between drafters is said here.

    size: 0 = nothing to propose (`Hint.nothing`); a positive size class (for a copying drafter,
    the length of the n-gram its proposal continues); None = cannot tell.
    source: which source will propose, for a drafter that combines several ('' = the drafter);
    gamma auto keeps acceptance per source.
    draft_cost_s: that source's seconds per draft token (the cost model turns it into c); None =
    the drafter's own cost, as the cost model has it.
    catch_up_s: seconds the next proposal costs beyond draft_cost_s per token: a draft model first
    decodes the committed tokens its cache lacks (the target's correction or bonus token, and every
    token of the plain steps since it last drafted) in the pass that drafts its first token, and a
    pass over more rows costs more than one over one row. 0 for a drafter with no such work.
    alpha_max: the best acceptance this source can be expected to reach (a learned drafter's
    held-out figure): gamma auto does not probe where even that would not pay on this machine.
    copies: the proposal copies on from a matched span of the context (n-gram lookup), so draft
    token j continues a match of size + j - 1 and acceptance is read per size along the draft.
    certain: the proposal starts with this many tokens that are certain (acceptance 1) and free (no
    drafting cost: tokens a grammar forces, drafters/grammar.py); size, confidence and the rest
    describe the proposal after them.
    confidence: the drafter's own estimate, per draft position j (0-based), that token j is accepted
    once the tokens before it were (a frequency-scored candidate: how often the matched text went on
    this way, calibrated by the drafter's record); the proposal has len(confidence) tokens. Gamma auto
    plans with it as given. Empty: the drafter has no such estimate.
    """

    size: int | None = None
    source: str = ""
    draft_cost_s: float | None = None
    alpha_max: float | None = None
    copies: bool = False
    confidence: tuple[float, ...] = ()
    catch_up_s: float = 0.0
    certain: int = 0

    @classmethod
    def nothing(cls, source: str = "") -> Hint:
        """The drafter has nothing to propose at this context (gamma 0 without planning)."""
        return cls(0, source)


class Drafter(Protocol):
    """What the engine calls, in this order: begin once per generation; then per step hint (before
    gamma is chosen), propose (when gamma > 0) and commit (after verification); close at the end of
    the drafter's life."""

    name: str  # shown in stats and token provenance ('ngram', 'model:<description>', ...)
    # True for drafters fed the target's hidden states (learned heads): the engine then asks the
    # target for the final hidden state of each verified row and calls `observe_hidden` with the
    # one that produced the newest committed token, before `commit`.
    needs_hidden: bool

    def begin(self, prompt: Sequence[int], sampling: SamplingParams) -> None:
        """A new generation starts from `prompt`, sampled with `sampling` (drafters that sample
        must use the same settings so that q is processed like p)."""

    def hint(self, context: Sequence[int]) -> Hint:
        """What the drafter knows cheaply about its next proposal, for gamma auto to keep
        acceptance per context: `Hint()` when it cannot tell, `Hint.nothing()` when it has nothing
        to propose, else a size class, the source that will propose, its cost (see `Hint`)."""

    def observe_hidden(self, hidden: np.ndarray) -> None:
        """Only if needs_hidden: the target's final hidden state [n_embd] at the position that
        produced the newest committed token."""

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        """Propose up to `gamma` tokens to follow `context` (prompt + committed output, and maybe
        tokens proposed ahead of this drafter's in the same draft: a grammar's forced tokens,
        drafters/grammar.py; `hint` was asked about the same context)."""

    def commit(self, context: Sequence[int], n_accepted: int) -> None:
        """The target accepted `n_accepted` tokens of the last proposal; `context` is everything
        committed now. Drop state that depended on rejected tokens."""

    def draft_cost_s(self) -> float:
        """Seconds to draft one token on this machine (0 for a lookup), for the cost model's c."""

    def close(self) -> None:
        """The drafter's life ends (a drafter built per request: its generation is over). Release
        resources (models, contexts, sessions); a drafter that learns from earlier answers keeps
        this generation's answer."""


@dataclass(frozen=True)
class DraftContext:
    """What building a drafter may use: the target it drafts for, how models are loaded, and the
    argument after the drafter's name (`--draft NAME:ARG`), and whose request it drafts for: a
    drafter that learns from earlier answers keeps them per owner ('' = this machine's user; the
    server: a digest of the client's API key), so one user's answers never draft for another."""

    target: Model
    opts: RuntimeOptions
    arg: str = ""
    ngram: tuple[int, int] = NGRAM_SIZES
    owner: str = ""


@dataclass(frozen=True)
class DrafterKind:
    name: str
    summary: str
    build: Callable[[DraftContext], Drafter]
    takes_model: bool = False  # ARG names a model file (draft model, learned drafter)
    takes_arg: bool = False  # ARG means something else to it (a plug-in's); neither: `NAME:ARG` is refused
    options: str = ""  # the command-line options that configure it instead, for that refusal


_REGISTRY: dict[str, DrafterKind] = {}


def register(name: str, summary: str, takes_model: bool = False, takes_arg: bool = False,
             options: str = "") -> Callable:
    """Decorator for a function DraftContext -> Drafter: makes `--draft NAME` build it, and `--draft
    NAME:ARG` where it takes a model or an argument (DrafterKind)."""

    def deco(build: Callable[[DraftContext], Drafter]) -> Callable[[DraftContext], Drafter]:
        _REGISTRY[name] = DrafterKind(name, summary, build, takes_model, takes_arg, options)
        return build

    return deco


def kinds() -> dict[str, DrafterKind]:
    """Every registered drafter kind (built-in modules and EDGESPEC_DRAFTERS plug-ins), by name."""
    extra = [m for m in (env.text("EDGESPEC_DRAFTERS") or "").split(",") if m.strip()]
    for mod in (*DRAFTER_MODULES, *extra):
        try:
            importlib.import_module(mod.strip())
        except ImportError as exc:
            raise EdgeSpecError(f"cannot load drafter module {mod.strip()!r}: {exc}") from None
    return dict(_REGISTRY)


def split_spec(spec: str) -> tuple[str, str]:
    """'none' | 'NAME' | 'NAME:ARG' | a learned drafter's folder (short for 'learned:PATH') | a model
    name or path (short for 'model:PATH') -> (kind, arg)."""
    spec = (spec or "none").strip()
    known = kinds()
    name, sep, arg = spec.partition(":")
    if spec == "none":
        return "none", ""
    if name in known:
        kind = known[name]
        if sep and not (kind.takes_model or kind.takes_arg):  # never an argument silently ignored
            how = f"; {kind.options} configures it" if kind.options else ""
            raise EdgeSpecError(f"drafter {spec!r}: {name} takes no argument; write just {name}{how}")
        return name, arg.strip()
    path = Path(spec).expanduser()
    try:
        is_dir = path.is_dir()
        exists = is_dir or path.exists()
    except OSError:  # a name no file can have (too long): the model resolver says so in one line
        is_dir = exists = False
    if not exists and name.lower() in known:
        raise EdgeSpecError(f"unknown drafter {name!r}: drafter names are lower case; did you mean "
                            f"{name.lower()}{sep}{arg}?")
    if is_dir or path.suffix == ".onnx" or path.name == "manifest.json":
        # a learned drafter's folder (or its drafter.onnx / manifest.json): a model is one file, so
        # any folder is taken as a drafter's, and one without a manifest is told what it lacks
        return "learned", spec
    return "model", spec  # a .gguf path, a bundled/catalog name or hf:ORG/REPO


def spec_names() -> str:
    """Every way to name a drafter, for messages: 'none, ngram, model:..., learned:...'."""
    return ", ".join(["none", *(f"{k.name}:..." if k.takes_model else f"{k.name}[:ARG]" if k.takes_arg else k.name
                              for k in kinds().values())])


def build(spec: str, ctx_target: Model, opts: RuntimeOptions, ngram: tuple[int, int] = NGRAM_SIZES,
          owner: str = "") -> Drafter | None:
    """The drafter `spec` names, built for `ctx_target` and a request of `owner` (DraftContext);
    None for 'none' (plain decoding)."""
    kind, arg = split_spec(spec)
    if kind == "none":
        return None
    k = kinds()[kind]
    if k.takes_model and not arg:
        raise EdgeSpecError(f"drafter {kind!r} needs a model: --draft {kind}:PATH_OR_NAME")
    try:
        return k.build(DraftContext(ctx_target, opts, arg, ngram, owner))
    except EdgeSpecError as exc:
        # A bare name that is no model may have been meant as a drafter (a typo, a plug-in that
        # did not load): name the drafters too, not only the models.
        if kind == "model" and not spec.strip().startswith("model:") and str(exc).startswith("unknown model"):
            raise EdgeSpecError(f"unknown drafter {spec.strip()!r} (drafters: {spec_names()}); as a model: {exc}") from None
        raise
