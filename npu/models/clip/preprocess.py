"""CLIP image preprocessing: uint8 RGB -> float32 [3, 224, 224], bit for bit as HF's default.

transformers 5.23.0's `CLIPImageProcessor` is the torchvision backend: on CPU it resizes the
uint8 tensor with torch's antialiased bicubic (a = -0.5) fixed-point kernel (int16 weights at a
per-axis precision, horizontal pass then vertical, each rounded and clamped to uint8), centre
crops, and normalises in float32 as `(v - mean·255) / (std·255)`. This module does the same
arithmetic in numpy, computing only the output pixels the centre crop keeps.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from pipeline.errors import NpucamError

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
RESIZE_SHORTEST = 224
CROP = 224
_CUBIC_A = -0.5
_BLOCK = 16  # outputs per dense block of the band
_ROW_CHUNK = 512  # image rows per horizontal-pass chunk


class ImageInputError(NpucamError):
    """An image the preprocessor cannot take (dtype, shape, size)."""


def resized_size(height: int, width: int, shortest: int = RESIZE_SHORTEST) -> tuple[int, int]:
    """HF's shortest-edge size: the short side becomes `shortest`, the long int(shortest·l/s)."""
    if width <= height:
        return int(shortest * height / width), shortest
    return shortest, int(shortest * width / height)


