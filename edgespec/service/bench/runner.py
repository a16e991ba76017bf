"""The bench runner (`python app.py bench`, the UI's bench tab): baseline vs speculative decoding over prompt suites, against
llama-cpp-python's own prompt lookup, with JSON, Markdown and plots.

Timing discipline (the machine is shared and small, so absolute tokens/s are noise): for each
prompt every configuration runs `repeats` times in a rotating order (baseline, c1, c2, ... then
c1, c2, ..., baseline, ...), the median tokens/s per configuration is kept, and every speedup is
a ratio of medians measured on the same prompt in the same run. Wall time is not pooled like the
counters: one repeat slowed by the machine's other load would pull a pooled rate, a median drops it.

Every other figure of a results row comes from one `Stats`: the repeats of a (prompt,
configuration) merged with `Stats.merge` (counters do not depend on machine load, so pooling all
repeats loses nothing and every figure -- acceptance, alpha, alpha by depth, tokens per call, the
draft-length histogram -- is of the same generations), written as its `to_dict` under "stats".
A category's cell merges its prompts' Stats the same way. A row or cell has one decode rate,
`tokens_per_s`: the median of its repeats' rates (a row), its prompts' tokens over their seconds at
those rates (a cell); the merged Stats leave their own rates out (`TIMED_FIGURES`). The predicted
speedup and the draft cost c of a row or cell are those of its merged Stats (`pooled`); the report
reads these and recomputes nothing.

Every generation goes through the session layer (`edgespec.service.session`): one loaded target, one
`Request` per configuration and prompt, the `Reply` it folds to. The predicted speedup of a run is
`Reply.predicted_speedup` and the T(K) in the report is the stored cost profile (`edgespec.runtime.profiles`),
the same numbers gamma auto plans with.

`python app.py bench --verify-cost` measures T(K) afresh, the seconds of one target pass over K
rows, and the best speedup speculation could give on this machine at perfect acceptance.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import signal
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from edgespec.core.costs import CostModel
from edgespec.core.drafters import NGRAM_SIZES
from edgespec.core.sampling import SamplingParams
from edgespec.core.stats import Stats, speedup
from edgespec.models.loader import RuntimeOptions
from edgespec.runtime import llamacpp
from edgespec.runtime.errors import EdgeSpecError
from edgespec.service.bench.report import BASELINE, REF_LOOKUP, REF_PLAIN, versus_llamacpp
from edgespec.service.session import DEFAULT_DRAFT, DEFAULT_GAMMA, FRAMINGS, Reply, Request, parse_gamma
from edgespec.service.suites import Prompt, load_suites, shipped_suites, suite_path

# The bench's answers are shorter than a request's default (session.Request.max_tokens): every
# prompt runs repeats x configurations times, and the speedup shows within this length.
BENCH_MAX_TOKENS = 128


@dataclass
class BenchSettings:
    suites: list[str]
    target: str
    drafts: list[str] = field(default_factory=lambda: [DEFAULT_DRAFT])
    gammas: list[str] = field(default_factory=lambda: [DEFAULT_GAMMA])
    ngram: tuple[int, int] = NGRAM_SIZES
    categories: list[str] = field(default_factory=list)
    per_category: int | None = None
    temperature: float = SamplingParams.temperature
    seed: int | None = None
    max_tokens: int = BENCH_MAX_TOKENS
    repeats: int = 3
    framing: str = "question"  # the session's framing: chat template, else 'Question: ...\nAnswer:'
    reference: bool = True
    lookup_tokens: int = 10
    lookup_ngram: int = 2
    llama_cpp: list[str] = field(default_factory=list)  # llama.cpp speculation types run as references
    llama_cpp_draft_max: int = 16
    llama_cpp_draft_model: str | None = None  # draft-simple's -md; default: the first model:NAME in drafts
    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)  # how the target and drafts load

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise EdgeSpecError(f"--repeats must be >= 1, got {self.repeats}")
        if self.max_tokens < 1:
            raise EdgeSpecError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise EdgeSpecError(f"--temperature must be >= 0, got {self.temperature}")
        if self.lookup_tokens < 1:
            raise EdgeSpecError(f"--lookup-tokens must be >= 1, got {self.lookup_tokens}")
        if self.llama_cpp_draft_max < 1:
            raise EdgeSpecError(f"--reference-draft-max must be >= 1, got {self.llama_cpp_draft_max}")
        if self.framing not in FRAMINGS:
            raise EdgeSpecError(f"--framing must be one of {', '.join(FRAMINGS)}, got {self.framing!r}")
        if not self.drafts or any(d.strip() == "none" for d in self.drafts):
            raise EdgeSpecError("--draft names a candidate drafter (ngram or a draft model); the baseline always runs")
        for g in self.gammas:
            parse_gamma(g)  # a bad gamma fails before any model loads
        for suite in self.suites:
            if suite_path(suite).is_dir():  # the suite loader would call it "not found"
                raise EdgeSpecError(f"--suite {suite} is a folder; give a suite file (.jsonl) or a shipped suite: "
                                    f"{', '.join(shipped_suites())}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Config:
    """One way of generating that is timed on every prompt."""

    name: str
    kind: str  # 'baseline' | 'ours' | 'reference' (llama-cpp-python) | 'llama.cpp' (its own speculation)
    draft: str = "none"
    gamma: str = "0"

    def request(self, s: BenchSettings, text: str, framing: str, max_tokens: int | None = None,
                owner: str = "") -> Request:
        """The session request this configuration makes for one prompt (baseline and ours); `owner`
        keeps the earlier answers a drafter learns from apart (Request.owner)."""
        return Request(
            text=text,
            framing=framing,
            draft=self.draft,
            gamma=self.gamma,
            ngram=s.ngram,
            max_tokens=max_tokens or s.max_tokens,
            sampling=SamplingParams(temperature=s.temperature, seed=s.seed),
            owner=owner,
        )


@dataclass
class Run:
    """One timed generation: token ids, decode tokens/s and, for ours and llama.cpp's, its Stats."""

    tokens: list[int]
    tokens_per_s: float
    stats: Stats | None = None  # llama.cpp runs: generated, drafted and accepted only
    text: str | None = None  # llama.cpp runs: the program's text (its tokens are not reported)


