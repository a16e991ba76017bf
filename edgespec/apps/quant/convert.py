"""Requantize a whole GGUF model: `python -m edgespec.apps.quant convert IN.gguf OUT.gguf --to FORMAT`.

Three routes, chosen by the target format:
- f16: every quantized tensor is dequantized (gguf-py) into F16 (F32 for 1-D tensors and for values
  F16 cannot hold); all metadata is copied. This is how an "F16 reference" is made from a Q4_1 file.
- q8_0, q6_k, q5_k_m, q4_k_m: llama.cpp's own quantizer (llama_model_quantize) from an F16/F32
  source; a quantized input is first dequantized to F16 in a temporary file.
- mxfp4 and the MX formats GGUF cannot store: this module writes the GGUF itself with a per-tensor
  choice. Matrices whose rows are a multiple of 32 become real GGML MXFP4 (type 39) for mxfp4, or
  are quantize-dequantized through the MX format into an F16 container (BF16/F32 if F16 would
  round the MX values) for mxfp6-*, mxfp8-*, mxint8: emulation, recorded in `edgespec.quant.*`
  metadata. Token embeddings / output head stay Q8_0 unless `mx_head` (they dominate the size of
  large-vocabulary models such as Gemma-3), 1-D tensors (norms) stay F32, other tensors that do not
  fit stay F16.

The input is opened read-only. Output goes to OUT.tmp-XXXX in the same folder, is fsync'ed and renamed
at the end; any failure deletes the temporary file, so a failed run leaves no partial output.
"""

from __future__ import annotations

import ctypes
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, quants
from tqdm import tqdm

from edgespec.apps.quant import mx
from edgespec.models.inspect import read_header
from edgespec.models.output import atomic_output
from edgespec.runtime.errors import EdgeSpecError
from edgespec.runtime.llama import check_gguf_file, lib

Q = GGMLQuantizationType
LLAMA_FTYPES = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q6_k": "LLAMA_FTYPE_MOSTLY_Q6_K",
                "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M", "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}
MX_TARGETS = ("mxfp4", "mxfp6-e2m3", "mxfp6-e3m2", "mxfp8-e4m3", "mxfp8-e5m2", "mxint8")
TARGETS = ("f16", *LLAMA_FTYPES, *MX_TARGETS)
FLOAT_TYPES = (Q.F32, Q.F16, Q.BF16)
# Tensors that are looked up by row (embeddings) or feed the vocabulary-wide output layer: kept at Q8_0.
HEAD_TENSORS = ("token_embd.weight", "output.weight")
F16_MAX = float(np.finfo(np.float16).max)


@dataclass
class TensorChoice:
    """What happened to one tensor. shape is GGML order (ne0 = row length first)."""

    name: str
    shape: list[int]
    source_type: str
    output_type: str  # GGML type in the file
    bits_per_weight: float  # true storage cost: MX bits for emulated tensors, the GGML type's otherwise
    emulated_format: str | None = None  # MX format whose values an F16/BF16/F32 container holds


