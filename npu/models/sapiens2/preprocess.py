"""Person boxes -> Sapiens2 input crops, as HF Sapiens2ImageProcessor's crop_and_resize.

Each COCO box is padded by 1.25, widened or heightened to the crop's aspect, and sampled on
an align-corners grid with torch.grid_sample semantics (zero padding; bilinear when the crop
shrinks the region, bicubic with A = -0.75 when it grows it), then ImageNet-normalised.
Reference: transformers 5.23.0 models/sapiens2/image_processing_sapiens2.py (docs/pose.md).
"""

from __future__ import annotations

import numpy as np

from npu.models.sapiens2.config import IMAGENET_MEAN, IMAGENET_STD
from pipeline.errors import NpucamError

CROP_SIZE = (1024, 768)


BOX_PADDING = 1.25


BICUBIC_A = -0.75


class CropError(NpucamError):
    """A crop request with an unusable image or box."""


def _check_image(image_rgb: np.ndarray) -> None:
    if not isinstance(image_rgb, np.ndarray):
        raise CropError(f"image_rgb must be a numpy array, got {type(image_rgb).__name__}")
    if image_rgb.dtype != np.uint8:
        raise CropError(f"image_rgb must be uint8, got dtype {image_rgb.dtype}")
    if image_rgb.ndim != 3 or image_rgb.shape[2] != 3:
        raise CropError(f"image_rgb must be [H, W, 3] RGB, got shape {image_rgb.shape}")
    if image_rgb.shape[0] < 2 or image_rgb.shape[1] < 2:
        raise CropError(f"image_rgb must be at least 2x2, got shape {image_rgb.shape}")


def _check_boxes(boxes_xywh: np.ndarray | list) -> np.ndarray:
    try:
        boxes = np.asarray(boxes_xywh, dtype=np.float64)
    except (TypeError, ValueError) as exc:  # ragged lists, non-numbers
        raise CropError(f"boxes_xywh is not an [N, 4] array of numbers: {exc}") from None
    if boxes.ndim == 1 and boxes.shape == (4,):
        boxes = boxes[None]
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise CropError(f"boxes_xywh must be [N, 4] (x, y, w, h), got shape {boxes.shape}")
    if boxes.shape[0] == 0:
        raise CropError("boxes_xywh is empty: at least one box is needed")
    for i, box in enumerate(boxes):
        if not np.all(np.isfinite(box)):
            raise CropError(f"boxes_xywh[{i}] = {box.tolist()} is not finite")
        if box[2] <= 0 or box[3] <= 0:
            raise CropError(f"boxes_xywh[{i}] = {box.tolist()} has a non-positive width or height")
    return boxes.astype(np.float32)


def crop_windows(
    boxes_xywh: np.ndarray, output_size: tuple[int, int] = CROP_SIZE, padding: float = BOX_PADDING
) -> np.ndarray:
    """The sampled window of each box: float32 [N, 4] as (cx, cy, w, h) in image pixels.

    boxes_xywh: float [N, 4] COCO boxes. Computed in float32 like HF's boxes_to_crop_params
    (box_xywh_to_cxcywh, then padding and aspect correction), so crops and keypoints built
    from these windows round exactly as HF's do.
    """
    boxes = _check_boxes(boxes_xywh)
    out_h, out_w = output_size
    x, y, w, h = boxes.T
    half = np.float32(0.5)
    aspect = np.float32(out_w / out_h)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported below
        cx = x + half * w
        cy = y + half * h
        sw = w * np.float32(padding)
        sh = h * np.float32(padding)
        wider = sw > sh * aspect
        win_w = np.where(wider, sw, sh * aspect)
        win_h = np.where(wider, sw / aspect, sh)
    windows = np.stack([cx, cy, win_w, win_h], axis=1).astype(np.float32)
    bad = ~np.all(np.isfinite(windows), axis=1) | np.any(windows[:, 2:] == 0, axis=1)
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        raise CropError(f"boxes_xywh[{i}] = {boxes[i].tolist()} is out of float32 range")
    return windows


def _source_coords(
    center: np.float32, size: np.float32, n_out: int, n_in: int
) -> tuple[np.ndarray, bool]:
    """Image coordinates sampled along one axis, float32 [n_out], with HF's rounding.

    HF builds the grid in float32 (j / scale + c - size/2), normalises it to [-1, 1] and
    grid_sample un-normalises it ((g + 1) * (n_in - 1) / 2); repeating that round trip keeps
    every sample point bit-identical. Also returns whether this axis shrinks (scale < 1).
    """
    # torch evaluates `int / tensor` as reciprocal(tensor) * int
    scale = (np.float32(1.0) / size) * np.float32(n_out - 1)
    grid = np.arange(n_out, dtype=np.float32) / scale + center - np.float32(0.5) * size
    norm = np.float32(2.0) * grid / np.float32(n_in - 1) - np.float32(1.0)
    coords = (norm + np.float32(1.0)) * np.float32((n_in - 1) / 2)
    return coords.astype(np.float32), bool(scale < 1)


def _cubic_weights(t: np.ndarray) -> np.ndarray:
    """Keys cubic convolution weights (A = -0.75) for taps -1, 0, 1, 2: float32 [..., 4]."""
    a = np.float32(BICUBIC_A)

    def near(x: np.ndarray) -> np.ndarray:
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: np.ndarray) -> np.ndarray:
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    one = np.float32(1.0)
    return np.stack([far(t + one), near(t), near(one - t), far(2 * one - t)], axis=-1)


