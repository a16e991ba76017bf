"""`python app.py bench`: baseline vs speculative decoding over prompt suites, against
llama-cpp-python's own prompt lookup, with JSON, Markdown and plots.

Timing discipline (the machine is shared and small, so absolute tokens/s are noise): for each
prompt every configuration runs `repeats` times in a rotating order (baseline, c1, c2, ... then
c1, c2, ..., baseline, ...), the median tokens/s per configuration is kept, and every speedup is
a ratio of medians measured on the same prompt in the same run.

`python app.py bench --verify-cost` measures T(K), the seconds of one target pass over K rows,
and the best speedup speculation could give on this machine at perfect acceptance.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from edgespec.bench_suite import FRAMINGS, Prompt, load_suites, tokenize_prompt
from edgespec.errors import EdgeSpecError

BASELINE = "baseline"
REF_PLAIN = "llama-cpp-python"
REF_LOOKUP = "llama-cpp-python lookup"


@dataclass
class BenchSettings:
    suites: list[str]
    target: str
    drafts: list[str] = field(default_factory=lambda: ["ngram"])
    gammas: list[str] = field(default_factory=lambda: ["auto"])
    ngram: tuple[int, int] = (1, 16)
    categories: list[str] = field(default_factory=list)
    per_category: int | None = None
    temperature: float = 0.0
    seed: int | None = None
    max_tokens: int = 128
    repeats: int = 3
    framing: str = "auto"
    reference: bool = True
    lookup_tokens: int = 10
    lookup_ngram: int = 2
    n_ctx: int = 4096
    n_threads: int | None = None
    flash_attn: str = "auto"
    exact: bool = False

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise EdgeSpecError(f"--repeats must be >= 1, got {self.repeats}")
        if self.max_tokens < 1:
            raise EdgeSpecError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise EdgeSpecError(f"--temperature must be >= 0, got {self.temperature}")
        if self.lookup_tokens < 1:
            raise EdgeSpecError(f"--lookup-tokens must be >= 1, got {self.lookup_tokens}")
        if self.framing not in FRAMINGS:
            raise EdgeSpecError(f"--framing must be one of {', '.join(FRAMINGS)}, got {self.framing!r}")
        if not self.drafts or any(d.strip() == "none" for d in self.drafts):
            raise EdgeSpecError("--draft names a candidate drafter (ngram or a draft model); the baseline always runs")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Config:
    """One way of generating that is timed on every prompt."""

    name: str
    kind: str  # 'baseline' | 'ours' | 'reference'
    draft: str = "none"
    gamma: str = "0"


@dataclass
class Run:
    """One timed generation: token ids, decode tokens/s and (for ours) the engine's stats."""

    tokens: list[int]
    tokens_per_s: float
    stats: dict | None = None
    predicted_speedup: float | None = None


def configs_for(s: BenchSettings) -> list[Config]:
    out = [Config(BASELINE, "baseline")]
    for d in s.drafts:
        for g in s.gammas:
            out.append(Config(f"{Path(d).name if d.endswith('.gguf') else d} g={g}", "ours", d, g))
    if s.reference:
        out += [Config(REF_PLAIN, "reference"), Config(REF_LOOKUP, "reference")]
    return out


def predicted_speedup(stats: dict, costs: dict[int, float]) -> float | None:
    """Speedup the paper's formula predicts from this run's measured quantities.

    Each step that drafted k tokens yields E(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha) tokens on
    average and costs k c + T(k+1)/T(1) single-token passes, so over the run's draft-length
    histogram n_k:  S = sum n_k E(alpha, k) / sum n_k (k c + T(k+1)/T(1)),
    with alpha the measured acceptance rate, c = (draft seconds per drafted token) / T(1), and T(K)
    from `measure_pass_costs` (the largest measured K stands in for larger ones, scaled linearly).
    """
    from edgespec.theory import expected_tokens

    hist = {int(k): n for k, n in stats["gamma_hist"].items()}
    if not hist or 1 not in costs:
        return None
    t1 = costs[1]
    kmax = max(costs)
    alpha = stats["acceptance_rate"]
    c = stats["draft_s"] / stats["drafted"] / t1 if stats["drafted"] else 0.0

    def t_ratio(rows: int) -> float:
        return (costs[rows] if rows in costs else costs[kmax] * rows / kmax) / t1

    tokens = sum(n * expected_tokens(alpha, k) for k, n in hist.items())
    cost = sum(n * (k * c + t_ratio(k + 1)) for k, n in hist.items())
    return tokens / cost


