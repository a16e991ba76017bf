"""Random-weight twins of GGUF models: `python -m edgespec.models.synthetic SOURCE.gguf OUT.gguf [--seed N]`.

A twin has SOURCE's architecture, every metadata key/value (tokenizer and chat template included,
so llama.cpp loads it and tokenizes the same text into the same ids), and the same tensor names,
shapes and GGML types in the same order, but random contents. llama.cpp's pass time T(K) depends
on the shapes and the weight types (which kernels run), not on the values, so a twin measures the
speed of a model whose weights are not here; its text is noise.

Random contents are valid for their type: a quantized tensor is random bytes with every fp16 scale
field of every block (d, dmin, m; byte offsets from ggml-common.h's block structs) set to +-2^-10
(MXFP4's E8M0 exponent to 2^-9), so that no block decodes to inf or NaN; F32/F16/BF16/F64 tensors
are normals with standard deviation 0.02, around 1.0 for norm weights and rope frequency factors.
A type not listed in HALF_FIELDS (nor float, nor MXFP4, nor IQ1_M) is refused in one line.

Tensors are generated and written one at a time, straight from numpy (no Python loop per block):
memory stays around the largest tensor. Output goes to OUT.tmp-XXXX beside OUT and is renamed at the
end; a failed run leaves nothing that passes for a model.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

from edgespec.models.inspect import read_header
from edgespec.models.output import atomic_output
from edgespec.runtime.errors import EdgeSpecError, run_command
from edgespec.runtime.llama import check_gguf_file

Q = GGMLQuantizationType

# Byte offsets of the fp16 fields (ggml_half) in one block of each type, from ggml-common.h.
HALF_FIELDS: dict[GGMLQuantizationType, tuple[int, ...]] = {
    Q.Q4_0: (0,),  # d, qs[16]
    Q.Q4_1: (0, 2),  # d, m, qs[16]
    Q.Q5_0: (0,),  # d, qh[4], qs[16]
    Q.Q5_1: (0, 2),  # d, m, qh[4], qs[16]
    Q.Q8_0: (0,),  # d, qs[32]
    Q.Q2_K: (80, 82),  # scales[16], qs[64], d, dmin
    Q.Q3_K: (108,),  # hmask[32], qs[64], scales[12], d
    Q.Q4_K: (0, 2),  # d, dmin, scales[12], qs[128]
    Q.Q5_K: (0, 2),  # d, dmin, scales[12], qh[32], qs[128]
    Q.Q6_K: (208,),  # ql[128], qh[64], scales[16], d
    Q.IQ2_XXS: (0,),  # d, qs[32] (uint16)
    Q.IQ2_XS: (0,),  # d, qs[32] (uint16), scales[8]
    Q.IQ2_S: (0,),  # d, qs[64], qh[8], scales[8]
    Q.IQ3_XXS: (0,),  # d, qs[96]
    Q.IQ3_S: (0,),  # d, qs[64], qh[8], signs[32], scales[4]
    Q.IQ1_S: (0,),  # d, qs[32], qh[8] (uint16)
    Q.IQ4_NL: (0,),  # d, qs[16]
    Q.IQ4_XS: (0,),  # d, scales_h (uint16), scales_l[4], qs[128]
    Q.TQ1_0: (52,),  # qs[48], qh[4], d
    Q.TQ2_0: (64,),  # qs[64], d
}
FLOAT_TYPES = {Q.F32: np.float32, Q.F16: np.float16, Q.BF16: None, Q.F64: np.float64}
IQ1_M_SCALES = 48  # qs[32], qh[16], scales[8]: the fp16 scale is the top 4 bits of the 4 uint16 scales
MXFP4_EXPONENT = 119  # block_mxfp4.e (E8M0): ggml scales the doubled E2M1 values by 2^(e-128), so |x| <= 12 * 2^-9
SUPPORTED = (*FLOAT_TYPES, *HALF_FIELDS, Q.IQ1_M, Q.MXFP4)

SCALE_HALF_HIGH = 0x14  # high byte of fp16 2^-10 (0x1400); the low byte is 0
WEIGHT_STD = 0.02
NEAR_ONE = ("norm", "rope_freqs")  # tensors that multiply (norm weights) or divide (rope factors): 1 + noise

Progress = Callable[[int, int], None]


def _fix_scales(blocks: np.ndarray, qtype: GGMLQuantizationType) -> None:
    """Make random blocks [n_blocks, type_size] (uint8) decode finite: set every scale field in place.

    An fp16 field becomes +-2^-10, its sign the random top bit already in its high byte.
    """
    if qtype == Q.MXFP4:
        blocks[:, 0] = MXFP4_EXPONENT
        return
    if qtype == Q.IQ1_M:
        # scale.u16 = (sc[0] >> 12) | ((sc[1] >> 8) & 0xf0) | ((sc[2] >> 4) & 0xf00) | (sc[3] & 0xf000):
        # the top nibble of each uint16's high byte holds one nibble of the fp16 bits.
        sign = blocks[:, IQ1_M_SCALES + 7] & 0x80
        half_high = (SCALE_HALF_HIGH | sign).astype(np.uint8)
        nibbles = (0, 0, half_high & 0x0F, half_high >> 4)  # fp16 bits 0-3, 4-7 (low byte 0), 8-11, 12-15
        for k, nibble in enumerate(nibbles):
            col = IQ1_M_SCALES + 2 * k + 1
            blocks[:, col] = (blocks[:, col] & 0x0F) | (np.asarray(nibble, dtype=np.uint8) << 4)
        return
    for off in HALF_FIELDS[qtype]:
        blocks[:, off] = 0
        blocks[:, off + 1] = SCALE_HALF_HIGH | (blocks[:, off + 1] & 0x80)


def _float_values(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    values = rng.standard_normal(n, dtype=np.float32)
    values *= WEIGHT_STD
    if any(word in name for word in NEAR_ONE):
        values += 1.0
    return values


def check_supported(name: str, qtype: GGMLQuantizationType) -> None:
    if qtype not in SUPPORTED:
        raise EdgeSpecError(f"tensor {name} has GGML type {qtype.name}, whose block layout edgespec.models.synthetic "
                            f"does not know (supported: {', '.join(t.name for t in SUPPORTED)})")


def random_tensor(name: str, qtype: GGMLQuantizationType, n_elements: int, rng: np.random.Generator) -> np.ndarray:
    """Random contents of one tensor, valid for its type: its raw bytes (uint8, 1-D) as GGUF stores them.

    Raises EdgeSpecError for a type this module does not know the block layout of.
    """
    check_supported(name, qtype)
    block, type_size = GGML_QUANT_SIZES[qtype]
    if n_elements % block:
        raise EdgeSpecError(f"tensor {name}: {n_elements} elements are not whole {qtype.name} blocks of {block}")
    if qtype in FLOAT_TYPES:
        values = _float_values(name, n_elements, rng)
        if qtype == Q.BF16:  # the top half of each float32, rounded to nearest even (values are finite)
            bits = values.view(np.uint32)
            bits += 0x7FFF + ((bits >> 16) & 1)
            return (bits >> 16).astype(np.uint16).view(np.uint8)
        return values.astype(FLOAT_TYPES[qtype], copy=False).view(np.uint8)
    n_bytes = n_elements // block * type_size
    raw = rng.bit_generator.random_raw(-(-n_bytes // 8)).view(np.uint8)[:n_bytes]
    _fix_scales(raw.reshape(-1, type_size), qtype)
    return raw


def _metadata_value(key: str, field) -> tuple[object, GGUFValueType, GGUFValueType | None]:
    """(value, type, element type) of a reader field as GGUFWriter.add_key_value takes them.

    Strings are passed as their stored bytes, so text that is not valid UTF-8 is copied unchanged.
    """
    vtype = field.types[0]
    if vtype == GGUFValueType.STRING:
        return bytes(field.parts[-1]), vtype, None
    if vtype != GGUFValueType.ARRAY:
        return field.parts[-1].tolist()[0], vtype, None
    if len(field.types) != 2:  # [ARRAY] alone: empty; more: an array of arrays (gguf-py flattens those)
        what = "an empty array" if len(field.types) == 1 else "an array of arrays"
        raise EdgeSpecError(f"metadata key {key} is {what}, which gguf's writer cannot copy")
    sub = field.types[1]
    if sub == GGUFValueType.STRING:
        return [bytes(field.parts[i]) for i in field.data], vtype, sub
    return field.contents(), vtype, sub


def _check_source(path: Path) -> None:
    try:
        check_gguf_file(path)
        read_header(path)  # one-line errors for a cut-short file, which gguf-py would not notice
    except OSError as exc:
        raise EdgeSpecError(f"cannot read {path}: {exc.strerror or exc}") from None


def _open_source(path: Path) -> GGUFReader:
    """gguf-py's reader (10 s for a 262k-token vocabulary), for a file _check_source has passed."""
    try:
        reader = GGUFReader(path, "r")
    except Exception as exc:  # gguf-py raises ValueError/struct.error/IndexError on damaged files
        detail = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise EdgeSpecError(f"corrupt GGUF file {path}: {detail}") from None
    split = reader.get_field("split.count")
    if split is not None and int(split.parts[-1][0]) > 1:
        raise EdgeSpecError(f"{path.name} is one shard of a split model; merge it first (llama-gguf-split --merge)")
    for t in reader.tensors:  # refuse before writing anything
        check_supported(t.name, t.tensor_type)
    return reader


