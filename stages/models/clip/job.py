"""CLIP's work items: the ClipJob on a region of a frame (detect -> infer) and the ClipInferred
the infer stage sends on (-> clip_labels, stages.models.clip.post)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stages.jobs import Inferred, Job


@dataclass(slots=True, kw_only=True)
class ClipJob(Job):
    """A region to label zero-shot (detect -> infer). image: the source frame, uint8 BGR
    [H, W, 3]; box_xywh: float32 [4], the whole frame for frame labels."""

    box_xywh: np.ndarray
    image: np.ndarray
    track_id: int | None = None


@dataclass(slots=True, kw_only=True)
class ClipInferred(Inferred):
    """A CLIP image embedding of a ClipJob with its labels in extra (-> ClipLabels)."""
