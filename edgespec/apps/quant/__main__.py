"""`python -m edgespec.apps.quant convert ...` and `python -m edgespec.apps.quant report ...`; errors are one line on stderr."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from edgespec.runtime.errors import run_command


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one line, not usage plus error."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def build_parser(prog: str = "python -m edgespec.apps.quant") -> argparse.ArgumentParser:
    from edgespec.apps.quant.convert import TARGETS

    ap = _Parser(prog=prog, description="MX / GGUF quantization and quality reports")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)
    cv = sub.add_parser("convert", help="requantize a GGUF model")
    cv.add_argument("input", help="source .gguf (F16/F32 or quantized)")
    cv.add_argument("output", help="output .gguf (written atomically; never the input)")
    cv.add_argument("--to", required=True, metavar="FORMAT", help="one of: " + ", ".join(TARGETS))
    cv.add_argument("--mx-embeddings", action="store_true",
                    help="MX formats: quantize token_embd/output too (default: keep them Q8_0)")
    cv.add_argument("--no-progress", action="store_true", help="no progress bar")
    cv.add_argument("--json", action="store_true", help="print the per-tensor choices as JSON")

    rp = sub.add_parser("report", help="quality and speed of quantized models against a reference")
    rp.add_argument("candidates", nargs="+", help="candidate .gguf files (same vocabulary as the reference)")
    rp.add_argument("--reference", required=True, help="reference .gguf (e.g. the F16 model)")
    rp.add_argument("--prompts", required=True, help="text file; prompts separated by lines holding only ---")
    rp.add_argument("--text", default=None, help="text for perplexity (default: the prompts file)")
    rp.add_argument("--out", default="quant_report", help="output stem: writes STEM.md, STEM.json, STEM.png")
    rp.add_argument("--labels", default=None, help="comma-separated names for the candidates")
    rp.add_argument("--max-prompt-tokens", type=int, default=256)
    rp.add_argument("--ppl-tokens", type=int, default=1024, help="tokens of --text to score (default 1024)")
    rp.add_argument("--gen-tokens", type=int, default=64, help="tokens per decode-speed run (default 64)")
    rp.add_argument("--repeats", type=int, default=3, help="interleaved speed repeats (default 3)")
    rp.add_argument("--gamma", type=int, default=3, help="draft length for the n-gram runs (default 3)")
    rp.add_argument("--threads", type=int, default=None)
    rp.add_argument("--title", default=None)
    return ap


def _terminate(signum: int, frame: object) -> None:
    # Unwind normally on SIGTERM so the atomic writer deletes its temporary file.
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None, prog: str = "python -m edgespec.apps.quant") -> int:
    args = build_parser(prog).parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    return run_command(lambda: _run(args))


def _run(args) -> int:
    if args.command == "convert":
        import json

        from edgespec.apps.quant.convert import convert

        res = convert(args.input, args.output, args.to, mx_head=args.mx_embeddings,
                      progress=not args.no_progress,
                      log=lambda s: print(s, file=sys.stderr))
        print(json.dumps(res.to_dict(), indent=1) if args.json else res.summary())
    else:
        from edgespec.apps.quant.report import main_report

        main_report(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
