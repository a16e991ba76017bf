"""Replay the n-gram drafter and gamma auto over recorded greedy generations, without the model.

    .venv/bin/python -m benchmarks.ngram_replay [--target gemma3-270m] [--grounded 8] [--open 2]

Greedy decoding makes speculation's outcome a function of the tokens alone: a draft is accepted up
to its first token that differs from what plain decoding produced. So one plain generation per
prompt (cached under the EdgeSpec cache, keyed by model, prompts and length) is enough to replay
any draft policy step by step, pricing each target pass with the machine's stored profile T(K).
This is how gamma auto's n-gram policy is designed and checked quickly; the bench's timed runs
remain the measurement (near-tie divergence and timing noise are not modelled here).

Prompts are ones the bench does not use: Spec-Bench's grounded categories (summarization, RAG,
extraction) after each category's first five, the code edits after the first two, and a few
open-ended ones. Prints:
  - P(draft token j accepted | tokens 1..j-1 accepted, match size h): how acceptance grows along a
    draft copied from a match (a draft that has been right so far is copying a longer match);
  - per prompt and overall, the replayed speedup of each policy over plain decoding.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence

from edgespec.core.adaptive import AutoGamma, size_class
from edgespec.core.costs import CostModel
from edgespec.core.drafters.ngram import NgramDrafter
from edgespec.core.engine import FixedGamma, GammaPolicy, propose_draft
from edgespec.core.stats import Stats
from edgespec.models import resolve
from edgespec.models.loader import RuntimeOptions
from edgespec.runtime.errors import EdgeSpecError, run_command
from edgespec.runtime.firstrun import cache_dir
from edgespec.service.bench.runner import BENCH_MAX_TOKENS
from edgespec.service.session import Request, Session, frame
from edgespec.service.suites import GROUNDED, grounded_prompts, load_suite, shipped_suites

OPEN = ("writing", "roleplay", "reasoning", "math", "coding", "stem", "humanities", "qa", "translation")
J_MAX = 64  # draft positions tabled


def held_out(grounded: int, open_ended: int) -> list:
    by_cat: dict[str, list] = defaultdict(list)
    for suite in ("spec_bench", "code_edit"):
        for pr in load_suite(shipped_suites()[suite]):
            by_cat[pr.category].append(pr)
    skip = {"code_edit": 2}
    out = []
    for cat, ps in by_cat.items():
        n = grounded if cat in GROUNDED else open_ended if any(cat.startswith(o) for o in OPEN) else 0
        out += ps[skip.get(cat, 5):][:n]
    return out


def record(target: str, prompts: Sequence, max_tokens: int, threads: int | None = None) -> list[dict]:
    """[{id, category, prompt: [tokens], out: [tokens]}] from plain greedy generations (cached)."""
    key = hashlib.sha256(json.dumps([target, [p.id for p in prompts], max_tokens]).encode()).hexdigest()[:16]
    path = cache_dir() / "derived" / f"ngram-replay-{key}.json"
    if path.exists():
        return json.loads(path.read_text())
    session = Session.load(target, RuntimeOptions(n_threads=threads))
    rows = []
    try:
        framing = "question"
        for i, pr in enumerate(prompts):
            req = Request(text=pr.text, framing=framing, draft="none", max_tokens=max_tokens)
            prompt = frame(session.target, req).tokens
            out = session.run(req).tokens
            rows.append({"id": pr.id, "category": pr.category, "prompt": list(prompt), "out": list(out)})
            print(f"[{i + 1}/{len(prompts)}] {pr.id} ({pr.category}): {len(out)} tokens", file=sys.stderr)
    finally:
        session.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows))
    return rows


def accepted_prefix(draft: Sequence[int], truth: Sequence[int]) -> int:
    n = 0
    for a, b in zip(draft, truth, strict=False):
        if int(a) != int(b):
            break
        n += 1
    return n


def chain_table(rows: list[dict]) -> dict[int, list[list[int]]]:
    """{match size h: [[accepted, reached] for j = 1..J_MAX]}: at every generated position, the
    drafter's J_MAX-token proposal against what plain decoding produced next."""
    table: dict[int, list[list[int]]] = defaultdict(lambda: [[0, 0] for _ in range(J_MAX)])
    for r in rows:
        d = NgramDrafter()
        d.begin(r["prompt"])
        ctx = list(r["prompt"])
        out = r["out"]
        for t, tok in enumerate(out):
            h = d.match_size(ctx)
            if h:
                prop = d.propose(ctx, J_MAX).tokens.tolist()
                truth = out[t : t + J_MAX]
                m = min(len(prop), len(truth))
                n_acc = accepted_prefix(prop[:m], truth[:m])
                for j in range(min(n_acc + 1, m)):
                    table[h][j][1] += 1
                    table[h][j][0] += j < n_acc
            ctx.append(tok)
            d.commit(ctx, 0)
    return table


