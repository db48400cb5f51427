"""stages.planning.probe: cameras probed through the capture stage's own sources (a file's
own rate unless `fps` paces it; a live camera that sends nothing falls back to its configured
rate, said so), the detect stage's boxes per frame, and its cost per frame robust to a burst
of other programs."""

from __future__ import annotations

import textwrap

import cv2
import numpy as np
import pytest

from pipeline.config import load_config
from stages.planning.probe import detect_seconds, measure_scenes, probe_cameras


def test_detect_seconds_is_mean_cpu_times_the_median_stretch():
    assert detect_seconds([0.01] * 5, [1.0, 1.0, 9.0, 1.0, 1.0]) == pytest.approx(0.01)
    assert detect_seconds([0.01, 0.03], [2.0, 2.0]) == pytest.approx(0.04)
    assert detect_seconds([0.02], [0.5]) == pytest.approx(0.02)  # never below its CPU time


def test_files_are_probed_and_live_cameras_fall_back(tmp_path):
    video = tmp_path / "v.avi"
    out = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 12.0, (64, 48))
    for i in range(20):
        out.write(np.full((48, 64, 3), i * 10, np.uint8))
    out.release()
    cfg = tmp_path / "c.toml"
    cfg.write_text(textwrap.dedent(
        """
        [[cameras]]
        name = "own"
        url = "v.avi"
        [[cameras]]
        name = "paced"
        url = "v.avi"
        fps = 5
        [[cameras]]
        name = "far"
        url = "zmq:tcp://127.0.0.1:9"
        fps = 7
        [[stages]]
        kind = "capture"
        """
    ))  # fmt: skip
    own, paced, far = probe_cameras(load_config(cfg), 10.0, 8, 0.3)
    assert (own.fps, own.fps_source, own.size, len(own.frames)) == (12.0, "probed", (64, 48), 8)
    assert (paced.fps, paced.fps_source) == (5.0, "configured") and paced.frames is own.frames
    assert (far.fps, far.fps_source, far.frames) == (7.0, "configured", [])
    assert far.note.startswith("not reachable")
    assert own.decode_s > 0


def test_scenes_hold_the_detectors_boxes_per_frame():
    config = load_config("configs/multicam-pose.toml")
    cams = [c for c in probe_cameras(config, 10.0, 12, 0.3) if c.name == "carphone"]
    index = next(i for i, s in enumerate(config.stages) if s.kind == "detect")
    scene = measure_scenes(config, index, cams, 12)["carphone"]
    assert len(scene.frames) == 12 and scene.detect_s > 0
    for boxes, scores, faces in scene.frames:
        assert boxes.shape == (len(scores), 4) and faces.shape == (0, 4)  # face = "none"
    assert scene.mean_people == pytest.approx(1.0)  # carphone's one person, every frame


def test_the_per_frame_pose_is_priced_per_person_frame_apart_from_the_detector():
    config = load_config("configs/demo.toml")  # its detect stage has `live` on
    cams = [c for c in probe_cameras(config, 10.0, 12, 0.3) if c.name == "carphone"]
    index = next(i for i, s in enumerate(config.stages) if s.kind == "detect")
    scene = measure_scenes(config, index, cams, 12)["carphone"]
    assert scene.live_people == pytest.approx(1.0)  # carphone's one person, every frame
    assert scene.live_person_s is not None and 0 < scene.live_person_s < scene.detect_s
    plain = load_config("configs/multicam-pose.toml")  # no `live`: nothing priced
    index = next(i for i, s in enumerate(plain.stages) if s.kind == "detect")
    cams = [c for c in probe_cameras(plain, 10.0, 4, 0.3) if c.name == "carphone"]
    scene = measure_scenes(plain, index, cams, 4)["carphone"]
    assert scene.live_person_s is None and scene.live_people == 0
