"""How long should a draft model draft? gamma=auto (edgespec.core.adaptive) against fixed gamma and
against llama.cpp's draft-probability cutoff (draft up to gamma_max, stop once the draft's top
probability falls below p_min), on the derived same-vocabulary pair and mixed Spec-Bench prompts.

    .venv/bin/python -m benchmarks.draft_policy [--prompts N] [--max-tokens N] [--repeats R]

Configurations are interleaved per prompt (rotating order); medians of repeats; ratios against the
plain baseline measured in the same run. Greedy decoding. Every configuration is a session Request;
the p_min cutoff is a drafter registered here ('model-pmin:PATH'), the registry's plug-in way.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from edgespec.core.drafters import DraftContext, register
from edgespec.core.drafters.model import ModelDrafter
from edgespec.models.loader import RuntimeOptions, load_model
from edgespec.service.session import Request, Session, frame
from edgespec.service.suites import load_suite, shipped_suites

P_MIN = 0.75  # llama.cpp's default draft-probability cutoff
WANTED = ["writing", "qa", "translation", "summarization", "coding", "rag", "math_reasoning", "extraction"]


@register("model-pmin", f"a draft model that stops drafting below top probability {P_MIN} (benchmarks.draft_policy)",
          takes_model=True)
def _pmin_drafter(ctx: DraftContext) -> ModelDrafter:
    return ModelDrafter(load_model(ctx.arg, ctx.opts), ctx.target, p_min=P_MIN)


def mixed_prompts(n: int) -> list[str]:
    by_cat: dict[str, str] = {}
    for pr in load_suite(shipped_suites()["spec_bench"]):
        by_cat.setdefault(pr.category, pr.text)
    return [by_cat[c] for c in WANTED if c in by_cat][:n]


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.draft_policy",
                                 description="Draft model: gamma auto vs fixed gamma vs the p_min cutoff")
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    from edgespec.models.derive import derive_pair

    target_path, draft_path = derive_pair()
    session = Session.load(str(target_path), RuntimeOptions())
    framing = frame(session.target, Request(text="?", framing="question")).framing
    configs = {  # name: (draft spec, gamma)
        "baseline": ("none", "0"),
        "draft gamma=auto": (f"model:{draft_path}", "auto"),
        "draft gamma=4": (f"model:{draft_path}", "4"),
        f"draft gamma<=16, p_min {P_MIN}": (f"model-pmin:{draft_path}", "16"),
    }
    names = list(configs)
    ratios: dict[str, list[float]] = {n: [] for n in names}
    accept: dict[str, list[float]] = {n: [] for n in names}
    print(f"target {target_path.name}, draft {draft_path.name}, {args.max_tokens} tokens, greedy, framing {framing}\n")
    print("| prompt | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    try:
        prompts = mixed_prompts(args.prompts)
        for draft, gamma in configs.values():  # untimed: loads draft models, profiles, warms caches
            session.run(Request(text=prompts[0], framing=framing, draft=draft, gamma=gamma, max_tokens=8))
        for text in prompts:
            tps: dict[str, list[float]] = {n: [] for n in names}
            for r in range(args.repeats):
                for name in names[r % len(names):] + names[: r % len(names)]:
                    draft, gamma = configs[name]
                    reply = session.run(Request(text=text, framing=framing, draft=draft, gamma=gamma,
                                                max_tokens=args.max_tokens))
                    tps[name].append(reply.stats.tokens_per_s)
                    if reply.stats.drafted:
                        accept[name].append(reply.stats.acceptance_rate)
            med = {n: statistics.median(v) for n, v in tps.items()}
            for n in names:
                ratios[n].append(med[n] / med["baseline"])
            print(f"| {text[:36]!r} | " + " | ".join(f"{med[n]:.1f} ({med[n] / med['baseline']:.2f}x)" for n in names)
                  + " |", flush=True)
    finally:
        session.close()
    print("| **median ratio** | " + " | ".join(f"**{statistics.median(ratios[n]):.2f}x**" for n in names) + " |")
    print("| acceptance | " + " | ".join(f"{statistics.mean(accept[n]):.2f}" if accept[n] else "-" for n in names) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
