"""bf16 and bfp16ebs8 on the host: the number formats IRON bundles store and NPU2 kernels read.

f32 -> bf16 rounds to nearest, ties to even, with taconite's integer trick (add
0x7FFF + lsb, keep the upper 16 bits); it is bit-identical to ml_dtypes on every finite input
and on +-inf. bfp16ebs8 is the block format of flm.GEMM's packed B on NPU2, encoded as amd/IRON
iron/operators/flm/packing.py (f32_to_bfp16ebs8 and pack_b with bfp16=True) encodes it.

NaN policy (f32_to_bf16): a NaN keeps its sign and the top 7 bits of its payload and gets the
quiet bit set, `(bits >> 16) | 0x0040`, as taconite::f32_to_bf16. So every NaN stays a NaN
(a signalling NaN whose payload lives only in the low 16 bits becomes the quiet 0x7FC0 /
0xFFC0), never an infinity.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from pipeline.errors import NpucamError

BFP16_BLOCK = 8  # values that share one exponent byte
BFP16_BLOCK_BYTES = 9  # the exponent byte, then 8 signed mantissa bytes
# A mantissa m under shared exponent byte E stands for m * 2**(E - 127 - 6): the f32 significand
# (implicit bit explicit, 24 bits) shifted right by 17 keeps the sign plus 7 bits.
_BFP16_SCALE_BIAS = 127 + 6


class PackingError(NpucamError):
    """bfp16ebs8 packing or unpacking was given an impossible shape, tiling or input."""


def f32_to_bf16(a: np.ndarray) -> np.ndarray:
    """Round to bf16, nearest with ties to even; NaNs as the module docstring says.

    a: any shape, any real dtype (converted to float32 first, as the device sees it).
    Returns uint16 of the same shape: the bf16 bit patterns.
    """
    bits = np.asarray(a, dtype=np.float32).view(np.uint32)
    # Finite values are <= 0xFF7FFFFF, so the addition cannot wrap; it can carry into the
    # exponent, which is the correct round-up (to the next binade or to infinity).
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
    out = (rounded >> np.uint32(16)).astype(np.uint16)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        out[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return out


def f32_to_bf16_into(a: np.ndarray, out: np.ndarray) -> np.ndarray:
    """f32_to_bf16(a) written into `out` without a temporary of a's size; returns out.

    a: float32, any shape (any strides); out: uint16 of the same shape, e.g. a view of a
    device buffer's mapping. ml_dtypes' cast rounds to nearest even exactly as the integer
    trick does on every non-NaN value; it makes every NaN the canonical 0x7FC0 / 0xFFC0, so a
    NaN present (a max that is NaN) is redone with the payload-keeping rule.
    """
    with np.errstate(invalid="ignore"):
        np.copyto(out.view(ml_dtypes.bfloat16), a, casting="unsafe")
        if a.size and np.isnan(np.max(a)):
            nan = np.isnan(a)
            out[nan] = f32_to_bf16(a[nan])
    return out


def bf16_to_f32(u: np.ndarray) -> np.ndarray:
    """bf16 bit patterns -> float32, exactly (the bits become the upper half of an f32).

    u: any shape of uint16 (or any integer dtype holding values < 2**16).
    Returns float32 of the same shape.
    """
    return (np.asarray(u).astype(np.uint32) << np.uint32(16)).view(np.float32)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bf16 (ties to even), still as float32; any shape."""
    return bf16_to_f32(f32_to_bf16(x))


