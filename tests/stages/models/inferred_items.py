"""Inferred items of each released model, as the infer stage sends them to the post stages
(stages/models/<model>/post.py), for the post-stage tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.config import parse_config
from pipeline.graph import Context
from pipeline.messages import now_ns
from pipeline.metrics import Metrics
from stages.jobs import Inferred
from stages.models.adaface.job import FaceInferred, FaceJob
from stages.models.clip.job import ClipInferred, ClipJob
from stages.models.sapiens2.job import PoseInferred, PoseJob


def context(tmp_path: Path) -> Context:
    config = parse_config({"stages": [{"kind": "capture"}]}, tmp_path / "run.toml")
    return Context(config, Metrics())


def frame_fields(seq: int = 3) -> dict:
    t = now_ns()
    return {"camera": "cam", "seq": seq, "capture_ts_ns": t, "deadline_ns": t + 10**10}


def pose_item(heatmaps: np.ndarray, window, track_id: int = 4) -> Inferred:
    job = PoseJob(
        **frame_fields(),
        track_id=track_id,
        box_xywh=np.array([10, 20, 30, 60], np.float32),
        score=0.9,
        image=np.zeros((4, 4, 3), np.uint8),
        pose_age_s=0.5,
        window=np.asarray(window, np.float32),
    )
    return PoseInferred(job=job, output=heatmaps, backend="sim", model="m", synthetic=True)


def face_item(embedding: np.ndarray) -> Inferred:
    job = FaceJob(
        **frame_fields(),
        box_xywh=np.array([5, 6, 20, 24], np.float32),
        score=0.8,
        landmarks=np.arange(10, dtype=np.float32).reshape(5, 2),
        track_id=2,
        landmark_source="yunet",
    )
    return FaceInferred(job=job, output=embedding, backend="sim", model="adaface", synthetic=False)


def unit(rng: np.random.Generator, d: int = 512) -> np.ndarray:
    v = rng.normal(size=d).astype(np.float32)
    return v / np.linalg.norm(v)


def clip_item(image_embed, text, labels, scale=100.0, track_id=None) -> Inferred:
    job = ClipJob(
        **frame_fields(),
        box_xywh=np.array([0, 0, 64, 48], np.float32),
        image=np.zeros((48, 64, 3), np.uint8),
        track_id=track_id,
    )
    extra = {"labels": labels, "text_embeds": text, "logit_scale": scale}
    return ClipInferred(job=job, output=image_embed, backend="cpu", model="clip", synthetic=True,
                    extra=extra)  # fmt: skip
