"""What verifying K tokens costs with the small-batch kernels and without, measured in one run.

    .venv/bin/python -m benchmarks.verify_kernels [--models qwen2.5-coder-1.5b,gemma3-270m] [--rounds 7]
        [--rows 1-16] [--threads N] [--flash-attn off|on|auto] [--at 512]
    .venv/bin/python -m benchmarks.verify_kernels --e2e [--models qwen2.5-coder-1.5b]
        [--drafts ngram,model:qwen2.5-coder-0.5b] [--max-tokens 96] [--repeats 3] [--edit-prompts 2]
        [--open-prompts 3]

Each model is loaded twice, in two child processes: one runs the small-batch kernel modules the
set-up built (native/smallbatch), the other the unpatched llama.cpp modules (EDGESPEC_KERNELS=stock),
or, with --baseline DIR and/or --baseline-env NAME=VALUE, an earlier build of the small-batch modules
or the same ones with a variable set (GGML_SMALLBATCH_512=0: their 256-bit forms).
The parent asks them for one round at a time, alternating, so that machine noise hits both alike; and
it starts the two children in one order for the first half of the rounds and in the other for the
second half, because the child started first ran 1-4% slower than the other with the very same
modules on a 2-core AMD EPYC (docs/kernels.md): which one loaded first must not decide a ratio. A
round times one pass over K rows (logits on every row, `--at` tokens of context before them) for
every K. The table gives medians over rounds: T(1) in ms, T(K)/T(1) for both, and the patched pass's
cost relative to the stock one; then the median of each round's own ratio and the best round's over
the best round (on a shared host a disturbed round slows both children), plus the spread (max/min of
T(1) over rounds) to judge the run by.

--e2e measures what that does to generation: each child runs the target as a session (gamma auto,
greedy, chat framing) on the code-edit suite and the open-ended coder prompts (code_open), plain and
with each drafter; requests alternate between the two kernel sets, repeats rotate the order (and start
the children afresh, in the other order from the repeat before: an even --repeats balances it), and the
table gives median tokens/s, the speedup over plain within each kernel set, acceptance, the draft
lengths gamma auto chose, and small-batch over stock for the same configuration. Each kernel set
measures its own cost profile, so gamma auto plans with its own T(K).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from edgespec.runtime.errors import EdgeSpecError, run_command

FILLER = (
    "def parse_config(path):\n    with open(path) as fh:\n        data = json.load(fh)\n"
    "    for key, value in data.items():\n        if isinstance(value, str):\n"
    "            data[key] = value.strip()\n    return data\n\n"
    "The configuration loader reads a JSON file, strips whitespace from every string value and "
    "returns the dictionary. Callers pass the path of the file; missing files raise an error. "
)


def parse_rows(text: str) -> list[int]:
    """'1-8,12,16' -> [1, 2, ..., 8, 12, 16]."""
    rows: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise EdgeSpecError(f"--rows: {part.strip()!r} is not a row count or range like 1-16")
        rows.update(range(int(lo), int(hi) + 1) if sep else {int(lo)})
    if not rows or min(rows) < 1 or max(rows) > 512:
        raise EdgeSpecError("--rows: row counts must be between 1 and 512")
    return sorted(rows)


def child(model_name: str, rows: list[int], threads: int | None, flash_attn: str, at: int) -> int:
    """Serve rounds on stdin/stdout: each input line asks for one timed pass per row count."""
    from edgespec.models import resolve
    from edgespec.runtime import llama as runtime

    model = runtime.Model(resolve(model_name), n_ctx=at + max(rows) + 16, n_batch=max(64, max(rows)),
                          n_threads=fixed_threads(threads), flash_attn=flash_attn)
    filler = model.tokenize(FILLER, add_special=True)
    filler = filler * (1 + (at + max(rows)) // len(filler))
    model.decode(filler[:at], n_logits=0)
    passes = filler[at : at + max(rows)]
    info = runtime.backend_info()
    print(json.dumps({"ready": True, "kernels": info.kernels, "variant": info.variant, **threads_info(model)}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        out = {}
        for _ in range(int(os.environ.get('VK_WARM', '0'))):
            model.truncate(at)
            model.decode(passes[:1], n_logits=1)
        for k in rows:  # a warm-up pass first, then the timed one
            for timed in (False, True):
                model.truncate(at)
                t = time.perf_counter()
                model.decode(passes[:k], n_logits=k)
                if timed:
                    out[k] = time.perf_counter() - t
        print(json.dumps(out), flush=True)
    model.close()
    return 0


def e2e_child(model_name: str, threads: int | None) -> int:
    """Serve generation requests (JSON lines: text, draft, max_tokens) with one session."""
    from edgespec.models.loader import RuntimeOptions
    from edgespec.service.session import Request, Session

    session = Session.load(model_name, RuntimeOptions(n_threads=fixed_threads(threads)))
    session.run(Request(text="Say hi.", framing="question", draft="none", gamma="0", max_tokens=4))
    info = {**runtime_info(), **threads_info(session.target)}
    print(json.dumps({"ready": True, **info}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        q = json.loads(line)
        reply = session.run(Request(text=q["text"], framing="question", draft=q["draft"], gamma="auto",
                                    max_tokens=q["max_tokens"]))
        st = reply.stats
        print(json.dumps({"tokens": reply.tokens, "tok_s": st.tokens_per_s, "generated": st.generated,
                          "drafted": st.drafted, "accepted": st.accepted, "calls": st.target_calls,
                          "drafted_hist": {str(k): v for k, v in st.drafted_hist.items()}}), flush=True)
    session.close()
    return 0


def fixed_threads(threads: int | None) -> int:
    """The children's thread count: the one asked for, else every core this process may use, fixed.
    With no count a model's threads follow the cores other processes leave free (runtime/threads.py),
    and a child would read its sibling's round (both cores busy for a second or more) as another
    process's load and run its next half second of passes on one thread (docs/kernels.md)."""
    return threads or max(1, len(os.sched_getaffinity(0)))


