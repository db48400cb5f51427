"""Sapiens2's host glue on a device, as the replay runs it: float32 work in row chunks on the
host thread pool (npu.rows) that reads bf16 straight from the device buffers' mappings and
writes bf16 straight into them, through per-thread chunk scratch and a few buffers reused
from box to box, never a temporary of a whole activation.

Every function computes bit for bit what model.py's float32 reference glue followed by
npu.bf16.f32_to_bf16 computes (the same float32 operations in the same order, on the same
rows; reductions over pixels stay one BLAS call over the whole array, as the reference's):
tests/npu/models/test_sapiens2_host.py checks each on random inputs.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import numpy as np

from npu.bf16 import bf16_to_f32_into, f32_to_bf16_into
from npu.rows import RowPool

F32 = np.float32
CHUNK_ELEMS = 1 << 16  # elements per chunk and array: a few chunk arrays fit a core's L2

RowWriter = Callable[[int, int, np.ndarray], None]  # (r0, r1, float32 rows [r1 - r0, C])

_local = threading.local()


def scratch(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """This thread's float32 scratch array `name` of `shape` (grown once, then reused)."""
    pads = _local.__dict__.setdefault("pads", {})
    n = math.prod(shape)
    buf = pads.get(name)
    if buf is None or buf.size < n:
        buf = pads[name] = np.empty(max(n, 1), F32)
    return buf[:n].reshape(shape)


