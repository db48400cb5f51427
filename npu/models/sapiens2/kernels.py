"""The replay's host loops compiled with numba: one pass over a chunk where numpy makes one
pass per operation (npu/models/sapiens2/glue.py calls them, row chunks on the host pool;
they release the GIL).

Each does the float32 operations of model.py's reference glue in the same order, so the bits
are the same: products and sums are IEEE float32 (numba contracts no multiply-add without
fastmath), sqrt is correctly rounded, a mean over a head is numpy's pairwise sum
(`pairwise_sum` of numpy/_core/src/umath/loops_utils.h.src: 8 accumulators up to 128
values, halves split at a multiple of 8 above) divided in float64 as np.mean does, and bf16
rounding is npu.bf16.f32_to_bf16's integer rule, NaNs included. InstanceNorm's mean
and variance sum in float64 in model.block_sums' order; tanh stays numpy's
(tests/npu/models/test_sapiens2_glue.py compares every result bit for bit).
"""

from __future__ import annotations

import numpy as np
from numba import njit

F32 = np.float32
U32 = np.uint32


@njit(nogil=True, cache=True)
def _bf16(b: np.uint32) -> np.uint16:
    """bf16 bits of float32 bits b (uint32): f32_to_bf16's rounding and NaN rule."""
    if (b & U32(0x7FFFFFFF)) > U32(0x7F800000):
        return np.uint16((b >> U32(16)) | U32(0x0040))
    return np.uint16((b + (U32(0x7FFF) + ((b >> U32(16)) & U32(1)))) >> U32(16))


@njit(nogil=True, cache=True)
def patches_bf16(bits: np.ndarray, p: int, gy0: int, gy1: int, out: np.ndarray) -> None:
    """The patch GEMM's A rows of grid rows [gy0, gy1): out[gy - gy0, gx, c, py, px] =
    f32_to_bf16(crop[c, gy·p + py, gx·p + px]); bits: the crop's float32 as uint32
    [3, H, W], out uint16 [gy1 - gy0, W / p, 3, p, p]."""
    for gy in range(gy0, gy1):
        for c in range(bits.shape[0]):
            for py in range(p):
                src = bits[c, gy * p + py]
                for gx in range(out.shape[1]):
                    dst = out[gy - gy0, gx, c, py]
                    for px in range(p):
                        dst[px] = _bf16(src[gx * p + px])


