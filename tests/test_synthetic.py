"""edgespec.models.synthetic: random-weight twins of the bundled models keep every metadata value and the tensor
table, hold random contents that decode finite, and load and run in llama.cpp; the CLI's bad inputs
are one line and exit status 1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter, quants

from edgespec.models import bundled_path
from edgespec.models.synthetic import HALF_FIELDS, SUPPORTED, random_tensor, write_random_like
from edgespec.runtime import llama as runtime
from edgespec.runtime.errors import EdgeSpecError

ROOT = Path(__file__).resolve().parent.parent
Q = GGMLQuantizationType

# Byte offsets of the fp16 scale fields in one block, restated here from ggml-common.h for the types
# the bundled models hold (not read from edgespec.models.synthetic, so a wrong offset there fails here).
SCALE_OFFSETS = {
    Q.Q4_1: (0, 2),  # d, m, qs[16]
    Q.Q5_0: (0,),  # d, qh[4], qs[16]
    Q.Q8_0: (0,),  # d, qs[32]
    Q.Q4_K: (0, 2),  # d, dmin, scales[12], qs[128]
    Q.Q6_K: (208,),  # ql[128], qh[64], scales[16], d
}
MAX_ABS_WEIGHT = 8.0  # |x| <= 4 for the largest random Q6_K block (2^-10 * 128 * 32)


def _values(reader: GGUFReader) -> dict[str, tuple[list[str], list[bytes]]]:
    """Every metadata key (the reader's GGUF.* pseudo-keys left out) -> (value types, stored bytes of each value)."""
    return {key: ([t.name for t in f.types], [bytes(f.parts[i]) for i in f.data])
            for key, f in reader.fields.items() if not key.startswith("GGUF.")}


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def pair(request, tmp_path_factory) -> tuple[Path, Path, GGUFReader, GGUFReader]:
    """(source, twin, source reader, twin reader) for each bundled model."""
    source = bundled_path(request.param)
    twin = tmp_path_factory.mktemp("twin") / f"{request.param}-random.gguf"
    calls = []
    assert write_random_like(source, twin, progress=lambda done, total: calls.append((done, total))) == twin
    out = GGUFReader(twin)
    assert len(calls) == len(out.tensors) and calls[-1] == (sum(int(t.n_bytes) for t in out.tensors),) * 2
    return source, twin, GGUFReader(source), out


def test_same_metadata_and_tensor_table(pair):
    source, twin, src, out = pair
    assert list(_values(out)) == list(_values(src))  # same keys, same order
    assert _values(out) == _values(src)  # same types and byte-identical values (tokenizer, chat template...)
    assert [(t.name, t.shape.tolist(), t.tensor_type) for t in out.tensors] == \
           [(t.name, t.shape.tolist(), t.tensor_type) for t in src.tensors]
    assert twin.stat().st_size == source.stat().st_size
    if "gemma" in source.name:  # the K-quant mix is what the twin is for
        assert {Q.Q4_K, Q.Q6_K, Q.Q5_0, Q.Q8_0, Q.F32} <= {t.tensor_type for t in out.tensors}


def test_contents_are_random_and_decode_finite(pair):
    _, _, src, out = pair
    for s, t in zip(src.tensors, out.tensors, strict=True):
        assert not np.array_equal(np.asarray(s.data), np.asarray(t.data)), t.name
        if t.tensor_type in SCALE_OFFSETS:
            blocks = np.asarray(t.data).reshape(-1, GGML_QUANT_SIZES[t.tensor_type][1])
            for off in SCALE_OFFSETS[t.tensor_type]:
                half = np.ascontiguousarray(blocks[:, off:off + 2]).view(np.float16)
                assert np.isfinite(half).all() and (half != 0).all(), (t.name, off)
        else:
            assert t.tensor_type == Q.F32, t.name
        values = quants.dequantize(np.asarray(t.data), t.tensor_type)
        assert np.isfinite(values).all() and np.abs(values).max() <= MAX_ABS_WEIGHT, t.name
        if "norm" in t.name:
            assert abs(float(values.mean()) - 1.0) < 0.05, t.name


def test_llama_cpp_loads_the_twin_and_tokenizes_the_same(pair):
    source, twin, _, _ = pair
    real = runtime.Model(source, n_ctx=128)
    m = runtime.Model(twin, n_ctx=128)
    try:
        text = "hello world: def f(x): return x + 1"
        assert m.tokenize(text) == real.tokenize(text)
        logits = m.decode(m.tokenize("hello world"), n_logits=1)
        assert logits.shape == (1, real.n_vocab) and np.isfinite(logits).all()
        assert float(logits.std()) > 0  # not a degenerate model
    finally:
        m.close()
        real.close()


@pytest.mark.parametrize("qtype", [t for t in SUPPORTED if GGML_QUANT_SIZES[t][0] > 1], ids=lambda t: t.name)
def test_every_quantized_type_decodes_finite(qtype):
    """Each block layout edgespec.models.synthetic knows, checked by gguf-py's own dequantizer over 1,024 blocks."""
    block, size = GGML_QUANT_SIZES[qtype]
    raw = random_tensor("blk.0.ffn_up.weight", qtype, 1024 * block, np.random.default_rng(1))
    assert raw.dtype == np.uint8 and raw.size == 1024 * size
    values = quants.dequantize(raw.reshape(-1, size), qtype)
    assert np.isfinite(values).all() and 0 < np.abs(values).max() <= MAX_ABS_WEIGHT
    assert np.unique(values).size >= 3  # the payload stays random (ternary TQ types have 3 values)
    if qtype in HALF_FIELDS:  # the same bytes without the scale fix: some fp16 scales are inf or NaN
        bad = np.random.default_rng(1).bit_generator.random_raw(raw.size // 8 + 1).view(np.uint8)[:raw.size]
        with np.errstate(all="ignore"):
            assert not np.isfinite(quants.dequantize(bad.reshape(-1, size), qtype)).all()


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16], ids=lambda t: t.name)
def test_float_tensors_are_small_normals(qtype):
    rng = np.random.default_rng(0)
    weights = quants.dequantize(random_tensor("blk.0.attn_q.weight", qtype, 4096, rng), qtype)
    norms = quants.dequantize(random_tensor("blk.0.attn_norm.weight", qtype, 4096, rng), qtype)
    assert abs(float(weights.std()) - 0.02) < 0.002 and abs(float(weights.mean())) < 0.002
    assert abs(float(norms.mean()) - 1.0) < 0.002


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgespec.models.synthetic", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def _one_error_line(res: subprocess.CompletedProcess, fragment: str) -> None:
    assert res.returncode == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], res.stderr
    assert "Traceback" not in res.stderr


