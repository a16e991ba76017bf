"""GGUF requantization on the bundled SmolLM2 (real gguf-py, real llama.cpp quantizer and loader)."""

from __future__ import annotations

import errno
import hashlib
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from edgespec.apps.quant import mx
from edgespec.apps.quant.convert import convert, tensor_float
from edgespec.runtime.errors import EdgeSpecError
from edgespec.runtime.llama import Model
from tests.conftest import ROOT, run_app

Q = gguf.GGMLQuantizationType


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("quant")


@pytest.fixture(scope="module")
def f16(work: Path, smollm2_path: Path) -> Path:
    out = work / "smol-f16.gguf"
    before = sha(smollm2_path)
    res = convert(smollm2_path, out, "f16", progress=False)
    assert sha(smollm2_path) == before  # the input is only read
    assert res.type_counts() == {"F16": 211, "F32": 61}
    return out


@pytest.fixture(scope="module")
def mxfp4(work: Path, f16: Path) -> Path:
    out = work / "smol-mxfp4.gguf"
    convert(f16, out, "mxfp4", progress=False)
    return out


def tensors(path: Path) -> dict[str, object]:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


@pytest.mark.slow
def test_f16_reference_keeps_metadata_and_values(f16: Path, smollm2_path: Path) -> None:
    src, out = gguf.GGUFReader(smollm2_path), gguf.GGUFReader(f16)
    for key in ("tokenizer.ggml.tokens", "tokenizer.chat_template", "llama.block_count", "tokenizer.ggml.merges"):
        assert out.get_field(key).contents() == src.get_field(key).contents()
    assert out.get_field("general.file_type").contents() == 1
    s, o = tensors(smollm2_path), tensors(f16)
    name = "blk.3.ffn_down.weight"
    assert o[name].tensor_type == Q.F16 and s[name].tensor_type == Q.Q4_1
    # Q4_1 values (scale * q + min, computed in float32) fit F16 to rounding.
    np.testing.assert_allclose(tensor_float(o[name]), tensor_float(s[name]), rtol=1e-3, atol=1e-6)


@pytest.mark.slow
def test_mxfp4_is_real_ggml_mxfp4_and_generates(mxfp4: Path, f16: Path) -> None:
    out, ref = tensors(mxfp4), tensors(f16)
    kinds = {name: t.tensor_type for name, t in out.items()}
    assert kinds["token_embd.weight"] == Q.Q8_0
    assert kinds["blk.0.attn_norm.weight"] == Q.F32
    mats = [n for n in out if n.startswith("blk.") and len(out[n].shape) == 2]
    assert len(mats) == 210 and all(kinds[n] == Q.MXFP4 for n in mats)
    # The stored blocks decode (by gguf-py, i.e. ggml's layout) to the spec's MXFP4 values of the source.
    name = "blk.7.attn_q.weight"
    want = mx.quantize_dequantize(tensor_float(ref[name]), "mxfp4")
    np.testing.assert_array_equal(tensor_float(out[name]), want)
    assert gguf.GGUFReader(mxfp4).get_field("edgespec.quant.format").contents() == "mxfp4"

    # llama.cpp loads it natively and continues a prompt sensibly (same top token as F16 here).
    model = Model(mxfp4, n_ctx=256, n_threads=1, flash_attn="off")
    refm = Model(f16, n_ctx=256, n_threads=1, flash_attn="off")
    prompt = model.tokenize("The capital of France is the city of")
    a = np.array(model.decode(prompt, 1)[0])
    b = np.array(refm.decode(prompt, 1)[0])
    assert np.isfinite(a).all() and a.argmax() == b.argmax()
    assert model.detokenize([int(a.argmax())]).strip() == "Paris"
    model.close()
    refm.close()


def test_mxfp4_plugs_into_app_as_draft(mxfp4: Path, f16: Path) -> None:
    proc = run_app("--headless", "--json", "--target", str(f16), "--draft", str(mxfp4), "--gamma", "3",
                   "--prompt", "List the days of the week: Monday, Tuesday,", "--max-tokens", "12",
                   "--threads", "1", "--ctx", "256")
    assert proc.returncode == 0, proc.stderr
    assert '"drafted"' in proc.stdout


def test_emulated_mx_records_metadata_and_values(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((96, 128)) * 0.02).astype(np.float16)
    src = tiny_gguf(tmp_path / "in.gguf", {
        "token_embd.weight": (rng.standard_normal((8, 128)).astype(np.float16), None),
        "blk.0.ffn_gate.weight": (w, None),
        "blk.0.ffn_norm.weight": (np.ones(128, np.float32), None),
    })
    out = tmp_path / "out.gguf"
    res = convert(src, out, "mxfp6-e2m3", progress=False)
    assert res.emulated and "EMULATED" in res.summary()
    assert res.type_counts() == {"F16 (mxfp6-e2m3 emulated)": 1, "F32": 1, "Q8_0": 1}
    r = gguf.GGUFReader(out)
    assert r.get_field("edgespec.quant.emulated").contents() is True
    assert r.get_field("edgespec.quant.format").contents() == "mxfp6-e2m3"
    assert r.get_field("edgespec.quant.mx_bits_per_weight").contents() == pytest.approx(6.25)
    assert r.get_field("general.name").contents() == "tiny"
    # True bits count MX bits for the matrix, not its 16-bit container.
    want_bits = (96 * 128 * 6.25 + 8 * 128 * 8.5 + 128 * 32) / (96 * 128 + 8 * 128 + 128)
    assert res.bits_per_weight == pytest.approx(want_bits) and res.file_bits_per_weight > 15 > 2 * res.bits_per_weight
    got = tensor_float(tensors(out)["blk.0.ffn_gate.weight"])
    np.testing.assert_array_equal(got, mx.quantize_dequantize(w.astype(np.float32), "mxfp6-e2m3"))
    # An MXFP8-E5M2 value F16 cannot hold (1.75 * 2^-24 beside 1.0 in a block): the container widens
    # to BF16 and the values stay exact.
    w32 = w.astype(np.float32)
    w32[0, :2] = [1.0, 1.75 * 2.0**-24]
    src32 = tiny_gguf(tmp_path / "in32.gguf", {"blk.0.ffn_gate.weight": (w32, None)})
    res8 = convert(src32, tmp_path / "e5m2.gguf", "mxfp8-e5m2", progress=False)
    assert [(c.output_type, c.bits_per_weight) for c in res8.tensors] == [("BF16", 8.25)]
    got8 = tensor_float(tensors(tmp_path / "e5m2.gguf")["blk.0.ffn_gate.weight"])
    np.testing.assert_array_equal(got8, mx.quantize_dequantize(w32, "mxfp8-e5m2"))
    assert got8[0, 1] == np.float32(1.75 * 2.0**-24)


