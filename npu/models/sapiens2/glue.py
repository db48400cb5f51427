"""Sapiens2's host glue on a device, as the replay runs it: float32 work in row chunks on the
host thread pool (npu.rows) that reads bf16 straight from the device buffers' mappings and
writes bf16 straight into them, through per-thread chunk scratch and a few buffers reused
from box to box, never a temporary of a whole activation. The passes numpy would make one
operation at a time are fused in npu.models.sapiens2.kernels.

Every function computes bit for bit what model.py's float32 reference glue followed by
npu.bf16.f32_to_bf16 computes (the same float32 operations in the same order, on the same
rows; InstanceNorm's mean and variance the reference's float64 block sums, in its order):
tests/npu/models/test_sapiens2_glue.py checks each on random inputs.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator

import numpy as np

from npu.bf16 import f32_to_bf16_into
from npu.models.sapiens2 import kernels
from npu.models.sapiens2.model import IN_BLOCK, mean_of_blocks
from npu.rows import RowPool

F32 = np.float32
CHUNK_ELEMS = 1 << 17  # elements per chunk and array: a few chunk arrays fit a core's L2
# elements of host work between the points where the thread driving the steps may turn to
# another computation's device step (Pieces yield () there: stages.device_thread.Interleaved)
PIECE_ELEMS = 1 << 20
Pieces = Iterator[tuple[()]]

# fill(lo, hi, dst): rows [lo, hi) of a chunk, as bf16 into dst (uint16 [hi - lo, C])
Fill = Callable[[int, int, np.ndarray], None]
# write(r0, r1, fill): a chunk's rows [r0, r1) into their places in a device mapping
RowWriter = Callable[[int, int, Fill], None]

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


def in_pieces(
    pool: RowPool, rows: int, cols: int, align: int, fn: Callable[[int, int], None]
) -> Pieces:
    """fn(r0, r1) over [0, rows) in row chunks on the pool, in pieces of about PIECE_ELEMS
    values (whole `align`-row groups), yielding () after each piece."""
    chunk = chunk_rows(cols, align)
    step = max(chunk, PIECE_ELEMS // max(cols, 1) // chunk * chunk)
    for b0 in range(0, rows, step):
        b1 = min(rows, b0 + step)
        pool.run(b1 - b0, chunk, lambda r0, r1, b0=b0: fn(b0 + r0, b0 + r1))
        yield ()


def widen(bits: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = bf16_to_f32(bits): uint16 and float32 [n, C], any strides; returns out."""
    kernels.widen(bits, out.view(np.uint32))
    return out


def put_rms(pool: RowPool, x: np.ndarray, eps: float, dst: np.ndarray) -> None:
    """dst = f32_to_bf16(rms_norm(x)): x float32 [T, D], dst uint16 [T, D] (a mapping)."""
    d = x.shape[1]

    def rows(r0: int, r1: int) -> None:
        kernels.rms_bf16(x[r0:r1], F32(eps), dst[r0:r1])

    pool.run(len(x), chunk_rows(d), rows)


def add_rows(pool: RowPool, x: np.ndarray, bits: np.ndarray) -> None:
    """x += bf16_to_f32(bits) in place: x float32 [T, D], bits uint16 [T, D] (any strides)."""
    d = x.shape[1]

    def rows(r0: int, r1: int) -> None:
        kernels.add_bf16(x[r0:r1], bits[r0:r1])

    pool.run(len(x), chunk_rows(d), rows)


def add_put_rms(
    pool: RowPool,
    x: np.ndarray,
    bits: np.ndarray,
    bias: np.ndarray | None,
    eps: float,
    dst: np.ndarray,
) -> None:
    """add_rows (then x += bias, if any), then put_rms, in one pass over each chunk: x float32
    [T, D] updated in place, bits uint16 [T, D] (any strides), bias float32 [D] or None,
    dst uint16 [T, D] (a mapping)."""
    d = x.shape[1]
    b = np.empty(0, F32) if bias is None else np.asarray(bias, F32)

    def rows(r0: int, r1: int) -> None:
        kernels.add_rms_bf16(x[r0:r1], bits[r0:r1], b, F32(eps), dst[r0:r1])

    pool.run(len(x), chunk_rows(d), rows)


def read_rows(pool: RowPool, bits: np.ndarray, out: np.ndarray) -> Pieces:
    """out = bf16_to_f32(bits): bits uint16 [rows, C] (any strides), out float32 [rows, C]."""

    def rows(r0: int, r1: int) -> None:
        widen(bits[r0:r1], out[r0:r1])

    yield from in_pieces(pool, len(out), out.shape[1], 1, rows)


def stage_rows(
    pool: RowPool,
    qkv: np.ndarray,
    dst: np.ndarray,
    stage: Callable[[np.ndarray, int, int, np.ndarray], np.ndarray],
) -> Pieces:
    """The attention's staged rows into dst: for each row chunk [r0, r1) of qkv (uint16
    [T, w], the qkv GEMM's C), stage(its bf16 rows, r0, r1, dst's rows) stages them
    (model.stage_attention's) rounded to bf16 into dst's rows (uint16 [T, 3D]) and returns
    those, or returns float32 rows of its own, rounded into dst here."""

    def rows(r0: int, r1: int) -> None:
        staged = stage(qkv[r0:r1], r0, r1, dst[r0:r1])
        if staged.dtype != np.uint16:
            f32_to_bf16_into(staged, dst[r0:r1])

    yield from in_pieces(pool, len(qkv), dst.shape[1], 1, rows)


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
    w0 = pairs.shape[1] - 2

    def write(r0: int, r1: int, fill: Fill) -> None:
        y0, y1 = r0 // w0, r1 // w0
        for y in range(y0, y1):
            fill((y - y0) * w0, (y - y0 + 1) * w0, pairs[y + 1, 1:-1, 0])
        pairs[y0:y1, 1:-1, 1] = pairs[y0 + 1 : y1 + 1, 1:-1, 0]

    return write


