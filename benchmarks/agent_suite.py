"""The agent suite through `serve`: stateless chat requests as coding agents and pipelines send them
(edits, diffs, rewrites, tool calls, extraction; `edgespec/service/suites/agent.jsonl`), sent in order with
the official `openai` client to `python app.py serve`, started here on 127.0.0.1.

    .venv/bin/python -m benchmarks.agent_suite --target qwen2.5-coder-1.5b [--repeats 3]
        [--drafts ngram,suffix] [--reference llama.cpp:ngram-simple,ngram-map-k,ngram-mod,ngram-cache]
        [--suite agent] [--suite code_open] [--out DIR] [--constrained] [--prediction]

Timing discipline, as the bench's: every request runs plain (`draft: none`) and each drafter in a
rotating order, one after another on the same server, and every ratio is of medians over repeats of
the same request. Each repeat is one pass through the whole suite in file order under its own API
key, so the suffix drafter learns only from the earlier answers of that pass (never from the same
request's answer in an earlier repeat), as an agent session would. Rates are the server's decode
rate (`timings.predicted_per_second`: tokens after the prompt over decode seconds), the measure
llama.cpp's programs print too.

The llama.cpp references (`--reference`) run `llama-speculative-simple` (edgespec/runtime/llamacpp.py,
built by scripts/build_reference.sh) on the same prompt tokens, one process per request: its
ngram-cache type learns within a request only (this llama.cpp neither saves its dynamic cache nor
takes -lcd in that program). Without the binary they are skipped with one line.

Prints a per-request table (later requests of a session vs its first one) and the ratios per kind.

`--constrained`: what agents send for structured answers. A request whose suite line has a `schema`
(the extractions) asks for it as `response_format` json_schema (strict); one with `tools` (the tool
calls) sends them with `tool_choice: "required"` (one call: `parallel_tool_calls: false`). Plain
decoding and every drafter get the same constraint, so the baseline is constrained plain decoding
and the drafters add the grammar's forced tokens (source `grammar`) to their own. A further table
gives per kind and configuration the share of answers valid under their schema (`jsonschema`) or
read as a call of one of the tools with valid arguments, the accepted draft tokens by source
(`timings.draft_n_accepted_by_source`) and the grammar's time as a share of decode time.

`--prediction`: a request of kind rewrite or edit sends the file its prompt holds (the fenced code
block, fences included: the answer's own format) as `prediction: {"type": "content", ...}` with every
drafter, and a configuration `prediction` (`draft: none` with the prediction) is added; `plain`
stays plain decoding without it.

`--suite agent_heldout` holds requests written after the constrained variants were built and never
tuned on (new tickets, emails and invoices with other fields, other tools), for the carry-over check.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema

from edgespec.core.stats import speedup
from edgespec.runtime import llamacpp
from edgespec.runtime.errors import EdgeSpecError
from edgespec.runtime.llama import DEFAULT_N_CTX
from edgespec.service.suites import Prompt, load_suites

ROOT = Path(__file__).resolve().parent.parent
PLAIN = "plain"
PREDICTION = "prediction"  # --prediction: draft none with the prediction (the prediction drafts alone)


@dataclass
class Result:
    """One request's runs of one configuration."""

    rates: list[float] = field(default_factory=list)  # decode tokens/s per repeat
    generated: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    by_source: dict[str, int] = field(default_factory=dict)  # accepted draft tokens by source, pooled
    drafted_by_source: dict[str, int] = field(default_factory=dict)  # drafted tokens by source, pooled
    valid: list[bool] = field(default_factory=list)  # constrained answers: valid under their constraint
    finishes: list[str] = field(default_factory=list)
    grammar_ms: float = 0.0  # the grammar's masks and forced tokens, pooled
    decode_ms: float = 0.0

    @property
    def rate(self) -> float:
        return statistics.median(self.rates) if self.rates else 0.0

    @property
    def tokens(self) -> int:
        return int(statistics.median(self.generated)) if self.generated else 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace, port: int, log: Path) -> subprocess.Popen:
    """`python app.py serve` with the suffix drafter (requests pick theirs with `draft`)."""
    cmd = [sys.executable, str(ROOT / "app.py"), "serve", "--port", str(port), "--target", args.target,
           "--draft", "suffix", "--ctx", str(args.ctx), "--flash-attn", args.flash_attn, "--queue", "2"]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.exact:
        cmd.append("--exact")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, env=os.environ.copy())
    return wait_healthy(proc, port, log, args.start_timeout)