class Runner:
    """Loads the target once and runs every configuration on it (references get their own contexts)."""

    def __init__(self, s: BenchSettings, log: Callable[[str], None]) -> None:
        from edgespec.factory import RuntimeOptions, load_model, make_drafter

        self.s = s
        self.opts = RuntimeOptions(n_ctx=s.n_ctx, n_threads=s.n_threads, flash_attn=s.flash_attn, exact=s.exact)
        log(f"loading {s.target}")
        self.target = load_model(s.target, self.opts)
        self.configs = configs_for(s)
        self.drafters = {}
        for cfg in self.configs:
            if cfg.kind == "ours" and cfg.draft not in self.drafters:
                log(f"loading drafter {cfg.draft}")
                self.drafters[cfg.draft] = make_drafter(cfg.draft, self.target, self.opts, s.ngram)
        self.refs = {}
        if s.reference:
            from edgespec.bench_reference import Reference

            log("loading llama-cpp-python references")
            for cfg, lookup in ((REF_PLAIN, False), (REF_LOOKUP, True)):
                self.refs[cfg] = Reference(
                    self.target,
                    lookup=lookup,
                    n_ctx=self.target.n_ctx,
                    n_threads=self.target.n_threads,
                    flash_attn=self.target.flash_attn != "off",
                    num_pred_tokens=s.lookup_tokens,
                    max_ngram_size=s.lookup_ngram,
                )
        fixed = [int(g) for g in s.gammas if g.strip().lower() != "auto"]
        self.max_rows = max([17, *(g + 1 for g in fixed)])  # AutoGamma drafts up to 16
        log(f"measuring T(K) for K = 1..{self.max_rows}")
        self.costs = measure_costs(self.target, list(range(1, self.max_rows + 1)), repeats=2)

    def run(self, cfg: Config, prompt: Sequence[int], max_tokens: int | None = None) -> Run:
        from edgespec.engine import Engine, GenerationConfig, collect
        from edgespec.factory import parse_gamma
        from edgespec.sampling import SamplingParams

        s = self.s
        n = max_tokens or s.max_tokens
        if cfg.kind == "reference":
            r = self.refs[cfg.name].generate(prompt, n, s.temperature, s.seed)
            return Run(r.tokens, r.tokens_per_s)
        drafter = self.drafters.get(cfg.draft)
        gamma = parse_gamma(cfg.gamma)  # a fresh policy per run: no learning carried across prompts
        engine = Engine(self.target, drafter, gamma)
        gen = GenerationConfig(max_tokens=n, sampling=SamplingParams(temperature=s.temperature, seed=s.seed))
        res = collect(engine.generate(prompt, gen))
        stats = res.stats.to_dict()
        pred = predicted_speedup(stats, self.costs) if drafter is not None else None
        return Run(res.tokens, res.stats.tokens_per_s, stats, pred)

    def close(self) -> None:
        for ref in self.refs.values():
            ref.close()
        for d in self.drafters.values():
            if d is not None:
                d.close()


def measure_costs(model, rows: list[int], repeats: int) -> dict[int, float]:
    from edgespec.profile import measure_pass_costs

    return measure_pass_costs(model, rows, repeats=repeats)


