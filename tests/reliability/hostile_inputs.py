"""Inputs a hostile peer sends, built once for the reliability tests: a JPEG whose header
claims a huge frame, a progressive JPEG whose last scan is repeated, frame headers that are
huge, deep or hold giant integers, and a sampler of a process's RSS while an attack runs."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import cv2
import numpy as np


def jpeg_claiming(height: int, width: int) -> bytes:
    """A ~630-byte JPEG (an 8x8 image) whose SOF segment says height x width: libjpeg decodes
    it to a full-size image (the missing scan data read as grey)."""
    ok, buf = cv2.imencode(".jpg", np.zeros((8, 8, 3), np.uint8), [cv2.IMWRITE_JPEG_QUALITY, 50])
    assert ok
    data = bytearray(buf.tobytes())
    i = 2
    while data[i + 1] != 0xC0:  # cv2 writes baseline JPEGs: the size is in SOF0
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    data[i + 5 : i + 7] = height.to_bytes(2, "big")
    data[i + 7 : i + 9] = width.to_bytes(2, "big")
    return bytes(data)


def scan_bomb(image: np.ndarray, repeats: int) -> bytes:
    """A progressive JPEG of `image` (Pillow's encoder) whose last scan's 12-byte SOS header
    (one component, no entropy data) is repeated `repeats` more times before EOI: libjpeg
    runs every repeat over the whole image (a repeated refinement scan, its data missing, is
    only a warning to it)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image[..., ::-1]).save(buf, "JPEG", progressive=True, quality=90)
    data = buf.getvalue()
    last = data.rindex(b"\xff\xda")  # the last SOS: its segment runs to EOI
    assert data.endswith(b"\xff\xd9")
    scan = data[last : last + 2 + int.from_bytes(data[last + 2 : last + 4], "big")]
    return data[:-2] + scan * repeats + b"\xff\xd9"


def with_fields(header: bytes, **fields) -> bytes:
    """A JSON header with fields replaced."""
    return json.dumps({**json.loads(header), **fields}).encode()


def deep_header(header: bytes, depth: int = 100_000) -> bytes:
    """header with an extra field nested depth arrays deep."""
    return header[:-1] + b',"x":' + b"[" * depth + b"]" * depth + b"}"


def giant_int_header(header: bytes, field: str = "seq", digits: int = 5000) -> bytes:
    """header with field's value replaced by an integer of `digits` digits."""
    value = json.loads(header)[field]
    needle = f'"{field}":{json.dumps(value)}'.encode()
    assert needle in header, "headers are written without spaces"
    return header.replace(needle, f'"{field}":{"9" * digits}'.encode(), 1)


def rss_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


class RssPeak(threading.Thread):
    """Samples a process's RSS every 10 ms until stop(); peak_mb is the highest seen."""

    def __init__(self, pid: int | str = "self") -> None:
        super().__init__(name="rss-peak", daemon=True)
        self.pid = pid
        self.start_mb = rss_mb(pid)
        self.peak_mb = self.start_mb
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.01):
            try:
                self.peak_mb = max(self.peak_mb, rss_mb(self.pid))
            except (OSError, RuntimeError):
                return

    def stop(self) -> float:
        """Stop sampling; the peak's growth over the first sample, in MB."""
        self._done.set()
        self.join(2)
        return self.peak_mb - self.start_mb
