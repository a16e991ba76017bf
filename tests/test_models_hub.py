"""The Hub download path for real, without internet: a small HTTP server on 127.0.0.1 answers the
endpoints huggingface_hub calls (model info with file listing, HEAD/GET on resolve/, a 302 to a
"CDN" host serving the bytes with Range support) and serves the bundled SmolLM2 GGUF."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from huggingface_hub import constants

from edgespec.models import hub, resolve
from edgespec.runtime.errors import EdgeSpecError

ROOT = Path(__file__).resolve().parent.parent
REPO = "edgespec-test/SmolLM2-135M-GGUF"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SPEC = f"hf:{REPO}:{GGUF_NAME}"
CHUNK = 1 << 20
CATALOG_NAME = "smollm2-360m-instruct"
CATALOG_REPO, CATALOG_FILE = "HuggingFaceTB/SmolLM2-360M-Instruct-GGUF", "smollm2-360m-instruct-q8_0.gguf"


class Blob:
    """One file in a fake repo: its bytes (a path for big files) and the ids the Hub reports."""

    def __init__(self, data: bytes | Path, lfs: bool) -> None:
        self.path = data if isinstance(data, Path) else None
        self.data = None if isinstance(data, Path) else data
        raw = self.path.read_bytes() if self.path else self.data
        self.size = len(raw)
        self.sha256 = hashlib.sha256(raw).hexdigest()
        self.git_oid = hashlib.sha1(b"blob %d\0" % self.size + raw).hexdigest()
        self.lfs = lfs

    def read(self, start: int, end: int) -> bytes:
        if self.data is not None:
            return self.data[start:end]
        with self.path.open("rb") as fh:
            fh.seek(start)
            return fh.read(end - start)


class FakeHub:
    """A threaded HTTP server speaking the Hub endpoints huggingface_hub uses for model repos."""

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, Blob]] = {}
        self.log: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.drop_at: int | None = None  # absolute byte offset where a file download is cut
        self.drops_left = 0  # how many downloads to cut; -1 for every one
        self.corrupt = False  # flip one byte of served content (size right, sha256 wrong)
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def commit(self, repo: str) -> str:
        return hashlib.sha1(repo.encode()).hexdigest()

    def cdn_gets(self) -> list[tuple[str, str, str | None]]:
        return [e for e in self.log if e[0] == "GET" and e[1].startswith("/cdn/")]

    def _handler(self) -> type:
        hub_ = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                self._route(body=False)

            def do_GET(self) -> None:
                self._route(body=True)

            def _send(self, code: int, headers: dict[str, str], payload: bytes = b"", body: bool = True) -> None:
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if body:
                    self.wfile.write(payload)

            def _route(self, body: bool) -> None:
                path = self.path.split("?", 1)[0]
                hub_.log.append((self.command, path, self.headers.get("Range")))
                m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
                if m:
                    return self._info(m[1], body)
                m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
                if m:
                    return self._resolve(m[1], m[3], body)
                m = re.fullmatch(r"/cdn/([0-9a-f]{64})", path)
                if m:
                    return self._cdn(m[1], body)
                self._send(404, {}, b"not found", body)

            def _missing_repo(self, repo: str, body: bool) -> bool:
                if repo in hub_.repos:
                    return False
                self._send(404, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"},
                           b'{"error": "Repository not found"}', body)
                return True

            def _info(self, repo: str, body: bool) -> None:
                if self._missing_repo(repo, body):
                    return
                siblings = []
                for name, b in hub_.repos[repo].items():
                    s = {"rfilename": name, "size": b.size, "blobId": b.git_oid}
                    if b.lfs:
                        s["lfs"] = {"size": b.size, "sha256": b.sha256, "pointerSize": 134}
                    siblings.append(s)
                doc = {"id": repo, "modelId": repo, "sha": hub_.commit(repo), "private": False, "siblings": siblings}
                self._send(200, {"Content-Type": "application/json"}, json.dumps(doc).encode(), body)

            def _resolve(self, repo: str, name: str, body: bool) -> None:
                if self._missing_repo(repo, body):
                    return
                commit = {"X-Repo-Commit": hub_.commit(repo)}
                b = hub_.repos[repo].get(name)
                if b is None:
                    self._send(404, {**commit, "X-Error-Code": "EntryNotFound"}, b"Entry not found", body)
                elif b.lfs:
                    # Like the real Hub: LFS files redirect to a CDN host, with the file's sha256 and size.
                    self._send(302, {**commit, "ETag": f'"{b.git_oid}"', "X-Linked-Etag": f'"{b.sha256}"',
                                     "X-Linked-Size": str(b.size),
                                     "Location": f"http://localhost:{hub_.port}/cdn/{b.sha256}"}, b"", body)
                else:
                    self._send(200, {**commit, "ETag": f'"{b.git_oid}"'}, b.read(0, b.size), body)

            def _cdn(self, sha: str, body: bool) -> None:
                blob = next((b for files in hub_.repos.values() for b in files.values() if b.sha256 == sha), None)
                if blob is None:
                    return self._send(404, {}, b"", body)
                start = 0
                rng = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
                if rng:
                    start = int(rng[1])
                self.send_response(206 if rng else 200)
                self.send_header("Content-Length", str(blob.size - start))
                self.send_header("ETag", f'"{sha}"')
                if rng:
                    self.send_header("Content-Range", f"bytes {start}-{blob.size - 1}/{blob.size}")
                self.end_headers()
                if not body:
                    return
                stop = blob.size
                cut = hub_.drop_at is not None and hub_.drops_left != 0
                if cut:
                    hub_.drops_left -= 1 if hub_.drops_left > 0 else 0
                    stop = max(start, min(hub_.drop_at, blob.size))
                pos = start
                while pos < stop:
                    chunk = blob.read(pos, min(pos + CHUNK, stop))
                    if hub_.corrupt and pos == 0:
                        chunk = chunk[:1000] + bytes([chunk[1000] ^ 0xFF]) + chunk[1001:]  # same size, other bytes
                    self.wfile.write(chunk)
                    pos += len(chunk)
                if cut:
                    # Drop the connection mid-file, as a flaky network would.
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True

        return Handler


@pytest.fixture(scope="module")
def served_gguf(smollm2_path) -> Blob:
    return Blob(Path(smollm2_path), lfs=True)


@pytest.fixture
def fake_hub(served_gguf, tmp_path, monkeypatch):
    hub_ = FakeHub()
    hub_.repos[REPO] = {GGUF_NAME: served_gguf, "README.md": Blob(b"# test repo\n", lfs=False)}
    hub_.repos["edgespec-test/no-gguf"] = {
        "config.json": Blob(b"{}", lfs=False), "model.safetensors": Blob(b"\0" * 64, lfs=True),
        "README.md": Blob(b"hi", lfs=False),
    }
    # A catalog entry's repo and file name, served with the bundled SmolLM2's bytes.
    hub_.repos[CATALOG_REPO] = {CATALOG_FILE: served_gguf}
    # Stand-ins for a split model: each part of a real split is itself a GGUF with its own tensors.
    hub_.repos["edgespec-test/split-GGUF"] = {f"model-Q8_0-0000{i}-of-00002.gguf": served_gguf for i in (1, 2)}
    hub_.repos["edgespec-test/fake-gguf"] = {"model-Q4_K_M.gguf": Blob(b"this is not a model " * 100, lfs=True)}
    hub_.thread.start()
    monkeypatch.setenv("HF_ENDPOINT", hub_.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield hub_
    hub_.server.shutdown()
    hub_.server.server_close()


def _cache_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() or p.is_symlink()] if root.exists() else []


def test_pull_downloads_into_the_cache_with_progress_and_second_pull_is_a_noop(fake_hub, served_gguf, tmp_path):
    calls: list[tuple[int, int]] = []
    path = hub.pull(SPEC, progress=lambda done, total: calls.append((done, total)))
    cache = tmp_path / "hf-cache"
    assert path.is_relative_to(cache) and path.name == GGUF_NAME
    assert path.is_symlink() and path.resolve().name == served_gguf.sha256  # blobs/<sha256>
    assert path.stat().st_size == served_gguf.size
    assert len(fake_hub.cdn_gets()) == 1
    assert len(calls) >= 5 and calls[-1] == (served_gguf.size, served_gguf.size)
    assert all(b[0] >= a[0] for a, b in zip(calls, calls[1:], strict=False))
    assert not [p for p in _cache_files(cache) if p.name.endswith(".incomplete")]

    n_requests, calls2 = len(fake_hub.log), []
    again = hub.pull(SPEC, progress=lambda d, t: calls2.append((d, t)))
    assert again == path and calls2 == []
    assert len(fake_hub.cdn_gets()) == 1  # no second download
    assert [e[0] for e in fake_hub.log[n_requests:]] == ["GET"]  # only the file listing


def test_resolve_hf_name_without_file_picks_the_gguf(fake_hub, served_gguf):
    path = resolve(f"hf:{REPO}")
    assert path.name == GGUF_NAME and path.stat().st_size == served_gguf.size


def test_catalog_name_downloads_through_the_hub_and_info_checks_its_pairs(fake_hub, served_gguf, tmp_path):
    calls: list[tuple[int, int]] = []
    path = resolve(CATALOG_NAME, progress=lambda d, t: calls.append((d, t)))
    assert path.name == CATALOG_FILE and calls[-1] == (served_gguf.size, served_gguf.size)
    env = {"HF_HUB_CACHE": str(tmp_path / "hf-cache"), "HF_HUB_OFFLINE": "1"}
    info = _cli("info", CATALOG_NAME, env=env)
    assert info.returncode == 0, info.stderr
    assert str(path) in info.stdout
    # Same bytes as the bundled smollm2-135m, so the metadata rule pairs them (both ways: equal size).
    assert "drafts for it:   smollm2-135m" in info.stdout and "it drafts for:   smollm2-135m" in info.stdout
    assert "smollm2-1.7b-instruct (not installed, so not checked)" in info.stdout


def test_split_model_downloads_every_part(fake_hub, served_gguf):
    calls: list[tuple[int, int]] = []
    path = hub.pull("hf:edgespec-test/split-GGUF", progress=lambda d, t: calls.append((d, t)))
    assert path.name == "model-Q8_0-00001-of-00002.gguf"
    assert (path.parent / "model-Q8_0-00002-of-00002.gguf").is_file()
    assert calls[-1] == (2 * served_gguf.size, 2 * served_gguf.size)
    assert [e["file"] for e in hub.installed() if e["repo"] == "edgespec-test/split-GGUF"] == [path.name]
    (path.parent / "model-Q8_0-00002-of-00002.gguf").unlink()
    assert hub.cached(f"hf:edgespec-test/split-GGUF:{path.name}") is None  # unusable without part 2


def test_dropped_connection_leaves_no_usable_file_and_a_clear_error(fake_hub, tmp_path):
    fake_hub.drop_at, fake_hub.drops_left = 10 * CHUNK, -1
    with pytest.raises(EdgeSpecError) as err:
        hub.pull(SPEC, show_bar=False)
    msg = str(err.value)
    assert "\n" not in msg and "download of" in msg and "failed" in msg and "retry" in msg
    cache = tmp_path / "hf-cache"
    assert not [p for p in _cache_files(cache) if "snapshots" in p.parts and p.exists()]
    assert not [p for p in _cache_files(cache) if "blobs" in p.parts]
    assert hub.cached(SPEC) is None
    # The resumed attempts asked for the rest of the file, not the whole file again.
    assert any(r == f"bytes={constants.DOWNLOAD_CHUNK_SIZE}-" for _, _, r in fake_hub.cdn_gets())


def test_one_drop_is_resumed_with_a_range_request(fake_hub, served_gguf):
    fake_hub.drop_at, fake_hub.drops_left = 15 * CHUNK + 123, 1
    path = hub.pull(SPEC, show_bar=False)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == served_gguf.sha256
    # huggingface_hub writes in DOWNLOAD_CHUNK_SIZE pieces and resumes after the last whole one.
    kept = fake_hub.drop_at // constants.DOWNLOAD_CHUNK_SIZE * constants.DOWNLOAD_CHUNK_SIZE
    assert kept > 0
    assert [r for _, _, r in fake_hub.cdn_gets()] == [None, f"bytes={kept}-"]


def test_corrupted_bytes_fail_the_sha256_check_and_are_removed(fake_hub, tmp_path):
    fake_hub.corrupt = True
    with pytest.raises(EdgeSpecError, match="sha256"):
        hub.pull(SPEC, show_bar=False)
    assert hub.cached(SPEC) is None
    assert not [p for p in _cache_files(tmp_path / "hf-cache") if "blobs" in p.parts]


def test_offline_with_empty_cache_says_what_to_do(fake_hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EdgeSpecError) as err:
        resolve(SPEC)
    assert "HF_HUB_OFFLINE" in str(err.value) and "python -m edgespec.models pull" in str(err.value)
    assert fake_hub.log == []


def test_offline_with_cached_file_needs_no_server(fake_hub, monkeypatch):
    path = hub.pull(SPEC, show_bar=False)
    fake_hub.log.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve(SPEC) == path
    assert resolve(f"hf:{REPO}") == path
    assert fake_hub.log == []


def test_repo_without_gguf_lists_what_it_has(fake_hub):
    with pytest.raises(EdgeSpecError) as err:
        hub.pull("hf:edgespec-test/no-gguf")
    assert "no .gguf" in str(err.value) and "config.json" in str(err.value) and "model.safetensors" in str(err.value)


def test_file_that_is_not_gguf_is_refused_and_removed(fake_hub):
    with pytest.raises(EdgeSpecError) as err:
        hub.pull("hf:edgespec-test/fake-gguf", show_bar=False)
    assert "not a GGUF" in str(err.value) and "removed" in str(err.value)
    assert hub.cached("hf:edgespec-test/fake-gguf:model-Q4_K_M.gguf") is None


def test_unknown_repo_and_unknown_file(fake_hub):
    with pytest.raises(EdgeSpecError, match="not found"):
        hub.pull("hf:edgespec-test/nope")
    with pytest.raises(EdgeSpecError, match=f"did you mean {re.escape(GGUF_NAME)}"):
        hub.pull(f"hf:{REPO}:SmolLM2-135M-Instruct.Q4_0.gguf")


def test_unreachable_hub_is_one_line(tmp_path, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket closes
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(EdgeSpecError, match="cannot reach the Hub"):
        hub.pull(SPEC)


def _cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgespec.models", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **env}, timeout=timeout)


def test_cli_pull_list_remove(fake_hub, tmp_path):
    env = {"HF_ENDPOINT": fake_hub.url, "HF_HUB_CACHE": str(tmp_path / "hf-cache"), "HF_HUB_OFFLINE": "0"}
    first = _cli("pull", SPEC, env=env)
    assert first.returncode == 0, first.stderr
    assert "100%" in first.stderr and GGUF_NAME in first.stderr  # the tqdm bar
    assert str(tmp_path / "hf-cache") in first.stdout
    second = _cli("pull", SPEC, env=env)
    assert second.returncode == 0 and "100%" not in second.stderr
    assert len(fake_hub.cdn_gets()) == 1

    listed = _cli("list", env=env)
    assert listed.returncode == 0 and SPEC in listed.stdout
    # The bundled SmolLM2 and the downloaded copy have the same vocabulary: list says they pair.
    assert re.search(r"<- (smollm2-135m|hf:)", listed.stdout)

    removed = _cli("remove", SPEC, env=env)
    assert removed.returncode == 0 and "removed" in removed.stdout
    assert SPEC not in _cli("list", env=env).stdout
    again = _cli("remove", SPEC, env=env)
    assert again.returncode == 1 and again.stderr.startswith("error: ") and again.stderr.count("\n") == 1


def test_cli_offline_empty_cache(tmp_path):
    env = {"HF_HUB_CACHE": str(tmp_path / "hf-cache"), "HF_HUB_OFFLINE": "1"}
    out = _cli("pull", SPEC, env=env)
    assert out.returncode == 1 and out.stderr.count("\n") == 1
    assert "unset HF_HUB_OFFLINE" in out.stderr and "Traceback" not in out.stderr


@pytest.fixture
def silent_endpoint():
    """A server on 127.0.0.1 that accepts connections and never answers (a stalled proxy or Hub)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    done.set()
    thread.join(timeout=5)
    for conn in held:
        conn.close()
    listener.close()


def test_pull_from_an_endpoint_that_never_answers_times_out_in_one_line(silent_endpoint, tmp_path):
    env = {"HF_ENDPOINT": silent_endpoint, "HF_HUB_CACHE": str(tmp_path / "hf-cache"), "HF_HUB_OFFLINE": "0",
           "EDGESPEC_HUB_TIMEOUT": "1.5"}
    t0 = time.monotonic()
    out = _cli("pull", SPEC, env=env, timeout=60)  # without a timeout this waits forever (the test then fails)
    took = time.monotonic() - t0
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: ")
    assert f"the Hub at {silent_endpoint} did not answer within 1.5 s (EDGESPEC_HUB_TIMEOUT)" in out.stderr
    assert took < 30, f"took {took:.0f} s"
    bad = _cli("pull", SPEC, env={**env, "EDGESPEC_HUB_TIMEOUT": "soon"}, timeout=60)
    assert bad.returncode == 1 and bad.stderr == "error: EDGESPEC_HUB_TIMEOUT must be a number of seconds > 0, got 'soon'\n"