def wait_healthy(proc: subprocess.Popen, port: int, log: Path, timeout: float) -> subprocess.Popen:
    """`proc` once its server answers /health on 127.0.0.1:`port`; a clear error if it exits or
    does not answer within `timeout` seconds."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EdgeSpecError(f"the server exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise EdgeSpecError(f"the server did not start within {timeout:.0f} s (log: {log})")


def messages(pr: Prompt) -> list[dict]:
    return ([{"role": "system", "content": pr.system}] if pr.system else []) + [{"role": "user", "content": pr.text}]


def budget(pr: Prompt, max_tokens: int | None) -> int:
    """The answer's token budget: --max-tokens for every request, else the request's own, else 128."""
    return max_tokens or pr.max_tokens or 128


PREDICTED_KINDS = ("rewrite", "edit")
CODE_BLOCK = re.compile(r"^```[^\n]*\n.*?^```[ \t]*$", re.DOTALL | re.MULTILINE)


def constraint(pr: Prompt, constrained: bool) -> dict:
    """What a constrained run adds to the request: the schema as response_format, or the tools with
    a required call (one)."""
    if not constrained:
        return {}
    if pr.schema is not None:
        name = re.sub(r"[^A-Za-z0-9_-]", "_", pr.session or pr.id)[:64]
        return {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": name, "schema": pr.schema, "strict": True}}}
    if pr.tools:
        return {"tools": list(pr.tools), "tool_choice": "required", "parallel_tool_calls": False}
    return {}


def predicted(pr: Prompt) -> str | None:
    """The file a rewrite or edit request holds (its first fenced code block, fences included)."""
    if (pr.kind or pr.category) not in PREDICTED_KINDS:
        return None
    m = CODE_BLOCK.search(pr.text)
    return m.group(0) if m else None


def schema_errors(value, schema: dict) -> list[str]:  # noqa: ANN001 - a JSON value
    """What makes `value` invalid under `schema` (jsonschema's messages; empty when it is valid)."""
    return [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(value)]


def valid(pr: Prompt, text: str, calls: list[dict]) -> bool | None:
    """Whether a constrained answer holds: JSON valid under the request's schema, or at least one
    call, each of a function among its tools with JSON arguments valid under that function's
    parameters. None for a request without a constraint."""
    if pr.schema is not None:
        try:
            return not schema_errors(json.loads(text), pr.schema)
        except ValueError:
            return False
    if pr.tools:
        fns = {t["function"]["name"]: t["function"].get("parameters") or {"type": "object"} for t in pr.tools}
        if not calls:
            return False
        for c in calls:
            if c["name"] not in fns:
                return False
            try:
                args = json.loads(c["arguments"])
            except ValueError:
                return False
            if schema_errors(args, fns[c["name"]]):
                return False
        return True
    return None


def ask(client, model: str, pr: Prompt, draft: str, max_tokens: int, extra: dict | None = None) -> dict:  # noqa: ANN001 - openai.OpenAI
    """One request; `extra`: the constraint and prediction fields of the body."""
    extra = dict(extra or {})
    kw = {k: extra.pop(k) for k in ("response_format", "tools", "tool_choice", "parallel_tool_calls") if k in extra}
    r = client.chat.completions.create(model=model, messages=messages(pr), max_tokens=max_tokens,
                                       temperature=0, extra_body={"draft": draft, **extra}, **kw)
    t = r.model_extra["timings"]
    msg = r.choices[0].message
    calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in msg.tool_calls or ()]
    text = msg.content or ""
    if calls:  # compared across configurations without the calls' random ids
        text += "".join(json.dumps(c, ensure_ascii=False) for c in calls)
    return {"text": text, "content": msg.content or "", "calls": calls, "rate": t["predicted_per_second"],
            "n": t["predicted_n"], "drafted": t["draft_n"], "accepted": t["draft_n_accepted"],
            "by_source": t.get("draft_n_accepted_by_source", {}), "drafted_by_source": t.get("draft_n_by_source", {}),
            "grammar_ms": t.get("grammar_ms") or 0.0, "decode_ms": t.get("predicted_ms") or 0.0,
            "finish": r.choices[0].finish_reason}


