"""The one cost model: what a target pass over K rows costs on this machine, what drafting costs,
and the speedup those predict. gamma auto plans with it, the live UI panel and the bench report
read it; nothing else measures or extrapolates T(K).

    T(K)   seconds of one target pass over K rows (T(K)/T(1) is the verification cost)
    c      seconds to draft one token / T(1) (`CostModel.c`: the drafter's own `draft_cost_s`)
    E      tokens per target call: (1 - alpha^(gamma+1)) / (1 - alpha)   (`expected_tokens`, Eq. 1 of
           Leviathan et al. 2023)
    S      E / (gamma c + T(gamma+1)/T(1))   (`CostModel.speedup`; Theorem 3.8 with the verification
           cost made explicit: the paper's idealised T(gamma+1) = T(1) is `CostModel.flat`)

T(K) comes from a stored profile, measured the first time a model runs with a given set-up and
kept under ~/.cache/edgespec/profiles. A profile measured afresh in every process would differ a
little from run to run, and gamma auto's draft lengths with it; stored, the same command gives the
same text. The key holds everything the costs depend on: the weights file, threads, flash
attention, weight repacking, the llama.cpp build, the CPU kernel variant and the processor, so a
profile measured on one CPU is never used on another.

A profile measured while something else loaded the machine is wrong for as long as it is kept, so
it is checked against the single-token passes every generation times anyway (`check_t1`), and
measured again when stored T(1) is clearly slower than what the machine does now.

In exact mode the profile also holds how many rows a pass may have and still give bit-identical
logits to single-token decoding (`max_rows`, probed on a real text); drafts are capped to that.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgespec.models.inspect import inspect_gguf
from edgespec.runtime import llama as runtime
from edgespec.runtime.errors import EdgeSpecError
from edgespec.runtime.llama import Model, parameter_label

K_MAX = 17  # rows profiled one by one: a draft of up to 16 tokens plus the last committed token
# Longer passes, profiled at these row counts only (linear in between): a copy that keeps being
# accepted is drafted as long as the stored curve pays for, up to GAMMA_MAX tokens. Multiples of 8:
# the CPU kernels work on rows in tiles, so a pass just past a multiple of 8 pays for a tile it
# barely uses (docs/gamma_auto.md has the measured steps).
LONG_ROWS = (24, 32, 48, 64)
GAMMA_MAX = LONG_ROWS[-1] - 1
CONTEXT_AT = 512  # tokens of context before the profiled passes (prompt + output of a typical request)
PROFILE_VERSION = 3  # how profiles are measured; stored profiles of other versions are measured again
STALE_FACTOR = 1.6  # stored T(1) this much slower than observed single-token passes: re-measure (the profile is
# timed after CONTEXT_AT tokens, so short chats see cheaper single-token passes than it; a factor above
# that gap and below what a loaded machine costs, docs/gamma_auto.md)
MIN_OBSERVED = 8  # single-token passes needed before a profile is judged
# A real paragraph for the batch-invariance probe (positions in real text, not a repeated phrase).
PROBE_TEXT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, counting the steps out of "
    "habit rather than need. At the top he trimmed the wick, polished the great lens with a soft cloth, "
    "and wrote the weather in a ledger that nobody had read for thirty years. Ships no longer relied on "
    "his light; satellites told them where the rocks were. Still, on foggy nights, a fishing boat would "
    "sometimes sound its horn as it passed, two short blasts and a long one, and he liked to think it was "
    "a greeting. In the winter the storms came from the north-west and the spray reached the gallery "
    "windows, leaving salt crusted on the glass that took him a whole morning to scrub away."
)


def expected_tokens(alpha: float | Sequence[float], gamma: int) -> float:
    """Tokens per target call when `gamma` tokens are drafted: (1 - alpha^(gamma+1)) / (1 - alpha)
    at acceptance alpha (Eq. 1), or, given per-position acceptances (draft token j accepted with
    probability alpha[j-1] once tokens 1..j-1 were: a copy whose later tokens are likelier right),
    1 + sum_j prod_{i<=j} alpha[i-1], which is Eq. 1 when every alpha[j] is the same."""
    if isinstance(alpha, (int, float)):
        if alpha >= 1.0:
            return float(gamma + 1)
        return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)
    total, p = 1.0, 1.0
    for a in alpha[:gamma]:
        p *= a
        total += p
    return total


def profile_dir() -> Path:
    """EDGESPEC_PROFILES, else EDGESPEC_CACHE/profiles, else ~/.cache/edgespec/profiles."""
    if os.environ.get("EDGESPEC_PROFILES"):
        return Path(os.environ["EDGESPEC_PROFILES"])
    return Path(os.environ.get("EDGESPEC_CACHE", Path.home() / ".cache" / "edgespec")) / "profiles"


def measure_pass_costs(model: Model, rows: Sequence[int], repeats: int = 3, at: int = CONTEXT_AT,
                       samples: dict[int, list[float]] | None = None, save: Callable[[], None] | None = None,
                       progress: Callable[[float], None] | None = None) -> dict[int, float]:
    """Seconds of one pass over K rows (logits on every row), for K in `rows`, with `at`
    tokens of context before them, where real steps run (a pass attends to everything before it:
    timed from position 0, T(K) came out lower than in generation).

    The cache is left as it was found: filler is appended after whatever it holds (a conversation
    whose prefix the next turn reuses) up to `at` tokens in all, and cut back afterwards. Only when
    not even the passes fit behind it is the cache cleared. Row counts are interleaved across repeats
    so that machine noise hits them alike.

    The fastest of the repeats is kept: these VMs stall a pass now and then (never speed one up),
    and a stall in T(1) alone would make every T(K)/T(1) look flatter than it is, so that gamma auto
    drafts where it does not pay.

    Resuming: `samples` {K: seconds of each timed pass} holds what an interrupted measurement timed
    (kept in the stored profile); it is extended in place after every round over the row counts,
    `save()` is called then, and only the rounds missing are measured (after the warm-up round, which
    is never kept). progress(fraction) follows the work, weighted by rows (a pass costs about its
    rows), the saved samples counted as done.
    """
    samples = {} if samples is None else samples
    for k in rows:
        samples.setdefault(k, [])
        del samples[k][repeats:]
    rounds = [todo for r in range(1, repeats + 1) if (todo := [k for k in rows if len(samples[k]) < r])]
    if not rounds:
        return {k: float(np.min(samples[k])) for k in rows}
    rounds.insert(0, list(rows))  # a warm-up round first, not kept
    saved = sum(k * len(samples[k]) for k in rows)
    total = saved + sum(sum(r) for r in rounds)
    done = saved
    if progress is not None:
        progress(done / total)
    k_max = max(rows)
    at = min(at, model.n_ctx - k_max - 1)
    start = model.n_past
    if start + k_max >= model.n_ctx:
        model.reset()
        start = 0
    at = max(at, start)  # a cache longer than `at` is kept: the passes then follow all of it
    filler = model.tokenize(PROBE_TEXT, add_special=True)
    filler = filler * (1 + (at - start + k_max) // len(filler))
    if at > start:
        model.decode(filler[: at - start], n_logits=0)
    passes = filler[at - start : at - start + k_max]
    for i, round_rows in enumerate(rounds):
        for k in round_rows:
            model.truncate(at)
            t = time.perf_counter()
            model.decode(passes[:k], n_logits=k)
            if i:  # the first round warms caches
                samples[k].append(time.perf_counter() - t)
            done += k
            if progress is not None:
                progress(done / total)
        if i and save is not None:
            save()
    model.truncate(start)
    return {k: float(np.min(samples[k])) for k in rows}


def probe_batch_invariance(model: Model, max_rows: int = K_MAX, contexts: Sequence[int] = (24, 96),
                           progress: Callable[[float], None] | None = None) -> int:
    """Largest K such that passes of 2..K rows give logits bit-identical to decoding the same
    tokens one at a time (1 if not even 2 rows do), after `contexts` tokens of real text.
    progress(fraction) after each context."""
    toks = model.tokenize(PROBE_TEXT, add_special=True)
    best = max_rows
    for i, n_ctx in enumerate(contexts):
        if progress is not None:
            progress(i / len(contexts))
        n_ctx = min(n_ctx, len(toks) - max_rows)
        model.reset()
        model.decode(toks[:n_ctx], n_logits=0)
        singles = np.stack([np.array(model.decode([toks[n_ctx + i]], n_logits=1)[0]) for i in range(max_rows)])
        for k in range(2, best + 1):
            model.truncate(n_ctx)
            if not np.array_equal(model.decode(toks[n_ctx : n_ctx + k], n_logits=k), singles[:k]):
                best = k - 1
                break
    model.reset()
    if progress is not None:
        progress(1.0)
    return best


def _key(model: Model) -> str:
    """What the costs depend on: the weights file, how it is run, the build, the kernels and the CPU."""
    st = os.stat(model.path)
    be = runtime.backend_info()
    parts = [
        os.path.realpath(model.path), st.st_size, st.st_mtime_ns,
        model.n_threads, model.flash_attn, model.repack,
        getattr(runtime.lib(), "__version__", ""), be.mode, be.variant, be.module, be.cpu.signature,
        sorted(os.sched_getaffinity(0)), PROFILE_VERSION, CONTEXT_AT,
    ]
    if model.rpc_servers:  # the passes run there: T(K) includes the network round trips
        parts.append(list(model.rpc_servers))
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:20]


def profile_path(model: Model) -> Path:
    return profile_dir() / f"{Path(model.path).stem}-{_key(model)}.json"


@dataclass
class Profile:
    """What is stored for one model and set-up."""

    pass_s: dict[int, float] = field(default_factory=dict)
    max_rows: int | None = None  # exact mode: rows proven batch-invariant; None when not probed
    # Seconds of the passes an interrupted measurement timed, by row count: the next one resumes
    # from them (measure_pass_costs) instead of starting again.
    partial: dict[int, list[float]] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> Profile | None:
        if os.environ.get("EDGESPEC_RECALIBRATE") == "1":
            return None
        try:
            data = json.loads(path.read_text())
            if data.get("stale"):
                return None
            mr = data.get("max_rows")
            partial = {int(k): [float(t) for t in v] for k, v in (data.get("partial") or {}).items()}
            return cls({int(k): float(v) for k, v in data["pass_s"].items()}, None if mr is None else int(mr), partial)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # missing or unreadable: measure again

    def write(self, path: Path, model: Model) -> bool:
        """Store the profile at `path`; False when it cannot be written (a read-only cache)."""
        be = runtime.backend_info()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({
                "model": model.path, "threads": model.n_threads, "flash_attn": model.flash_attn,
                "repack": model.repack, "mode": be.mode, "cpu_variant": be.variant, "cpu": be.cpu.model,
                "measured": time.strftime("%Y-%m-%d %H:%M:%S"), "max_rows": self.max_rows,
                "pass_s": {str(k): v for k, v in sorted(self.pass_s.items())},
                "partial": {str(k): v for k, v in sorted(self.partial.items()) if v},
            }, indent=1))
            tmp.replace(path)
        except OSError:
            return False  # a read-only cache costs a re-measurement in the next process (`unwritable` says so)
        return True


# model -> its profile, so a process reads or measures it once per model (weak: a closed model's
# entry goes with it, and a new model never inherits it)
_loaded: weakref.WeakKeyDictionary[Model, Profile] = weakref.WeakKeyDictionary()
# profile path -> what this process measured and could not store (an unwritable cache): a model
# loaded again with the same set-up (the UI's pool, the bench) is not measured again
_unstored: dict[Path, Profile] = {}


def unwritable() -> str | None:
    """Why profiles cannot be stored in profile_dir(), or None when they can: a profile measured
    while it is unwritable is lost when the process ends."""
    folder = profile_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as exc:
        return f"{folder} cannot be written ({exc.strerror or exc})"
    return None


def profile_rows(max_rows: int = GAMMA_MAX + 1) -> list[int]:
    """The row counts a profile holds up to `max_rows`: every one to K_MAX, then LONG_ROWS."""
    return list(range(1, min(K_MAX, max_rows) + 1)) + [k for k in LONG_ROWS if K_MAX < k <= max_rows]


def profile(model: Model, rows: Sequence[int] | None = None,
            progress: Callable[[float], None] | None = None) -> Profile:
    """The stored profile of `model` with T(K) for every K in `rows` (measured and stored if missing;
    in exact mode the batch-invariance probe too). Measuring takes seconds to minutes, so
    progress(fraction) is called while it runs (only then); what was timed is saved as it goes, and
    a measurement that was interrupted resumes from it."""
    rows = profile_rows() if rows is None else rows
    prof = _loaded.get(model)
    path = profile_path(model)
    if prof is None:
        prof = Profile.read(path) or _unstored.get(path) or Profile()
    missing = sorted(set(rows) - set(prof.pass_s))
    probe = runtime.mode() == "exact" and prof.max_rows is None
    if missing or probe:
        # the two parts' shares of the progress, by the rows they decode (about what they cost)
        share = 4 * sum(missing) / (4 * sum(missing) + (K_MAX * K_MAX if probe else 0))

        def part(lo: float, width: float) -> Callable[[float], None] | None:
            return None if progress is None else lambda f: progress(lo + width * f)

        if missing:
            prof.pass_s.update(measure_pass_costs(model, missing, samples=prof.partial,
                                                  save=lambda: prof.write(path, model), progress=part(0.0, share)))
            for k in missing:
                prof.partial.pop(k, None)
        if probe:
            prof.max_rows = probe_batch_invariance(model, progress=part(share, 1.0 - share))
        if not prof.write(path, model):
            _unstored[path] = prof
    _loaded[model] = prof
    return prof


def forget(model: Model) -> None:
    """Mark the stored profile stale: the next use measures it again."""
    _loaded.pop(model, None)
    path = profile_path(model)
    _unstored.pop(path, None)
    try:
        data = json.loads(path.read_text())
        data["stale"] = True
        path.write_text(json.dumps(data, indent=1))
    except (OSError, ValueError):
        pass


@dataclass(frozen=True)
class ModelKind:
    """What a GGUF model is, read from its metadata rather than its file name (a renamed copy is the
    same kind): what acceptance measured on one model carries over to, gamma auto's prior."""

    architecture: str  # general.architecture, e.g. 'gemma3'
    size: str  # the parameter count as model names give it (runtime.llama.parameter_label), e.g. '268M'
    quant: str  # the file type, e.g. 'Q4_K_M'

    @classmethod
    def of(cls, path: str | os.PathLike) -> ModelKind | None:
        """The kind of the GGUF file at `path`, None when its header cannot be read."""
        try:
            st = os.stat(path)
            return _kind(os.path.realpath(path), st.st_size, st.st_mtime_ns)
        except (OSError, EdgeSpecError):
            return None


