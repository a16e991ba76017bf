"""`python -m edgespec.apps.quant` and `python -m edgespec.models info` on paths they cannot write or read and on cut-short
GGUF files: one `error: ...` line naming the path, exit status 1, no traceback, no file left behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from edgespec.apps.quant.convert import convert
from edgespec.runtime.errors import EdgeSpecError
from tests.conftest import ROOT

PROMPTS = ROOT / "edgespec" / "apps" / "quant" / "prompts.txt"


MODULES = {"quant": "edgespec.apps.quant", "models": "edgespec.models"}  # the tools' modules


def _run(tool: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", MODULES[tool], *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def _assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """A small F16 GGUF: a 256 x 256 matrix (128 KB of tensor data) and a norm vector."""
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_string("general.name", "tiny")
    rng = np.random.default_rng(0)
    w.add_tensor("blk.0.ffn_up.weight", rng.standard_normal((256, 256)).astype(np.float16))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(256, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("out", ["/proc/edgespec-x.gguf", "/sys/edgespec-x.gguf"])
def test_output_in_a_folder_that_takes_no_files(tiny: Path, out: str) -> None:
    _assert_one_line_error(_run("quant", "convert", str(tiny), out, "--to", "q8_0", "--no-progress"),
                           f"cannot create the output file {out}")
    _assert_one_line_error(_run("quant", "convert", str(tiny), out, "--to", "mxfp4", "--no-progress"), out)


def test_output_path_that_cannot_exist_and_input_folder(tiny: Path, tmp_path: Path) -> None:
    too_long = tmp_path / ("x" * 300 + ".gguf")
    _assert_one_line_error(_run("quant", "convert", str(tiny), str(too_long), "--to", "f16"),
                           "cannot use the output path", "File name too long")
    _assert_one_line_error(_run("quant", "convert", str(tmp_path), str(tmp_path / "o.gguf"), "--to", "f16"),
                           f"not a file: {tmp_path}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]


def _cut(src: Path, dst: Path, n_bytes: int) -> Path:
    with src.open("rb") as fh:
        dst.write_bytes(fh.read(n_bytes))
    return dst


def test_gguf_cut_in_its_tensor_data(tiny: Path, tmp_path: Path) -> None:
    cut = _cut(tiny, tmp_path / "cut.gguf", tiny.stat().st_size - 70_000)  # half of the matrix is missing
    with pytest.raises(EdgeSpecError, match=r"truncated GGUF: cut\.gguf is \d+ bytes but its tensors need"):
        convert(cut, tmp_path / "out.gguf", "mxfp6-e2m3", progress=False)
    _assert_one_line_error(_run("quant", "convert", str(cut), str(tmp_path / "out.gguf"), "--to", "f16"),
                           "truncated GGUF: cut.gguf")
    _assert_one_line_error(_run("models", "info", str(cut)), "truncated GGUF: cut.gguf")
    _assert_one_line_error(_run("quant", "report", "--reference", str(tiny), str(cut), "--prompts", str(PROMPTS)),
                           "truncated GGUF: cut.gguf")
    _assert_one_line_error(_run("quant", "report", "--reference", str(cut), str(tiny), "--prompts", str(PROMPTS),
                                "--out", str(tmp_path / "r")), "truncated GGUF: cut.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.gguf", "tiny.gguf"]


def test_first_100_kb_of_a_real_model(smollm2_path: Path, tmp_path: Path) -> None:
    head = _cut(smollm2_path, tmp_path / "head.gguf", 100_000)  # ends inside the vocabulary
    for module, args in (("quant", ("convert", str(head), str(tmp_path / "o.gguf"), "--to", "q8_0")),
                         ("models", ("info", str(head))),
                         ("quant", ("report", "--reference", str(smollm2_path), str(head), "--prompts", str(PROMPTS)))):
        _assert_one_line_error(_run(module, *args), f"truncated GGUF header (100000 bytes): {head}")


def test_report_refuses_an_unwritable_output_folder_before_measuring(tiny: Path) -> None:
    proc = _run("quant", "report", "--reference", str(tiny), str(tiny), "--prompts", str(PROMPTS),
                "--out", "/proc/edgespec-report")
    _assert_one_line_error(proc, "cannot write the report in /proc")