def _check_output(source: Path, out: Path, force: bool) -> None:
    try:
        folder_exists, exists, is_dir = out.parent.is_dir(), out.exists(), out.is_dir()
        same = exists and os.path.samefile(out, source)
    except OSError as exc:
        raise EdgeSpecError(f"cannot use the output path {out}: {exc.strerror or exc}") from None
    if not folder_exists:
        raise EdgeSpecError(f"output folder does not exist: {out.parent}")
    if is_dir:
        raise EdgeSpecError(f"output path is a folder: {out}")
    if same:
        raise EdgeSpecError(f"output path is the source file ({out}); choose another output path")
    if exists and not force:
        raise EdgeSpecError(f"output file exists: {out} (--force replaces it)")


def _writer_like(reader: GGUFReader) -> tuple[GGUFWriter, list[tuple[str, GGMLQuantizationType, int, int]]]:
    """A GGUFWriter holding the reader's metadata and tensor table (no file yet), and the tensors in
    file order as (name, type, elements, bytes)."""
    arch = reader.get_field("general.architecture")
    if arch is None:
        raise EdgeSpecError("the source has no general.architecture")
    writer = GGUFWriter(None, bytes(arch.parts[-1]).decode("utf-8"))  # the writer adds general.architecture
    writer.data_alignment = reader.alignment
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":  # the reader's header pseudo-keys
            continue
        writer.add_key_value(key, *_metadata_value(key, field))
    tensors = []
    for t in reader.tensors:
        block, type_size = GGML_QUANT_SIZES[t.tensor_type]
        # numpy order (ne reversed) of the raw bytes; the writer turns it back into the element shape
        byte_shape = [int(n) for n in reversed(t.shape)]
        byte_shape[-1] = byte_shape[-1] // block * type_size
        writer.add_tensor_info(t.name, byte_shape, np.dtype(np.uint8), int(t.n_bytes), raw_dtype=t.tensor_type)
        tensors.append((t.name, t.tensor_type, int(t.n_elements), int(t.n_bytes)))
    return writer, tensors


