"""State shared by all tabs and sessions of one running app."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from edgespec.apps.args import KeyLogin
from edgespec.core import drafters
from edgespec.core.engine import DEFAULT_MAX_TOKENS
from edgespec.core.sampling import SamplingParams
from edgespec.models import DEFAULT_TARGET
from edgespec.models.loader import RuntimeOptions
from edgespec.runtime.errors import EdgeSpecError
from edgespec.service.pool import ModelPool
from edgespec.service.session import DEFAULT_DRAFT, DEFAULT_GAMMA


@dataclass
class Defaults:
    """Initial values of the controls (from the command line; the defaults are the session's and
    the engine's own)."""

    target: str = DEFAULT_TARGET
    draft: str = DEFAULT_DRAFT  # a --draft spec: none | a registered drafter NAME[:ARG] | a draft model name/path
    gamma: str = DEFAULT_GAMMA
    ngram: tuple[int, int] = drafters.NGRAM_SIZES
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = SamplingParams.temperature
    top_k: int = SamplingParams.top_k
    top_p: float = SamplingParams.top_p
    min_p: float = SamplingParams.min_p
    seed: int | None = SamplingParams.seed
    system: str = "You are a helpful assistant."


def drafter_choices() -> list[tuple[str, str]]:
    """(label, value) for every drafter kind in the registry (plug-ins included), after 'none'."""
    out = [("none (plain decoding)", "none")]
    for name, kind in drafters.kinds().items():
        out.append((f"{name} (the Models tab's draft model)" if kind.takes_model else name, name))
    return out


def drafter_help() -> str:
    """One line per drafter kind: its name and the registry's summary."""
    return "; ".join(f"{name}: {kind.summary}" for name, kind in drafters.kinds().items())


def default_kind(spec: str) -> str:
    """The drafter kind a --draft spec names ('none', 'ngram', 'model' for a draft model path...)."""
    return drafters.split_spec(spec)[0]


def default_draft_model(spec: str) -> str:
    """The model argument of a --draft spec whose kind takes one (else ''), for the Models tab."""
    kind, arg = drafters.split_spec(spec)
    return arg if kind != "none" and drafters.kinds()[kind].takes_model else ""


def drafter_spec(kind: str, draft_model: str | None) -> str:
    """A drafter choice plus the Models tab's draft model -> the Request's draft spec."""
    kind = (kind or "none").strip()
    if kind == "none":
        return "none"
    known = drafters.kinds()
    if kind not in known:
        raise EdgeSpecError(f"unknown drafter {kind!r}: choose one of {', '.join(['none', *known])}")
    if not known[kind].takes_model:
        return kind
    model = (draft_model or "").strip()
    if not model:
        raise EdgeSpecError(f"drafter {kind!r} needs a draft model: pick one in the Models tab")
    return f"{kind}:{model}"


@dataclass
class AppContext:
    pool: ModelPool
    defaults: Defaults
    login: KeyLogin | None = None  # set where the app is served with a login (--api-key)
    _stops: dict[tuple[str, str], threading.Event] = field(default_factory=dict)
    _clears: dict[tuple[str, str], int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def opts(self) -> RuntimeOptions:
        return self.pool.opts

    def owner(self, user: str | None) -> str:
        """Whose requests a logged-in `user` makes (Request.owner): its key's, as for the API; '' without
        a login (this machine's user)."""
        return self.login.owner(user) if self.login is not None else ""

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
            for key in [k for k in self._clears if k[0] == session]:
                del self._clears[key]

    def clear(self, session: str, kind: str) -> None:
        """Stop the session's `kind` generation and mark everything started before as cleared: a
        generation that sees `clears` change must not bring its conversation back."""
        with self._lock:
            self._clears[(session, kind)] = self._clears.get((session, kind), 0) + 1
        self.stop(session, kind)

    def clears(self, session: str, kind: str) -> int:
        """How many times the session's `kind` conversation was cleared (see clear)."""
        with self._lock:
            return self._clears.get((session, kind), 0)

    def stop(self, session: str, kind: str) -> bool:
        """Stop the session's running generation of that kind; False if none was registered."""
        with self._lock:
            ev = self._stops.get((session, kind))
        if ev is None:
            return False
        ev.set()
        return True