def configs_for(s: BenchSettings) -> list[Config]:
    out = [Config(BASELINE, "baseline")]
    for d in s.drafts:
        for g in s.gammas:
            out.append(Config(f"{Path(d).name if d.endswith('.gguf') else d} g={g}", "ours", d, g))
    if s.reference:
        out += [Config(REF_PLAIN, "reference"), Config(REF_LOOKUP, "reference")]
    out += [Config(llamacpp.PREFIX + t, "llama.cpp", gamma=str(s.llama_cpp_draft_max)) for t in s.llama_cpp]
    return out


class Runner:
    """One session (the target, loaded once, and the draft models kept for it) runs every
    configuration of ours; the llama-cpp-python references get their own contexts."""

    def __init__(self, s: BenchSettings, log: Callable[[str], None]) -> None:
        from edgespec.core import drafters
        from edgespec.runtime import profiles
        from edgespec.service.session import Session, frame

        self.s = s
        log(f"loading {s.target}")
        self.session = Session.load(s.target, s.runtime)
        self.target = self.session.target
        self.refs: dict = {}
        self.cost_models: dict[str, CostModel] = {}  # per configuration of ours: its latest reply's
        try:
            # The framing as the session resolves it, and the stop strings it adds (qa: the next
            # "Question:"), the same for every prompt; llama.cpp's program has none.
            framed = frame(self.target, Request(text="?", framing=s.framing, draft="none"))
            self.framing, self.frame_stops = framed.framing, framed.stop
            if s.llama_cpp:
                binary = llamacpp.find_binary()
                if binary is None:
                    log(llamacpp.missing_message())
                    s.llama_cpp = []
                else:
                    log(f"llama.cpp reference: {binary}")
                    draft_model = self.reference_draft_model()
                    self.refs.update({
                        llamacpp.PREFIX + t: llamacpp.LlamaCppSpeculative(
                            binary, self.target, t, draft_max=s.llama_cpp_draft_max, draft_model=draft_model)
                        for t in s.llama_cpp
                    })
            self.configs = configs_for(s)
            for cfg in self.configs:
                if cfg.kind == "ours" and drafters.kinds()[drafters.split_spec(cfg.draft)[0]].takes_model:
                    log(f"loading drafter {cfg.draft}")
                    self.session.drafter(cfg.draft, s.ngram)  # kept by the session for every run
            if s.reference:
                from edgespec.service.bench.reference import Reference

                log("loading llama-cpp-python references")
                for name, lookup in ((REF_PLAIN, False), (REF_LOOKUP, True)):
                    self.refs[name] = Reference(
                        self.target,
                        lookup=lookup,
                        n_ctx=self.target.n_ctx,
                        n_threads=self.target.n_threads,
                        flash_attn=self.target.flash_attn != "off",
                        num_pred_tokens=s.lookup_tokens,
                        max_ngram_size=s.lookup_ngram,
                    )
            fixed = [int(g) for g in s.gammas if g.strip().lower() != "auto"]
            rows = sorted(set(profiles.profile_rows()) | set(range(1, max([0, *fixed]) + 2)))
            log(f"cost profile T(K) for K = 1..{profiles.K_MAX}, {', '.join(str(k) for k in rows if k > profiles.K_MAX)} "
                "(stored; measured on first use)")
            profile = profiles.profile(self.target, rows)
            self.costs = {k: profile.pass_s[k] for k in rows}
            self.cost_profile = str(profiles.profile_path(self.target))
        except BaseException:
            self.close()
            raise

    def reference_draft_model(self) -> Path | None:
        """The GGUF llama.cpp's draft-simple runs: --reference-draft-model, else the draft model of
        the first `model:NAME` drafter benched (the same file on both sides)."""
        from edgespec.core import drafters
        from edgespec.models import resolve

        name = self.s.llama_cpp_draft_model
        if name is None:
            for d in self.s.drafts:
                kind, arg = drafters.split_spec(d)
                if kind == "model" and arg:
                    name = arg
                    break
        return None if name is None else resolve(name)

    def profile_changed(self) -> bool:
        """Whether the stored profile is no longer the one reported (the session found it stale
        during the run and measured it again): later runs were predicted with other T(K)."""
        from edgespec.runtime import profiles
        now = profiles.Profile.read(Path(self.cost_profile))
        return now is None or any(now.pass_s.get(k) != v for k, v in self.costs.items())

    def frame(self, text: str) -> list[int]:
        """The prompt's tokens as every configuration is fed them (the session's framing)."""
        from edgespec.service.session import frame

        return frame(self.target, Request(text=text, framing=self.framing, draft="none")).tokens

    def run(self, cfg: Config, text: str, tokens: Sequence[int], max_tokens: int | None = None,
            stop: threading.Event | None = None, owner: str = "") -> Run:
        """One timed generation of `cfg` on one prompt (`tokens` = `frame(text)`). `owner`: whose
        earlier answers a drafter that learns from them sees (each repeat its own, so a repeat
        never copies the answer an earlier repeat gave to the same prompt)."""
        s = self.s
        if cfg.kind == "reference":
            r = self.refs[cfg.name].generate(tokens, max_tokens or s.max_tokens, s.temperature, s.seed)
            return Run(r.tokens, r.tokens_per_s)
        if cfg.kind == "llama.cpp":
            limit = max_tokens or s.max_tokens
            sr = self.refs[cfg.name].generate(tokens, limit)
            # Its count includes an end-of-generation token where it stopped early (ours does not),
            # and it finishes the step that reaches the limit, so it may return up to a draft more.
            generated = sr.n_predict - (1 if sr.n_predict < limit else 0)
            toks = self.target.tokenize(sr.text, add_special=False)
            stats = Stats(generated=generated, drafted=sr.n_drafted, accepted=sr.n_accept)
            return Run(toks, generated / max(sr.decode_s, 1e-9), stats, text=sr.text)
        reply = self.session.run(cfg.request(s, text, self.framing, max_tokens, owner), stop)
        if reply.costs is not None:
            self.cost_models[cfg.name] = reply.costs
        return Run(reply.tokens, reply.stats.tokens_per_s, reply.stats)

    def close(self) -> None:
        for ref in self.refs.values():
            ref.close()
        self.refs = {}
        self.session.close()


