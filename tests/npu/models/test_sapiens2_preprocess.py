"""npu.models.sapiens2.preprocess.crop_persons against HF Sapiens2's crop_and_resize (torch
grid_sample).

Tolerance: max |diff| <= 1e-4 on the normalised crop (docs/pose.md's bar; the sample points are
bit-identical, so what remains is float32 summation order, about 1e-6 here).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.sapiens2.image_processing_sapiens2 import (
    box_xywh_to_cxcywh,
    boxes_to_crop_params,
    crop_and_resize,
)

from npu.models.sapiens2.config import IMAGENET_MEAN, IMAGENET_STD
from npu.models.sapiens2.preprocess import CropError, crop_persons, crop_windows
from pipeline.errors import NpucamError

torch.set_num_threads(1)


def _hf_crops(image: np.ndarray, boxes: np.ndarray, size=(1024, 768)) -> np.ndarray:
    """HF's path: float32 image, crop_and_resize, fused (v - 255 mean) / (255 std)."""
    t = torch.from_numpy(image).permute(2, 0, 1).float()
    b = box_xywh_to_cxcywh(torch.tensor(boxes, dtype=torch.float32))
    out = crop_and_resize(t, b, size)
    mean = torch.tensor(IMAGENET_MEAN) * 255.0
    std = torch.tensor(IMAGENET_STD) * 255.0
    return ((out - mean[:, None, None]) / std[:, None, None]).numpy()


def _mode(box: np.ndarray, size=(1024, 768)) -> str:
    win = crop_windows(box[None], size)[0]
    shrink = min((size[1] - 1) / win[2], (size[0] - 1) / win[3]) < 1
    return "bilinear" if shrink else "bicubic"


BOXES = np.array(
    [
        [100.3, 50.7, 200.2, 300.9],  # grows: bicubic
        [-50.0, -30.0, 120.0, 80.0],  # partly outside, top-left
        [600.0, 400.0, 90.0, 150.0],  # partly outside, bottom-right
        [10.5, 20.25, 7.3, 3.1],  # tiny
        [-500.0, -400.0, 2000.0, 1800.0],  # huge, mostly outside: bilinear
        [300.0, 200.0, 700.3, 900.1],  # shrinks: bilinear
        [5.0, 5.0, 600.0, 30.0],  # very wide
    ],
    dtype=np.float32,
)


def test_crop_matches_hf_crop_and_resize_both_modes():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
    crops, windows = crop_persons(image, BOXES)
    ref = _hf_crops(image, BOXES)
    assert crops.shape == (len(BOXES), 3, 1024, 768) and crops.dtype == np.float32
    modes = {_mode(b) for b in BOXES}
    assert modes == {"bilinear", "bicubic"}
    for i in range(len(BOXES)):
        assert np.abs(crops[i] - ref[i]).max() <= 1e-4, (i, _mode(BOXES[i]))


def test_crop_matches_hf_on_random_boxes_and_small_output():
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (97, 131, 3), dtype=np.uint8)
    xy = rng.uniform(-60, 140, (12, 2))
    wh = np.exp(rng.uniform(np.log(0.5), np.log(400), (12, 2)))
    boxes = np.concatenate([xy, wh], axis=1).astype(np.float32)
    crops, _ = crop_persons(image, boxes, output_size=(64, 48))
    ref = _hf_crops(image, boxes, (64, 48))
    assert {_mode(b, (64, 48)) for b in boxes} == {"bilinear", "bicubic"}
    assert np.abs(crops - ref).max() <= 1e-4


def test_windows_are_hf_crop_params():
    center, scale = boxes_to_crop_params(
        box_xywh_to_cxcywh(torch.tensor(BOXES)), output_size=(1024, 768)
    )
    _, windows = crop_persons(np.zeros((8, 8, 3), np.uint8), BOXES)
    np.testing.assert_array_equal(windows[:, :2], center.numpy())
    np.testing.assert_array_equal(windows[:, 2:], scale.numpy())
    # the window has the crop's aspect and contains the 1.25-padded box
    np.testing.assert_allclose(windows[:, 2] / windows[:, 3], 0.75, rtol=1e-6)
    assert np.all(windows[:, 2] >= 1.25 * BOXES[:, 2] * (1 - 1e-6))
    assert np.all(windows[:, 3] >= 1.25 * BOXES[:, 3] * (1 - 1e-6))


