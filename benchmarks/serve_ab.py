"""Two checkouts of this repository serving the same target, the same requests sent to each in
turn: how a change to the serving path moves what clients see (`timings.predicted_per_second`).

    .venv/bin/python -m benchmarks.serve_ab --before /path/to/old/checkout [--after .] \
        [--target qwen2.5-coder-1.5b] [--drafts none,ngram] [--requests 6] [--repeats 3]

Each checkout runs `python app.py serve` with its own virtual environment (`.venv` inside it, or a
link to one) on a free loopback port; both servers stay loaded, and only one generates at a time.
The requests are the first requests of the agent suite's kinds (edit, diff, rewrite, tool call,
extraction), each under its own API key per repeat so the suffix drafter never sees its own earlier
answer. Order alternates (before/after, then after/before). Prints per-request rates and, per
drafter, medians and the median per-request ratio after/before.

Both servers run a fixed thread count (`--threads`, default every core): with the count following
the free cores, a server would read the other's request, just finished, as another process's load
and run the first half second of its own on one thread (docs/kernels.md, 2026-12-06).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.agent_suite import free_port, messages, wait_healthy
from edgespec.runtime.errors import EdgeSpecError
from edgespec.service.suites import load_suites, shipped_suites

ROOT = Path(__file__).resolve().parent.parent


def start(tree: Path, target: str, port: int, log: Path, timeout: float, threads: int) -> subprocess.Popen:
    python = tree / ".venv" / "bin" / "python"
    if not (tree / "app.py").is_file() or not python.exists():
        raise EdgeSpecError(f"{tree} is not a checkout with its .venv (app.py and .venv/bin/python)")
    cmd = [str(python), "app.py", "serve", "--port", str(port), "--target", target, "--draft", "suffix", "--queue", "2",
           "--threads", str(threads)]
    proc = subprocess.Popen(cmd, cwd=tree, stdout=log.open("w"), stderr=subprocess.STDOUT)
    return wait_healthy(proc, port, log, timeout)


def first_of_each_kind(n: int) -> list:
    """The suite's first request of each kind, then the rest in file order; the first `n`."""
    prompts = load_suites([shipped_suites()["agent"]])
    firsts: dict = {}
    for pr in prompts:
        firsts.setdefault(pr.kind, pr)
    lead = list(firsts.values())
    return (lead + [pr for pr in prompts if pr not in lead])[:n]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.serve_ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="the checkout to compare against")
    ap.add_argument("--after", default=str(ROOT), help="the checkout with the change (default: this one)")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--drafts", default="none,ngram", help="what each request is sent with (`draft`)")
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--start-timeout", type=float, default=1800.0)
    ap.add_argument("--threads", type=int, default=None, help="each server's CPU threads, fixed (default: every core)")
    args = ap.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        raise EdgeSpecError(f"--threads must be 1 or more, got {args.threads}")
    threads = args.threads or max(1, len(os.sched_getaffinity(0)))
    import openai

    trees = {"before": Path(args.before).resolve(), "after": Path(args.after).resolve()}
    drafts = [d.strip() for d in args.drafts.split(",") if d.strip()]
    prompts = first_of_each_kind(args.requests)
    procs, ports = [], {}
    rates = {(side, d): [] for side in trees for d in drafts}
    try:
        for side, tree in trees.items():
            port = free_port()
            print(f"starting {side}: {tree} on 127.0.0.1:{port}", file=sys.stderr, flush=True)
            procs.append(start(tree, args.target, port, Path(f"/tmp/serve_ab_{side}.log"), args.start_timeout, threads))
            ports[side] = port
        print("| repeat | request | drafter | before tok/s | after tok/s | after / before |")
        print("|---|---|---|---|---|---|")
        for r in range(args.repeats):
            pass_clients = {side: openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=f"serve-ab-{r}",
                                                max_retries=0, timeout=1800) for side, port in ports.items()}
            for i, pr in enumerate(prompts):
                for d in drafts:
                    order = list(trees) if (r + i) % 2 == 0 else list(trees)[::-1]
                    got = {}
                    for side in order:
                        resp = pass_clients[side].chat.completions.create(
                            model=args.target, messages=messages(pr), max_tokens=pr.max_tokens or 128,
                            temperature=0, extra_body={"draft": d})
                        got[side] = resp.model_extra["timings"]["predicted_per_second"]
                        rates[(side, d)].append(got[side])
                    print(f"| {r + 1} | {pr.id} | {d} | {got['before']:.1f} | {got['after']:.1f} | "
                          f"{got['after'] / got['before']:.2f} |", flush=True)
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=60)
    print()
    for d in drafts:
        b, a = rates[("before", d)], rates[("after", d)]
        ratios = [y / x for x, y in zip(b, a, strict=True)]
        print(f"{d}: before median {statistics.median(b):.1f} tok/s, after {statistics.median(a):.1f} tok/s; "
              f"after / before per request: median {statistics.median(ratios):.2f} "
              f"(range {min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} requests)")
    return 0


if __name__ == "__main__":
    from edgespec.runtime.errors import run_command

    sys.exit(run_command(lambda: main(sys.argv[1:])))