def _no_drafts(cfg: Config, runs: Sequence[Run]) -> bool:
    """True for a configuration of ours that drafted nothing in any run: it did the baseline's work
    (plain decoding through the same engine), so its speedup is 1.00x, not the ratio of two timings
    that differ only by the machine's noise (a `--repeats 1` run printed 1.72x with no drafts)."""
    return cfg.kind == "ours" and all(r.stats is not None and not r.stats.drafted for r in runs)


def _median_run(runs: list[Run]) -> Run:
    order = sorted(runs, key=lambda r: r.tokens_per_s)
    return order[(len(order) - 1) // 2]


# Figures of a Stats that its wall time gives; the merged Stats of repeats would give a second
# tokens/s next to the row's or cell's own `tokens_per_s` (of the median runs), so they are left out.
TIMED_FIGURES = ("tokens_per_s", "bandwidth_gb_s")


def pooled(stats: Sequence[Stats], costs: CostModel | None) -> dict:
    """The figures of generations pooled by `Stats.merge`: the merged Stats (`to_dict`, less its
    rates: TIMED_FIGURES) under "stats"; with the cost model they were planned with, the speedup it
    predicts for the pooled draft lengths at the pooled alpha (`Reply.predicted_speedup`) and the
    measured draft cost c, seconds drafting per drafted token over T(1) (None where nothing was
    drafted)."""
    st = Stats.merge(stats)
    out: dict = {"stats": {k: v for k, v in st.to_dict().items() if k not in TIMED_FIGURES}}
    if costs is not None:
        out["predicted_speedup"] = Reply(stats=st, costs=costs).predicted_speedup
        out["draft_cost"] = costs.draft_cost(st.draft_s / st.drafted) if st.drafted else None
    return out


def bench_prompt(runner: Runner, pr: Prompt, tokens: list[int], stop: threading.Event | None) -> dict | None:
    """Time every configuration on one prompt (interleaved, rotating order) and compare outputs."""
    from edgespec.runtime.exactness import explain_divergence

    s = runner.s
    cfgs = runner.configs
    runs: dict[str, list[Run]] = {c.name: [] for c in cfgs}
    for r in range(s.repeats):
        shift = r % len(cfgs)
        for cfg in cfgs[shift:] + cfgs[:shift]:
            if stop is not None and stop.is_set():
                return None
            runs[cfg.name].append(runner.run(cfg, pr.text, tokens, stop=stop, owner=f"bench-repeat-{r}"))
    if stop is not None and stop.is_set():
        return None  # the last run may have been cut short

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
            "speedup": 1.0 if _no_drafts(cfg, rs) else speedup(tps, base_tps),
            "no_drafts": _no_drafts(cfg, rs),
            # the median run's tokens (llama.cpp: its own count), which its tokens/s counted
            "generated": rep.stats.generated if cfg.kind == "llama.cpp" else len(rep.tokens),
            "tokens": rs[0].tokens,
            "text": rs[0].text if rs[0].text is not None else runner.target.detokenize(rs[0].tokens),
        }
        if rep.stats is not None:
            entry.update(pooled([r.stats for r in rs], runner.cost_models.get(cfg.name)))
        if s.greedy and cfg.kind == "llama.cpp":
            # Compared as text (the program reports text, not token ids), over the baseline's
            # length when the baseline stopped at the limit or may have stopped at a framing stop
            # string (the program runs past both).
            base_text = runner.target.detokenize(base_tokens)
            prefix = len(base_tokens) >= s.max_tokens or bool(runner.frame_stops)
            differ = [r for r in rs if not (r.text.startswith(base_text) if prefix else r.text == base_text)]
            entry["identical"] = not differ
            entry["divergences"] = []
            for seq in sorted({tuple(r.tokens) for r in differ}):
                div = explain_divergence(runner.target, tokens, base_tokens, list(seq))
                if div is not None:
                    entry["divergences"].append(div.to_dict())
        elif s.greedy:
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
            results[name]["speedup_vs_own_baseline"] = speedup(results[name]["tokens_per_s"], own)
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


