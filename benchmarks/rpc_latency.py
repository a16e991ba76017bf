"""The target on llama.cpp's RPC servers over links of 0, 1 and 10 ms round trip (README, "More than
one machine"): plain decoding against n-gram speculation.

    .venv/bin/python -m benchmarks.rpc_latency [--target gemma3-270m] [--rtt-ms 0,1,10] [--repeats 3]
        [--max-tokens 96] [--server-threads 1] [--out FILE.json]

For each round-trip time it starts two loopback rpc-servers (together they hold the target's
layers) behind `LatencyRelay`s, this file's TCP relay that delays every byte by half the round trip
each way, and loads the target through them. Then, for a code-edit prompt and an open-ended one, it
runs plain decoding and n-gram speculation (gamma auto), greedy, interleaved over (repeat, link,
prompt, mode), and prints a Markdown table of medians over the repeats: decode tokens/s, the
speedup, round trips per token (exchanges in which the client waited for a server, counted by the
relays over the decode steps after the first) and tokens per target pass.

Each link has its own cost profile (the profile is keyed by the servers' addresses), measured
through that link before the timed runs, so gamma auto plans with T(K) round trips included. The
0 ms link goes through the relay too (no delay), so every column pays the relay's own hop.
Loopback only; every server, relay and worker it starts is stopped when it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from edgespec.apps.args import Parser
from edgespec.models.loader import RuntimeOptions
from edgespec.runtime import rpc
from edgespec.runtime.errors import EdgeSpecError, run_command
from edgespec.service.session import Request, Session
from edgespec.service.suites import load_suites

MODES = {"plain": ("none", "auto"), "speculative": ("ngram", "auto")}
PROMPTS = (("code_edit", "code_edit"), ("spec_bench", "writing"))  # (suite, category): first prompt of each
CHUNK = 1 << 16


class LatencyRelay:
    """A TCP relay from 127.0.0.1:`port` to a server on 127.0.0.1:`target_port` that holds every
    chunk `rtt_s / 2` seconds in each direction, and counts round trips: answers from the server
    that follow bytes from the client (times the client waited on the link)."""

    def __init__(self, target_port: int, rtt_s: float) -> None:
        self.delay = rtt_s / 2
        self.round_trips = 0
        self._target = target_port
        self._lock = threading.Lock()
        self._client_spoke = False
        self._closing = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self._target))
            for s in (client, server):
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks += [client, server]
            for src, dst, from_client in ((client, server, True), (server, client, False)):
                q: queue.Queue[tuple[float, bytes] | None] = queue.Queue()
                for fn, fargs in ((self._read, (src, q, from_client)), (self._write, (dst, q))):
                    t = threading.Thread(target=fn, args=fargs, daemon=True)
                    t.start()
                    self._threads.append(t)

    def _read(self, src: socket.socket, q: queue.Queue, from_client: bool) -> None:
        while True:
            try:
                data = src.recv(CHUNK)
            except OSError:
                data = b""
            if not data:
                q.put(None)
                return
            with self._lock:
                if not from_client and self._client_spoke:
                    self.round_trips += 1
                self._client_spoke = from_client
            q.put((time.monotonic() + self.delay, data))

    def _write(self, dst: socket.socket, q: queue.Queue) -> None:
        while (item := q.get()) is not None:
            due, data = item
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                dst.sendall(data)
            except OSError:
                return
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self._closing.set()
        self._listener.close()
        for s in self._socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for t in self._threads:
            t.join(5)


class Link:
    """Two rpc-servers behind relays of one round-trip time, and the target loaded through them."""

    def __init__(self, rtt_ms: float, target: str, n_ctx: int, threads: int) -> None:
        self.rtt_ms = rtt_ms
        self.servers, self.relays = [], []
        self.session: Session | None = None
        try:
            for _ in range(2):
                port = rpc.free_port()
                self.servers.append(rpc.start_server(port, threads))
                self.relays.append(LatencyRelay(port, rtt_ms / 1000))
            eps = tuple(f"127.0.0.1:{r.port}" for r in self.relays)
            self.session = Session.load(target, RuntimeOptions(n_ctx=n_ctx, rpc=eps))
        except BaseException:
            self.close()
            raise

    @property
    def round_trips(self) -> int:
        return sum(r.round_trips for r in self.relays)

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
        for r in self.relays:
            r.close()
        for s in self.servers:
            rpc.stop_server(s)


def run(links: Sequence[Link], repeats: int, max_tokens: int) -> list[dict]:
    """Every (repeat, link, prompt, mode), interleaved; one row per run."""
    prompts = [load_suites([suite], [category], 1)[0] for suite, category in PROMPTS]
    rows = []
    for link in links:  # the cost profile of each link, measured through it before any clock runs
        assert link.session is not None
        link.session.prepare(Request(text=prompts[0].text, draft="ngram"))
    for rep in range(repeats):
        for link in links:
            session = link.session
            assert session is not None
            for pr in prompts:
                modes = list(MODES) if rep % 2 == 0 else list(reversed(MODES))  # neither always goes first
                for mode in modes:
                    draft, gamma = MODES[mode]
                    req = Request(text=pr.text, framing="question", draft=draft,
                                  gamma=gamma, max_tokens=max_tokens)
                    # Round trips of the decode steps only: counted from the first step's event on (the
                    # prompt's prefill, whole or reused from the cache, comes before it).
                    first: tuple[int, int] | None = None
                    for _, reply in session.generate(req):
                        if first is None:
                            first = (link.round_trips, len(reply.tokens))
                    assert first is not None
                    st = reply.stats
                    decoded = len(reply.tokens) - first[1]
                    rows.append({
                        "repeat": rep, "rtt_ms": link.rtt_ms, "prompt": pr.id, "mode": mode,
                        "tokens_per_s": st.tokens_per_s, "generated": st.generated, "target_calls": st.target_calls,
                        "decode_round_trips": link.round_trips - first[0], "decode_tokens": decoded,
                        "tokens": reply.tokens,
                    })
                    print(f"  repeat {rep + 1} | {link.rtt_ms:g} ms | {pr.id} | {mode}: {st.tokens_per_s:.1f} tok/s, "
                          f"{st.generated} tokens, {link.round_trips - first[0]} round trips after the first step",
                          flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """Medians over the repeats, one line per (prompt, link)."""
    out = ["| prompt | round trip | plain tok/s | speculative tok/s | speedup | round trips/token plain | "
           "round trips/token speculative | tokens/pass speculative | output = plain |",
           "|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["prompt"], r["rtt_ms"]) for r in rows})
    for prompt, rtt in keys:
        sel = {m: [r for r in rows if (r["prompt"], r["rtt_ms"], r["mode"]) == (prompt, rtt, m)] for m in MODES}

        def med(mode: str, f, sel: dict = sel) -> float:
            return statistics.median(f(r) for r in sel[mode])

        plain, spec = med("plain", lambda r: r["tokens_per_s"]), med("speculative", lambda r: r["tokens_per_s"])
        same = all(r["tokens"] == sel["plain"][0]["tokens"] for r in sel["plain"] + sel["speculative"])
        out.append(
            f"| {prompt} | {rtt:g} ms | {plain:.1f} | {spec:.1f} | {spec / plain:.2f}x | "
            f"{med('plain', lambda r: r['decode_round_trips'] / max(1, r['decode_tokens'])):.2f} | "
            f"{med('speculative', lambda r: r['decode_round_trips'] / max(1, r['decode_tokens'])):.2f} | "
            f"{med('speculative', lambda r: r['generated'] / max(1, r['target_calls'])):.2f} | "
            f"{'yes' if same else 'no'} |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = Parser(prog="python -m benchmarks.rpc_latency", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="gemma3-270m", help="target model (default gemma3-270m)")
    ap.add_argument("--rtt-ms", default="0,1,10", help="round-trip times to inject, in ms (default 0,1,10)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--server-threads", type=int, default=1, help="threads of each rpc-server (default 1)")
    ap.add_argument("--out", default=None, help="also write every run as JSON here")
    args = ap.parse_args(argv)

    def go() -> int:
        try:
            rtts = [float(x) for x in args.rtt_ms.split(",")]
        except ValueError:
            raise EdgeSpecError(f"--rtt-ms takes numbers of milliseconds separated by commas, got {args.rtt_ms!r}") from None
        if any(not 0 <= r <= 1000 for r in rtts) or args.repeats < 1 or args.max_tokens < 1:
            raise EdgeSpecError("--rtt-ms must be within 0..1000 ms, --repeats and --max-tokens at least 1")
        # The relays' ports are new every run, and so are the profiles keyed by them: keep those out
        # of the user's store unless asked.
        os.environ.setdefault("EDGESPEC_PROFILES", tempfile.mkdtemp(prefix="edgespec-rpc-profiles-"))
        from edgespec.models import resolve

        target = str(resolve(args.target))
        links: list[Link] = []
        try:
            for rtt in rtts:
                print(f"loading {Path(target).name} through two rpc-servers at {rtt:g} ms", flush=True)
                links.append(Link(rtt, target, args.ctx, args.server_threads))
            rows = run(links, args.repeats, args.max_tokens)
        finally:
            for link in links:
                link.close()
        print()
        print(f"{Path(target).name}, two loopback rpc-servers ({args.server_threads} thread each), greedy, "
              f"{args.max_tokens} new tokens, medians of {args.repeats} repeats")
        print(table(rows))
        if args.out:
            Path(args.out).write_text(json.dumps(rows, indent=1))
        return 0

    return run_command(go)


if __name__ == "__main__":
    raise SystemExit(main())
