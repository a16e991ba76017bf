"""python -m models ensure-bundled: make sure the bundled default models are on disk."""

from __future__ import annotations

import argparse
import sys

from edgespec.errors import EdgeSpecError
from models import BUNDLED, bundled_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m models")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("ensure-bundled", help="locate (and assemble) the bundled default models")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "ensure-bundled":
            for name in BUNDLED:
                path = bundled_path(name)
                print(f"{name:14s} {path.stat().st_size / 1e6:7.1f} MB  {path}")
        return 0
    except EdgeSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
