"""How often is the n-gram drafter's first proposed token right, by the size of the match it copies
from? The measurement behind gamma auto's starting estimates (`adaptive.MATCH_PRIOR`).

    .venv/bin/python -m benchmarks.ngram_priors [--target gemma3-270m] [--skip 5] [--per-category 3]

Greedy plain generations of Spec-Bench prompts that the bench does not use (each category's first
`--skip` prompts are the bench's; these come after them), then a replay of the n-gram drafter over
prompt + output: at every generated position, the size of the longest match and whether the token
it proposes is the one the target produced. Prints P(accepted | match size) with counts.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

from benchmarks.suite import load_suite, resolve_framing, shipped_suites
from edgespec.drafters.ngram import NgramDrafter
from edgespec.loader import RuntimeOptions
from edgespec.session import Request, Session, frame


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ngram_priors")
    ap.add_argument("--target", default="gemma3-270m")
    ap.add_argument("--skip", type=int, default=5, help="prompts per category the bench uses (left out)")
    ap.add_argument("--per-category", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    by_cat: dict[str, list] = defaultdict(list)
    for suite in ("spec_bench", "code_edit"):
        for pr in load_suite(shipped_suites()[suite]):
            by_cat[pr.category].append(pr)
    skip = {"code_edit": 2}  # the bench's code-edit prompts: the first two
    prompts = [p for cat, ps in by_cat.items() for p in ps[skip.get(cat, args.skip):][: args.per_category]]
    session = Session.load(args.target, RuntimeOptions())
    hits: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    try:
        framing = resolve_framing(session.target, "auto")
        for i, pr in enumerate(prompts):
            req = Request(text=pr.text, framing=framing, draft="none", max_tokens=args.max_tokens)
            prompt = frame(session.target, req).tokens
            out = session.run(req).tokens
            d = NgramDrafter()
            d.begin(prompt)
            ctx = list(prompt)
            for tok in out:
                n = d.hint(ctx)
                if n:
                    prop = d.propose(ctx, 1).tokens
                    hits[n][0] += int(len(prop) and int(prop[0]) == tok)
                    hits[n][1] += 1
                ctx.append(tok)
                d.commit(ctx, 0)
            print(f"[{i + 1}/{len(prompts)}] {pr.id} ({pr.category}): {len(out)} tokens", file=sys.stderr)
    finally:
        session.close()
    print("| match size | accepted | tested | P(accepted) |")
    print("|---|---|---|---|")
    for n in sorted(hits):
        a, t = hits[n]
        print(f"| {n} | {a} | {t} | {a / t:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
