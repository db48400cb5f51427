"""npu.models.sapiens2.post.dark_keypoints against HF Sapiens2's post_process_pose_estimation.

Tolerance: 1e-3 image px. On peaked heatmaps (what a pose model emits) HF's float32 result is
met directly. On white-noise heatmaps the Newton step is ill-conditioned (tiny Hessians) and
HF's own float32 blur rounding moves its answer by ~1e-2 heatmap px (float32 vs float64 HF),
so there the reference is HF's same functions evaluated in float64, with eps set to float64's
as HF does for a float64 input.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers.models.sapiens2 import image_processing_sapiens2 as hf_ip

import npu.models.sapiens2.post as post
from npu.models.sapiens2.post import HeatmapError, dark_keypoints
from npu.models.sapiens2.preprocess import crop_windows

torch.set_num_threads(1)
PROCESSOR = hf_ip.Sapiens2ImageProcessor()


def _hf_keypoints(heatmaps: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    out = PROCESSOR.post_process_pose_estimation(
        SimpleNamespace(heatmaps=torch.from_numpy(heatmaps)), boxes=[boxes.tolist()]
    )[0]
    return np.stack([p["keypoints"].numpy() for p in out]), np.stack(
        [p["scores"].numpy() for p in out]
    )


def _peaked(rng, n, k, h, w, amp=(0.02, 1.2), noise=0.003) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    cx = rng.uniform(-3, w + 2, (n, k, 1, 1))
    cy = rng.uniform(-3, h + 2, (n, k, 1, 1))
    s = rng.uniform(1.5, 5, (n, k, 1, 1))
    a = rng.uniform(*amp, (n, k, 1, 1))
    hm = a * np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * s * s))
    return (hm + rng.normal(0, noise, (n, k, h, w))).astype(np.float32)


BOXES = np.array([[300.5, 120.25, 350.0, 700.0], [-50.0, -30.0, 1200.0, 800.0]], np.float32)


def test_full_size_peaked_heatmaps_match_hf():
    rng = np.random.default_rng(0)
    hm = _peaked(rng, 1, 308, 256, 192)
    ref, scores = _hf_keypoints(hm, BOXES[:1])
    kp = dark_keypoints(hm, crop_windows(BOXES[:1]))
    assert kp.shape == (1, 308, 3) and kp.dtype == np.float32
    np.testing.assert_array_equal(kp[..., 2], scores)
    assert np.all(scores > 0)
    assert np.abs(kp[..., :2] - ref).max() <= 1e-3


@pytest.mark.parametrize(
    ("amp", "what"),
    [((0.001, 0.02), "weak peaks: the low clip engages"), ((40.0, 80.0), "high clip engages")],
)
def test_peaks_where_the_log_clip_engages_match_hf(amp, what):
    rng = np.random.default_rng(1)
    hm = _peaked(rng, 2, 17, 64, 48, amp=amp, noise=amp[0] * 0.02)
    ref, _ = _hf_keypoints(hm, BOXES)
    kp = dark_keypoints(hm, crop_windows(BOXES))
    assert np.abs(kp[..., :2] - ref).max() <= 1e-3, what


def test_white_noise_heatmaps_match_hf_evaluated_in_float64(monkeypatch):
    rng = np.random.default_rng(2)
    hm = rng.random((2, 17, 64, 48), dtype=np.float32)
    t = torch.from_numpy(hm).double()
    loc, _ = hf_ip.get_keypoint_predictions(t)
    ref = hf_ip.post_dark_unbiased_data_processing(loc.double(), t).numpy()
    monkeypatch.setattr(post, "F32_EPS", float(np.finfo(np.float64).eps))
    # a window that maps heatmap px to themselves: x / 47 * 47 + 23.5 - 23.5
    kp = dark_keypoints(hm, np.array([[23.5, 31.5, 47.0, 63.0]] * 2))
    assert np.abs(kp[..., :2] - ref).max() <= 1e-3


def test_blurred_maxima_match_hfs_float32_blur_of_the_zero_padded_maps():
    # HF's gaussian_blur_preserve_max before its rescale: zero padding, torchvision's blur.
    # Both blur in float32 (11 + 11 taps): relative error a few float32 ulps of the maximum
    import torchvision.transforms.v2.functional as tvf

    rng = np.random.default_rng(3)
    flat = np.concatenate([_peaked(rng, 1, 5, 40, 30)[0], rng.normal(size=(3, 40, 30))])
    flat = flat.astype(np.float32).reshape(8, -1)
    rows = np.array([0, 2, 5, 6, 7])
    padded = torch.nn.functional.pad(torch.from_numpy(flat[rows].reshape(-1, 40, 30)), (5,) * 4)
    sigma = 0.3 * ((11 - 1) * 0.5 - 1) + 0.8
    ref = tvf.gaussian_blur(padded, [11, 11], [sigma, sigma])[:, 5:-5, 5:-5].amax(dim=(1, 2))
    top = post._blur_max(flat, rows, 40, 30, post.gaussian_taps())
    np.testing.assert_allclose(top, ref.numpy(), rtol=1e-6)


def test_first_maximum_wins_on_ties():
    hm = np.zeros((1, 1, 40, 30), np.float32)
    hm[0, 0, 10, 12] = hm[0, 0, 30, 20] = 1.0
    kp = dark_keypoints(hm, np.array([[14.5, 19.5, 29.0, 39.0]]))  # identity mapping
    # an isolated delta blurs symmetrically, so the Newton step is 0 at the first maximum
    np.testing.assert_allclose(kp[0, 0], [12.0, 10.0, 1.0], atol=1e-5)


def test_nonpositive_maps_keep_minus_one_unrefined():
    hm = np.full((1, 2, 8, 6), -0.5, np.float32)
    hm[0, 1, 3, 3] = 0.9
    win = np.array([[10.0, 20.0, 5.0, 7.0]])
    kp = dark_keypoints(hm, win)
    # (-1, -1) through the window: -1 / 5 * 5 + 10 - 2.5, -1 / 7 * 7 + 20 - 3.5
    np.testing.assert_allclose(kp[0, 0], [6.5, 15.5, -0.5], atol=1e-6)
    assert kp[0, 1, 2] == np.float32(0.9)


@pytest.mark.parametrize(
    ("heatmaps", "windows", "needle"),
    [
        (np.zeros((2, 3, 4), np.float32), np.zeros((2, 4)), "[N, K, H, W]"),
        (np.zeros((1, 3, 4, 4), np.float64), np.ones((1, 4)), "float32"),
        (np.zeros((0, 3, 4, 4), np.float32), np.ones((0, 4)), "non-empty"),
        (np.zeros((1, 3, 4, 1), np.float32), np.ones((1, 4)), "H, W >= 2"),
        (np.zeros((1, 3, 4, 4), np.float32), np.ones((2, 4)), "windows must be [1, 4]"),
        (np.zeros((1, 3, 4, 4), np.float32), [[1, 1, 0, 1]], "windows[0]"),
        (np.full((1, 1, 4, 4), np.nan, np.float32), np.ones((1, 4)), "NaN"),
    ],
)
def test_bad_input_raises_a_named_error(heatmaps, windows, needle):
    with pytest.raises(HeatmapError) as err:
        dark_keypoints(heatmaps, windows)
    assert needle in str(err.value)


@pytest.mark.parametrize(("k", "h", "w"), [(3, 5, 4), (7, 17, 13), (2, 40, 11)])
def test_any_heatmap_size_matches_hf(k, h, w):
    rng = np.random.default_rng(h * w)
    hm = _peaked(rng, 2, k, h, w, amp=(0.2, 1.0), noise=0.002)
    ref, scores = _hf_keypoints(hm, BOXES)
    kp = dark_keypoints(hm, crop_windows(BOXES))
    np.testing.assert_array_equal(kp[..., 2], scores)
    assert np.abs(kp[..., :2] - ref).max() <= 1e-3
