"""Serve a model over HTTP and measure what a client sees (run under the machine's CPU lock):

  1. time to first token on turns 1, 5 and 10 of a chat, with prefix reuse (the server keeps the
     conversation's KV cache) and without it (`cache_prompt: false`, every turn prefilled in full),
     with the prompt tokens each prefilled; both asked the same messages, turn by turn interleaved;
  2. N clients sending requests at once (default 8 clients, 32 requests): throughput (generated
     tokens per wall second) and p50/p95 latency, with the server's drafter vs `draft: none`.

    .venv/bin/python -m benchmarks.server_load [--target smollm2-135m] [--draft ngram] [--json OUT]

It starts `python app.py serve` itself on a free loopback port and prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from edgespec.runtime.llama import DEFAULT_N_CTX

ROOT = Path(__file__).resolve().parent.parent

DOCUMENT = (
    "Release notes, version 4.2 of the Harbor inventory service.\n"
    "1. The import job now accepts CSV files with a header row; columns may come in any order.\n"
    "2. Warehouse codes are checked against the registry before an item is stored; unknown codes are "
    "rejected with error H-104.\n"
    "3. The nightly report lists items whose stock fell below the reorder point, grouped by warehouse, "
    "and is mailed to the warehouse manager at 06:00 local time.\n"
    "4. Prices are stored in cents as integers; the API still accepts decimal strings and rounds half up.\n"
    "5. The search endpoint supports prefix matching on item names and exact matching on SKUs.\n"
    "6. Deleting an item archives it for 30 days before it is removed for good; archived items can be "
    "restored from the admin page.\n"
    "7. Rate limits: 100 requests per minute per API token, 1000 per minute per organisation.\n"
    "8. The service now runs on Python 3.12 and PostgreSQL 16; the migration adds two indexes.\n"
)
QUESTIONS = [
    "What does error H-104 mean?", "When is the nightly report mailed?", "How are prices stored?",
    "What happens when an item is deleted?", "What are the rate limits?", "Which Python version is used?",
    "Does the import job need columns in a fixed order?", "What does the search endpoint support?",
    "Who receives the nightly report?", "Summarise the release in one sentence.",
]
LOAD_PROMPTS = [
    "Rewrite this function with type hints:\n\ndef total(prices, tax):\n    s = 0\n    for p in prices:\n"
    "        s += p\n    return s * (1 + tax)\n",
    "Repeat this list exactly, one item per line: apples, pears, plums, cherries, grapes, lemons.",
    "Convert to JSON: name Alice, age 31, city Paris, languages French and English.",
    "Fix the typo and repeat the sentence: The quick brwn fox jumps over the lazy dog.",
    "Write the numbers from 1 to 20 separated by commas.",
    "Rename the variable x to count in this code:\n\nx = 0\nfor item in items:\n    x += 1\nprint(x)\n",
    "Translate to French: Good morning, how are you today?",
    "Explain what a hash table is in two sentences.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, str(ROOT / "app.py"), "serve", "--port", str(port), "--target", args.target,
           "--draft", args.draft, "--queue", str(args.requests), "--ctx", str(args.ctx)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1800):
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {proc.stderr.read()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("server did not start")


def stream_chat(url: str, body: dict) -> dict:
    """One streamed chat completion: client-side TTFT and latency, the server's timings."""
    t0 = time.perf_counter()
    ttft = None
    text, timings = "", {}
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise SystemExit(f"server error: {chunk['error']['message']}")
            for c in chunk["choices"]:
                piece = c["delta"].get("content")
                if piece and ttft is None:
                    ttft = time.perf_counter() - t0
                text += piece or ""
            timings = chunk.get("timings", timings)
    return {"text": text, "ttft_s": ttft, "latency_s": time.perf_counter() - t0, "timings": timings}


