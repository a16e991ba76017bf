"""Stored cost profiles: what one llama.cpp pass over K rows costs on this machine, measured once
per model and set-up and kept on disk. The cost model (`edgespec.core.costs`) reads T(K) from here;
nothing else measures it.

A profile is measured the first time a model runs with a given set-up and kept under
~/.cache/edgespec/profiles. A profile measured afresh in every process would differ a little from
run to run, and gamma auto's draft lengths with it; stored, the same command gives the same text.
The key holds everything the costs depend on: the weights file, threads, flash attention, weight
repacking, the llama.cpp build, the CPU kernel variant and the processor, and the device the layers
run on (its name and description, and how many layers are there), so a profile measured on one CPU
or GPU is never used on another: gamma auto plans with the T(K) of the device it runs on.

A profile measured while something else loaded the machine is wrong for as long as it is kept, so
it is checked against the single-token passes every generation times anyway
(`CostModel.check_t1`), and measured again when stored T(1) is clearly slower than what the
machine does now. A measurement in which a pass over more rows came out much cheaper than one
over fewer (`implausible`: every repeat of one row count stalled) is measured again before it is
stored, and kept for the one process only if it is implausible again.

In exact mode the profile also holds how many rows a pass may have and still give bit-identical
logits to single-token decoding (`max_rows`, from `exactness.probe_batch_invariance`); drafts are
capped to that.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgespec.runtime import backend, env
from edgespec.runtime import llama as runtime
from edgespec.runtime.exactness import PROBE_TEXT, probe_batch_invariance
from edgespec.runtime.llama import Model

K_MAX = 17  # rows profiled one by one: a draft of up to 16 tokens plus the last committed token
# Longer passes, profiled at these row counts only (linear in between): a copy that keeps being
# accepted is drafted as long as the stored curve pays for, up to GAMMA_MAX tokens. Multiples of 8:
# the CPU kernels work on rows in tiles, so a pass just past a multiple of 8 pays for a tile it
# barely uses (docs/gamma_auto.md has the measured steps).
LONG_ROWS = (24, 32, 48, 64)
GAMMA_MAX = LONG_ROWS[-1] - 1
CONTEXT_AT = 512  # tokens of context before the profiled passes (prompt + output of a typical request)
PROFILE_VERSION = 4  # how profiles are measured; stored profiles of other versions are measured again
# A pass over more rows measured below this share of one over fewer rows was disturbed (the fastest
# of the repeats of the smaller one stalled: another program held the CPU): measured again.
PLAUSIBLE = 0.7
# A stored profile is planned with only if every pass took a positive, finite time of at most
# MAX_PASS_S seconds and none over K rows cost more than DEARER_MAX K single-row passes (a pass over
# K rows costs at most about K single passes: llama.cpp runs the rows together or one by one).
MAX_PASS_S = 3600.0
DEARER_MAX = 2.0


def profile_dir() -> Path:
    """EDGESPEC_PROFILES, else EDGESPEC_CACHE/profiles, else ~/.cache/edgespec/profiles."""
    return env.path("EDGESPEC_PROFILES") or env.cache_dir() / "profiles"


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
    drafts where it does not pay. A measurement in which a pass over more rows came out much cheaper
    than one over fewer (`implausible`: every repeat of one row count stalled) is taken again from
    scratch, once.

    Resuming: `samples` {K: seconds of each timed pass} holds what an interrupted measurement timed
    (kept in the stored profile); it is extended in place after every round over the row counts,
    `save()` is called then, and only the rounds missing are measured (after the warm-up round, which
    is never kept). progress(fraction) follows the work, weighted by rows (a pass costs about its
    rows), the saved samples counted as done.
    """
    samples = {} if samples is None else samples
    got = _time_passes(model, rows, repeats, at, samples, save, progress)
    bad = implausible(got)
    if bad is not None:  # every repeat of one row count stalled: once more, from scratch
        _say_disturbed(model, got, bad, "measuring again")
        for k in rows:
            samples[k].clear()
        got = _time_passes(model, rows, repeats, at, samples, save, progress)
    return got


def _time_passes(model: Model, rows: Sequence[int], repeats: int, at: int, samples: dict[int, list[float]],
                 save: Callable[[], None] | None, progress: Callable[[float], None] | None) -> dict[int, float]:
    """measure_pass_costs' timing, resuming from and adding to `samples`."""
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


def implausible(pass_s: dict[int, float]) -> tuple[int, int] | None:
    """Row counts (a, b), a < b, where the pass over b rows measured below PLAUSIBLE times the one over
    a rows, or None. More rows never make a pass much cheaper; a stall in every repeat of one row
    count does (seen: T(1) 2.0 s beside T(3) 80 ms, measured while a test suite ran)."""
    slowest: tuple[int, float] | None = None
    for k in sorted(pass_s):
        t = pass_s[k]
        if slowest is not None and t < PLAUSIBLE * slowest[1]:
            return slowest[0], k
        if slowest is None or t > slowest[1]:
            slowest = (k, t)
    return None


