"""The align stage: face jobs (any job carrying landmarks) -> aligned 112x112 crops equal to
align_face / align_face_4pt (the 4-point BlazeFace approximation); every other job (pose,
CLIP, another model's) passes through."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import pytest
from skimage import data

from pipeline.config import parse_config
from pipeline.graph import Context
from pipeline.messages import Frame, now_ns
from pipeline.metrics import Metrics
from stages.align import (
    ARCFACE_TEMPLATE,
    Align,
    AlignError,
    AlignOptions,
    align_face,
    align_face_4pt,
)
from stages.detect import Detect, DetectOptions
from stages.jobs import Job, LandmarkJob
from stages.models.adaface.job import FaceJob
from stages.models.clip.job import ClipJob
from stages.models.sapiens2.job import PoseJob


def context(tmp_path: Path) -> Context:
    config = parse_config(
        {"cameras": [{"name": "cam", "url": "synthetic:"}], "stages": [{"kind": "capture"}]},
        tmp_path / "run.toml",
    )
    return Context(config, Metrics())


def face_job(image: np.ndarray, landmarks: np.ndarray, source: str) -> FaceJob:
    t = now_ns()
    return FaceJob(
        camera="cam", seq=1, capture_ts_ns=t, deadline_ns=t + 10**10,
        box_xywh=np.array([0, 0, 10, 10], np.float32), score=0.9,
        landmarks=np.asarray(landmarks, np.float32), image=image, landmark_source=source,
    )  # fmt: skip


def test_five_landmarks_give_align_face_crops(tmp_path):
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (240, 320, 3), np.uint8)
    angle = np.deg2rad(20)
    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    landmarks = (ARCFACE_TEMPLATE - 56) @ rot.T * 1.7 + [160, 120]  # a rotated, larger face
    (job,) = Align("align", AlignOptions(), context(tmp_path)).process(
        face_job(image, landmarks, "yunet")
    )
    expected, _ = align_face(image, landmarks.astype(np.float32))
    assert job.aligned.shape == (112, 112, 3) and job.aligned.dtype == np.uint8
    np.testing.assert_array_equal(job.aligned, expected)
    assert job.image is None  # the frame reference is dropped once aligned


def test_blazeface_jobs_on_the_astronaut_give_align_face_4pt_crops(tmp_path):
    ctx = context(tmp_path)
    image = cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR)
    t = now_ns()
    detect = Detect("detect", DetectOptions(person="none"), ctx)
    (face,) = [
        i for i in detect.process(Frame("cam", 0, t, t + 10**10, image)) if isinstance(i, FaceJob)
    ]
    landmarks = face.landmarks.copy()
    (job,) = Align("align", AlignOptions(), ctx).process(face)
    expected, matrix = align_face_4pt(image, landmarks)
    np.testing.assert_array_equal(job.aligned, expected)
    # the eyes land near the template's eyes (the 4-point fit is an approximation)
    eyes = np.hstack([landmarks[:2], np.ones((2, 1))]) @ matrix.T
    np.testing.assert_allclose(eyes, ARCFACE_TEMPLATE[:2], atol=4.0)


def test_pose_and_clip_jobs_pass_through_and_bad_landmarks_are_errors(tmp_path):
    stage = Align("align", AlignOptions(), context(tmp_path))
    image = np.zeros((32, 32, 3), np.uint8)
    t = now_ns()
    common = {"camera": "cam", "seq": 1, "capture_ts_ns": t, "deadline_ns": t + 1}
    pose = PoseJob(**common, track_id=1, box_xywh=np.ones(4, np.float32), score=1.0, image=image)
    clip = ClipJob(**common, box_xywh=np.ones(4, np.float32), image=image)
    assert stage.process(pose) == [pose] and stage.process(clip) == [clip]
    with pytest.raises(AlignError, match=r"\[5, 2\] or BlazeFace's \[4, 2\], got shape \(3, 2\)"):
        stage.process(face_job(image, np.zeros((3, 2)), "x"))
    job = face_job(image, np.zeros((5, 2)), "x")
    job.image = None
    with pytest.raises(AlignError, match="no frame to align"):
        stage.process(job)


@dataclass(slots=True, kw_only=True)
class AgeJob(LandmarkJob):
    """Another model's job on aligned faces (the issue's "age" model), not a FaceJob."""


@dataclass(slots=True, kw_only=True)
class WholeFrameJob(Job):
    """Another model's job with no landmarks."""

    image: np.ndarray


def test_any_job_with_landmarks_is_aligned_and_any_other_job_passes_through(tmp_path):
    stage = Align("align", AlignOptions(), context(tmp_path))
    assert stage.accepts == (Job,)  # an outbox routes every job through align
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (120, 160, 3), np.uint8)
    landmarks = (ARCFACE_TEMPLATE - 56) * 0.8 + [80, 60]
    t = now_ns()
    common = {"camera": "cam", "seq": 2, "capture_ts_ns": t, "deadline_ns": t + 10**10}
    age = AgeJob(**common, box_xywh=np.zeros(4, np.float32), score=1.0,
                 landmarks=landmarks.astype(np.float32), image=image)  # fmt: skip
    (out,) = stage.process(age)
    assert out is age and age.image is None
    np.testing.assert_array_equal(age.aligned, align_face(image, landmarks.astype(np.float32))[0])
    whole = WholeFrameJob(**common, image=image)
    assert stage.process(whole) == [whole] and whole.image is image
