"""Heatmaps -> keypoints, as HF's Sapiens2 post_process_pose_estimation.

Argmax (first maximum), one DARK/UDP Newton step on the log of the max-preserving Gaussian
blur (kernel 11, sigma 2, zero borders), mapped back through the crop window. Reference:
transformers 5.23.0 models/sapiens2/image_processing_sapiens2.py (docs/pose.md).

The blur is evaluated only at the 3x3 neighbourhood of each argmax, each value from its
11x11 zero-padded window (separably). The max-preserving rescale by s = max(m)/max(blur(m))
needs the maximum of the whole blurred map, but it cancels out of the Newton step: the step
uses differences of ln(clip(s·B, 1e-3, 50)), and where no clip engages these equal
differences of ln B. Since blur weights sum to at most 1, max(B) <= max(m), so s >= 1;
and s·B <= max(m). Hence if every neighbourhood value B >= 1e-3 and max(m) <= 50, no clip
engages for any admissible s and the step is computed from ln B exactly. Only maps failing
that test (weak or very strong peaks) are blurred in full, in float32 as HF's, to get s.

Score <= 0: HF sets the location to (-1, -1) and then reads the replicate-padded log map
at flat offsets from padded (0, 0), which wrap into the previous map (or the end of the
batch); its refined coordinates there are artefacts. Here such keypoints keep the location
(-1, -1) unrefined (equivalent to clamping every lookup to the map), mapped through the
window like any other; their score is the raw maximum, as HF's.
"""

from __future__ import annotations

import cv2
import numpy as np

from pipeline.errors import NpucamError

BLUR_KERNEL = 11


LOG_CLIP = (1e-3, 50.0)


F32_EPS = float(np.finfo(np.float32).eps)


class HeatmapError(NpucamError):
    """Heatmaps or windows that cannot be decoded."""


def gaussian_taps(kernel: int = BLUR_KERNEL) -> np.ndarray:
    """Normalised 1-D Gaussian taps, float64 [kernel], sigma from OpenCV's rule for sigma=0."""
    if kernel % 2 == 0 or kernel <= 1:
        raise HeatmapError(f"blur kernel must be an odd integer > 1, got {kernel}")
    sigma = 0.3 * ((kernel - 1) * 0.5 - 1) + 0.8
    t = np.arange(kernel, dtype=np.float64) - (kernel - 1) / 2
    taps = np.exp(-0.5 * (t / sigma) ** 2)
    return taps / taps.sum()


def _blur_max(flat: np.ndarray, rows: np.ndarray, h: int, w: int, taps: np.ndarray) -> np.ndarray:
    """The maximum of the zero-bordered blur of maps flat[rows] (flat float32 [M, H*W]):
    float64 [len(rows)].

    One map at a time through OpenCV's float32 separable filter (BORDER_CONSTANT: zeros)
    into one reused map, so nothing of the size of all maps is made. HF blurs in float32
    too (torchvision's gaussian_blur): the maximum is as exact as the reference's.
    """
    taps32 = taps.astype(np.float32)
    blurred = np.empty((h, w), np.float32)
    top = np.empty(len(rows), np.float64)
    for i, r in enumerate(rows):
        cv2.sepFilter2D(flat[r].reshape(h, w), cv2.CV_32F, taps32, taps32, dst=blurred,
                        borderType=cv2.BORDER_CONSTANT)  # fmt: skip
        top[i] = blurred.max()
    return top


def _blur_at(
    flat: np.ndarray, h: int, w: int, ys: np.ndarray, xs: np.ndarray, taps: np.ndarray
) -> np.ndarray:
    """Blurred values at given points, each from its zero-padded window.

    flat: float32 [M, H*W]; ys: int [M, P], xs: int [M, Q] -> float64 [M, P, Q], the blur at
    every (ys[:, p], xs[:, q]).
    """
    r = len(taps) // 2
    offs = np.arange(-r, r + 1)
    yy = ys[:, :, None] + offs  # [M, P, T]
    xx = xs[:, :, None] + offs  # [M, Q, T]
    y_ok = (yy >= 0) & (yy < h)
    x_ok = (xx >= 0) & (xx < w)
    idx = (
        np.clip(yy, 0, h - 1)[:, :, :, None, None] * w + np.clip(xx, 0, w - 1)[:, None, None, :, :]
    )  # [M, P, T, Q, T]
    vals = np.take_along_axis(flat, idx.reshape(len(flat), -1), axis=1).reshape(idx.shape)
    vals = vals.astype(np.float64) * (y_ok[:, :, :, None, None] & x_ok[:, None, None, :, :])
    return np.einsum("mptqs,t,s->mpq", vals, taps, taps, optimize=True)


