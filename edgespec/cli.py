"""Command line: `python app.py --headless ...` generates in the terminal; plain `python app.py`
opens the web UI; `python app.py bench ...` runs benchmarks."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from edgespec.errors import EdgeSpecError, run_command

COLOURS = {"draft": "\033[32m", "bonus": "\033[36m", "target": ""}
RESET = "\033[0m"


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one line, not usage plus error."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def add_runtime_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--ctx", type=int, default=4096, help="context size in tokens (default 4096)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: all available cores)")
    ap.add_argument("--flash-attn", choices=["auto", "on", "off"], default="auto")
    ap.add_argument(
        "--exact",
        action="store_true",
        help="exact mode: llamafile-off build, flash attention off; greedy output bit-identical to "
        "plain decoding for F16/Q8_0/Q4_0/Q4_1 weights (slower on K-quants; see README)",
    )


def add_generation_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--target", default=None, help="target model: .gguf path or name (default smollm2-135m)")
    ap.add_argument("--draft", default="ngram", help="none | ngram | draft model path or name (default ngram)")
    ap.add_argument("--gamma", default="auto", help="draft length per step: a number, or auto (default)")
    ap.add_argument("--ngram", default="1,16", help="n-gram sizes for the ngram drafter as MIN,MAX (default 1,16)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--min-p", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument(
        "--verifier",
        choices=["rejection", "match"],
        default="rejection",
        help="at temperature > 0: modified rejection sampling (default) or exact match of the target's own sample",
    )
    add_runtime_args(ap)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python app.py", description="EdgeSpec: speculative generation on your own machine")
    ap.add_argument("--headless", action="store_true", help="generate in the terminal instead of opening the UI")
    ap.add_argument("--prompt", default=None)
    ap.add_argument("--prompt-file", default=None)
    ap.add_argument("--chat", action="store_true", help="wrap the prompt in the model's own chat template")
    ap.add_argument("--system", default=None, help="system message for --chat")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    ap.add_argument("--no-color", action="store_true")
    ap.add_argument("--host", default="127.0.0.1", help="UI address (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=7860, help="UI port (default 7860)")
    add_generation_args(ap)
    return ap


def parse_ngram(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(","))
    except ValueError:
        raise EdgeSpecError(f"--ngram wants MIN,MAX (e.g. 1,4), got {text!r}") from None
    return lo, hi


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
    elif args.prompt is not None:
        text = args.prompt
    else:
        raise EdgeSpecError("--headless needs --prompt TEXT or --prompt-file FILE")
    if not text.strip():
        raise EdgeSpecError("the prompt is empty")
    return text


def headless(args: argparse.Namespace) -> int:
    from edgespec.engine import Engine, GenerationConfig, StepEvent
    from edgespec.factory import RuntimeOptions, load_model, make_drafter, parse_gamma
    from edgespec.sampling import SamplingParams
    from models import DEFAULT_TARGET

    text = read_prompt(args)
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.min_p, args.seed)
    config = GenerationConfig(max_tokens=args.max_tokens, sampling=sampling, verifier=args.verifier)
    gamma = parse_gamma(args.gamma)
    ngram = parse_ngram(args.ngram)
    opts = RuntimeOptions(n_ctx=args.ctx, n_threads=args.threads, flash_attn=args.flash_attn, exact=args.exact)

    target = load_model(args.target or DEFAULT_TARGET, opts)
    drafter = make_drafter(args.draft, target, opts, ngram)
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": text}
        ]
        text = target.apply_chat_template(messages)
    prompt = target.tokenize(text, add_special=True, parse_special=args.chat)
    engine = Engine(target, drafter, gamma)

    colour = not args.no_color and not args.json and sys.stdout.isatty()
    tokens: list[int] = []
    sources: list[str] = []
    pieces: list[str] = []
    last: StepEvent | None = None
    try:
        for ev in engine.generate(prompt, config):
            last = ev
            tokens += ev.tokens
            sources += ev.sources
            pieces += ev.pieces
            if not args.json:
                for piece, src in zip(ev.pieces, ev.sources, strict=True):
                    sys.stdout.write(f"{COLOURS[src]}{piece}{RESET}" if colour and COLOURS[src] else piece)
                sys.stdout.flush()
    except KeyboardInterrupt:
        print("\n(stopped)", file=sys.stderr)
        if last is None:
            return 130
    finally:
        if drafter is not None:
            drafter.close()
    assert last is not None
    stats = last.stats
    if args.json:
        out = {
            "text": "".join(pieces),
            "tokens": tokens,
            "token_sources": sources,
            "finish_reason": last.finish_reason,
            "target": target.path,
            "draft": engine.drafter_name,
            "exact": args.exact,
            "stats": stats.to_dict(),
        }
        snapshot = getattr(engine.gamma, "snapshot", None)
        if snapshot is not None and drafter is not None:
            out["adaptive"] = snapshot()
        print(json.dumps(out, ensure_ascii=False))
    else:
        print()
        print(stats_line(stats, engine.drafter_name, getattr(engine.gamma, "label", "")), file=sys.stderr)
        note = getattr(engine.gamma, "fallback_note", None)
        if note is not None and drafter is not None and note():
            print(note(), file=sys.stderr)
    return 0


def stats_line(stats, drafter: str, gamma: str) -> str:
    acc = (
        f"accepted {stats.accepted}/{stats.drafted} drafts ({100 * stats.acceptance_rate:.0f}%) | "
        if stats.drafted
        else ""
    )
    return (
        f"[{stats.tokens_per_s:.1f} tok/s | {stats.generated} tokens in {stats.decode_s:.2f}s | {acc}"
        f"{stats.tokens_per_call:.2f} tokens/target call | {stats.bandwidth_gb_s:.2f} GB/s | "
        f"drafter {drafter}{f' gamma {gamma}' if drafter != 'none' else ''}]"
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_command(lambda: _dispatch(argv))


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] == "bench":
        from edgespec.bench import main as bench_main

        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.headless:
        return headless(args)
    from edgespec.ui import launch

    return launch(args)
