"""Decoding speed with a busy process beside it: the automatic thread count against a fixed one.

    .venv/bin/python -m benchmarks.threads_load [--target qwen2.5-coder-1.5b] [--repeats 3] [--draft none,ngram]

One process per run (`app.py --json`), greedy, a fixed prompt; conditions interleaved in every round:
alone and beside one busy process (a Python loop, like `yes > /dev/null`), each with the thread count
left automatic (runtime/threads.py) and fixed at every core (`--threads N`, what a fixed count gave
before). Prints medians of the decode rate and the ratios issue 44 item 38 asks for: busy / alone
(target >= 0.65) and automatic / fixed alone (no loss). Run it on an otherwise quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = ("Rewrite this function with type hints and a docstring, keeping its behaviour:\n\n"
          "def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(xs)\n")
BUSY = "while True: pass\n"


def run(target: str, draft: str, threads: int | None, max_tokens: int) -> dict:
    cmd = [sys.executable, str(ROOT / "app.py"), "--target", target, "--draft", draft, "--prompt", PROMPT,
           "--temperature", "0", "--max-tokens", str(max_tokens), "--json"]
    if threads:
        cmd += ["--threads", str(threads)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if res.returncode != 0:
        last = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"the app exited ({res.returncode})"
        raise SystemExit(last if last.startswith("error: ") else f"error: {last}")
    out = json.loads(res.stdout)
    return {"tok_s": out["stats"]["tokens_per_s"], "threads": out["backend"]["threads"]}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.threads_load")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="none,ngram", help="drafters, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    drafts = [d.strip() for d in args.draft.split(",") if d.strip()]
    conds = [(busy, threads) for busy in (False, True) for threads in (None, cores)]
    rates: dict[tuple, list[float]] = {}
    used: dict[tuple, list[int]] = {}
    for r in range(args.repeats):
        for draft in drafts:
            order = conds if r % 2 == 0 else conds[::-1]
            for busy, threads in order:
                hog = subprocess.Popen([sys.executable, "-c", BUSY]) if busy else None
                try:
                    if hog is not None:
                        time.sleep(1.0)
                    got = run(args.target, draft, threads, args.max_tokens)
                finally:
                    if hog is not None:
                        hog.kill()
                        hog.wait()
                key = (draft, busy, threads)
                rates.setdefault(key, []).append(got["tok_s"])
                used.setdefault(key, []).append(got["threads"])
                print(f"round {r + 1} {draft:<6} {'busy ' if busy else 'alone'} threads "
                      f"{'auto' if threads is None else threads} -> {got['threads']}: {got['tok_s']:.1f} tok/s",
                      file=sys.stderr)
    print(f"\n{args.target}, {cores} cores, {args.max_tokens} tokens, medians of {args.repeats}\n")
    print("| drafter | alone, auto | alone, fixed | busy, auto | busy, fixed | busy/alone auto | busy/alone fixed "
          "| auto/fixed alone | threads busy, auto |")
    print("|---|---|---|---|---|---|---|---|---|")
    for draft in drafts:
        m = {k[1:]: statistics.median(v) for k, v in rates.items() if k[0] == draft}
        print(f"| {draft} | {m[(False, None)]:.1f} | {m[(False, cores)]:.1f} | {m[(True, None)]:.1f} | "
              f"{m[(True, cores)]:.1f} | {m[(True, None)] / m[(False, None)]:.2f} | "
              f"{m[(True, cores)] / m[(False, cores)]:.2f} | {m[(False, None)] / m[(False, cores)]:.2f} | "
              f"{sorted(set(used[(draft, True, None)]))} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
