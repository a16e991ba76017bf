"""Short open-ended answers on the bundled models: is gamma auto ever slower than plain decoding?

    .venv/bin/python -m benchmarks.short_open [--target smollm2-135m gemma3-270m] [--per-category 2] [--repeats 4]

Gamma auto promises never to fall below plain decoding. Short open-ended answers (a translation,
a question, in the model's chat framing where it has a template, greedy) are where that is hardest: a failed draft costs a multi-row pass
and a 30-token answer has no long copy to pay it back (issue 44, item 39). For each prompt (held-out
Spec-Bench prompts: each category's first five are the bench's and are skipped) plain decoding and
n-gram speculation with gamma auto run interleaved, in rotating order, `--repeats` times; it prints
the median of the repeats' tokens/s ratios (each pair ran back to back) per prompt and, to say where the time goes, per configuration the median
seconds per token of: target passes (llama_decode), drafting, verification, and the rest of the step
(the engine's own Python work), plus the passes by row count.
Time it alone: anything else running on the cores makes the figures noise.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from edgespec.models.loader import RuntimeOptions
from edgespec.runtime.errors import run_command
from edgespec.service.session import Request, Session
from edgespec.service.suites import load_suite, shipped_suites

CATEGORIES = ("translation", "qa", "writing")
SKIP = 5  # each category's first five prompts are the bench's
CONFIGS = {"plain": ("none", "0"), "ngram auto": ("ngram", "auto")}


def prompts(per_category: int) -> list:
    by_cat: dict[str, list] = defaultdict(list)
    for pr in load_suite(shipped_suites()["spec_bench"]):
        by_cat[pr.category].append(pr)
    return [pr for cat in CATEGORIES for pr in by_cat.get(cat, [])[SKIP:SKIP + per_category]]


def measure(session: Session, text: str, repeats: int, max_tokens: int) -> dict:
    runs: dict[str, list] = {name: [] for name in CONFIGS}
    names = list(CONFIGS)
    for r in range(repeats):
        for name in names[r % 2:] + names[:r % 2]:
            draft, gamma = CONFIGS[name]
            reply = session.run(Request(text=text, framing="auto", draft=draft, gamma=gamma, max_tokens=max_tokens))
            runs[name].append(reply)
    # each repeat's ngram/plain pair ran back to back: the median of those ratios is less moved by
    # the machine drifting over the minutes of a run than the ratio of the two medians
    out: dict = {"paired": statistics.median(s.stats.tokens_per_s / p.stats.tokens_per_s
                                             for s, p in zip(runs["ngram auto"], runs["plain"], strict=True))}
    for name, replies in runs.items():
        n = max(1, replies[0].stats.generated)
        st = [rp.stats for rp in replies]
        decode = [s.wall_s - s.prefill_s for s in st]
        passes = [sum(sum(v) for v in s.pass_s.values()) for s in st]
        out[name] = {
            "tokens": replies[0].stats.generated,
            "tps": statistics.median(s.tokens_per_s for s in st),
            "ms_per_token": {
                "passes": 1e3 * statistics.median(passes) / n,
                "draft": 1e3 * statistics.median(s.draft_s for s in st) / n,
                "verify": 1e3 * statistics.median(s.verify_s for s in st) / n,
                "rest": 1e3 * statistics.median(d - p - s.draft_s - s.verify_s for d, p, s in zip(decode, passes, st, strict=True)) / n,
            },
            "rows": {k: (len(st[0].pass_s[k]), 1e3 * statistics.median([t for s in st for t in s.pass_s.get(k, [])]))
                     for k in sorted(st[0].pass_s)},
            "drafted": st[-1].drafted, "accepted": st[-1].accepted,
            "same": replies[0].tokens == runs["plain"][0].tokens,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=160)
    args = ap.parse_args(argv)
    chosen = prompts(args.per_category)
    for target in args.target:
        session = Session.load(target, RuntimeOptions())
        try:
            for draft, gamma in CONFIGS.values():  # untimed: profile, caches, allocations
                session.run(Request(text=chosen[0].text, framing="auto", draft=draft, gamma=gamma, max_tokens=8))
            print(f"\n## {target}\n")
            print("| prompt | tokens | ngram/plain | drafted/accepted | ms/token plain: pass, rest | "
                  "ngram: pass, draft, verify, rest | ngram passes: rows x n (median ms) |")
            print("|---|---|---|---|---|---|---|")
            ratios = []
            for pr in chosen:
                m = measure(session, pr.text, args.repeats, args.max_tokens)
                p, s = m["plain"], m["ngram auto"]
                ratio = m["paired"]
                ratios.append(ratio)
                pm, sm = p["ms_per_token"], s["ms_per_token"]
                rows = ", ".join(f"{k}x{n} ({ms:.1f})" for k, (n, ms) in s["rows"].items())
                print(f"| {pr.id} {pr.category} | {p['tokens']} | {ratio:.3f}x{'' if s['same'] else ' (differs)'} "
                      f"| {s['drafted']}/{s['accepted']} | {pm['passes']:.2f}, {pm['rest']:.2f} "
                      f"| {sm['passes']:.2f}, {sm['draft']:.2f}, {sm['verify']:.2f}, {sm['rest']:.2f} | {rows} |",
                      flush=True)
            print(f"\n{target}: median {statistics.median(ratios):.3f}x, worst {min(ratios):.3f}x "
                  f"over {len(ratios)} prompts ({args.repeats} interleaved repeats each)")
        finally:
            session.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))  # a bad model name: one line, exit 1
