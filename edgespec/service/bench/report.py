"""Benchmark outputs: results.json, report.md (tables per category, Spec-Bench leaderboard style)
and plots (speedup per category, measured vs predicted speedup, T(K)/T(1) cost curve).

T(K) in a report is the machine's stored cost profile (`edgespec.runtime.profiles`), the one gamma auto planned
with; `--verify-cost` output is a fresh measurement (`profiles.measure_pass_costs`). Acceptance, alpha
and the other per-token figures are read from each row's merged `Stats` ("stats", its `to_dict`),
never recomputed here."""

from __future__ import annotations

import json
import os
from pathlib import Path

from edgespec.core.stats import speedup

# Names of the configurations every run has (the bench builds them, the report lays them out).
BASELINE = "baseline"
REF_PLAIN = "llama-cpp-python"
REF_LOOKUP = "llama-cpp-python lookup"
PLOTS = ("speedup_by_category.png", "measured_vs_predicted.png", "verify_cost.png")


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "–" if x is None else format(x, spec)


def _stats_cells(c: dict) -> list[str]:
    """acceptance, alpha, mean accepted and target calls of a row or cell, from its Stats; '–' where
    it has none (llama-cpp-python), nothing was drafted, or no target call was counted (llama.cpp)."""
    st = c.get("stats")
    drafted = bool(st and st["drafted"])
    calls = bool(st and st["target_calls"])
    return [_fmt(st["acceptance_rate"] if drafted else None), _fmt(st["alpha"] if drafted and calls else None),
            _fmt(st["mean_accepted"] if calls else None), str(st["target_calls"]) if calls else "–"]


def _write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file so an interrupted write never leaves half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def report_markdown(res: dict) -> str:
    cats = res["categories"]
    names = [c["name"] for c in res["meta"]["configs"]]
    order = [c for c in cats if c != "overall"] + (["overall"] if "overall" in cats else [])
    lines = _header(res) + _speedup_table(cats, names, order)
    for cat in order:
        lines += _category_table(cat, cats[cat], names)
    lines += llamacpp_section(res)
    if res["meta"]["settings"]["temperature"] == 0:
        lines += _divergence_section(res)
    if res["skipped"]:
        lines += ["", "## Skipped", ""] + [f"- {s['id']}: {s['reason']}" for s in res["skipped"]]
    lines += _cost_section(res["meta"]["verify_cost_s"])
    return "\n".join(lines) + "\n"


def _header(res: dict) -> list[str]:
    """The run's settings and machine, how the figures are made, and warnings about the cost profile."""
    meta = res["meta"]
    st = meta["settings"]
    lines = [
        "# EdgeSpec benchmark",
        "",
        f"- target: `{Path(meta['target']).name}` ({meta['target_description']})",
        f"- suites: {', '.join(f'`{s}`' for s in st['suites'])}; prompts: {meta['prompts_done']} of "
        f"{meta['prompts_total']}{' (interrupted)' if meta['interrupted'] else ''}"
        + (f"; skipped {len(res['skipped'])}" if res["skipped"] else ""),
        f"- framing: {meta.get('framing', st['framing'])}; temperature {st['temperature']}; max tokens "
        f"{st['max_tokens']}; repeats {st['repeats']} (interleaved, rotating order, medians)",
        f"- machine: {meta['cpu_count']} CPUs, {meta['platform']}; started {meta['started']}",
        "",
        "Speedup = decode tokens/s over the baseline's on the same prompts in the same run "
        "(category rate = total tokens / total decode seconds). llama-cpp-python rows: its plain "
        "`Llama` and its `LlamaPromptLookupDecoding`; 'own' = over its own plain run. Acceptance "
        "(accepted / drafted), alpha (accepted / tested), mean accepted and target calls pool every "
        "repeat and prompt; predicted = the cost model at those pooled figures.",
        "",
    ]
    if meta.get("verify_cost_suspect"):
        lines += ["**Warning:** T(1) of the stored cost profile is over twice the baseline's seconds per token "
                  "(the profile was measured under machine load): predicted speedups are unreliable; "
                  "EDGESPEC_RECALIBRATE=1 measures it again.", ""]
    if meta.get("cost_profile_changed"):
        lines += ["**Note:** the stored cost profile was measured again during the run (the session found it "
                  "slower than the machine's single-token passes); T(K) below is the one at the start, and "
                  "later runs were predicted with the new one.", ""]
    return lines


