"""The target on llama.cpp's RPC servers (edgespec.runtime.rpc): two real rpc-servers on loopback ports,
real llama.cpp on both ends, the bundled SmolLM2. Every server and worker started here is stopped."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgespec.core.drafters.ngram import NgramDrafter
from edgespec.core.engine import Engine, FixedGamma, GenerationConfig
from edgespec.models.loader import RuntimeOptions
from edgespec.runtime import backend, profiles, rpc
from edgespec.runtime.errors import EdgeSpecError
from edgespec.runtime.llama import Model
from edgespec.service.session import Reply, Request, Session
from tests.batched_path import BatchedPath
from tests.conftest import ROOT, run_app


def _built() -> str | None:
    try:
        backend.rpc_module(rpc.llama_version())
        return None
    except EdgeSpecError as exc:
        return str(exc)


needs_rpc = pytest.mark.skipif(_built() is not None, reason=f"{_built()} (bash scripts/setup.sh builds it)")

EDIT_PROMPT = ("Add type hints to this function and change nothing else:\n\n"
               "def total_price(items, tax_rate):\n"
               "    subtotal = sum(item.price * item.quantity for item in items)\n"
               "    return subtotal * (1 + tax_rate)\n")


def _rss_mb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) // 1024


@dataclass
class Server:
    proc: subprocess.Popen
    endpoint: str

    @classmethod
    def start(cls) -> Server:
        port = rpc.free_port()
        return cls(rpc.start_server(port), f"127.0.0.1:{port}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # a test may have stopped it
        rpc.stop_server(self.proc)


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    """Two rpc-servers on free loopback ports, one thread each."""
    started: list[Server] = []
    try:
        for _ in range(2):
            started.append(Server.start())
        yield started
    finally:
        for s in started:
            s.stop()


def _eps(servers: list[Server]) -> tuple[str, ...]:
    return tuple(s.endpoint for s in servers)


@needs_rpc
def test_greedy_output_over_rpc_equals_local_decoding(smollm2_path, servers):
    eps = _eps(servers)
    before = [_rss_mb(s.proc.pid) for s in servers]
    remote = rpc.RemoteModel(smollm2_path, eps, n_ctx=2048, flash_attn="off")
    # one thread, as each server: two threads' barriers stall when other work shares the cores
    smollm2 = Model(smollm2_path, n_ctx=2048, flash_attn="off", n_threads=1)
    try:
        # the layers went to both servers (SmolLM2's 96 MB of weights, split), not to this process
        grown = [_rss_mb(s.proc.pid) - b for s, b in zip(servers, before, strict=True)]
        assert all(g >= 20 for g in grown), grown
        prompt = smollm2.tokenize(EDIT_PROMPT)
        config = GenerationConfig(max_tokens=48)
        for wrap in (lambda m: m, BatchedPath):
            local = Reply.collect(Engine(wrap(smollm2), None).generate(prompt, config))
            assert Reply.collect(Engine(wrap(remote), None).generate(prompt, config)).tokens == local.tokens
        # Speculative passes decode several rows, which take other kernels than single tokens (README,
        # "Exactness"); on the path where every pass has 2 rows or more they equal plain decoding.
        spec = Reply.collect(Engine(BatchedPath(remote), NgramDrafter(), FixedGamma(4)).generate(prompt, config))
        assert spec.tokens == local.tokens
        # speculation over the network: fewer target passes (round trips) than tokens
        assert spec.stats.target_calls < spec.stats.generated
    finally:
        remote.close()
        smollm2.close()
    assert not rpc._workers  # the last remote model stopped its worker


@needs_rpc
def test_the_drafter_stays_on_this_machine(smollm2_path, servers):
    session = Session.load(str(smollm2_path), RuntimeOptions(n_ctx=512, rpc=_eps(servers)))
    try:
        drafter = session.drafter(f"model:{smollm2_path}")
        assert type(drafter.draft) is Model and drafter.draft.rpc_servers == ()
    finally:
        session.close()


@needs_rpc
def test_the_cost_profile_of_an_rpc_target_is_its_own(smollm2_path, servers):
    # the same file, run alike here (the remote target's process uses one thread) but for the servers
    # (flash attention named: 'auto' is off on this CPU but llama.cpp's own choice on RPC devices)
    local = Session.load(str(smollm2_path), RuntimeOptions(n_ctx=512, n_threads=1, flash_attn="off"))
    remote = Session.load(str(smollm2_path), RuntimeOptions(n_ctx=512, rpc=_eps(servers), flash_attn="off"))
    try:
        assert (local.target.n_threads, local.target.flash_attn) == (remote.target.n_threads, remote.target.flash_attn)
        # T(K) over the network includes round trips: a local profile must not stand in for it
        assert profiles.profile_path(remote.target) != profiles.profile_path(local.target)
    finally:
        remote.close()
        local.close()


@needs_rpc
def test_an_unreachable_server_is_one_line(smollm2_path):
    ep = f"127.0.0.1:{rpc.free_port()}"
    with pytest.raises(EdgeSpecError, match=f"cannot reach the RPC server at {ep}: Connection refused"):
        Session.load(str(smollm2_path), RuntimeOptions(n_ctx=512, rpc=(ep,)))
    res = run_app("--headless", "--prompt", "Hi", "--rpc", ep, timeout=120)
    assert res.returncode == 1 and res.stderr.startswith(f"error: cannot reach the RPC server at {ep}")
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n and (part := conn.recv(n - len(data))):
        data += part
    return data


class _OldServer:
    """A TCP server that answers llama.cpp's RPC HELLO like a server of protocol 6.0.0 (an older
    llama.cpp build): HELLO is command 14, a 24-byte request; the answer is its size (8 bytes) and
    major, minor, patch, padding and 24 bytes of transport capabilities."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(30)
        try:
            while True:
                conn, _ = self.sock.accept()
                with conn:
                    conn.settimeout(10)
                    head = _recv_exactly(conn, 9)
                    if len(head) == 9 and head[0] == 14:
                        _recv_exactly(conn, struct.unpack("<Q", head[1:])[0])
                        conn.sendall(struct.pack("<Q", 28) + bytes([6, 0, 0, 0]) + bytes(24))
        except OSError:
            return

    def close(self) -> None:
        self.sock.close()
        self.thread.join(5)


