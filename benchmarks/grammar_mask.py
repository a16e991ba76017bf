"""What the grammar costs per token: llguidance's mask (the tokens allowed after each token of a
JSON document valid under a schema), its forced tokens, and masking a row of logits, on a model's
real vocabulary; then constrained generations through the engine (plain and n-gram), where the
grammar's share of the decode time is read off Stats.grammar_s.

    .venv/bin/python -m benchmarks.grammar_mask [--target smollm2-135m] [--generate]

Results go in docs/structured_output.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from edgespec.core.grammar import GRAMMAR, Constraint
from edgespec.core.sampling import constrain
from edgespec.models import resolve_local
from edgespec.runtime.errors import run_command
from edgespec.runtime.grammar import grammar_tokenizer
from edgespec.runtime.llama import Model
from edgespec.service.session import Request, Session
from edgespec.service.structured import json_object_grammar, json_schema_grammar

TICKET = {"type": "object", "additionalProperties": False,
          "required": ["title", "priority", "component", "reporter_email", "tags"],
          "properties": {"title": {"type": "string", "maxLength": 80},
                         "priority": {"enum": ["low", "medium", "high"]},
                         "component": {"type": "string"},
                         "reporter_email": {"type": "string", "format": "email"},
                         "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5}}}
DOCUMENT = {"title": "Login page crashes when the password field is empty", "priority": "high",
            "component": "auth", "reporter_email": "dana.kim@acme.dev", "tags": ["login", "crash"]}
PROMPT = ("Turn this bug report into a JSON ticket (title, priority low/medium/high, component, reporter_email, "
          "tags):\nFrom: dana.kim@acme.dev - The login page crashes when the password field is empty. Urgent, it "
          "blocks everyone. Component: auth.")


def replay(model: Model, spec: str, text: str) -> dict:
    """Per token of `text` (a document the grammar accepts): mask, forced tokens, and a masked row."""
    c = Constraint(grammar_tokenizer(model), spec)
    tokens = model.tokenize(text, add_special=False)
    masks, forced = [], []
    row = np.random.default_rng(0).normal(size=(1, model.n_vocab)).astype(np.float32)
    apply = []
    for t in tokens:
        t0 = time.perf_counter()
        allowed = c.masks([])
        t1 = time.perf_counter()
        c.forced()
        t2 = time.perf_counter()
        constrain(row, allowed)
        apply.append(time.perf_counter() - t2)
        masks.append(t1 - t0)
        forced.append(t2 - t1)
        c.advance([t])
    return {"tokens": len(tokens), "mask_us": 1e6 * statistics.median(masks), "mask_us_max": 1e6 * max(masks),
            "forced_us": 1e6 * statistics.median(forced), "apply_us": 1e6 * statistics.median(apply)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.grammar_mask")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--generate", action="store_true", help="also run constrained generations through the engine")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    path = resolve_local(args.target)
    if path is None:
        print(f"{args.target} is not installed", file=sys.stderr)
        return 1
    model = Model(path, n_ctx=2048, n_threads=args.threads)
    t0 = time.perf_counter()
    grammar_tokenizer(model)
    print(f"{args.target}: vocabulary {model.n_vocab} tokens, tokenizer built in {time.perf_counter() - t0:.2f} s")
    for name, spec in (("ticket schema", json_schema_grammar(TICKET)), ("json_object", json_object_grammar())):
        r = replay(model, spec, json.dumps(DOCUMENT))
        print(f"  {name}: {r['tokens']} tokens, mask {r['mask_us']:.0f} us median ({r['mask_us_max']:.0f} max), "
              f"forced tokens {r['forced_us']:.0f} us, masking one row {r['apply_us']:.0f} us")
    model.close()
    if args.generate:
        from edgespec.models.loader import RuntimeOptions

        session = Session.load(args.target, RuntimeOptions(n_threads=args.threads))
        try:
            for draft in ("none", "ngram"):
                reply = session.run(Request(text=PROMPT, draft=draft, max_tokens=160, grammar=json_schema_grammar(TICKET)))
                st = reply.stats
                print(f"  generate draft={draft}: {st.generated} tokens in {st.target_calls} passes, "
                      f"{st.tokens_per_s:.1f} tok/s, grammar {1000 * st.grammar_s:.1f} ms = "
                      f"{100 * st.grammar_s / st.decode_s:.1f}% of decode, forced accepted "
                      f"{st.source_accepted.get(GRAMMAR, 0)}, finish {reply.finish_reason}; {reply.text[:80]!r}")
        finally:
            session.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(lambda: main(sys.argv[1:])))  # a bad model name: one line, exit 1