def test_crop_of_a_box_outside_the_image_is_the_normalised_zero():
    image = np.full((50, 60, 3), 200, np.uint8)
    crops, _ = crop_persons(image, np.array([[1000.0, 1000.0, 20.0, 20.0]]), output_size=(16, 12))
    expected = -np.asarray(IMAGENET_MEAN) / np.asarray(IMAGENET_STD)
    np.testing.assert_allclose(
        crops[0], np.broadcast_to(expected[:, None, None], (3, 16, 12)), 1e-6
    )


@pytest.mark.parametrize(
    ("image", "boxes", "needle"),
    [
        (np.zeros((10, 10, 3), np.float32), [[0, 0, 5, 5]], "uint8"),
        (np.zeros((10, 10), np.uint8), [[0, 0, 5, 5]], "[H, W, 3]"),
        (np.zeros((10, 10, 4), np.uint8), [[0, 0, 5, 5]], "[H, W, 3]"),
        (np.zeros((1, 10, 3), np.uint8), [[0, 0, 5, 5]], "2x2"),
        ([[1, 2, 3]], [[0, 0, 5, 5]], "numpy array"),
        (np.zeros((10, 10, 3), np.uint8), np.zeros((0, 4)), "empty"),
        (np.zeros((10, 10, 3), np.uint8), [[0, 0, -5, 5]], "boxes_xywh[0]"),
        (np.zeros((10, 10, 3), np.uint8), [[0, 0, 5, 5], [1, 1, 3, 0]], "boxes_xywh[1]"),
        (np.zeros((10, 10, 3), np.uint8), [[0, 0, np.nan, 5]], "not finite"),
        (np.zeros((10, 10, 3), np.uint8), [[0, 0, 5]], "[N, 4]"),
        (np.zeros((10, 10, 3), np.uint8), [[0, 0, 5, 5], [1, 2]], "[N, 4] array of numbers"),
        (np.zeros((10, 10, 3), np.uint8), [["a", 0, 5, 5]], "[N, 4] array of numbers"),
        (np.zeros((10, 10, 3), np.uint8), [[0, 0, 3e38, 5]], "out of float32 range"),
        (np.zeros((10, 10, 3), np.uint8), [[3e38, 0, 3, 5]], "out of float32 range"),
    ],
)
def test_bad_input_raises_a_named_error(image, boxes, needle):
    with pytest.raises(CropError) as err:
        crop_persons(image, boxes)
    assert isinstance(err.value, NpucamError)
    assert needle in str(err.value)


def test_crop_matches_the_hf_processor_end_to_end():
    from transformers import Sapiens2ImageProcessor

    rng = np.random.default_rng(4)
    image = rng.integers(0, 256, (300, 200, 3), dtype=np.uint8)
    boxes = [[20.5, 30.0, 80.0, 150.0], [-10.0, 100.0, 400.0, 500.0]]
    ref = Sapiens2ImageProcessor()(images=image, boxes=[boxes], return_tensors="np")
    crops, _ = crop_persons(image, np.array(boxes))
    assert np.abs(crops - ref["pixel_values"]).max() <= 1e-4


@settings(max_examples=60, deadline=None)
@given(
    shape=st.tuples(st.integers(0, 12), st.integers(0, 12), st.integers(1, 4)),
    dtype=st.sampled_from([np.uint8, np.float32, np.int16]),
    boxes=st.lists(
        st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=3, max_size=5),
        max_size=3,
    ),
)
def test_any_input_gives_crops_or_a_crop_error(shape, dtype, boxes):
    image = np.zeros(shape, dtype)
    try:
        crops, windows = crop_persons(image, boxes, output_size=(8, 6))
    except CropError:
        return
    assert crops.shape == (len(boxes), 3, 8, 6) and windows.shape == (len(boxes), 4)
    assert np.all(np.isfinite(crops)) and np.all(np.isfinite(windows))
