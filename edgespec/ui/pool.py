"""Loaded models shared by every UI session.

A `Model` holds one llama.cpp context and is not thread-safe, so a generation leases a model for
its whole run. The pool keeps up to `per_key` instances of each (path, options) pair: two
sessions chatting with the same model get separate contexts and really run at the same time,
a third waits for a free one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from edgespec.drafters import Drafter
from edgespec.errors import EdgeSpecError
from edgespec.factory import RuntimeOptions, load_model, make_drafter
from edgespec.profile import measure_pass_costs
from edgespec.runtime import Model

Progress = Callable[[float], None]


@dataclass
class Slot:
    """One loaded target plus the draft models loaded against it (a draft model keeps its own KV
    cache in step with this target, so it belongs to the slot, not to the pool)."""

    model: Model
    busy: bool = False
    draft_models: dict[str, Drafter] = field(default_factory=dict)
    pass_costs: dict[int, float] = field(default_factory=dict)
    costs_at: float = 0.0  # perf_counter() when pass_costs were measured
    used_at: float = field(default_factory=time.perf_counter)  # last lease, for evicting the stalest

    def drafter(self, spec: str, opts: RuntimeOptions, ngram: tuple[int, int]) -> Drafter | None:
        """A drafter for one generation: n-gram drafters are rebuilt (cheap, stateless between
        generations); draft models are loaded once per slot and reused."""
        spec = (spec or "none").strip()
        if spec in ("none", "ngram"):
            return make_drafter(spec, self.model, opts, ngram)
        if spec not in self.draft_models:
            self.draft_models[spec] = make_drafter(spec, self.model, opts, ngram)
        return self.draft_models[spec]

    def costs(self, rows: list[int], max_age_s: float = 30.0) -> dict[int, float]:
        """Median seconds of a target pass over K rows. Re-measured when older than `max_age_s`:
        on a shared machine the load changes, and a stale T(1) would skew the measured speedup."""
        if time.perf_counter() - self.costs_at > max_age_s:
            self.pass_costs.clear()
        missing = [k for k in rows if k not in self.pass_costs]
        if missing:
            self.pass_costs.update(measure_pass_costs(self.model, missing, repeats=2))
            self.costs_at = time.perf_counter()
        return {k: self.pass_costs[k] for k in rows}

    def close(self) -> None:
        for d in self.draft_models.values():
            d.close()
        self.draft_models.clear()
        self.model.close()


class ModelPool:
    """Loaded models keyed by their resolved path: up to `per_key` instances of one model and
    `max_slots` instances in all; the least recently used idle instance is freed to make room."""

    def __init__(self, opts: RuntimeOptions, per_key: int = 2, max_slots: int = 4) -> None:
        self.opts = opts
        self.per_key = per_key
        self.max_slots = max_slots
        self._cond = threading.Condition()
        self._slots: dict[str, list[Slot]] = {}
        self._loading: dict[str, int] = {}

    @staticmethod
    def key(name: str) -> str:
        """Local path of what a user named (bundled, catalog or hf: name, models/ file, path).
        Never downloads: a generation must not stall on a multi-gigabyte fetch without a bar."""
        from models import resolve_local

        path = resolve_local(name)
        if path is None:
            raise EdgeSpecError(f"{name} is not downloaded yet: download it in the Models tab first")
        return str(Path(path).resolve())

    @contextmanager
    def lease(self, name: str, progress: Progress | None = None) -> Iterator[Slot]:
        """Exclusive use of a loaded instance of `name` for the duration of the block."""
        key = self.key(name)
        slot = self._acquire(key, progress)
        try:
            yield slot
        finally:
            with self._cond:
                slot.busy = False
                self._cond.notify_all()

    def _acquire(self, key: str, progress: Progress | None) -> Slot:
        evicted: Slot | None = None
        with self._cond:
            while True:
                slots = self._slots.setdefault(key, [])
                for s in slots:
                    if not s.busy:
                        s.busy = True
                        s.used_at = time.perf_counter()
                        if progress is not None:
                            progress(1.0)
                        return s
                if len(slots) + self._loading.get(key, 0) < self.per_key:
                    total = sum(map(len, self._slots.values())) + sum(self._loading.values())
                    idle = [(s.used_at, k, s) for k, v in self._slots.items() for s in v if not s.busy]
                    if total < self.max_slots or idle:
                        if total >= self.max_slots:
                            _, k, evicted = min(idle, key=lambda t: t[0])
                            self._slots[k].remove(evicted)
                        self._loading[key] = self._loading.get(key, 0) + 1
                        break
                self._cond.wait()
        if evicted is not None:
            evicted.close()
        try:
            model = load_model(key, self.opts, progress)
        except BaseException:
            with self._cond:
                self._loading[key] -= 1
                self._cond.notify_all()
            raise
        slot = Slot(model, busy=True)
        with self._cond:
            self._loading[key] -= 1
            self._slots[key].append(slot)
        return slot

    def active(self) -> int:
        """Number of generations (or loads) holding a model right now."""
        with self._cond:
            return sum(s.busy for v in self._slots.values() for s in v) + sum(self._loading.values())

    def loaded(self) -> list[str]:
        """'file.gguf xN' for each model with N instances in memory."""
        with self._cond:
            return [f"{Path(k).name} x{len(v)}" for k, v in self._slots.items() if v]
