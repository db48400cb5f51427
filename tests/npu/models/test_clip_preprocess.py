"""npu.models.clip.preprocess against HF CLIPImageProcessor (transformers 5.23.0): 0 differences."""

from __future__ import annotations

import numpy as np
import pytest

from npu.models.clip.preprocess import ImageInputError, preprocess, resized_size

SIZES = [
    (1, 1), (1, 7), (7, 1), (2, 2), (3, 3), (1, 300), (300, 1), (2, 500), (17, 2000),
    (50, 37), (100, 150), (112, 112), (199, 301), (223, 224), (224, 223), (224, 224),
    (225, 224), (224, 500), (500, 224), (333, 333), (448, 448), (480, 640), (640, 480),
    (1000, 1333), (1080, 1920), (3000, 200), (225, 1000), (4, 4096),
]  # fmt: skip


@pytest.fixture(scope="module")
def hf_processor():
    import torch
    from transformers import CLIPImageProcessor

    torch.set_num_threads(1)
    return CLIPImageProcessor()


def hf_pixels(processor, image: np.ndarray) -> np.ndarray:
    out = processor(images=image, return_tensors="np", input_data_format="channels_last")
    return out["pixel_values"][0]


def test_default_processor_is_the_torchvision_backend(hf_processor):
    # docs/clip.md: what `CLIPImageProcessor()` resolves to in transformers 5.23.0
    assert hf_processor.backend == "torchvision"
    assert hf_processor.size == {"shortest_edge": 224}
    assert hf_processor.crop_size == {"height": 224, "width": 224}


@pytest.mark.parametrize(("height", "width"), SIZES)
def test_pixels_equal_hf_exactly(hf_processor, height, width):
    rng = np.random.default_rng(height * 7919 + width)
    image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    ours = preprocess(image)
    ref = hf_pixels(hf_processor, image)
    assert ours.dtype == np.float32 and ours.shape == (3, 224, 224)
    assert int(np.count_nonzero(ours != ref)) == 0


def test_smooth_and_saturated_images_equal_hf(hf_processor):
    # ringing of the negative bicubic lobes must clamp exactly as the uint8 kernel does
    yy, xx = np.mgrid[0:371, 0:517]
    smooth = np.stack([xx % 256, yy % 256, (xx + yy) % 256], axis=-1).astype(np.uint8)
    edges = ((xx // 3 + yy // 5) % 2 * 255).astype(np.uint8)[..., None].repeat(3, axis=-1)
    for image in (
        smooth,
        edges,
        np.zeros((90, 91, 3), np.uint8),
        np.full((5, 9, 3), 255, np.uint8),
    ):
        assert int(np.count_nonzero(preprocess(image) != hf_pixels(hf_processor, image))) == 0


def test_non_contiguous_input_equals_its_copy():
    rng = np.random.default_rng(1)
    big = rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)
    view = big[::2, ::-1]
    assert np.array_equal(preprocess(view), preprocess(np.ascontiguousarray(view)))


def test_resized_size_truncates_the_long_side_as_hf():
    assert resized_size(480, 640) == (224, 298)
    assert resized_size(640, 480) == (298, 224)
    assert resized_size(1, 5) == (224, 1120)


@pytest.mark.parametrize(
    ("image", "message"),
    [
        (np.zeros((0, 10, 3), np.uint8), "zero-size"),
        (np.zeros((10, 0, 3), np.uint8), "zero-size"),
        (np.zeros((10, 10, 3), np.float32), "uint8"),
        (np.zeros((10, 10), np.uint8), r"\[H, W, 3\]"),
        (np.zeros((10, 10, 4), np.uint8), r"\[H, W, 3\]"),
        ([[1, 2, 3]], "numpy array"),
    ],
)
def test_bad_images_raise_a_clear_error(image, message):
    with pytest.raises(ImageInputError, match=message):
        preprocess(image)


def test_sizes_cover_the_float32_and_float64_passes():
    from npu.models.clip.preprocess import _banded_pass

    dtypes = set()
    for height, width in SIZES:
        out_h, out_w = resized_size(height, width)
        for n_in, n_out in ((width, out_w), (height, out_h)):
            if n_in != n_out:
                dtypes.add(_banded_pass(n_in, n_out, (n_out - 224) // 2, 224).dtype)
    assert dtypes == {np.dtype(np.float32), np.dtype(np.float64)}


def test_random_sizes_equal_hf_exactly(hf_processor):
    # log-uniform heights and widths 1..1600 (300 sizes of this sweep also passed offline)
    rng = np.random.default_rng(2026)
    for _ in range(40):
        height, width = (int(np.exp(rng.uniform(0, np.log(1600)))) for _ in range(2))
        image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        diff = np.count_nonzero(preprocess(image) != hf_pixels(hf_processor, image))
        assert diff == 0, f"{height}x{width}: {diff} values differ"