def invalid(pass_s: dict[int, float]) -> str | None:
    """Why stored pass costs cannot be planned with (edited by hand, written by a broken build), or
    None: each T(K) a positive, finite number of seconds up to MAX_PASS_S, no T(K) above DEARER_MAX
    K T(1), and more rows never much cheaper than fewer (`implausible`)."""
    for k, t in sorted(pass_s.items()):
        if k < 1 or not (math.isfinite(t) and 0 < t <= MAX_PASS_S):
            return f"T({k}) = {t!r} s is not a time a pass can take"
    t1 = pass_s.get(1)
    for k, t in sorted(pass_s.items()):
        if t1 is not None and t > DEARER_MAX * k * t1:
            return f"T({k}) {t * 1000:.3g} ms is more than {DEARER_MAX:g} x {k} passes of T(1) {t1 * 1000:.3g} ms"
    bad = implausible(pass_s)
    if bad is not None:
        a, b = bad
        return f"T({b}) {pass_s[b] * 1000:.3g} ms is below T({a}) {pass_s[a] * 1000:.3g} ms"
    return None


def _key(model: Model) -> str:
    """What the costs depend on: the weights file, how it is run, the build, the kernels and the CPU."""
    be = runtime.backend_info()
    parts = [
        *model.file.identity,  # as loaded: a server goes on after its file is removed
        model.n_threads, model.flash_attn, model.repack,
        getattr(runtime.lib(), "__version__", ""), be.mode, be.variant, be.module, be.kernels, be.kernel_bits, be.kernel_prefetch,
        be.cpu.signature,
        sorted(os.sched_getaffinity(0)), PROFILE_VERSION, CONTEXT_AT,
    ]
    if be.kernel_amx:  # the AMX forms change T(K) from 6 rows on (keys without them stay as they were)
        parts.append("amx")
    if model.device != backend.CPU_DEVICE:  # the passes run there (CPU keys stay as they were)
        parts.append([model.device, model.device_description, model.layers_on_device])
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
        """The profile stored at `path`; None (measure again) when it is missing, unreadable, marked
        stale, invalid (`invalid`: said on stderr), or EDGESPEC_RECALIBRATE asks for a new one."""
        if env.recalibrate():
            return None
        try:
            data = json.loads(path.read_text())
            if data.get("stale"):
                return None
            mr = data.get("max_rows")
            partial = {int(k): [float(t) for t in v] for k, v in (data.get("partial") or {}).items()}
            prof = cls({int(k): float(v) for k, v in data["pass_s"].items()}, None if mr is None else int(mr), partial)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # missing or unreadable: measure again
        why = invalid(prof.pass_s)
        if why is None and prof.max_rows is not None and prof.max_rows < 0:
            why = f"max_rows {prof.max_rows} is negative"
        if why is not None:
            print(f"edgespec: the stored cost profile {path.name} is invalid ({why}); measuring it again",
                  file=sys.stderr)
            return None
        # an interrupted measurement's samples are resumed from only where each is a time
        prof.partial = {k: v for k, v in prof.partial.items()
                        if k >= 1 and all(math.isfinite(t) and 0 < t <= MAX_PASS_S for t in v)}
        return prof

    def write(self, path: Path, model: Model) -> bool:
        """Store the profile at `path`; False when it cannot be written (a read-only cache)."""
        be = runtime.backend_info()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({
                "model": model.path, "threads": model.n_threads, "flash_attn": model.flash_attn,
                "repack": model.repack, "mode": be.mode, "cpu_variant": be.variant, "cpu": be.cpu.model,
                "device": model.device, "device_description": model.device_description,
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
            prof.max_rows = probe_batch_invariance(model, K_MAX, progress=part(share, 1.0 - share))
        bad = implausible(prof.pass_s) if missing else None
        if bad is not None:  # implausible twice (or beside the stored rows): this process only
            _say_disturbed(model, prof.pass_s, bad, "used for this run only, measured again next time")
        if bad is not None or not prof.write(path, model):
            _unstored[path] = prof
    _loaded[model] = prof
    return prof


def _say_disturbed(model: Model, pass_s: dict[int, float], bad: tuple[int, int], then: str) -> None:
    a, b = bad
    print(f"edgespec: {Path(model.path).name}'s pass costs came out implausible (T({b}) {pass_s[b] * 1000:.1f} ms "
          f"below T({a}) {pass_s[a] * 1000:.1f} ms): the CPU was busy with something else; {then}",
          file=sys.stderr)


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
