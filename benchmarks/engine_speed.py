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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgespec import runtime  # noqa: E402
from edgespec.adaptive import AutoGamma  # noqa: E402
from edgespec.drafters.ngram import NgramDrafter  # noqa: E402
from edgespec.engine import Engine, GenerationConfig, collect  # noqa: E402
from edgespec.exactness import explain_divergence  # noqa: E402
from edgespec.factory import RuntimeOptions, load_model, prepare_runtime  # noqa: E402

CODE_EDIT = ROOT / "benchmarks" / "suites" / "code_edit.jsonl"
SPEC_BENCH = ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"


def encode(model: runtime.Model, text: str) -> list[int]:
    if model.chat_template():
        return model.tokenize(model.apply_chat_template([{"role": "user", "content": text}]), parse_special=True)
    return model.tokenize(f"Question: {text}\nAnswer:")  # base models: the bench's `qa` framing


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
    model.n_past = 0
    return n / dt


def speed(model: runtime.Model, prompts: list[str], max_tokens: int, repeats: int) -> dict:
    """Interleaved runs per prompt; returns median tok/s and ratios per configuration."""
    configs = {
        "baseline": lambda: Engine(model, None),
        "ngram gamma=auto": lambda: Engine(model, NgramDrafter(), AutoGamma()),
        "ngram gamma=4": lambda: Engine(model, NgramDrafter(), 4),
        "ngram gamma=16": lambda: Engine(model, NgramDrafter(), 16),
    }
    rows = []
    for text in prompts:
        prompt = encode(model, text)
        tps: dict[str, list[float]] = {name: [] for name in configs}
        tps["bare llama_cpp loop"] = []
        outputs: dict[str, list[int]] = {}
        acc: dict[str, float] = {}
        names = list(configs) + ["bare llama_cpp loop"]
        for r in range(repeats):
            for name in names[r % len(names):] + names[: r % len(names)]:  # rotate the order
                if name == "bare llama_cpp loop":
                    n = len(outputs.get("baseline", [])) or max_tokens
                    tps[name].append(bare_loop(model, prompt, n))
                    continue
                res = collect(configs[name]().generate(prompt, GenerationConfig(max_tokens=max_tokens)))
                tps[name].append(res.stats.tokens_per_s)
                outputs[name] = res.tokens
                acc[name] = res.stats.acceptance_rate
        med = {k: statistics.median(v) for k, v in tps.items()}
        base = med["baseline"]
        rows.append({
            "prompt": text[:60],
            "tokens_per_s": med,
            "ratio": {k: v / base for k, v in med.items()},
            "acceptance": acc,
            "identical_to_baseline": {k: outputs[k] == outputs["baseline"] for k in configs},
        })
    return {"rows": rows}


def divergence(model: runtime.Model, questions: list[str], max_tokens: int) -> dict:
    cases = []
    for text in questions:
        prompt = encode(model, text)
        base = collect(Engine(model, None).generate(prompt, GenerationConfig(max_tokens=max_tokens)))
        spec = collect(Engine(model, NgramDrafter(), 4).generate(prompt, GenerationConfig(max_tokens=max_tokens)))
        d = explain_divergence(model, prompt, base.tokens, spec.tokens)
        cases.append({"prompt": text[:50], "diverged": d is not None, **(d.to_dict() if d else {})})
    n_div = sum(c["diverged"] for c in cases)
    return {"cases": cases, "diverged": n_div, "total": len(cases),
            "all_near_ties": all(c.get("near_tie", True) for c in cases)}


def spec_bench_subset(per_category: int) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for line in SPEC_BENCH.read_text().splitlines():
        q = json.loads(line)
        if seen.get(q["category"], 0) < per_category:
            seen[q["category"]] = seen.get(q["category"], 0) + 1
            out.append(q["turns"][0])
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--exact", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fewer prompts and tokens (a smoke run)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    opts = RuntimeOptions(n_ctx=4096, flash_attn="auto", exact=args.exact)
    code = [json.loads(line)["prompt"] for line in CODE_EDIT.read_text().splitlines()][: 1 if args.quick else 3]
    questions = spec_bench_subset(1 if args.quick else 2)
    max_tokens, repeats = (64, 1) if args.quick else (160, 3)
    mode = "exact" if args.exact else "fast"
    prepare_runtime(opts)  # the library must be chosen before anything loads llama_cpp
    report = {"mode": mode, "system_info": runtime.system_info(), "models": {}}
    for name in ("gemma3-270m", "smollm2-135m"):
        model = load_model(name, opts)
        print(f"\n## {name} ({mode} mode)\n", flush=True)
        sp = speed(model, code, max_tokens, repeats)
        cols = list(sp["rows"][0]["tokens_per_s"])
        print("| prompt | " + " | ".join(cols) + " |")
        print("|---|" + "---|" * len(cols))
        for row in sp["rows"]:
            cells = [f"{row['tokens_per_s'][c]:.1f} tok/s ({row['ratio'][c]:.2f}x)" for c in cols]
            print(f"| {row['prompt'][:40]!r} | " + " | ".join(cells) + " |")
        for row in sp["rows"]:
            print(f"identical to baseline: {row['identical_to_baseline']}; acceptance: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in row["acceptance"].items()))
        dv = divergence(model, questions, max_tokens)
        print(f"\ngreedy divergence from plain decoding (ngram gamma=4, {max_tokens} tokens): "
              f"{dv['diverged']}/{dv['total']} prompts; all at near-ties: {dv['all_near_ties']}")
        for c in dv["cases"]:
            if c["diverged"]:
                print(f"  - {c['prompt']!r}: position {c['position']}, top-2 gap {c['top2_gap']:.3f}")
        report["models"][name] = {"speed": sp, "divergence": dv}
        model.close()
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
