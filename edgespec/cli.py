"""Command line: `python app.py --headless ...` generates in the terminal; plain `python app.py`
opens the web UI; `python app.py bench ...` runs benchmarks."""

from __future__ import annotations

import argparse
import ipaddress
import json
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from edgespec.args import Parser, add_generation_args
from edgespec.errors import EdgeSpecError, run_command

COLOURS = {"draft": "\033[32m", "bonus": "\033[36m", "target": ""}
RESET = "\033[0m"
# Why a generation ended, in words, for the terminal.
FINISH_NOTES = {
    "eog": "the model ended its reply",
    "length": "reached --max-tokens",
    "context": "the context is full (raise --ctx)",
    "stop": "reached a stop string",
    "stopped": "stopped",
}


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="python app.py", description="EdgeSpec: speculative generation on your own machine")
    ap.add_argument("--headless", action="store_true", help="generate in the terminal instead of opening the UI")
    ap.add_argument("--prompt", default=None)
    ap.add_argument("--prompt-file", default=None)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    ap.add_argument("--no-color", action="store_true")
    ap.add_argument("--host", default="127.0.0.1", help="UI address (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=7860, help="UI port (default 7860)")
    add_generation_args(ap)
    return ap


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None and args.prompt_file is not None:
        raise EdgeSpecError("give --prompt or --prompt-file, not both")
    if args.prompt_file is not None:
        p = Path(args.prompt_file)
        if not p.exists():
            raise EdgeSpecError(f"prompt file not found: {p}")
        if p.is_dir():
            raise EdgeSpecError(f"prompt file is a directory: {p}")
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise EdgeSpecError(f"prompt file is not UTF-8 text: {p}") from None
        except OSError as exc:
            raise EdgeSpecError(f"cannot read prompt file {p}: {exc.strerror}") from None
    elif args.prompt is not None:
        text = args.prompt
    else:
        raise EdgeSpecError("--headless needs --prompt TEXT or --prompt-file FILE")
    if not text.strip():
        raise EdgeSpecError("the prompt is empty")
    return text


def headless(args: argparse.Namespace) -> int:
    from edgespec.session import Reply, Request, Session, runtime_options
    from models import DEFAULT_TARGET

    req = Request.from_args(args, read_prompt(args))
    session = Session.load(args.target or DEFAULT_TARGET, runtime_options(args))
    colour = not args.no_color and not args.json and sys.stdout.isatty()
    reply = Reply()
    interrupted = False
    try:
        shown = 0
        for _, reply in session.generate(req):
            if not args.json:
                for piece, src in zip(reply.pieces[shown:], reply.sources[shown:], strict=True):
                    sys.stdout.write(f"{COLOURS[src]}{piece}{RESET}" if colour and COLOURS[src] else piece)
                sys.stdout.flush()
                shown = len(reply.pieces)
    except KeyboardInterrupt:
        interrupted = True
        reply.finish_reason = "interrupted"
    finally:
        session.close()
    if args.json:
        print(json.dumps(reply.to_dict(), ensure_ascii=False))
    elif interrupted and not reply.stats.target_calls:
        print("interrupted", file=sys.stderr)
        return 130
    else:
        print()
        print(stats_line(reply), file=sys.stderr)
        note = reply.policy.get("fallback")
        if note:
            print(note, file=sys.stderr)
        cap = exact_cap_note(reply)
        if cap:
            print(cap, file=sys.stderr)
        if interrupted:
            print("interrupted", file=sys.stderr)
        elif not reply.tokens:
            why = FINISH_NOTES.get(reply.finish_reason or "", reply.finish_reason)
            print(f"(no text: {why} before producing any; framing {reply.framing})", file=sys.stderr)
        elif reply.finish_reason in ("context", "stop"):
            print(f"({FINISH_NOTES[reply.finish_reason]})", file=sys.stderr)
    return 130 if interrupted else 0


def exact_cap_note(reply) -> str | None:
    """Exact mode says when it limited drafts to stay exact (or could not draft at all)."""
    costs = reply.costs
    if costs is None or costs.draft_cap is None or costs.draft_cap >= costs.gamma_max:
        return None
    if costs.draft_cap == 0:
        return ("exact mode: on this CPU no pass of 2 or more rows gives this model the logits of single-token "
                "decoding, so it decodes plainly (exact, without speculation)")
    return (f"exact mode: drafts capped at {costs.draft_cap} tokens, the largest pass ({costs.max_rows} rows) proven "
            "to give the logits of single-token decoding on this CPU")


def stats_line(reply) -> str:
    """One line of numbers, the same names everywhere (README, "Stats")."""
    st = reply.stats
    acc = ""
    if st.drafted:
        acc = (f"accepted {st.accepted}/{st.drafted} drafted ({100 * st.acceptance_rate:.0f}%), "
               f"alpha {st.alpha:.2f} | ")
    speed = ""
    if reply.measured_speedup is not None:
        speed = f"speedup {reply.measured_speedup:.2f}x measured, {reply.predicted_speedup:.2f}x predicted | "
    gamma = f" gamma {reply.gamma}" if reply.drafter != "none" else ""
    return (
        f"[{st.tokens_per_s:.1f} tok/s | {st.generated} tokens in {st.decode_s:.2f}s | {acc}"
        f"{st.tokens_per_call:.2f} tokens/target call | {speed}{st.bandwidth_gb_s:.2f} GB/s | "
        f"drafter {reply.drafter}{gamma}]"
    )


def check_address(host: str, port: int) -> None:
    """A bad --host or --port, or a port already taken, as one line before any server starts."""
    if not 1 <= port <= 65535:
        raise EdgeSpecError(f"--port must be between 1 and 65535, got {port}")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        try:
            socket.getaddrinfo(host, port)
        except (socket.gaierror, UnicodeError):
            raise EdgeSpecError(f"--host {host!r} is not an address or a name this machine can resolve") from None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise EdgeSpecError(f"cannot listen on {host}:{port}: {exc.strerror} (pick another --port/--host)") from None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # A shell starts background jobs with SIGINT ignored, and Python keeps that; Ctrl-C (or a
    # SIGINT from a supervisor) must still end the command with status 130.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return run_command(lambda: _dispatch(argv))


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] == "bench":
        from benchmarks.bench import main as bench_main

        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.headless:
        return headless(args)
    check_address(args.host, args.port)
    from edgespec.ui import launch

    return launch(args)