def replay(row: dict, policy: GammaPolicy, costs: CostModel, d: NgramDrafter,
           branch: Callable[[list[int], list[int], int], None] | None = None) -> dict:
    """Run the engine's loop over one recorded generation: the engine's own draft phase (choose,
    propose, fit: `engine.propose_draft`), verification (greedy: the accepted prefix of the draft
    against the recorded output), observe, and the engine's counting (`Stats.record_step`); each
    target pass costs the profile's T(k+1). `branch(context, draft, n_accepted)` is told of every
    drafted step (for the second-candidate analysis)."""
    d.begin(row["prompt"])
    policy.start(costs)
    ctx = list(row["prompt"])
    out = row["out"]
    stats, seconds = Stats(), 0.0
    while stats.generated < len(out):
        done = stats.generated
        limit = len(out) - done - 1 if costs.draft_cap is None else min(len(out) - done - 1, costs.draft_cap)
        _, proposed = propose_draft(d, policy, ctx, limit)
        draft = proposed.tokens.tolist()
        k = len(draft)
        n_acc = accepted_prefix(draft, out[done:])
        if branch is not None and k:
            branch(ctx, draft, n_acc)
        seconds += costs.seconds(k + 1)
        policy.observe(k, n_acc)
        new = out[done : done + n_acc + 1]
        ctx += new
        stats.record_step(k, n_acc, len(new), len(new) if done + len(new) == len(out) else None, d.name)
        d.commit(ctx, n_acc)
    # an empty answer (end of generation at once) took no step: plain and speculative alike
    return {"speedup": len(out) * costs.seconds(1) / seconds if seconds else 1.0, "calls": stats.target_calls,
            "drafted_hist": dict(stats.drafted_hist)}


def alternative(context: list[int], size: int, first: int, m: int) -> list[int]:
    """A second candidate: what followed the latest other occurrence of the last `size` tokens
    whose next token differs from `first` (the first candidate's), up to m tokens; [] if none."""
    tail = context[len(context) - size :]
    for end in range(len(context) - 1, size - 1, -1):
        if context[end] != first and context[end - size : end] == tail:
            return context[end : end + m]
    return []