def _median_run(runs: list[Run]) -> Run:
    order = sorted(runs, key=lambda r: r.tokens_per_s)
    return order[(len(order) - 1) // 2]


def bench_prompt(runner: Runner, pr: Prompt, tokens: list[int], stop: threading.Event | None) -> dict | None:
    """Time every configuration on one prompt (interleaved, rotating order) and compare outputs."""
    from edgespec.exactness import explain_divergence

    s = runner.s
    cfgs = runner.configs
    runs: dict[str, list[Run]] = {c.name: [] for c in cfgs}
    for r in range(s.repeats):
        shift = r % len(cfgs)
        for cfg in cfgs[shift:] + cfgs[:shift]:
            if stop is not None and stop.is_set():
                return None
            runs[cfg.name].append(runner.run(cfg, tokens))

    base_runs = runs[BASELINE]
    base_tokens = base_runs[0].tokens
    base_tps = statistics.median(r.tokens_per_s for r in base_runs)
    results = {}
    for cfg in cfgs:
        rs = runs[cfg.name]
        tps = statistics.median(r.tokens_per_s for r in rs)
        rep = _median_run(rs)
        entry: dict = {
            "kind": cfg.kind,
            "tokens_per_s": tps,
            "tokens_per_s_runs": [r.tokens_per_s for r in rs],
            "speedup": tps / base_tps,
            "generated": len(rep.tokens),
            "tokens": rs[0].tokens,
            "text": runner.target.detokenize(rs[0].tokens),
        }
        if rep.stats is not None:
            drafted = sum(r.stats["drafted"] for r in rs)
            accepted = sum(r.stats["accepted"] for r in rs)
            calls = sum(r.stats["target_calls"] for r in rs)
            entry.update(
                drafted=drafted,  # summed over repeats, like accepted
                accepted=accepted,
                acceptance_rate=accepted / drafted if drafted else None,
                mean_accepted=accepted / calls if calls else None,
                target_calls=rep.stats["target_calls"],
                tokens_per_call=rep.stats["tokens_per_call"],
                gamma_hist=rep.stats["gamma_hist"],
                predicted_speedup=rep.predicted_speedup,
            )
        if s.greedy:
            distinct = {tuple(r.tokens) for r in rs}
            entry["identical"] = distinct == {tuple(base_tokens)}
            entry["divergences"] = []
            for seq in sorted(distinct - {tuple(base_tokens)}):
                div = explain_divergence(runner.target, tokens, base_tokens, list(seq))
                entry["divergences"].append(div.to_dict())
        results[cfg.name] = entry
    if REF_PLAIN in results:
        own = results[REF_PLAIN]["tokens_per_s"]
        for name in (REF_PLAIN, REF_LOOKUP):
            results[name]["speedup_vs_own_baseline"] = results[name]["tokens_per_s"] / own
        if s.greedy:
            own_tokens = {tuple(r.tokens) for r in runs[REF_PLAIN]}
            results[REF_LOOKUP]["identical_to_own_baseline"] = {tuple(r.tokens) for r in runs[REF_LOOKUP]} == own_tokens
    return {
        "id": pr.id,
        "category": pr.category,
        "prompt_tokens": len(tokens),
        "baseline_stable": len({tuple(r.tokens) for r in base_runs}) == 1,
        "results": results,
    }


def aggregate(prompts: list[dict], names: list[str]) -> dict:
    """Per-category (and 'overall') totals: tokens/s = total tokens / total decode seconds of the
    median runs; speedup = that rate over the baseline's rate on the same prompts."""
    groups: dict[str, list[dict]] = {}
    for p in prompts:
        groups.setdefault(p["category"], []).append(p)
    if prompts:
        groups["overall"] = list(prompts)
    out: dict = {}
    for cat, ps in groups.items():
        row: dict = {}
        for name in names:
            es = [p["results"][name] for p in ps]
            gen = sum(e["generated"] for e in es)
            secs = sum(e["generated"] / e["tokens_per_s"] for e in es if e["tokens_per_s"] > 0)
            cell: dict = {"prompts": len(es), "generated": gen, "tokens_per_s": gen / secs if secs else 0.0}
            if es[0].get("acceptance_rate") is not None or "target_calls" in es[0]:
                calls = sum(e["target_calls"] for e in es)
                cell["target_calls"] = calls
                acc = [e["acceptance_rate"] for e in es if e.get("acceptance_rate") is not None]
                cell["acceptance_rate"] = statistics.mean(acc) if acc else None
                cell["mean_accepted"] = statistics.mean(e["mean_accepted"] or 0.0 for e in es)
                pred = [e["predicted_speedup"] for e in es if e.get("predicted_speedup") is not None]
                cell["predicted_speedup"] = statistics.mean(pred) if pred else None
            if "identical" in es[0]:
                cell["identical"] = sum(bool(e["identical"]) for e in es)
                divs = [d for e in es for d in e["divergences"]]
                cell["divergences"] = len(divs)
                cell["near_tie_divergences"] = sum(d["near_tie"] for d in divs)
            row[name] = cell
        base = row[BASELINE]["tokens_per_s"]
        for name in names:
            row[name]["speedup"] = row[name]["tokens_per_s"] / base if base else 0.0
        if REF_PLAIN in row:
            own = row[REF_PLAIN]["tokens_per_s"]
            for name in (REF_PLAIN, REF_LOOKUP):
                row[name]["speedup_vs_own_baseline"] = row[name]["tokens_per_s"] / own if own else 0.0
        out[cat] = row
    return out


def run_bench(
    s: BenchSettings,
    out_dir: str | Path,
    progress: Callable[[int, int, str], None] | None = None,
    log: Callable[[str], None] = lambda m: None,
    stop: threading.Event | None = None,
) -> dict:
    """Run the suite and write results.json, report.md and plots into `out_dir`.

    Ctrl-C (KeyboardInterrupt) or `stop` ends the run after writing what was finished: the prompt
    in progress is dropped and results.json says `"interrupted": true`.
    """
    from edgespec.bench_report import write_outputs

    prompts = load_suites(s.suites, s.categories, s.per_category)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EdgeSpecError(f"cannot create output folder {out}: {exc.strerror}") from None
    runner = Runner(s, log)
    names = [c.name for c in runner.configs]
    meta = {
        "settings": {k: v for k, v in vars(s).items()},
        "target": runner.target.path,
        "target_description": runner.target.info.description,
        "configs": [vars(c) for c in runner.configs],
        "prompts_total": len(prompts),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "verify_cost_s": {str(k): v for k, v in runner.costs.items()},
        "interrupted": False,
    }
    done: list[dict] = []
    skipped: list[dict] = []
    results = {"meta": meta, "prompts": done, "skipped": skipped, "categories": {}}

    def save(final: bool) -> None:
        meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        meta["prompts_done"] = len(done)
        results["categories"] = aggregate(done, names)
        if done:
            # T(1) should be close to the baseline's seconds per token; far above it means the cost
            # measurement hit a burst of machine load, and predicted speedups are not to be trusted.
            base_s = 1.0 / results["categories"]["overall"][BASELINE]["tokens_per_s"]
            meta["verify_cost_suspect"] = runner.costs[1] > 2.0 * base_s
        write_outputs(results, out, runner.costs, plots=final)

    try:
        encoded = []
        for pr in prompts:
            toks, framing = tokenize_prompt(runner.target, pr.text, s.framing)
            meta["framing"] = framing
            encoded.append(toks)
        if encoded:  # one short untimed pass per configuration warms caches and lazy allocations
            for cfg in runner.configs:
                runner.run(cfg, encoded[0], max_tokens=8)
        for i, (pr, toks) in enumerate(zip(prompts, encoded, strict=True)):
            if progress is not None:
                progress(i, len(prompts), pr.id)
            if len(toks) + s.max_tokens + 1 > runner.target.n_ctx:
                skipped.append({"id": pr.id, "reason": f"{len(toks)} prompt tokens + {s.max_tokens} do not fit --ctx {runner.target.n_ctx}"})
                continue
            row = bench_prompt(runner, pr, toks, stop)
            if row is None:
                meta["interrupted"] = True
                break
            done.append(row)
            save(final=False)
        if progress is not None and not meta["interrupted"]:
            progress(len(prompts), len(prompts), "")
    except KeyboardInterrupt:
        meta["interrupted"] = True
    finally:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if threading.current_thread() is threading.main_thread() else None
        try:
            save(final=True)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            runner.close()
    return results


def verify_cost(target: str, opts_kw: dict, max_k: int, repeats: int, out_dir: str | None) -> dict:
    """T(K) for K = 1..max_k and the ceiling speedup at perfect acceptance.

    With every draft accepted (alpha = 1) and free drafting (c = 0), a pass over K rows yields K
    tokens for T(K)/T(1) single-token passes: the best speedup is max_K K T(1) / T(K).
    """
    from edgespec.factory import RuntimeOptions, load_model

    if max_k < 2:
        raise EdgeSpecError(f"--max-k must be >= 2, got {max_k}")
    if repeats < 1:
        raise EdgeSpecError(f"--repeats must be >= 1, got {repeats}")
    model = load_model(target, RuntimeOptions(**opts_kw))
    if max_k > model.n_batch:
        raise EdgeSpecError(f"--max-k must be <= {model.n_batch}, got {max_k}")
    costs = measure_costs(model, list(range(1, max_k + 1)), repeats)
    t1 = costs[1]
    rows = [{"k": k, "seconds": t, "t_ratio": t / t1, "ceiling_speedup": k * t1 / t} for k, t in costs.items()]
    best = max(rows, key=lambda r: r["ceiling_speedup"])
    res = {
        "target": model.path,
        "target_description": model.info.description,
        "repeats": repeats,
        "rows": rows,
        "best_k": best["k"],
        "ceiling_speedup": best["ceiling_speedup"],
    }
    if out_dir is not None:
        from edgespec.bench_report import write_verify_cost

        write_verify_cost(res, Path(out_dir))
    model.close()
    return res


def build_parser() -> argparse.ArgumentParser:
    from edgespec.cli import _Parser, add_runtime_args

    ap = _Parser(
        prog="python app.py bench",
        description="Baseline vs speculative decoding over prompt suites (JSONL), with llama-cpp-python's "
        "prompt lookup as a reference; or --verify-cost to measure this machine's speculation ceiling.",
    )
    ap.add_argument("--suite", action="append", default=[], help="JSONL suite file (repeatable)")
    ap.add_argument("--target", default=None, help="target model: .gguf path or bundled name (default smollm2-135m)")
    ap.add_argument("--draft", action="append", default=[], help="candidate drafter: ngram or a draft model (repeatable; default ngram)")
    ap.add_argument("--gamma", action="append", default=[], help="draft length: a number or auto (repeatable; default auto)")
    ap.add_argument("--ngram", default="1,16", help="n-gram sizes for the ngram drafter as MIN,MAX (default 1,16)")
    ap.add_argument("--category", action="append", default=[], help="only this category (repeatable)")
    ap.add_argument("--per-category", type=int, default=None, help="first N prompts of each category")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); outputs are compared only when greedy")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--framing", choices=FRAMINGS, default="auto",
                    help="auto: chat template if the model has one, else 'Question: ...\\nAnswer:' (default)")
    ap.add_argument("--no-reference", action="store_true", help="skip llama-cpp-python's plain and prompt-lookup runs")
    ap.add_argument("--lookup-tokens", type=int, default=10, help="llama-cpp-python prompt lookup num_pred_tokens (default 10)")
    ap.add_argument("--lookup-ngram", type=int, default=2, help="llama-cpp-python prompt lookup max_ngram_size (default 2)")
    ap.add_argument("--out", default=None, help="output folder (results.json, report.md, plots)")
    ap.add_argument("--verify-cost", action="store_true", help="measure T(K)/T(1) for K = 1..--max-k and the speedup ceiling")
    ap.add_argument("--max-k", type=int, default=32, help="largest K for --verify-cost (default 32)")
    add_runtime_args(ap)
    return ap


