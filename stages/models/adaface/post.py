"""The face_match stage: AdaFace's face embeddings -> FaceResults, identified against the gallery
file (stages.gallery)."""

from __future__ import annotations

import logging
import os

import numpy as np
from pydantic import Field

from pipeline.config import Config
from pipeline.files import path_kind
from pipeline.graph import MapStage, StageOptions
from stages.gallery import (
    GALLERY_MAX_BYTES,
    Gallery,
    GalleryError,
    GalleryFile,
    GalleryMissingError,
    read_gallery,
)
from stages.jobs import Inferred
from stages.models.adaface.job import FaceInferred, FaceJob
from stages.models.adaface.result import FaceResult
from stages.postprocess import PostprocessError, result_fields, xyxy

logger = logging.getLogger(__name__)


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
                **result_fields(item),
                box=xyxy(job.box_xywh),
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
