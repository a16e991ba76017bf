"""Quality/speed report: the statistics on hand-made distributions, then a small real run on SmolLM2
(bundled Q4_1 as reference, an MXFP4 conversion of it as candidate)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgespec.apps.quant import mx
from edgespec.apps.quant.convert import convert, open_gguf, tensor_float
from edgespec.apps.quant.report import (
    DistributionStats,
    build_report,
    compare_distributions,
    read_prompts,
    summarize_file,
    tensor_rmse,
    write_outputs,
)
from edgespec.runtime.llama import Model
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def candidate(tmp_path_factory, smollm2_path: Path) -> Path:
    out = tmp_path_factory.mktemp("report") / "smol-mxfp4.gguf"
    convert(smollm2_path, out, "mxfp4", progress=False)
    return out


def test_distribution_stats_by_hand() -> None:
    # Two positions, vocabulary of 2. Row 1: p = q = (0.5, 0.5). Row 2: p = (0.8, 0.2), q = (0.5, 0.5).
    ref = np.log(np.array([[0.5, 0.5], [0.8, 0.2]]))
    cand = np.log(np.array([[0.5, 0.5], [0.5, 0.5]]))
    st = DistributionStats()
    st.add(ref.astype(np.float32), cand.astype(np.float32))
    kl2 = 0.8 * math.log(0.8 / 0.5) + 0.2 * math.log(0.2 / 0.5)
    assert st.positions == 2
    assert st.kl == pytest.approx(kl2 / 2, rel=1e-6)
    assert st.alpha == pytest.approx((1.0 + 0.7) / 2, rel=1e-6)
    assert st.top1 == 1.0  # argmax of (0.5, 0.5) is token 0, as for (0.8, 0.2)


@pytest.mark.slow
def test_summary_and_tensor_rmse(candidate: Path, smollm2_path: Path) -> None:
    s = summarize_file(candidate, "mxfp4")
    assert s.format == "mxfp4" and not s.emulated
    assert s.tensor_types == {"MXFP4": 210, "Q8_0": 1, "F32": 61}
    assert 4.25 < s.bits_per_weight < 6 and s.file_bits_per_weight > s.bits_per_weight
    name = "blk.4.ffn_up.weight"
    some = [name, "blk.0.attn_norm.weight", "blk.9.attn_k.weight"]
    same, per = tensor_rmse(smollm2_path, [smollm2_path, candidate], names=some)
    assert same == dict.fromkeys([*some, "__all__"], 0.0)
    r = {t.name: t for t in open_gguf(smollm2_path).tensors}[name]
    w = tensor_float(r).astype(np.float64)
    want = np.linalg.norm(mx.quantize_dequantize(w, "mxfp4") - w) / np.linalg.norm(w)
    # per[] sums n = w.size float32 squares in a CPU-dependent order: error < 4 sqrt(n) eps (Higham & Mary 2019).
    assert per[name] == pytest.approx(want, rel=4 * math.sqrt(w.size) * float(np.finfo(np.float32).eps))
    assert per["blk.0.attn_norm.weight"] == 0.0  # norms are copied
    # Over several tensors the RMSE ratio is a weighted mean of theirs.
    assert min(per[n] for n in some) <= per["__all__"] <= max(per[n] for n in some)
    assert per["__all__"] > 0.05


def test_identical_models_agree_exactly(smollm2_path: Path) -> None:
    a = Model(smollm2_path, n_ctx=128, n_threads=1, flash_attn="off")
    b = Model(smollm2_path, n_ctx=128, n_threads=1, flash_attn="off")
    st = compare_distributions(a, b, [a.tokenize("One two three four five six seven eight nine ten")])
    assert st.positions > 5
    assert st.kl == pytest.approx(0.0, abs=1e-9) and st.top1 == 1.0 and st.alpha == pytest.approx(1.0, abs=1e-9)
    a.close()
    b.close()


@pytest.mark.slow
def test_small_report_end_to_end(candidate: Path, smollm2_path: Path, tmp_path: Path) -> None:
    prompts = ["The quick brown fox jumps over the lazy dog. The quick brown fox", "Count: one, two, three,"]
    rep = build_report(smollm2_path, [candidate], prompts, "Rivers carry water from the hills down to the sea. " * 4,
                       labels=["mxfp4"], max_prompt_tokens=32, ppl_tokens=48, gen_tokens=8, repeats=1,
                       speed_prompts=1, n_threads=1, log=lambda s: None, show_progress=False)
    c = rep["candidates"][0]
    assert c["kl"] > 0 and 0 < c["top1"] <= 1 and 0 < c["alpha"] <= 1
    assert c["positions"] == rep["settings"]["positions"] > 20
    assert c["perplexity"] > 1 and rep["reference"]["perplexity"] > 1
    assert c["decode_tps"] > 0 and c["decode_ratio"] > 0 and c["ngram_tps"] > 0 and c["draft_tps"] > 0
    assert 0 <= c["ngram_acceptance"] <= 1 and 0 <= c["draft_acceptance"] <= 1
    md, js, png = write_outputs(rep, tmp_path / "r", "test")
    assert json.loads(js.read_text())["candidates"][0]["summary"]["label"] == "mxfp4"
    assert "| mxfp4 | mxfp4 |" in md.read_text()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_prompts_file_format(tmp_path: Path) -> None:
    f = tmp_path / "p.txt"
    f.write_text("first prompt\n\nstill first\n---\nsecond\n---  \n\n")
    assert read_prompts(f) == ["first prompt\n\nstill first", "second"]
    assert len(read_prompts(ROOT / "edgespec" / "apps" / "quant" / "prompts.txt")) == 8


def test_report_cli_errors(tmp_path: Path, smollm2_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "edgespec.apps.quant", "report", *args], capture_output=True, text=True,
                              cwd=ROOT, timeout=120)

    bad = tmp_path / "bad.gguf"
    bad.write_text("not a model")
    for args, expect in [
        (("--reference", str(smollm2_path), str(smollm2_path), "--prompts", str(tmp_path / "none.txt")), "prompts file not found"),
        (("--reference", str(smollm2_path), str(bad), "--prompts", str(ROOT / "edgespec" / "apps" / "quant" / "prompts.txt")), "not a GGUF file"),
        (("--reference", str(smollm2_path), "--prompts", "x"), "the following arguments are required"),
    ]:
        proc = run(*args)
        assert proc.returncode != 0
        assert proc.stderr.startswith("error: ") and expect in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
