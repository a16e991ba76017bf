"""GGUF inspection checked against llama.cpp itself, and pairing from metadata checked against the
full check on loaded models (edgespec.models.pairing.check_compatible) on real pairs."""

from __future__ import annotations

import ctypes
import shutil
import struct
from pathlib import Path

import pytest

from edgespec.models import resolve
from edgespec.models.inspect import inspect_gguf, kv_cache_bytes, pairing_from_metadata, read_header, vocabulary
from edgespec.models.pairing import check_compatible
from edgespec.runtime.errors import EdgeSpecError
from edgespec.runtime.llama import Model, lib

TOKENS_KEY = b"tokenizer.ggml.tokens"


@pytest.fixture(scope="module")
def smollm2_q8(smollm2_path, tmp_path_factory) -> Path:
    """A same-vocabulary copy of SmolLM2 requantized to Q8_0 with llama.cpp's own quantizer."""
    llama = lib()
    out = tmp_path_factory.mktemp("q8") / "smollm2-135m-q8_0.gguf"
    params = llama.llama_model_quantize_default_params()
    params.ftype = llama.LLAMA_FTYPE_MOSTLY_Q8_0
    params.allow_requantize = True
    params.nthread = 2
    rc = llama.llama_model_quantize(str(smollm2_path).encode(), str(out).encode(), ctypes.byref(params))
    assert rc == 0 and out.is_file()
    return out


def _token_offsets(path: Path) -> tuple[list[str], list[int]]:
    """Token texts and the file offset of each token's bytes (independent of edgespec.models.inspect)."""
    data = path.read_bytes()[:20_000_000]
    pos = data.index(TOKENS_KEY) + len(TOKENS_KEY)
    elem_type, count = struct.unpack_from("<IIQ", data, pos)[1:]
    assert elem_type == 8  # array of strings
    pos += 16
    texts, offsets = [], []
    for _ in range(count):
        (n,) = struct.unpack_from("<Q", data, pos)
        offsets.append(pos + 8)
        texts.append(data[pos + 8:pos + 8 + n].decode("utf-8"))
        pos += 8 + n
    return texts, offsets


@pytest.fixture(scope="module")
def smollm2_one_token_changed(smollm2_path, tmp_path_factory) -> tuple[Path, int, str, str]:
    """A copy of SmolLM2 whose text for one ordinary token (id >= 1234) is changed, same length."""
    texts, offsets = _token_offsets(Path(smollm2_path))
    vocab = set(texts)
    for i in range(1234, len(texts)):
        old = texts[i]
        new = old.swapcase()
        if old.isascii() and old.isalpha() and len(old) >= 4 and new not in vocab:
            break
    out = tmp_path_factory.mktemp("tok") / "smollm2-token-changed.gguf"
    shutil.copyfile(smollm2_path, out)
    with out.open("r+b") as fh:
        fh.seek(offsets[i])
        fh.write(new.encode())
    return out, i, old, new


def test_inspection_agrees_with_llama_cpp(smollm2, gemma):
    for model in (smollm2, gemma):
        meta, info = inspect_gguf(model.path), model.info
        assert meta["n_params"] == info.n_params
        assert meta["vocab_size"] == info.n_vocab == model.n_vocab
        assert meta["context_length"] == info.n_ctx_train
        assert (meta["bos_id"], meta["eos_id"]) == (info.bos, info.eos)
        assert (meta["add_bos"], meta["add_eos"]) == (info.add_bos, info.add_eos)
        assert meta["vocab_type"] == info.vocab_type
        assert meta["has_chat_template"] == (model.chat_template() is not None)
        assert vocabulary(model.path)[1000:1010] == [model.token_text(i) for i in range(1000, 1010)]
        assert sum(q["tensors"] for q in meta["quantization"].values()) == len(meta["tensor_types"])
        assert meta["weights_bytes"] <= meta["file_size"]