def _speedup_table(cats: dict, names: list[str], order: list[str]) -> list[str]:
    """Speedup of every configuration (rows) in every category (columns)."""
    lines = [
        "## Speedup per category",
        "",
        "| configuration | " + " | ".join(order) + " |",
        "|---|" + "---|" * len(order),
    ]
    for name in names:
        cells = []
        for cat in order:
            cell = cats[cat][name]
            txt = f"{cell['speedup']:.2f}x"
            if name == REF_LOOKUP:
                txt += f" (own {cell['speedup_vs_own_baseline']:.2f}x)"
            cells.append(txt)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _category_table(cat: str, row: dict, names: list[str]) -> list[str]:
    """One category's figures per configuration."""
    lines = [
        "",
        f"## {cat}",
        "",
        "| configuration | tok/s | speedup | predicted | acceptance | alpha | mean accepted | target calls | identical |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        c = row[name]
        ident = f"{c['identical']}/{c['prompts']}" if "identical" in c else "–"
        if c.get("divergences"):
            ident += f" ({c['near_tie_divergences']}/{c['divergences']} near-tie)"
        cells = [f"{c['tokens_per_s']:.1f}", f"{c['speedup']:.2f}x", _fmt(c.get("predicted_speedup")),
                 *_stats_cells(c), ident]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _divergence_section(res: dict) -> list[str]:
    """Greedy runs: where each output that differs from the baseline's does, and whether the
    baseline itself varied between repeats."""
    divs = [
        (p["id"], name, d)
        for p in res["prompts"]
        for name, e in p["results"].items()
        for d in e.get("divergences", [])
    ]
    lines = ["", "## Greedy outputs that differ from the baseline", ""]
    if divs:
        lines += [
            "| prompt | configuration | position | baseline token | candidate token | top-2 logit gap | near-tie |",
            "|---|---|---|---|---|---|---|",
        ]
        for pid, name, d in divs:
            lines.append(
                f"| {pid} | {name} | {d['position']} | {d['baseline_token']} | {d['candidate_token']} | "
                f"{d['top2_gap']:.3f} | {'yes' if d['near_tie'] else '**no**'} |"
            )
    else:
        lines.append("None: every configuration produced the baseline's tokens on every prompt.")
    unstable = [p["id"] for p in res["prompts"] if not p["baseline_stable"]]
    if unstable:
        lines.append(f"\nBaseline output varied between repeats on: {', '.join(unstable)}")
    return lines


def _cost_section(costs: dict[str, float]) -> list[str]:
    """T(K)/T(1) of the stored cost profile at a few K (none when the run has no profile)."""
    if not costs:
        return []
    t1 = costs["1"]
    ks = [k for k in ("2", "3", "5", "8", "9", "16", "17", "24", "32", "48", "64") if k in costs]
    return [
        "",
        "## Verification cost T(K)/T(1) on this machine",
        "",
        "From the stored cost profile that gamma auto and the predicted speedups use "
        "(`python app.py bench --verify-cost` measures afresh).",
        "",
        "| K | " + " | ".join(ks) + " |",
        "|---|" + "---|" * len(ks),
        "| T(K)/T(1) | " + " | ".join(f"{costs[k] / t1:.2f}" for k in ks) + " |",
    ]


def versus_llamacpp(res: dict) -> list[dict]:
    """Per prompt and configuration of ours: its speedup, the best llama.cpp speculation type's and
    the ratio of the two (medians of the same run). Empty when no llama.cpp reference ran."""
    kinds = {c["name"]: c["kind"] for c in res["meta"]["configs"]}
    ours = [n for n, k in kinds.items() if k == "ours"]
    refs = [n for n, k in kinds.items() if k == "llama.cpp"]
    rows: list[dict] = []
    if not refs:
        return rows
    for p in res["prompts"]:
        r = p["results"]
        best = max(refs, key=lambda n: r[n]["tokens_per_s"])
        for name in ours:
            rows.append({
                "id": p["id"], "category": p["category"], "config": name,
                "speedup": r[name]["speedup"], "best_reference": best, "reference_speedup": r[best]["speedup"],
                "ratio": speedup(r[name]["tokens_per_s"], r[best]["tokens_per_s"]),
                "references": {n: r[n]["speedup"] for n in refs},
            })
    return rows


def llamacpp_section(res: dict) -> list[str]:
    rows = versus_llamacpp(res)
    if not rows:
        return []
    refs = list(rows[0]["references"])
    lines = [
        "",
        "## EdgeSpec vs llama.cpp's own speculation",
        "",
        "llama.cpp rows: `llama-speculative-simple --spec-type T` built from the same vendored llama.cpp and run "
        "on the same shared libraries (scripts/build_reference.sh); speedups over EdgeSpec's baseline. "
        "'vs best' = EdgeSpec tok/s over the fastest llama.cpp type's on that prompt.",
        "",
        "| prompt | EdgeSpec | " + " | ".join(n.removeprefix("llama.cpp ") for n in refs) + " | vs best |",
        "|---|---|" + "---|" * len(refs) + "---|",
    ]
    for r in rows:
        cells = " | ".join(f"{r['references'][n]:.2f}x" for n in refs)
        lines.append(f"| {r['id']} ({r['config']}) | {r['speedup']:.2f}x | {cells} | **{r['ratio']:.2f}x** |")
    ratios = sorted(r["ratio"] for r in rows)
    lines += ["", f"vs best: median {ratios[(len(ratios) - 1) // 2]:.2f}x, min {ratios[0]:.2f}x over {len(rows)} prompt runs."]
    return lines


def summary_lines(res: dict) -> list[str]:
    """A few lines for the terminal: overall speedup per configuration."""
    overall = res["categories"].get("overall")
    if not overall:
        return ["no prompts finished"]
    out = []
    for name, c in overall.items():
        extra = f", own baseline {c['speedup_vs_own_baseline']:.2f}x" if "speedup_vs_own_baseline" in c else ""
        ident = f", identical {c['identical']}/{c['prompts']}" if "identical" in c else ""
        extra += " (drafted nothing: plain decoding)" if c.get("no_drafts") else ""
        out.append(f"{name:28s} {c['tokens_per_s']:7.1f} tok/s  {c['speedup']:.2f}x{extra}{ident}")
    vs = versus_llamacpp(res)
    if vs:
        ratios = sorted(r["ratio"] for r in vs)
        out.append(f"EdgeSpec vs best llama.cpp type, per prompt: median {ratios[(len(ratios) - 1) // 2]:.2f}x, "
                   f"min {ratios[0]:.2f}x ({len(vs)} prompt runs)")
    return out


def write_outputs(res: dict, out: Path, costs: dict[int, float], plots: bool) -> None:
    _write_atomic(out / "results.json", json.dumps(res, indent=1, ensure_ascii=False))
    _write_atomic(out / "report.md", report_markdown(res))
    if plots and res["prompts"]:
        write_plots(res, out, costs)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(res: dict, out: Path, costs: dict[int, float]) -> None:
    plt = _pyplot()
    cats = res["categories"]
    names = [c["name"] for c in res["meta"]["configs"] if c["name"] != BASELINE]
    order = [c for c in cats if c != "overall"] + ["overall"]

    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(order)), 4))
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(order))]
        ax.bar(xs, [cats[c][name]["speedup"] for c in order], width, label=name)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(order)), order, rotation=20)
    ax.set_ylabel("speedup over baseline (decode tok/s)")
    ax.set_title(f"Speedup per category — {Path(res['meta']['target']).name}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / PLOTS[0], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 5))
    top = 1.0
    for name in names:
        pts = [
            (p["results"][name]["predicted_speedup"], p["results"][name]["speedup"])
            for p in res["prompts"]
            if p["results"][name].get("predicted_speedup") is not None
        ]
        if pts:
            ax.scatter(*zip(*pts, strict=True), label=name, s=18)
            top = max(top, *(max(a, b) for a, b in pts))
    ax.plot([0, top * 1.05], [0, top * 1.05], color="grey", lw=0.8, ls="--")
    ax.set_xlabel("predicted speedup (measured alpha, c, T(K))")
    ax.set_ylabel("measured speedup")
    ax.set_title("Measured vs predicted, per prompt")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / PLOTS[1], dpi=110)
    plt.close(fig)

    _cost_plot(costs, out / PLOTS[2], Path(res["meta"]["target"]).name)