class References:
    """llama.cpp's own speculation on the prompt tokens the server would decode."""

    def __init__(self, args: argparse.Namespace, types: list[str], log) -> None:  # noqa: ANN001
        self.runs: dict[str, llamacpp.LlamaCppSpeculative] = {}
        self.model = None
        binary = llamacpp.find_binary()
        if not types:
            return
        if binary is None:
            log(llamacpp.missing_message())
            return
        from edgespec.models.loader import RuntimeOptions, load_model

        self.model = load_model(args.target, RuntimeOptions(n_ctx=args.ctx, n_threads=args.threads,
                                                            flash_attn=args.flash_attn, exact=args.exact))
        self.runs = {llamacpp.PREFIX + t: llamacpp.LlamaCppSpeculative(binary, self.model, t) for t in types}

    def tokens(self, pr: Prompt) -> list[int]:
        from edgespec.service.session import Request, frame

        msgs = [{"role": "user", "content": pr.text}]
        return frame(self.model, Request(messages=msgs, system=pr.system, framing="auto", draft="none")).tokens

    def close(self) -> None:
        if self.model is not None:
            self.model.close()


def run(args: argparse.Namespace) -> dict:
    prompts = load_suites(args.suite, args.category, None)
    if args.kind:
        prompts = [pr for pr in prompts if (pr.kind or pr.category) in args.kind]
        if not prompts:
            raise EdgeSpecError(f"no requests of kind {', '.join(args.kind)}")
    if args.limit:
        prompts = prompts[: args.limit]
    drafts = [d.strip() for d in args.drafts.split(",") if d.strip()]
    configs = [PLAIN, *([PREDICTION] if args.prediction else []), *drafts]
    if args.prediction and not any(predicted(pr) for pr in prompts):
        raise EdgeSpecError(f"--prediction: no request of kind {' or '.join(PREDICTED_KINDS)} with a code block")
    if args.constrained and not any(constraint(pr, True) for pr in prompts):
        raise EdgeSpecError("--constrained: none of these requests has a 'schema' or 'tools' in its suite line")
    types = [t for spec in args.reference for t in llamacpp.parse_reference(spec)]
    if types and (args.constrained or args.prediction):
        raise EdgeSpecError("--reference runs llama.cpp without a grammar or a prediction: leave it out with "
                            "--constrained or --prediction")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    refs = References(args, types, log)
    names = configs + list(refs.runs)
    results = {pr.id: {name: Result() for name in names} for pr in prompts}
    out_dir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="edgespec-agent-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log(f"starting the server on 127.0.0.1:{port} ({args.target}; log {out_dir / 'server.log'})")
    proc = start_server(args, port, out_dir / "server.log")
    import openai

    try:
        model = args.target
        for r in range(args.repeats):
            # each pass its own key: the suffix drafter's earlier answers are that pass's only
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=f"agent-suite-pass-{r}",
                                   max_retries=0, timeout=1800)
            for i, pr in enumerate(prompts):
                shift = (r + i) % len(configs)
                fixed = constraint(pr, args.constrained)
                file = predicted(pr) if args.prediction else None
                for name in configs[shift:] + configs[:shift]:
                    extra = dict(fixed)
                    if file is not None and name != PLAIN:
                        extra["prediction"] = {"type": "content", "content": file}
                    a = ask(client, model, pr, "none" if name in (PLAIN, PREDICTION) else name,
                            budget(pr, args.max_tokens), extra)
                    res = results[pr.id][name]
                    res.rates.append(a["rate"])
                    res.generated.append(a["n"])
                    res.texts.append(a["text"])
                    res.finishes.append(a["finish"])
                    res.drafted += a["drafted"]
                    res.accepted += a["accepted"]
                    res.grammar_ms += a["grammar_ms"]
                    res.decode_ms += a["decode_ms"]
                    for src, n in a["by_source"].items():
                        res.by_source[src] = res.by_source.get(src, 0) + n
                    for src, n in a["drafted_by_source"].items():
                        res.drafted_by_source[src] = res.drafted_by_source.get(src, 0) + n
                    ok = valid(pr, a["content"], a["calls"]) if fixed else None
                    if ok is not None:
                        res.valid.append(ok)
                if refs.runs:
                    toks = refs.tokens(pr)
                    for name, ref in refs.runs.items():
                        limit = budget(pr, args.max_tokens)
                        sr = ref.generate(toks, limit)
                        generated = sr.n_predict - (1 if sr.n_predict < limit else 0)
                        res = results[pr.id][name]
                        res.rates.append(generated / max(sr.decode_s, 1e-9))
                        res.generated.append(generated)
                        res.texts.append(sr.text)
                        res.drafted += sr.n_drafted
                        res.accepted += sr.n_accept
                log(f"pass {r + 1}/{args.repeats} {pr.id}: "
                    + ", ".join(f"{n} {results[pr.id][n].rates[-1]:.1f}" for n in names) + " tok/s")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        refs.close()
    report = summarise(prompts, names, results)
    report["settings"] = {k: v for k, v in vars(args).items()}
    (out_dir / "results.json").write_text(json.dumps(report, indent=1))
    print(markdown(report, names))
    log(f"wrote {out_dir / 'results.json'}")
    return report


