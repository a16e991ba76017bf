"""Command-line arguments shared by `python app.py` and `python app.py bench`."""

from __future__ import annotations

import argparse
import hashlib
import hmac
import ipaddress
import json
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from edgespec.runtime.errors import EdgeSpecError

if TYPE_CHECKING:
    from edgespec.models.loader import RuntimeOptions
    from edgespec.service.session import Request


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one line, not usage plus error."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def not_empty(what: str) -> Callable[[str], str]:
    """An argparse type for a flag whose empty value would otherwise quietly mean its default
    (`--draft ""` ran plain decoding, `--rpc ""` ran locally): refused in one line saying `what`."""

    def check(value: str) -> str:
        if not value.strip():
            raise argparse.ArgumentTypeError(f"empty value; {what}")
        return value

    return check


def add_runtime_args(ap: argparse.ArgumentParser) -> None:
    from edgespec.models.loader import MIN_CTX, RuntimeOptions

    ctx = RuntimeOptions.n_ctx
    ap.add_argument("--ctx", type=int, default=ctx, help=f"context size in tokens (default {ctx}, at least {MIN_CTX})")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: all available cores)")
    ap.add_argument("--flash-attn", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--device", default=None, metavar="NAME",
                    help="where the target's and draft model's layers run: cpu, Vulkan0, CUDA0, ... (python app.py "
                    "--list-devices; default: the first GPU, else the CPU; --exact: the CPU)")
    ap.add_argument(
        "--exact",
        action="store_true",
        help="exact mode: llamafile-off kernels, flash attention off, drafts capped at the batch sizes probed to "
        "give the same logits as single-token decoding; greedy output then equals plain decoding (see README)",
    )


def add_generation_args(ap: argparse.ArgumentParser) -> None:
    from edgespec.core.drafters import NGRAM_SIZES, kinds, spec_names
    from edgespec.core.engine import DEFAULT_MAX_TOKENS, VERIFIERS
    from edgespec.core.sampling import SamplingParams
    from edgespec.models import DEFAULT_TARGET
    from edgespec.service.session import DEFAULT_DRAFT, DEFAULT_FRAMING, DEFAULT_GAMMA, FRAMINGS

    names = " | ".join(["none", *kinds()])
    ap.add_argument("--target", default=None, type=not_empty("give a .gguf path or a model name, or leave --target out "
                                                              f"for {DEFAULT_TARGET}"),
                    help=f"target model: .gguf path or name (default {DEFAULT_TARGET})")
    ap.add_argument("--draft", default=DEFAULT_DRAFT, type=not_empty("write --draft none for plain decoding, or one of "
                                                                     f"{names}"),
                    help=f"{spec_names()}, or a draft model's path or name (default {DEFAULT_DRAFT})")
    ap.add_argument("--gamma", default=DEFAULT_GAMMA,
                    help=f"draft length per step: a number, or auto (default {DEFAULT_GAMMA})")
    lo, hi = NGRAM_SIZES
    ap.add_argument("--ngram", default=f"{lo},{hi}", help=f"n-gram sizes for the ngram drafter as MIN,MAX (default {lo},{hi})")
    ap.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help=f"default {DEFAULT_MAX_TOKENS}")
    ap.add_argument("--temperature", type=float, default=SamplingParams.temperature,
                    help=f"0 = greedy (default {SamplingParams.temperature:g})")
    ap.add_argument("--top-k", type=int, default=SamplingParams.top_k)
    ap.add_argument("--top-p", type=float, default=SamplingParams.top_p)
    ap.add_argument("--min-p", type=float, default=SamplingParams.min_p)
    ap.add_argument("--seed", type=int, default=SamplingParams.seed,
                    help="seed for sampling, 0 to 2^64-1 (default, or -1: random)")
    ap.add_argument(
        "--verifier",
        choices=VERIFIERS,
        default=VERIFIERS[0],
        help="at temperature > 0: modified rejection sampling (default) or exact match of the target's own sample",
    )
    ap.add_argument("--framing", choices=FRAMINGS, default=DEFAULT_FRAMING,
                    help="how the prompt is fed: auto (chat template if the model has one, else raw), chat, "
                    "transcript, qa or raw")
    ap.add_argument("--chat", action="store_true", help="same as --framing chat")
    ap.add_argument("--raw", action="store_true", help="same as --framing raw (plain completion)")
    ap.add_argument("--system", default=None, help="system message (chat or transcript framing)")
    ap.add_argument("--stop", action="append", default=None, help="stop before this string (repeatable)")
    ap.add_argument("--no-prefix-reuse", action="store_true",
                    help="prefill every prompt in full instead of reusing the KV cache of the longest prefix "
                    "already decoded (earlier turns of a chat)")
    ap.add_argument("--rpc", default=None, metavar="HOST:PORT[,HOST:PORT...]",
                    type=not_empty("give HOST:PORT of an rpc-server, or leave --rpc out to run on this machine"),
                    help="run the target's layers on these llama.cpp rpc-servers (python app.py rpc-server); the "
                    "drafter stays on this machine. Fast mode only: --exact cannot run over RPC, so greedy "
                    "speculative output can differ from plain decoding where the top two logits nearly tie "
                    "(docs/rpc.md)")
    add_runtime_args(ap)


