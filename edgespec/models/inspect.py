"""Read a GGUF file's header without loading the model: architecture, size, quantization,
context length, tokenizer, and the draft/target pairing rule answered from metadata alone.

The header is parsed here with the `gguf` package's type tables (value types, quantization block
sizes, file types). gguf-py's own GGUFReader builds one numpy view per array element, which takes
15-25 s on a 262k-token vocabulary; this reader takes well under a second for the same file.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, LlamaFileType

from edgespec.models.pairing import (
    FIRST_CHECKED_TOKEN,
    VocabFacts,
    header_difference,
    token_difference,
    vocab_type_name,
    vocab_type_of,
)
from edgespec.runtime.errors import EdgeSpecError
from edgespec.runtime.llama import parameter_label

GGUF_MAGIC = b"GGUF"
_BLOCK_TENSOR = re.compile(r"^blk\.(\d+)\.")  # a layer's tensors: blk.<layer>.<name>
DEFAULT_ALIGNMENT = 32
KV_BYTES_PER_VALUE = 2  # llama.cpp's default KV cache type is F16
DEFAULT_MEMORY_CONTEXT = 4096

# llama.cpp's add-BOS/add-EOS defaults by tokenizer.ggml.model when the GGUF does not set them.
_DEFAULT_ADD_BOS = {"llama": True, "bert": True}
_DEFAULT_ADD_EOS = {"t5": True, "bert": True}

_NUMPY_TYPES = {
    GGUFValueType.UINT8: np.uint8, GGUFValueType.INT8: np.int8,
    GGUFValueType.UINT16: np.uint16, GGUFValueType.INT16: np.int16,
    GGUFValueType.UINT32: np.uint32, GGUFValueType.INT32: np.int32,
    GGUFValueType.FLOAT32: np.float32, GGUFValueType.BOOL: np.bool_,
    GGUFValueType.UINT64: np.uint64, GGUFValueType.INT64: np.int64,
    GGUFValueType.FLOAT64: np.float64,
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    type: GGMLQuantizationType
    offset: int  # bytes from the start of the tensor data section

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def n_bytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.type]
        return self.n_elements // block * size


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any]  # numeric arrays as numpy arrays, string arrays as lists of str
    tensors: list[TensorInfo]
    data_offset: int  # bytes from the start of the file
    file_size: int


class _Cursor:
    """Little-endian reads from a memory map, with a one-line error when the file ends early."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            raise EdgeSpecError(f"truncated GGUF header ({len(self.buf)} bytes): {self.path}")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self) -> str:
        return self.take(self.u64()).decode("utf-8", "replace")

    def value(self, vtype: int) -> Any:
        vtype = GGUFValueType(vtype)
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            etype, count = GGUFValueType(self.u32()), self.u64()
            if etype == GGUFValueType.STRING:
                return [self.string() for _ in range(count)]
            if etype == GGUFValueType.ARRAY:
                return [self.value(GGUFValueType.ARRAY) for _ in range(count)]
            dtype = np.dtype(_NUMPY_TYPES[etype]).newbyteorder("<")
            raw = self.take(count * dtype.itemsize)
            return np.frombuffer(raw, dtype=dtype)
        dtype = np.dtype(_NUMPY_TYPES[vtype]).newbyteorder("<")
        return np.frombuffer(self.take(dtype.itemsize), dtype=dtype)[0].item()