@pytest.mark.slow
def test_quantized_input_is_dequantized_before_llama_quantize(work: Path, smollm2_path: Path) -> None:
    out = work / "smol-q8_0.gguf"
    res = convert(smollm2_path, out, "q8_0", progress=False)
    assert res.type_counts() == {"Q8_0": 211, "F32": 61}
    assert sorted(p.name for p in work.iterdir() if "tmp" in p.name or p.name.startswith(".edgespec")) == []
    model = Model(out, n_ctx=128, n_threads=1)
    assert np.isfinite(model.decode(model.tokenize("Hello"), 1)).all()
    model.close()


# ------------------------------------------------------------------ bad input
def test_not_a_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "notes.gguf"
    bad.write_text("hello")
    with pytest.raises(EdgeSpecError, match="not a GGUF file"):
        convert(bad, tmp_path / "out.gguf", "mxfp4")
    assert not (tmp_path / "out.gguf").exists()


def test_unknown_format_and_same_path(smollm2_path: Path, tmp_path: Path) -> None:
    with pytest.raises(EdgeSpecError, match="unknown format 'mxfp5'; choose one of f16, q8_0"):
        convert(smollm2_path, tmp_path / "o.gguf", "mxfp5")
    with pytest.raises(EdgeSpecError, match="output path is the input file"):
        convert(smollm2_path, smollm2_path, "mxfp4")
    link = tmp_path / "link.gguf"
    link.symlink_to(smollm2_path)
    with pytest.raises(EdgeSpecError, match="output path is the input file"):
        convert(smollm2_path, link, "mxfp4")


def tiny_gguf(path: Path, tensors: dict[str, tuple[np.ndarray, Q | None]]) -> Path:
    """A small GGUF with the given tensors (not a runnable model: the converter only reads tensors)."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_string("general.name", "tiny")
    for name, (data, raw) in tensors.items():
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unsupported_tensor_type(tmp_path: Path) -> None:
    block_bytes = gguf.GGML_QUANT_SIZES[Q.Q8_K][1]
    src = tiny_gguf(tmp_path / "q8k.gguf",
                    {"blk.0.attn_q.weight": (np.zeros((2, block_bytes), dtype=np.uint8), Q.Q8_K)})
    with pytest.raises(EdgeSpecError, match="unsupported tensor type Q8_K .*blk.0.attn_q.weight"):
        convert(src, tmp_path / "out.gguf", "mxfp4")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q8k.gguf"]


def test_disk_full_leaves_no_output_and_input_untouched(tmp_path: Path, monkeypatch) -> None:
    w = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float16)
    src = tiny_gguf(tmp_path / "in.gguf", {"blk.0.ffn_up.weight": (w, None),
                                            "blk.0.ffn_norm.weight": (np.ones(256, np.float32), None)})
    before = sha(src)

    def full_disk(self, *, progress: bool = False) -> None:
        self.fout[0].write(b"\0" * 4096)  # part of the data reaches the disk, then it is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", full_disk)
    out = tmp_path / "out.gguf"
    with pytest.raises(EdgeSpecError, match=r"could not write .*out.gguf: No space left on device"):
        convert(src, out, "mxfp6-e3m2", progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["in.gguf"]
    assert sha(src) == before
    monkeypatch.undo()
    res = convert(src, out, "mxfp6-e3m2", progress=False)  # the same conversion succeeds on a healthy disk
    assert res.type_counts() == {"F16 (mxfp6-e3m2 emulated)": 1, "F32": 1} and out.is_file()


def test_cli_errors_are_one_line(tmp_path: Path, smollm2_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "edgespec.apps.quant", *args], capture_output=True, text=True,
                              cwd=ROOT, timeout=120)

    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOPE" + b"\0" * 64)
    for args, expect in [
        ((str(bad), str(tmp_path / "o.gguf"), "--to", "mxfp4"), "not a GGUF file"),
        ((str(smollm2_path), str(tmp_path / "o.gguf"), "--to", "int3"), "unknown format 'int3'"),
        ((str(smollm2_path), str(smollm2_path), "--to", "q8_0"), "output path is the input file"),
        ((str(smollm2_path), str(tmp_path / "nodir" / "o.gguf"), "--to", "q8_0"), "output folder does not exist"),
    ]:
        proc = run("convert", *args)
        assert proc.returncode != 0
        assert proc.stderr.startswith("error: ") and expect in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.gguf"]