@needs_rpc
def test_a_server_of_another_protocol_version_is_one_line(smollm2_path):
    old = _OldServer()
    try:
        with pytest.raises(EdgeSpecError, match=f"RPC server at {old.endpoint} speaks protocol 6.0.0, this build "
                           "speaks 7.0.0"):
            rpc.RemoteModel(smollm2_path, [old.endpoint], n_ctx=512)
    finally:
        old.close()
    assert not rpc._workers


def _generate_until_error(session: Session, act: Callable[[], None]) -> tuple[EdgeSpecError | None, float, int]:
    """Generate a long reply (400 tokens: the end-of-generation token does not end it) and run `act`
    from another thread 0.05 s after its first token (mid-pass, most likely); (the error raised,
    seconds from `act` to it, tokens generated)."""
    fired: list[float] = []
    timer = threading.Timer(0.05, lambda: (fired.append(time.monotonic()), act()))
    err, tokens = None, 0
    try:
        for _, reply in session.generate(Request(text="Count from one to two hundred in words.", max_tokens=400,
                                                 draft="none", stop_at_eog=False)):
            tokens = len(reply.tokens)
            if not timer.is_alive() and not fired:
                timer.start()
    except EdgeSpecError as exc:
        err = exc
    timer.join()
    return err, time.monotonic() - fired[0], tokens


@needs_rpc
def test_a_server_killed_mid_generation_is_an_error_not_a_hang(smollm2_path, servers):
    eps = _eps(servers)
    session = Session.load(str(smollm2_path), RuntimeOptions(n_ctx=1024, rpc=eps))
    worker = session.target._worker
    try:
        session.run(Request(text="Hi", max_tokens=4, draft="none"))  # warm: the kill lands mid-stream
        err, after, tokens = _generate_until_error(session, servers[1].proc.kill)
        assert isinstance(err, EdgeSpecError), f"no error after {tokens} tokens"
        assert f"lost the RPC server at {eps[1]}" in str(err) and "\n" not in str(err), err
        assert after < 15, after
        assert worker.proc.poll() is not None  # the worker died, this process did not
        with pytest.raises(EdgeSpecError, match=f"lost the RPC server at {eps[1]}"):
            session.run(Request(text="Hi", max_tokens=4))  # stays an error, never a hang
    finally:
        session.close()
    # The app keeps running: with a server back, the target loads and generates again.
    servers[1].stop()
    servers[1] = Server.start()
    again = Session.load(str(smollm2_path), RuntimeOptions(n_ctx=1024, rpc=_eps(servers)))
    try:
        assert len(again.run(Request(text="Hi", max_tokens=8, draft="none")).tokens) > 0
    finally:
        again.close()


@needs_rpc
def test_a_server_that_stops_answering_times_out(smollm2_path, servers, monkeypatch):
    monkeypatch.setenv("EDGESPEC_RPC_TIMEOUT", "3")
    session = Session.load(str(smollm2_path), RuntimeOptions(n_ctx=1024, rpc=_eps(servers)))
    try:
        session.run(Request(text="Hi", max_tokens=4, draft="none"))
        frozen = servers[0].proc.pid
        err, after, _ = _generate_until_error(session, lambda: os.kill(frozen, signal.SIGSTOP))
        assert isinstance(err, EdgeSpecError) and "did not answer within 3 s" in str(err), err
        assert after < 3 + 10, after  # the timeout plus stopping the worker
    finally:
        session.close()


@pytest.mark.parametrize("rpc_list, msg", [
    (("localhost",), "HOST:PORT"),
    (("[::1]:50052",), "no IPv6"),
    (("127.0.0.1:0",), "between 1 and 65535"),
    (("127.0.0.1:5", "127.0.0.1:5"), "twice"),
])
def test_bad_rpc_lists_are_one_line(rpc_list, msg):
    with pytest.raises(EdgeSpecError, match=msg):
        RuntimeOptions(rpc=rpc_list)


def test_exact_mode_and_rpc_do_not_mix():
    with pytest.raises(EdgeSpecError, match="--exact cannot run with --rpc"):
        RuntimeOptions(rpc=("127.0.0.1:50052",), exact=True)


@needs_rpc
def test_rpc_server_command_listens_on_loopback_and_refuses_other_addresses_without_a_flag():
    res = run_app("rpc-server", "--host", "0.0.0.0", timeout=60)
    assert res.returncode == 1 and "no authentication" in res.stderr and "--allow-remote" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    port = rpc.free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "rpc-server", "--port", str(port), "--threads", "1"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while rpc.unreachable(f"127.0.0.1:{port}", 0.5) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert rpc.unreachable(f"127.0.0.1:{port}") is None
        listening = [ln.split()[1] for ln in Path("/proc/net/tcp").read_text().splitlines()[1:]
                     if ln.split()[3] == "0A" and ln.split()[1].endswith(f":{port:04X}")]
        assert listening == [f"0100007F:{port:04X}"]  # 127.0.0.1 only, not 0.0.0.0
    finally:
        proc.kill()
        proc.wait(timeout=10)
