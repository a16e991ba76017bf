"""What speculation can reach on this machine for a target: the bound set by T(K), before any drafter.

    .venv/bin/python -m benchmarks.ceiling --target qwen2.5-coder-1.5b [--goal 1.25] [--bench RUN.json]

Prints, as Markdown, from the target's stored cost profile (measured if missing; measure it on an
idle machine):
  * T(K)/T(1) for each row count: what verifying K-1 drafts costs in single-token passes;
  * for drafters of cost c (c = one draft token's time over T(1)) and acceptance alpha, the best
    draft length and speedup the one cost model (`CostModel.best_gamma`) predicts here;
  * the acceptance a drafter of each cost needs to reach `--goal` (None: no acceptance does);
  * with `--bench`, each configuration of a bench run (its results.json): its measured alpha by
    draft depth and draft cost (the 'overall' cell: every prompt's Stats merged), and the best it
    could give here with those.
The same numbers are what gamma auto uses to decline a drafter.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from edgespec.core.costs import CostModel
from edgespec.models.loader import RuntimeOptions, load_model
from edgespec.runtime.profiles import profile_rows

ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
COSTS = (0.0, 0.01, 0.05, 0.2, 0.6)


def needed_alpha(costs: CostModel, c: float, goal: float) -> float | None:
    """The smallest acceptance (to 0.001) whose best draft length reaches `goal`; None if even
    alpha = 1 does not."""
    if costs.best_gamma(1.0, c=c)[1] < goal:
        return None
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-3:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if costs.best_gamma(mid, c=c)[1] >= goal else (mid, hi)
    return round(hi, 3)


def ratio_table(costs: CostModel, rows: Sequence[int]) -> list[str]:
    head = "| K | " + " | ".join(str(k) for k in rows) + " |"
    sep = "|---|" + "---|" * len(rows)
    vals = "| T(K)/T(1) | " + " | ".join(f"{costs.t_ratio(k):.2f}" for k in rows) + " |"
    return [head, sep, vals]


def grid(costs: CostModel, goal: float) -> list[str]:
    out = ["| c \\ alpha | " + " | ".join(f"{a:g}" for a in ALPHAS) + f" | alpha for {goal:g}x |",
           "|---|" + "---|" * (len(ALPHAS) + 1)]
    for c in COSTS:
        cells = []
        for a in ALPHAS:
            g, s = costs.best_gamma(a, c=c, drafting=True)
            cells.append(f"{s:.2f}x (g={g})")
        need = needed_alpha(costs, c, goal)
        out.append(f"| {c:g} | " + " | ".join(cells) + f" | {'none' if need is None else need} |")
    return out


def bench_rows(costs: CostModel, run: dict) -> list[str]:
    """One row per configuration of a bench run that drafted, pooled over its prompts ('overall':
    categories.overall.<configuration>.stats.alpha_by_depth and .draft_cost)."""
    out = ["| configuration | alpha by depth | draft cost c | best here (gamma) | measured |",
           "|---|---|---|---|---|"]
    overall = run.get("categories", {}).get("overall", {})
    for name, row in overall.items():
        depths = [a for a in (row.get("stats") or {}).get("alpha_by_depth", []) if a is not None]
        c = row.get("draft_cost")
        if not depths or c is None:
            continue
        g, s = costs.best_gamma(depths, c=c, drafting=True)
        shown = "/".join(f"{a:.2f}" for a in depths[:8])
        out.append(f"| {name} | {shown} | {c:.3f} | {s:.2f}x ({g}) | {row.get('speedup', 0):.2f}x |")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from edgespec.apps.args import Parser
    from edgespec.runtime.errors import run_command

    ap = Parser(prog="python -m benchmarks.ceiling", description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True, help="target model: .gguf path or catalog name")
    ap.add_argument("--goal", type=float, default=1.25, help="speedup to find the needed acceptance for (default 1.25)")
    ap.add_argument("--bench", default=None, help="a bench run's results.json (python app.py bench --out DIR)")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)

    def go() -> int:
        model = load_model(args.target, RuntimeOptions(n_ctx=1024, n_threads=args.threads))
        try:
            costs = CostModel.for_target(model)
        finally:
            model.close()
        rows = [k for k in profile_rows(costs.gamma_max + 1) if k <= 17 or k in (24, 32, 64)]
        lines = [f"# What speculation can reach here: {args.target}", "",
                 f"T(1) = {1000 * costs.seconds(1):.1f} ms (stored profile).", ""]
        lines += ratio_table(costs, rows)
        lines += ["", "Best draft length and speedup by draft cost c and acceptance alpha (one alpha at every depth):", ""]
        lines += grid(costs, args.goal)
        if args.bench:
            with open(args.bench) as f:
                run = json.load(f)
            lines += ["", "Measured drafters (alpha by depth and c from the bench run; the best draft length with them):", ""]
            lines += bench_rows(costs, run)
        print("\n".join(lines))
        return 0

    return run_command(go)


if __name__ == "__main__":
    sys.exit(main())