def second_candidates(rows: list[dict], costs: CostModel, lengths: Sequence[int] = (1, 3, 7)) -> None:
    """Would a second candidate continuation, verified in the same pass (a branch of m more rows
    with its own sequence id), pay? On every step gamma auto drafted and where the draft was
    rejected, the best case for a branch: it starts exactly at the rejected position (a real tree
    does not know that position and must spread its rows) and copies another occurrence of the
    match there that proposes a different token. It pays only if the tokens it gains per extra
    T(1) of rows beat the tokens per T(1) that speculation already gets."""
    print("\nSecond candidate in the same pass (m more rows on every drafted step, branching at the rejected "
          "position: an upper bound):\n")
    print("| m | drafted steps | rejected | a branch exists | branch right | tokens gained | "
          "extra cost, T(1)s | gained per T(1) | current tokens per T(1) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for m in lengths:
        stats = {"steps": 0, "rejected": 0, "offered": 0, "right": 0, "gained": 0, "extra": 0.0}

        def branch(ctx: list[int], draft: list[int], n_acc: int, row: dict, m: int = m, stats: dict = stats) -> None:
            stats["steps"] += 1
            stats["extra"] += (costs.seconds(len(draft) + 1 + m) - costs.seconds(len(draft) + 1)) / costs.seconds(1)
            if n_acc == len(draft):
                return
            stats["rejected"] += 1
            at = ctx + draft[:n_acc]
            d = NgramDrafter()
            d.begin(at)
            alt = alternative(at, d.match_size(at), draft[n_acc], m)
            truth = row["out"][len(at) - len(row["prompt"]) :]
            stats["offered"] += bool(alt)
            got = accepted_prefix(alt, truth)
            stats["right"] += got > 0
            stats["gained"] += got

        tokens = cost = 0.0
        for r in rows:
            res = replay(r, AutoGamma(), costs, NgramDrafter(), lambda c, d, n, r=r, f=branch: f(c, d, n, r))
            tokens += len(r["out"])
            cost += len(r["out"]) / res["speedup"]
        per = stats["gained"] / stats["extra"] if stats["extra"] else 0.0
        print(f"| {m} | {stats['steps']} | {stats['rejected']} | {stats['offered']} | {stats['right']} | "
              f"{stats['gained']} | {stats['extra']:.0f} | {per:.2f} | {tokens / cost:.2f} |")


Variant = Callable[[], tuple[GammaPolicy, CostModel, NgramDrafter]]  # a fresh policy, its costs, a drafter


def compare(rows: list[dict], variants: dict[str, Variant]) -> None:
    names = list(variants)
    print("| prompt | tokens | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    by_group: dict[str, dict[str, list[float]]] = {"grounded": defaultdict(list), "open": defaultdict(list)}
    for r in rows:
        cells = []
        group = "grounded" if r["category"] in GROUNDED else "open"
        for name in names:
            res = replay(r, *variants[name]())
            by_group[group][name].append(res["speedup"])
            cells.append(f"{res['speedup']:.2f}x")
        print(f"| {r['category']} {r['id']} | {len(r['out'])} | " + " | ".join(cells) + " |")
    for group, res in by_group.items():
        if not res:
            continue
        print(f"\n{group}: " + ", ".join(
            f"{n} median {statistics.median(v):.3f}x min {min(v):.2f}x" for n, v in res.items()))
        if len(names) > 1:
            base = res[names[0]]
            for n in names[1:]:
                ratios = [b / a for a, b in zip(base, res[n], strict=True)]
                print(f"  {n} / {names[0]}: median {statistics.median(ratios):.3f}, min {min(ratios):.3f}, "
                      f"max {max(ratios):.3f}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ngram_replay")
    ap.add_argument("--target", default="gemma3-270m")
    ap.add_argument("--grounded", type=int, default=8, help="prompts per grounded category")
    ap.add_argument("--open", type=int, default=2, help="prompts per open-ended category")
    ap.add_argument("--max-tokens", type=int, default=BENCH_MAX_TOKENS, help="the bench's length (default %(default)s)")
    ap.add_argument("--threads", type=int, default=None, help="threads of the recording (greedy tokens do not "
                    "depend on it; on a loaded machine 1 records faster)")
    ap.add_argument("--table", action="store_true", help="print the acceptance-chain table")
    ap.add_argument("--fixed", default="", help="also replay fixed draft lengths, e.g. 7,15")
    ap.add_argument("--branches", action="store_true", help="would a second candidate branch pay?")
    ap.add_argument("--bench-prompts", action="store_true",
                    help="replay the bench's grounded prompts instead (check, not design)")
    args = ap.parse_args(argv)
    prompts = grounded_prompts() if args.bench_prompts else held_out(args.grounded, args.open)
    if not prompts:
        raise EdgeSpecError("no prompts to replay: --grounded and --open are both 0")
    resolve(args.target)  # an unknown name: one line before any recording
    rows = record(args.target, prompts, args.max_tokens, args.threads)
    if args.table:
        table = chain_table(rows)
        print("P(token j accepted | 1..j-1 accepted) by match size h (reached in brackets)\n")
        print("| h | " + " | ".join(f"j={j + 1}" for j in range(8)) + " |")
        print("|---|" + "---|" * 8)
        for h in sorted(table):
            cells = [f"{a / t:.2f} ({t})" if t else "" for a, t in table[h][:8]]
            print(f"| {h} | " + " | ".join(cells) + " |")
        print("\nPooled by the size the match had grown to (h + j - 1, by size class): adaptive.MEASURED_PRIORS\n")
        pooled: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        for h, cells in table.items():
            for j, (a, t) in enumerate(cells):
                cls = size_class(h + j)
                pooled[cls][0] += a
                pooled[cls][1] += t
        print("| size | accepted | tested | P(accepted) |\n|---|---|---|---|")
        for n in sorted(pooled):
            a, t = pooled[n]
            print(f"| {n} | {a} | {t} | {a / t:.3f} |")
        print()
    session = Session.load(args.target, RuntimeOptions())
    try:
        costs = CostModel.for_target(session.target)
    finally:
        session.close()
    variants: dict[str, Variant] = {
        "auto": lambda: (AutoGamma(), costs, NgramDrafter()),
        "auto, drafts <= 16": lambda: (AutoGamma(gamma_max=16), costs, NgramDrafter()),
    }
    for g in (int(x) for x in args.fixed.split(",") if x.strip()):
        variants[f"gamma {g}"] = lambda g=g: (FixedGamma(g), costs, NgramDrafter())
    compare(rows, variants)
    if args.branches:
        second_candidates(rows, costs)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(lambda: main(sys.argv[1:])))  # a bad model name: one line, exit 1
