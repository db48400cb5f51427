"""Sapiens2's work items: the PoseJob detect makes for a tracked person and the PoseInferred
the infer stage sends on (-> the dark stage, stages.models.sapiens2.post)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stages.jobs import Inferred, Job


@dataclass(slots=True, kw_only=True)
class PoseJob(Job):
    """A tracked person to refresh the pose of (detect -> infer).

    image: the source frame, uint8 BGR [H, W, 3]; box_xywh: float32 [4]; pose_age_s: seconds
    since this track's previous pose (None for a new track). The infer stage fills window,
    float32 [4] (cx, cy, w, h) of the sampled region (npu.models.sapiens2.preprocess.crop_persons).
    """

    track_id: int
    box_xywh: np.ndarray
    score: float
    image: np.ndarray
    pose_age_s: float | None = None
    window: np.ndarray | None = None


@dataclass(slots=True, kw_only=True)
class PoseInferred(Inferred):
    """Sapiens2 heatmaps of a PoseJob (-> Dark)."""