def aggregate(prompts: list[dict], names: list[str], cost_models: dict[str, CostModel] | None = None) -> dict:
    """Per-category (and 'overall') totals: tokens/s = total tokens / total decode seconds of the
    median runs; speedup = that rate over the baseline's rate on the same prompts; the prompts'
    Stats merged (`pooled`, with the configuration's cost model from `cost_models`)."""
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
            if "stats" in es[0]:
                cell.update(pooled([Stats.from_dict(e["stats"]) for e in es], (cost_models or {}).get(name)))
            if "identical" in es[0]:
                cell["identical"] = sum(bool(e["identical"]) for e in es)
                divs = [d for e in es for d in e["divergences"]]
                cell["divergences"] = len(divs)
                cell["near_tie_divergences"] = sum(d["near_tie"] for d in divs)
            row[name] = cell
        base = row[BASELINE]["tokens_per_s"]
        for name in names:
            row[name]["speedup"] = speedup(row[name]["tokens_per_s"], base)
            if all(p["results"][name].get("no_drafts") for p in ps):
                row[name]["speedup"] = 1.0  # plain decoding on every prompt (`_no_drafts`)
                row[name]["no_drafts"] = True
        if REF_PLAIN in row:
            own = row[REF_PLAIN]["tokens_per_s"]
            for name in (REF_PLAIN, REF_LOOKUP):
                row[name]["speedup_vs_own_baseline"] = speedup(row[name]["tokens_per_s"], own)
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
    from edgespec.service.bench.report import write_outputs

    prompts = load_suites(s.suites, s.categories, s.per_category)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EdgeSpecError(f"cannot create output folder {out}: {exc.strerror}") from None
    runner = Runner(s, log)
    names = [c.name for c in runner.configs]
    meta = _meta(runner, len(prompts))
    done: list[dict] = []
    skipped: list[dict] = []
    results = {"meta": meta, "prompts": done, "skipped": skipped, "categories": {}}

    def save(final: bool) -> None:
        meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        meta["prompts_done"] = len(done)
        results["categories"] = aggregate(done, names, runner.cost_models)
        results["versus_llamacpp"] = versus_llamacpp(results)
        if done:
            # T(1) should be close to the baseline's seconds per token; far above it means the stored
            # profile was measured under machine load, and predicted speedups are not to be trusted.
            base_s = 1.0 / results["categories"]["overall"][BASELINE]["tokens_per_s"]
            meta["verify_cost_suspect"] = runner.costs[1] > 2.0 * base_s
        meta["cost_profile_changed"] = runner.profile_changed()
        write_outputs(results, out, runner.costs, plots=final)

    try:
        encoded = [runner.frame(pr.text) for pr in prompts]
        if encoded:  # one short untimed pass per configuration warms caches and lazy allocations
            for cfg in runner.configs:
                runner.run(cfg, prompts[0].text, encoded[0], max_tokens=8, owner="bench-warm-up")
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


