"""5-point face alignment to the ArcFace 112x112 template, as insightface's `norm_crop`.

A similarity transform (rotation, uniform scale, translation; no reflection) is fitted with
Umeyama's method, exactly what scikit-image's `SimilarityTransform.estimate` computes
(docs/face-id.md), and the face is warped with cv2.warpAffine (bilinear, zero
border), as insightface and OpenCV's FaceRecognizerSF.alignCrop do (docs/face-id.md).

BlazeFace gives no mouth corners, so `align_face_4pt` fits eyes, nose and the mouth centre to
the template's mouth-corner midpoint: an approximation no upstream source gives (docs/face-id.md).
The colour order each embedder expects (docs/face-id.md) is data here, not a convention in comments.
The `align` stage applies this to every job that carries landmarks (stages.jobs.LandmarkJob).
"""

from __future__ import annotations

from typing import Literal

import cv2
import numpy as np
from pydantic import Field

from pipeline.errors import NpucamError
from pipeline.graph import MapStage, StageOptions
from stages.jobs import Job, LandmarkJob

ColourOrder = Literal["rgb", "bgr"]

# ArcFace template in 112x112 pixel coordinates (x, y), in image order: image-left eye,
# image-right eye, nose tip, image-left mouth corner, image-right mouth corner (docs/face-id.md).
ARCFACE_TEMPLATE = np.array(
    [
        [38.2946, 51.6963],
        [73.5318, 51.5014],
        [56.0252, 71.7366],
        [41.5493, 92.3655],
        [70.7299, 92.2041],
    ],
    dtype=np.float64,
)

# The 4-point template of BlazeFace's fit: eyes, nose, and the midpoint of the mouth corners.
ARCFACE_TEMPLATE_4PT = np.vstack([ARCFACE_TEMPLATE[:3], ARCFACE_TEMPLATE[3:].mean(axis=0)])


class AlignError(NpucamError):
    """Landmarks or image that cannot be aligned (wrong shape, non-finite, degenerate)."""


