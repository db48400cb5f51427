"""Damaged media and what the counts say about it (stages/sources.py, stages/capture.py).

- An mp4 with 64 KB of garbage at 40% (the sample bikes.mp4, H.264, 250 frames): npucam
  publishes every frame OpenCV itself decodes from it (reading on past failed reads to the end)
  and counts each frame the container has but nobody could decode as `bad_frames`. Before the
  fix five failed reads in a row were taken as the end: 98 of OpenCV's 212 frames published,
  health `ended`, `bad_frames` 0.
- A corrupt JPEG right before a live camera stalls is counted (it was lost with the stall).
- A camera's `frames` are what capture sent on plus its `refused`: a frame no inbox took
  (grabbed while the pipeline stops, or refused by a closed queue) was counted in `frames`
  and nowhere else.
- A file OpenCV cannot open is an error naming the camera and the file; when no camera could
  ever open, `npucam run` exits 1 (it exited 0).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import threading
import time
from pathlib import Path

import cv2
import numpy as np
from engine_stages import start
from rel_helpers import NpucamRun

from pipeline.assets import asset_path


def damaged_copy(src: Path, dst: Path, at: float = 0.4, size: int = 65536) -> Path:
    data = bytearray(src.read_bytes())
    start_at = int(len(data) * at)
    data[start_at : start_at + size] = np.random.default_rng(1).bytes(size)
    dst.write_bytes(bytes(data))
    return dst


def opencv_decodes(path: Path) -> tuple[int, int]:
    """(frames OpenCV decodes reading to the end past any failed read, the container's frame
    count): the reference."""
    cap = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    count = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
    decoded = failed_in_a_row = 0
    while failed_in_a_row < 100:  # far past any damaged run of this file
        ok, _ = cap.read()
        decoded += ok
        failed_in_a_row = 0 if ok else failed_in_a_row + 1
    cap.release()
    return decoded, count


def run_file_camera(write_config, path: Path) -> tuple[list, dict]:
    config = write_config(
        f"""
        [metrics]
        stats_interval_s = 0
        [[cameras]]
        name = "clip"
        url = "{path}"
        realtime = false
        staleness_ms = 600000
        [[stages]]
        kind = "capture"
        [[stages]]
        name = "collect"
        kind = "engine_stages:Collect"
        inbox = {{ size = 8, policy = "block" }}
        """
    )

    async def main():
        pipeline, task = await start(config)
        assert await asyncio.wait_for(task, 60) == 0
        return pipeline.stages["collect"].items, pipeline.metrics.snapshot()["cameras"]["clip"]

    return asyncio.run(main())


def test_a_damaged_mp4_publishes_what_opencv_decodes_and_counts_what_it_cannot(
    write_config, tmp_path
):
    path = damaged_copy(asset_path("bikes.mp4"), tmp_path / "bikes-damaged.mp4")
    decoded, count = opencv_decodes(path)
    assert count == 250 and 150 < decoded < count  # the damage is real and partial
    items, cam = run_file_camera(write_config, path)
    print(
        f"\ndamaged bikes.mp4: OpenCV decodes {decoded} of {count}; npucam published "
        f"{len(items)}, bad_frames {cam['bad_frames']}, health {cam['health']}"
    )
    assert len(items) == decoded
    assert [f.seq for f in items] == list(range(decoded))
    assert cam["bad_frames"] == count - decoded
    assert cam["health"] == "ended" and cam["frames"] == decoded


def test_an_intact_file_has_no_bad_frames(write_config):
    path = asset_path("carphone_pristine.mp4")
    decoded, count = opencv_decodes(path)
    items, cam = run_file_camera(write_config, path)
    assert len(items) == decoded == count and cam["bad_frames"] == 0


def test_a_corrupt_frame_right_before_a_stall_is_counted(monkeypatch, caplog):
    from stages import sources

    class CorruptThenStall(sources.Source):
        description = "fake:corrupt-then-stall"

        def __init__(self, stop: threading.Event) -> None:
            self.stop = stop
            self.reads = 0

        def open(self) -> None:
            pass

        def read(self, seq):
            self.reads += 1
            if self.reads == 1:
                return np.zeros((8, 8, 3), np.uint8), None, self.description
            if self.reads == 2:
                return None  # a frame FFmpeg could not decode: the read fails at once
            self.stop.wait(0.3)  # then nothing for stall_timeout_s
            return None

    monkeypatch.setattr(sources, "make_source", lambda spec, stop: CorruptThenStall(stop))
    spec = sources.CameraSpec("live", "rtsp://127.0.0.1:1/x", stall_timeout_s=0.3, end="stop")
    reader = sources.CameraReader(spec, lambda frame: None)
    with caplog.at_level(logging.WARNING, logger="stages.sources"):
        reader.start()
        end = time.monotonic() + 5
        while reader.health != "ended" and time.monotonic() < end:
            time.sleep(0.02)
        reader.stop()
    stats = reader.stats()
    assert stats["frames"] == 1 and stats["bad_frames"] == 1
    assert any("camera live: skipped bad frame" in r.getMessage() for r in caplog.records)


def test_frames_no_inbox_takes_are_counted_as_refused(write_config):
    """A camera's `frames` = what capture sent on + `refused`: frames grabbed while the
    pipeline stops (or that a closed queue refuses) are no longer counted silently."""
    config = write_config(
        """
        [metrics]
        stats_interval_s = 0
        [[cameras]]
        name = "fast"
        url = "synthetic:?width=64&height=48&fps=400"
        staleness_ms = 600000
        [[stages]]
        kind = "capture"
        [[stages]]
        name = "slow"
        kind = "engine_stages:Slow"
        delay_s = 0.3
        inbox = { size = 2, policy = "block" }
        [[stages]]
        name = "collect"
        kind = "engine_stages:Collect"
        inbox = { size = 1000, policy = "block" }
        """
    )
    runs = []
    for _ in range(3):  # a frame is not always in hand when the stop comes

        async def main():
            pipeline, task = await start(config, duration=1.0)
            assert await task == 0
            return pipeline.metrics.snapshot()

        snap = asyncio.run(main())
        cam = snap["cameras"]["fast"]
        sent = snap["stages"]["capture"]["out"].get("fast", 0)
        runs.append((cam["frames"], sent, cam["refused"]))
    print(f"\n(frames, sent, refused) per run: {runs}")
    assert all(frames == sent + refused for frames, sent, refused in runs)
    assert any(refused for *_, refused in runs)


def test_a_file_opencv_cannot_open_is_an_error_naming_the_camera_and_file(write_config, tmp_path):
    """Refused before the run starts (validate's check, run by `npucam run` too: exit 2)."""
    bad = tmp_path / "not-a-video.mp4"
    bad.write_bytes(b"\0garbage" * 1000)
    good = tmp_path / "good.mp4"
    shutil.copy(asset_path("carphone_pristine.mp4"), good)
    cams = {"broken": bad, "fine": good}

    def config(names) -> Path:
        text = "".join(
            f'[[cameras]]\nname = "{n}"\nurl = "{cams[n]}"\nrealtime = false\n' for n in names
        )
        return write_config(text + '[[stages]]\nkind = "capture"\n', f"{'-'.join(names)}.toml")

    for names in (["broken"], ["fine", "broken"]):
        code, err = NpucamRun(config(names)).wait(30)
        assert code == 2, err
        index = names.index("broken")
        assert f"cameras[{index}].url: {bad}: not a video OpenCV can open" in err


def test_a_file_that_cannot_be_opened_at_start_fails_capture_when_no_camera_opens(
    write_config, tmp_path
):
    """A file that was a video when the config was checked but is not by the time its
    camera opens: an error naming the camera and file; the capture stage fails (exit 1) when
    no camera of it ever opened, and runs on when another did."""
    from pipeline.config import load_config
    from pipeline.graph import Pipeline

    clips = {n: tmp_path / f"{n}.mp4" for n in ("broken", "fine")}
    for path in clips.values():
        shutil.copy(asset_path("carphone_pristine.mp4"), path)

    def run(names) -> tuple[int, str]:
        text = "".join(
            f'[[cameras]]\nname = "{n}"\nurl = "{clips[n]}"\nrealtime = false\n' for n in names
        )
        path = write_config(text + '[[stages]]\nkind = "capture"\n', f"{'-'.join(names)}.toml")
        pipeline = Pipeline(load_config(path))  # checked while the files are videos
        clips["broken"].write_bytes(b"\0garbage" * 1000)
        records: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda record: records.append(record.getMessage())
        logging.getLogger().addHandler(handler)
        try:
            code = asyncio.run(pipeline.run(duration=20, handle_signals=False))
        finally:
            logging.getLogger().removeHandler(handler)
            shutil.copy(asset_path("carphone_pristine.mp4"), clips["broken"])
        return code, "\n".join(records)

    code, log_text = run(["broken"])
    assert code == 1
    assert "no camera could be opened: broken" in log_text and str(clips["broken"]) in log_text
    code, log_text = run(["broken", "fine"])
    assert code == 0
    assert f"camera broken never opened {clips['broken']}" in log_text