@njit(nogil=True, cache=True)
def _block_sum(a: np.ndarray, s: int, n: int) -> np.float32:
    """numpy's pairwise_sum of a[s : s + n] for n <= 128 (its unrolled leaves)."""
    b = a[s : s + n]
    if n < 8:
        res = F32(0.0)
        for i in range(n):
            res += b[i]
        return res
    r0, r1, r2, r3 = b[0], b[1], b[2], b[3]
    r4, r5, r6, r7 = b[4], b[5], b[6], b[7]
    end = n - n % 8
    for i in range(1, end // 8):
        # a slice of 8 per step: its loads need no negative-index fix-up (1.5x the speed)
        blk = b[i * 8 : i * 8 + 8]
        r0 += blk[0]
        r1 += blk[1]
        r2 += blk[2]
        r3 += blk[3]
        r4 += blk[4]
        r5 += blk[5]
        r6 += blk[6]
        r7 += blk[7]
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for i in range(end, n):
        res += b[i]
    return res


@njit(nogil=True, cache=True)
def _pairwise(a: np.ndarray, n: int, stack: np.ndarray, sums: np.ndarray) -> np.float32:
    """numpy's float32 pairwise sum of a[:n] (a 1-D float32 array): above 128 values the
    halves split at a multiple of 8 and are summed alone, then added (the recursion, walked
    on `stack` (int64 [3, 64]) and `sums` (float32 [64]): numba's cache does not keep recursive
    functions safely)."""
    if n <= 128:
        return _block_sum(a, 0, n)
    starts, sizes, state = stack[0], stack[1], stack[2]  # state 0: split it, 1: left done
    starts[0], sizes[0], state[0], top = 0, n, 0, 0
    while True:
        m = sizes[top]
        if m <= 128 or state[top] == 2:
            value = _block_sum(a, starts[top], m) if m <= 128 else sums[top]
            if top == 0:
                return value
            top -= 1
            if state[top] == 1:
                sums[top] = value
            else:
                sums[top] = sums[top] + value
            continue
        n2 = m // 2
        n2 -= n2 % 8
        if state[top] == 0:
            state[top] = 1
            starts[top + 1], sizes[top + 1], state[top + 1] = starts[top], n2, 0
        else:
            state[top] = 2
            starts[top + 1], sizes[top + 1], state[top + 1] = starts[top] + n2, m - n2, 0
        top += 1


@njit(nogil=True, cache=True)
def _norm_heads(
    src: np.ndarray,
    width: int,
    hd: int,
    weight: np.ndarray,
    eps: np.float32,
    qk_norm: bool,
    work: np.ndarray,
    inv: np.ndarray,
    stack: np.ndarray,
    sums: np.ndarray,
    dst: np.ndarray,
    dst_stride: int,
) -> None:
    """Head h of src (width heads of hd values) -> dst[h·dst_stride:][:hd]: rms_norm(head)
    · weight, or the head itself without q/k norm."""
    for h in range(width):
        s = src[h * hd : (h + 1) * hd]
        if qk_norm:
            w = work[:hd]
            for j in range(hd):
                w[j] = s[j] * s[j]
            inv[h] = F32(np.float64(_pairwise(w, hd, stack, sums)) / np.float64(hd))  # mean
    for h in range(width):
        inv[h] = F32(1.0) / np.sqrt(inv[h] + eps)
    for h in range(width):
        s = src[h * hd : (h + 1) * hd]
        o = dst[h * dst_stride : h * dst_stride + hd]
        if qk_norm:
            f = inv[h]
            for j in range(hd):
                o[j] = (s[j] * f) * weight[j]
        else:
            for j in range(hd):
                o[j] = s[j]


@njit(nogil=True, cache=True)
def _rope(
    x: np.ndarray,
    width: int,
    hd: int,
    stride: int,
    cos: np.ndarray,
    sin: np.ndarray,
    scale: np.float32,
    scaled: bool,
) -> None:
    """Half-split RoPE in place of heads at x[h·stride:]: [lo·cos - hi·sin | hi·cos + lo·sin],
    each result then times `scale` when `scaled` (q's log2(e)/sqrt(hd), after the rotation)."""
    half = hd // 2
    c0, c1, s0, s1 = cos[:half], cos[half:hd], sin[:half], sin[half:hd]
    for h in range(width):
        lo_v = x[h * stride : h * stride + half]
        hi_v = x[h * stride + half : h * stride + hd]
        if scaled:
            for j in range(half):
                lo = lo_v[j]
                hi = hi_v[j]
                lo_v[j] = (lo * c0[j] - hi * s0[j]) * scale
                hi_v[j] = (hi * c1[j] + lo * s1[j]) * scale
        else:
            for j in range(half):
                lo = lo_v[j]
                hi = hi_v[j]
                lo_v[j] = lo * c0[j] - hi * s0[j]
                hi_v[j] = hi * c1[j] + lo * s1[j]


@njit(nogil=True, cache=True)
def _copy_v(row: np.ndarray, heads: int, kv: int, hd: int, o: np.ndarray) -> None:
    """A token's v heads, each repeated heads / kv times: row float32 [(heads + 2 kv)·hd] ->
    o[2·heads·hd : 3·heads·hd]."""
    d = heads * hd
    rep = heads // kv
    v = row[d + kv * hd : d + 2 * kv * hd]
    for h in range(kv):
        vh = v[h * hd : (h + 1) * hd]
        for k2 in range(rep):
            vd = o[2 * d + (h * rep + k2) * hd : 2 * d + (h * rep + k2 + 1) * hd]
            for j in range(hd):
                vd[j] = vh[j]


@njit(nogil=True, cache=True)
def _stage_qk(
    row: np.ndarray,
    rotate: bool,
    cos: np.ndarray,
    sin: np.ndarray,
    heads: int,
    kv: int,
    hd: int,
    q_norm: np.ndarray,
    k_norm: np.ndarray,
    eps: np.float32,
    scale: np.float32,
    qk_norm: bool,
    work: np.ndarray,
    inv: np.ndarray,
    stack: np.ndarray,
    sums: np.ndarray,
    o: np.ndarray,
) -> None:
    """One token's q and k: row float32 [(heads + kv)·hd] at least -> o[:2·heads·hd] (q/k
    norm, RoPE from `rotate` on, q's scale, k's repeats)."""
    d = heads * hd
    rep = heads // kv
    qo, ko = o[:d], o[d : 2 * d]
    _norm_heads(row[:d], heads, hd, q_norm, eps, qk_norm, work, inv, stack, sums, qo, hd)
    k = row[d : d + kv * hd]
    _norm_heads(k, kv, hd, k_norm, eps, qk_norm, work, inv, stack, sums, ko, rep * hd)
    if rotate:
        _rope(qo, heads, hd, hd, cos, sin, scale, True)
        _rope(ko, kv, hd, rep * hd, cos, sin, scale, False)
    else:
        for j in range(d):
            qo[j] *= scale
    for h in range(kv):
        first = ko[h * rep * hd : h * rep * hd + hd]
        for k2 in range(1, rep):
            kd = ko[(h * rep + k2) * hd : (h * rep + k2 + 1) * hd]
            for j in range(hd):
                kd[j] = first[j]


@njit(nogil=True, cache=True)
def stage(
    qkv: np.ndarray,
    heads: int,
    kv: int,
    hd: int,
    prefix: int,
    q_norm: np.ndarray,
    k_norm: np.ndarray,
    cos: np.ndarray,
    sin: np.ndarray,
    eps: np.float32,
    scale: np.float32,
    qk_norm: bool,
    out: np.ndarray,
) -> None:
    """model.stage_attention's rows: qkv float32 [t, (heads + 2 kv)·hd] -> out float32
    [t, 3·heads·hd]; rows from `prefix` on are rotated with cos / sin rows [t - prefix, hd]."""
    work = np.empty(hd, F32)
    inv = np.empty(heads, F32)
    stack = np.zeros((3, 64), np.int64)
    sums = np.zeros(64, F32)
    for r in range(qkv.shape[0]):
        t = max(r - prefix, 0)
        _stage_qk(qkv[r], r >= prefix, cos[t], sin[t], heads, kv, hd, q_norm, k_norm, eps,
                  scale, qk_norm, work, inv, stack, sums, out[r])  # fmt: skip
        _copy_v(qkv[r], heads, kv, hd, out[r])


@njit(nogil=True, cache=True)
def stage_bits(
    qkv: np.ndarray,
    heads: int,
    kv: int,
    hd: int,
    prefix: int,
    q_norm: np.ndarray,
    k_norm: np.ndarray,
    cos: np.ndarray,
    sin: np.ndarray,
    eps: np.float32,
    scale: np.float32,
    qk_norm: bool,
    out: np.ndarray,
) -> None:
    """stage() of the bf16 bits of qkv (uint16), each row widened as bf16_to_f32 first."""
    work = np.empty(hd, F32)
    inv = np.empty(heads, F32)
    stack = np.zeros((3, 64), np.int64)
    sums = np.zeros(64, F32)
    row = np.empty(qkv.shape[1], F32)
    wide = row.view(np.uint32)
    for r in range(qkv.shape[0]):
        src = qkv[r]
        for j in range(qkv.shape[1]):
            wide[j] = U32(src[j]) << U32(16)
        t = max(r - prefix, 0)
        _stage_qk(row, r >= prefix, cos[t], sin[t], heads, kv, hd, q_norm, k_norm, eps,
                  scale, qk_norm, work, inv, stack, sums, out[r])  # fmt: skip
        _copy_v(row, heads, kv, hd, out[r])


@njit(nogil=True, cache=True)
def stage_bits_bf16(
    qkv: np.ndarray,
    heads: int,
    kv: int,
    hd: int,
    prefix: int,
    q_norm: np.ndarray,
    k_norm: np.ndarray,
    cos: np.ndarray,
    sin: np.ndarray,
    eps: np.float32,
    scale: np.float32,
    qk_norm: bool,
    out: np.ndarray,
) -> None:
    """stage_bits() rounded as f32_to_bf16 into out (uint16): each row's q and k are staged
    in float32 scratch, then rounded, with no float32 copy of the chunk. v is only copied
    (and repeated), so its bits go across as they are: the float32 of a bf16 rounds back to
    itself, and a NaN to itself made quiet, as f32_to_bf16 does."""
    work = np.empty(hd, F32)
    inv = np.empty(heads, F32)
    stack = np.zeros((3, 64), np.int64)
    sums = np.zeros(64, F32)
    d = heads * hd
    qk = d + kv * hd  # q and k of a row of qkv; v follows
    rep = heads // kv
    row = np.empty(qk, F32)
    wide = row.view(np.uint32)
    staged = np.empty(2 * d, F32)
    staged_bits = staged.view(np.uint32)
    for r in range(qkv.shape[0]):
        src = qkv[r]
        for j in range(qk):
            wide[j] = U32(src[j]) << U32(16)
        t = max(r - prefix, 0)
        _stage_qk(row, r >= prefix, cos[t], sin[t], heads, kv, hd, q_norm, k_norm, eps,
                  scale, qk_norm, work, inv, stack, sums, staged)  # fmt: skip
        dst = out[r]
        for j in range(2 * d):
            dst[j] = _bf16(staged_bits[j])
        for h in range(kv):
            vh = src[qk + h * hd : qk + (h + 1) * hd]
            for k2 in range(rep):
                vd = dst[2 * d + (h * rep + k2) * hd : 2 * d + (h * rep + k2 + 1) * hd]
                for j in range(hd):
                    b = vh[j]
                    # a NaN (exponent all ones, mantissa not 0) made quiet; else itself
                    vd[j] = b | np.uint16(0x0040) if (b & np.uint16(0x7FFF)) > 0x7F80 else b


@njit(nogil=True, cache=True)
def gather_rows(
    c: np.ndarray, offs: np.ndarray, bias: np.ndarray, boffs: np.ndarray, out: np.ndarray
) -> None:
    """out[i, j] = bf16_to_f32(c[offs[i] + j]), plus bias[boffs[i] + j] when bias is not
    empty (float32, added after the widening, as model.deconv_scatter's C + bias): the rows
    of a GEMM's C (uint16, flat) at any offsets, into float32 out [n, C] (contiguous)."""
    wide = out.view(np.uint32)
    biased = bias.shape[0] > 0
    n = out.shape[1]
    for i in range(out.shape[0]):
        src = c[offs[i] : offs[i] + n]  # a slice: its loads need no negative-index fix-up
        for j in range(n):
            wide[i, j] = U32(src[j]) << U32(16)
        if biased:
            add = bias[boffs[i] : boffs[i] + n]
            for j in range(n):
                out[i, j] += add[j]


@njit(nogil=True, cache=True)
def _row(
    c: np.ndarray, o: int, bias: np.ndarray, b: int, biased: bool, row: np.ndarray, wide: np.ndarray
) -> None:
    """row = bf16_to_f32(c[o:][:C]) (+ bias[b:][:C]): gather_rows' row, into L1 scratch."""
    n = row.shape[0]
    src = c[o : o + n]
    for j in range(n):
        wide[j] = U32(src[j]) << U32(16)
    if biased:
        add = bias[b : b + n]
        for j in range(n):
            row[j] += add[j]


@njit(nogil=True, cache=True)
def block_sums(
    c: np.ndarray,
    offs: np.ndarray,
    bias: np.ndarray,
    boffs: np.ndarray,
    ch: int,
    block: int,
    sums: np.ndarray,
) -> None:
    """sums[b, j] = the sum over rows i in [b·block, (b+1)·block) of float64(y[i, j]), in
    row order (model.block_sums), y's rows as gather_rows reads them from C (offs: from a
    block boundary); sums float64 [ceil(len(offs) / block), ch]."""
    row = np.empty(ch, F32)
    wide = row.view(np.uint32)
    biased = bias.shape[0] > 0
    for b in range(sums.shape[0]):
        s = sums[b]
        s[:] = 0.0
        for i in range(b * block, min((b + 1) * block, offs.shape[0])):
            _row(c, offs[i], bias, boffs[i], biased, row, wide)
            for j in range(ch):
                s[j] += np.float64(row[j])


@njit(nogil=True, cache=True)
def block_square_sums(
    c: np.ndarray,
    offs: np.ndarray,
    bias: np.ndarray,
    boffs: np.ndarray,
    mean: np.ndarray,
    block: int,
    sums: np.ndarray,
) -> None:
    """block_sums of float64(y - mean)² (model.block_square_sums): y's rows read from C as
    block_sums reads them, centred in float32, squared exactly in float64."""
    ch = mean.shape[0]
    row = np.empty(ch, F32)
    wide = row.view(np.uint32)
    biased = bias.shape[0] > 0
    for b in range(sums.shape[0]):
        s = sums[b]
        s[:] = 0.0
        for i in range(b * block, min((b + 1) * block, offs.shape[0])):
            _row(c, offs[i], bias, boffs[i], biased, row, wide)
            for j in range(ch):
                v = np.float64(row[j] - mean[j])
                s[j] += v * v


@njit(nogil=True, cache=True)
def halves(y: np.ndarray, mean: np.ndarray, rstd: np.ndarray, t: np.ndarray) -> None:
    """t = ((y - mean) · rstd) · 0.5 per column, tanh's argument in SiLU: y, t float32
    [n, C]."""
    for i in range(y.shape[0]):
        for j in range(y.shape[1]):
            t[i, j] = ((y[i, j] - mean[j]) * rstd[j]) * F32(0.5)


@njit(nogil=True, cache=True)
def silu_bf16(
    tanh: np.ndarray, y: np.ndarray, mean: np.ndarray, rstd: np.ndarray, out: np.ndarray
) -> None:
    """out = f32_to_bf16(((tanh + 1) · 0.5) · z), z = (y - mean) · rstd computed again as
    halves() did (the same operations, so the same bits: reading y again costs less than
    writing and reading z): InstanceNorm + SiLU's end from y and tanh(z / 2), into uint16
    out [n, C] (any strides)."""
    row = np.empty(y.shape[1], F32)
    bits = row.view(np.uint32)
    for i in range(y.shape[0]):
        for j in range(y.shape[1]):
            z = (y[i, j] - mean[j]) * rstd[j]
            row[j] = ((tanh[i, j] + F32(1.0)) * F32(0.5)) * z
        for j in range(y.shape[1]):
            out[i, j] = _bf16(bits[j])


@njit(nogil=True, cache=True)
def widen(bits: np.ndarray, out: np.ndarray) -> None:
    """out = the float32 bits of bf16 bits (bf16_to_f32): bits uint16 and out uint32 (a
    view of the float32 destination) [n, C], any strides."""
    for i in range(bits.shape[0]):
        for j in range(bits.shape[1]):
            out[i, j] = U32(bits[i, j]) << U32(16)


@njit(nogil=True, cache=True)
def add_bf16(x: np.ndarray, bits: np.ndarray) -> None:
    """x += bf16_to_f32(bits) in place: x float32 and bits uint16 [n, C] (any strides)."""
    row = np.empty(x.shape[1], F32)
    wide = row.view(np.uint32)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            wide[j] = U32(bits[i, j]) << U32(16)
        for j in range(x.shape[1]):
            x[i, j] += row[j]


@njit(nogil=True, cache=True)
def rms_bf16(x: np.ndarray, eps: np.float32, out: np.ndarray) -> None:
    """out = f32_to_bf16(rms_norm(x)): x float32 [n, C] -> uint16 [n, C] (any strides); the
    mean of squares is numpy's pairwise sum over the row, divided as np.mean does."""
    c = x.shape[1]
    sq = np.empty(c, F32)
    row = np.empty(c, F32)
    bits = row.view(np.uint32)
    stack = np.zeros((3, 64), np.int64)
    sums = np.zeros(64, F32)
    for i in range(x.shape[0]):
        for j in range(c):
            sq[j] = x[i, j] * x[i, j]
        ms = F32(np.float64(_pairwise(sq, c, stack, sums)) / np.float64(c))
        inv = F32(1.0) / np.sqrt(ms + eps)
        for j in range(c):
            row[j] = x[i, j] * inv
        for j in range(c):
            out[i, j] = _bf16(bits[j])


@njit(nogil=True, cache=True)
def add_rms_bf16(
    x: np.ndarray, bits: np.ndarray, bias: np.ndarray, eps: np.float32, out: np.ndarray
) -> None:
    """The residual add and the next norm in one pass over x: x += bf16_to_f32(bits), then
    x += bias (per column, when bias has C values; else none), in place; then out =
    f32_to_bf16(rms_norm(x)) of the updated rows, as rms_bf16. x float32 [n, C], bits and out
    uint16 [n, C] (any strides)."""
    c = x.shape[1]
    biased = bias.shape[0] == c
    sq = np.empty(c, F32)
    row = np.empty(c, F32)
    wide = row.view(np.uint32)
    stack = np.zeros((3, 64), np.int64)
    sums = np.zeros(64, F32)
    for i in range(x.shape[0]):
        for j in range(c):
            wide[j] = U32(bits[i, j]) << U32(16)
        for j in range(c):
            x[i, j] += row[j]
        if biased:
            for j in range(c):
                x[i, j] += bias[j]
        for j in range(c):
            sq[j] = x[i, j] * x[i, j]
        ms = F32(np.float64(_pairwise(sq, c, stack, sums)) / np.float64(c))
        inv = F32(1.0) / np.sqrt(ms + eps)
        for j in range(c):
            row[j] = x[i, j] * inv
        for j in range(c):
            out[i, j] = _bf16(wide[j])


@njit(nogil=True, cache=True)
def widen_transposed(c: np.ndarray, c_stride: int, p0: int, p1: int, out: np.ndarray) -> None:
    """out[k, p] = the float32 bits of bf16 c[p·c_stride + k], p in [p0, p1), k < K: the
    predictor's C (uint16, flat) into heatmaps (out uint32 [K, pixels], a float32 view), in
    blocks of 64 pixels so the reads stay in cache."""
    k_count = out.shape[0]
    for b0 in range(p0, p1, 64):
        b1 = min(b0 + 64, p1)
        for k in range(k_count):
            dst = out[k]
            for p in range(b0, b1):
                dst[p] = U32(c[p * c_stride + k]) << U32(16)
