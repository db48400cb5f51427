"""The size, coding and scan count of a JPEG from its marker segments, read before any decoder
allocates the image or spends CPU on it (cv2.imdecode has no size limit: 630 bytes claiming
16384 x 16384 decode to 805 MB; nor a scan limit: libjpeg decodes every repeat of a
progressive scan, 0.18 ms each at 3840 x 2160, so 25 MB of 12-byte repeats cost minutes).

Segments are walked as ITU T.81 B.1 lays them out and libjpeg reads them: SOI, then marker
segments with a 2-byte length each, the first SOFn giving height and width; after each SOS
segment the entropy-coded data runs to the next marker that is not a stuffed byte (FF 00) or a
restart marker (FF D0-D7), T.81 B.1.1.5.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.errors import NpucamError

# SOFn markers carry the frame size; C4 (DHT), C8 (JPG) and CC (DAC) share the range.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# what cameras and encoders send: baseline, extended sequential and progressive, Huffman coded
HUFFMAN_SOF = {0xC0: "baseline", 0xC1: "extended sequential", 0xC2: "progressive"}
# scans a decoder is asked to run: a colour progressive JPEG from libjpeg has 10, mozjpeg's
# a few more, a sequential one 1 to 4 (one per component when not interleaved)
MAX_SCANS = 32


class JpegError(NpucamError):
    """A JPEG refused before decoding: says what it claims and which limit it breaks."""


@dataclass(frozen=True)
class JpegInfo:
    height: int
    width: int
    sof: int  # the SOFn marker's second byte (0xC0 baseline, 0xC2 progressive...)
    scans: int  # SOS segments counted (up to the first beyond the limit)


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) from the first SOF segment of a JPEG, None if there is none before the
    first scan (not a JPEG, or damaged)."""
    found = _sof(data)
    return None if found is None else found[0][:2]


def _sof(data: bytes) -> tuple[tuple[int, int, int], int] | None:
    """((height, width, SOFn), offset of the segment after it), or None."""
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
            height = int.from_bytes(data[i + 5 : i + 7], "big")
            width = int.from_bytes(data[i + 7 : i + 9], "big")
            return (height, width, marker), i + 2 + length
        if marker == 0xDA:  # start of scan before any SOF
            return None
        i += 2 + length
    return None


def jpeg_info(data: bytes, max_scans: int = MAX_SCANS) -> JpegInfo:
    """Size, SOFn and scan count of a JPEG; JpegError when it has no SOF before its first scan,
    is not Huffman coded baseline / extended / progressive (arithmetic, lossless and
    hierarchical codings are refused: no camera sends them), or has more than max_scans scans
    (the count stops at the first beyond it)."""
    data = bytes(data) if not isinstance(data, bytes) else data
    found = _sof(data)
    if found is None:
        raise JpegError("not a JPEG (no SOI, or no SOF marker before the first scan)")
    (height, width, sof), i = found
    if sof not in HUFFMAN_SOF:
        raise JpegError(
            f"JPEG coding SOF{sof - 0xC0} is refused (only baseline, extended sequential and "
            "progressive Huffman coding are decoded)"
        )
    scans = 0
    ends: np.ndarray | None = None
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            break  # damaged: the decoder says what it can make of the rest
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        if marker == 0xD9:  # EOI
            break
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if length < 2:
            break
        i += 2 + length
        if marker in _SOF_MARKERS:
            raise JpegError("JPEG has a second SOF marker (hierarchical or damaged)")
        if marker == 0xDA:
            scans += 1
            if scans > max_scans:
                raise JpegError(
                    f"JPEG has more than {max_scans} scans (each one decoded over the whole "
                    "image): refused before decoding"
                )
            if ends is None:
                ends = _markers(data)
            k = int(np.searchsorted(ends, i))
            if k == len(ends):
                break
            i = int(ends[k])
    return JpegInfo(height, width, sof, scans)


def _markers(data: bytes) -> np.ndarray:
    """Offsets of every FF followed by a byte that is not a stuffed 00, a restart marker or
    another FF: where an entropy-coded segment can end (vectorised: a Python loop over the
    FF bytes of a 10 MB JPEG took 50 ms, this 9 ms)."""
    a = np.frombuffer(data, np.uint8)
    ff = np.flatnonzero(a[:-1] == 0xFF)
    nxt = a[ff + 1]
    return ff[(nxt != 0) & ((nxt < 0xD0) | (nxt > 0xD7)) & (nxt != 0xFF)]
