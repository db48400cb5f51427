"""Frame segments (stages/record/frame_log.py): frames read back with their seq and capture
time, a segment cut short mid-frame keeps every complete frame, and OpenCV's FFmpeg backend (an
independent reader) decodes a segment as the MJPEG stream it is."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from stages.record.frame_log import (
    FrameSegmentWriter,
    RecordingError,
    encode_jpeg,
    read_frames,
    read_index,
)


def numbered_frame(i: int, width: int, height: int) -> np.ndarray:
    """uint8 [height, width, 3]: a grey level and a bar that move with i, so frames differ."""
    image = np.full((height, width, 3), 8 * (i % 32), np.uint8)
    image[:, (3 * i) % width] = 255
    return image


def _segment(tmp_path, n=5, size=(64, 48)):
    writer = FrameSegmentWriter(tmp_path / "000001")
    jpegs = []
    for i in range(n):
        jpeg = encode_jpeg(numbered_frame(i, *size), 90)
        writer.append(10 + i, 1_000_000 * i + 7, jpeg)
        jpegs.append(jpeg)
    writer.close()
    return writer, jpegs


def test_frames_read_back_in_order_with_their_seq_capture_time_and_jpeg(tmp_path):
    writer, jpegs = _segment(tmp_path)
    got = list(read_frames(writer.index_path))
    assert [e.seq for e, _ in got] == [10, 11, 12, 13, 14]
    assert [e.capture_ts_ns for e, _ in got] == [1_000_000 * i + 7 for i in range(5)]
    assert [jpeg for _, jpeg in got] == jpegs
    assert writer.bytes == writer.video_path.stat().st_size + writer.index_path.stat().st_size


def test_a_segment_cut_mid_frame_and_mid_line_keeps_every_complete_frame(tmp_path):
    writer, jpegs = _segment(tmp_path)
    # what a kill during the 5th frame leaves: half its JPEG, half its sidecar line
    video = writer.video_path.read_bytes()
    writer.video_path.write_bytes(video[: len(video) - len(jpegs[-1]) // 2])
    lines = writer.index_path.read_bytes().split(b"\n")
    writer.index_path.write_bytes(b"\n".join(lines[:-2]) + b"\n" + lines[-2][:5])
    got = list(read_frames(writer.index_path))
    assert [e.seq for e, _ in got] == [10, 11, 12, 13]
    assert [jpeg for _, jpeg in got] == jpegs[:4]


def test_a_complete_line_pointing_past_the_stream_is_not_a_frame(tmp_path):
    writer, jpegs = _segment(tmp_path)
    video = writer.video_path.read_bytes()
    writer.video_path.write_bytes(video[:-1])  # the line was written, the JPEG was not all
    assert [e.seq for e in read_index(writer.index_path)] == [10, 11, 12, 13]


def test_a_damaged_sidecar_is_an_error_naming_the_file_and_line(tmp_path):
    writer, _ = _segment(tmp_path)
    lines = writer.index_path.read_bytes().split(b"\n")
    lines[3] = b"12,x,0,5"
    writer.index_path.write_bytes(b"\n".join(lines))
    with pytest.raises(RecordingError, match=r"000001\.csv: line 4: not seq,ts,offset,length"):
        read_index(writer.index_path)


def test_opencv_ffmpeg_decodes_a_segment_as_an_mjpeg_stream_frame_for_frame(tmp_path):
    writer, jpegs = _segment(tmp_path, n=6, size=(96, 64))
    cap = cv2.VideoCapture(str(writer.video_path), cv2.CAP_FFMPEG)
    decoded = []
    while True:
        ok, image = cap.read()
        if not ok:
            break
        decoded.append(image)
    cap.release()
    assert len(decoded) == 6
    for image, jpeg in zip(decoded, jpegs, strict=True):
        # the same libjpeg decode of the same bytes: FFmpeg's and OpenCV's agree within 1
        ours = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
        assert np.abs(image.astype(int) - ours.astype(int)).max() <= 1


def test_a_segment_never_overwrites_an_existing_file(tmp_path):
    _segment(tmp_path)
    with pytest.raises(FileExistsError):
        FrameSegmentWriter(tmp_path / "000001")
