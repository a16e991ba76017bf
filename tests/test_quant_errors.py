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


def _special_file(path: Path, kind: str) -> Path:
    """A character device like /dev/null (needs root), a FIFO or a socket at `path`."""
    import os
    import socket
    import stat

    if kind == "device":
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null's numbers
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    return path


@pytest.mark.parametrize("kind, what", [("device", "a character device"), ("fifo", "a named pipe"),
                                        ("socket", "a socket")])
def test_an_output_that_is_no_regular_file_is_left_alone(tiny: Path, tmp_path: Path, kind: str, what: str) -> None:
    """`quant convert IN /dev/null` run as root replaced /dev/null with a regular file (issue 44): a
    device, FIFO or socket at the output path is refused in one line and stays what it was."""
    import stat

    out = _special_file(tmp_path / "out.gguf", kind)
    before = out.lstat()
    _assert_one_line_error(_run("quant", "convert", str(tiny), str(out), "--to", "q8_0", "--no-progress"),
                           f"the output path {out} exists and is {what}")
    after = out.lstat()
    assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode) and after.st_ino == before.st_ino
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.gguf", "tiny.gguf"]  # no temporary file left


def test_the_atomic_writer_refuses_what_is_no_regular_file(tmp_path: Path) -> None:
    from edgespec.models.output import atomic_output

    fifo = _special_file(tmp_path / "fifo", "fifo")
    with pytest.raises(EdgeSpecError, match="exists and is a named pipe"), atomic_output(fifo) as tmp:
        tmp.write_bytes(b"x")
    with pytest.raises(EdgeSpecError, match="exists and is a folder"), atomic_output(tmp_path) as tmp:
        tmp.write_bytes(b"x")
    link = tmp_path / "link"
    link.symlink_to(fifo)  # followed: what it points at is what would be replaced
    with pytest.raises(EdgeSpecError, match="named pipe"), atomic_output(link) as tmp:
        tmp.write_bytes(b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link"]
