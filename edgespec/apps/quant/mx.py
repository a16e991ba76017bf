"""OCP Microscaling (MX) v1.0 codecs over numpy: MXFP8 (E4M3, E5M2), MXFP6 (E2M3, E3M2), MXFP4 (E2M1)
and MXINT8.

A block is 32 consecutive values along the last axis sharing one E8M0 scale X = 2^shared_exp:
    shared_exp = floor(log2(max_i |V_i|)) - emax_elem        (spec section 6.3)
    P_i        = round_to_element(V_i / X)                    (round to nearest even, saturate at max normal)
    V_i'       = X * P_i
Element encodings come from ml_dtypes (float8_e4m3fn, float8_e5m2, float6_e2m3fn, float6_e3m2fn,
float4_e2m1fn, float8_e8m0fnu); MXINT8 elements are int8 two's complement with an implicit 2^-6.

Special values (choices where the spec leaves room, documented here and in docs/quant_report.md):
- a block whose max |V| is 0 gets the smallest scale, E8M0 0x00 (2^-127), and all-zero elements;
- a block holding any NaN or +-Inf gets the NaN scale, E8M0 0xFF, and decodes to 32 NaNs (the spec
  allows a NaN scale; a single NaN/Inf element cannot be represented in FP6/FP4 anyway);
- shared exponents below -127 clamp to -127 (the smallest E8M0 scale); values then underflow to 0;
- inputs are taken as float32 (float64 inputs are first rounded to float32).
- MXINT8 saturates symmetrically at +-127 * 2^-6 (its max normal); the code -128 (-2.0) decodes
  but is never produced.

The MXFP4 block layout of GGML (type 39: one E8M0 byte, then 16 bytes holding element j in the low
nibble of byte j and element j+16 in the high nibble) is provided by `to_ggml_mxfp4`/`from_ggml_mxfp4`.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from edgespec.runtime.errors import EdgeSpecError

BLOCK = 32
E8M0_BIAS = 127
E8M0_NAN = 0xFF
E8M0_MIN_EXP = -127
INT8_FRACTION_BITS = 6  # MXINT8 element value = code * 2^-6


@dataclass(frozen=True)
class ElementFormat:
    """One MX element type.

    bits: storage bits per element; emax: exponent of the largest normal (the spec's emax_elem);
    max_normal: largest finite magnitude; dtype: the ml_dtypes type (None for MXINT8's int8).
    """

    name: str
    bits: int
    emax: int
    max_normal: float
    dtype: np.dtype | None

    @property
    def bits_per_weight(self) -> float:
        """Element bits plus the 8-bit shared scale spread over its block of 32."""
        return self.bits + 8 / BLOCK


FORMATS: dict[str, ElementFormat] = {
    "mxfp8-e4m3": ElementFormat("mxfp8-e4m3", 8, 8, 448.0, np.dtype(ml_dtypes.float8_e4m3fn)),
    "mxfp8-e5m2": ElementFormat("mxfp8-e5m2", 8, 15, 57344.0, np.dtype(ml_dtypes.float8_e5m2)),
    "mxfp6-e2m3": ElementFormat("mxfp6-e2m3", 6, 2, 7.5, np.dtype(ml_dtypes.float6_e2m3fn)),
    "mxfp6-e3m2": ElementFormat("mxfp6-e3m2", 6, 4, 28.0, np.dtype(ml_dtypes.float6_e3m2fn)),
    "mxfp4": ElementFormat("mxfp4", 4, 2, 6.0, np.dtype(ml_dtypes.float4_e2m1fn)),
    "mxint8": ElementFormat("mxint8", 8, 0, 127 / 64, None),
}


def element_format(name: str) -> ElementFormat:
    """Look up an MX format by name (mxfp4, mxfp6-e2m3, mxfp6-e3m2, mxfp8-e4m3, mxfp8-e5m2, mxint8)."""
    try:
        return FORMATS[name]
    except KeyError:
        raise EdgeSpecError(f"unknown MX format {name!r}; choose one of {', '.join(FORMATS)}") from None


@dataclass
class MXArray:
    """An MX-encoded array.

    scales: uint8 E8M0 codes [..., n_blocks]; elements: [..., n_blocks, 32] in the element dtype
    (int8 codes for MXINT8); length: size of the last axis before padding to a multiple of 32.
    """

    fmt: ElementFormat
    scales: np.ndarray
    elements: np.ndarray
    length: int

    def element_codes(self) -> np.ndarray:
        """Raw element bit patterns, uint8 [..., n_blocks, 32] (FP6/FP4 use the low 6/4 bits)."""
        return self.elements.view(np.uint8)

    @property
    def nbits(self) -> int:
        """Storage of this array in bits: elements plus one 8-bit scale per block."""
        return self.elements.size * self.fmt.bits + self.scales.size * 8


def _blocks(x: np.ndarray) -> tuple[np.ndarray, int]:
    """float32 view [..., n_blocks, 32] of x, zero-padded on the last axis; and the unpadded length."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0:
        x = x.reshape(1)
    n = x.shape[-1]
    pad = (-n) % BLOCK
    if pad:
        x = np.concatenate([x, np.zeros((*x.shape[:-1], pad), dtype=np.float32)], axis=-1)
    return x.reshape(*x.shape[:-1], -1, BLOCK), n


def shared_exponents(blocks: np.ndarray, fmt: ElementFormat) -> tuple[np.ndarray, np.ndarray]:
    """Per-block shared exponent floor(log2(amax)) - emax_elem, clamped to E8M0's range.

    blocks: float32 [..., n_blocks, 32]. Returns (exponents int32 [..., n_blocks], special bool mask of
    blocks holding NaN/Inf). floor(log2) comes from frexp, which is exact (a float32 log2 can round
    a value just below a power of two up to it).
    """
    finite = np.isfinite(blocks).all(axis=-1)
    amax = np.where(finite, np.abs(np.where(np.isfinite(blocks), blocks, 0)).max(axis=-1), 0)
    _, e = np.frexp(amax)  # amax = m * 2^e with m in [0.5, 1)
    exp = e.astype(np.int32) - 1 - fmt.emax
    exp = np.where(amax > 0, exp, E8M0_MIN_EXP)
    return np.clip(exp, E8M0_MIN_EXP, E8M0_BIAS).astype(np.int32), ~finite


def quantize(x: np.ndarray, fmt: ElementFormat | str) -> MXArray:
    """Encode x (any shape; blocks run along the last axis) in an MX format."""
    if isinstance(fmt, str):
        fmt = element_format(fmt)
    blocks, n = _blocks(x)
    exp, special = shared_exponents(blocks, fmt)
    # V / X by exponent arithmetic: exact wherever the quotient is a normal float32.
    scaled = np.ldexp(np.where(special[..., None], 0, blocks), -exp[..., None]).astype(np.float32)
    # ml_dtypes turns out-of-range values into NaN/Inf for FP8; the spec saturates, so clamp first.
    clipped = np.clip(scaled, -fmt.max_normal, fmt.max_normal)
    if fmt.dtype is None:
        elements = np.rint(np.ldexp(clipped, INT8_FRACTION_BITS)).astype(np.int8)  # ties to even
    else:
        elements = clipped.astype(fmt.dtype)  # ml_dtypes casts round to nearest, ties to even
    scales = np.where(special, E8M0_NAN, exp + E8M0_BIAS).astype(np.uint8)
    return MXArray(fmt, scales, elements, n)


def dequantize(mx: MXArray) -> np.ndarray:
    """Decode to float32 with the original shape (padding dropped). NaN scales give NaN blocks."""
    if mx.fmt.dtype is None:
        elems = np.ldexp(mx.elements.astype(np.float32), -INT8_FRACTION_BITS)
    else:
        elems = mx.elements.astype(np.float32)
    scale = mx.scales.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)  # 2^(code-127), 0xFF = NaN
    out = (elems * scale[..., None]).astype(np.float32)
    out = out.reshape(*out.shape[:-2], -1)
    return out[..., : mx.length]


def quantize_dequantize(x: np.ndarray, fmt: ElementFormat | str) -> np.ndarray:
    """Round-trip x through an MX format (what an MX weight holds), float32 of x's shape."""
    return dequantize(quantize(x, fmt)).reshape(np.shape(x))


def to_ggml_mxfp4(x: np.ndarray) -> np.ndarray:
    """Encode rows of x as GGML MXFP4 blocks (type 39): uint8 [..., n/32 * 17]. Needs n % 32 == 0."""
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1] % BLOCK:
        raise ValueError(f"MXFP4 rows need a multiple of {BLOCK} values, got {x.shape[-1]}")
    mx = quantize(x, FORMATS["mxfp4"])
    codes = mx.element_codes() & 0x0F
    packed = codes[..., : BLOCK // 2] | (codes[..., BLOCK // 2 :] << 4)
    raw = np.concatenate([mx.scales[..., None], packed], axis=-1)
    return raw.reshape(*x.shape[:-1], -1)


def from_ggml_mxfp4(raw: np.ndarray) -> MXArray:
    """Parse GGML MXFP4 bytes uint8 [..., n_blocks * 17] into an MXArray (rows of n_blocks * 32)."""
    raw = np.asarray(raw, dtype=np.uint8)
    blocks = raw.reshape(*raw.shape[:-1], -1, 1 + BLOCK // 2)
    scales = blocks[..., 0].copy()
    packed = blocks[..., 1:]
    codes = np.concatenate([packed & 0x0F, packed >> 4], axis=-1)
    elements = codes.view(ml_dtypes.float4_e2m1fn)
    return MXArray(FORMATS["mxfp4"], scales, elements, elements.shape[-2] * BLOCK)
