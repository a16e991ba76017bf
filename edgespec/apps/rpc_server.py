"""`python app.py rpc-server`: llama.cpp's rpc-server program (the set-up's build, edgespec.runtime.rpc)
holding a target's layers for an EdgeSpec elsewhere (README, "More than one machine")."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from edgespec.apps.args import Parser, check_address, is_loopback
from edgespec.runtime import backend, rpc
from edgespec.runtime.errors import EdgeSpecError, run_command


def main(argv: Sequence[str]) -> int:
    """`python app.py rpc-server`: llama.cpp's rpc-server (the set-up's build) with this machine's
    CPU kernels; loopback only unless --allow-remote."""
    ap = Parser(prog="python app.py rpc-server",
                description="hold a target's layers for EdgeSpec on another machine (llama.cpp's rpc-server)")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    ap.add_argument("--port", type=int, default=rpc.DEFAULT_PORT, help=f"port (default {rpc.DEFAULT_PORT})")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: all available cores)")
    ap.add_argument("--allow-remote", action="store_true",
                    help="listen on an address other machines can reach (the RPC protocol has no authentication)")
    ap.add_argument("--cache", action="store_true",
                    help="keep received weights on disk (llama.cpp's cache, ~/.cache/llama.cpp/rpc) so a reload is faster")
    args = ap.parse_args(list(argv))
    cores = len(os.sched_getaffinity(0))
    threads = args.threads if args.threads is not None else cores
    if not 1 <= threads <= cores:
        raise EdgeSpecError(f"--threads must be between 1 and {cores}, the cores this process may use; got {threads}")
    if not is_loopback(args.host) and not args.allow_remote:
        raise EdgeSpecError(f"--host {args.host} opens the server to other machines, and llama.cpp's RPC protocol has "
                            "no authentication or encryption (whoever reaches the port can use this machine's memory "
                            "and CPU): add --allow-remote on a trusted network only")
    check_address(args.host, args.port)
    folder = backend.rpc_module(rpc.llama_version()).parent
    if not is_loopback(args.host):
        print(f"warning: listening on {args.host}:{args.port} with no authentication or encryption (llama.cpp's RPC "
              "protocol has none): keep the port behind a firewall or VPN", file=sys.stderr)
    program = str(folder / backend.RPC_PROGRAM)
    cmd = [program, "--host", args.host, "--port", str(args.port), "--threads", str(threads)]
    if args.cache:
        cmd.append("--cache")
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(
        [str(folder), *filter(None, [os.environ.get("LD_LIBRARY_PATH")])])}
    sys.stdout.flush()
    sys.stderr.flush()
    # The program loads every backend module in its folder and its working directory: run it in
    # its folder, which holds this library and its CPU kernels (without the AMX variant).
    os.chdir(folder)
    os.execve(program, cmd, env)
    return 0  # not reached: execve replaced this process


if __name__ == "__main__":  # what `python app.py rpc-server` runs, for edgespec.runtime.rpc.start_server
    sys.exit(run_command(lambda: main(sys.argv[1:])))
