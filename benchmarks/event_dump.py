"""Every engine event of a fixed set of generations, as JSON, to compare two versions of the code.

    .venv/bin/python -m benchmarks.event_dump --out before.json [--quick]
    .venv/bin/python -m benchmarks.event_dump --out after.json [--quick]
    .venv/bin/python -m benchmarks.event_dump --compare before.json after.json

A redesign that keeps behaviour gives the same tokens, sources, drafter names, gammas, acceptances,
finish reasons and counters for every event and every reply. Timings (and the figures derived from
them) are left out; the gamma policies are fixed, because gamma auto reads measured step costs.
Greedy and sampled (seeded) generations, the n-gram, suffix and draft-model drafters, stop strings
and a short budget are covered, on the bundled models and, when installed, the real Qwen pair.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edgespec.core.sampling import SamplingParams
from edgespec.models.loader import RuntimeOptions
from edgespec.runtime.errors import EdgeSpecError
from edgespec.service.session import Request, Session
from edgespec.service.suites import load_suite

# (name, target, draft, gamma, temperature, stop, max_tokens)
CASES = [
    ("plain", "gemma3-270m", "none", "0", 0.0, (), 48),
    ("ngram g4", "gemma3-270m", "ngram", "4", 0.0, (), 48),
    ("ngram g8 sampled", "gemma3-270m", "ngram", "8", 0.8, (), 48),
    ("suffix g6", "gemma3-270m", "suffix", "6", 0.0, (), 48),
    ("ngram g4 stop", "gemma3-270m", "ngram", "4", 0.0, ("return", "\n\n\n"), 48),
    ("ngram g4 short", "smollm2-135m", "ngram", "4", 0.0, (), 7),
    ("draft model g4", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "4", 0.0, (), 32),
    ("draft model g3 sampled", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "3", 0.7, (), 32),
    ("ngram g8 real", "qwen2.5-coder-1.5b", "ngram", "8", 0.0, (), 32),
]
QUICK = {"plain", "ngram g4", "ngram g8 sampled", "suffix g6", "ngram g4 stop", "ngram g4 short"}


def _counts(d: dict) -> dict:
    """The deterministic part of a stats dict: integers, strings and lists or maps of integers."""
    keep = {}
    for k, v in d.items():
        if isinstance(v, bool) or isinstance(v, int | str):
            keep[k] = v
        elif isinstance(v, list) and all(isinstance(x, int) for x in v):
            keep[k] = v
        elif isinstance(v, dict) and v and all(isinstance(x, int) for x in v.values()) and not k.startswith("pass_"):
            keep[k] = v
    return keep


def _event(ev) -> dict:
    return {"tokens": list(ev.tokens), "sources": list(ev.sources), "drafters": list(ev.drafted_by),
            "gamma": ev.gamma, "drafted": ev.drafted, "accepted": ev.accepted,
            "finish_reason": ev.finish_reason, "source": ev.source, "stats": _counts(ev.stats.to_dict())}


def dump(quick: bool) -> dict:
    prompts = [p.text for p in load_suite("code_edit")[:2]] + [load_suite("spec_bench")[0].text]
    out: dict = {}
    sessions: dict[str, Session] = {}
    for name, target, draft, gamma, temp, stop, max_tokens in CASES:
        if quick and name not in QUICK:
            continue
        try:
            session = sessions.get(target) or Session.load(target, RuntimeOptions(n_ctx=2048, n_threads=2))
        except EdgeSpecError as e:
            print(f"skipped {name}: {e}", file=sys.stderr)
            continue
        sessions[target] = session
        for i, prompt in enumerate(prompts):
            req = Request(text=prompt, draft=draft, gamma=gamma, max_tokens=max_tokens, stop=stop,
                          sampling=SamplingParams(temperature=temp, seed=7))
            events, reply = [], None
            for ev, folded in session.generate(req):
                events.append(_event(ev))
                reply = folded
            out[f"{name} #{i}"] = {"events": events, "tokens": list(reply.tokens), "text": reply.text,
                                   "finish_reason": reply.finish_reason, "stats": _counts(reply.stats.to_dict())}
            print(f"{name} #{i}: {len(events)} events, {len(reply.tokens)} tokens", file=sys.stderr)
    for s in sessions.values():
        s.close()
    return out


# Counters renamed since a dump was written: old name -> new name (compared under the new name).
RENAMED = {"gamma_hist": "drafted_hist"}


def _renamed(d):
    if isinstance(d, dict):
        return {RENAMED.get(k, k): _renamed(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_renamed(x) for x in d]
    return d


def compare(a: dict, b: dict) -> tuple[list[str], list[str]]:
    """(differences between the replies, differences between the events) of two dumps. A reply is
    its tokens, text, finish reason and counters; its events are how the engine handed it out."""
    a, b = _renamed(a), _renamed(b)
    replies = [f"only in the first: {k}" for k in a if k not in b] + [f"only in the second: {k}" for k in b if k not in a]
    events = []
    for k in a:
        if k not in b:
            continue
        fields = [f for f in ("tokens", "text", "finish_reason", "stats") if a[k][f] != b[k][f]]
        if fields:
            replies.append(f"{k}: the reply's {', '.join(fields)} differ")
        ea, eb = a[k]["events"], b[k]["events"]
        if ea != eb:
            n = min(len(ea), len(eb))
            first = next((i for i in range(n) if ea[i] != eb[i]), n)
            what = sorted(f for f in ea[first] if ea[first][f] != eb[first][f]) if first < n else ["count"]
            events.append(f"{k}: events differ from event {first} ({len(ea)} vs {len(eb)} events): {what}")
    return replies, events


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--quick", action="store_true", help="bundled models only")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"))
    args = ap.parse_args(argv)
    if args.compare:
        a, b = (json.loads(p.read_text()) for p in args.compare)
        replies, events = compare(a, b)
        n_events = sum(len(v["events"]) for v in a.values())
        print("\n".join(replies) if replies else f"replies identical: {len(a)} generations")
        print("\n".join(events) if events else f"events identical: {n_events} events")
        return 1 if replies or events else 0
    if args.out is None:
        ap.error("give --out FILE or --compare A B")
    data = dump(args.quick)
    args.out.write_text(json.dumps(data, indent=1))
    print(f"wrote {args.out}: {len(data)} generations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
