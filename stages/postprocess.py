"""Heatmaps -> keypoints, as HF's Sapiens2 post_process_pose_estimation.

Argmax (first maximum), one DARK/UDP Newton step on the log of the max-preserving Gaussian
blur (kernel 11, sigma 2, zero borders), mapped back through the crop window. Reference:
transformers 5.23.0 models/sapiens2/image_processing_sapiens2.py (spec sapiens2 §5).

The blur is evaluated only at the 3x3 neighbourhood of each argmax, each value from its
11x11 zero-padded window (separably). The max-preserving rescale by s = max(m)/max(blur(m))
needs the maximum of the whole blurred map, but it cancels out of the Newton step: the step
uses differences of ln(clip(s·B, 1e-3, 50)), and where no clip engages these equal
differences of ln B. Since blur weights sum to at most 1, max(B) <= max(m), so s >= 1;
and s·B <= max(m). Hence if every neighbourhood value B >= 1e-3 and max(m) <= 50, no clip
engages for any admissible s and the step is computed from ln B exactly. Only maps failing
that test (weak or very strong peaks) are blurred in full to get s exactly.

Score <= 0: HF sets the location to (-1, -1) and then reads the replicate-padded log map
at flat offsets from padded (0, 0), which wrap into the previous map (or the end of the
batch); its refined coordinates there are artefacts. Here such keypoints keep the location
(-1, -1) unrefined (equivalent to clamping every lookup to the map), mapped through the
window like any other; their score is the raw maximum, as HF's.

The stages at the end of the file turn the infer stage's outputs into published results:
`dark` (pose heatmaps -> keypoints), `face_match` (embeddings -> gallery identities) and
`clip_labels` (CLIP image embeddings -> label probabilities, spec b.8).
"""

from __future__ import annotations

import logging

import numpy as np
from pydantic import Field

from npu.models.keypoints308 import NAMES as KEYPOINT_NAMES
from npu.models.keypoints308 import face_points
from pipeline.errors import NpucamError
from pipeline.graph import MapStage, StageOptions
from pipeline.messages import ClipResult, FaceResult, PoseResult, now_ns
from stages.detect import run_tracks
from stages.gallery import Gallery, GalleryFile
from stages.jobs import (
    ClipInferred,
    ClipJob,
    FaceInferred,
    FaceJob,
    Inferred,
    PoseInferred,
    PoseJob,
)

logger = logging.getLogger(__name__)

BLUR_KERNEL = 11
LOG_CLIP = (1e-3, 50.0)
F32_EPS = float(np.finfo(np.float32).eps)


class PostprocessError(NpucamError):
    """Heatmaps or windows that cannot be decoded."""


def gaussian_taps(kernel: int = BLUR_KERNEL) -> np.ndarray:
    """Normalised 1-D Gaussian taps, float64 [kernel], sigma from OpenCV's rule for sigma=0."""
    if kernel % 2 == 0 or kernel <= 1:
        raise PostprocessError(f"blur kernel must be an odd integer > 1, got {kernel}")
    sigma = 0.3 * ((kernel - 1) * 0.5 - 1) + 0.8
    t = np.arange(kernel, dtype=np.float64) - (kernel - 1) / 2
    taps = np.exp(-0.5 * (t / sigma) ** 2)
    return taps / taps.sum()


def _blur_full(maps: np.ndarray, taps: np.ndarray) -> np.ndarray:
    """Zero-bordered separable blur of whole maps: float [M, H, W] -> float64 [M, H, W]."""
    r = len(taps) // 2
    m, h, w = maps.shape
    padded = np.zeros((m, h + 2 * r, w + 2 * r), dtype=np.float64)
    padded[:, r : r + h, r : r + w] = maps
    rows = sum(taps[i] * padded[:, :, i : i + w] for i in range(len(taps)))
    return sum(taps[i] * rows[:, i : i + h, :] for i in range(len(taps)))