def add_grammar_args(ap: argparse.ArgumentParser) -> None:
    """Structured output for one generation (`grammar_from_args`)."""
    ap.add_argument("--json-schema", default=None, metavar="FILE|-",
                    help="the reply is JSON valid under this JSON schema (a file; - reads stdin); its forced keys "
                    "and punctuation are drafted for free (docs/structured_output.md)")
    ap.add_argument("--grammar", default=None, metavar="FILE",
                    help="the reply follows this grammar (llguidance's Lark format: docs/structured_output.md)")


def grammar_from_args(args: argparse.Namespace) -> str | None:
    """The grammar spec of --json-schema or --grammar (service.structured), None without either."""
    from edgespec.service import structured

    schema_file, lark_file = getattr(args, "json_schema", None), getattr(args, "grammar", None)
    if schema_file is not None and lark_file is not None:
        raise EdgeSpecError("give --json-schema or --grammar, not both")
    if schema_file is not None:
        text = _read_text(schema_file, "--json-schema")
        try:
            schema = json.loads(text)
        except ValueError as exc:
            raise EdgeSpecError(f"--json-schema {schema_file}: not JSON ({exc})") from None
        try:
            return structured.json_schema_grammar(schema)
        except structured.StructuredOutputError as exc:
            raise EdgeSpecError(f"--json-schema {schema_file}: {exc}") from None
    if lark_file is not None:
        try:
            return structured.lark_grammar(_read_text(lark_file, "--grammar"))
        except structured.StructuredOutputError as exc:
            raise EdgeSpecError(f"--grammar {lark_file}: {exc}") from None
    return None


def _read_text(name: str, flag: str) -> str:
    """A UTF-8 file's text (- : stdin), or a one-line error naming `flag`."""
    try:
        if name == "-":
            return sys.stdin.buffer.read().decode("utf-8")
        return Path(name).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise EdgeSpecError(f"{flag} {name}: not UTF-8 text") from None
    except OSError as exc:
        raise EdgeSpecError(f"{flag} {name}: cannot read it ({exc.strerror})") from None


def url_host(host: str) -> str:
    """`host` as a URL writes it: an IPv6 address in brackets (http://[::1]:8000)."""
    return f"[{host}]" if ":" in host else host


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