def quantize_bfp16_blocks(values: np.ndarray) -> np.ndarray:
    """Encode blocks of 8 float32 values as bfp16ebs8, as IRON's f32_to_bfp16ebs8 (conv_even).

    values: float32 [nblocks, 8], finite. Returns uint8 [nblocks, 9]: the shared exponent
    byte E (the largest biased f32 exponent in the block), then 8 int8 mantissas
    m = round_half_even(significand / 2**(17 + E - e)), where e is the value's own biased
    exponent and the significand has its implicit bit made explicit (none for zero and
    subnormals, which keep e = 0, so a subnormal is read as half its value).

    Two details follow IRON's encoder for byte parity: a block maximum that rounds to 128 is
    saturated to 127, and a negative value 32 or more binades below E (including -0.0) encodes
    as -1 rather than 0 (the arithmetic-shift result IRON keeps in both rounding modes).
    """
    values = np.asarray(values, dtype=np.float32)
    if values.ndim != 2 or values.shape[1] != BFP16_BLOCK:
        raise PackingError(f"bfp16 blocks must be float32 [n, 8], got shape {values.shape}")
    if not np.isfinite(values).all():
        raise PackingError("bfp16 packing needs finite values; got inf or NaN")
    bits = values.view(np.uint32)
    exp = ((bits >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int32)
    shared = exp.max(axis=1, keepdims=True)
    # significand / 2**(17 + E - e) is |x| * 2**(133 - E) for a normal x, exact in float64;
    # a subnormal's e = 0 makes it |x| * 2**(132 - E).
    scaled = values.astype(np.float64) * np.ldexp(1.0, _BFP16_SCALE_BIAS - shared)
    scaled[exp == 0] *= 0.5
    mantissa = np.rint(scaled)  # round half to even, symmetric in sign: conv_even
    np.clip(mantissa, -128, 127, out=mantissa)
    mantissa[((shared - exp) >= 32) & ((bits >> np.uint32(31)) == 1)] = -1
    out = np.empty((values.shape[0], BFP16_BLOCK_BYTES), dtype=np.uint8)
    out[:, 0] = shared[:, 0]
    out[:, 1:] = mantissa.astype(np.int8).view(np.uint8)
    return out


def dequantize_bfp16_blocks(blocks: np.ndarray) -> np.ndarray:
    """Decode bfp16ebs8 blocks: uint8 [nblocks, 9] -> float32 [nblocks, 8], exactly.

    Each value is m * 2**(E - 133) (see quantize_bfp16_blocks); every such value is an exact
    float32 (at most 8 significant bits, no smaller than 2**-133) except -128 * 2**121
    (E = 254, m = -128), which is -2**128 and reads as -inf.
    """
    blocks = np.asarray(blocks, dtype=np.uint8)
    if blocks.ndim != 2 or blocks.shape[1] != BFP16_BLOCK_BYTES:
        raise PackingError(f"bfp16 blocks must be uint8 [n, 9], got shape {blocks.shape}")
    mantissa = np.ascontiguousarray(blocks[:, 1:]).view(np.int8).astype(np.float32)
    # 2**(E - 133) >= 2**-133 is a float32 (subnormal below 2**-126), and so is every product.
    scale = np.ldexp(np.float32(1.0), blocks[:, :1].astype(np.int32) - _BFP16_SCALE_BIAS)
    with np.errstate(over="ignore"):
        return mantissa * scale


def bfp16_packed_size(k: int, n: int) -> int:
    """Bytes of a packed [K, N] B: K*N/8 blocks of 9 bytes (the records' b_bytes)."""
    return k * n // BFP16_BLOCK * BFP16_BLOCK_BYTES


# pack_b's register tiling s x t: 8 x 8 in every IRON commit read (design.py R, S, T = 8, 8, 8).
_S = _T = 8


def _tiling(k: int, n: int, tile_n: int, tile_k: int, ct_k: int) -> tuple[int, ...]:
    """The 7-axis blocking (kb, kslice, i, s_in, cb, tb, t_in) of a row-major [K, N] B."""
    for name, value in (("K", k), ("N", n), ("tile_n", tile_n), ("tile_k", tile_k), ("ct_k", ct_k)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
            raise PackingError(f"{name} must be a positive integer, got {value!r}")
    checks = (
        (k % tile_k == 0, f"K ({k}) is not a multiple of tile_k ({tile_k})"),
        (n % tile_n == 0, f"N ({n}) is not a multiple of tile_n ({tile_n})"),
        (tile_k % ct_k == 0, f"tile_k ({tile_k}) is not a multiple of ct_k ({ct_k})"),
        (ct_k % _S == 0, f"ct_k ({ct_k}) is not a multiple of {_S}"),
        (tile_n % _T == 0, f"tile_n ({tile_n}) is not a multiple of {_T}"),
    )
    for ok, message in checks:
        if not ok:
            raise PackingError(message)
    return (k // tile_k, tile_k // ct_k, ct_k // _S, _S, n // tile_n, tile_n // _T, _T)


# Consumption order (cb, kb, kslice, tb, i, t_in, s_in): a block is 8 consecutive k (s_in) of
# one output column, as pack_b's bfp16 permute(4, 0, 1, 5, 2, 6, 3).
_PACK_ORDER = (4, 0, 1, 5, 2, 6, 3)
_UNPACK_ORDER = tuple(int(i) for i in np.argsort(_PACK_ORDER))


def pack_bfp16(b: np.ndarray, tile_n: int, tile_k: int, ct_k: int) -> np.ndarray:
    """Pack a row-major GEMM weight into flm.GEMM's NPU2 B: bfp16ebs8 in consumption order.

    b: float32 [K, N], finite. tile_n / tile_k / ct_k: the record's fields (IRON: tile_k is
    K_TILE = 512, ct_k = CT_MAX_K_FOR_N[tile_n]). Returns uint8 [K*N/8*9].
    """
    b = np.asarray(b, dtype=np.float32)
    if b.ndim != 2:
        raise PackingError(f"B must be float32 [K, N], got shape {b.shape}")
    axes = _tiling(b.shape[0], b.shape[1], tile_n, tile_k, ct_k)
    blocks = b.reshape(axes).transpose(_PACK_ORDER).reshape(-1, BFP16_BLOCK)
    return quantize_bfp16_blocks(blocks).reshape(-1)


def unpack_bfp16(
    blob: np.ndarray | bytes, k: int, n: int, tile_n: int, tile_k: int, ct_k: int
) -> np.ndarray:
    """Invert pack_bfp16: uint8 [K*N/8*9] (or bytes) -> float32 [K, N], the values the NPU reads."""
    axes = _tiling(k, n, tile_n, tile_k, ct_k)
    raw = np.frombuffer(blob, dtype=np.uint8) if isinstance(blob, bytes | bytearray) else blob
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if raw.size != bfp16_packed_size(k, n):
        raise PackingError(
            f"packed B holds {raw.size} bytes, a [{k}, {n}] B needs {bfp16_packed_size(k, n)}"
        )
    values = dequantize_bfp16_blocks(raw.reshape(-1, BFP16_BLOCK_BYTES))
    packed_axes = tuple(axes[i] for i in _PACK_ORDER)
    return np.ascontiguousarray(values.reshape(packed_axes).transpose(_UNPACK_ORDER)).reshape(k, n)
