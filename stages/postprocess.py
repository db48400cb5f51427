"""What every model's post stage (stages/models/<model>/post.py: dark, face_match, clip_labels)
shares: its error type, a published result's frame identity and provenance from an Inferred,
and a job's box as corners."""

from __future__ import annotations

import numpy as np

from pipeline.errors import NpucamError
from stages.jobs import Inferred


class PostprocessError(NpucamError):
    """Heatmaps or windows that cannot be decoded."""


def xyxy(box_xywh: np.ndarray) -> np.ndarray:
    """(x, y, w, h) -> float32 [4] (x1, y1, x2, y2), a published result's box."""
    b = np.asarray(box_xywh, np.float32).reshape(4)
    return np.array([b[0], b[1], b[0] + b[2], b[1] + b[3]], np.float32)


def result_fields(item: Inferred) -> dict:
    """The Result fields of an Inferred: its job's frame identity, its backend and model."""
    job = item.job
    return {
        "camera": job.camera,
        "seq": job.seq,
        "capture_ts_ns": job.capture_ts_ns,
        "deadline_ns": job.deadline_ns,
        "backend": item.backend,
        "model": item.model,
        "synthetic": item.synthetic,
    }
