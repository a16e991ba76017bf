"""Does the stored cost profile tell the truth? T(K) from the profile (what gamma auto plans with)
against T(K) observed in real generation steps (`Stats.pass_s`: the llama_decode of each step, at
the real context length), for every row count K that the runs produced.

    .venv/bin/python -m benchmarks.pass_cost [--target gemma3-270m] [--gammas 1,2,4,8,12,16] [--max-tokens 96]

The runs are the bench's grounded prompts (first 2 of summarization, RAG and extraction, and 2 code
edits) with the n-gram drafter at fixed draft lengths, so that passes of many sizes occur.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict

from edgespec.models.loader import RuntimeOptions
from edgespec.runtime import profiles
from edgespec.runtime.errors import run_command
from edgespec.service.session import Request, Session
from edgespec.service.suites import grounded_prompts


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.pass_cost")
    ap.add_argument("--target", default="gemma3-270m")
    ap.add_argument("--gammas", default="1,2,4,8,12,16")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    session = Session.load(args.target, RuntimeOptions(n_threads=args.threads))
    observed: dict[int, list[float]] = defaultdict(list)
    try:
        target = session.target
        prof = profiles.profile(target)
        framing = "question"
        prompts = grounded_prompts()
        for i, pr in enumerate(prompts):
            for g in args.gammas.split(","):
                reply = session.run(Request(text=pr.text, framing=framing, draft="ngram", gamma=g.strip(),
                                            max_tokens=args.max_tokens))
                for k, v in reply.stats.pass_s.items():
                    observed[k].extend(v)
            print(f"[{i + 1}/{len(prompts)}] {pr.id}", file=sys.stderr)
    finally:
        session.close()
    t1p = prof.pass_s[1]
    t1o = statistics.median(observed[1])
    print(f"profile measured at {profiles.CONTEXT_AT} tokens of context; observed = median of real steps")
    print("| K | profile T(K) ms | observed T(K) ms | passes | observed / profile | profile T(K)/T(1) | observed T(K)/T(1) |")
    print("|---|---|---|---|---|---|---|")
    worst = 0.0
    for k in sorted(observed):
        if k not in prof.pass_s or len(observed[k]) < 3:
            continue
        o = statistics.median(observed[k])
        p = prof.pass_s[k]
        worst = max(worst, abs(o / p - 1))
        print(f"| {k} | {1000 * p:.1f} | {1000 * o:.1f} | {len(observed[k])} | {o / p:.2f} | {p / t1p:.2f} | {o / t1o:.2f} |")
    print(f"\nlargest disagreement: {100 * worst:.0f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(lambda: main(sys.argv[1:])))  # a bad model name: one line, exit 1
