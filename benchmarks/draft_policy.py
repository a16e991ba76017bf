"""How long should a draft model draft? gamma=auto (edgespec.adaptive) against fixed gamma and
against llama.cpp's draft-probability cutoff (draft up to gamma_max, stop once the draft's top
probability falls below p_min), on the derived same-vocabulary pair and mixed Spec-Bench prompts.

    .venv/bin/python -m benchmarks.draft_policy [--prompts N] [--max-tokens N] [--repeats R]

Configurations are interleaved per prompt (rotating order); medians of repeats; ratios against the
plain baseline measured in the same run. Greedy decoding.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgespec.adaptive import AutoGamma  # noqa: E402
from edgespec.drafters.model import ModelDrafter  # noqa: E402
from edgespec.engine import Engine, GenerationConfig, collect  # noqa: E402
from edgespec.factory import RuntimeOptions, load_model  # noqa: E402
from models.derive import derive_pair  # noqa: E402

SPEC_BENCH = ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"


def mixed_prompts(n: int) -> list[str]:
    wanted = ["writing", "qa", "translation", "summarization", "coding", "rag", "math_reasoning", "extraction"]
    by_cat: dict[str, str] = {}
    for line in SPEC_BENCH.read_text().splitlines():
        q = json.loads(line)
        by_cat.setdefault(q["category"], q["turns"][0])
    return [by_cat[c] for c in wanted if c in by_cat][:n]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    opts = RuntimeOptions(n_ctx=4096)
    target_path, draft_path = derive_pair()
    target = load_model(str(target_path), opts)
    draft = load_model(str(draft_path), opts)
    configs = {
        "baseline": lambda: Engine(target, None),
        "draft gamma=auto": lambda: Engine(target, ModelDrafter(draft, target), AutoGamma()),
        "draft gamma=4": lambda: Engine(target, ModelDrafter(draft, target), 4),
        "draft gamma<=16, p_min 0.75": lambda: Engine(target, ModelDrafter(draft, target, p_min=0.75), 16),
    }
    names = list(configs)
    ratios: dict[str, list[float]] = {n: [] for n in names}
    accept: dict[str, list[float]] = {n: [] for n in names}
    print(f"target {target_path.name}, draft {draft_path.name}, {args.max_tokens} tokens, greedy\n")
    print("| prompt | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for text in mixed_prompts(args.prompts):
        prompt = target.tokenize(target.apply_chat_template([{"role": "user", "content": text}]), parse_special=True)
        tps: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.repeats):
            for name in names[r % len(names):] + names[: r % len(names)]:
                res = collect(configs[name]().generate(prompt, GenerationConfig(max_tokens=args.max_tokens)))
                tps[name].append(res.stats.tokens_per_s)
                if res.stats.drafted:
                    accept[name].append(res.stats.acceptance_rate)
        med = {n: statistics.median(v) for n, v in tps.items()}
        for n in names:
            ratios[n].append(med[n] / med["baseline"])
        print(f"| {text[:36]!r} | " + " | ".join(f"{med[n]:.1f} ({med[n] / med['baseline']:.2f}x)" for n in names) + " |",
              flush=True)
    print("| **median ratio** | " + " | ".join(f"**{statistics.median(ratios[n]):.2f}x**" for n in names) + " |")
    print("| acceptance | " + " | ".join(f"{statistics.mean(accept[n]):.2f}" if accept[n] else "-" for n in names) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