def _cubic(x: np.ndarray) -> np.ndarray:
    """torch's antialias bicubic filter (Keys, a = -0.5), float64, same expression order."""
    a = _CUBIC_A
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def axis_weights(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Fixed-point resize taps of one axis, as torch's compute_index_ranges_int16_weights.

    Returns xmin int64 [out] (first input index of each output), weights int32 [out, taps]
    (zero beyond each output's support) and the precision p (weights are scaled by 2^p).
    """
    scale = in_size / out_size
    support = 2.0 * scale if scale >= 1.0 else 2.0
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    taps = int(np.ceil(support)) * 2 + 1
    center = scale * (np.arange(out_size, dtype=np.float64) + 0.5)
    xmin = np.maximum((center - support + 0.5).astype(np.int64), 0)
    xsize = np.minimum((center + support + 0.5).astype(np.int64), in_size) - xmin
    taps = min(taps, int(xsize.max()))
    weights = np.zeros((out_size, taps), dtype=np.float64)
    total = np.zeros(out_size, dtype=np.float64)
    for j in range(taps):
        w = _cubic((j + xmin - center + 0.5) * invscale)
        w = np.where(j < xsize, w, 0.0)
        weights[:, j] = w
        total += w
    nonzero = total != 0.0
    weights[nonzero] /= total[nonzero, None]
    wt_max = float(weights[nonzero].max()) if nonzero.any() else 0.0
    precision = 0
    while precision < 22 and int(0.5 + wt_max * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    scaled = weights * (1 << precision)
    fixed = np.trunc(np.where(scaled < 0, scaled - 0.5, scaled + 0.5)).astype(np.int32)
    return xmin, fixed, precision


@functools.lru_cache(maxsize=64)
def _banded_pass(in_size: int, out_size: int, start: int, count: int) -> _Pass:
    """Outputs [start, start+count) of one resized axis as dense blocks of the band.

    The pass works on pixels centred by -128, so every partial sum S = Σ (px-128)·w is an
    integer with |S| <= 128·Σ|w|. Dense weights are scaled by 2^-p (exact in binary), and
    torch's (Σ px·w + 2^(p-1)) >> p becomes floor(S/2^p + frac) + whole, where
    whole + frac (0 <= frac < 1) = (128·Σw + 2^(p-1)) / 2^p. float32 is exact when
    128·Σ|w| + 2^p < 2^24 (scale factors up to about 3); otherwise the pass runs in float64.
    """
    xmin, weights, precision = axis_weights(in_size, out_size)
    xmin, weights = xmin[start : start + count], weights[start : start + count]
    taps = weights.shape[1]
    reach = np.minimum(xmin + taps, in_size)
    first = int(xmin.min())
    bound = 128 * int(np.abs(weights).astype(np.int64).sum(axis=1).max()) + (1 << precision)
    dtype = np.float32 if bound < (1 << 24) else np.float64
    offset = 128 * weights.astype(np.int64).sum(axis=1) + (1 << (precision - 1))
    whole = offset >> precision
    frac = (offset - (whole << precision)) / float(1 << precision)
    blocks = []
    for o0 in range(0, count, _BLOCK):
        o1 = min(o0 + _BLOCK, count)
        lo, hi = int(xmin[o0:o1].min()), int(reach[o0:o1].max())
        dense = np.zeros((hi - lo, o1 - o0), dtype=np.float64)
        for o in range(o0, o1):
            n = int(reach[o] - xmin[o])
            dense[xmin[o] - lo : xmin[o] - lo + n, o - o0] = weights[o, :n]
        dense *= 1.0 / (1 << precision)
        blocks.append((o0, o1, lo - first, hi - first, dense.astype(dtype)))
    span = int(reach.max()) - first
    # the pass's output is centred again for the next one
    return _Pass(first, span, tuple(blocks), frac.astype(dtype), (whole - 128).astype(dtype))


class _Pass(NamedTuple):
    first: int
    span: int
    blocks: tuple[tuple[int, int, int, int, np.ndarray], ...]
    frac: np.ndarray  # [count]
    whole: np.ndarray  # [count], minus the 128 that centres the output

    @property
    def dtype(self) -> np.dtype:
        return self.frac.dtype


def _round_shift(acc: np.ndarray, frac: np.ndarray, whole: np.ndarray) -> np.ndarray:
    """acc = S/2^p -> torch's rounded, clamped uint8 result minus 128, in place."""
    acc += frac
    np.floor(acc, out=acc)
    acc += whole
    return np.clip(acc, -128.0, 127.0, out=acc)


def _row_pass(rows: np.ndarray, band: _Pass) -> np.ndarray:
    """Centred [span, n] -> [count, n]: one fixed-point pass along the first axis."""
    rows = rows.astype(band.dtype, copy=False)
    out = np.empty((band.blocks[-1][1], rows.shape[1]), dtype=band.dtype)
    for o0, o1, lo, hi, dense in band.blocks:
        np.matmul(dense.T, rows[lo:hi], out=out[o0:o1])
    return _round_shift(out, band.frac[:, None], band.whole[:, None])


def _column_pass(cols: np.ndarray, band: _Pass) -> np.ndarray:
    """Centred [n, span] -> [n, count]: one fixed-point pass along the last axis."""
    cols = cols.astype(band.dtype, copy=False)
    out = np.empty((cols.shape[0], band.blocks[-1][1]), dtype=band.dtype)
    for o0, o1, lo, hi, dense in band.blocks:
        np.matmul(cols[:, lo:hi], dense, out=out[:, o0:o1])
    return _round_shift(out, band.frac, band.whole)


def _horizontal(window: np.ndarray, band: _Pass) -> np.ndarray:
    """uint8 [n, 3, span] -> centred [n, 3, count]: the horizontal pass over some rows."""
    centred = np.empty(window.shape, dtype=band.dtype)
    np.subtract(window, 128, out=centred, dtype=band.dtype)
    n = window.shape[0]
    return _column_pass(centred.reshape(n * 3, -1), band).reshape(n, 3, -1)


def resize_crop(
    image: np.ndarray, resize_shortest: int = RESIZE_SHORTEST, crop: int = CROP
) -> np.ndarray:
    """uint8 [H, W, 3] -> float32 [3, crop, crop] of integers 0..255: HF's shortest-edge resize
    followed by its centre crop, computing only the kept pixels.

    Each pass is GEMMs over dense blocks of its band whose sums are exact (see _banded_pass).
    """
    height, width = image.shape[:2]
    out_h, out_w = resized_size(height, width, resize_shortest)
    if out_h < crop or out_w < crop:
        raise ImageInputError(f"resized image {out_h}x{out_w} is smaller than the {crop} crop")
    top = int((out_h - crop) / 2.0)
    left = int((out_w - crop) / 2.0)
    # torch skips a pass whose size is unchanged; the crop then only offsets that axis.
    xband = _banded_pass(width, out_w, left, crop) if out_w != width else None
    yband = _banded_pass(height, out_h, top, crop) if out_h != height else None
    cols = slice(xband.first, xband.first + xband.span) if xband else slice(left, left + crop)
    rows = slice(yband.first, yband.first + yband.span) if yband else slice(top, top + crop)
    # Work on [y, c, x]: the horizontal pass (first, as torch) contracts the last axis of
    # [y·c, x], the vertical pass the first axis of [y, c·x]; no transposes in between.
    window = image[rows, cols].transpose(0, 2, 1)
    h = window.shape[0]
    if xband and h <= _ROW_CHUNK:
        ycx = _horizontal(window, xband)
    elif xband:
        # rows are independent in this pass: chunks bound the float copy of a large image
        ycx = np.empty((h, 3, crop), dtype=xband.dtype)
        for y0 in range(0, h, _ROW_CHUNK):
            ycx[y0 : y0 + _ROW_CHUNK] = _horizontal(window[y0 : y0 + _ROW_CHUNK], xband)
    else:
        dtype = yband.dtype if yband else np.float32
        ycx = np.empty(window.shape, dtype=dtype)
        np.subtract(window, 128, out=ycx, dtype=dtype)
    ycx = ycx.reshape(h, 3 * crop)
    if yband:
        ycx = _row_pass(ycx, yband)
    out = np.empty((3, crop, crop), dtype=np.float32)
    np.add(ycx.reshape(crop, 3, crop).transpose(1, 0, 2), 128, out=out, dtype=np.float32)
    return out


def normalize(
    crop_chw: np.ndarray,
    mean: tuple[float, float, float] = OPENAI_CLIP_MEAN,
    std: tuple[float, float, float] = OPENAI_CLIP_STD,
) -> np.ndarray:
    """[3, h, w] pixel values (0..255, any dtype) -> float32 [3, h, w] = (v - mean·255) / (std·255),
    with HF's float32 ops."""
    # HF fuses rescale into normalize: float32 mean/std times float32(1 / (1/255)).
    factor = np.float32(1.0 / (1.0 / 255.0))
    m = (np.asarray(mean, dtype=np.float32) * factor)[:, None, None]
    s = (np.asarray(std, dtype=np.float32) * factor)[:, None, None]
    chw = np.subtract(np.asarray(crop_chw, dtype=np.float32), m)
    chw /= s
    return chw


def check_image(image_rgb: np.ndarray, what: str = "image") -> None:
    """Raise ImageInputError unless image_rgb is a non-empty uint8 [H, W, 3] array."""
    if not isinstance(image_rgb, np.ndarray):
        raise ImageInputError(f"{what}: expected a numpy array, got {type(image_rgb).__name__}")
    if image_rgb.dtype != np.uint8:
        raise ImageInputError(f"{what}: expected uint8 RGB, got dtype {image_rgb.dtype}")
    if image_rgb.ndim != 3 or image_rgb.shape[2] != 3:
        raise ImageInputError(f"{what}: expected shape [H, W, 3], got {image_rgb.shape}")
    if image_rgb.shape[0] == 0 or image_rgb.shape[1] == 0:
        raise ImageInputError(f"{what}: zero-size image {image_rgb.shape}")


def preprocess(
    image_rgb: np.ndarray,
    *,
    resize_shortest: int = RESIZE_SHORTEST,
    crop: int = CROP,
    mean: tuple[float, float, float] = OPENAI_CLIP_MEAN,
    std: tuple[float, float, float] = OPENAI_CLIP_STD,
) -> np.ndarray:
    """uint8 RGB [H, W, 3] -> float32 [3, crop, crop], equal to HF CLIPImageProcessor's output."""
    check_image(image_rgb)
    return normalize(resize_crop(image_rgb, resize_shortest, crop), mean, std)
