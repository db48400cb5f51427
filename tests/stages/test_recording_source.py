"""The `recording:` camera source (stages/source_kinds/recording.py): a recorded camera's frames
with their recorded seq, paced by their capture times on a shared timeline (checked on a
virtual clock), capture times shifted by one offset for all cameras of a session or kept as
recorded, cameras delivered in capture-time order when not paced, and url errors naming the
camera."""

from __future__ import annotations

import re
import threading

import cv2
import numpy as np
import pytest

from pipeline.clock import VirtualClock
from stages.record.frame_log import FrameSegmentWriter, encode_jpeg
from stages.rig.sync import FrameGrouper
from stages.source_kinds.recording import RecordingSource
from stages.sources import CameraReader, CameraSpec, SourceError

MS = 1_000_000
T0 = 1_600_000_000 * 10**9  # a recording made long before the clocks of these tests


def _image(seq: int) -> np.ndarray:
    image = np.zeros((48, 64, 3), np.uint8)
    image[:, (seq * 7) % 64] = 255
    return image


def write_session(root, cameras: dict[str, list[tuple[int, int]]], per_segment: int = 2):
    """cameras: name -> [(seq, capture offset ns from T0)], written in segments of per_segment."""
    for name, frames in cameras.items():
        folder = root / "frames" / name
        folder.mkdir(parents=True)
        for start in range(0, len(frames), per_segment):
            writer = FrameSegmentWriter(folder / f"{start // per_segment + 1:06d}")
            for seq, offset in frames[start : start + per_segment]:
                writer.append(seq, T0 + offset, encode_jpeg(_image(seq), 95))
            writer.close()
    return root


def _source(session, camera, clock, realtime=True, shifted=True, stop=None):
    return RecordingSource(session, camera, realtime, shifted, stop or threading.Event(), clock)


def test_frames_keep_their_recorded_seq_and_are_paced_by_capture_time(tmp_path):
    session = write_session(tmp_path, {"a": [(5, 0), (6, 40 * MS), (7, 100 * MS), (9, 180 * MS)]})
    clock = VirtualClock()
    source = _source(session, "a", clock)
    source.open()
    got = []
    while (item := source.read(0)) is not None:
        got.append(item)
    source.close()
    assert [item[3] for item in got] == [5, 6, 7, 9]
    assert clock.waits == pytest.approx([0.04, 0.06, 0.08])  # the recorded gaps
    start_ns = 1_700_000_000 * 10**9  # VirtualClock's epoch: the timeline's start
    assert [item[1] - start_ns for item in got] == [0, 40 * MS, 100 * MS, 180 * MS]
    decoded = got[2][0]
    assert np.abs(decoded.astype(int) - _image(7).astype(int)).mean() < 3  # JPEG 95


def test_times_recorded_gives_the_capture_times_unchanged(tmp_path):
    session = write_session(tmp_path, {"a": [(0, 0), (1, 33 * MS)]})
    source = _source(session, "a", VirtualClock(), shifted=False)
    source.open()
    assert [source.read(0)[1], source.read(1)[1]] == [T0, T0 + 33 * MS]
    source.close()


def test_cameras_of_a_session_share_one_timeline_and_one_offset(tmp_path):
    session = write_session(tmp_path, {"a": [(0, 10 * MS), (1, 50 * MS)], "b": [(0, 0)]})
    clock = VirtualClock()
    a, b = _source(session, "a", clock), _source(session, "b", clock)
    a.open()
    b.open()
    first_a, first_b = a.read(0), b.read(0)
    # the session's first capture (camera b's) is the start: a's first frame waits 10 ms
    assert clock.waits == pytest.approx([0.01])
    assert first_a[1] - first_b[1] == 10 * MS  # the recorded difference, exactly
    a.close()
    b.close()