def _taps(coords: np.ndarray, n_in: int, bicubic: bool) -> tuple[np.ndarray, np.ndarray]:
    """Source indices and weights along one axis: int [n_out, T], float32 [n_out, T].

    Taps outside the image get weight 0 (grid_sample's zero padding); their indices are
    clamped so the gather stays in bounds.
    """
    base = np.floor(coords)
    t = (coords - base).astype(np.float32)
    base = base.astype(np.int64)
    if bicubic:
        idx = base[:, None] + np.arange(-1, 3)[None, :]
        wts = _cubic_weights(t)
    else:
        idx = base[:, None] + np.arange(0, 2)[None, :]
        wts = np.stack([np.float32(1.0) - t, t], axis=-1)
    inside = (idx >= 0) & (idx < n_in)
    return np.clip(idx, 0, n_in - 1), np.where(inside, wts, np.float32(0.0)).astype(np.float32)


def _used(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct source indices the taps read, and each tap's position among them."""
    used, pos = np.unique(idx, return_inverse=True)
    return used, pos.reshape(idx.shape)


def _resample_rows(
    src: np.ndarray, idx: np.ndarray, wts: np.ndarray, block: int = 16
) -> np.ndarray:
    """out[i] = sum_t wts[i, t] * src[idx[i, t]]: float32 [S, F] -> float32 [n_out, F].

    The taps of consecutive outputs read a narrow band of rows (the grid is monotonic), so
    each block of outputs is one small dense GEMM over its band; weights of out-of-image
    taps are 0, so the band matrix holds exactly grid_sample's weights.
    """
    n_out = len(idx)
    out = np.empty((n_out, src.shape[1]), np.float32)
    for i0 in range(0, n_out, block):
        ib, wb = idx[i0 : i0 + block], wts[i0 : i0 + block]
        lo, hi = int(ib.min()), int(ib.max()) + 1
        band = np.zeros((len(ib), hi - lo), np.float32)
        rows = np.arange(len(ib))
        for t in range(ib.shape[1]):
            band[rows, ib[:, t] - lo] += wb[:, t]
        np.matmul(band, src[lo:hi], out=out[i0 : i0 + block])
    return out


def crop_persons(
    image_rgb: np.ndarray,
    boxes_xywh: np.ndarray,
    output_size: tuple[int, int] = CROP_SIZE,
    mean: tuple[float, float, float] = IMAGENET_MEAN,
    std: tuple[float, float, float] = IMAGENET_STD,
    padding: float = BOX_PADDING,
) -> tuple[np.ndarray, np.ndarray]:
    """Crop and normalise one Sapiens2 input per person box.

    image_rgb: uint8 [H, W, 3] in RGB order (convert OpenCV's BGR frames first).
    boxes_xywh: float [N, 4] COCO boxes (x, y, w, h) in image pixels.
    output_size: (height, width) of the crops; 1024 x 768 for the released models.
    mean, std: per-channel normalisation (ImageNet's); padding: the box scale (1.25).
    Returns crops float32 [N, 3, out_h, out_w] = (v - 255 mean) / (255 std) of the sampled
    values v (0..255 scale, bicubic may overshoot), and windows float32 [N, 4] as
    (cx, cy, w, h) of the sampled region, for mapping keypoints back.

    The grid is separable (x depends only on the column, y only on the row), so each crop
    is one horizontal pass over the pixels it touches and one vertical pass, each as banded
    GEMMs; both are exact reformulations of grid_sample's per-pixel sum (only the float32
    summation order differs).
    """
    _check_image(image_rgb)
    windows = crop_windows(boxes_xywh, output_size, padding)
    out_h, out_w = output_size
    in_h, in_w = image_rgb.shape[:2]
    mean255 = np.asarray(mean, dtype=np.float32) * np.float32(255.0)
    std255 = np.asarray(std, dtype=np.float32) * np.float32(255.0)
    crops = np.empty((len(windows), 3, out_h, out_w), dtype=np.float32)
    for n, (cx, cy, win_w, win_h) in enumerate(windows):
        with np.errstate(over="ignore", invalid="ignore"):
            xs, shrink_x = _source_coords(cx, win_w, out_w, in_w)
            ys, shrink_y = _source_coords(cy, win_h, out_h, in_h)
        if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))):
            box = np.asarray(boxes_xywh, dtype=np.float64).reshape(-1, 4)[n].tolist()
            raise CropError(f"boxes_xywh[{n}] = {box} is out of float32 range")
        bicubic = not (shrink_x or shrink_y)
        x_idx, x_w = _taps(xs, in_w, bicubic)
        y_idx, y_w = _taps(ys, in_h, bicubic)
        rows, row_tap = _used(y_idx)
        cols, col_tap = _used(x_idx)
        # only the pixels some tap reads, channel-first: float32 [3, R, C]
        r, c = len(rows), len(cols)
        src = np.empty((3, r, c), np.float32)
        if rows[-1] - rows[0] + 1 == r and cols[-1] - cols[0] + 1 == c:
            picked = image_rgb[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
        else:
            picked = image_rgb[rows[:, None], cols[None, :]]
        src[...] = picked.transpose(2, 0, 1)
        r, c = len(rows), len(cols)
        # horizontal pass on the transposed view: [C, 3R] -> [out_w, 3R]
        horiz = _resample_rows(src.reshape(3 * r, c).T, col_tap, x_w)
        horiz = horiz.reshape(out_w, 3, r)
        vert = np.empty((3, out_h, out_w), np.float32)
        for ch in range(3):
            vert[ch] = _resample_rows(horiz[:, ch, :].T, row_tap, y_w)
        np.subtract(vert, mean255[:, None, None], out=vert)
        np.divide(vert, std255[:, None, None], out=crops[n])
    return crops, windows
