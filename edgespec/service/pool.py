"""Loaded sessions shared by everything that generates: the UI's browser sessions and the
server's worker (`serve --ui` leases from one pool, so the UI and the API never run on one context
at the same time). Below both: it knows sessions, not pages or requests.

A `Session` holds one target (one llama.cpp context) and the draft models loaded against it; it is
not thread-safe, so a generation leases a session for its whole run. The pool keeps up to
`per_key` sessions of each target file: two browser sessions chatting with the same model get
separate contexts and really run at the same time, a third waits for a free one.

A session keeps its KV cache between generations (prefix reuse), so a chat turn prefills only the
new turn if it runs on the session that ran the previous one: a lease names its owner (the browser
session) and gets back the idle session that owner used last when there is one.

The pool measures nothing: costs come from the session's cost model (`edgespec.core.costs`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from edgespec.models.loader import RuntimeOptions
from edgespec.runtime.errors import EdgeSpecError
from edgespec.service.session import Session

Progress = Callable[[float], None]


@dataclass
class _Entry:
    session: Session
    busy: bool = False
    owner: str | None = None  # who leased it last (its cache holds their conversation)
    used_at: float = field(default_factory=time.perf_counter)  # last lease, for evicting the stalest


class ModelPool:
    """Sessions keyed by their target's resolved path: up to `per_key` sessions of one target and
    `max_slots` sessions in all; the least recently used idle session is closed to make room."""

    def __init__(self, opts: RuntimeOptions, per_key: int = 2, max_slots: int = 4) -> None:
        self.opts = opts
        self.per_key = per_key
        self.max_slots = max_slots
        self._cond = threading.Condition()
        self._entries: dict[str, list[_Entry]] = {}
        self._loading: dict[str, int] = {}

    @staticmethod
    def key(name: str) -> str:
        """Local path of what a user named (bundled, catalog or hf: name, edgespec/models/ file, path).
        Never downloads: a generation must not stall on a multi-gigabyte fetch without a bar."""
        from edgespec.models import resolve_local

        path = resolve_local(name)
        if path is None:
            raise EdgeSpecError(f"{name} is not downloaded yet: download it in the Models tab first")
        return str(Path(path).resolve())

    @contextmanager
    def lease(self, name: str, progress: Progress | None = None, owner: str | None = None) -> Iterator[Session]:
        """Exclusive use of a loaded session of `name` for the duration of the block; `owner`'s
        own last session when it is idle (its cache holds their conversation). A loaded session's
        own key is not looked up again: it goes on from memory if its file has been removed since."""
        with self._cond:
            loaded = bool(self._entries.get(name))
        key = name if loaded else self.key(name)
        entry = self._acquire(key, progress, owner)
        try:
            yield entry.session
        finally:
            with self._cond:
                entry.busy = False
                self._cond.notify_all()

    def _acquire(self, key: str, progress: Progress | None, owner: str | None = None) -> _Entry:
        evicted: _Entry | None = None
        with self._cond:
            while True:
                entries = self._entries.setdefault(key, [])
                idle = [e for e in entries if not e.busy]
                # the owner's own session first, then one nobody owns, then the stalest
                idle.sort(key=lambda e: (e.owner != owner or owner is None, e.owner is not None, e.used_at))
                if idle:
                    e = idle[0]
                    e.busy = True
                    e.owner = owner
                    e.used_at = time.perf_counter()
                    if progress is not None:
                        progress(1.0)
                    return e
                if len(entries) + self._loading.get(key, 0) < self.per_key:
                    total = sum(map(len, self._entries.values())) + sum(self._loading.values())
                    idle = [(e.used_at, k, e) for k, v in self._entries.items() for e in v if not e.busy]
                    if total < self.max_slots or idle:
                        if total >= self.max_slots:
                            _, k, evicted = min(idle, key=lambda t: t[0])
                            self._entries[k].remove(evicted)
                        self._loading[key] = self._loading.get(key, 0) + 1
                        break
                self._cond.wait()
        if evicted is not None:
            evicted.session.close()
        try:
            session = Session.load(key, self.opts, progress)
        except BaseException:
            with self._cond:
                self._loading[key] -= 1
                self._cond.notify_all()
            raise
        entry = _Entry(session, busy=True, owner=owner)
        with self._cond:
            self._loading[key] -= 1
            self._entries[key].append(entry)
        return entry

    def active(self) -> int:
        """Number of generations (or loads) holding a session right now."""
        with self._cond:
            return sum(e.busy for v in self._entries.values() for e in v) + sum(self._loading.values())

    def loaded(self) -> list[str]:
        """'file.gguf xN' for each target with N sessions in memory."""
        with self._cond:
            return [f"{Path(k).name} x{len(v)}" for k, v in self._entries.items() if v]

    def use_device(self, device: str | None) -> None:
        """Load models on `device` from now on (RuntimeOptions.device; None: the default): the
        sessions loaded on another device are closed. Refused while a generation holds one."""
        from dataclasses import replace

        from edgespec.runtime import backend
        from edgespec.runtime import llama as runtime

        if device == self.opts.device:
            return
        opts = replace(self.opts, device=device)  # a bad combination (--exact on a GPU) fails here
        if device is not None:
            runtime.lib()
            backend.choose_device(device)  # an unknown name fails here, before anything is closed
        with self._cond:
            if self.active():
                raise EdgeSpecError("a generation is running; change the device when it has finished")
            self.opts = opts
        self.close()

    def close(self) -> None:
        """Close every idle session (busy ones are left to finish)."""
        with self._cond:
            idle = [e for v in self._entries.values() for e in v if not e.busy]
            for v in self._entries.values():
                v[:] = [e for e in v if e.busy]
        for e in idle:
            e.session.close()