def main(argv: list[str]) -> int:
    from edgespec.cli import parse_ngram
    from models import DEFAULT_TARGET

    args = build_parser().parse_args(argv)
    target = args.target or DEFAULT_TARGET
    runtime_kw = {"n_ctx": args.ctx, "n_threads": args.threads, "flash_attn": args.flash_attn, "exact": args.exact}
    if args.verify_cost:
        res = verify_cost(target, runtime_kw, args.max_k, args.repeats, args.out)
        from edgespec.bench_report import verify_cost_markdown

        print(verify_cost_markdown(res))
        return 0
    if not args.suite:
        raise EdgeSpecError("bench needs --suite FILE.jsonl (or --verify-cost)")
    if args.out is None:
        raise EdgeSpecError("bench needs --out DIR for results.json, report.md and plots")
    s = BenchSettings(
        suites=args.suite,
        target=target,
        drafts=args.draft or ["ngram"],
        gammas=args.gamma or ["auto"],
        ngram=parse_ngram(args.ngram),
        categories=args.category,
        per_category=args.per_category,
        temperature=args.temperature,
        seed=args.seed,
        max_tokens=args.max_tokens,
        repeats=args.repeats,
        framing=args.framing,
        reference=not args.no_reference,
        lookup_tokens=args.lookup_tokens,
        lookup_ngram=args.lookup_ngram,
        **runtime_kw,
    )
    for g in s.gammas:
        from edgespec.factory import parse_gamma

        parse_gamma(g)  # a bad gamma fails before any model loads
    load_suites(s.suites, s.categories, s.per_category)  # so does a bad suite file

    from tqdm import tqdm

    bar = tqdm(total=None, unit="prompt", file=sys.stderr, dynamic_ncols=True)

    def progress(i: int, n: int, pid: str) -> None:
        bar.total = n
        bar.n = i
        bar.set_postfix_str(f"prompt {pid}" if pid else "done")
        bar.refresh()

    def log(msg: str) -> None:
        bar.write(msg, file=sys.stderr)

    try:
        res = run_bench(s, args.out, progress, log)
    finally:
        bar.close()
    meta = res["meta"]
    if meta["interrupted"]:
        print(f"interrupted: wrote {meta['prompts_done']} of {meta['prompts_total']} prompts to {args.out}", file=sys.stderr)
        return 130
    from edgespec.bench_report import summary_lines

    print("\n".join(summary_lines(res)))
    print(f"wrote {Path(args.out) / 'results.json'}, report.md and plots", file=sys.stderr)
    return 0