@dataclass
class ConversionResult:
    source: str
    output: str
    target: str
    emulated: bool
    file_size: int
    n_params: int
    tensors: list[TensorChoice] = field(default_factory=list)

    @property
    def bits_per_weight(self) -> float:
        """True bits per weight over all tensors (MX element bits + 8/32 for the shared scale)."""
        total = sum(np.prod(t.shape, dtype=np.int64) * t.bits_per_weight for t in self.tensors)
        return float(total / max(self.n_params, 1))

    @property
    def file_bits_per_weight(self) -> float:
        """File size in bits over parameter count (includes metadata and, when emulated, the container)."""
        return self.file_size * 8 / max(self.n_params, 1)

    def type_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.tensors:
            key = t.output_type + (f" ({t.emulated_format} emulated)" if t.emulated_format else "")
            counts[key] = counts.get(key, 0) + 1
        return counts

    def summary(self) -> str:
        lines = [
            f"wrote {self.output}: {self.file_size / 1e6:.1f} MB, {self.n_params / 1e6:.1f}M weights, "
            f"{self.bits_per_weight:.3f} bits/weight true, {self.file_bits_per_weight:.3f} bits/weight in the file",
            "tensors: " + ", ".join(f"{n} x {k}" for k, n in sorted(self.type_counts().items())),
        ]
        if self.emulated:
            lines.append(
                f"note: GGUF has no {self.target} type, so {self.target} is EMULATED: the weights hold "
                f"exactly the {self.target} values but are stored in a wider container; speed and file "
                f"size are those of the container, quality is that of {self.target}"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["bits_per_weight"] = self.bits_per_weight
        d["file_bits_per_weight"] = self.file_bits_per_weight
        return d


def type_bits(t: GGMLQuantizationType) -> float:
    block, size = GGML_QUANT_SIZES[t]
    return size * 8 / block


def readable(t: GGMLQuantizationType) -> bool:
    """Whether gguf-py can turn a tensor of this type into floats."""
    return t in FLOAT_TYPES or t in quants._type_traits


def open_gguf(path: str | os.PathLike) -> GGUFReader:
    """Open a GGUF read-only, with one-line errors for files that are not GGUF, cut short or damaged."""
    p = Path(path).expanduser()
    try:
        check_gguf_file(p)
        # Checks the header and that every tensor's bytes are in the file, which gguf-py does not.
        read_header(p)
    except OSError as exc:
        raise EdgeSpecError(f"cannot read {p}: {exc.strerror or exc}") from None
    try:
        return GGUFReader(p, "r")
    except Exception as exc:  # gguf-py raises ValueError/struct.error/IndexError on damaged files
        detail = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise EdgeSpecError(f"corrupt GGUF file {p}: {detail}") from None


def tensor_float(t) -> np.ndarray:
    """A reader tensor as float32 in numpy order [ne1, ne0] (or [ne0] for 1-D)."""
    out = quants.dequantize(np.asarray(t.data), t.tensor_type)
    return out.reshape([int(n) for n in reversed(t.shape)]).astype(np.float32, copy=False)


def _check_readable(reader: GGUFReader, path: Path) -> None:
    for t in reader.tensors:
        if not readable(t.tensor_type):
            raise EdgeSpecError(
                f"unsupported tensor type {t.tensor_type.name} in {path.name} (tensor {t.name}); "
                "convert it from an F16/F32 or a common quantized GGUF instead"
            )


def _check_paths(src: Path, dst: Path) -> None:
    try:
        same = dst.resolve() == src.resolve() or (dst.exists() and os.path.samefile(dst, src))
        folder_exists, dst_is_dir = dst.parent.is_dir(), dst.is_dir()
    except OSError as exc:  # e.g. a name too long or a folder this user may not look into
        raise EdgeSpecError(f"cannot use the output path {dst}: {exc.strerror or exc}") from None
    if same:
        raise EdgeSpecError(f"output path is the input file ({dst}); choose another output path")
    if not folder_exists:
        raise EdgeSpecError(f"output folder does not exist: {dst.parent}")
    if dst_is_dir:
        raise EdgeSpecError(f"output path is a folder: {dst}")


@contextmanager
def _temp_file(folder: Path, suffix: str) -> Iterator[Path]:
    fd, name = tempfile.mkstemp(prefix=".edgespec-quant-", suffix=suffix, dir=folder)
    os.close(fd)
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def _copy_metadata(reader: GGUFReader, extra: dict[str, tuple[object, GGUFValueType]]) -> GGUFWriter:
    arch_field = reader.get_field("general.architecture")
    arch = arch_field.contents() if arch_field is not None else "llama"
    writer = GGUFWriter(None, arch)
    skip = {"general.architecture", "general.file_type", *extra}
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name in skip or name.startswith("edgespec.quant."):
            continue
        main = f.types[0]
        sub = f.types[-1] if main == GGUFValueType.ARRAY else None
        writer.add_key_value(name, f.contents(), main, sub)
    for key, (value, vtype) in extra.items():
        writer.add_key_value(key, value, vtype)
    return writer


def _write(writer: GGUFWriter, path: Path) -> None:
    writer.write_header_to_file(path)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()


def _container(values: np.ndarray) -> tuple[np.ndarray, GGMLQuantizationType]:
    """The narrowest float container that holds `values` (float32) exactly: F16, else BF16, else F32."""
    f16 = values.astype(np.float16)
    if np.array_equal(f16.astype(np.float32), values):
        return f16, Q.F16
    bf16 = quants.quantize(values, Q.BF16)
    if np.array_equal(quants.dequantize(bf16, Q.BF16).reshape(values.shape), values):
        return bf16, Q.BF16
    return values, Q.F32


def _plan(t, target: str, mx_head: bool) -> tuple[GGMLQuantizationType, str | None]:
    """Output type for one tensor, and the MX format it carries (None when not MX)."""
    ne0 = int(t.shape[0])
    if len(t.shape) < 2:
        return Q.F32, None
    if target == "f16":
        return Q.F16, None
    if ne0 % mx.BLOCK:
        return Q.F16, None
    if t.name in HEAD_TENSORS and not mx_head:
        return Q.Q8_0, None
    return (Q.MXFP4 if target == "mxfp4" else Q.F16), target


def _write_direct(reader: GGUFReader, tmp: Path, target: str, show: bool, mx_head: bool = False) -> list[TensorChoice]:
    """The f16 and MX routes: convert tensor by tensor in numpy and write the GGUF with gguf-py."""
    emulated = target in MX_TARGETS and target != "mxfp4"
    fmt = mx.element_format(target) if target in MX_TARGETS else None
    choices: list[TensorChoice] = []
    arrays: list[tuple[str, np.ndarray, GGMLQuantizationType | None]] = []
    bar = tqdm(reader.tensors, desc=f"{target} ", unit="tensor", disable=not show, leave=False)
    for t in bar:
        bar.set_postfix_str(t.name, refresh=False)
        out_type, mx_name = _plan(t, target, mx_head)
        shape = [int(n) for n in t.shape]
        if out_type == t.tensor_type and mx_name is None:
            data, raw = np.asarray(t.data), t.tensor_type  # same type: copy the bytes, no rounding
        else:
            values = tensor_float(t)
            if out_type == Q.MXFP4:
                data, raw = mx.to_ggml_mxfp4(values), Q.MXFP4
            elif mx_name is not None:
                values = mx.quantize_dequantize(values, fmt)
                data, out_type = _container(values)
                raw = None if out_type != Q.BF16 else Q.BF16
            elif out_type == Q.Q8_0:
                data, raw = quants.quantize(values, Q.Q8_0), Q.Q8_0
            elif out_type == Q.F16 and np.abs(values).max(initial=0) <= F16_MAX:
                data, raw = values.astype(np.float16), None
            else:
                data, raw, out_type = values, None, Q.F32
        bits = fmt.bits_per_weight if mx_name is not None else type_bits(out_type)
        choices.append(TensorChoice(t.name, shape, t.tensor_type.name, out_type.name, bits,
                                    mx_name if (mx_name and emulated) else None))
        arrays.append((t.name, data, raw))
    extra: dict[str, tuple[object, GGUFValueType]] = {}
    if target == "f16":
        extra["general.file_type"] = (1, GGUFValueType.UINT32)  # LLAMA_FTYPE_MOSTLY_F16
    else:
        n_mx = sum(1 for c in choices if c.output_type == "MXFP4" or c.emulated_format)
        extra.update({
            "edgespec.quant.format": (target, GGUFValueType.STRING),
            "edgespec.quant.emulated": (emulated, GGUFValueType.BOOL),
            "edgespec.quant.mx_block_size": (mx.BLOCK, GGUFValueType.UINT32),
            "edgespec.quant.mx_tensor_count": (n_mx, GGUFValueType.UINT32),
            "edgespec.quant.mx_bits_per_weight": (float(fmt.bits_per_weight), GGUFValueType.FLOAT32),
        })
        if emulated:
            extra["edgespec.quant.note"] = (
                f"{target} emulated: MX-quantized values stored in F16/BF16 containers", GGUFValueType.STRING)
    writer = _copy_metadata(reader, extra)
    for name, data, raw in arrays:
        writer.add_tensor(name, data, raw_dtype=raw)
    _write(writer, tmp)
    return choices


_PROGRESS_LINE = re.compile(r"\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")


def _llama_quantize(src: Path, dst: Path, target: str, show: bool) -> None:
    """Run llama.cpp's quantizer, turning its per-tensor log lines into a progress bar."""
    llama = lib()
    params = llama.llama_model_quantize_default_params()
    params.ftype = getattr(llama, LLAMA_FTYPES[target])
    params.nthread = max(1, len(os.sched_getaffinity(0)))
    bar = tqdm(desc=f"{target} ", unit="tensor", disable=not show, leave=False)
    tail: list[str] = []

    @llama.llama_log_callback
    def _log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        line = text.decode("utf-8", "replace")
        tail.append(line)
        del tail[:-20]
        m = _PROGRESS_LINE.search(line)
        if m:
            bar.total = int(m.group(2))
            bar.set_postfix_str(m.group(3), refresh=False)
            bar.update(int(m.group(1)) - bar.n)

    llama.llama_log_set(_log, ctypes.c_void_p(0))
    try:
        rc = llama.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    finally:
        # Hand logging back to the runtime's quiet handler.
        llama.llama_log_set(llama._edgespec_log_cb, ctypes.c_void_p(0))
        bar.close()
    if rc != 0:
        errors = [ln.strip() for ln in tail if "error" in ln.lower() or "failed" in ln.lower()]
        detail = (errors or [ln.strip() for ln in tail if ln.strip()] or ["no details"])[-1]
        raise EdgeSpecError(f"llama.cpp could not quantize {src.name} to {target}: {detail}")


def _describe(path: Path, target: str) -> list[TensorChoice]:
    reader = GGUFReader(path, "r")
    return [TensorChoice(t.name, [int(n) for n in t.shape], "", t.tensor_type.name, type_bits(t.tensor_type))
            for t in reader.tensors]


def convert(src: str | os.PathLike, dst: str | os.PathLike, target: str, *, mx_head: bool = False,
            progress: bool = True, log: Callable[[str], None] | None = None) -> ConversionResult:
    """Write `dst`, a requantized copy of the GGUF model `src` in format `target` (see TARGETS).

    mx_head: MX targets also cover token_embd/output (kept at Q8_0 by default).

    Raises EdgeSpecError with a one-line message on bad input or a failed write; `src` is only read.
    """
    if target not in TARGETS:
        raise EdgeSpecError(f"unknown format {target!r}; choose one of {', '.join(TARGETS)}")
    if mx_head and target not in MX_TARGETS:
        raise EdgeSpecError(f"--mx-embeddings applies to MX formats only, not {target}")
    src_p = Path(src).expanduser()
    dst_p = Path(dst).expanduser()
    reader = open_gguf(src_p)
    _check_paths(src_p, dst_p)
    _check_readable(reader, src_p)
    say = log or (lambda s: None)
    source_types = {t.name: t.tensor_type.name for t in reader.tensors}

    with atomic_output(dst_p) as tmp:
        if target in LLAMA_FTYPES:
            if all(t.tensor_type in FLOAT_TYPES for t in reader.tensors):
                _llama_quantize(src_p, tmp, target, progress)
            else:
                say(f"{src_p.name} is already quantized: dequantizing to F16 first (temporary file)")
                with _temp_file(dst_p.parent, ".f16.gguf") as f16:
                    _write_direct(reader, f16, "f16", progress)
                    _llama_quantize(f16, tmp, target, progress)
            choices = _describe(tmp, target)
        else:
            choices = _write_direct(reader, tmp, target, progress, mx_head)
    for c in choices:
        c.source_type = source_types.get(c.name, "")
    n_params = int(sum(np.prod(c.shape, dtype=np.int64) for c in choices))
    return ConversionResult(str(src_p), str(dst_p), target, target in MX_TARGETS and target != "mxfp4",
                            dst_p.stat().st_size, n_params, choices)