def _meta(runner: Runner, prompts_total: int) -> dict:
    """What results.json says about a run before its first prompt: settings, target, machine, the
    configurations and the stored cost profile."""
    return {
        "settings": {**vars(runner.s), "runtime": dataclasses.asdict(runner.s.runtime)},
        "target": runner.target.path,
        "target_description": runner.target.info.description,
        "configs": [vars(c) for c in runner.configs],
        "prompts_total": prompts_total,
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "framing": runner.framing,
        "verify_cost_s": {str(k): v for k, v in runner.costs.items()},  # the stored cost profile
        "cost_profile": runner.cost_profile,
        "interrupted": False,
    }


def verify_cost(target: str, opts: RuntimeOptions, max_k: int, repeats: int, out_dir: str | None) -> dict:
    """T(K) for K = 1..max_k and the ceiling speedup at perfect acceptance.

    With every draft accepted (alpha = 1) and free drafting (c = 0), a pass over K rows yields K
    tokens for T(K)/T(1) single-token passes: the cost model's speedup of K-1 drafts,
    `CostModel.speedup(1.0, K-1, c=0)` = K T(1) / T(K); the ceiling is its largest.
    """
    from edgespec.models.loader import load_model
    from edgespec.runtime.profiles import measure_pass_costs

    if max_k < 2:
        raise EdgeSpecError(f"--max-k must be >= 2, got {max_k}")
    if repeats < 1:
        raise EdgeSpecError(f"--repeats must be >= 1, got {repeats}")
    model = load_model(target, opts)
    try:
        if max_k > model.n_batch:
            raise EdgeSpecError(f"--max-k must be <= {model.n_batch}, got {max_k}")
        path, description = model.path, model.info.description
        costs = measure_pass_costs(model, list(range(1, max_k + 1)), repeats)
    finally:
        model.close()
    cm = CostModel(costs, gamma_max=max_k - 1)  # every measured K in its table
    rows = [{"k": k, "seconds": t, "t_ratio": cm.t_ratio(k), "ceiling_speedup": cm.speedup(1.0, k - 1, c=0.0)}
            for k, t in costs.items()]
    best = max(rows, key=lambda r: r["ceiling_speedup"])
    res = {
        "target": path,
        "target_description": description,
        "repeats": repeats,
        "rows": rows,
        "best_k": best["k"],
        "ceiling_speedup": best["ceiling_speedup"],
    }
    if out_dir is not None:
        from edgespec.service.bench.report import write_verify_cost

        write_verify_cost(res, Path(out_dir))
    return res
