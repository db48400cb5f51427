"""npu.bf16 against ml_dtypes (bf16) and against a float-division restatement of IRON's
bfp16ebs8 encoder, plus the layout of packed B checked by an explicit loop nest."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from npu.bf16 import (
    PackingError,
    bf16_to_f32,
    bfp16_packed_size,
    dequantize_bfp16_blocks,
    f32_to_bf16,
    pack_bfp16,
    quantize_bfp16_blocks,
    round_bf16,
    unpack_bfp16,
)


def ml_bf16_bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def test_f32_to_bf16_matches_ml_dtypes_on_a_million_random_bit_patterns():
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, size=1_000_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[~np.isnan(x)]
    assert x.size > 990_000
    np.testing.assert_array_equal(f32_to_bf16(x), ml_bf16_bits(x))


def test_f32_to_bf16_matches_ml_dtypes_on_a_million_gaussian_values():
    x = np.random.default_rng(1).standard_normal(1_000_000).astype(np.float32) * 3.0
    np.testing.assert_array_equal(f32_to_bf16(x), ml_bf16_bits(x))


def test_f32_to_bf16_matches_ml_dtypes_on_subnormals_infinities_zeros_and_extremes():
    sub = np.arange(1, 1 << 23, 997, dtype=np.uint32)
    special = np.array(
        [
            0x00000000,
            0x80000000,
            0x7F800000,
            0xFF800000,
            0x7F7FFFFF,
            0xFF7FFFFF,
            0x7F7F8000,
            0x7F7F7FFF,
            0x00800000,
            0x007FFFFF,
            0x00008000,
            0x00018000,
            0x3F808000,
            0x3F818000,
        ],
        dtype=np.uint32,
    )
    bits = np.concatenate([sub, sub | 0x80000000, special])
    x = bits.view(np.float32)
    np.testing.assert_array_equal(f32_to_bf16(x), ml_bf16_bits(x))


def test_ties_round_to_even():
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), -(1 + 3 * 2**-8)], np.float32)
    np.testing.assert_array_equal(round_bf16(x), [1.0, 1.015625, -1.0, -1.015625])


def test_largest_finite_values_round_to_infinity_past_the_bf16_maximum():
    x = np.array([3.4028235e38, -3.4028235e38], np.float32)
    np.testing.assert_array_equal(f32_to_bf16(x), [0x7F80, 0xFF80])


def test_nan_keeps_sign_and_top_payload_and_is_quiet():
    bits = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FA12345, 0xFF812345], np.uint32)
    out = f32_to_bf16(bits.view(np.float32))
    np.testing.assert_array_equal(out, [0x7FC0, 0xFFC0, 0x7FC0, 0x7FE1, 0xFFC1])
    assert np.isnan(bf16_to_f32(out)).all()
    # ml_dtypes drops the payload (0x7FC0 / 0xFFC0); NaN-ness and sign agree.
    with np.errstate(invalid="ignore"):
        ml = ml_bf16_bits(bits.view(np.float32))
    np.testing.assert_array_equal(out & 0xFFC0, ml)


def test_shapes_are_kept_and_bf16_to_f32_is_exact():
    x = np.random.default_rng(2).standard_normal((3, 4, 5)).astype(np.float32)
    u = f32_to_bf16(x)
    assert u.dtype == np.uint16 and u.shape == (3, 4, 5)
    back = bf16_to_f32(u)
    assert back.dtype == np.float32 and back.shape == (3, 4, 5)
    np.testing.assert_array_equal(back, u.view(ml_dtypes.bfloat16).astype(np.float32))
    assert f32_to_bf16(np.float32(1.0)).shape == ()


def reference_bfp16(values: np.ndarray) -> np.ndarray:
    """IRON's encoder restated with float division and np.rint (its formulation, not ours)."""
    u = values.view(np.uint32)
    sign = (u >> 31).astype(bool)
    exp = ((u >> 23) & 0xFF).astype(np.int64)
    man = (u & 0x7FFFFF).astype(np.int64)
    man = np.where(exp != 0, man | 0x800000, man)
    emax = exp.max(axis=1, keepdims=True)
    shift = emax - exp
    total = np.clip(17 + shift, 0, 62)
    mag = np.where(sign, -man, man).astype(np.float64)
    v8 = np.rint(mag / np.exp2(total.astype(np.float64)))
    v8 = np.where(shift >= 32, np.where(sign, -1, 0), v8)
    v8 = np.clip(v8, -128, 127)
    out = np.empty((values.shape[0], 9), np.uint8)
    out[:, 0] = emax[:, 0]
    out[:, 1:] = v8.astype(np.int8).view(np.uint8)
    return out


