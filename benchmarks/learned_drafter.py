"""Figures for the learned drafter (docs/learned_drafter.md).

  python -m benchmarks.learned_drafter summary RESULTS.json [RESULTS.json ...]
      per bench configuration: median and minimum speedup over prompts, alpha, c, tokens per target
      call, and what the same alpha and c would give where a K-row pass costs what a 1-row pass does
      (a GPU-like T(K) = T(1); the paper's formula, a prediction, not a measurement).

  python -m benchmarks.learned_drafter sampled --target T --draft learned:DIR [--temperature 0.8]
      acceptance of the same drafter at temperature > 0 with the lossless rejection sampler and with
      exact-match verification, on the same prompts, seeds and draft length.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.report import BASELINE, REF_LOOKUP, REF_PLAIN
from edgespec.errors import EdgeSpecError, run_command


def flat_speedup(alpha: float, c: float, gamma_max: int = 16) -> tuple[int, float]:
    """Best (gamma, speedup) of S = (1 - a^(g+1)) / ((1 - a)(g c + 1)): T(K) = T(1)."""
    best = (0, 1.0)
    for g in range(1, gamma_max + 1):
        tokens = (1 - alpha ** (g + 1)) / (1 - alpha) if alpha < 1 else g + 1
        s = tokens / (g * c + 1)
        if s > best[1]:
            best = (g, s)
    return best


def summarize(res: dict) -> list[dict]:
    meta = res["meta"]
    t1 = float(meta["verify_cost_s"]["1"])
    rows = []
    names = [c["name"] for c in meta["configs"]] + [REF_LOOKUP]
    for name in names:
        if name in (BASELINE, REF_PLAIN):
            continue
        es = [p["results"][name] for p in res["prompts"] if name in p["results"]]
        if not es:
            continue
        sp = [e["speedup"] for e in es]
        row = {"config": name, "prompts": len(es), "median_speedup": statistics.median(sp), "min_speedup": min(sp),
               "overall_speedup": res["categories"]["overall"][name]["speedup"]}
        drafted = sum(e.get("drafted") or 0 for e in es)
        if "alpha" in es[0]:
            alphas = [e["alpha"] for e in es if e.get("drafted")]
            row["alpha"] = statistics.median(alphas) if alphas else None
            draft_s = sum(e["draft_s"] for e in es if e.get("drafted"))
            drafted_median_runs = sum(e["drafted"] / max(1, len(e["tokens_per_s_runs"])) for e in es if e.get("drafted"))
            row["c"] = (draft_s / drafted_median_runs / t1) if drafted_median_runs else None
            row["tokens_per_call"] = statistics.median(e["tokens_per_call"] for e in es)
            row["drafted"] = drafted
            if row["alpha"] is not None and row["c"] is not None:
                g, s = flat_speedup(row["alpha"], row["c"])
                row["flat_tk_gamma"], row["flat_tk_speedup"] = g, s
        rows.append(row)
    return rows


def summary_markdown(paths: Sequence[str]) -> str:
    lines = []
    for p in paths:
        try:
            res = json.loads(Path(p).read_text())
        except (OSError, ValueError) as exc:
            raise EdgeSpecError(f"cannot read {p}: {exc}") from None
        meta = res["meta"]
        cats = sorted({pr["category"] for pr in res["prompts"]})
        t = meta["verify_cost_s"]
        tk = ", ".join(f"T({k})/T(1) {float(t[str(k)]) / float(t['1']):.2f}" for k in (2, 3, 5) if str(k) in t)
        lines += [f"### {meta['target_description']}: {', '.join(cats)} ({len(res['prompts'])} prompts, "
                  f"{meta['settings']['repeats']} interleaved repeats, {tk})", "",
                  "| drafter | median speedup | min | overall | alpha | c | tokens/call | T(K)=T(1) prediction |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in summarize(res):
            pred = f"{r['flat_tk_speedup']:.2f}x (gamma {r['flat_tk_gamma']})" if "flat_tk_speedup" in r else "-"
            alpha = f"{r['alpha']:.2f}" if r.get("alpha") is not None else "-"
            c = f"{r['c']:.3f}" if r.get("c") is not None else "-"
            tpc = f"{r['tokens_per_call']:.2f}" if "tokens_per_call" in r else "-"
            lines.append(f"| {r['config']} | {r['median_speedup']:.2f}x | {r['min_speedup']:.2f}x | "
                         f"{r['overall_speedup']:.2f}x | {alpha} | {c} | {tpc} | {pred} |")
        lines.append("")
    return "\n".join(lines)


def sampled(target: str, draft: str, temperature: float, gamma: int, max_tokens: int, seeds: int,
            categories: Sequence[str], per_category: int) -> str:
    from edgespec.loader import RuntimeOptions
    from edgespec.sampling import SamplingParams
    from edgespec.session import Request, Session
    from edgespec.suites import load_suites

    session = Session.load(target, RuntimeOptions())
    framing = "question"
    prompts = load_suites(["spec_bench"], list(categories), per_category)
    acc = {"rejection": [0, 0], "match": [0, 0]}
    try:
        for pr in prompts:
            for seed in range(seeds):
                for verifier in ("rejection", "match"):
                    r = session.run(Request(text=pr.text, framing=framing, draft=draft, gamma=str(gamma),
                                            max_tokens=max_tokens, sampling=SamplingParams(temperature, seed=seed),
                                            verifier=verifier))
                    acc[verifier][0] += r.stats.accepted
                    acc[verifier][1] += r.stats.drafted
    finally:
        session.close()
    lines = [f"temperature {temperature}, gamma {gamma}, {len(prompts)} prompts x {seeds} seeds, {max_tokens} tokens, "
             f"drafter {draft}", "", "| verifier | accepted / drafted | acceptance |", "|---|---|---|"]
    for v, (a, d) in acc.items():
        lines.append(f"| {v} | {a} / {d} | {a / d if d else 0:.3f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.learned_drafter")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s1 = sub.add_parser("summary")
    s1.add_argument("results", nargs="+")
    s2 = sub.add_parser("sampled")
    s2.add_argument("--target", required=True)
    s2.add_argument("--draft", required=True)
    s2.add_argument("--temperature", type=float, default=0.8)
    s2.add_argument("--gamma", type=int, default=3)
    s2.add_argument("--max-tokens", type=int, default=96)
    s2.add_argument("--seeds", type=int, default=3)
    s2.add_argument("--category", action="append", default=[])
    s2.add_argument("--per-category", type=int, default=2)
    args = ap.parse_args(argv)

    def go() -> int:
        if args.cmd == "summary":
            print(summary_markdown(args.results))
        else:
            print(sampled(args.target, args.draft, args.temperature, args.gamma, args.max_tokens, args.seeds,
                          args.category or ["writing", "qa", "translation", "reasoning"], args.per_category))
        return 0

    return run_command(go)


if __name__ == "__main__":
    sys.exit(main())