def test_inspection_facts_of_the_bundled_models(smollm2_path, gemma_path):
    s = inspect_gguf(smollm2_path)
    assert (s["architecture"], s["file_type_name"], s["tokenizer_model"]) == ("llama", "Q4_1", "gpt2")
    assert s["tensor_types"]["blk.0.attn_q.weight"] == "Q4_1" and s["tensor_types"]["token_embd.weight"] == "Q8_0"
    assert s["has_chat_template"] and len(s["vocab_fingerprint"]) == 16
    g = inspect_gguf(gemma_path)
    assert (g["architecture"], g["file_type_name"], g["vocab_size"]) == ("gemma3", "Q4_K_M", 262144)
    assert {"Q4_K", "Q6_K"} <= set(g["quantization"])


def test_kv_cache_estimate_from_metadata(smollm2_path, gemma_path):
    # SmolLM2: 30 layers x 3 KV heads x (64 + 64) dims (576 / 9 heads) x 2 bytes per token.
    assert kv_cache_bytes(read_header(smollm2_path).metadata, 4096) == 4096 * 30 * 3 * 128 * 2
    # Gemma 3 270M: 18 layers x 1 KV head x (256 + 256) (explicit key/value lengths) x 2 bytes.
    assert kv_cache_bytes(read_header(gemma_path).metadata, 1000) == 1000 * 18 * 1 * 512 * 2
    s = inspect_gguf(smollm2_path)
    assert s["memory_bytes_4096"] == s["weights_bytes"] + s["kv_bytes_4096"]


def _full_check(target: Model, draft: Model) -> tuple[bool, str]:
    try:
        check_compatible(target, draft)
    except EdgeSpecError as exc:
        return False, str(exc)
    return True, ""


def test_pairing_from_metadata_agrees_with_the_full_check(smollm2, gemma, smollm2_q8, smollm2_one_token_changed):
    changed_path, tok_id, old, new = smollm2_one_token_changed
    q8 = Model(smollm2_q8, n_ctx=256, flash_attn="off")
    changed = Model(changed_path, n_ctx=256, flash_attn="off")
    cases = [(smollm2, gemma), (gemma, smollm2), (smollm2, q8), (q8, smollm2), (gemma, gemma),
             (smollm2, changed), (changed, q8)]
    verdicts = []
    for target, draft in cases:
        meta_ok, meta_why = pairing_from_metadata(target.path, draft.path)
        full_ok, full_why = _full_check(target, draft)
        assert meta_ok == full_ok, (target.path, draft.path, meta_why, full_why)
        if not full_ok:
            assert meta_why == full_why  # one rule (edgespec.models.pairing), one wording, e.g. "gpt2 (BPE) vs llama (SPM)"
        verdicts.append(meta_ok)
    assert verdicts == [False, False, True, True, True, False, False]
    ok, why = pairing_from_metadata(smollm2.path, changed.path)
    assert why == f"draft and target vocabularies differ at token {tok_id}: {new!r} vs {old!r}"
    assert pairing_from_metadata(smollm2.path, gemma.path)[1].endswith("tokenizer types: llama (SPM) vs gpt2 (BPE)")


def test_truncated_and_non_gguf_files_are_refused(smollm2_path, tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(smollm2_path, "rb") as src:
        cut.write_bytes(src.read(50_000_000))
    with pytest.raises(EdgeSpecError, match="truncated GGUF"):
        resolve(str(cut))
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(cut.read_bytes()[:1000])
    with pytest.raises(EdgeSpecError, match="truncated GGUF header"):
        inspect_gguf(header_only)
    text = tmp_path / "notes.gguf"
    text.write_text("just some text, not a model\n" * 10)
    with pytest.raises(EdgeSpecError, match="not a GGUF file"):
        resolve(str(text))
    with pytest.raises(EdgeSpecError, match="not a GGUF file"):
        pairing_from_metadata(smollm2_path, text)