def summarise(prompts: list[Prompt], names: list[str], results: dict) -> dict:
    """Per request: medians, ratios over plain, whether greedy text equals plain's; per kind and
    overall: total tokens over total seconds of the median rates, over plain's."""
    rows = []
    step: dict[str, int] = {}
    for pr in prompts:
        res = results[pr.id]
        base = res[PLAIN]
        session = pr.session or pr.id
        step[session] = step.get(session, 0) + 1
        row = {"id": pr.id, "kind": pr.kind or pr.category, "session": session, "step": step[session],
               "tokens": base.tokens, "plain_tok_s": base.rate, "plain_text": base.texts[0] if base.texts else "",
               "configs": {}}
        for name in names:
            x = res[name]
            row["configs"][name] = {
                "tok_s": x.rate, "rates": x.rates, "speedup": speedup(x.rate, base.rate),
                "tokens": x.tokens, "drafted": x.drafted, "accepted": x.accepted, "accepted_by_source": x.by_source,
                "drafted_by_source": x.drafted_by_source, "valid": x.valid, "finishes": x.finishes, "texts": x.texts,
                "grammar_ms": x.grammar_ms, "decode_ms": x.decode_ms,
                "same_text": all(t == base.texts[0] for t in x.texts) if not name.startswith(llamacpp.PREFIX) else None,
            }
        rows.append(row)
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["kind"], []).append(row)
    groups["all"] = rows
    later = [row for row in rows if row["step"] > 1]
    firsts = [row for row in rows if row["step"] == 1 and any(r["session"] == row["session"] for r in later)]
    if later:
        groups["sessions: first requests"] = firsts
        groups["sessions: later requests"] = later
    kinds = {}
    for kind, rs in groups.items():
        cell = {}
        secs_plain = sum(r["configs"][PLAIN]["tokens"] / r["configs"][PLAIN]["tok_s"] for r in rs if r["configs"][PLAIN]["tok_s"])
        tok_plain = sum(r["configs"][PLAIN]["tokens"] for r in rs)
        for name in names:
            toks = sum(r["configs"][name]["tokens"] for r in rs)
            secs = sum(r["configs"][name]["tokens"] / r["configs"][name]["tok_s"] for r in rs if r["configs"][name]["tok_s"])
            rate = toks / secs if secs else 0.0
            cs = [r["configs"][name] for r in rs]
            checked = [v for c in cs for v in c["valid"]]
            by_source: dict[str, int] = {}
            drafted_by: dict[str, int] = {}
            for c in cs:
                for src, n in c["accepted_by_source"].items():
                    by_source[src] = by_source.get(src, 0) + n
                for src, n in c["drafted_by_source"].items():
                    drafted_by[src] = drafted_by.get(src, 0) + n
            decode_ms = sum(c["decode_ms"] for c in cs)
            cell[name] = {"tok_s": rate, "speedup": speedup(rate, tok_plain / secs_plain if secs_plain else 0.0),
                          "requests": len(rs),
                          # constrained answers checked / valid (schema-valid JSON, or calls of the tools)
                          "checked": len(checked), "valid": sum(checked),
                          "drafted": sum(c["drafted"] for c in cs), "accepted": sum(c["accepted"] for c in cs),
                          "accepted_by_source": dict(sorted(by_source.items())),
                          "drafted_by_source": dict(sorted(drafted_by.items())),
                          "grammar_share": sum(c["grammar_ms"] for c in cs) / decode_ms if decode_ms else 0.0,
                          "length_cut": sum(f == "length" for c in cs for f in c["finishes"])}
        kinds[kind] = cell
    return {"requests": rows, "kinds": kinds}


