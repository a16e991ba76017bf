"""How many threads a CPU pass should use now: the cores this process may run on, less those other
processes keep busy (issue 44, item 38).

ggml's CPU threads meet at a barrier after every operation of a pass, hundreds of times a token,
and spin there. When another process holds one of the cores, the thread that waits for it holds
up all the others at every barrier: on a 2-core AMD EPYC with one `yes > /dev/null` beside it, the
real 1.5B decoded at 0.31x of its speed alone with 2 threads, against 0.71x with one (docs/threads.md).
So where the user did not fix a thread count, every decode runs with as many threads as there are
cores left free by other processes, measured from /proc/stat (the busy time of this process's cores
less this process's own CPU time) over the time since the last look, at most every CHECK_S seconds.
Alone it gives every core, as a fixed count does. Where /proc is missing it gives every core.
"""

from __future__ import annotations

import os
import threading
import time

CHECK_S = 0.5  # the longest a thread count is kept before the load is looked at again
# Other processes' busy cores are rounded to whole cores with this much slack: a browser tab or an
# editor that takes 20-30% of a core now and then does not cost a thread.
SLACK = 0.35


def _ticks() -> tuple[int, int] | None:
    """(busy ticks of the cores this process may use, this process's own CPU ticks), or None."""
    try:
        allowed = os.sched_getaffinity(0)
        busy = 0
        with open("/proc/stat") as f:
            for line in f:
                if not line.startswith("cpu") or line.startswith("cpu "):
                    continue
                name, *fields = line.split()
                if int(name[3:]) not in allowed:
                    continue
                v = [int(x) for x in fields[:8]]
                busy += sum(v) - v[3] - v[4]  # all but idle and iowait
        with open("/proc/self/stat") as f:
            stat = f.read().rsplit(")", 1)[1].split()
        own = int(stat[11]) + int(stat[12])  # utime, stime (fields 14 and 15 of the whole line)
        return busy, own
    except (OSError, ValueError, IndexError):
        return None


class Governor:
    """The thread count for the next pass of every model of this process whose thread count is
    automatic: the cores free of other processes' work since the last look (`threads`)."""

    def __init__(self) -> None:
        self.cores = max(1, len(os.sched_getaffinity(0)))
        self._lock = threading.Lock()
        self._at = 0.0
        self._last = _ticks()
        self._threads = self.cores
        self.others = 0.0  # cores other processes kept busy at the last look

    def threads(self) -> int:
        now = time.monotonic()
        if now - self._at < CHECK_S:
            return self._threads
        with self._lock:
            if now - self._at < CHECK_S:
                return self._threads
            ticks = _ticks()
            if ticks is not None and self._last is not None:
                busy, own = ticks[0] - self._last[0], ticks[1] - self._last[1]
                wall = (now - self._at) * os.sysconf("SC_CLK_TCK") if self._at else 0.0
                if wall > 0:
                    self.others = max(0.0, (busy - own) / wall)
                    self._threads = max(1, min(self.cores, self.cores - int(self.others + 1 - SLACK)))
            self._last, self._at = ticks, now
            return self._threads


_governor: Governor | None = None


def governor() -> Governor:
    global _governor
    if _governor is None:
        _governor = Governor()
    return _governor
