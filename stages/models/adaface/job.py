"""AdaFace's work items: the FaceJob on a face with alignment points (detect or dark -> align
-> infer) and the FaceInferred the infer stage sends on (-> face_match,
stages.models.adaface.post)."""

from __future__ import annotations

from dataclasses import dataclass

from stages.jobs import Inferred, LandmarkJob


@dataclass(slots=True, kw_only=True)
class FaceJob(LandmarkJob):
    """A detected face to embed with its alignment points (AdaFace's job)."""


@dataclass(slots=True, kw_only=True)
class FaceInferred(Inferred):
    """An AdaFace embedding of a FaceJob (-> FaceMatch)."""