def _blur_at(
    flat: np.ndarray, h: int, w: int, ys: np.ndarray, xs: np.ndarray, taps: np.ndarray
) -> np.ndarray:
    """Blurred values at given points, each from its zero-padded window.

    flat: float32 [M, H*W]; ys: int [M, P], xs: int [M, Q] -> float64 [M, P, Q], the blur at
    every (ys[:, p], xs[:, q]).
    """
    r = len(taps) // 2
    offs = np.arange(-r, r + 1)
    yy = ys[:, :, None] + offs  # [M, P, T]
    xx = xs[:, :, None] + offs  # [M, Q, T]
    y_ok = (yy >= 0) & (yy < h)
    x_ok = (xx >= 0) & (xx < w)
    idx = (
        np.clip(yy, 0, h - 1)[:, :, :, None, None] * w + np.clip(xx, 0, w - 1)[:, None, None, :, :]
    )  # [M, P, T, Q, T]
    vals = np.take_along_axis(flat, idx.reshape(len(flat), -1), axis=1).reshape(idx.shape)
    vals = vals.astype(np.float64) * (y_ok[:, :, :, None, None] & x_ok[:, None, None, :, :])
    return np.einsum("mptqs,t,s->mpq", vals, taps, taps, optimize=True)


def _check_windows(windows: np.ndarray, n: int) -> np.ndarray:
    win = np.asarray(windows, dtype=np.float64)
    if win.shape != (n, 4):
        raise PostprocessError(f"windows must be [{n}, 4] (cx, cy, w, h), got shape {win.shape}")
    if not np.all(np.isfinite(win)) or np.any(win[:, 2:] <= 0):
        bad = int(np.flatnonzero(~np.all(np.isfinite(win), axis=1) | np.any(win[:, 2:] <= 0, 1))[0])
        raise PostprocessError(f"windows[{bad}] = {win[bad].tolist()} is not a valid window")
    return win