def chunk_rows(cols: int, align: int = 1) -> int:
    """Rows per chunk for rows `cols` wide (a multiple of `align` rows)."""
    rows = max(1, CHUNK_ELEMS // max(cols, 1))
    return max(align, rows // align * align)


def rms_into(x: np.ndarray, eps: float, out: np.ndarray) -> np.ndarray:
    """model.rms_norm(x, eps) into `out` (float32, x's shape, may be x itself)."""
    np.square(x, out=out)
    ms = np.mean(out, axis=-1, keepdims=True, dtype=F32)
    return np.multiply(x, F32(1.0) / np.sqrt(ms + F32(eps)), out=out)


def put_rms(pool: RowPool, x: np.ndarray, eps: float, dst: np.ndarray) -> None:
    """dst = f32_to_bf16(rms_norm(x)): x float32 [T, D], dst uint16 [T, D] (a mapping)."""
    d = x.shape[1]

    def rows(r0: int, r1: int) -> None:
        f32_to_bf16_into(rms_into(x[r0:r1], eps, scratch("rms", (r1 - r0, d))), dst[r0:r1])

    pool.run(len(x), chunk_rows(d), rows)


def add_rows(pool: RowPool, x: np.ndarray, bits: np.ndarray) -> None:
    """x += bf16_to_f32(bits) in place: x float32 [T, D], bits uint16 [T, D] (any strides)."""
    d = x.shape[1]

    def rows(r0: int, r1: int) -> None:
        xc = x[r0:r1]
        xc += bf16_to_f32_into(bits[r0:r1], scratch("add", xc.shape))

    pool.run(len(x), chunk_rows(d), rows)


def read_rows(pool: RowPool, bits: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = bf16_to_f32(bits): bits uint16 [rows, C] (any strides), out float32 [rows, C]."""

    def rows(r0: int, r1: int) -> None:
        bf16_to_f32_into(bits[r0:r1], out[r0:r1])

    pool.run(len(out), chunk_rows(out.shape[1]), rows)
    return out


def stage_rows(
    pool: RowPool,
    qkv: np.ndarray,
    dst: np.ndarray,
    stage: Callable[[np.ndarray, int, int, np.ndarray], np.ndarray],
) -> None:
    """The attention's staged rows into dst: for each row chunk [r0, r1) of qkv (uint16
    [T, w], the qkv GEMM's C), stage(float32 rows, r0, r1, out float32 [r1 - r0, 3D])
    returns the staged float32 rows (model.stage_attention's), rounded into dst (uint16
    [T, 3D])."""
    w, width = qkv.shape[1], dst.shape[1]

    def rows(r0: int, r1: int) -> None:
        f = bf16_to_f32_into(qkv[r0:r1], scratch("qkv", (r1 - r0, w)))
        f32_to_bf16_into(stage(f, r0, r1, scratch("stage", (r1 - r0, width))), dst[r0:r1])

    pool.run(len(qkv), chunk_rows(width), rows)


def pairs_view(a: np.ndarray, h0: int, w0: int, c: int) -> np.ndarray:
    """The deconv GEMM's A rows in a uint16 mapping as [h0 + 1, w0 + 2, 2, C]: window (y, x),
    part p holds xp[y + p][x] of the input zero-padded by 1 (model.deconv_pairs)."""
    return a[: (h0 + 1) * (w0 + 2) * 2 * c].reshape(h0 + 1, w0 + 2, 2, c)


def zero_pair_pads(pairs: np.ndarray) -> None:
    """The zeros of model.deconv_pairs (the padding border) in a pairs_view."""
    pairs[:, 0] = 0
    pairs[:, -1] = 0
    pairs[0, :, 0] = 0
    pairs[-1, :, 1] = 0


def pair_writer(pairs: np.ndarray) -> RowWriter:
    """A RowWriter of image pixels (rows = whole image rows of w0 pixels) into a pairs_view:
    pixel (oy, ox) goes to window (oy + 1, ox + 1) part 0 and window (oy, ox + 1) part 1."""
    w0, c = pairs.shape[1] - 2, pairs.shape[3]

    def write(r0: int, r1: int, rows: np.ndarray) -> None:
        y0, y1 = r0 // w0, r1 // w0
        part0 = pairs[y0 + 1 : y1 + 1, 1:-1, 0]
        f32_to_bf16_into(rows.reshape(y1 - y0, w0, c), part0)
        pairs[y0:y1, 1:-1, 1] = part0

    return write


def dense_writer(a: np.ndarray, c: int) -> RowWriter:
    """A RowWriter of rows into a uint16 mapping as dense [rows, C] (a 1x1 conv's A)."""

    def write(r0: int, r1: int, rows: np.ndarray) -> None:
        f32_to_bf16_into(rows, a[r0 * c : r1 * c].reshape(r1 - r0, c))

    return write


def rms_rows_to(pool: RowPool, x: np.ndarray, eps: float, align: int, write: RowWriter) -> None:
    """write(r0, r1, rms_norm(x[r0:r1])) for chunks of whole `align`-row groups of x
    (float32 [rows, C]): the final norm into the first deconv's pairs."""
    c = x.shape[1]

    def rows(r0: int, r1: int) -> None:
        write(r0, r1, rms_into(x[r0:r1], eps, scratch("rms", (r1 - r0, c))))

    pool.run(len(x), chunk_rows(c, align), rows)


def scatter_into(
    pool: RowPool,
    c: np.ndarray,
    h0: int,
    w0: int,
    n: int,
    c_out: int,
    bias: np.ndarray | None,
    y: np.ndarray,
) -> None:
    """model.deconv_scatter of the 4-phase GEMM's C (uint16, read at row stride n: window
    r = sy·(w0+2) + sx at r·n, phase (2a+b) at columns (2a+b)·C_out) plus the phase's bias,
    into y float32 [2h0, 2w0, C_out]."""
    y5 = y.reshape(h0, 2, w0, 2, c_out)
    item = c.itemsize
    strides = ((w0 + 2) * n * item, n * item, item)

    def rows(r0: int, r1: int) -> None:
        for a in (0, 1):
            for b in (0, 1):
                phase = 2 * a + b
                start = ((r0 + a) * (w0 + 2) + b) * n + phase * c_out
                win = np.lib.stride_tricks.as_strided(
                    c[start:], (r1 - r0, w0, c_out), strides, writeable=False
                )
                out = y5[r0:r1, a, :, b]
                bf16_to_f32_into(win, out)
                if bias is not None:
                    out += bias[phase * c_out : (phase + 1) * c_out]

    pool.run(h0, max(1, chunk_rows(4 * w0 * c_out)), rows)


def instance_norm_silu_to(
    pool: RowPool,
    y: np.ndarray,
    eps: float,
    sq: np.ndarray,
    align: int,
    write: RowWriter,
) -> None:
    """model.instance_norm_silu(y) handed to write(r0, r1, rows) in chunks of whole
    `align`-row groups. y float32 [pixels, C] is centred and scaled in place; sq (float32,
    y's shape) holds the squares for the variance. Both channel sums are one BLAS reduction
    over all pixels, as the reference's."""
    px, c = y.shape
    n = F32(px)
    ones = np.ones(px, F32)
    mean = (ones @ y) / n
    chunk = chunk_rows(c, align)

    def centre(r0: int, r1: int) -> None:
        yc = y[r0:r1]
        yc -= mean
        np.multiply(yc, yc, out=sq[r0:r1])

    pool.run(px, chunk, centre)
    rstd = F32(1.0) / np.sqrt((ones @ sq) / n + F32(eps))

    def silu(r0: int, r1: int) -> None:
        yc = y[r0:r1]
        yc *= rstd
        t = np.multiply(yc, F32(0.5), out=scratch("silu", yc.shape))
        np.tanh(t, out=t)
        t += F32(1.0)
        t *= F32(0.5)
        t *= yc
        write(r0, r1, t)

    pool.run(px, chunk, silu)


def heatmaps_into(pool: RowPool, c: np.ndarray, px: int, c_stride: int, out: np.ndarray) -> None:
    """out[k, p] = bf16_to_f32(c[p·c_stride + k]) for k < K: the predictor's C (uint16)
    transposed into heatmaps float32 [K, px]."""
    k = out.shape[0]
    view = np.lib.stride_tricks.as_strided(c, (px, k), (c_stride * c.itemsize, c.itemsize))

    def rows(p0: int, p1: int) -> None:
        bf16_to_f32_into(view[p0:p1].T, out[:, p0:p1])

    pool.run(px, chunk_rows(k), rows)