def test_unpaced_cameras_deliver_in_capture_time_order_across_cameras(tmp_path):
    session = write_session(
        tmp_path,
        {
            "a": [(i, t * MS) for i, t in enumerate((0, 30, 31, 90, 120))],
            "b": [(i, t * MS) for i, t in enumerate((10, 20, 60, 100))],
        },
    )
    order: list[tuple[int, str]] = []
    lock = threading.Lock()
    clock = VirtualClock()
    sources = {name: _source(session, name, clock, realtime=False) for name in "ab"}
    for source in sources.values():
        source.open()

    def read_all(name):
        source = sources[name]
        while (item := source.read(0)) is not None:
            with lock:
                order.append((item[1], name))

    threads = [threading.Thread(target=read_all, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)  # hang guard
    for source in sources.values():
        source.close()
    assert [name for _, name in order] == ["a", "b", "b", "a", "a", "b", "a", "b", "a"]
    assert [ts for ts, _ in order] == sorted(ts for ts, _ in order)


def test_the_reader_gives_frames_the_recorded_seq_and_keeps_recorded_times(tmp_path):
    session = write_session(tmp_path, {"cam": [(3, 0), (4, 40 * MS), (8, 80 * MS)]})
    spec = CameraSpec("cam", f"recording:{session}?times=recorded")
    frames = []
    reader = CameraReader(spec, frames.append, clock=VirtualClock())
    reader.start()
    reader._thread.join(30)  # hang guard: the recording ends, the reader ends
    assert [f.seq for f in frames] == [3, 4, 8]
    # ten years before the reader's clock, and not re-stamped as clock skew would be
    assert [f.capture_ts_ns for f in frames] == [T0, T0 + 40 * MS, T0 + 80 * MS]
    assert reader.stats()["clock_skews"] == 0 and reader.health == "ended"


def test_a_camera_named_in_the_query_reads_that_camera_of_the_session(tmp_path):
    session = write_session(tmp_path, {"left": [(0, 0)], "right": [(0, 0), (1, MS)]})
    spec = CameraSpec("cam0", f"recording:{session}?camera=right")
    assert spec.kind == "recording" and spec.source_kind.missing(spec) is None
    frames = []
    reader = CameraReader(spec, frames.append, clock=VirtualClock())
    reader.start()
    reader._thread.join(30)  # hang guard
    assert [f.seq for f in frames] == [0, 1] and frames[0].camera == "cam0"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("recording:", "recording needs a session folder"),
        ("recording:s?speed=2", "unknown key 'speed'"),
        ("recording:s?times=wall", "times: 'wall' is not one of"),
    ],
)
def test_a_bad_recording_url_is_an_error_naming_the_camera(url, message):
    expected = rf"camera 'c' \({re.escape(url)}\): .*{re.escape(message)}"
    with pytest.raises(SourceError, match=expected):
        CameraSpec("c", url)


def test_validate_says_which_camera_has_no_recorded_frames(tmp_path):
    session = write_session(tmp_path, {"left": [(0, 0)]})
    spec = CameraSpec("right", f"recording:{session}")
    assert spec.source_kind.missing(spec) == (
        f"{session}/frames/right: no recorded frames of camera 'right'"
    )


def test_the_frames_decode_as_opencv_decodes_the_jpeg(tmp_path):
    session = write_session(tmp_path, {"a": [(0, 0)]})
    source = _source(session, "a", VirtualClock())
    source.open()
    image = source.read(0)[0]
    source.close()
    jpeg = (session / "frames" / "a" / "000001.mjpeg").read_bytes()
    assert np.array_equal(image, cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR))


def test_four_recorded_cameras_give_the_rig_the_same_frame_groups_as_live(tmp_path):
    # a 4-camera studio at 30 fps: per-camera clock phase and jitter, a few frames lost
    rng = np.random.default_rng(7)
    cameras = {}
    for c in range(4):
        phase = rng.integers(0, 8 * MS)
        frames = [
            (seq, int(phase + seq * 33_333_333 + rng.integers(-2 * MS, 2 * MS)))
            for seq in range(40)
            if rng.random() > 0.1
        ]
        cameras[f"cam{c}"] = frames
    session = write_session(tmp_path, cameras, per_segment=7)

    def groups_of(arrivals):
        """The rig's groups (stages/rig/sync.py) of frames arriving 20 ms after capture."""
        now = [0]
        grouper = FrameGrouper({name: 30.0 for name in cameras}, clock=lambda: now[0])
        out = []
        for camera, seq, ts in arrivals:
            now[0] = ts + 20 * MS
            out += grouper.add(camera, seq, ts)
        out += grouper.flush()
        return [{v.camera: v.seq for v in g.views.values()} for g in out]

    live = sorted(
        ((name, seq, T0 + offset) for name, frames in cameras.items() for seq, offset in frames),
        key=lambda f: f[2],
    )
    delivered = []
    lock = threading.Lock()
    clock = VirtualClock()
    sources = [_source(session, name, clock, realtime=False) for name in cameras]
    for source in sources:
        source.open()

    def read_all(source):
        while (item := source.read(0)) is not None:
            with lock:
                delivered.append((source.camera, item[3], item[1]))

    threads = [threading.Thread(target=read_all, args=(s,)) for s in sources]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)  # hang guard
    for source in sources:
        source.close()
    assert len(delivered) == len(live)
    expected = groups_of(live)
    assert len(expected) >= 35 and groups_of(delivered) == expected
