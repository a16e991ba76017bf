"""State shared by all tabs and sessions of one running app."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from edgespec.factory import RuntimeOptions
from edgespec.ui.pool import ModelPool


@dataclass
class Defaults:
    """Initial values of the controls (from the command line)."""

    target: str = "smollm2-135m"
    draft: str = "ngram"  # none | ngram | draft model name/path
    gamma: str = "auto"
    ngram: tuple[int, int] = (1, 16)
    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None


@dataclass
class AppContext:
    pool: ModelPool
    defaults: Defaults
    _stops: dict[tuple[str, str], threading.Event] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def opts(self) -> RuntimeOptions:
        return self.pool.opts

    def new_stop(self, session: str, kind: str) -> threading.Event:
        """A fresh stop flag for this session's next `kind` ('chat' | 'race') generation."""
        ev = threading.Event()
        with self._lock:
            self._stops[(session, kind)] = ev
        return ev

    def forget(self, session: str) -> None:
        """Drop a closed session's stop flags (stopping anything it left running)."""
        with self._lock:
            for key in [k for k in self._stops if k[0] == session]:
                self._stops.pop(key).set()

    def stop(self, session: str, kind: str) -> bool:
        """Stop the session's running generation of that kind; False if none was registered."""
        with self._lock:
            ev = self._stops.get((session, kind))
        if ev is None:
            return False
        ev.set()
        return True
