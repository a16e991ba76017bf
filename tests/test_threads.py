"""The thread count follows the cores other processes leave free (runtime/threads.py; issue 44 item 38):
a busy process beside this one takes a thread away, a fixed --threads is kept, and --json says what ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from edgespec.runtime import threads
from tests.conftest import run_app

BUSY = "import time\nt = time.time() + 60\nwhile time.time() < t: pass\n"


def test_the_count_is_the_cores_less_what_others_keep_busy(monkeypatch):
    gov = threads.Governor()
    gov.cores = 4
    tick = os.sysconf("SC_CLK_TCK")
    samples = iter([(0, 0), (int(2.0 * tick), int(1.0 * tick)),  # 1 of 2 busy cores is another process's
                    (int(2.1 * tick), int(1.1 * tick)), (int(2.3 * tick), int(1.2 * tick))])
    clock = iter([100.0, 101.0, 102.0, 103.0])
    monkeypatch.setattr(threads, "_ticks", lambda: next(samples))
    monkeypatch.setattr(threads.time, "monotonic", lambda: next(clock))
    gov._last, gov._at = threads._ticks(), threads.time.monotonic()
    assert gov.threads() == 3 and gov.others == pytest.approx(1.0, abs=0.05)
    assert gov.threads() == 4  # others used 0 of the next second
    assert gov.threads() == 4 and gov.others == pytest.approx(0.1, abs=0.05)  # a tenth of a core costs nothing


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_a_busy_process_beside_takes_a_thread_away():
    gov = threads.Governor()
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        time.sleep(0.3)
        gov.threads()
        time.sleep(threads.CHECK_S + 0.5)
        assert gov.threads() <= gov.cores - 1, gov.others
        assert gov.others >= 0.6
    finally:
        busy.kill()
        busy.wait()


def test_json_says_how_many_threads_ran_and_a_fixed_count_is_kept():
    out = run_app("--headless", "--prompt", "hi", "--raw", "--max-tokens", "4", "--draft", "none", "--json",
                  "--threads", "1")
    assert out.returncode == 0, out.stderr[-1000:]
    be = json.loads(out.stdout)["backend"]
    assert be["threads"] == be["threads_max"] == 1
    out = run_app("--headless", "--prompt", "hi", "--raw", "--max-tokens", "4", "--draft", "none", "--json")
    be = json.loads(out.stdout)["backend"]
    assert 1 <= be["threads"] <= be["threads_max"] == len(os.sched_getaffinity(0))
