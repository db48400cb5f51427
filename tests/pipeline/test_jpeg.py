"""pipeline/jpeg.py: the SOF size of a JPEG equals what Pillow's header reader (an independent
reference) reports, for the JPEG kinds cameras and cv2 write; damaged data gives None."""

from __future__ import annotations

import io

import cv2
import numpy as np
import pytest
from PIL import Image

from pipeline.jpeg import jpeg_size

RNG = np.random.default_rng(3)
IMAGE = RNG.integers(0, 256, (37, 53, 3), np.uint8)


def pillow_size(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as im:  # reads the header only
        return im.height, im.width


def cv2_jpeg(image, *params) -> bytes:
    ok, buf = cv2.imencode(".jpg", image, list(params))
    assert ok
    return buf.tobytes()


def pillow_jpeg(**kwargs) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(IMAGE).save(buf, "JPEG", **kwargs)
    return buf.getvalue()


EXIF = Image.Exif()
EXIF[0x0110] = "camera model"  # an APP1 segment before the SOF

JPEGS = {
    "cv2 baseline": cv2_jpeg(IMAGE),
    "cv2 progressive": cv2_jpeg(IMAGE, cv2.IMWRITE_JPEG_PROGRESSIVE, 1),
    "cv2 optimized": cv2_jpeg(IMAGE, cv2.IMWRITE_JPEG_OPTIMIZE, 1),
    "cv2 grey": cv2_jpeg(IMAGE[..., 0]),
    "pillow with exif and icc": pillow_jpeg(exif=EXIF, icc_profile=b"\0" * 300),
    "pillow progressive 4:2:0": pillow_jpeg(progressive=True, subsampling=2),
}


@pytest.mark.parametrize("name", JPEGS)
def test_jpeg_size_is_pillows(name):
    data = JPEGS[name]
    assert jpeg_size(data) == pillow_size(data) == (37, 53)


@pytest.mark.parametrize(
    "data",
    [b"", b"\xff\xd8", b"\x89PNG\r\n", JPEGS["cv2 baseline"][:20], b"\xff\xd8\xff\xda\x00\x08"],
)
def test_no_sof_before_the_data_ends_or_the_scan_starts_is_none(data):
    assert jpeg_size(data) is None
