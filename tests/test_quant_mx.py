"""MX codecs against hand-worked examples from the OCP MX v1.0 tables, an independent brute-force
oracle (nearest representable value, ties to the even code), and gguf-py's MXFP4 (GGML type 39)."""

from __future__ import annotations

import gguf
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgespec.apps.quant import mx
from edgespec.runtime.errors import EdgeSpecError

MXFP4 = gguf.GGMLQuantizationType.MXFP4


def block(*values: float) -> np.ndarray:
    """One block of 32 float32 values, zero-filled after `values`."""
    x = np.zeros(32, dtype=np.float32)
    x[: len(values)] = values
    return x


def encode(values: np.ndarray, fmt: str) -> tuple[int, np.ndarray]:
    q = mx.quantize(values, fmt)
    return int(q.scales.reshape(-1)[0]), q.element_codes().reshape(-1)


# ------------------------------------------------------------------ hand-worked examples (spec tables)
def test_e2m1_table_values_encode_to_their_codes() -> None:
    # FP4 E2M1 (spec table): 0, 0.5 (subnormal), 1, 1.5, 2, 3, 4, 6 -> codes 0..7, sign is bit 3.
    pos = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    scale, codes = encode(block(*pos, *[-v for v in pos[1:]]), "mxfp4")
    assert scale == 127  # amax 6: floor(log2 6) - emax(2) = 0 -> X = 2^0
    assert codes[:15].tolist() == list(range(8)) + list(range(9, 16))


def test_shared_exponent_and_ties_to_even() -> None:
    # amax 100: floor(log2 100) = 6, minus emax 2 -> X = 16, E8M0 code 127 + 4.
    scale, codes = encode(block(100, 20, 28, -40), "mxfp4")
    assert scale == 131
    # 100/16 = 6.25 -> 6 (0b0111); 20/16 = 1.25 tie 1.0|1.5 -> 1.0 (even, 0b0010);
    # 28/16 = 1.75 tie 1.5|2 -> 2 (0b0100); -40/16 = -2.5 tie -2|-3 -> -2 (0b1100).
    assert codes[:4].tolist() == [0b0111, 0b0010, 0b0100, 0b1100]
    _, codes = encode(block(6, 2.5, 3.5, 5, 0.25, 0.75), "mxfp4")
    assert codes[1:6].tolist() == [0b0100, 0b0110, 0b0110, 0b0000, 0b0010]  # 2, 4, 4, 0, 1


def test_elements_saturate_at_max_normal() -> None:
    # amax 7.9 has floor(log2) = 2 = emax, so X = 1 and 7.9 is above E2M1's max normal 6.
    scale, codes = encode(block(7.9, -7.0), "mxfp4")
    assert scale == 127 and codes[:2].tolist() == [0b0111, 0b1111]
    # FP8 E4M3: 464..511 saturate to 448 (0x7E), never to NaN (0x7F), which a bare cast gives.
    assert np.isnan(np.float32(500).astype(ml_dtypes.float8_e4m3fn).astype(np.float32))
    scale, codes = encode(block(500, 448, 2.0**-9, 2.0**-10), "mxfp8-e4m3")
    assert scale == 127 and codes[:4].tolist() == [0x7E, 0x7E, 0x01, 0x00]  # min subnormal; tie -> 0
    # FP8 E5M2: max normal 57344 = 0x7B; 60000 saturates there instead of going to Inf (0x7C).
    scale, codes = encode(block(60000, 57344, -57344), "mxfp8-e5m2")
    assert scale == 127 and codes[:3].tolist() == [0x7B, 0x7B, 0xFB]
    # FP6 E2M3: max 7.5 = 0b0_11_111, min subnormal 0.125 = 0b0_00_001.
    scale, codes = encode(block(7.9, 7.5, 0.125, -0.125), "mxfp6-e2m3")
    assert scale == 127 and codes[:4].tolist() == [0x1F, 0x1F, 0x01, 0x21]
    # FP6 E3M2: emax 4, max 28 = 0b0_111_11, min subnormal 0.0625 = 0b0_000_01.
    scale, codes = encode(block(31, 28, 0.0625), "mxfp6-e3m2")
    assert scale == 127 and codes[:3].tolist() == [0x1F, 0x1F, 0x01]


