"""What a user meets at the edges of `serve` and the web UI, on real subprocesses on 127.0.0.1:
Ctrl-C during a stream ends it cleanly with status 130, the UI follows the server's rule for
addresses beyond loopback (a key, used as the login password)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx

from tests.conftest import ROOT
from tests.test_server import free_port, start_server

MODEL = "smollm2-135m"


def env_without_key() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "EDGESPEC_API_KEY"}


def run(*args: str, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python app.py ARGS`; a command that should refuse at once but serves instead fails the test
    through TimeoutExpired (subprocess.run kills it first)."""
    return subprocess.run([sys.executable, str(ROOT / "app.py"), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env or env_without_key())


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode}: {proc.stderr.read()}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} did not answer")


def test_ctrl_c_during_a_stream_ends_it_with_done_and_exits_130():
    # no drafter: no cost profile to measure at start-up (the stop path is the same for every drafter)
    served = start_server("--target", MODEL, "--draft", "none", "--ctx", "1024")
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a very long story."}],
                "max_tokens": 900, "ignore_eos": True, "stream": True}
        waiting: dict = {}

        def second() -> None:  # queued behind the stream when the signal comes
            r = httpx.post(served.url + "/v1/chat/completions", timeout=60,
                           json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
            waiting["status"], waiting["body"] = r.status_code, r.json()

        events: list[str] = []
        queued = threading.Thread(target=second, daemon=True)
        with httpx.stream("POST", served.url + "/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[len("data: "):])
                if len(events) == 4:
                    queued.start()
                    deadline = time.monotonic() + 10
                    while served.health()["queued"] < 1 and time.monotonic() < deadline:
                        time.sleep(0.05)
                    served.proc.send_signal(signal.SIGINT)
        queued.join(timeout=30)
        code = served.proc.wait(timeout=30)
        err = served.stderr()
    finally:
        stop(served.proc)
    assert events[-1] == "[DONE]", events[-3:]
    final = json.loads(events[-2])
    assert final["choices"][0]["finish_reason"] == "stop" and final["edgespec"]["finish_reason"] == "stopped"
    assert len(events) < 100  # ended at the next step, not after 900 tokens
    assert waiting.get("status") == 503 and waiting["body"]["error"]["code"] == "server_shutting_down", waiting
    assert code == 130, err
    assert "Traceback" not in err and "ERROR" not in err and "CancelledError" not in err, err
    assert err.rstrip().endswith("interrupted"), err


def test_ctrl_c_in_the_web_ui_exits_130():
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port), "--target", MODEL],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_without_key())
    try:
        wait_http(f"http://127.0.0.1:{port}/", proc)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
        err = proc.stderr.read()
    finally:
        stop(proc)
    assert code == 130, err
    assert "Traceback" not in err and err.rstrip().endswith("interrupted"), err


def test_web_ui_beyond_loopback_needs_a_key_like_serve():
    port = str(free_port())
    res = run("--host", "0.0.0.0", "--port", port, timeout=60)
    assert res.returncode == 1, res.stderr
    assert res.stderr.count("\n") == 1 and "refusing to listen on 0.0.0.0 without --api-key" in res.stderr
    res = run("--host", "0.0.0.0", "--port", port, "--api-key", " ", timeout=60)
    assert res.returncode == 1 and res.stderr == "error: --api-key is empty\n"


def test_web_ui_with_a_key_asks_for_it_as_the_password():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--host", "0.0.0.0", "--port", str(port),
                             "--target", MODEL], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**env_without_key(), "EDGESPEC_API_KEY": "ui-key-42"})
    try:
        wait_http(url + "/", proc)
        assert httpx.get(url + "/config", timeout=10).status_code == 401
        with httpx.Client(base_url=url, timeout=10) as client:
            assert client.post("/login", data={"username": "me", "password": "wrong"}).status_code == 400
            assert client.get("/config").status_code == 401
            assert client.post("/login", data={"username": "me", "password": "ui-key-42"}).status_code == 200
            assert client.get("/config").status_code == 200
    finally:
        stop(proc)