def _read_header(path: Path, size: int) -> GGUFHeader:
    with path.open("rb") as fh:
        if size < 24:
            raise EdgeSpecError(f"not a GGUF file ({size} bytes): {path}")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            cur = _Cursor(buf, path)
            magic = cur.take(4)
            if magic != GGUF_MAGIC:
                raise EdgeSpecError(f"not a GGUF file (bad magic {magic!r}): {path}")
            version = cur.u32()
            if version not in (2, 3):
                raise EdgeSpecError(f"unsupported GGUF version {version} (big-endian or too old): {path}")
            n_tensors, n_kv = cur.u64(), cur.u64()
            try:
                metadata = {}
                for _ in range(n_kv):
                    key = cur.string()
                    metadata[key] = cur.value(cur.u32())
                tensors = []
                for _ in range(n_tensors):
                    name = cur.string()
                    dims = tuple(cur.u64() for _ in range(cur.u32()))
                    tensors.append(TensorInfo(name, dims, GGMLQuantizationType(cur.u32()), cur.u64()))
            except ValueError as exc:
                raise EdgeSpecError(f"corrupt GGUF header ({exc}): {path}") from None
            align = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
            data_offset = -(-cur.pos // align) * align
    return GGUFHeader(path, version, metadata, tensors, data_offset, size)


@lru_cache(maxsize=16)
def _cached_header(path: Path, size: int, mtime_ns: int) -> GGUFHeader:
    # size and mtime are part of the key so that a rewritten file is read again.
    return _read_header(path, size)


def read_header(path: str | os.PathLike) -> GGUFHeader:
    """Parse a GGUF header (metadata + tensor table) and check that the tensor data is all there.

    A file that was cut short (an interrupted copy or download) fails here with a one-line error,
    even though its first bytes look like a model.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise EdgeSpecError(f"model file not found: {p}")
    st = p.stat()
    header = _cached_header(p.resolve(), st.st_size, st.st_mtime_ns)
    needed = header.data_offset + max((t.offset + t.n_bytes for t in header.tensors), default=0)
    if needed > header.file_size:
        raise EdgeSpecError(
            f"truncated GGUF: {p.name} is {header.file_size} bytes but its tensors need {needed}; "
            "download or copy it again"
        )
    check_blocks(header, p.name)
    return header


def check_blocks(header: GGUFHeader, name: str) -> None:
    """The metadata's layer count against the layers whose tensors the file holds (blk.0.* to
    blk.N-1.*): llama.cpp trusts `<arch>.block_count` and aborts the whole process (GGML_ASSERT) on
    a count of 0 or one far beyond the tensors, so a file that contradicts itself stops here."""
    arch = header.metadata.get("general.architecture")
    count = header.metadata.get(f"{arch}.block_count")
    blocks = {int(m[1]) for t in header.tensors if (m := _BLOCK_TENSOR.match(t.name))}
    if count is None or not blocks:
        return  # no layer count (llama.cpp refuses that in words), or no llama.cpp-style layers to count
    if isinstance(count, bool) or not isinstance(count, int) or count != max(blocks) + 1:
        raise EdgeSpecError(
            f"damaged GGUF: {name} says {arch}.block_count = {count}, but its tensors are those of "
            f"{max(blocks) + 1} layers (blk.0 to blk.{max(blocks)}); llama.cpp would abort on it"
        )


def _arch_key(meta: dict[str, Any], key: str) -> Any:
    return meta.get(f"{meta.get('general.architecture', '')}.{key}")


def _file_type_name(value: int | None) -> str | None:
    if value is None:
        return None
    try:
        return LlamaFileType(value).name.removeprefix("MOSTLY_")
    except ValueError:
        return f"type {value}"


def _vocab_fingerprint(tokens: list[str]) -> str:
    # Over the ids llama.cpp compares (>= 5): equal fingerprints and sizes mean the texts agree.
    h = hashlib.sha256()
    for tok in tokens[FIRST_CHECKED_TOKEN:]:
        h.update(tok.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()[:16]


def _tokenizer_facts(meta: dict[str, Any]) -> dict[str, Any]:
    model = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens") or []
    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    add_eos = meta.get("tokenizer.ggml.add_eos_token")
    return {
        "tokenizer_model": model,
        "vocab_type": vocab_type_of(model),
        "tokenizer_type": vocab_type_name(vocab_type_of(model)),
        "vocab_size": len(tokens),
        "vocab_fingerprint": _vocab_fingerprint(tokens) if tokens else None,
        "bos_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_id": meta.get("tokenizer.ggml.eos_token_id"),
        "add_bos": bool(add_bos) if add_bos is not None else _DEFAULT_ADD_BOS.get(model, False),
        "add_eos": bool(add_eos) if add_eos is not None else _DEFAULT_ADD_EOS.get(model, False),
    }


def _per_layer(value: Any, n_layer: int) -> list[int]:
    if value is None:
        return [0] * n_layer
    if isinstance(value, np.ndarray):
        return [int(v) for v in value]
    return [int(value)] * n_layer


def kv_cache_bytes(meta: dict[str, Any], n_ctx: int = DEFAULT_MEMORY_CONTEXT) -> int:
    """Bytes of an F16 KV cache for `n_ctx` tokens: n_ctx * sum over layers of n_head_kv * (d_k + d_v) * 2.

    Head sizes come from `<arch>.attention.key_length/value_length`, else embedding_length / head_count.
    Sliding-window layers are counted at full context, so this is an upper bound for such models.
    """
    n_layer = int(_arch_key(meta, "block_count") or 0)
    n_embd = int(_arch_key(meta, "embedding_length") or 0)
    n_head = _per_layer(_arch_key(meta, "attention.head_count"), n_layer)
    n_head_kv = _per_layer(_arch_key(meta, "attention.head_count_kv") or _arch_key(meta, "attention.head_count"), n_layer)
    per_token = 0
    for layer in range(n_layer):
        d_head = n_embd // n_head[layer] if n_head[layer] else 0
        d_k = int(_arch_key(meta, "attention.key_length") or d_head)
        d_v = int(_arch_key(meta, "attention.value_length") or d_head)
        per_token += n_head_kv[layer] * (d_k + d_v)
    return n_ctx * per_token * KV_BYTES_PER_VALUE


def inspect_gguf(path: str | os.PathLike) -> dict[str, Any]:
    """Everything `python -m edgespec.models info` shows, read from the header only (no weights loaded).

    Keys: path, file_size, architecture, name, description (e.g. 'llama 135M Q4_1': llama.cpp's model
    description, with the parameter count of the tensors), n_params, n_layer, n_embd, n_head,
    n_head_kv, context_length, file_type (llama_ftype int), file_type_name (e.g. 'Q4_K_M'),
    quantization ({type: {'tensors', 'params', 'bytes'}}), tensor_types ({tensor name: type}),
    weights_bytes, has_chat_template, tokenizer_model, vocab_type (llama_vocab_type int),
    tokenizer_type (its readable name, e.g. 'gpt2 (BPE)'), vocab_size, vocab_fingerprint, bos_id,
    eos_id, add_bos, add_eos, kv_bytes_4096 (F16 KV cache at a 4096-token context) and
    memory_bytes_4096 (weights + that KV cache; compute buffers not included).
    """
    h = read_header(path)
    meta = h.metadata
    quant: dict[str, dict[str, int]] = {}
    for t in h.tensors:
        q = quant.setdefault(t.type.name, {"tensors": 0, "params": 0, "bytes": 0})
        q["tensors"] += 1
        q["params"] += t.n_elements
        q["bytes"] += t.n_bytes
    weights = sum(t.n_bytes for t in h.tensors)
    n_params = sum(t.n_elements for t in h.tensors)
    kv = kv_cache_bytes(meta)
    arch, file_type_name = meta.get("general.architecture"), _file_type_name(meta.get("general.file_type"))
    return {
        "path": str(Path(path).expanduser()),  # as named (a cache entry is a symlink to its blob)
        "file_size": h.file_size,
        "gguf_version": h.version,
        "architecture": arch,
        "name": meta.get("general.name"),
        # Not llama.cpp's llama_model_desc: it guesses size by layer count (30-layer SmolLM2-135M is "llama 256M").
        "description": " ".join(x for x in (arch or "?", parameter_label(n_params), file_type_name) if x),
        "n_params": n_params,
        "n_layer": _arch_key(meta, "block_count"),
        "n_embd": _arch_key(meta, "embedding_length"),
        "n_head": _arch_key(meta, "attention.head_count"),
        "n_head_kv": _arch_key(meta, "attention.head_count_kv"),
        "context_length": _arch_key(meta, "context_length"),
        "file_type": meta.get("general.file_type"),
        "file_type_name": file_type_name,
        "quantization": dict(sorted(quant.items(), key=lambda kv_: -kv_[1]["params"])),
        "tensor_types": {t.name: t.type.name for t in h.tensors},
        "weights_bytes": weights,
        "has_chat_template": bool(meta.get("tokenizer.chat_template")),
        **_tokenizer_facts(meta),
        "kv_bytes_4096": kv,
        "memory_bytes_4096": weights + kv,
    }


def vocabulary(path: str | os.PathLike) -> list[str]:
    """Token texts by id, as stored in tokenizer.ggml.tokens."""
    return list(read_header(path).metadata.get("tokenizer.ggml.tokens") or [])


def _vocab_facts(path: str | os.PathLike, facts: dict[str, Any]) -> VocabFacts:
    return VocabFacts(Path(path).name, facts["vocab_type"], facts["add_bos"], facts["add_eos"], facts["bos_id"],
                      facts["eos_id"], facts["vocab_size"])


def pairing_from_metadata(target_path: str | os.PathLike, draft_path: str | os.PathLike) -> tuple[bool, str]:
    """llama.cpp's draft/target compatibility rule (edgespec.models.pairing), answered from the two headers.

    Returns (ok, one-line reason); a refusal reads exactly as edgespec.models.pairing.check_compatible's.
    """
    t_head, d_head = read_header(target_path), read_header(draft_path)
    t_facts, d_facts = _tokenizer_facts(t_head.metadata), _tokenizer_facts(d_head.metadata)
    t, d = _vocab_facts(target_path, t_facts), _vocab_facts(draft_path, d_facts)
    why = header_difference(t, d)
    if why:
        return False, why
    if t.n_vocab == d.n_vocab and t_facts["vocab_fingerprint"] == d_facts["vocab_fingerprint"]:
        return True, f"draft {d.file} can draft for target {t.file}: same vocabulary ({t.n_vocab} tokens)"
    t_tok = t_head.metadata.get("tokenizer.ggml.tokens") or []
    d_tok = d_head.metadata.get("tokenizer.ggml.tokens") or []
    why = token_difference(t_tok.__getitem__, d_tok.__getitem__, len(t_tok), len(d_tok))
    if why:
        return False, why
    return True, (f"draft {d.file} can draft for target {t.file}: vocabularies agree on ids >= {FIRST_CHECKED_TOKEN} "
                  f"({d.n_vocab} vs {t.n_vocab} tokens)")