def _check_windows(windows: np.ndarray, n: int) -> np.ndarray:
    win = np.asarray(windows, dtype=np.float64)
    if win.shape != (n, 4):
        raise HeatmapError(f"windows must be [{n}, 4] (cx, cy, w, h), got shape {win.shape}")
    if not np.all(np.isfinite(win)) or np.any(win[:, 2:] <= 0):
        bad = int(np.flatnonzero(~np.all(np.isfinite(win), axis=1) | np.any(win[:, 2:] <= 0, 1))[0])
        raise HeatmapError(f"windows[{bad}] = {win[bad].tolist()} is not a valid window")
    return win


def dark_keypoints(
    heatmaps: np.ndarray, windows: np.ndarray, kernel: int = BLUR_KERNEL
) -> np.ndarray:
    """Decode heatmaps to keypoints in image pixels.

    heatmaps: float32 [N, K, H, W]; windows: float [N, 4] as (cx, cy, w, h) of each crop's
    sampled region (from npu.models.sapiens2.preprocess.crop_persons).
    Returns float32 [N, K, 3] as (x, y, score), score = the heatmap maximum.
    """
    hm = np.asarray(heatmaps)
    if hm.ndim != 4 or min(hm.shape) == 0 or min(hm.shape[2:]) < 2:
        raise HeatmapError(
            f"heatmaps must be a non-empty [N, K, H, W] array with H, W >= 2, got {hm.shape}"
        )
    if hm.dtype != np.float32:
        raise HeatmapError(f"heatmaps must be float32, got dtype {hm.dtype}")
    n, k, h, w = hm.shape
    win = _check_windows(windows, n)
    taps = gaussian_taps(kernel)

    flat = hm.reshape(n * k, h * w)
    idx = np.argmax(flat, axis=1)  # first maximum, as torch.argmax
    score = np.take_along_axis(flat, idx[:, None], axis=1)[:, 0]
    if not np.all(np.isfinite(score)):
        bad = int(np.flatnonzero(~np.isfinite(score))[0])
        raise HeatmapError(f"heatmaps[{bad // k}, {bad % k}] contains NaN or inf")
    x = (idx % w).astype(np.int64)
    y = (idx // w).astype(np.int64)
    pos = score > 0

    # replicate padding of the log map = clamping the neighbour coordinates
    nx = np.clip(x[:, None] + np.arange(-1, 2), 0, w - 1)
    ny = np.clip(y[:, None] + np.arange(-1, 2), 0, h - 1)
    blur = _blur_at(flat, h, w, ny, nx, taps)  # [M, 3(y), 3(x)]

    lo, hi = LOG_CLIP
    exact = pos & ((blur.min(axis=(1, 2)) < lo) | (score > hi))
    if np.any(exact):
        # the clip may engage: the rescale factor is needed, from the whole blurred map
        rows = np.flatnonzero(exact)
        top = _blur_max(flat, rows, h, w, taps)
        scale = np.where(top > 0, score[rows] / np.where(top > 0, top, 1.0), 1.0)
        blur[rows] = np.clip(blur[rows] * scale[:, None, None], lo, hi)
    with np.errstate(divide="ignore", invalid="ignore"):
        log = np.log(np.where(pos[:, None, None], blur, 1.0))

    gx = 0.5 * (log[:, 1, 2] - log[:, 1, 0])
    gy = 0.5 * (log[:, 2, 1] - log[:, 0, 1])
    hxx = log[:, 1, 2] - 2 * log[:, 1, 1] + log[:, 1, 0] + F32_EPS
    hyy = log[:, 2, 1] - 2 * log[:, 1, 1] + log[:, 0, 1] + F32_EPS
    hxy = 0.5 * (
        log[:, 2, 2] - log[:, 1, 2] - log[:, 2, 1] + 2 * log[:, 1, 1]
        - log[:, 1, 0] - log[:, 0, 1] + log[:, 0, 0]
    )  # fmt: skip
    det = hxx * hyy - hxy * hxy
    with np.errstate(divide="ignore", invalid="ignore"):
        dx = (hyy * gx - hxy * gy) / det
        dy = (-hxy * gx + hxx * gy) / det
    kx = np.where(pos, x - dx, -1.0).reshape(n, k)
    ky = np.where(pos, y - dy, -1.0).reshape(n, k)

    cx, cy, ww, wh = (win[:, i, None] for i in range(4))
    out = np.empty((n, k, 3), dtype=np.float32)
    out[:, :, 0] = kx / (w - 1) * ww + cx - 0.5 * ww
    out[:, :, 1] = ky / (h - 1) * wh + cy - 0.5 * wh
    out[:, :, 2] = score.reshape(n, k)
    return out
