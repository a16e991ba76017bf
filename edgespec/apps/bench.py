"""`python app.py bench`: the command line of the bench runner (edgespec.service.bench.runner)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edgespec.core.drafters import NGRAM_SIZES
from edgespec.models import DEFAULT_TARGET
from edgespec.runtime import llamacpp
from edgespec.runtime.errors import EdgeSpecError
from edgespec.service.bench.runner import BENCH_MAX_TOKENS, BenchSettings, run_bench, verify_cost
from edgespec.service.session import DEFAULT_DRAFT, DEFAULT_GAMMA, FRAMINGS
from edgespec.service.suites import load_suites


def build_parser() -> argparse.ArgumentParser:
    from edgespec.apps.args import Parser, add_runtime_args, not_empty
    from edgespec.service.suites import shipped_suites

    ap = Parser(
        prog="python app.py bench",
        description="Baseline vs speculative decoding over prompt suites (JSONL), with llama-cpp-python's "
        "prompt lookup as a reference; or --verify-cost to measure this machine's speculation ceiling.",
    )
    ap.add_argument("--suite", action="append", default=[], type=not_empty("give a .jsonl file or a shipped suite"),
                    help=f"JSONL suite file, or the name of a shipped suite ({', '.join(shipped_suites())}) "
                    "(repeatable)")
    ap.add_argument("--target", default=None, help=f"target model: .gguf path or bundled name (default {DEFAULT_TARGET})")
    ap.add_argument("--draft", action="append", default=[],
                    help=f"candidate drafter: ngram or a draft model (repeatable; default {DEFAULT_DRAFT})")
    ap.add_argument("--gamma", action="append", default=[],
                    help=f"draft length: a number or auto (repeatable; default {DEFAULT_GAMMA})")
    ngram = ",".join(map(str, NGRAM_SIZES))
    ap.add_argument("--ngram", default=ngram, help=f"n-gram sizes for the ngram drafter as MIN,MAX (default {ngram})")
    ap.add_argument("--category", action="append", default=[], help="only this category (repeatable)")
    ap.add_argument("--per-category", type=int, default=None, help="first N prompts of each category")
    ap.add_argument("--temperature", type=float, default=BenchSettings.temperature,
                    help=f"0 = greedy (default {BenchSettings.temperature:g}); outputs are compared only when greedy")
    ap.add_argument("--seed", type=int, default=BenchSettings.seed)
    ap.add_argument("--max-tokens", type=int, default=BENCH_MAX_TOKENS,
                    help=f"default {BENCH_MAX_TOKENS}: shorter than a request's, as every prompt runs many times")
    ap.add_argument("--repeats", type=int, default=BenchSettings.repeats, help=f"default {BenchSettings.repeats}")
    ap.add_argument("--framing", choices=FRAMINGS, default=BenchSettings.framing,
                    help="question (default): the chat template if the model has one, else 'Question: ...\\nAnswer:'; "
                    "the others as in app.py --framing")
    ap.add_argument("--no-reference", action="store_true", help="skip llama-cpp-python's plain and prompt-lookup runs")
    ap.add_argument("--lookup-tokens", type=int, default=BenchSettings.lookup_tokens,
                    help=f"llama-cpp-python prompt lookup num_pred_tokens (default {BenchSettings.lookup_tokens})")
    ap.add_argument("--lookup-ngram", type=int, default=BenchSettings.lookup_ngram,
                    help=f"llama-cpp-python prompt lookup max_ngram_size (default {BenchSettings.lookup_ngram})")
    ap.add_argument("--reference", action="append", default=[], metavar="llama.cpp:TYPE,...",
                    help="also run llama.cpp's own speculation (llama-speculative-simple, built by "
                    "scripts/build_reference.sh) with these types: " + ",".join(llamacpp.SPEC_TYPES) +
                    f", {llamacpp.DRAFT_TYPE} (its draft-model mode) or {llamacpp.DRAFT_TYPE}/N_MAX/N_MIN/P_MIN")
    ap.add_argument("--reference-draft-max", type=int, default=BenchSettings.llama_cpp_draft_max,
                    help=f"llama.cpp's --spec-draft-n-max (default {BenchSettings.llama_cpp_draft_max}; its n-gram "
                    "types draft with their own lengths)")
    ap.add_argument("--reference-draft-model", default=None, metavar="MODEL",
                    help="draft model for llama.cpp's draft-simple (default: the first --draft model:NAME)")
    ap.add_argument("--out", default=None, type=not_empty("give a folder for results.json, report.md and plots"),
                    help="output folder (results.json, report.md, plots)")
    ap.add_argument("--force", action="store_true", help="replace an earlier run's results in --out")
    ap.add_argument("--verify-cost", action="store_true", help="measure T(K)/T(1) for K = 1..--max-k and the speedup ceiling")
    ap.add_argument("--max-k", type=int, default=32, help="largest K for --verify-cost (default 32)")
    add_runtime_args(ap)
    return ap


def check_out(out: str | None, names: tuple[str, ...], force: bool) -> None:
    """Refuse an --out folder that holds an earlier run's `names` unless `force`: a new run would
    replace them without a word."""
    if out is None or force:
        return
    earlier = [n for n in names if (Path(out) / n).exists()]
    if earlier:
        raise EdgeSpecError(f"{out} already holds an earlier run ({', '.join(earlier)}); add --force to replace it, "
                            "or choose another --out")


def main(argv: list[str]) -> int:
    from edgespec.apps.args import runtime_options
    from edgespec.service.session import parse_ngram

    args = build_parser().parse_args(argv)
    target = args.target or DEFAULT_TARGET
    opts = runtime_options(args)
    if args.verify_cost:
        check_out(args.out, ("verify_cost.json", "verify_cost.md"), args.force)
        res = verify_cost(target, opts, args.max_k, args.repeats, args.out)
        from edgespec.service.bench.report import verify_cost_markdown

        print(verify_cost_markdown(res))
        return 0
    if not args.suite:
        raise EdgeSpecError("bench needs --suite FILE.jsonl (or --verify-cost)")
    if args.out is None:
        raise EdgeSpecError("bench needs --out DIR for results.json, report.md and plots")
    check_out(args.out, ("results.json", "report.md"), args.force)
    s = BenchSettings(
        suites=args.suite,
        target=target,
        drafts=args.draft or [DEFAULT_DRAFT],
        gammas=args.gamma or [DEFAULT_GAMMA],
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
        llama_cpp=[t for spec in args.reference for t in llamacpp.parse_reference(spec)],
        llama_cpp_draft_max=args.reference_draft_max,
        llama_cpp_draft_model=args.reference_draft_model,
        runtime=opts,
    )
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
    from edgespec.service.bench.report import summary_lines

    print("\n".join(summary_lines(res)))
    print(f"wrote {Path(args.out) / 'results.json'}, report.md and plots", file=sys.stderr)
    return 0
