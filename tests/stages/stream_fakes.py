"""A test-only stand-in for the infer stage: jobs -> Inferred with deterministic outputs, so
the detect / align / postprocess stages can be tested without a model (never in product)."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from npu.models.sapiens2.preprocess import crop_windows
from pipeline.graph import MapStage, StageOptions
from stages.jobs import Inferred, Job
from stages.models.adaface.job import FaceInferred, FaceJob
from stages.models.clip.job import ClipInferred, ClipJob
from stages.models.sapiens2.job import PoseInferred, PoseJob

LABELS = ("a person", "a bicycle", "a phone")


def peaked_heatmaps(k: int, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 [k, h, w] heatmaps with one Gaussian peak (sigma 2) each, at integer (x, y)
    positions float64 [k, 2] spread over the map (w, h >= 16)."""
    # 7+ px from every border, so the zero border does not skew the peak
    peaks = np.stack([(5 * np.arange(k)) % (w - 14) + 7, (7 * np.arange(k)) % (h - 14) + 7])
    yy, xx = np.mgrid[0:h, 0:w]
    maps = np.exp(
        -((xx[None] - peaks[0][:, None, None]) ** 2 + (yy[None] - peaks[1][:, None, None]) ** 2)
        / 8.0
    )
    return maps.astype(np.float32), peaks.T.astype(np.float64)


def label_embeddings(dim: int) -> np.ndarray:
    """float32 [len(LABELS), dim]: orthonormal text embeddings."""
    q, _ = np.linalg.qr(np.random.default_rng(7).normal(size=(dim, len(LABELS))))
    return q.T.astype(np.float32)


def inferred_type(job: Job) -> type[Inferred]:
    """The Inferred subclass a job's model sends on (its runtime's inferred_type), so the graph
    routes each fake output to that kind's postprocess stage."""
    if isinstance(job, PoseJob):
        return PoseInferred
    if isinstance(job, FaceJob):
        return FaceInferred
    if isinstance(job, ClipJob):
        return ClipInferred
    return Inferred


class FakeInferOptions(StageOptions):
    keypoints: int = Field(17, ge=1)
    heatmap: list[int] = [64, 48]
    embed_dim: int = Field(32, ge=len(LABELS))


class FakeInfer(MapStage):
    """PoseJob -> peaked heatmaps (window from crop_windows); FaceJob (aligned) -> an
    embedding from the crop's channel means; ClipJob -> the text embedding of label
    `track_id % 3` (frames: label 0), with the extra the CLIP stage needs."""

    kind = "fake_infer"
    accepts = (PoseJob, FaceJob, ClipJob)
    Options = FakeInferOptions

    def process(self, job):
        o = self.options
        if isinstance(job, PoseJob):
            job.window = crop_windows(job.box_xywh[None])[0]
            output, extra = peaked_heatmaps(o.keypoints, *o.heatmap)[0], {}
        elif isinstance(job, FaceJob):
            assert job.aligned is not None and job.aligned.shape == (112, 112, 3)
            means = job.aligned.reshape(-1, 3).mean(axis=0)
            output = np.resize(means, o.embed_dim).astype(np.float32) + np.arange(o.embed_dim)
            extra = {}
        else:
            text = label_embeddings(o.embed_dim)
            output = text[(job.track_id or 0) % len(LABELS)].copy()
            extra = {"labels": list(LABELS), "text_embeds": text, "logit_scale": 100.0}
        return [
            inferred_type(job)(
                job=job,
                output=output,
                backend="fake",
                model=f"fake-{type(job).__name__}",
                synthetic=True,
                extra=extra,
            )
        ]
