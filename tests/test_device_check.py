"""The parts of the NVIDIA device check (scripts/device_check.sh, benchmarks/device_check.py) that run
without a GPU: a twin written from a model's header alone, and what the cost model plans from T(K)."""

from __future__ import annotations

import json

import numpy as np

from benchmarks.device_check import plans, twin
from edgespec.models.inspect import read_header
from edgespec.runtime.llama import Model


def test_twin_from_a_header_alone(smollm2_path, smollm2, tmp_path):
    header = read_header(smollm2_path)
    models = tmp_path / "models"
    models.mkdir()
    with open(smollm2_path, "rb") as fh:
        (models / "smol.header.gguf").write_bytes(fh.read(header.data_offset))
    (models / "smol.json").write_text(json.dumps({"size_bytes": smollm2_path.stat().st_size}))
    out = twin(models / "smol.header.gguf", tmp_path)
    assert out.stat().st_size == smollm2_path.stat().st_size
    got = read_header(out)
    assert [(t.name, t.shape, t.type) for t in got.tensors] == [(t.name, t.shape, t.type) for t in header.tensors]
    model = Model(out, n_ctx=256, flash_attn="off", device="cpu")
    try:
        tokens = model.tokenize("Hello there, twin", add_special=True)
        assert tokens == smollm2.tokenize("Hello there, twin", add_special=True)  # the same vocabulary
        assert np.isfinite(np.array(model.decode(tokens, n_logits=1))).all()
    finally:
        model.close()


def test_plans_draft_longer_where_passes_are_flat():
    flat = plans({k: 1.0 + 0.01 * k for k in range(1, 17)})
    linear = plans({k: float(k) for k in range(1, 17)})
    assert flat["alpha 0.9, c 0.0"]["gamma"] > 4 and flat["alpha 0.9, c 0.0"]["speedup"] > 3
    assert linear["alpha 0.9, c 0.0"]["gamma"] == 0 and linear["alpha 0.9, c 0.0"]["speedup"] == 1.0
