"""Cost profiles: seconds of one target pass over K rows, measured once per machine and model.

gamma auto plans from T(K)/T(1). Measuring it takes about a second per model, and a profile
measured afresh in every process would differ a little from run to run; draft lengths chosen from
it would then differ too, and with them the batch shapes llama.cpp sees, which (in the fast build)
nudges the logits and can change a seeded or greedy output. So the profile is measured the first
time a model is used with a given runtime set-up, stored under ~/.cache/edgespec/profiles, and
reused: the same command gives the same text. Delete the folder (or set EDGESPEC_RECALIBRATE=1)
to measure again, e.g. after moving to another machine or changing the thread count.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np

from edgespec.runtime import Model, lib


def profile_dir() -> Path:
    """EDGESPEC_PROFILES, else EDGESPEC_CACHE/profiles, else ~/.cache/edgespec/profiles."""
    if os.environ.get("EDGESPEC_PROFILES"):
        return Path(os.environ["EDGESPEC_PROFILES"])
    return Path(os.environ.get("EDGESPEC_CACHE", Path.home() / ".cache" / "edgespec")) / "profiles"


def measure_pass_costs(model: Model, rows: list[int], repeats: int = 3) -> dict[int, float]:
    """Median seconds of one target pass over K rows (logits on every row), for K in `rows`.

    Decodes filler tokens from position 0 and clears the cache afterwards. Row counts are
    interleaved across repeats so that machine noise hits them alike.
    """
    filler = model.tokenize(" the quick brown fox jumps over the lazy dog" * 8, add_special=False)
    times: dict[int, list[float]] = {k: [] for k in rows}
    for _ in range(repeats + 1):  # the first round warms caches and is discarded
        for k in rows:
            model.reset()
            t = time.perf_counter()
            model.decode(filler[:k], n_logits=k)
            times[k].append(time.perf_counter() - t)
    model.reset()
    return {k: float(np.median(v[1:])) for k, v in times.items()}


def _key(model: Model) -> str:
    """What the costs depend on: the weights file, how it is run, and the llama.cpp build."""
    st = os.stat(model.path)
    llama = lib()
    parts = [
        os.path.realpath(model.path), st.st_size, st.st_mtime_ns,
        model.n_threads, model.flash_attn, model.repack,
        getattr(llama, "__file__", ""), getattr(llama, "__version__", ""),
        sorted(os.sched_getaffinity(0)),
    ]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:20]


def pass_costs(model: Model, rows: list[int]) -> dict[int, float]:
    """T(K) for K in `rows`: from the model object, else the stored profile, else measured (and
    stored). Measuring happens at most once per model, machine and runtime set-up."""
    cached: dict[int, float] = getattr(model, "_pass_costs", {})
    if all(k in cached for k in rows):
        return {k: cached[k] for k in rows}
    path = profile_dir() / f"{Path(model.path).stem}-{_key(model)}.json"
    stored: dict[int, float] = {}
    if path.exists() and os.environ.get("EDGESPEC_RECALIBRATE") != "1":
        try:
            stored = {int(k): float(v) for k, v in json.loads(path.read_text())["pass_s"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            stored = {}  # unreadable profile: measure again
    missing = sorted(set(rows) - set(stored))
    if missing:
        stored.update(measure_pass_costs(model, missing, repeats=3))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({
                "model": model.path, "threads": model.n_threads, "flash_attn": model.flash_attn,
                "repack": model.repack, "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
                "pass_s": {str(k): v for k, v in sorted(stored.items())},
            }, indent=1))
            tmp.replace(path)
        except OSError:
            pass  # a read-only cache only costs a re-measurement next time
    model._pass_costs = {**cached, **stored}
    return {k: stored[k] for k in rows}
