"""An agent framework against `serve`: the OpenAI Agents SDK (`pip install openai-agents==0.24.0`)
runs a two-step tool task through `python app.py serve`, started here on 127.0.0.1 (or a server
already running, `--url`), and the run is checked: the agent looks an order up, then the price of
the order's item (an argument it can only have from the first tool's result), and answers the total.

    .venv/bin/python -m benchmarks.agent_tools --target qwen2.5-coder-1.5b [--draft ngram] [--repeats 3]
    .venv/bin/python -m benchmarks.agent_tools --url http://127.0.0.1:8000/v1 --api-key KEY --model NAME

Prints one JSON line per run (the tool calls in order with their arguments, the final answer, whether
it passed, wall seconds, the server's draft figures summed over the run's requests) and exits 1 when
a run failed. Meant for the real 1.5B: the bundled 135M models are too small to follow the task.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ORDERS = {"5521": {"sku": "KB-104", "quantity": 3}}
PRICES = {"KB-104": 4.25}
TASK = "What does order 5521 cost in total? Use the tools: look up the order, then the price of its item."
EXPECTED = "12.75"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen, str]:
    import httpx

    port = free_port()
    cmd = [sys.executable, str(ROOT / "app.py"), "serve", "--port", str(port), "--target", args.target,
           "--draft", args.draft, "--ctx", str(args.ctx)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, env=os.environ.copy())
    deadline = time.monotonic() + args.start_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("error: ")]
            why = f": {lines[-1][len('error: '):]}" if lines else ""
            raise SystemExit(f"error: the server exited (status {proc.returncode}){why}; its log: {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc, f"http://127.0.0.1:{port}/v1"
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"error: the server did not answer /health within {args.start_timeout:.0f} s; its log: {log}")


def run_once(url: str, api_key: str, model: str) -> dict:
    """One agent run; what it called, what it answered, and the server's figures for its requests."""
    import httpx
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    calls: list[tuple[str, dict]] = []
    figures = {"requests": 0, "predicted_n": 0, "draft_n": 0, "draft_n_accepted": 0}

    async def count(response: httpx.Response) -> None:  # the server's timings, request by request
        await response.aread()
        timings = (response.json() or {}).get("timings") or {}
        figures["requests"] += 1
        for k in ("predicted_n", "draft_n", "draft_n_accepted"):
            figures[k] += timings.get(k, 0)

    @function_tool
    def lookup_order(order_id: str) -> dict:
        """Look up an order by its id: the item's SKU and the quantity ordered."""
        calls.append(("lookup_order", {"order_id": order_id}))
        return ORDERS.get(order_id.strip(), {"error": f"no order {order_id}"})

    @function_tool
    def get_price(sku: str) -> dict:
        """The unit price of an item, in dollars, by its SKU."""
        calls.append(("get_price", {"sku": sku}))
        return {"unit_price": PRICES[sku.strip()]} if sku.strip() in PRICES else {"error": f"no item {sku}"}

    http = httpx.AsyncClient(event_hooks={"response": [count]}, timeout=600)
    client = AsyncOpenAI(base_url=url, api_key=api_key, http_client=http, max_retries=0)
    agent = Agent(name="clerk", instructions="You answer questions about orders. Use the tools; do not guess.",
                  tools=[lookup_order, get_price], model=OpenAIChatCompletionsModel(model=model, openai_client=client),
                  model_settings=ModelSettings(temperature=0.0, max_tokens=256))
    t0 = time.monotonic()
    result = Runner.run_sync(agent, TASK, max_turns=6)
    wall = time.monotonic() - t0
    answer = str(result.final_output)
    passed = (calls[:1] == [("lookup_order", {"order_id": "5521"})] and ("get_price", {"sku": "KB-104"}) in calls
              and EXPECTED in answer.replace("$", ""))
    return {"passed": passed, "calls": calls, "answer": answer, "wall_s": round(wall, 2), "server": figures}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument("--draft", default="ngram")
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--url", help="a running server's /v1 address (no server is started)")
    p.add_argument("--api-key", default="local")
    p.add_argument("--model", help="the model id to ask for (default: the target)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--start-timeout", type=float, default=600)
    args = p.parse_args(argv)
    try:
        import agents  # noqa: F401
    except ImportError:
        print("error: the OpenAI Agents SDK is not installed: .venv/bin/python -m pip install openai-agents==0.24.0",
              file=sys.stderr)
        return 1
    proc, url = None, args.url
    if url is None:
        log = Path(tempfile.mkdtemp(prefix="edgespec-agent-tools-")) / "serve.log"
        proc, url = start_server(args, log)
    try:
        failed = 0
        for i in range(args.repeats):
            run = run_once(url, args.api_key, args.model or args.target)
            failed += not run["passed"]
            print(json.dumps({"run": i + 1, **run}, ensure_ascii=False), flush=True)
        return 1 if failed else 0
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
