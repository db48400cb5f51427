"""The size of a JPEG from its SOF segment, read before any decoder allocates the image
(cv2.imdecode has no size limit: 630 bytes claiming 16384 x 16384 decode to 805 MB).

Segments are walked as ITU T.81 B.1 lays them out and libjpeg reads them: SOI, then marker
segments with a 2-byte length each, the first SOFn giving height and width.
"""

from __future__ import annotations

# SOFn markers carry the frame size; C4 (DHT), C8 (JPG) and CC (DAC) share the range.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) from the first SOF segment of a JPEG, None if there is none before the
    first scan (not a JPEG, or damaged)."""
    if data[:2] != b"\xff\xd8":
        return None
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length field
            i += 2
            continue
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if length < 2:
            return None
        if marker in _SOF_MARKERS:
            if i + 9 > len(data):
                return None
            return (
                int.from_bytes(data[i + 5 : i + 7], "big"),
                int.from_bytes(data[i + 7 : i + 9], "big"),
            )
        if marker == 0xDA:  # start of scan before any SOF
            return None
        i += 2 + length
    return None