def markdown(report: dict, names: list[str]) -> str:
    short = {n: n.replace(llamacpp.PREFIX, "llama.cpp ") for n in names}
    head = ["request", "kind", "step", "tokens", "plain tok/s", *(f"{short[n]} x" for n in names[1:]),
            "suffix from answers", "same text"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in report["requests"]:
        c = row["configs"]
        sfx = c.get("suffix")
        from_answers = (f"{sfx['accepted_by_source'].get('answers', 0)}/{sfx['accepted']}" if sfx else "-")
        same = [n for n in names[1:] if c[n]["same_text"] is False]
        lines.append("| " + " | ".join([
            row["id"], row["kind"], str(row["step"]), str(row["tokens"]), f"{row['plain_tok_s']:.1f}",
            *(f"{c[n]['speedup']:.2f}" for n in names[1:]), from_answers,
            "yes" if not same else "differs: " + ", ".join(same)]) + " |")
    lines += ["", "| kind | requests | plain tok/s | " + " | ".join(f"{short[n]} x" for n in names[1:]) + " |",
              "|" + "---|" * (len(names) + 2)]
    for kind, cell in report["kinds"].items():
        lines.append(f"| {kind} | {cell[PLAIN]['requests']} | {cell[PLAIN]['tok_s']:.1f} | "
                     + " | ".join(f"{cell[n]['speedup']:.2f}" for n in names[1:]) + " |")
    if "suffix" in names and "ngram" in names:
        lines.append("")
        for kind, cell in report["kinds"].items():
            lines.append(f"suffix / ngram, {kind}: {cell['suffix']['tok_s'] / max(cell['ngram']['tok_s'], 1e-9):.2f}x")
    lines += ["", "| kind | config | valid | accepted/drafted | accepted by source | grammar % of decode | cut at max_tokens |",
              "|---|---|---|---|---|---|---|"]
    for kind, cell in report["kinds"].items():
        for n in names:
            if n.startswith(llamacpp.PREFIX):
                continue
            c = cell[n]
            srcs = ", ".join(f"{src} {c['accepted_by_source'].get(src, 0)}/{c['drafted_by_source'].get(src, 0)}"
                             for src in sorted({*c["accepted_by_source"], *c["drafted_by_source"]}))
            lines.append(f"| {kind} | {short[n]} | " + (f"{c['valid']}/{c['checked']}" if c["checked"] else "-")
                         + f" | {c['accepted']}/{c['drafted']} | {srcs or '-'} | {100 * c['grammar_share']:.1f} | "
                         f"{c['length_cut']} |")
    refs = [n for n in names if n.startswith(llamacpp.PREFIX)]
    if refs and "suffix" in names:
        cell = report["kinds"]["all"]
        best = max(refs, key=lambda n: cell[n]["tok_s"])
        lines.append(f"suffix / best llama.cpp ({short[best]}), all: {cell['suffix']['tok_s'] / max(cell[best]['tok_s'], 1e-9):.2f}x")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    from edgespec.apps.args import Parser

    ap = Parser(prog="python -m benchmarks.agent_suite",
                description="Agent requests through `serve`: plain vs drafters (and llama.cpp's n-gram speculation), "
                "per request and per kind.")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--suite", action="append", default=None, help="suite file or shipped name (default agent; repeatable)")
    ap.add_argument("--category", action="append", default=[], help="only this category (repeatable)")
    ap.add_argument("--drafts", default="ngram,suffix", help="drafters compared with plain, by name (default ngram,suffix)")
    ap.add_argument("--repeats", type=int, default=3, help="passes through the suite (default 3; medians)")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="answer budget of every request (default: each request's own, else 128)")
    ap.add_argument("--kind", action="append", default=[], help="only requests of this kind (edit, diff, rewrite, "
                    "tool, extract; repeatable)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N requests")
    ap.add_argument("--reference", action="append", default=[], metavar="llama.cpp:TYPE,...",
                    help="also run llama.cpp's speculation on the same prompt tokens: " + ",".join(llamacpp.SPEC_TYPES))
    ap.add_argument("--ctx", type=int, default=DEFAULT_N_CTX)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--flash-attn", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--exact", action="store_true")
    ap.add_argument("--start-timeout", type=float, default=1800.0,
                    help="seconds to wait for the server (its first run measures the cost profile)")
    ap.add_argument("--out", default=None, help="folder for results.json and the server's log")
    ap.add_argument("--constrained", action="store_true",
                    help="requests with a schema ask for it as response_format json_schema (strict), those with tools "
                    "send them with tool_choice required; plain and every drafter alike")
    ap.add_argument("--prediction", action="store_true",
                    help="rewrite and edit requests send their file as prediction (every drafter, and a 'prediction' "
                    "configuration: draft none with it); plain stays without")
    return ap


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    args.suite = args.suite or ["agent"]
    if args.repeats < 1:
        raise EdgeSpecError(f"--repeats must be >= 1, got {args.repeats}")
    run(args)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main(sys.argv[1:]))
    except EdgeSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
