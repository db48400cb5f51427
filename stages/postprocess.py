"""The postprocess stages: the infer stage's outputs -> published results. `dark` turns pose
heatmaps into 308 keypoints in frame pixels (npu.models.sapiens2.post), `face_match`
identifies face embeddings against the gallery (stages.gallery), `clip_labels` turns CLIP
image embeddings into label probabilities (npu.models.clip.post).
"""

from __future__ import annotations

import logging
import os

import numpy as np
from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from npu.models.clip.post import ZeroShotError, label_probabilities
from npu.models.sapiens2.keypoints import NAMES as KEYPOINT_NAMES
from npu.models.sapiens2.keypoints import face_points
from npu.models.sapiens2.post import BLUR_KERNEL, dark_keypoints
from pipeline.config import Config
from pipeline.errors import NpucamError
from pipeline.files import path_kind
from pipeline.graph import MapStage, StageOptions
from pipeline.messages import ClipResult, FaceResult, PoseResult, now_ns
from stages.gallery import (
    GALLERY_MAX_BYTES,
    Gallery,
    GalleryError,
    GalleryFile,
    GalleryMissingError,
    read_gallery,
)
from stages.jobs import (
    ClipInferred,
    ClipJob,
    FaceInferred,
    FaceJob,
    Inferred,
    PoseInferred,
    PoseJob,
)
from stages.tracks import TrackRegistry

logger = logging.getLogger(__name__)


class PostprocessError(NpucamError):
    """Heatmaps or windows that cannot be decoded."""


# ---- the post-processing stages: Inferred (stages.jobs) -> published results --------------
# The infer stage emits one Inferred subclass per kind; each stage's inbox takes only its own.


MAX_BLUR_KERNEL = 99  # DARK's blur kernel: the heatmaps are 64 x 48 (Sapiens2: 256 x 192)


class DarkOptions(StageOptions):
    kernel: int = Field(BLUR_KERNEL, ge=3, le=MAX_BLUR_KERNEL)  # DARK's Gaussian blur (odd)
    # face jobs from each 308-keypoint pose's 5 face points (npu.models.sapiens2.keypoints), sent
    # on by the detect stage of the same run with its next frame of that camera
    face_points: bool = False
    face_min_score: float = Field(0.3, ge=0)  # every point used must score above this

    @field_validator("kernel")
    @classmethod
    def _odd(cls, kernel: int) -> int:
        if kernel % 2 == 0:  # npu.models.sapiens2.post.gaussian_taps refuses it on every pose
            raise PydanticCustomError("odd_kernel", "expected an odd integer")
        return kernel


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


class Dark(MapStage[DarkOptions]):
    """Inferred pose heatmaps -> PoseResult: DARK keypoints in frame pixels through the crop
    window the infer stage recorded, with the track id and the pose's age (the track's pose
    refresh is marked finished in the run's tracker, stages.tracks.TrackRegistry)."""

    kind = "dark"
    accepts = (PoseInferred,)
    Options = DarkOptions

    @classmethod
    def produces(cls, options: DarkOptions) -> tuple[type, ...]:
        """With face_points, a FaceJob per pose's face (sent on by the detect stage)."""
        return (FaceJob,) if options.face_points else ()

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
        tracks = TrackRegistry.of(self.context).get(job.camera)
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
    gallery_max_bytes: int = Field(GALLERY_MAX_BYTES, ge=1024)  # largest gallery file read


def _gallery_key(config: Config, index: int) -> str:
    return f"stages[{index}].gallery"


class FaceMatch(MapStage[FaceMatchOptions]):
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
            self.gallery = GalleryFile(
                context.config.base_dir / options.gallery,
                interval_s=options.reload_interval_s,
                max_bytes=options.gallery_max_bytes,
            )
            if path_kind(self.gallery.path, follow=False) == "missing":
                names = context.config.stage_names
                key = f"stages[{names.index(name)}]" if name in names else f"stage {name}"
                logger.warning(
                    "%s: %s", context.config.path, _missing_gallery(key, self.gallery.path)
                )
        self._warned_model = False

    @classmethod
    def check(cls, config: Config, index: int) -> list[str]:
        """The gallery file, read and decoded as the stage will at start: a regular file
        (no FIFO, device, directory or symlink), within gallery_max_bytes, a gallery. A
        missing one is only a warning (`warnings`): enrolment may create it later."""
        path, max_bytes = cls._gallery_file(config, index)
        if path is None:
            return []
        try:
            read_gallery(path, max_bytes)
        except GalleryMissingError:
            return []
        except GalleryError as exc:
            return [f"{_gallery_key(config, index)}: {exc}"]
        return []

    @classmethod
    def warnings(cls, config: Config, index: int) -> list[str]:
        """A gallery path with no file yet: the run starts, with no identities."""
        path, _ = cls._gallery_file(config, index)
        if path is None or path_kind(path, follow=False) != "missing":
            return []
        return [_missing_gallery(f"stages[{index}]", path)]

    @staticmethod
    def _gallery_file(config: Config, index: int):
        opts = config.stages[index].options
        raw, max_bytes = opts.get("gallery"), opts.get("gallery_max_bytes", GALLERY_MAX_BYTES)
        if not isinstance(raw, str) or not raw or type(max_bytes) is not int:  # noqa: E721
            return None, GALLERY_MAX_BYTES  # Options validation reports these
        return config.base_dir / raw, max_bytes

    def _current(self) -> Gallery | None:
        if self.gallery is None:
            return None
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


def _missing_gallery(key: str, path) -> str:
    path = os.path.normpath(path)
    return (
        f"{key}.gallery: {path}: no such gallery file; every face is "
        "`empty_gallery` until someone is enrolled there (`npucam face enroll NAME IMAGE... "
        f"--gallery {path}`), then the stage loads it"
    )


class ClipLabelsOptions(StageOptions):
    pass


class ClipLabels(MapStage[ClipLabelsOptions]):
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
        try:
            probs = label_probabilities(
                item.output, item.extra["text_embeds"], item.extra["logit_scale"]
            )
        except ZeroShotError as exc:
            raise PostprocessError(f"{where}: {exc}") from exc
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