def test_mxint8_fixed_point() -> None:
    # MXINT8: emax 0, element = int8 * 2^-6; saturates at max normal +-1.984375 (code +-127).
    scale, codes = encode(block(1.0, 1.984375, -1.999, 1 / 128, 3 / 128, -0.5), "mxint8")
    assert scale == 127
    assert codes[:6].view(np.int8).tolist() == [64, 127, -127, 0, 2, -32]  # 0.5 and 1.5 LSB ties -> even
    q = mx.quantize(block(1.0, 1.984375, -1.999), "mxint8")
    assert mx.dequantize(q)[:3].tolist() == [1.0, 1.984375, -1.984375]
    q.elements[0, 0] = -128  # the spec's -2.0 code decodes even though quantize never writes it
    assert mx.dequantize(q)[0] == -2.0


def test_zero_tiny_nan_and_inf_blocks() -> None:
    x = np.concatenate([block(), block(2.0**-140), block(1.0, np.nan), block(np.inf, 1.0), block(3.0)])
    q = mx.quantize(x, "mxfp4")
    # zero block: smallest scale; 2^-140 block: exponent clamps to -127 and the value underflows to 0;
    # NaN or Inf anywhere: the NaN scale 0xFF, and the whole block decodes to NaN; others unaffected.
    assert q.scales.tolist() == [0, 0, 0xFF, 0xFF, 126]  # 3.0: floor(log2 3) - 2 = -1
    y = mx.dequantize(q)
    assert (y[:64] == 0).all()
    assert np.isnan(y[64:128]).all()
    assert y[128] == 3.0 and (y[129:] == 0).all()


def test_nan_element_codes_decode_to_nan() -> None:
    q = mx.quantize(block(1.0, 1.0), "mxfp8-e4m3")
    q.elements.view(np.uint8)[..., 1] = 0x7F  # E4M3 NaN pattern S.1111.111
    assert np.isnan(mx.dequantize(q)[1]) and mx.dequantize(q)[0] == 1.0


def test_shape_and_padding() -> None:
    x = np.random.default_rng(1).standard_normal((3, 5, 70)).astype(np.float32)
    y = mx.quantize_dequantize(x, "mxfp6-e2m3")
    assert y.shape == x.shape and y.dtype == np.float32
    # The padded tail block only holds the last 6 values: its scale follows their max alone.
    q = mx.quantize(x, "mxfp6-e2m3")
    assert q.scales.shape == (3, 5, 3)
    tail = x[0, 0, 64:]
    assert q.scales[0, 0, 2] == int(np.floor(np.log2(np.abs(tail).max()))) - 2 + 127


def test_unknown_format() -> None:
    with pytest.raises(EdgeSpecError, match="unknown MX format 'mxfp5'"):
        mx.quantize(np.zeros(32), "mxfp5")


# ------------------------------------------------------------------ independent oracle and round trips
def _oracle(values: np.ndarray, fmt: mx.ElementFormat) -> np.ndarray:
    """Nearest representable element value (saturating), ties to the even code, by brute force."""
    if fmt.dtype is None:
        codes = np.arange(-128, 128)
        grid = codes / 64.0
    else:
        codes = np.arange(2 ** fmt.bits, dtype=np.uint8)
        grid = codes.view(fmt.dtype).astype(np.float64)
        ok = np.isfinite(grid)
        codes, grid = codes[ok], grid[ok]
    v = np.clip(values.astype(np.float64), -fmt.max_normal, fmt.max_normal)[:, None]
    err = np.abs(grid[None, :] - v)
    best = err.min(axis=1, keepdims=True)
    cand = np.isclose(err, best, rtol=0, atol=0)
    # Among equally near codes prefer the one with an even last bit (sign of zero: keep the input's).
    even = (codes.astype(np.int64) & 1) == 0
    score = cand * (2 + even) + (np.signbit(grid)[None, :] == np.signbit(v)) * 0.5
    return grid[np.argmax(score, axis=1)]