def threads_info(model) -> dict:
    return {"threads": model.n_threads, "auto_threads": model.auto_threads}


def runtime_info() -> dict:
    from edgespec.runtime import llama as runtime
    info = runtime.backend_info()
    return {"kernels": info.kernels, "variant": info.variant}


class Child:
    def __init__(self, model: str, kernels: str, args: argparse.Namespace, e2e: bool = False) -> None:
        env = {**os.environ}
        if kernels == "stock" and (args.baseline or args.baseline_env):  # another build or setting of the kernels
            env.pop("EDGESPEC_KERNELS", None)
            if args.baseline:
                env["EDGESPEC_KERNEL_MODULES"] = args.baseline
            env.update(baseline_env(args))
        elif kernels == "stock":
            env["EDGESPEC_KERNELS"] = "stock"
        else:
            env.pop("EDGESPEC_KERNELS", None)
        cmd = [sys.executable, "-m", "benchmarks.verify_kernels", "--child", model, "--rows", args.rows,
               "--flash-attn", args.flash_attn, "--at", str(args.at)] + (["--e2e"] if e2e else [])
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        hello = self._read()
        self.kernels, self.variant = hello["kernels"], hello["variant"]
        self.threads, self.auto_threads = hello["threads"], hello["auto_threads"]

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise EdgeSpecError(f"the benchmark child exited ({self.proc.wait()}) before answering")
        return json.loads(line)

    def round(self) -> dict[int, float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return {int(k): v for k, v in self._read().items()}

    def ask(self, request: dict) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


KERNEL_SETS = ("smallbatch", "stock")


def start_children(model: str, args: argparse.Namespace, turn: int, e2e: bool = False) -> dict[str, Child]:
    """Both kernel sets' children, the small-batch one started first on even turns and second on odd ones."""
    order = KERNEL_SETS if turn % 2 == 0 else tuple(reversed(KERNEL_SETS))
    children: dict[str, Child] = {}
    try:
        for name in order:
            children[name] = Child(model, name, args, e2e=e2e)
        if children["smallbatch"].kernels != "smallbatch":
            raise EdgeSpecError("the small-batch kernel modules are not installed here (re-run scripts/setup.sh; "
                                "its log says why when they could not be built)")
    except BaseException:
        for c in children.values():
            c.close()
        raise
    return {name: children[name] for name in KERNEL_SETS}


def measure(model: str, args: argparse.Namespace) -> None:
    rows = parse_rows(args.rows)
    times: dict[str, dict[int, list[float]]] = {name: {k: [] for k in rows} for name in KERNEL_SETS}
    first_half = (args.rounds + 1) // 2
    for half, rounds in enumerate((range(first_half), range(first_half, args.rounds))):
        if not rounds:
            continue
        children = start_children(model, args, half)
        try:
            for r in rounds:
                order = list(KERNEL_SETS) if r % 2 == 0 else list(reversed(KERNEL_SETS))
                for name in order:
                    for k, v in children[name].round().items():
                        times[name][k].append(v)
                print(f"[{model}] round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
        finally:
            for c in children.values():
                c.close()
    med = {name: {k: statistics.median(v) for k, v in t.items()} for name, t in times.items()}
    variant = children["stock"].variant
    print(f"\n### {model} ({variant} CPU kernels, {children['stock'].threads} threads, "
          f"flash attention {args.flash_attn}, {args.at} tokens of context, medians of {args.rounds} "
          "interleaved rounds)\n")
    base = _base(args)
    # the two children's passes of one round ran seconds apart: the ratio within a round cancels what
    # slowed the whole round (another guest on the host), and the best round of each is the least disturbed
    print(f"| K | {base} T(K) ms | {base} T(K)/T(1) | small-batch T(K) ms | small-batch T(K)/T(1) | small-batch / {base} "
          "| median of rounds' ratios | best round / best round |")
    print("|---|---|---|---|---|---|---|---|")
    s1, p1 = med["stock"][rows[0]], med["smallbatch"][rows[0]]
    for k in rows:
        s, p = med["stock"][k], med["smallbatch"][k]
        paired = statistics.median(a / b for a, b in zip(times["smallbatch"][k], times["stock"][k], strict=True))
        best = min(times["smallbatch"][k]) / min(times["stock"][k])
        print(f"| {k} | {1000 * s:.1f} | {s / s1:.2f} | {1000 * p:.1f} | {p / p1:.2f} | {p / s:.2f} | {paired:.2f} | {best:.2f} |")
    for name in children:
        t1 = times[name][rows[0]]
        print(f"\n{base if name == 'stock' else name}: T({rows[0]}) spread over rounds {min(t1) * 1000:.1f}-{max(t1) * 1000:.1f} ms "
              f"(max/min {max(t1) / min(t1):.2f})", end="")
    print()


def measure_e2e(model: str, args: argparse.Namespace) -> None:
    from edgespec.service.suites import load_suites

    prompts = load_suites(["code_edit"])[: args.edit_prompts] + load_suites(["code_open"])[: args.open_prompts]
    configs = ["none", *[d.strip() for d in args.drafts.split(",") if d.strip()]]
    res: dict = {}  # (kernels, config, prompt id) -> list of replies
    jobs = [(p, c, k) for p in prompts for c in configs for k in KERNEL_SETS]
    for r in range(args.repeats):
        children = start_children(model, args, r, e2e=True)
        try:
            for i, (p, c, k) in enumerate(jobs[r % len(jobs):] + jobs[: r % len(jobs)]):
                out = children[k].ask({"text": p.text, "draft": c, "max_tokens": args.max_tokens})
                res.setdefault((k, c, p.id), []).append(out)
                print(f"[{model}] repeat {r + 1}/{args.repeats}, {i + 1}/{len(jobs)}", file=sys.stderr, flush=True)
        finally:
            for ch in children.values():
                ch.close()
    groups = {"code edit": [p for p in prompts if p.category == "code_edit"],
              "open-ended": [p for p in prompts if p.category != "code_edit"]}
    print(f"\n### {model}: generation with each kernel set ({children['stock'].variant} CPU kernels, greedy, gamma "
          f"auto, {args.max_tokens} tokens, medians of {args.repeats} interleaved repeats)\n")
    base = _base(args)
    print("| prompts | drafter | kernels | tok/s | speedup over plain | acceptance | draft lengths chosen (length: steps) "
          f"| small-batch / {base} |")
    print("|---|---|---|---|---|---|---|---|")
    for gname, ps in groups.items():
        if not ps:  # --edit-prompts 0 or --open-prompts 0
            continue
        for c in configs:
            rate = {}
            for k in children:
                rate[k] = rate_of(res, k, c, ps)
                drafted = accepted = 0
                hist: dict[str, int] = {}
                for p in ps:
                    mid = median_run(res[(k, c, p.id)])
                    drafted += mid["drafted"]
                    accepted += mid["accepted"]
                    for g, n in mid["drafted_hist"].items():
                        hist[g] = hist.get(g, 0) + n
                plain = rate_of(res, k, "none", ps)
                acc = f"{accepted / drafted:.2f}" if drafted else "–"
                lens = ", ".join(f"{g}: {n}" for g, n in sorted(hist.items(), key=lambda t: int(t[0]))) or "–"
                ratio = f"{rate[k] / rate_of(res, 'stock', c, ps):.2f}x" if k == "smallbatch" else ""
                print(f"| {gname} ({len(ps)}) | {c} | {base if k == 'stock' else k} | {rate[k]:.1f} | {rate[k] / plain:.2f}x | {acc} | {lens} | {ratio} |")
    same = sum(res[("smallbatch", c, p.id)][0]["tokens"] == res[("stock", c, p.id)][0]["tokens"]
               for p in prompts for c in configs)
    print(f"\nsame tokens from both kernel sets: {same} of {len(prompts) * len(configs)} generations")
    for k in children:  # greedy speculation against plain decoding, within each kernel set
        spec = [(c, p) for c in configs if c != "none" for p in prompts]
        equal = sum(res[(k, c, p.id)][0]["tokens"] == res[(k, "none", p.id)][0]["tokens"] for c, p in spec)
        print(f"{base if k == 'stock' else k}: speculation printed plain decoding's tokens in {equal} of {len(spec)} generations")


def _base(args: argparse.Namespace) -> str:
    """What the second kernel set is called in the tables: the unpatched modules, or --baseline's."""
    return "baseline" if args.baseline or args.baseline_env else "stock"


def baseline_env(args: argparse.Namespace) -> dict[str, str]:
    """--baseline-env NAME=VALUE ...: what the baseline child's environment adds."""
    out = {}
    for item in args.baseline_env:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or name != name.strip():
            raise EdgeSpecError(f"--baseline-env {item!r}: write NAME=VALUE, e.g. GGML_SMALLBATCH_512=0")
        out[name] = value
    return out


def refuse_spinning(args: argparse.Namespace) -> None:
    """Refuse OpenMP settings under which a child's threads spin on while it waits for its next round:
    the other child then times its round with a core taken (measured, OMP_WAIT_POLICY=active for the
    baseline: the small-batch child's T(1) read 1.9x its time, docs/kernels.md), and the comparison is noise."""
    for who, env in (("", os.environ), ("--baseline-env ", {**os.environ, **baseline_env(args)})):
        policy = env.get("OMP_WAIT_POLICY", "").strip().lower()
        spin = env.get("GOMP_SPINCOUNT", "").strip().lower()
        if policy == "active" or spin in ("infinite", "infinity") or (spin.isdigit() and int(spin) >= 10**9):
            name = "OMP_WAIT_POLICY" if policy == "active" else "GOMP_SPINCOUNT"
            raise EdgeSpecError(f"{who}{name}={env[name]} keeps a waiting child's threads spinning while the other "
                                "child times its round, so the two would slow each other; unset it")


def median_run(runs: list[dict]) -> dict:
    """The repeat with the median tokens/s."""
    return sorted(runs, key=lambda o: o["tok_s"])[len(runs) // 2]


def rate_of(res: dict, kernels: str, config: str, prompts: list) -> float:
    """Tokens/s of a group of prompts: their tokens over their seconds, each prompt at its median repeat."""
    toks = secs = 0.0
    for p in prompts:
        mid = median_run(res[(kernels, config, p.id)])
        toks += mid["generated"]
        secs += mid["generated"] / mid["tok_s"] if mid["tok_s"] else 0.0
    return toks / secs if secs else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.verify_kernels", description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen2.5-coder-1.5b,gemma3-270m",
                    help="comma-separated model names or GGUF paths")
    ap.add_argument("--rows", default="1-16", help="row counts to time, e.g. 1-16 or 1,2,4,8")
    ap.add_argument("--baseline", default=None, metavar="DIR",
                    help="compare with the small-batch modules in DIR (an earlier build) instead of the unpatched ones")
    ap.add_argument("--baseline-env", action="append", default=[], metavar="NAME=VALUE",
                    help="run the baseline with the small-batch modules (or --baseline's) and this variable set, "
                         "e.g. GGML_SMALLBATCH_512=0 for their 256-bit forms; repeatable")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--flash-attn", choices=["auto", "on", "off"], default="off")
    ap.add_argument("--at", type=int, default=512, help="tokens of context before the timed passes")
    ap.add_argument("--e2e", action="store_true", help="generation with each kernel set instead of T(K)")
    ap.add_argument("--drafts", default="ngram,model:qwen2.5-coder-0.5b", help="with --e2e: drafters besides plain")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--edit-prompts", type=int, default=2, help="with --e2e: the first N code-edit prompts")
    ap.add_argument("--open-prompts", type=int, default=3, help="with --e2e: the first N open-ended coder prompts")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        if args.e2e:
            return run_command(lambda: e2e_child(args.child, args.threads))
        return run_command(lambda: child(args.child, parse_rows(args.rows), args.threads, args.flash_attn, args.at))
    if args.rounds < 1 or args.repeats < 1 or args.max_tokens < 1:
        print("error: --rounds, --repeats and --max-tokens must be at least 1", file=sys.stderr)
        return 2
    if args.edit_prompts < 0 or args.open_prompts < 0 or args.edit_prompts + args.open_prompts < 1:
        print("error: --edit-prompts and --open-prompts must not be negative, and one must be at least 1", file=sys.stderr)
        return 2

    def run() -> int:
        parse_rows(args.rows)
        refuse_spinning(args)
        for model in [m.strip() for m in args.models.split(",") if m.strip()]:
            (measure_e2e if args.e2e else measure)(model, args)
        return 0

    return run_command(run)


if __name__ == "__main__":
    raise SystemExit(main())