def test_cli_writes_a_seeded_twin(tmp_path):
    source = bundled_path("smollm2-135m")
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    res = _run(str(source), str(a), "--seed", "3", "--no-progress")
    assert res.returncode == 0 and res.stdout.startswith(f"wrote {a}"), res.stderr
    write_random_like(source, b, seed=3)
    assert a.read_bytes() == b.read_bytes()  # the seed fixes the contents
    write_random_like(source, b, seed=4, force=True)
    assert a.read_bytes() != b.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf", "b.gguf"]  # no temporary files left


def test_cli_bad_inputs(tmp_path):
    source = bundled_path("smollm2-135m")
    _one_error_line(_run(str(tmp_path / "missing.gguf"), str(tmp_path / "out.gguf")), "model file not found")
    existing = tmp_path / "existing.gguf"
    existing.write_bytes(b"keep me")
    _one_error_line(_run(str(source), str(existing)), "output file exists")
    assert existing.read_bytes() == b"keep me"
    assert os.listdir(tmp_path) == ["existing.gguf"]


def test_bad_inputs(tmp_path):
    source = bundled_path("smollm2-135m")
    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n" * 10)
    with pytest.raises(EdgeSpecError, match="not a GGUF file"):
        write_random_like(text, tmp_path / "out.gguf")
    with pytest.raises(EdgeSpecError, match="output folder does not exist"):
        write_random_like(source, tmp_path / "no" / "such" / "out.gguf")
    with pytest.raises(EdgeSpecError, match="output path is the source file"):
        write_random_like(source, source, force=True)
    with pytest.raises(EdgeSpecError, match="output path is a folder"):
        write_random_like(source, tmp_path, force=True)
    ints = tmp_path / "ints.gguf"  # a tensor type without a known block layout
    writer = GGUFWriter(ints, "llama")
    writer.add_tensor("positions", np.arange(64, dtype=np.int32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(EdgeSpecError, match="tensor positions has GGML type I32, whose block layout"):
        write_random_like(ints, tmp_path / "out.gguf")
    assert sorted(os.listdir(tmp_path)) == ["ints.gguf", "notes.gguf"]  # nothing written, no temporary files
