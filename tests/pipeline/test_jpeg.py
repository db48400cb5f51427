"""pipeline/jpeg.py: the SOF size of a JPEG equals what Pillow's header reader (an independent
reference) reports, for the JPEG kinds cameras and cv2 write; damaged data gives None."""

from __future__ import annotations

import io

import cv2
import numpy as np
import pytest
from PIL import Image

from pipeline.jpeg import JpegError, jpeg_info, jpeg_size

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


@pytest.mark.parametrize("name", JPEGS)
def test_jpeg_info_counts_the_scans_each_encoder_writes(name):
    data = JPEGS[name]
    info = jpeg_info(data)
    assert (info.height, info.width) == pillow_size(data)
    # libjpeg's progressive scripts: 10 scans for colour, 6 for grey; sequential: 1
    assert info.scans == (10 if "progressive" in name else 1)
    assert info.sof == (0xC2 if "progressive" in name else 0xC0)


def test_a_scan_limit_counts_stuffed_and_restart_bytes_as_scan_data():
    # restart markers (FF D0-D7) and stuffed FF 00 inside a scan are not scan ends
    data = cv2_jpeg(RNG.integers(0, 256, (64, 64, 3), np.uint8), cv2.IMWRITE_JPEG_RST_INTERVAL, 1)
    assert b"\xff\xd0" in data and b"\xff\x00" in data
    assert jpeg_info(data).scans == 1
    with pytest.raises(JpegError, match="more than 0 scans"):
        jpeg_info(data, max_scans=0)