def is_loopback(host: str) -> bool:
    """True if every address `host` names is a loopback address."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


def api_keys(value: str | None) -> tuple[str, ...]:
    """The keys of --api-key: one, or several separated by commas (as llama-server takes them), one
    per user; () for none."""
    return () if value is None else tuple(k.strip() for k in value.split(","))


def check_exposure(host: str, api_key: str | None) -> None:
    """Refuse to serve the API or the UI beyond this machine without an API key (one line, before
    anything loads)."""
    if not host.strip():
        raise EdgeSpecError("--host is empty: give the address to listen on, e.g. 127.0.0.1 (this machine only, the "
                            "default), ::1, or 0.0.0.0 (every network interface; needs --api-key)")
    if api_key is not None and not api_key.strip():
        raise EdgeSpecError("--api-key is empty")
    if any(not k for k in api_keys(api_key)):
        raise EdgeSpecError("--api-key has an empty key between its commas (KEY1,KEY2,...)")
    if not is_loopback(host) and not api_key:
        raise EdgeSpecError(f"refusing to listen on {host} without --api-key: anyone who can reach this machine "
                            "could use the model; add --api-key KEY (API clients send 'Authorization: Bearer KEY', "
                            "the web UI asks for it as the password) or keep the default --host 127.0.0.1")


def key_owner(key: str | bytes) -> str:
    """Whose requests a client's key makes them (Request.owner): a digest of the key (the key itself is
    never kept). The API (`serve`) and the web UI's login derive it alike, so a user's chats and API
    calls share their earlier answers and cached prompts, and never another key's."""
    return "key:" + hashlib.sha256(key if isinstance(key, bytes) else key.encode()).hexdigest()[:16]


class KeyLogin:
    """Gradio's login check for the web UI: any user name, an API key (of `api_keys(key)`) as the
    password, and the owner of a logged-in user's requests (`owner`): its key's, as for the API
    ('' for every user with `shared` answers). A user name belongs to the key it first logged in with:
    a login with that name and another key is refused, so no one takes over another key's owner by
    its user name."""

    def __init__(self, key: str, shared: bool = False) -> None:
        self.keys = api_keys(key)
        self.shared = shared
        self._owners: dict[str, str] = {}
        self._lock = threading.Lock()

    def __call__(self, user: str, password: str) -> bool:
        key = next((k for k in self.keys if hmac.compare_digest(password.encode(), k.encode())), None)
        if key is None:
            return False
        with self._lock:
            return self._owners.setdefault(user, key_owner(key)) == key_owner(key)

    def owner(self, user: str | None) -> str:
        """The owner of a logged-in user's requests ('' with shared answers or for no login)."""
        return "" if self.shared else self._owners.get(user or "", "")


def key_auth(key: str, shared: bool = False) -> KeyLogin:
    """The web UI's login for --api-key `key` (KeyLogin)."""
    return KeyLogin(key, shared)


def request_from_args(args: argparse.Namespace, text: str) -> Request:
    """The Request the command line's generation arguments ask for (`add_generation_args`): the one
    place argparse names meet the session layer."""
    from edgespec.core.sampling import SamplingParams
    from edgespec.service.session import Request, parse_ngram

    framing = args.framing
    if args.chat and args.raw:
        raise EdgeSpecError("give --chat or --raw, not both")
    if args.chat or args.raw:
        if framing != "auto":
            raise EdgeSpecError("--chat and --raw are short for --framing chat|raw; give one of them")
        framing = "chat" if args.chat else "raw"
    return Request(
        text=text,
        system=args.system,
        framing=framing,
        draft=args.draft,
        gamma=args.gamma,
        ngram=parse_ngram(args.ngram),
        max_tokens=args.max_tokens,
        sampling=SamplingParams(args.temperature, args.top_k, args.top_p, args.min_p, args.seed),
        verifier=args.verifier,
        stop=tuple(args.stop or ()),
        reuse_prefix=not args.no_prefix_reuse,
        grammar=grammar_from_args(args),
    )


def runtime_options(args: argparse.Namespace) -> RuntimeOptions:
    """The runtime options of the command line's runtime arguments (`add_runtime_args`)."""
    from edgespec.models.loader import RuntimeOptions

    rpc = getattr(args, "rpc", None)  # a program without --rpc (bench) runs every layer here
    return RuntimeOptions(n_ctx=args.ctx, n_threads=args.threads, flash_attn=args.flash_attn, exact=args.exact,
                          rpc=tuple(rpc.split(",")) if rpc else (), device=args.device)