def _cost_plot(costs: dict[int, float], path: Path, title: str) -> None:
    plt = _pyplot()
    ks = sorted(costs)
    t1 = costs[1]
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot(ks, [costs[k] / t1 for k in ks], marker="o", ms=3, label="measured T(K)/T(1)")
    ax.plot(ks, ks, color="grey", ls="--", lw=0.8, label="K (compute-bound)")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xlabel("rows verified in one pass (K)")
    ax.set_ylabel("T(K) / T(1)")
    ax.set_title(f"Verification cost — {title}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def verify_cost_markdown(res: dict) -> str:
    lines = [
        f"Verification cost on this machine: {Path(res['target']).name} ({res['target_description']}), "
        f"median of {res['repeats']} interleaved repeats",
        "",
        "| K | T(K) ms | T(K)/T(1) | K·T(1)/T(K) |",
        "|---|---|---|---|",
    ]
    for r in res["rows"]:
        lines.append(f"| {r['k']} | {1000 * r['seconds']:.2f} | {r['t_ratio']:.2f} | {r['ceiling_speedup']:.2f} |")
    lines += [
        "",
        f"Ceiling: at perfect acceptance and free drafting, speculation can reach at most "
        f"{res['ceiling_speedup']:.2f}x (verifying K = {res['best_k']} rows per pass).",
    ]
    return "\n".join(lines)


def write_verify_cost(res: dict, out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        from edgespec.runtime.errors import EdgeSpecError

        raise EdgeSpecError(f"cannot create output folder {out}: {exc.strerror}") from None
    _write_atomic(out / "verify_cost.json", json.dumps(res, indent=1))
    _write_atomic(out / "verify_cost.md", verify_cost_markdown(res) + "\n")
    _cost_plot({r["k"]: r["seconds"] for r in res["rows"]}, out / "verify_cost.png", Path(res["target"]).name)