def umeyama_similarity(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Least-squares similarity src -> dst without reflection (Umeyama 1991), as skimage's.

    src, dst: float [N, 2] point sets (N >= 2). Returns float64 [3, 3], the homogeneous
    matrix; all NaN when src is degenerate (every point equal), as skimage returns.
    """
    src = np.asarray(src, dtype=np.float64)
    dst = np.asarray(dst, dtype=np.float64)
    n, dim = src.shape
    src_mean = src.mean(axis=0)
    dst_mean = dst.mean(axis=0)
    src_d = src - src_mean
    dst_d = dst - dst_mean
    a = dst_d.T @ src_d / n
    d = np.ones(dim)
    if np.linalg.det(a) < 0:
        d[dim - 1] = -1.0
    t = np.eye(dim + 1)
    u, s, vt = np.linalg.svd(a)
    # numpy's matrix_rank tolerance, from the singular values already at hand
    rank = int(np.count_nonzero(s > s.max(initial=0.0) * dim * np.finfo(np.float64).eps))
    if rank == 0:
        return np.full((dim + 1, dim + 1), np.nan)
    if rank == dim - 1:
        if np.linalg.det(u) * np.linalg.det(vt) > 0:
            r = u @ vt
        else:
            flip = np.ones(dim)
            flip[dim - 1] = -1.0
            r = u @ np.diag(flip) @ vt
    else:
        r = u @ np.diag(d) @ vt
    scale = (s @ d) / src_d.var(axis=0).sum()
    t[:dim, :dim] = scale * r
    t[:dim, dim] = dst_mean - scale * (r @ src_mean)
    return t


def _check_image(image: np.ndarray) -> None:
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8:
        raise AlignError(f"image must be a uint8 numpy array, got {type(image).__name__}")
    if image.ndim != 3 or image.shape[2] != 3 or image.shape[0] < 1 or image.shape[1] < 1:
        raise AlignError(f"image must be uint8 [H, W, 3], got shape {image.shape}")


def _fit_and_warp(
    image: np.ndarray, points: np.ndarray, template: np.ndarray, size: int
) -> tuple[np.ndarray, np.ndarray]:
    _check_image(image)
    if size < 8:
        raise AlignError(f"crop size must be >= 8, got {size}")
    pts = np.asarray(points, dtype=np.float64)
    if pts.shape != template.shape:
        raise AlignError(f"landmarks must be [{len(template)}, 2], got shape {pts.shape}")
    if not np.all(np.isfinite(pts)):
        raise AlignError("landmarks contain NaN or infinite values")
    m = umeyama_similarity(pts, template * (size / 112.0))
    if not np.all(np.isfinite(m)):
        raise AlignError("degenerate landmarks (all points coincide): no similarity fits")
    matrix = m[:2, :].astype(np.float64)
    crop = cv2.warpAffine(
        image,
        matrix,
        (size, size),
        flags=cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_CONSTANT,
        borderValue=0,
    )
    return crop, matrix


def align_face(
    image: np.ndarray, landmarks: np.ndarray, size: int = 112
) -> tuple[np.ndarray, np.ndarray]:
    """Warp a face onto the ArcFace template from 5 landmarks.

    image: uint8 [H, W, 3] in any channel order; landmarks: float [5, 2] (x, y) in image
    pixels in template order (image-left eye, image-right eye, nose, image-left mouth
    corner, image-right mouth corner). Returns (crop uint8 [size, size, 3] in the image's
    channel order, matrix float64 [2, 3] mapping image pixels -> crop pixels). The template
    is scaled by size/112.
    """
    return _fit_and_warp(image, landmarks, ARCFACE_TEMPLATE, size)


def align_face_4pt(
    image: np.ndarray, points: np.ndarray, size: int = 112
) -> tuple[np.ndarray, np.ndarray]:
    """BlazeFace alignment: eyes, nose, mouth centre -> the template (an approximation).

    points: float [4, 2] (x, y) in image pixels: image-left eye, image-right eye, nose tip,
    mouth centre; the mouth centre is fitted to the midpoint of the template's mouth
    corners (56.1396, 92.2848). Same outputs as `align_face`. The crop is close to, but not
    the same as, a 5-point alignment; docs/face-id.md says by how much it can shift.
    """
    return _fit_and_warp(image, points, ARCFACE_TEMPLATE_4PT, size)


def blazeface_alignment_points(keypoints: np.ndarray) -> np.ndarray:
    """BlazeFace's 6 keypoints -> the 4 points of `align_face_4pt`.

    keypoints: float [6, 2] in BlazeFace order (subject's right eye, left eye, nose tip,
    mouth centre, right ear, left ear). A frontal, unmirrored face has the subject's right
    eye on the image left, which is template point 0. Returns float64 [4, 2].
    """
    kp = np.asarray(keypoints, dtype=np.float64)
    if kp.shape != (6, 2):
        raise AlignError(f"BlazeFace keypoints must be [6, 2], got shape {kp.shape}")
    return kp[:4].copy()


# ---- the align stage ----------------------------------------------------------------------


class AlignOptions(StageOptions):
    size: int = Field(112, ge=8)  # the embedder's input side (AdaFace: 112)


class Align(MapStage[AlignOptions]):
    """A job that carries landmarks (a LandmarkJob: AdaFace's FaceJob, or any model's on
    faces) -> the same job with `aligned` (uint8 [size, size, 3] BGR) filled in and its frame
    reference dropped. 5 landmarks (YuNet) use `align_face`; BlazeFace's 4 points
    (landmark_source "blazeface") use the documented approximation `align_face_4pt`.

    Every other job passes through unchanged, so detect -> align -> infer is one chain (a
    face job sent to both align and infer would reach infer unaligned)."""

    kind = "align"
    accepts = (Job,)
    Options = AlignOptions

    def process(self, job: Job) -> list[Job]:
        if not isinstance(job, LandmarkJob):
            return [job]
        if job.image is None:
            raise AlignError(f"camera {job.camera!r} #{job.seq}: face job has no frame to align")
        points = np.asarray(job.landmarks, np.float64)
        if points.shape == (5, 2):
            crop, _ = align_face(job.image, points, self.options.size)
        elif points.shape == (4, 2):
            crop, _ = align_face_4pt(job.image, points, self.options.size)
        else:
            raise AlignError(
                f"camera {job.camera!r} #{job.seq}: landmarks must be [5, 2] or BlazeFace's "
                f"[4, 2], got shape {points.shape}"
            )
        job.aligned = crop
        job.image = None
        return [job]