def turns(url: str, args: argparse.Namespace) -> list[dict]:
    # warm-up: a long prefill of other text, so turn 1 does not pay for first-use allocations
    stream_chat(url, {"messages": [{"role": "user", "content": "\n".join(reversed(DOCUMENT.splitlines()))}],
                      "max_tokens": 2, "cache_prompt": False})
    messages = [{"role": "system", "content": "Answer from these notes.\n\n" + DOCUMENT}]
    rows = []
    for n, q in enumerate(QUESTIONS, 1):
        messages.append({"role": "user", "content": q})
        body = {"messages": messages, "max_tokens": args.turn_tokens, "temperature": 0}
        reuse = stream_chat(url, body)
        fresh = stream_chat(url, {**body, "cache_prompt": False})
        rows.append({"turn": n, "prompt_tokens": reuse["timings"]["prompt_n"] + reuse["timings"]["cache_n"],
                     "reuse_ttft_ms": 1000 * reuse["ttft_s"], "reuse_prefilled": reuse["timings"]["prompt_n"],
                     "fresh_ttft_ms": 1000 * fresh["ttft_s"], "fresh_prefilled": fresh["timings"]["prompt_n"]})
        messages.append({"role": "assistant", "content": reuse["text"]})
    return rows


def load(url: str, args: argparse.Namespace, draft: str | None) -> dict:
    latencies: list[float] = []
    tokens = [0]
    errors: list[str] = []
    lock = threading.Lock()
    todo = iter(range(args.requests))

    def client() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            body = {"messages": [{"role": "user", "content": LOAD_PROMPTS[i % len(LOAD_PROMPTS)]}],
                    "max_tokens": args.max_tokens, "temperature": 0}
            if draft is not None:
                body["draft"] = draft
            t0 = time.perf_counter()
            r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
            dt = time.perf_counter() - t0
            with lock:
                if r.status_code == 200:
                    latencies.append(dt)
                    tokens[0] += r.json()["usage"]["completion_tokens"]
                else:
                    errors.append(f"{r.status_code} {r.text[:80]}")

    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    q = statistics.quantiles(latencies, n=20) if len(latencies) >= 2 else latencies * 19
    return {"draft": draft or args.draft, "ok": len(latencies), "errors": errors, "tokens": tokens[0], "wall_s": wall,
            "tokens_per_s": tokens[0] / wall, "p50_s": statistics.median(latencies), "p95_s": q[18]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.server_load", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default="ngram", help="the server's drafter, compared with draft none")
    ap.add_argument("--ctx", type=int, default=DEFAULT_N_CTX)
    ap.add_argument("--turn-tokens", type=int, default=48, help="max tokens per chat turn")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=48, help="max tokens per load-test request")
    ap.add_argument("--skip-turns", action="store_true")
    ap.add_argument("--skip-load", action="store_true")
    ap.add_argument("--json", default=None, help="also write the numbers to this file")
    args = ap.parse_args(argv)
    proc, url = start(args)
    out: dict = {"target": args.target, "draft": args.draft}
    try:
        if not args.skip_turns:
            rows = turns(url, args)
            out["turns"] = rows
            print(f"\n### Time to first token per chat turn ({args.target}, draft {args.draft}, greedy, "
                  f"{args.turn_tokens} tokens per reply)\n")
            print("| turn | prompt tokens | TTFT with reuse | prefilled | TTFT without reuse | prefilled |")
            print("|---|---|---|---|---|---|")
            for r in rows:
                if r["turn"] in (1, 5, 10):
                    print(f"| {r['turn']} | {r['prompt_tokens']} | {r['reuse_ttft_ms']:.0f} ms | {r['reuse_prefilled']} "
                          f"| {r['fresh_ttft_ms']:.0f} ms | {r['fresh_prefilled']} |")
        if not args.skip_load:
            results = []
            for draft in (None, "none"):
                load(url, argparse.Namespace(**{**vars(args), "requests": args.clients}), draft)  # warm-up
                results.append(load(url, args, draft))
            out["load"] = results
            print(f"\n### {args.clients} concurrent clients, {args.requests} requests, {args.max_tokens} max tokens "
                  f"({args.target}, greedy)\n")
            print("| drafter | completed | throughput | p50 latency | p95 latency |")
            print("|---|---|---|---|---|")
            for r in results:
                print(f"| {r['draft']} | {r['ok']}/{args.requests} | {r['tokens_per_s']:.1f} tok/s | {r['p50_s']:.2f} s "
                      f"| {r['p95_s']:.2f} s |")
                for e in r["errors"][:3]:
                    print(f"  error: {e}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
