"""Engine benchmark (issue: speculative engine): speed ratios and greedy exactness, measured in one run.

    .venv/bin/python -m benchmarks.engine_speed [--exact] [--quick] [--out FILE.json]

For each bundled model it prints, as Markdown:
  * tokens/s ratios of n-gram speculation over the plain baseline on grounded code-edit prompts
    (configurations interleaved per prompt, medians of repeats);
  * the engine's plain baseline against a bare llama_cpp decode loop (overhead of the engine);
  * greedy divergence of speculative output from plain decoding over a Spec-Bench subset, with the
    target's top-2 logit gap at each first divergence.
Run once normally and once with --exact (the llamafile-off library; it must be a separate process
because the library is chosen before loading).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from edgespec.models.loader import RuntimeOptions, prepare_runtime
from edgespec.runtime import llama as runtime
from edgespec.runtime.exactness import explain_divergence
from edgespec.service.session import Request, Session, frame
from edgespec.service.suites import load_suite, shipped_suites

BARE = "bare llama_cpp loop"
# Configurations of the session: (draft, gamma) per name; all greedy.
CONFIGS = {
    "baseline": ("none", "0"),
    "ngram gamma=auto": ("ngram", "auto"),
    "ngram gamma=4": ("ngram", "4"),
    "ngram gamma=16": ("ngram", "16"),
}


def request(model: runtime.Model, text: str, draft: str = "none", gamma: str = "0", max_tokens: int = 256) -> Request:
    """Chat template if the model has one, else the bench's Question/Answer frame."""
    return Request(text=text, framing="question", draft=draft, gamma=gamma, max_tokens=max_tokens)


def bare_loop(model: runtime.Model, prompt: list[int], n: int) -> float:
    """Plain greedy decoding straight on llama_cpp (no engine): tokens/s after the prompt."""
    llama = runtime.lib()
    model.reset()
    model.decode(prompt[:-1], n_logits=0)
    ctx = model._ctx
    tok = (ctypes.c_int32 * 1)(prompt[-1])
    t0 = time.perf_counter()
    for _ in range(n):
        if llama.llama_decode(ctx, llama.llama_batch_get_one(tok, 1)) != 0:
            raise RuntimeError("decode failed")
        row = np.ctypeslib.as_array(llama.llama_get_logits_ith(ctx, -1), shape=(model.n_vocab,))
        tok[0] = int(np.argmax(row))
    dt = time.perf_counter() - t0
    model.reset()
    return n / dt


def speed(session: Session, prompts: list[str], max_tokens: int, repeats: int) -> dict:
    """Interleaved runs per prompt; returns median tok/s and ratios per configuration."""
    model = session.target
    for draft, gamma in CONFIGS.values():  # untimed: cost profile, caches, lazy allocations
        session.run(request(model, prompts[0], draft, gamma, 8))
    rows = []
    for text in prompts:
        prompt = frame(model, request(model, text)).tokens
        tps: dict[str, list[float]] = {name: [] for name in [*CONFIGS, BARE]}
        outputs: dict[str, list[int]] = {}
        acc: dict[str, float] = {}
        names = list(tps)
        for r in range(repeats):
            for name in names[r % len(names):] + names[: r % len(names)]:  # rotate the order
                if name == BARE:
                    n = len(outputs.get("baseline", [])) or max_tokens
                    tps[name].append(bare_loop(model, prompt, n))
                    continue
                draft, gamma = CONFIGS[name]
                reply = session.run(request(model, text, draft, gamma, max_tokens))
                tps[name].append(reply.stats.tokens_per_s)
                outputs[name] = reply.tokens
                acc[name] = reply.stats.acceptance_rate
        med = {k: statistics.median(v) for k, v in tps.items()}
        base = med["baseline"]
        rows.append({
            "prompt": text[:60],
            "tokens_per_s": med,
            "ratio": {k: v / base for k, v in med.items()},
            "acceptance": acc,
            "identical_to_baseline": {k: outputs[k] == outputs["baseline"] for k in CONFIGS},
        })
    return {"rows": rows}


def divergence(session: Session, questions: list[str], max_tokens: int) -> dict:
    model = session.target
    cases = []
    for text in questions:
        prompt = frame(model, request(model, text)).tokens
        base = session.run(request(model, text, "none", "0", max_tokens))
        spec = session.run(request(model, text, "ngram", "4", max_tokens))
        d = explain_divergence(model, prompt, base.tokens, spec.tokens)
        cases.append({"prompt": text[:50], "diverged": d is not None, **(d.to_dict() if d else {})})
    n_div = sum(c["diverged"] for c in cases)
    return {"cases": cases, "diverged": n_div, "total": len(cases),
            "all_near_ties": all(c.get("near_tie", True) for c in cases)}


def spec_bench_subset(per_category: int) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for pr in load_suite(shipped_suites()["spec_bench"]):
        if seen.get(pr.category, 0) < per_category:
            seen[pr.category] = seen.get(pr.category, 0) + 1
            out.append(pr.text)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.engine_speed", description=__doc__.split("\n")[0])
    ap.add_argument("--exact", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fewer prompts and tokens (a smoke run)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    opts = RuntimeOptions(exact=args.exact)
    code = [pr.text for pr in load_suite(shipped_suites()["code_edit"])][: 1 if args.quick else 3]
    questions = spec_bench_subset(1 if args.quick else 2)
    max_tokens, repeats = (64, 1) if args.quick else (160, 3)
    mode = "exact" if args.exact else "fast"
    prepare_runtime(opts)  # the library must be chosen before anything loads llama_cpp
    report = {"mode": mode, "system_info": runtime.system_info(), "models": {}}
    for name in ("gemma3-270m", "smollm2-135m"):
        session = Session.load(name, opts)
        print(f"\n## {name} ({mode} mode)\n", flush=True)
        sp = speed(session, code, max_tokens, repeats)
        cols = list(sp["rows"][0]["tokens_per_s"])
        print("| prompt | " + " | ".join(cols) + " |")
        print("|---|" + "---|" * len(cols))
        for row in sp["rows"]:
            cells = [f"{row['tokens_per_s'][c]:.1f} tok/s ({row['ratio'][c]:.2f}x)" for c in cols]
            print(f"| {row['prompt'][:40]!r} | " + " | ".join(cells) + " |")
        for row in sp["rows"]:
            print(f"identical to baseline: {row['identical_to_baseline']}; acceptance: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in row["acceptance"].items()))
        dv = divergence(session, questions, max_tokens)
        print(f"\ngreedy divergence from plain decoding (ngram gamma=4, {max_tokens} tokens): "
              f"{dv['diverged']}/{dv['total']} prompts; all at near-ties: {dv['all_near_ties']}")
        for c in dv["cases"]:
            if c["diverged"]:
                print(f"  - {c['prompt']!r}: position {c['position']}, top-2 gap {c['top2_gap']:.3f}")
        report["models"][name] = {"speed": sp, "divergence": dv}
        session.close()
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
