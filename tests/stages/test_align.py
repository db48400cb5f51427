"""stages.align against scikit-image's SimilarityTransform + cv2.warpAffine (insightface's path).

Tolerances: the matrix within 1e-4 (both are the same Umeyama fit in float64; only the SVD
rounding differs), the crop within 1 grey level (cv2's fixed-point bilinear weights can round
a pixel differently when a matrix entry moves in its last bits).
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from skimage.transform import SimilarityTransform

from stages.align import (
    ARCFACE_TEMPLATE,
    ARCFACE_TEMPLATE_4PT,
    AlignError,
    align_face,
    align_face_4pt,
    blazeface_alignment_points,
    umeyama_similarity,
)


def _skimage_align(image, landmarks, template=ARCFACE_TEMPLATE, size=112):
    tform = SimilarityTransform.from_estimate(
        np.asarray(landmarks, np.float64), template * (size / 112.0)
    )
    m = tform.params[0:2, :]
    return cv2.warpAffine(image, m, (size, size), borderValue=0.0), m


def _random_face(rng, rotate_deg: float, mirror: bool, scale: float, centre) -> np.ndarray:
    pts = ARCFACE_TEMPLATE - ARCFACE_TEMPLATE.mean(axis=0)
    if mirror:
        pts = pts * np.array([-1.0, 1.0])
    th = np.deg2rad(rotate_deg)
    rot = np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]])
    pts = (pts @ rot.T) * scale + np.asarray(centre)
    return pts + rng.normal(0.0, 1.5 * scale, size=pts.shape)


@pytest.mark.parametrize("mirror", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_align_face_equals_skimage_similarity_and_warp(seed: int, mirror: bool) -> None:
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, size=(240, 320, 3), dtype=np.uint8)
    image = cv2.GaussianBlur(image, (5, 5), 0)  # smooth so 1-level checks are meaningful
    lmk = _random_face(
        rng,
        rotate_deg=rng.uniform(-180, 180),
        mirror=mirror,
        scale=rng.uniform(0.5, 2.5),
        centre=(rng.uniform(60, 260), rng.uniform(60, 180)),
    )
    crop, m = align_face(image, lmk)
    ref_crop, ref_m = _skimage_align(image, lmk)
    assert crop.shape == (112, 112, 3) and crop.dtype == np.uint8
    assert m.shape == (2, 3)
    np.testing.assert_allclose(m, ref_m, atol=1e-4)
    assert np.abs(crop.astype(int) - ref_crop.astype(int)).max() <= 1


def test_align_face_maps_template_to_itself_and_mirrored_faces_rotate_not_reflect() -> None:
    image = np.zeros((112, 112, 3), np.uint8)
    _, m = align_face(image, ARCFACE_TEMPLATE)
    np.testing.assert_allclose(m, np.hstack([np.eye(2), np.zeros((2, 1))]), atol=1e-9)
    mirrored = ARCFACE_TEMPLATE * np.array([-1.0, 1.0]) + np.array([112.0, 0.0])
    _, m = align_face(image, mirrored)
    assert np.linalg.det(m[:, :2]) > 0  # a rotation-scale, never a reflection


def test_align_face_scaled_template_and_channel_order_kept() -> None:
    rng = np.random.default_rng(3)
    image = rng.integers(0, 256, size=(200, 200, 3), dtype=np.uint8)
    lmk = ARCFACE_TEMPLATE * 1.5 + 10
    crop, m = align_face(image, lmk, size=224)
    ref_crop, ref_m = _skimage_align(image, lmk, size=224)
    np.testing.assert_allclose(m, ref_m, atol=1e-4)
    assert crop.shape == (224, 224, 3)
    crop_bgr, _ = align_face(image[..., ::-1].copy(), lmk, size=224)
    np.testing.assert_array_equal(crop_bgr, crop[..., ::-1])


def test_align_face_4pt_equals_skimage_on_four_points() -> None:
    rng = np.random.default_rng(7)
    image = rng.integers(0, 256, size=(160, 160, 3), dtype=np.uint8)
    pts = ARCFACE_TEMPLATE_4PT * 1.2 + rng.normal(0, 2, (4, 2)) + 5
    crop, m = align_face_4pt(image, pts)
    ref_crop, ref_m = _skimage_align(image, pts, template=ARCFACE_TEMPLATE_4PT)
    np.testing.assert_allclose(m, ref_m, atol=1e-4)
    assert np.abs(crop.astype(int) - ref_crop.astype(int)).max() <= 1
    np.testing.assert_allclose(ARCFACE_TEMPLATE_4PT[3], [56.1396, 92.2848], atol=1e-4)


def test_blazeface_points_take_eyes_nose_mouth_centre() -> None:
    kp = np.arange(12, dtype=np.float64).reshape(6, 2)
    np.testing.assert_array_equal(blazeface_alignment_points(kp), kp[:4])
    with pytest.raises(AlignError, match=r"\[6, 2\]"):
        blazeface_alignment_points(kp[:5])


def test_umeyama_degenerate_points_are_nan_like_skimage() -> None:
    m = umeyama_similarity(np.ones((5, 2)), ARCFACE_TEMPLATE)
    assert np.isnan(m).all()
    with pytest.raises(AlignError, match="degenerate"):
        align_face(np.zeros((50, 50, 3), np.uint8), np.ones((5, 2)))


@pytest.mark.parametrize(
    ("image", "landmarks", "match"),
    [
        (np.zeros((50, 50), np.uint8), ARCFACE_TEMPLATE, "uint8 \\[H, W, 3\\]"),
        (np.zeros((50, 50, 3), np.float32), ARCFACE_TEMPLATE, "uint8"),
        (np.zeros((50, 50, 3), np.uint8), ARCFACE_TEMPLATE[:4], "\\[5, 2\\]"),
        (np.zeros((50, 50, 3), np.uint8), np.full((5, 2), np.nan), "NaN"),
    ],
)
def test_align_face_bad_input_is_a_clear_error(image, landmarks, match) -> None:
    with pytest.raises(AlignError, match=match):
        align_face(image, landmarks)


def test_face_at_the_border_gets_zero_fill_not_an_error() -> None:
    image = np.full((100, 100, 3), 200, np.uint8)
    lmk = ARCFACE_TEMPLATE * 0.8 - np.array([30.0, 0.0])  # left half of the face off-image
    crop, _ = align_face(image, lmk)
    assert (crop[:, :10] == 0).all() and (crop[:, -10:] == 200).all()
