"""How models and tokenizers are named to users: parameter counts from the tensors (not llama.cpp's
size class), one readable tokenizer-type name for both pairing checks, and name lists without repeats."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import gguf
import pytest

import edgespec.models.inspect
from edgespec.models import pairing, resolve
from edgespec.models.inspect import inspect_gguf, pairing_from_metadata
from edgespec.runtime.errors import EdgeSpecError
from edgespec.runtime.llama import parameter_label
from tests.conftest import ROOT


def _vocab_gguf(path: Path, n_tokens: int, model: str = "gpt2") -> Path:
    """A GGUF holding only a tokenizer: n_tokens distinct tokens, BOS 1, EOS 2."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model(model)
    w.add_token_list([f"tok{i}" for i in range(n_tokens)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_description_counts_the_parameters(smollm2_path: Path, gemma_path: Path) -> None:
    # llama.cpp describes any 30-layer llama as "llama 256M"; SmolLM2-135M has 134,515,008 weights.
    s = inspect_gguf(smollm2_path)
    assert s["n_params"] == 134_515_008 and s["description"] == "llama 135M Q4_1"
    assert inspect_gguf(gemma_path)["description"] == "gemma3 268M Q4_K_M"
    assert [parameter_label(n) for n in (50_000, 999_400, 134_515_008, 999_600_000, 1_235_814_400)] == [
        "50K", "999K", "135M", "1.0B", "1.2B"]


def test_one_tokenizer_type_name_for_metadata_and_loaded_models(smollm2_path: Path, gemma_path: Path) -> None:
    assert pairing.vocab_type_name(1) == "llama (SPM)" and pairing.vocab_type_name(2) == "gpt2 (BPE)"
    assert [pairing.vocab_type_of(m) for m in ("llama", "gpt2", "bert", "t5", "rwkv", "none", "no_vocab")] == [
        1, 2, 3, 4, 5, 0, 0]
    ok, why = pairing_from_metadata(smollm2_path, gemma_path)
    assert not ok
    assert why == ("draft gemma-3-270m-q4_k_m.gguf and target SmolLM2-135M-Instruct.Q4_1.gguf use different "
                   "tokenizer types: llama (SPM) vs gpt2 (BPE)")
    # check_compatible (loaded models: llama.cpp's vocab type ints) words the same facts the same way.
    loaded = pairing.header_difference(
        pairing.VocabFacts("SmolLM2-135M-Instruct.Q4_1.gguf", 2, False, False, 1, 2, 49152),
        pairing.VocabFacts("gemma-3-270m-q4_k_m.gguf", 1, True, False, 2, 1, 262144))
    assert loaded == why
    assert edgespec.models.inspect.FIRST_CHECKED_TOKEN is pairing.FIRST_CHECKED_TOKEN


def test_vocabulary_size_limit_is_the_shared_one(tmp_path: Path) -> None:
    n = 300
    target = _vocab_gguf(tmp_path / "t.gguf", n)
    near = _vocab_gguf(tmp_path / "near.gguf", n + pairing.MAX_VOCAB_SIZE_DIFFERENCE)
    far = _vocab_gguf(tmp_path / "far.gguf", n + pairing.MAX_VOCAB_SIZE_DIFFERENCE + 1)
    assert pairing_from_metadata(target, near) == (
        True, f"draft near.gguf can draft for target t.gguf: vocabularies agree on ids >= 5 ({n + 128} vs {n} tokens)")
    assert pairing_from_metadata(target, far) == (
        False, f"draft far.gguf and target t.gguf vocabularies differ in size by more than 128: {n + 129} vs {n}")
    bert = _vocab_gguf(tmp_path / "bert.gguf", n, model="bert")
    assert pairing_from_metadata(target, bert)[1].endswith("different tokenizer types: bert (WPM) vs gpt2 (BPE)")


def test_unknown_model_lists_each_name_once() -> None:
    with pytest.raises(EdgeSpecError) as err:
        resolve("zzqx-no-such-model")
    known = re.search(r"; known: (.*) \(or use", str(err.value)).group(1).split(", ")
    assert known[:2] == ["smollm2-135m", "gemma3-270m"]  # the bundled models first
    assert len(known) == len(set(known)), known
    with pytest.raises(EdgeSpecError) as err:
        resolve("smollm2")
    close = re.search(r"did you mean (.*)\?", str(err.value)).group(1).split(", ")
    assert close[0] == "smollm2-135m" and len(close) == len(set(close)), close


def _list(cache: Path) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache / "hf"), "EDGESPEC_CACHE": str(cache)}
    out = subprocess.run([sys.executable, "-m", "edgespec.models", "list"], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_list_shows_the_derived_pair_and_real_sizes(smollm2_path: Path, tmp_path: Path) -> None:
    from edgespec.models.derive import DERIVED_TARGET_NAME

    before = _list(tmp_path)
    assert re.search(rf"{re.escape(DERIVED_TARGET_NAME)} +target .*not made yet: python -m edgespec.models derive", before)
    assert "llama 135M Q4_1" in before and "256M" not in before
    # Stand-in for `python -m edgespec.models derive` (which needs llama.cpp): a real GGUF at the derived path.
    target = tmp_path / "derived" / DERIVED_TARGET_NAME
    target.parent.mkdir()
    target.write_bytes(smollm2_path.read_bytes())
    after = _list(tmp_path)
    assert "not made yet" not in after
    assert re.search(rf"{re.escape(DERIVED_TARGET_NAME)} +target .* derived +{re.escape(str(target))}", after)
    assert f"  {DERIVED_TARGET_NAME} <- smollm2-135m" in after
