"""Figures for the learned drafter (docs/learned_drafter.md).

  python -m benchmarks.learned_drafter summary RESULTS.json [RESULTS.json ...]
      per bench configuration: median and minimum speedup over prompts, and from its 'overall' cell
      (the Stats of every prompt and repeat merged) alpha, c and tokens per target call, and what the
      same alpha and c would give where a K-row pass costs what a 1-row pass does (a GPU-like
      T(K) = T(1), `CostModel.flat`: a prediction, not a measurement).

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

from edgespec.core.costs import CostModel
from edgespec.core.stats import Stats
from edgespec.runtime.errors import EdgeSpecError, run_command
from edgespec.service.bench.report import BASELINE, REF_LOOKUP, REF_PLAIN

FLAT_GAMMA_MAX = 16  # longest draft of the T(K) = T(1) prediction


def summarize(res: dict) -> list[dict]:
    meta = res["meta"]
    rows = []
    names = [c["name"] for c in meta["configs"]] + [REF_LOOKUP]
    for name in names:
        if name in (BASELINE, REF_PLAIN):
            continue
        es = [p["results"][name] for p in res["prompts"] if name in p["results"]]
        if not es:
            continue
        sp = [e["speedup"] for e in es]
        overall = res["categories"]["overall"][name]
        row = {"config": name, "prompts": len(es), "median_speedup": statistics.median(sp), "min_speedup": min(sp),
               "overall_speedup": overall["speedup"]}
        if "draft_cost" in overall:  # ours with a drafter
            st = overall["stats"]
            row["alpha"] = st["alpha"] if st["drafted"] else None
            row["c"] = overall["draft_cost"]
            row["tokens_per_call"] = st["tokens_per_call"]
            row["drafted"] = st["drafted"]
            if row["alpha"] is not None and row["c"] is not None:
                g, s = CostModel.flat(row["c"]).best_gamma(row["alpha"], FLAT_GAMMA_MAX)
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
    from edgespec.core.sampling import SamplingParams
    from edgespec.models.loader import RuntimeOptions
    from edgespec.service.session import Request, Session
    from edgespec.service.suites import load_suites

    session = Session.load(target, RuntimeOptions())
    framing = "question"
    prompts = load_suites(["spec_bench"], list(categories), per_category)
    stats: dict[str, list[Stats]] = {"rejection": [], "match": []}
    try:
        for pr in prompts:
            for seed in range(seeds):
                for verifier in ("rejection", "match"):
                    r = session.run(Request(text=pr.text, framing=framing, draft=draft, gamma=str(gamma),
                                            max_tokens=max_tokens, sampling=SamplingParams(temperature, seed=seed),
                                            verifier=verifier))
                    stats[verifier].append(r.stats)
    finally:
        session.close()
    lines = [f"temperature {temperature}, gamma {gamma}, {len(prompts)} prompts x {seeds} seeds, {max_tokens} tokens, "
             f"drafter {draft}", "", "| verifier | accepted / drafted | acceptance |", "|---|---|---|"]
    for v, runs in stats.items():
        st = Stats.merge(runs)
        lines.append(f"| {v} | {st.accepted} / {st.drafted} | {st.acceptance_rate:.3f} |")
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