def write_random_like(source: Path, out: Path, *, seed: int = 0, progress: Progress | None = None,
                      force: bool = False) -> Path:
    """Write OUT: SOURCE's metadata and tensor table with random, type-valid tensor contents.

    `seed` fixes the contents (each tensor draws from its own generator, seeded by (seed, index)).
    `progress(done_bytes, total_bytes)` is called after each tensor. An existing OUT is an error
    unless `force`. Returns OUT. Every failure is an EdgeSpecError with a one-line message.
    """
    source, out = Path(source).expanduser(), Path(out).expanduser()
    _check_source(source)
    _check_output(source, out, force)
    # gguf-py's reader holds a numpy view per vocabulary entry (~0.5 GB at 150k tokens and merges):
    # it is dropped once the writer has the metadata, before the tensors are generated.
    writer, tensors = _writer_like(_open_source(source))
    total = sum(n_bytes for _, _, _, n_bytes in tensors)
    done = 0
    with atomic_output(out) as tmp:
        try:
            writer.write_header_to_file(tmp)
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for index, (name, qtype, n_elements, n_bytes) in enumerate(tensors):
                rng = np.random.default_rng([seed, index])
                writer.write_tensor_data(random_tensor(name, qtype, n_elements, rng))
                done += n_bytes
                if progress is not None:
                    progress(done, total)
        finally:
            writer.close()
    return out


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one line, not usage plus error."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m edgespec.models.synthetic",
                 description="Write a random-weight twin of a GGUF model (same metadata, tensor shapes and types) "
                             "to measure its llama.cpp speed without its weights.")
    ap.add_argument("source", help="the model to copy the shapes of (.gguf)")
    ap.add_argument("out", help="output .gguf (written atomically)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--force", action="store_true", help="replace OUT if it exists")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwind, so the temporary output is deleted


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)

    def go() -> int:
        start = time.perf_counter()
        bars = []  # the bar starts with the first tensor, after the source's header has been read

        def progress(done: int, total: int) -> None:
            if not bars:
                from tqdm import tqdm

                bars.append(tqdm(desc="writing", total=total, unit="B", unit_scale=True, file=sys.stderr))
            bars[0].update(done - bars[0].n)

        try:
            out = write_random_like(Path(args.source), Path(args.out), seed=args.seed, force=args.force,
                                    progress=None if args.no_progress else progress)
        finally:
            for bar in bars:
                bar.close()
        print(f"wrote {out} ({out.stat().st_size / 1e6:.0f} MB, random weights, seed {args.seed}) "
              f"in {time.perf_counter() - start:.1f} s")
        return 0

    return run_command(go)


if __name__ == "__main__":
    raise SystemExit(main())
