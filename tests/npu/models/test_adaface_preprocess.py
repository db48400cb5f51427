"""npu/models/adaface/preprocess.py: an aligned crop -> cvlface's ((x/255) - 0.5) / 0.5 CHW
input in the embedder's colour order."""

from __future__ import annotations

import numpy as np
import pytest

from npu.models.adaface.config import AdaFaceError
from npu.models.adaface.preprocess import convert_colour, embedder_input


def test_embedder_input_normalises_and_orders_channels() -> None:
    crop = np.zeros((112, 112, 3), np.uint8)
    crop[..., 0] = 255  # blue in a BGR crop
    x = embedder_input(crop, have="bgr", want="rgb")
    assert x.shape == (3, 112, 112) and x.dtype == np.float32
    np.testing.assert_allclose(x[2], 1.0)
    np.testing.assert_allclose(x[0], -1.0)
    np.testing.assert_array_equal(convert_colour(crop, "bgr", "bgr"), crop)
    with pytest.raises(AdaFaceError, match="colour order"):
        convert_colour(crop, "bgr", "hsv")  # type: ignore[arg-type]