def dark_keypoints(
    heatmaps: np.ndarray, windows: np.ndarray, kernel: int = BLUR_KERNEL
) -> np.ndarray:
    """Decode heatmaps to keypoints in image pixels.

    heatmaps: float32 [N, K, H, W]; windows: float [N, 4] as (cx, cy, w, h) of each crop's
    sampled region (from stages.detect.crop_persons).
    Returns float32 [N, K, 3] as (x, y, score), score = the heatmap maximum.
    """
    hm = np.asarray(heatmaps)
    if hm.ndim != 4 or min(hm.shape) == 0 or min(hm.shape[2:]) < 2:
        raise PostprocessError(
            f"heatmaps must be a non-empty [N, K, H, W] array with H, W >= 2, got {hm.shape}"
        )
    if hm.dtype != np.float32:
        raise PostprocessError(f"heatmaps must be float32, got dtype {hm.dtype}")
    n, k, h, w = hm.shape
    win = _check_windows(windows, n)
    taps = gaussian_taps(kernel)

    flat = hm.reshape(n * k, h * w)
    idx = np.argmax(flat, axis=1)  # first maximum, as torch.argmax
    score = np.take_along_axis(flat, idx[:, None], axis=1)[:, 0]
    if not np.all(np.isfinite(score)):
        bad = int(np.flatnonzero(~np.isfinite(score))[0])
        raise PostprocessError(f"heatmaps[{bad // k}, {bad % k}] contains NaN or inf")
    x = (idx % w).astype(np.int64)
    y = (idx // w).astype(np.int64)
    pos = score > 0

    # replicate padding of the log map = clamping the neighbour coordinates
    nx = np.clip(x[:, None] + np.arange(-1, 2), 0, w - 1)
    ny = np.clip(y[:, None] + np.arange(-1, 2), 0, h - 1)
    blur = _blur_at(flat, h, w, ny, nx, taps)  # [M, 3(y), 3(x)]

    lo, hi = LOG_CLIP
    exact = pos & ((blur.min(axis=(1, 2)) < lo) | (score > hi))
    if np.any(exact):
        # the clip may engage: the rescale factor is needed, from the whole blurred map
        rows = np.flatnonzero(exact)
        full = _blur_full(flat[rows].reshape(-1, h, w), taps)
        top = full.reshape(len(rows), -1).max(axis=1)
        scale = np.where(top > 0, score[rows] / np.where(top > 0, top, 1.0), 1.0)
        blur[rows] = np.clip(blur[rows] * scale[:, None, None], lo, hi)
    with np.errstate(divide="ignore", invalid="ignore"):
        log = np.log(np.where(pos[:, None, None], blur, 1.0))

    gx = 0.5 * (log[:, 1, 2] - log[:, 1, 0])
    gy = 0.5 * (log[:, 2, 1] - log[:, 0, 1])
    hxx = log[:, 1, 2] - 2 * log[:, 1, 1] + log[:, 1, 0] + F32_EPS
    hyy = log[:, 2, 1] - 2 * log[:, 1, 1] + log[:, 0, 1] + F32_EPS
    hxy = 0.5 * (
        log[:, 2, 2] - log[:, 1, 2] - log[:, 2, 1] + 2 * log[:, 1, 1]
        - log[:, 1, 0] - log[:, 0, 1] + log[:, 0, 0]
    )  # fmt: skip
    det = hxx * hyy - hxy * hxy
    with np.errstate(divide="ignore", invalid="ignore"):
        dx = (hyy * gx - hxy * gy) / det
        dy = (-hxy * gx + hxx * gy) / det
    kx = np.where(pos, x - dx, -1.0).reshape(n, k)
    ky = np.where(pos, y - dy, -1.0).reshape(n, k)

    cx, cy, ww, wh = (win[:, i, None] for i in range(4))
    out = np.empty((n, k, 3), dtype=np.float32)
    out[:, :, 0] = kx / (w - 1) * ww + cx - 0.5 * ww
    out[:, :, 1] = ky / (h - 1) * wh + cy - 0.5 * wh
    out[:, :, 2] = score.reshape(n, k)
    return out


# ---- the post-processing stages: Inferred (stages.jobs) -> published results --------------
# The infer stage emits one Inferred subclass per kind; each stage's inbox takes only its own.


class DarkOptions(StageOptions):
    kernel: int = Field(BLUR_KERNEL, ge=3)  # DARK's Gaussian blur kernel (odd)
    # face jobs from each 308-keypoint pose's 5 face points (npu.models.keypoints308), sent
    # on by the detect stage of the same run with its next frame of that camera
    face_points: bool = False
    face_min_score: float = Field(0.3, ge=0)  # every point used must score above this


def _xyxy(box_xywh: np.ndarray) -> np.ndarray:
    b = np.asarray(box_xywh, np.float32).reshape(4)
    return np.array([b[0], b[1], b[0] + b[2], b[1] + b[3]], np.float32)


def _result_fields(item: Inferred) -> dict:
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


class Dark(MapStage):
    """Inferred pose heatmaps -> PoseResult: DARK keypoints in frame pixels through the crop
    window the infer stage recorded, with the track id and the pose's age (the track's pose
    refresh is marked finished in the run's tracker, stages.detect.run_tracks)."""

    kind = "dark"
    accepts = (PoseInferred,)
    Options = DarkOptions

    def process(self, item: Inferred) -> list[PoseResult]:
        job = item.job
        if not isinstance(job, PoseJob):
            return []
        where = f"camera {job.camera!r} #{job.seq} track {job.track_id}"
        if job.window is None:
            raise PostprocessError(f"{where}: the pose job has no crop window from infer")
        heatmaps = np.asarray(item.output)
        if heatmaps.ndim != 3:
            raise PostprocessError(f"{where}: heatmaps must be [K, H, W], got {heatmaps.shape}")
        keypoints = dark_keypoints(
            heatmaps[None].astype(np.float32, copy=False),
            np.asarray(job.window, np.float32).reshape(1, 4),
            self.options.kernel,
        )[0]
        at = now_ns()
        tag = None
        tracks = run_tracks(self.context).get(job.camera)
        if tracks is not None:
            tag = tracks.finish_pose(job.track_id, job.capture_ts_ns, at)
            face = self._face_job(job, keypoints) if self.options.face_points else None
            if face is not None:
                with tracks.lock:
                    tracks.pose_faces.append(face)
        if tag is not None and tag.tracked:  # the tracker's word: since its previous pose
            since_ms = None if tag.since_previous_ns is None else tag.since_previous_ns / 1e6
        else:  # no tracker in this run (a split config), or the track expired while its
            # pose ran (the tracker forgot it): the age detect saw when it made the job
            since_ms = None if job.pose_age_s is None else job.pose_age_s * 1e3
        return [
            PoseResult(
                **_result_fields(item),
                track_id=job.track_id,
                keypoints=keypoints,
                box=_xyxy(job.box_xywh),
                score=job.score,
                age_ms=(at - job.capture_ts_ns) / 1e6,
                since_previous_ms=since_ms,
            )
        ]

    def _face_job(self, job: PoseJob, keypoints: np.ndarray) -> FaceJob | None:
        """A face job on the pose's own frame from its 5 face points, or None when the pose
        is not Sapiens2's 308 keypoints or a point has no confident candidate. The box is
        an approximation: a square of twice the points' extent around their mean."""
        if keypoints.shape[0] != len(KEYPOINT_NAMES) or job.image is None:
            return None
        points = face_points(keypoints, self.options.face_min_score)
        if points is None:
            return None
        centre = points.mean(axis=0)
        side = 2.0 * float(np.ptp(points, axis=0).max())
        if side <= 0:
            return None
        return FaceJob(
            camera=job.camera,
            seq=job.seq,
            capture_ts_ns=job.capture_ts_ns,
            deadline_ns=job.deadline_ns,
            frame_size=job.frame_size,
            box_xywh=np.array([*(centre - side / 2), side, side], np.float32),
            score=job.score,
            landmarks=points,
            image=job.image,
            track_id=job.track_id,
            landmark_source="sapiens2",
        )


class FaceMatchOptions(StageOptions):
    gallery: str | None = Field(None, min_length=1)  # gallery file (docs/face-id.md); relative
    # paths resolve against the config's directory; None: no identities (embeddings only)
    threshold: float = Field(0.4, ge=-1, le=1)
    margin: float = Field(0.05, ge=0, le=2)
    reload_interval_s: float = Field(1.0, ge=0)  # how often the file's stamp is looked at


class FaceMatch(MapStage):
    """Inferred face embeddings -> FaceResult: the L2-normalised embedding, identified
    against the gallery file (hot-reloaded when it changes; a corrupt file keeps the
    previous gallery), with the box and alignment points."""

    kind = "face_match"
    accepts = (FaceInferred,)
    Options = FaceMatchOptions

    def __init__(self, name, options, context) -> None:
        super().__init__(name, options, context)
        self.gallery: GalleryFile | None = None
        if options.gallery is not None:
            self.gallery = GalleryFile(context.config.base_dir / options.gallery)
        self._checked_ns = 0
        self._warned_model = False

    def _current(self) -> Gallery | None:
        if self.gallery is None:
            return None
        at = now_ns()
        if at - self._checked_ns >= self.options.reload_interval_s * 1e9:
            self._checked_ns = at
            self.gallery.reload_if_changed()
        return self.gallery.current

    def process(self, item: Inferred) -> list[FaceResult]:
        job = item.job
        if not isinstance(job, FaceJob):
            return []
        e = np.asarray(item.output, np.float32).reshape(-1)
        norm = float(np.linalg.norm(e))
        if not np.all(np.isfinite(e)) or norm == 0:
            raise PostprocessError(
                f"camera {job.camera!r} #{job.seq}: face embedding is zero or not finite"
            )
        e = e / np.float32(norm)
        identity, similarity, margin = None, -1.0, 0.0
        reason = "no_gallery"
        gallery = self._current()
        if gallery is not None:
            if gallery.embed_dim != e.shape[0] and gallery.names:
                raise PostprocessError(
                    f"camera {job.camera!r}: embedding dim {e.shape[0]} does not match the "
                    f"gallery's {gallery.embed_dim} ({self.gallery.path})"
                )
            if gallery.model and gallery.model != item.model and not self._warned_model:
                self._warned_model = True
                logger.warning(
                    "stage %s: gallery %s holds %r embeddings, faces come from %r: "
                    "similarities across models mean nothing (enrol with the stream's model)",
                    self.name,
                    self.gallery.path,
                    gallery.model,
                    item.model,
                )
            if gallery.names:
                m = gallery.identify(e, self.options.threshold, self.options.margin)
                identity, similarity, margin, reason = m.name, m.similarity, m.margin, m.reason
            else:
                reason = "empty_gallery"
        return [
            FaceResult(
                **_result_fields(item),
                box=_xyxy(job.box_xywh),
                landmarks=np.asarray(job.landmarks, np.float32),
                embedding=e,
                identity=identity,
                similarity=similarity,
                margin=margin,
                score=job.score,
                track_id=job.track_id,
                extra={"reason": reason, "landmark_source": job.landmark_source},
            )
        ]


class ClipLabelsOptions(StageOptions):
    pass


def label_probabilities(
    image_embed: np.ndarray, text_embeds: np.ndarray, logit_scale: float
) -> np.ndarray:
    """CLIP zero-shot (spec b.8): softmax over labels of logit_scale · cos(image, text).

    image_embed: float [D]; text_embeds: float [L, D]; logit_scale: the exp'd scale (100 for
    the released models). Returns float32 [L], summing to 1.
    """
    img = np.asarray(image_embed, np.float64).reshape(-1)
    txt = np.asarray(text_embeds, np.float64)
    if txt.ndim != 2 or txt.shape[1] != img.shape[0] or txt.shape[0] == 0:
        raise PostprocessError(
            f"text embeddings must be [L >= 1, {img.shape[0]}], got shape {txt.shape}"
        )
    img_n, txt_n = np.linalg.norm(img), np.linalg.norm(txt, axis=1)
    if img_n == 0 or np.any(txt_n == 0) or not np.isfinite(img).all():
        raise PostprocessError("CLIP embeddings must be finite and non-zero")
    logits = float(logit_scale) * (txt @ img) / (txt_n * img_n)
    e = np.exp(logits - logits.max())
    return (e / e.sum()).astype(np.float32)


class ClipLabels(MapStage):
    """Inferred CLIP image embeddings -> ClipResult: label probabilities from the text
    embeddings and logit scale the infer stage attached (Inferred.extra)."""

    kind = "clip_labels"
    accepts = (ClipInferred,)
    Options = ClipLabelsOptions

    def process(self, item: Inferred) -> list[ClipResult]:
        job = item.job
        if not isinstance(job, ClipJob):
            return []
        where = f"camera {job.camera!r} #{job.seq}"
        missing = [k for k in ("labels", "text_embeds", "logit_scale") if k not in item.extra]
        if missing:
            raise PostprocessError(f"{where}: CLIP output lacks {', '.join(missing)}")
        labels = tuple(item.extra["labels"])
        probs = label_probabilities(
            item.output, item.extra["text_embeds"], item.extra["logit_scale"]
        )
        if len(labels) != len(probs):
            raise PostprocessError(
                f"{where}: {len(labels)} labels but {len(probs)} text embeddings"
            )
        return [
            ClipResult(
                **_result_fields(item),
                labels=labels,
                probabilities=probs,
                box=_xyxy(job.box_xywh),
                track_id=job.track_id,
            )
        ]
