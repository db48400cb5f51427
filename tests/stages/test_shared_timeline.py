"""Paced cameras on one SharedTimeline (capture's `synchronized`): frame k of every camera
is stamped at one capture time with seq k, whenever its file opened, and a camera that falls
behind drops the frames whose slots went by instead of shifting its own schedule. On virtual
clocks: every assertion is exact and no host's speed enters."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from pipeline.clock import VirtualClock
from pipeline.config import ConfigError, load_config
from pipeline.graph import check_stages
from pipeline.messages import Frame
from stages.sources import CameraReader, CameraSpec, SharedTimeline

FPS = 10.0
PERIOD_NS = 100_000_000
CARPHONE_FRAMES = 120


class Frames:
    """emit: keeps the first `keep` frames, then stops taking (the reader runs ahead on a
    virtual clock); `on_seq` runs a step inside emit when that seq arrives."""

    def __init__(self, keep: int, on_seq: dict[int, object] | None = None) -> None:
        self.keep = keep
        self.frames: list[Frame] = []
        self.on_seq = on_seq or {}
        self.done = threading.Event()

    def __call__(self, frame: Frame) -> bool:
        if len(self.frames) >= self.keep:
            self.done.set()
            return False
        self.frames.append(frame)
        step = self.on_seq.get(frame.seq)
        if step is not None:
            step()  # type: ignore[operator]
        return True


def run_reader(clock: VirtualClock, timeline: SharedTimeline | None, emit: Frames, **kw):
    spec = CameraSpec(name=kw.pop("name", "cam"), url="sample:carphone_pristine.mp4", **kw)
    reader = CameraReader(spec, emit, clock, timeline=timeline)
    reader.start()
    try:
        assert emit.done.wait(30), "reader delivered too few frames"  # hang guard
    finally:
        assert reader.stop(5.0)
    return reader


def slot_ns(timeline: SharedTimeline, seq: int) -> int:
    return timeline.start_ns + seq * PERIOD_NS


def test_a_camera_that_opens_late_skips_to_the_current_slot_and_matches_the_others_frames():
    first, late = VirtualClock(), VirtualClock()  # one timebase: same start and epoch
    timeline = SharedTimeline.starting_in(first, 0.1)
    late.advance(0.35)  # its file opened 0.35 s after the stage started: slots 0 and 1 gone
    a = Frames(keep=8)
    run_reader(first, timeline, a, fps=FPS, name="a")
    b = Frames(keep=6)
    b_reader = run_reader(late, timeline, b, fps=FPS, name="b")

    assert [f.seq for f in a.frames] == list(range(8))
    assert [f.seq for f in b.frames] == list(range(2, 8))
    assert b_reader.stats()["late_skips"] == 2
    by_seq = {f.seq: f for f in a.frames}
    for frame in a.frames + b.frames:
        assert frame.capture_ts_ns == slot_ns(timeline, frame.seq)
    for frame in b.frames:  # the same frame of the file, not just the same stamp
        np.testing.assert_array_equal(frame.image, by_seq[frame.seq].image)


def test_a_camera_held_up_drops_the_frames_whose_slots_went_by_and_keeps_its_schedule():
    clock = VirtualClock()
    timeline = SharedTimeline.starting_in(clock, 0.0)
    # emit of frame 5 blocks 0.25 s (a full queue downstream): slot 6 goes by, slot 7 is
    # 0.05 s late and is read at once
    held = Frames(keep=10, on_seq={5: lambda: clock.advance(0.25)})
    reader = run_reader(clock, timeline, held, fps=FPS)
    assert [f.seq for f in held.frames] == [0, 1, 2, 3, 4, 5, 7, 8, 9, 10]
    assert reader.stats()["late_skips"] == 1
    assert [f.capture_ts_ns for f in held.frames] == [slot_ns(timeline, f.seq) for f in held.frames]
    # every wait ends on a slot: none after the hold (slot 7 was due), the rest one period
    assert clock.waits[-3:] == pytest.approx([0.1, 0.1, 0.1])

    # without a timeline the same hold shifts the camera's own schedule: nothing is dropped
    # and the stamps move off the slots (the drift that split a rig's groups)
    own = VirtualClock()
    start_ns = own.now_ns()
    shifted = Frames(keep=10, on_seq={5: lambda: own.advance(0.25)})
    run_reader(own, None, shifted, fps=FPS)
    assert [f.seq for f in shifted.frames] == list(range(10))
    assert shifted.frames[6].capture_ts_ns - start_ns > 6 * PERIOD_NS


def test_a_looping_file_keeps_its_slots_across_the_reopen():
    clock = VirtualClock()
    timeline = SharedTimeline.starting_in(clock, 0.0)
    looped = Frames(keep=CARPHONE_FRAMES + 5)
    reader = run_reader(clock, timeline, looped, fps=FPS, loop=True)
    frames = looped.frames
    assert [f.seq for f in frames] == list(range(CARPHONE_FRAMES + 5))
    assert [f.capture_ts_ns for f in frames] == [slot_ns(timeline, f.seq) for f in frames]
    np.testing.assert_array_equal(frames[CARPHONE_FRAMES].image, frames[0].image)
    assert reader.stats()["late_skips"] == 0


CONFIG = """
[[cameras]]
name = "a"
url = "synthetic:?fps=10"
[[cameras]]
name = "b"
{b}
[[stages]]
kind = "capture"
synchronized = true
[[stages]]
kind = "publish"
"""


@pytest.mark.parametrize(
    ("b", "error"),
    [
        (
            'url = "zmq:tcp://127.0.0.1:5999"',
            "stages[0].synchronized: camera 'b' is live: only paced files, folders and the "
            "test card share a timeline",
        ),
        (
            'url = "synthetic:"\nrealtime = false',
            "stages[0].synchronized: camera 'b' is not paced (realtime = false)",
        ),
        ('url = "images:frames"', "cameras[1].fps: camera 'b' is a folder in a synchronized"),
    ],
)
def test_a_synchronized_capture_refuses_cameras_that_cannot_share_a_timeline(
    write_config, tmp_path, b, error
):
    (tmp_path / "frames").mkdir()
    with pytest.raises(ConfigError) as exc:
        check_stages(load_config(write_config(CONFIG.format(b=b))))
    assert error in str(exc.value)


def test_a_synchronized_capture_of_paced_cameras_is_accepted(write_config):
    check_stages(load_config(write_config(CONFIG.format(b='url = "synthetic:?fps=10"'))))