def wide_range_blocks(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mant = rng.standard_normal((n, 8))
    expo = rng.integers(-60, 60, size=(n, 8))
    x = (mant * np.exp2(expo)).astype(np.float32)
    x[rng.random((n, 8)) < 0.05] = 0.0
    return x


def test_bfp16_quantiser_matches_irons_float_formulation_bytewise():
    x = np.concatenate(
        [
            wide_range_blocks(50_000, 3),
            np.random.default_rng(4).standard_normal((50_000, 8)).astype(np.float32),
        ]
    )
    np.testing.assert_array_equal(quantize_bfp16_blocks(x), reference_bfp16(x))


def test_bfp16_hardware_measured_roundings():
    # IRON's measured conv_even results: 14.9375 -> 15, 106.5 -> 106, 94.5 -> 94.
    x = np.zeros((3, 8), np.float32)
    x[:, 0] = [14.9375, 106.5, 94.5]
    np.testing.assert_array_equal(
        dequantize_bfp16_blocks(quantize_bfp16_blocks(x))[:, 0], [15.0, 106.0, 94.0]
    )


def test_bfp16_error_bound_one_block_ulp_and_half_ulp_where_rounding_applies():
    # ulp = 2**(E - 133) for shared exponent byte E. Rounding costs <= ulp/2; saturating the
    # max (127.5 -> 127) and IRON's -1 for negatives >= 32 binades down cost < 1 ulp.
    x = np.concatenate(
        [
            wide_range_blocks(100_000, 5),
            np.random.default_rng(6).standard_normal((100_000, 8)).astype(np.float32),
        ]
    )
    x[np.abs(x) < np.float32(2**-126)] = 0.0  # subnormals are read at half value (documented)
    q = quantize_bfp16_blocks(x)
    err = np.abs(dequantize_bfp16_blocks(q).astype(np.float64) - x.astype(np.float64))
    ulp = np.broadcast_to(np.exp2(q[:, :1].astype(np.float64) - 133), x.shape)
    assert (err <= ulp).all()
    mant = q[:, 1:].view(np.int8)
    exp = (x.view(np.uint32) >> 23) & 0xFF
    special = (mant == 127) | ((q[:, :1].astype(np.int64) - exp >= 32) & (x <= 0) & (mant == -1))
    assert (err[~special] <= ulp[~special] / 2).all()
    assert special.any() and (~special).any()


def test_bfp16_representable_values_round_trip_exactly():
    rng = np.random.default_rng(7)
    e = rng.integers(100, 150, size=(1000, 1))
    m = rng.integers(-127, 128, size=(1000, 8))
    m[:, 0] = rng.choice([-127, -100, 64, 90, 127], size=1000)
    x = (m * np.exp2(e - 133.0)).astype(np.float32)
    np.testing.assert_array_equal(dequantize_bfp16_blocks(quantize_bfp16_blocks(x)), x)


def test_bfp16_decoding_extremes():
    q = np.zeros((2, 9), np.uint8)
    q[:, 1:3] = np.array([-128, 127], np.int8).view(np.uint8)
    q[:, 0] = [0, 254]
    out = dequantize_bfp16_blocks(q)
    np.testing.assert_array_equal(out[0, :2], [-128 * 2.0**-133, 127 * 2.0**-133])
    assert out[1, 0] == -np.inf and out[1, 1] == np.float32(127 * 2.0**121)
    big = np.full((1, 8), -3.4028235e38, np.float32)  # rounds to mantissa -128 at E = 254
    assert quantize_bfp16_blocks(big)[0, 1] == 0x80


def expected_layout(b: np.ndarray, tile_n: int, tile_k: int, ct_k: int) -> np.ndarray:
    """Blocks in consumption order by an explicit loop nest over (cb, kb, kslice, tb, i, t_in):
    each block is 8 consecutive k of one column n."""
    k_dim, n_dim = b.shape
    blocks = []
    for cb in range(n_dim // tile_n):
        for kb in range(k_dim // tile_k):
            for ks in range(tile_k // ct_k):
                for tb in range(tile_n // 8):
                    for i in range(ct_k // 8):
                        for t_in in range(8):
                            k0 = kb * tile_k + ks * ct_k + i * 8
                            n = cb * tile_n + tb * 8 + t_in
                            blocks.append(b[k0 : k0 + 8, n])
    return np.array(blocks, np.float32)


@pytest.mark.parametrize(
    ("k", "n", "tile_n", "tile_k", "ct_k"),
    [(1024, 128, 64, 512, 128), (512, 256, 128, 512, 32), (64, 32, 16, 32, 16), (96, 24, 8, 48, 8)],
)
def test_pack_bfp16_puts_blocks_in_irons_consumption_order(k, n, tile_n, tile_k, ct_k):
    b = np.random.default_rng(k + n).standard_normal((k, n)).astype(np.float32)
    packed = pack_bfp16(b, tile_n, tile_k, ct_k)
    assert packed.dtype == np.uint8 and packed.shape == (bfp16_packed_size(k, n),)
    expected = quantize_bfp16_blocks(expected_layout(b, tile_n, tile_k, ct_k)).reshape(-1)
    np.testing.assert_array_equal(packed, expected)
    back = unpack_bfp16(packed, k, n, tile_n, tile_k, ct_k)
    np.testing.assert_array_equal(
        back.T.reshape(-1, 8), dequantize_bfp16_blocks(quantize_bfp16_blocks(b.T.reshape(-1, 8)))
    )
    np.testing.assert_array_equal(unpack_bfp16(packed.tobytes(), k, n, tile_n, tile_k, ct_k), back)


def test_pack_bfp16_round_trip_within_the_block_bound():
    b = np.random.default_rng(8).standard_normal((1024, 64)).astype(np.float32)
    back = unpack_bfp16(pack_bfp16(b, 64, 512, 128), 1024, 64, 64, 512, 128)
    colmax = np.abs(b.T.reshape(-1, 8)).max(axis=1)
    # one ulp of a block is at most 2**-6 times its largest magnitude
    bound = (colmax * 2**-6).reshape(64, 1024 // 8).T.repeat(8, axis=0)
    assert (np.abs(back - b) <= bound).all()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((np.zeros((100, 64)), 64, 512, 128), "K (100) is not a multiple of tile_k (512)"),
        ((np.zeros((512, 70)), 64, 512, 128), "N (70) is not a multiple of tile_n (64)"),
        ((np.zeros((512, 64)), 64, 512, 100), "tile_k (512) is not a multiple of ct_k (100)"),
        ((np.zeros((512, 64)), 64, 512, 0), "ct_k must be a positive integer, got 0"),
        ((np.zeros((32, 12)), 12, 32, 4), "ct_k (4) is not a multiple of 8"),
        ((np.zeros(8), 8, 8, 8), "B must be float32 [K, N], got shape (8,)"),
        ((np.full((8, 8), np.inf), 8, 8, 8), "bfp16 packing needs finite values; got inf or NaN"),
    ],
)
def test_pack_bfp16_refuses_bad_tilings_and_values(args, message):
    with pytest.raises(PackingError) as err:
        pack_bfp16(*args)
    assert str(err.value) == message


def test_unpack_bfp16_refuses_a_blob_of_the_wrong_size():
    with pytest.raises(PackingError, match="packed B holds 8 bytes, a \\[8, 8\\] B needs 72"):
        unpack_bfp16(np.zeros(8, np.uint8), 8, 8, 8, 8, 8)
