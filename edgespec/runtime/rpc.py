"""The target on other machines, through llama.cpp's RPC backend (README, "More than one machine").

`rpc-server` processes (llama.cpp's own program, built by the set-up; `python app.py rpc-server`
starts one) hold the target's layers: llama.cpp makes one device per server, spreads the layers
over them and runs every pass there. The drafter stays on this machine, so each pass, one network
round trip or more, yields as many tokens as were accepted.

llama.cpp's RPC client aborts the whole process when a server cannot be reached, speaks another
protocol version or dies in the middle of a pass (GGML_ABORT in ggml-rpc.cpp), and waits forever
for one that stops answering. So the remote target runs in a worker process: `RemoteModel` is a
`runtime.Model` whose vocabulary and metadata are loaded here (no weights) and whose passes run in
the worker. One worker holds every remote model of this process on one connection per server (an
rpc-server serves one client at a time). Logits come back through a memory-mapped file. A worker
that dies, or does not answer within EDGESPEC_RPC_TIMEOUT seconds, becomes one error line naming
the server; this process keeps running, and the next load starts a new worker.
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib.metadata
import itertools
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, Pipe
from pathlib import Path

import numpy as np

from edgespec.runtime import backend, env
from edgespec.runtime import llama as runtime
from edgespec.runtime.errors import EdgeSpecError, one_line, run_command
from edgespec.runtime.llama import FlashAttn, Model, ModelInfo
from edgespec.runtime.model_file import ModelFile

DEFAULT_PORT = 50052
CONNECT_S = 3.0  # TCP connect probe before a worker starts
START_S = 30.0  # worker start: importing llama.cpp and the handshake with every server
DEFAULT_TIMEOUT_S = 60.0  # one pass of at most n_batch tokens, or a pause in loading


def timeout_s() -> float:
    """Seconds a remote pass (or a pause while loading) may take: EDGESPEC_RPC_TIMEOUT, default 60."""
    return env.number("EDGESPEC_RPC_TIMEOUT", DEFAULT_TIMEOUT_S)


def check_endpoints(endpoints: Sequence[str]) -> None:
    """One line for a malformed --rpc list. llama.cpp splits HOST:PORT at the first colon, so an
    IPv6 address cannot be given (use a host name)."""
    seen = set()
    for ep in endpoints:
        host, sep, port = ep.partition(":")
        if not sep or not host or not port.isdigit() or ":" in port:
            raise EdgeSpecError(f"--rpc takes HOST:PORT[,HOST:PORT...] (no IPv6 literals), got {ep!r}")
        if not 1 <= int(port) <= 65535:
            raise EdgeSpecError(f"--rpc {ep}: the port must be between 1 and 65535")
        if ep in seen:
            raise EdgeSpecError(f"--rpc lists {ep} twice")
        seen.add(ep)


def unreachable(endpoint: str, timeout: float = CONNECT_S) -> str | None:
    """Why nothing accepts TCP connections at HOST:PORT, or None when something does."""
    host, _, port = endpoint.partition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return None
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as exc:
        return exc.strerror or one_line(exc)


def llama_version() -> str:
    return importlib.metadata.version("llama-cpp-python")


# ----------------------------------------------------------------------------- the worker process
def _shm_dir() -> str | None:
    """Where the logits files go: RAM-backed /dev/shm where there is one."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class _Worker:
    """The process that holds this process's remote models for one list of servers."""

    def __init__(self, endpoints: tuple[str, ...]) -> None:
        self.endpoints = endpoints
        self.lock = threading.Lock()
        self.users = 0  # live RemoteModels
        self.dead: str | None = None  # why it stopped, once it has
        self._seq = 0
        self._connecting = endpoints[0]
        for ep in endpoints:
            why = unreachable(ep)
            if why is not None:
                host, _, port = ep.partition(":")
                raise EdgeSpecError(f"cannot reach the RPC server at {ep}: {why} (start one there with: "
                                    f"python app.py rpc-server --port {port})")
        info = backend.read_json(backend.rpc_module(llama_version()).parent / backend.RPC_INFO)
        self._protocol = info.get("rpc_protocol", "another version")
        self.devices: list[tuple[str, str, int, int]] | None = None  # (endpoint, description, free, total)
        self._err = tempfile.TemporaryFile()  # its stderr: llama.cpp's last words when it aborts
        self.conn, child = Pipe()
        env = {**os.environ, "GGML_NO_BACKTRACE": "1",  # an abort must not attach a debugger
               "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                              *filter(None, [os.environ.get("PYTHONPATH")])])}
        # A session of its own: Ctrl-C in the terminal is for this process, which ends the worker.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edgespec.runtime.rpc", "worker", str(child.fileno()), *endpoints],
            pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._err,
            env=env, start_new_session=True,
        )
        child.close()
        try:
            with self.lock:
                # starting the worker (importing llama.cpp) may take START_S; each server's handshake
                # then gets EDGESPEC_RPC_TIMEOUT, like every pass
                kind, payload = self._wait(0, START_S, then=timeout_s())
            if kind != "ready":
                raise EdgeSpecError(payload[0])
        except BaseException:
            self.stop()
            raise
        self.devices = payload[0]

    def call(self, msg: tuple, timeout: float, progress: Callable[[float], None] | None = None) -> tuple[str, list]:
        """Send one request and wait for its answer: (kind, payload)."""
        with self.lock:
            if self.dead is not None:
                raise EdgeSpecError(self.dead)
            self._seq += 1
            try:
                self.conn.send((self._seq, *msg))
            except OSError:
                raise EdgeSpecError(self._died()) from None
            return self._wait(self._seq, timeout, progress)

    def _wait(self, seq: int, timeout: float, progress: Callable[[float], None] | None = None,
              then: float | None = None) -> tuple[str, list]:
        """The answer to request `seq`. A worker that dies, or stays silent for `timeout` seconds
        (progress messages restart the clock, with `then` seconds when given), raises one line."""
        deadline = time.monotonic() + timeout
        while True:
            if self.conn.poll(0.1):
                try:
                    got, kind, *payload = self.conn.recv()
                except (EOFError, OSError):
                    raise EdgeSpecError(self._died()) from None
                if kind in ("connecting", "progress"):
                    timeout = then or timeout
                    deadline = time.monotonic() + timeout
                    if kind == "connecting":
                        self._connecting = payload[0]
                    elif got == seq and progress is not None:
                        progress(payload[0])
                    continue
                if got == seq:
                    return kind, payload
                continue  # the answer to a call interrupted earlier (Ctrl-C)
            if self.proc.poll() is not None:
                raise EdgeSpecError(self._died())
            if time.monotonic() > deadline:
                raise EdgeSpecError(self._silent(timeout))

    def _last_words(self) -> tuple[str, str | None]:
        """What llama.cpp wrote before the worker ended: the abort message and a version mismatch."""
        self._err.seek(0, os.SEEK_END)
        self._err.seek(max(0, self._err.tell() - 8192))
        text = self._err.read().decode("utf-8", "replace")
        aborts = re.findall(r"ggml[\w-]*\.c(?:pp)?:\d+: (.+)", text)
        mismatch = re.search(r"RPC server version mismatch: (\S+)", text)
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        detail = aborts[-1] if aborts else (lines[-1] if lines else "")
        return detail, mismatch.group(1) if mismatch else None

    def _died(self) -> str:
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        detail, mismatch = self._last_words()
        starting = self.devices is None
        ep = self._connecting
        if mismatch:
            msg = (f"the RPC server at {ep} speaks protocol {mismatch}, this build speaks {self._protocol}: "
                   "run the rpc-server of the same llama.cpp build there (python app.py rpc-server)")
        elif starting and "handshake" in detail:
            msg = f"the server at {ep} did not answer llama.cpp's RPC handshake (is it an rpc-server?)"
        elif starting and detail:
            msg = f"the RPC connection to {ep} failed: {detail}"
        else:
            down = [f"{e} ({why})" for e in self.endpoints if (why := unreachable(e, 1.0)) is not None]
            where = ("lost the RPC server at " + ", ".join(down)) if down else "the RPC worker stopped"
            what = detail or (f"signal {-rc}" if rc < 0 else f"exit status {rc}")
            msg = f"{where}: {what}; the target is unloaded, load it again once the server runs"
        self.dead = msg
        return msg

    def _silent(self, timeout: float) -> str:
        self.stop()
        if self.devices is None:
            msg = (f"the RPC server at {self._connecting} accepted the connection but did not answer within "
                   f"{timeout:g} s (EDGESPEC_RPC_TIMEOUT; an rpc-server serves one client at a time: is another "
                   "program using it?)")
        else:
            down = [f"{e} ({why})" for e in self.endpoints if (why := unreachable(e, 1.0)) is not None]
            msg = (f"the RPC servers did not answer within {timeout:g} s (EDGESPEC_RPC_TIMEOUT)"
                   + (f"; unreachable: {', '.join(down)}" if down else "") + "; the target is unloaded")
        self.dead = msg
        return msg

    def release(self) -> None:
        """One model fewer; the last one stops the worker, which frees the servers for other clients."""
        with _registry_lock:
            self.users -= 1
            if self.users <= 0:
                self.stop()
                if _workers.get(self.endpoints) is self:
                    del _workers[self.endpoints]

    def stop(self) -> None:
        if self.dead is None:
            self.dead = "the RPC worker was stopped"
        self.conn.close()  # the worker ends when its end of the pipe closes
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # stuck in a call to a server that does not answer
                self.proc.kill()
                self.proc.wait()
        self._err.close()


