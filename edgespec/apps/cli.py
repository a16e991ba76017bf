"""Command line: `python app.py --headless ...` generates in the terminal; plain `python app.py`
opens the web UI; `python app.py bench | serve | distill | models | quant ...` run the sub-commands."""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from edgespec.apps.args import (
    Parser,
    add_generation_args,
    add_grammar_args,
    check_address,
    request_from_args,
    runtime_options,
)
from edgespec.runtime.errors import EdgeSpecError, require_stdout, run_command

COLOURS = {"draft": "\033[32m", "bonus": "\033[36m", "target": ""}
RESET = "\033[0m"
# Why a generation ended, in words, for the terminal.
FINISH_NOTES = {
    "eog": "the model ended its reply",
    "length": "reached --max-tokens",
    "context": "the context is full (raise --ctx)",
    "stop": "reached a stop string",
    "grammar": "the grammar is complete",
    "stopped": "stopped",
}


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="python app.py", description="EdgeSpec: speculative generation on your own machine")
    ap.add_argument("--headless", action="store_true", help="generate in the terminal instead of opening the UI "
                    "(implied by --prompt, --prompt-file and --chat-file)")
    ap.add_argument("--prompt", default=None)
    ap.add_argument("--prompt-file", default=None, help="read the prompt from this file (- reads stdin)")
    ap.add_argument("--chat-file", default=None, metavar="FILE",
                    help="multi-turn chat: JSON lines ({\"role\": \"user\"|\"system\", \"content\": ...} or a JSON "
                    "string), one reply per user line, earlier turns kept in the KV cache; - reads stdin (plain lines too)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    ap.add_argument("--list-devices", action="store_true",
                    help="list the devices a model can run on (name, description, memory; names for --device) and exit")
    ap.add_argument("--no-color", action="store_true")
    ap.add_argument("--host", default="127.0.0.1", help="UI address (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=7860, help="UI port (default 7860)")
    ap.add_argument("--api-key", default=None, help="UI login password, any user name (default: $EDGESPEC_API_KEY); "
                    "needed for a --host other than loopback")
    add_generation_args(ap)
    add_grammar_args(ap)
    return ap


def utf8(text: str, flag: str) -> str:
    """`text` from the command line, refused in one line when it is not UTF-8: Python keeps such
    bytes as lone surrogates (surrogateescape), which the tokenizer cannot encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        byte = ord(text[exc.start]) - 0xDC00 if 0xDC80 <= ord(text[exc.start]) <= 0xDCFF else None
        what = f"byte 0x{byte:02x}" if byte is not None else f"character {text[exc.start]!r}"
        raise EdgeSpecError(f"{flag} is not valid UTF-8 text ({what} at character {exc.start}); "
                            "pass UTF-8, or put the text in a file for --prompt-file") from None
    return text


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None and args.prompt_file is not None:
        raise EdgeSpecError("give --prompt or --prompt-file, not both")
    if args.system is not None:
        utf8(args.system, "--system")
    if args.prompt_file == "-":  # stdin, as --chat-file - reads it
        try:
            text = sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EdgeSpecError(f"the prompt on stdin is not UTF-8 text (at byte {exc.start})") from None
    elif args.prompt_file is not None:
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
        text = utf8(args.prompt, "--prompt")
    else:
        raise EdgeSpecError("--headless needs --prompt TEXT or --prompt-file FILE")
    if not text.strip():
        raise EdgeSpecError("the prompt is empty")
    return text


def headless(args: argparse.Namespace) -> int:
    from edgespec.models import DEFAULT_TARGET
    from edgespec.service.session import Reply, Session

    if args.chat_file is not None:
        return headless_chat(args)
    req = request_from_args(args, read_prompt(args))
    session = Session.load(args.target or DEFAULT_TARGET, runtime_options(args))
    session.on_profile = profile_progress(session.target.path)
    context_note(session.target)
    colour = not args.no_color and not args.json and sys.stdout.isatty()
    reply = Reply()
    interrupted = False
    try:
        shown = 0
        for i, (_, reply) in enumerate(session.generate(req)):
            if reply.note and not i:
                print(f"note: {reply.note}", file=sys.stderr)
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


def chat_lines(args: argparse.Namespace):
    """(line number, role, content) of --chat-file: a file is read and checked before any model
    loads; stdin (-) is read as it comes, so the command also works as a terminal chat."""
    if args.prompt is not None or args.prompt_file is not None:
        raise EdgeSpecError("give --chat-file or --prompt/--prompt-file, not both")
    if args.chat_file == "-":
        lines = enumerate(sys.stdin, 1)
    else:
        p = Path(args.chat_file)
        if p.is_dir():
            raise EdgeSpecError(f"chat file is a directory: {p}")
        if not p.is_file():
            raise EdgeSpecError(f"chat file not found: {p}")
        try:
            lines = list(enumerate(p.read_text(encoding="utf-8").splitlines(), 1))
        except (UnicodeDecodeError, OSError) as exc:
            raise EdgeSpecError(f"cannot read chat file {p}: {exc}") from None
    where = "stdin" if args.chat_file == "-" else args.chat_file

    def parse(no: int, line: str) -> tuple[int, str, str] | None:
        line = line.strip()
        if not line:
            return None
        if args.chat_file == "-" and line[0] not in "{\"":
            return no, "user", line
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise EdgeSpecError(f"{where}:{no}: not JSON ({exc.msg})") from None
        if isinstance(item, str):
            item = {"role": "user", "content": item}
        if not isinstance(item, dict) or not isinstance(item.get("content"), str) or \
                item.get("role", "user") not in ("user", "system"):
            raise EdgeSpecError(f"{where}:{no}: want {{\"role\": \"user\" or \"system\", \"content\": TEXT}} or a string")
        if not item["content"].strip():
            raise EdgeSpecError(f"{where}:{no}: the {item.get('role', 'user')} message is empty")
        return no, item.get("role", "user"), item["content"]

    def ordered(items):
        """A system message comes first, once, and not beside --system (checked line by line, so a
        file fails before the model loads)."""
        talked = system = False
        for no, role, content in items:
            if role == "system":
                if args.system is not None:
                    raise EdgeSpecError(f"{where}:{no}: a system message here and --system as well; give one of them")
                if talked or system:
                    raise EdgeSpecError(f"{where}:{no}: a system message goes first, once (before any user message)")
                system = True
            else:
                talked = True
            yield no, role, content

    parsed = (parse(no, line) for no, line in lines)
    return ordered(x for x in parsed if x is not None)


def headless_chat(args: argparse.Namespace) -> int:
    """`--headless --chat-file FILE`: one reply per user line; the session keeps the conversation's
    KV cache, so each turn prefills only itself (the stats line says how many tokens were reused)."""
    from edgespec.models import DEFAULT_TARGET
    from edgespec.service.session import Conversation, Session

    if args.system is not None:
        utf8(args.system, "--system")
    items = chat_lines(args)
    if args.chat_file != "-":
        items = list(items)
        if not any(role == "user" for _, role, _ in items):
            raise EdgeSpecError(f"{args.chat_file}: no user message")
    settings = request_from_args(args, "(chat)")
    convo = Conversation(settings)
    session = Session.load(args.target or DEFAULT_TARGET, runtime_options(args))
    session.on_profile = profile_progress(session.target.path)
    context_note(session.target)
    colour = not args.no_color and not args.json and sys.stdout.isatty()
    turn = 0
    noted = False
    try:
        for _, role, content in items:
            if role == "system":  # first and once (chat_lines)
                convo.system = content
                continue
            turn += 1
            if not args.json and args.chat_file != "-":
                print(f"> {content}")
            shown = 0
            for _, reply in convo.ask(session, content):
                if reply.note and not noted:  # once per conversation
                    print(f"note: {reply.note}", file=sys.stderr)
                    noted = True
                if not args.json:
                    for piece, src in zip(reply.pieces[shown:], reply.sources[shown:], strict=True):
                        sys.stdout.write(f"{COLOURS[src]}{piece}{RESET}" if colour and COLOURS[src] else piece)
                    sys.stdout.flush()
                    shown = len(reply.pieces)
            if args.json:
                print(json.dumps({"turn": turn, "user": content, **reply.to_dict()}, ensure_ascii=False), flush=True)
            else:
                st = reply.stats
                print()
                print(f"{stats_line(reply)} [turn {turn}: prompt {st.prompt_tokens} tokens, {st.prompt_reused} "
                      f"reused, {st.prompt_prefilled} prefilled in {1000 * st.prefill_s:.0f} ms]", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        session.close()
    return 0


def context_note(model) -> None:
    """A note when --ctx goes beyond the context the model was trained for: llama.cpp runs it, but
    positions past the trained length give text that loses its thread."""
    trained = model.info.n_ctx_train
    if trained and model.n_ctx > trained:
        print(f"note: --ctx {model.n_ctx} is more than the {trained} tokens {Path(model.path).name} was trained "
              f"for; text beyond {trained} tokens may lose its coherence", file=sys.stderr)


def profile_progress(model_path: str) -> Callable[[float], None]:
    """What the terminal shows while a cost profile is measured (the first use of a model with a
    set-up takes seconds to minutes before any text): a line on stderr, counting up on a terminal."""
    from edgespec.runtime.profiles import unwritable

    tty = sys.stderr.isatty()
    why = unwritable()
    kept = "not kept: the next run measures again" if why else "once per set-up, kept for next time"
    what = f"measuring the pass costs of {Path(model_path).stem} ({kept})"
    if tty:  # one terminal line, or the carriage return cannot redraw it
        what = what[: shutil.get_terminal_size().columns - 7]
    said = False

    def show(fraction: float) -> None:
        nonlocal said
        if why and not said:
            print(f"note: the cost profile folder {why}; set EDGESPEC_PROFILES to a folder you can write",
                  file=sys.stderr, flush=True)
        if tty:
            sys.stderr.write(f"\r{what}: {100 * fraction:3.0f}%" + ("\n" if fraction >= 1 else ""))
            sys.stderr.flush()
        elif not said:
            print(f"{what} ...", file=sys.stderr, flush=True)
        said = True

    return show


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


def list_devices() -> int:
    """`--list-devices`: one line per device, the default marked."""
    from edgespec.runtime import backend
    from edgespec.runtime import llama as runtime

    runtime.lib()
    default = backend.choose_device(None)
    for d in backend.devices():
        print(d.line() + ("  [default]" if d == default else ""))
    return 0


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
        f"drafter {reply.drafter}{gamma} | {reply.device}{_threads(reply)}]"
    )


def _threads(reply) -> str:
    """', 1 of 2 threads (other work holds a core)' while the thread count followed the load."""
    if reply.device != "cpu" or not reply.threads_max or reply.threads >= reply.threads_max:
        return ""
    return f", {reply.threads} of {reply.threads_max} threads (other work holds a core)"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # A shell starts background jobs with SIGINT ignored, and Python keeps that; Ctrl-C (or a
    # SIGINT from a supervisor) must still end the command with status 130.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # the web UI, serve and rpc-server only log to stdout: they run with it closed
    return run_command(lambda: _dispatch(argv), output=False)


def _dispatch(argv: list[str]) -> int:
    from edgespec.runtime import env

    env.check_all()  # a bad EDGESPEC_* value is one line before anything loads
    if argv and argv[0] == "bench":
        from edgespec.apps.bench import main as bench_main

        require_stdout()
        return bench_main(argv[1:])
    if argv and argv[0] == "serve":
        from edgespec.apps.server import main as serve_main

        return serve_main(argv[1:])
    if argv and argv[0] == "rpc-server":
        from edgespec.apps.rpc_server import main as rpc_main

        return rpc_main(argv[1:])
    if argv and argv[0] == "distill":
        from edgespec.apps.distill import main as distill_main

        return distill_main(argv[1:])
    if argv and argv[0] == "models":  # as python -m edgespec.models ...
        from edgespec.models.__main__ import main as models_main

        return models_main(argv[1:], prog="python app.py models")
    if argv and argv[0] == "quant":  # as python -m edgespec.apps.quant ...
        from edgespec.apps.quant.__main__ import main as quant_main

        return quant_main(argv[1:], prog="python app.py quant")
    args = build_parser().parse_args(argv)
    if args.list_devices:
        return list_devices()
    # A prompt on the command line asks for an answer here, not for the UI (which would ignore it).
    if args.headless or any(x is not None for x in (args.prompt, args.prompt_file, args.chat_file)):
        require_stdout()
        return headless(args)
    check_address(args.host, args.port)
    from edgespec.apps.ui import launch

    return launch(args)