@functools.lru_cache(maxsize=32)
def _kind(path: str, size: int, mtime_ns: int) -> ModelKind:
    # size and mtime are part of the key so that a rewritten file is read again
    info = inspect_gguf(path)
    return ModelKind(info["architecture"] or "?", parameter_label(info["n_params"]), info["file_type_name"] or "?")


class CostModel:
    """T(K) for K = 1..k_max+1, c and the predicted speedup. Built from the stored profile by
    `for_target`, or from given costs (tests, what-if predictions)."""

    def __init__(self, pass_s: dict[int, float], c: float = 0.0, max_rows: int | None = None,
                 gamma_max: int = GAMMA_MAX) -> None:
        """pass_s: seconds for some row counts (must include 1); linear in between and extended
        beyond the largest along the last segment's slope."""
        if 1 not in pass_s:
            raise ValueError("pass_s needs T(1)")
        self.gamma_max = gamma_max
        ks = np.array(sorted(pass_s))
        ts = np.array([pass_s[k] for k in ks])
        rows = np.arange(gamma_max + 2)
        if ks.size == 1:
            table = ts[0] * np.maximum(rows, 1)  # cost linear in rows: the worst case
        else:
            table = np.interp(rows, ks, ts)
            slope = max((ts[-1] - ts[-2]) / (ks[-1] - ks[-2]), 0.0)
            beyond = rows > ks[-1]
            table[beyond] = ts[-1] + slope * (rows[beyond] - ks[-1])
        self._table = table  # [gamma_max + 2] seconds, index = rows
        # Draft lengths worth considering: every one whose rows are up to K_MAX, beyond that only
        # where a row count was measured (the curve between sparse points is not known to be
        # linear: just past a multiple of 8 a pass costs a step more, LONG_ROWS).
        self._lengths = [g for g in range(1, gamma_max + 1) if g + 1 <= K_MAX or g + 1 in pass_s]
        self._slope = float(table[-1] - table[-2]) if table.size > 2 else float(table[-1])
        self.c = float(c)
        self.max_rows = max_rows
        self.target_kind: ModelKind | None = None  # what the target is (for_target): gamma auto's prior

    @classmethod
    def flat(cls, c: float = 0.0, gamma_max: int = K_MAX - 1) -> CostModel:
        """The paper's idealised machine: a pass over any number of rows costs what one row does
        (T(K) = T(1), a GPU-like verification), drafting c per token."""
        return cls({1: 1.0, 2: 1.0}, c, gamma_max=gamma_max)

    @classmethod
    def for_target(cls, target: Model, draft_cost_s: float = 0.0, gamma_max: int = GAMMA_MAX,
                   progress: Callable[[float], None] | None = None) -> CostModel:
        """From the stored profile of `target`; draft_cost_s = seconds to draft one token;
        progress(fraction) while a missing profile is measured (`profile`)."""
        rows = profile_rows(gamma_max + 1)
        prof = profile(target, rows, progress)
        model = cls({k: prof.pass_s[k] for k in rows}, 0.0, prof.max_rows if runtime.mode() == "exact" else None,
                    gamma_max)
        model.c = model.draft_cost(draft_cost_s)
        model.target_kind = ModelKind.of(target.path)
        return model

    def seconds(self, rows: int) -> float:
        """T(rows): seconds of one target pass over `rows` rows (beyond the table, along its last slope)."""
        rows = max(rows, 1)
        last = self.gamma_max + 1
        if rows <= last:
            return float(self._table[rows])
        return float(self._table[last] + self._slope * (rows - last))

    def draft_cost(self, seconds_per_token: float) -> float:
        """c: seconds of drafting one token as a share of T(1), a single-token target pass. The one
        definition: the cost model's own c, a hint's per-source cost and a run's measured drafting
        cost (seconds drafting per drafted token) are all this."""
        return seconds_per_token / self.seconds(1)

    def t_ratio(self, rows: int) -> float:
        """T(rows)/T(1), the verification cost in single-token passes."""
        return self.seconds(rows) / self.seconds(1)

    @property
    def draft_cap(self) -> int | None:
        """Longest draft a pass may verify in exact mode (rows proven batch-invariant, minus one);
        None when drafts are not capped."""
        return None if self.max_rows is None else max(0, self.max_rows - 1)

    def speedup(self, alpha: float | Sequence[float], gamma: int, c: float | None = None,
                catch_up: float = 0.0) -> float:
        """Predicted speedup over plain decoding of drafting `gamma` tokens at acceptance alpha, or
        at per-position acceptances alpha[j-1] (token j given 1..j-1 accepted; `expected_tokens`):
        E / `step_cost`, c the model's unless given."""
        if gamma <= 0:
            return 1.0
        return expected_tokens(alpha, gamma) / self.step_cost(gamma, c, catch_up)

    def drafting_cost(self, gamma: int, c: float | None = None, catch_up: float = 0.0) -> float:
        """What drafting `gamma` tokens costs, in single-token target passes: gamma c, plus
        `catch_up` (a draft model's decoding of the committed tokens it has not seen, Hint.catch_up_s
        through `draft_cost`), which a step pays however many tokens it drafts."""
        return gamma * (self.c if c is None else c) + catch_up

    def step_cost(self, gamma: int, c: float | None = None, catch_up: float = 0.0) -> float:
        """What a step that drafts `gamma` tokens costs, in single-token passes: its drafting
        (`drafting_cost`: gamma c + catch-up) and the verification T(gamma+1)/T(1)."""
        return self.drafting_cost(gamma, c, catch_up) + self.t_ratio(gamma + 1)

    def best_gamma(self, alpha: float | Sequence[float], gamma_max: int | None = None,
                   c: float | None = None, catch_up: float = 0.0, *, drafting: bool = False) -> tuple[int, float]:
        """The draft length in [0, min(gamma_max, draft_cap)] with the highest predicted speedup
        (alpha: one acceptance rate, or per-position acceptances as for `speedup`; c and catch_up
        as for `step_cost`); with `drafting`, the best length of at least 1 even when it is slower
        than plain decoding (what a drafter would give here, to say why it was declined)."""
        cap = self.gamma_max if gamma_max is None else gamma_max
        if self.draft_cap is not None:
            cap = min(cap, self.draft_cap)
        best, best_s = 0, (0.0 if drafting else 1.0)
        for g in self._lengths:
            if g > cap or (not isinstance(alpha, (int, float)) and g > len(alpha)):
                break
            s = self.speedup(alpha, g, c, catch_up)
            if s > best_s:
                best, best_s = g, s
        return best, best_s

    def predicted_for(self, gamma_hist: dict[int, int], alpha: float) -> float:
        """What the formula predicts for a run's draft lengths (`Stats.gamma_hist`, steps by draft
        length) at its measured alpha: each step that drafted k tokens yields E(alpha, k) tokens and
        costs `step_cost(k)` single-token passes, so S = sum n_k E(alpha, k) / sum n_k step_cost(k).
        c is the model's (the one gamma auto planned with), not the run's drafting time."""
        if not gamma_hist:
            return 1.0
        tokens = sum(n * expected_tokens(alpha, k) for k, n in gamma_hist.items())
        return tokens / sum(n * self.step_cost(k) for k, n in gamma_hist.items())

    def measured_speedup(self, tokens: int, calls: int, seconds: float, t1: float | None = None) -> float:
        """Speedup that happened: tokens/s over the plain rate 1/T(1). T(1) is what a plain step
        cost while generating (`t1`, median wall time of the plain steps) when known, else the profile's;
        either way no more than a step took on average (a pass never costs less than one row), so
        a generation is never credited with more than its tokens per target call."""
        if calls == 0 or seconds <= 0:
            return 0.0
        t_plain = min(self.seconds(1) if t1 is None else t1, seconds / calls)
        return tokens / seconds * t_plain

    def check_t1(self, target: Model, observed_s: Sequence[float]) -> bool:
        """Judge the stored profile by the single-token passes a generation timed. If stored T(1)
        is STALE_FACTOR slower than their median, it was measured on a loaded machine: forget it
        (the next generation measures again). Returns True when it was forgotten."""
        if len(observed_s) < MIN_OBSERVED:
            return False
        if self.seconds(1) > STALE_FACTOR * float(np.median(observed_s)):
            forget(target)
            return True
        return False