def dense_writer(a: np.ndarray, c: int) -> RowWriter:
    """A RowWriter of rows into a uint16 mapping as dense [rows, C] (a 1x1 conv's A)."""

    def write(r0: int, r1: int, fill: Fill) -> None:
        fill(0, r1 - r0, a[r0 * c : r1 * c].reshape(r1 - r0, c))

    return write


def rms_rows_to(pool: RowPool, x: np.ndarray, eps: float, align: int, write: RowWriter) -> None:
    """rms_norm(x) as bf16 through write, in chunks of whole `align`-row groups of x
    (float32 [rows, C]): the final norm into the first deconv's pairs."""
    c = x.shape[1]

    def rows(r0: int, r1: int) -> None:
        xc = x[r0:r1]

        def fill(lo: int, hi: int, dst: np.ndarray) -> None:
            kernels.rms_bf16(xc[lo:hi], F32(eps), dst)

        write(r0, r1, fill)

    pool.run(len(x), chunk_rows(c, align), rows)


def deconv_rows(h0: int, w0: int, n: int, c_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Where model.deconv_scatter finds each output pixel in the 4-phase GEMM's C (read at
    row stride n: window r = sy·(w0+2) + sx at r·n, phase 2a+b at columns (2a+b)·C_out):
    (offs, boffs) int64 [2h0·2w0] of pixel (2sy+a, 2sx+b) row-major: its C offset
    ((sy+a)·(w0+2) + sx+b)·n + (2a+b)·C_out, and its bias offset (2a+b)·C_out."""
    a = np.arange(2 * h0) % 2
    b = np.arange(2 * w0) % 2
    sy = np.arange(2 * h0) // 2
    sx = np.arange(2 * w0) // 2
    phase = (2 * a[:, None] + b[None, :]) * c_out
    window = (sy + a)[:, None] * (w0 + 2) + (sx + b)[None, :]
    return (window * n + phase).reshape(-1).astype(np.int64), phase.reshape(-1).astype(np.int64)


def conv_rows(px: int, c_stride: int) -> np.ndarray:
    """The C offsets int64 [px] of a 1x1 conv's output rows read at row stride c_stride."""
    return np.arange(px, dtype=np.int64) * c_stride


def instance_norm_silu_to(
    pool: RowPool,
    c: np.ndarray,
    offs: np.ndarray,
    bias: np.ndarray | None,
    boffs: np.ndarray | None,
    ch: int,
    eps: float,
    align: int,
    write: RowWriter,
) -> Pieces:
    """model.instance_norm_silu(y) as bf16 through write, in chunks of whole `align`-row
    groups, where y's row p is bf16_to_f32(c[offs[p]:][:ch]) (+ bias[boffs[p]:][:ch]): a
    GEMM's C (uint16, flat) read in place (deconv_rows, conv_rows), never a float32 copy of
    all of y. Each pass widens the rows again: a row at a time for the mean's and the
    variance's float64 block sums (model.block_sums, block_square_sums, in chunks of whole
    blocks), a chunk into per-thread scratch for tanh (numpy's) and the end of SiLU."""
    px = len(offs)
    if px and int(offs.max()) + ch > len(c):
        raise ValueError(f"rows up to offset {int(offs.max())} + {ch} of a C of {len(c)} values")
    b = np.empty(0, F32) if bias is None else np.asarray(bias, F32)
    bo = offs if boffs is None else boffs

    def rows_of(r0: int, r1: int) -> np.ndarray:
        y = scratch("in.y", (r1 - r0, ch))
        kernels.gather_rows(c, offs[r0:r1], b, bo[r0:r1], y)
        return y

    block = IN_BLOCK
    sums = np.empty((-(-px // block), ch), np.float64)

    def total(r0: int, r1: int) -> None:
        kernels.block_sums(
            c, offs[r0:r1], b, bo[r0:r1], ch, block, sums[r0 // block : -(-r1 // block)]
        )

    yield from in_pieces(pool, px, ch, block, total)
    mean = mean_of_blocks(sums, px)

    def centre(r0: int, r1: int) -> None:
        kernels.block_square_sums(c, offs[r0:r1], b, bo[r0:r1], mean, block,
                                  sums[r0 // block : -(-r1 // block)])  # fmt: skip

    yield from in_pieces(pool, px, ch, block, centre)
    rstd = F32(1.0) / np.sqrt(mean_of_blocks(sums, px) + F32(eps))

    def silu(r0: int, r1: int) -> None:
        yc = rows_of(r0, r1)
        t = scratch("silu.t", yc.shape)
        kernels.halves(yc, mean, rstd, t)
        np.tanh(t, out=t)

        def fill(lo: int, hi: int, dst: np.ndarray) -> None:
            kernels.silu_bf16(t[lo:hi], yc[lo:hi], mean, rstd, dst)

        write(r0, r1, fill)

    yield from in_pieces(pool, px, ch, align, silu)


def heatmaps_into(pool: RowPool, c: np.ndarray, px: int, c_stride: int, out: np.ndarray) -> Pieces:
    """out[k, p] = bf16_to_f32(c[p·c_stride + k]) for k < K: the predictor's C (uint16)
    transposed into heatmaps float32 [K, px]."""
    wide = out.view(np.uint32)

    def rows(p0: int, p1: int) -> None:
        kernels.widen_transposed(c, c_stride, p0, p1, wide)

    yield from in_pieces(pool, px, out.shape[0], 64, rows)