_workers: dict[tuple[str, ...], _Worker] = {}
_registry_lock = threading.Lock()
_ids = itertools.count(1)


def _worker_for(endpoints: tuple[str, ...]) -> _Worker:
    with _registry_lock:
        w = _workers.get(endpoints)
        if w is None or w.dead is not None:
            w = _workers[endpoints] = _Worker(endpoints)
        w.users += 1
        return w


@atexit.register
def _stop_workers() -> None:
    for w in list(_workers.values()):
        w.stop()


# ----------------------------------------------------------------------------- the remote target
class RemoteModel(Model):
    """A target whose layers live on rpc-servers: the `Model` interface, passes run by the worker.

    Tokenizing, chat templates and pairing checks use the vocabulary loaded here. The cache is
    tracked here too: `truncate` and `reset` only shorten `cached`, and the next pass tells the
    worker how many positions to keep, so a rollback costs no message of its own.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        endpoints: Sequence[str],
        *,
        n_ctx: int = runtime.DEFAULT_N_CTX,
        n_batch: int = runtime.DEFAULT_N_BATCH,
        flash_attn: FlashAttn = "auto",
        progress: Callable[[float], None] | None = None,
    ) -> None:
        self._worker: _Worker | None = None
        self._batch = self._ctx = self._model = None
        p = runtime.check_gguf_file(path)
        llama = runtime.lib()
        self.path = str(p)
        self.file = ModelFile(p)
        self.rpc_servers = tuple(endpoints)
        self.device, self.device_description = "rpc", ", ".join(self.rpc_servers)
        check_endpoints(self.rpc_servers)
        mparams = llama.llama_model_default_params()
        mparams.vocab_only = True  # the weights are read by the worker and sent to the servers
        self._model = llama.llama_model_load_from_file(self.path.encode(), mparams)
        if not self._model:
            raise EdgeSpecError(f"llama.cpp could not read the vocabulary of {p.name}")
        self._vocab = llama.llama_model_get_vocab(self._model)
        self.n_vocab = llama.llama_vocab_n_tokens(self._vocab)
        self.n_embd = llama.llama_model_n_embd(self._model)
        # This process only looks up token embeddings (the layers run on the servers): one thread,
        # which spins on no core that the servers or the drafter could use.
        self.n_threads = self.threads_now = 1
        self.flash_attn = flash_attn
        self.repack = True  # the servers store weights in their own layout
        self._cached: list[int] = []
        self._pieces: dict[int, bytes] = {}
        self._timeout = timeout_s()
        fd, self._logits_path = tempfile.mkstemp(prefix="edgespec-logits-", dir=_shm_dir())
        os.close(fd)
        self._rows = 0
        self._grow(16)
        self._id = next(_ids)
        self._worker = _worker_for(self.rpc_servers)
        kw = dict(n_ctx=n_ctx, n_batch=n_batch, n_threads=self.n_threads, flash_attn=flash_attn)
        try:
            kind, payload = self._worker.call(("load", self._id, self.path, self._logits_path, kw),
                                              self._timeout, progress)
        except BaseException:
            self.close()
            raise
        if kind != "loaded":
            self.close()
            raise EdgeSpecError(payload[0])
        got = payload[0]
        self.n_ctx, self.n_batch = got["n_ctx"], got["n_batch"]
        self._info = ModelInfo(**got["info"])

    @property
    def info(self) -> ModelInfo:
        return self._info

    def _grow(self, rows: int) -> None:
        """Room for `rows` rows of logits in the shared file (views handed out earlier stay valid)."""
        rows = 1 << max(0, rows - 1).bit_length()
        if rows > self._rows:
            os.truncate(self._logits_path, rows * self.n_vocab * 4)
            self._view = np.memmap(self._logits_path, dtype=np.float32, mode="r", shape=(rows, self.n_vocab))
            self._rows = rows

    def decode(self, tokens: Sequence[int], n_logits: int = 1, hidden: bool = False) -> np.ndarray:
        """As `Model.decode`, run by the worker; the logits are a read-only view of the shared file."""
        assert self._worker is not None, "decode after close"
        self.last_hidden = None
        self._grow(n_logits)
        start = self.n_past
        toks = [int(t) for t in tokens]
        chunks = max(1, math.ceil(len(toks) / self.n_batch))
        kind, payload = self._worker.call(("decode", self._id, start, toks, n_logits, hidden, self._rows),
                                          self._timeout * chunks)
        n_past = payload[1]
        self._cached.extend(toks[: n_past - start])
        if kind == "invalid":
            raise ValueError(payload[0])
        if kind == "error":
            raise EdgeSpecError(payload[0])
        if hidden:
            self.last_hidden = np.frombuffer(payload[0], dtype=np.float32).reshape(n_logits, self.n_embd).copy()
        return np.asarray(self._view[:n_logits])

    def truncate(self, n: int) -> None:
        del self._cached[n:]

    def reset(self) -> None:
        self._cached.clear()

    def close(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            if worker.dead is None:
                try:
                    worker.call(("free", self._id), self._timeout)
                except EdgeSpecError:
                    pass  # the worker is gone: nothing left to free
            worker.release()
            Path(self._logits_path).unlink(missing_ok=True)
        super().close()


# ----------------------------------------------------------------------------- inside the worker
def _serve(conn: Connection, endpoints: list[str]) -> int:
    """The worker: connect to the servers, then load and run models on request until the pipe
    closes. Answers are (seq, kind, payload...)."""
    try:
        runtime.lib()
        backend.ggml_errors_to_stderr()
        module = backend.rpc_module(llama_version())
        devices: list[backend.RpcDevice] = []
        for ep in endpoints:
            conn.send((0, "connecting", ep))
            devices += backend.rpc_devices(module, ep)  # llama.cpp aborts here on a bad server
    except EdgeSpecError as exc:
        conn.send((0, "error", str(exc)))
        return 1
    conn.send((0, "ready", [(d.endpoint, d.description, d.free, d.total) for d in devices]))
    handles = [d.handle for d in devices]
    models: dict[int, tuple[Model, str]] = {}
    views: dict[int, np.ndarray] = {}
    while True:
        try:
            seq, kind, mid, *args = conn.recv()
        except EOFError:
            return 0
        model = models[mid][0] if mid in models else None
        try:
            if kind == "load":
                path, logits_path, kw = args
                loaded = Model(path, devices=handles, progress=lambda f, s=seq: conn.send((s, "progress", f)), **kw)
                models[mid] = (loaded, logits_path)
                info = {"n_ctx": loaded.n_ctx, "n_batch": loaded.n_batch, "info": dataclasses.asdict(loaded.info)}
                conn.send((seq, "loaded", info))
            elif kind == "decode" and model is not None:
                keep, toks, n_logits, hidden, rows = args
                model.truncate(keep)
                # llama.cpp sends a pass to the servers without waiting, and only a read waits for it
                # to finish: a prefill (no logits) reads its last row, so that its time, and its
                # failure, belong to this call and not to the next pass.
                read = max(n_logits, 1)
                logits = model.decode(toks, read, hidden)[read - n_logits :]
                if mid not in views or views[mid].shape[0] != rows:
                    views[mid] = np.memmap(models[mid][1], dtype=np.float32, mode="r+", shape=(rows, model.n_vocab))
                views[mid][:n_logits] = logits
                conn.send((seq, "done", model.last_hidden.tobytes() if hidden else None, model.n_past))
            elif kind == "free" and model is not None:
                views.pop(mid, None)
                models.pop(mid)[0].close()
                conn.send((seq, "freed", None, 0))
            else:
                conn.send((seq, "error", f"the worker has no model {mid} (loading it failed)", 0))
        except EdgeSpecError as exc:
            conn.send((seq, "error", str(exc), model.n_past if model is not None else 0))
        except ValueError as exc:
            conn.send((seq, "invalid", str(exc), model.n_past if model is not None else 0))


def _worker_main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent ends the worker; Ctrl-C is the parent's
    conn = Connection(int(argv[0]))
    try:
        return _serve(conn, argv[1:])
    except (EOFError, BrokenPipeError):
        return 0


# ----------------------------------------------------------------------------- the set-up's steps
def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, threads: int = 1, folder: Path | None = None) -> subprocess.Popen:
    """`python app.py rpc-server` on 127.0.0.1:`port` as a child process, ready once this returns
    (it accepts connections); its output goes to /dev/null."""
    env = None if folder is None else {**os.environ, "EDGESPEC_RPC_DIR": str(folder)}
    proc = subprocess.Popen([sys.executable, "-m", "edgespec.apps.rpc_server", "--port", str(port),
                             "--threads", str(threads)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env, cwd=Path(__file__).resolve().parents[2])
    deadline = time.monotonic() + START_S
    while unreachable(f"127.0.0.1:{port}", 0.5) is not None:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            err = proc.communicate()[1].decode("utf-8", "replace").strip().splitlines()
            raise EdgeSpecError(f"the rpc-server did not start: {err[-1] if err else 'no output'}")
        time.sleep(0.1)
    proc.stderr.close()
    return proc


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def assemble(src: Path, out: Path) -> None:
    """Gather the set-up's RPC build (`src`: the extracted sdist with build/bin) into `out`: the
    program and the RPC module, this installed library and the CPU kernels this machine may use (no
    AMX variant), and RPC_INFO; then prove it: start the server and connect to it through the
    module from a worker, as `--rpc` will."""
    lib = backend.lib_dir()
    if not backend.cpu_modules(lib):
        raise EdgeSpecError("the installed llama.cpp has its CPU kernels built in (not the set-up's "
                            "-DGGML_BACKEND_DL=ON build)")
    built = src / "build" / "bin"
    base = sorted(built.glob("libggml-base.so.*.*"))
    have = backend.ggml_version()
    if not base or not base[0].name.endswith("." + have):
        raise EdgeSpecError(f"the RPC module was built against ggml {base[0].name if base else '?'}, "
                            f"the installed ggml is {have}")
    header = (src / "vendor/llama.cpp/ggml/include/ggml-rpc.h").read_text()
    proto = ".".join(re.search(rf"RPC_PROTO_{p}_VERSION\s+(\d+)", header).group(1) for p in ("MAJOR", "MINOR", "PATCH"))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in (built / backend.RPC_PROGRAM, built / "libggml-rpc.so"):
        shutil.copy2(f, tmp)
    manifest = backend.read_manifest(lib)
    for f in [*lib.glob("libggml.so*"), *lib.glob("libggml-base.so*"),
              *backend.server_modules(lib, backend.this_cpu().signature, manifest)]:
        shutil.copy2(f, tmp)
    info = {"llama-cpp-python": llama_version(), "ggml": have, "rpc_protocol": proto}
    (tmp / backend.RPC_INFO).write_text(json.dumps(info, indent=1))
    os.environ["EDGESPEC_RPC_DIR"] = str(tmp)
    port = free_port()
    server = start_server(port, folder=tmp)
    try:
        worker = _Worker((f"127.0.0.1:{port}",))
        worker.stop()
    finally:
        stop_server(server)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def record(folder: Path) -> None:
    """Note `folder` in the installed library's manifest, where `--rpc` and `rpc-server` look."""
    os.environ["EDGESPEC_RPC_DIR"] = str(folder)
    backend.rpc_module(llama_version())
    lib = backend.lib_dir()
    manifest = backend.read_manifest(lib)
    manifest["rpc"] = str(folder.resolve())
    backend.write_manifest(lib, manifest)


def _module_main(argv: list[str]) -> int:
    if argv and argv[0] == "worker":  # RemoteModel's worker process (no user runs this)
        return _worker_main(argv[1:])
    if len(argv) == 3 and argv[0] == "assemble":
        return run_command(lambda: assemble(Path(argv[1]), Path(argv[2])))
    if len(argv) == 2 and argv[0] == "record":
        return run_command(lambda: record(Path(argv[1])))
    print("usage: python -m edgespec.runtime.rpc assemble SRC OUT | record DIR (scripts/setup.sh runs these)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_module_main(sys.argv[1:]))