@pytest.mark.parametrize("name", list(mx.FORMATS))
def test_matches_brute_force_oracle_including_ties(name: str) -> None:
    fmt = mx.FORMATS[name]
    rng = np.random.default_rng(7)
    # Blocks with amax set to hit shared exponent 0, filled with random values and exact midpoints.
    if fmt.dtype is None:
        grid = np.arange(-128, 128) / 64.0
    else:
        g = np.arange(2 ** fmt.bits, dtype=np.uint8).view(fmt.dtype).astype(np.float64)
        grid = np.unique(g[np.isfinite(g)])
    mids = (grid[1:] + grid[:-1]) / 2
    # Random values up to just below 2^(emax+1), past max normal, so the block scale stays 2^0.
    hi = min(fmt.max_normal * 1.1, 2.0 ** (fmt.emax + 1) * 0.999)
    vals = np.concatenate([mids, rng.uniform(-hi, hi, 2000)])
    vals = rng.permutation(vals)
    vals = vals[: len(vals) // 31 * 31].reshape(-1, 31)
    top = 2.0**fmt.emax * 1.5  # floor(log2 top) = emax, so X = 1 and elements = values
    x = np.concatenate([np.full((len(vals), 1), top), vals], axis=1).astype(np.float32)
    got = mx.quantize_dequantize(x, fmt)
    want = _oracle(x.reshape(-1), fmt).reshape(x.shape)
    np.testing.assert_array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize("name", list(mx.FORMATS))
def test_every_representable_value_round_trips_bit_exactly(name: str) -> None:
    fmt = mx.FORMATS[name]
    q = mx.quantize(np.random.default_rng(3).standard_normal((64, 256)).astype(np.float32) * 0.03, fmt)
    y = mx.dequantize(q)
    q2 = mx.quantize(y, fmt)
    # Re-encoding decoded values reproduces scales and element codes exactly (except -0 -> +0 can't
    # occur: the sign of zero is kept), and decoding again is the identity.
    np.testing.assert_array_equal(q2.scales, q.scales)
    np.testing.assert_array_equal(q2.element_codes(), q.element_codes())
    np.testing.assert_array_equal(mx.dequantize(q2), y)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1, max_size=96),
       st.sampled_from(list(mx.FORMATS)))
def test_finite_inputs_give_finite_bounded_outputs(values: list[float], name: str) -> None:
    x = np.asarray(values, dtype=np.float32)
    y = mx.quantize_dequantize(x, name)
    assert np.isfinite(y).all()
    # Per block: |y| never exceeds 2^(floor(log2 amax) + 1) (saturation keeps it below the next power).
    for b in range(0, len(x), 32):
        amax = np.abs(x[b : b + 32]).max()
        if amax > 0:
            assert np.abs(y[b : b + 32]).max() <= 2.0 ** (np.floor(np.log2(np.float64(amax))) + 1)


# ------------------------------------------------------------------ GGML MXFP4 (gguf-py) agreement
def _without_negative_zero(raw: np.ndarray) -> np.ndarray:
    r = raw.reshape(-1, 17).copy()
    lo, hi = r[:, 1:] & 0x0F, r[:, 1:] >> 4
    lo[lo == 8] = 0
    hi[hi == 8] = 0
    r[:, 1:] = lo | (hi << 4)
    return r


def test_ggml_mxfp4_bytes_match_gguf_py() -> None:
    x = (np.random.default_rng(0).standard_normal((64, 1024)) * 0.02).astype(np.float32)
    ours = mx.to_ggml_mxfp4(x)
    theirs = gguf.quants.quantize(x, MXFP4)
    assert ours.shape == theirs.shape == (64, 1024 // 32 * 17)
    # Identical except that ggml writes +0 where round-to-nearest-even of a small negative gives -0.
    np.testing.assert_array_equal(_without_negative_zero(ours), _without_negative_zero(theirs))
    assert (ours != theirs).any()  # the -0 codes are really there
    # gguf-py (= ggml) decodes our bytes to exactly our values.
    np.testing.assert_array_equal(gguf.quants.dequantize(ours, MXFP4), mx.quantize_dequantize(x, "mxfp4"))
    np.testing.assert_array_equal(mx.dequantize(mx.from_ggml_mxfp4(theirs)), gguf.quants.dequantize(theirs, MXFP4))


def test_ggml_mxfp4_differs_only_where_ggml_does_not_round_to_even() -> None:
    # ggml picks the first of two equally near E2M1 values; the spec rounds ties to even:
    # 3.5 -> ggml 3 (0b0101), spec 4 (0b0110); 0.75 -> ggml 0.5, spec 1.0.
    x = block(6.0, 3.5, 0.75)[None, :]
    ours = mx.to_ggml_mxfp4(x)
    theirs = gguf.quants.quantize(x, MXFP4)
    assert gguf.quants.dequantize(theirs, MXFP4)[0, 1:3].tolist() == [3.0, 0.5]
    assert gguf.quants.dequantize(ours, MXFP4)[0, 1:3].tolist() == [4.0, 1.0]


def test_ggml_mxfp4_needs_rows_of_32() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        mx.to_ggml_mxfp4(np.zeros((2, 48), dtype=np.float32))
