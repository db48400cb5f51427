"""The face gallery: enrolment with a quality gate, cosine identification, a hot-reloaded file.

Faces are found by a detector (BlazeFace by default), aligned to the ArcFace template
(stages.align) and embedded by an AdaFace model; the gallery keeps L2-normalised embeddings
per identity and names a face by the best cosine over each identity's samples, accepted only
above a threshold and by a margin over the second-best identity. The file format (an .npz
without pickles) is documented in docs/face-id.md; writes are atomic (temp file +
os.replace, mode 0600), and `GalleryFile` reloads it when its mtime, size or inode change,
keeping the previous gallery when the new file is corrupt.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import tempfile
import threading
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import cv2
import numpy as np

from npu.models.adaface.preprocess import embedder_input
from pipeline import bounded_json
from pipeline.bounded_json import JsonLimitError, JsonLimits
from pipeline.errors import NpucamError
from pipeline.files import FileMissingError, FileRuleError, FileWatch, path_kind, read_regular
from stages.align import ColourOrder, align_face, align_face_4pt, blazeface_alignment_points
from stages.detectors.detections import DetectorOutput

log = logging.getLogger(__name__)

FORMAT = "npucam-face-gallery"
VERSION = 1
ZIP_MAGIC = b"PK\x03\x04"  # every .npz np.savez writes is a zip archive
# the largest gallery file read, and the most its arrays may unpack to (face_match's
# `gallery_max_bytes`): 256 MiB holds about 130 000 512-d samples
GALLERY_MAX_BYTES = 256 << 20


# the gallery's `meta` JSON (format, version, model and what enrolment adds: a few hundred
# bytes): bounded before parsing, so deep nesting or a 5000-digit number is a GalleryError
# (json raised RecursionError and ValueError)
META_LIMITS = JsonLimits(max_bytes=1 << 20, max_depth=16, max_string=64 << 10, max_int_digits=40)


class GalleryError(NpucamError):
    """A gallery file that cannot be read or written, or an operation it cannot do."""


class FaceRejected(GalleryError):
    """An image or frame without an enrollable face; `reason` says why without `where`."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.reason = reason


# ---- the gallery itself (immutable; edits return a new Gallery) ---------------------------


@dataclass(frozen=True)
class Match:
    """The answer for one face: name is None when no identity is accepted.

    similarity: cosine to the best identity; second: cosine to the second-best identity
    (-1 when there is none); reason: "match", "below_threshold", "ambiguous" (margin too
    small) or "empty_gallery".
    """

    name: str | None
    similarity: float
    second: float
    best: str | None
    reason: str

    @property
    def margin(self) -> float:
        return self.similarity - self.second


@dataclass(frozen=True)
class Gallery:
    """names: one per row; embeddings: float32 [N, D], each row L2-normalised."""

    names: tuple[str, ...]
    embeddings: np.ndarray
    model: str = ""
    meta: dict = field(default_factory=dict)

    @staticmethod
    def empty(embed_dim: int = 512, model: str = "") -> Gallery:
        return Gallery((), np.zeros((0, embed_dim), np.float32), model)

    @property
    def embed_dim(self) -> int:
        return int(self.embeddings.shape[1])

    def identities(self) -> dict[str, int]:
        """Identity -> number of enrolled samples, in enrolment order."""
        out: dict[str, int] = {}
        for n in self.names:
            out[n] = out.get(n, 0) + 1
        return out

    def add(self, name: str, embeddings: np.ndarray) -> Gallery:
        """A gallery with `embeddings` (float [K, D] or [D]) enrolled as `name`."""
        check_name(name)
        e = np.atleast_2d(np.asarray(embeddings, dtype=np.float32))
        if e.shape[1] != self.embed_dim:
            raise GalleryError(
                f"embedding dim {e.shape[1]} does not match the gallery's {self.embed_dim}"
            )
        if not np.all(np.isfinite(e)) or np.any(np.linalg.norm(e, axis=1) == 0):
            raise GalleryError(f"{name!r}: embeddings must be finite and non-zero")
        e = e / np.linalg.norm(e, axis=1, keepdims=True)
        return Gallery(
            self.names + (name,) * len(e),
            np.vstack([self.embeddings, e.astype(np.float32)]),
            self.model,
            self.meta,
        )

    def remove(self, name: str) -> Gallery:
        """A gallery without `name`; GalleryError if it is not enrolled."""
        keep = np.array([n != name for n in self.names], dtype=bool)
        if keep.all():
            raise GalleryError(f"no identity {name!r} in the gallery")
        names = tuple(n for n in self.names if n != name)
        return Gallery(names, self.embeddings[keep], self.model, self.meta)

    def identify(self, embedding: np.ndarray, threshold: float, margin: float) -> Match:
        """Name one face. embedding: float [D] (any norm).

        Each identity scores the best cosine over its samples; the best identity is
        accepted when its score >= threshold and exceeds the second-best identity's by
        >= margin.
        """
        e = np.asarray(embedding, dtype=np.float32).reshape(-1)
        if e.shape[0] != self.embed_dim:
            raise GalleryError(
                f"embedding dim {e.shape[0]} does not match the gallery's {self.embed_dim}"
            )
        if not self.names:
            return Match(None, -1.0, -1.0, None, "empty_gallery")
        norm = float(np.linalg.norm(e))
        sims = self.embeddings @ (e / norm) if norm > 0 else np.zeros(len(self.names))
        per_id: dict[str, float] = {}
        for n, s in zip(self.names, sims.tolist(), strict=True):
            per_id[n] = max(per_id.get(n, -1.0), s)
        ranked = sorted(per_id.items(), key=lambda kv: -kv[1])
        best, sim = ranked[0]
        second = ranked[1][1] if len(ranked) > 1 else -1.0
        if sim < threshold:
            return Match(None, sim, second, best, "below_threshold")
        if sim - second < margin:
            return Match(None, sim, second, best, "ambiguous")
        return Match(best, sim, second, best, "match")


def check_name(name: str) -> None:
    """Identity names: 1..128 printable characters, no leading/trailing spaces."""
    if not isinstance(name, str) or not 1 <= len(name) <= 128:
        raise GalleryError(f"identity name must be 1..128 characters: {name!r}")
    if name != name.strip() or not name.isprintable():
        raise GalleryError(f"identity name must be printable, without edge spaces: {name!r}")


# ---- the file format ----------------------------------------------------------------------


def encode_gallery(g: Gallery) -> bytes:
    """The .npz bytes of g: names (unicode [N]), embeddings (float32 [N, D]), meta (JSON)."""
    meta = dict(g.meta)
    meta.update({"format": FORMAT, "version": VERSION, "embed_dim": g.embed_dim, "model": g.model})
    buf = io.BytesIO()
    np.savez(
        buf,
        names=np.array(g.names, dtype=str).reshape(-1),
        embeddings=np.ascontiguousarray(g.embeddings, dtype="<f4"),
        meta=np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8),
    )
    return buf.getvalue()


def decode_gallery(data: bytes, where: str, max_bytes: int = GALLERY_MAX_BYTES) -> Gallery:
    """Parse .npz bytes (no pickles); GalleryError naming `where` and the field at fault.
    The arrays may unpack to at most max_bytes in total (a small compressed member must not
    expand without bound)."""
    if not data.startswith(ZIP_MAGIC):
        raise GalleryError(f"{where}: not a readable face gallery (.npz): no zip header")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            unpacked = sum(info.file_size for info in zf.infolist())
    except Exception as exc:  # zipfile raises several types on damaged archives
        raise GalleryError(
            f"{where}: not a readable face gallery (.npz): {type(exc).__name__}: {exc}"
        ) from exc
    if unpacked > max_bytes:
        raise GalleryError(
            f"{where}: the gallery's arrays unpack to {unpacked} bytes, over the "
            f"{max_bytes}-byte limit (face_match gallery_max_bytes)"
        )
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            missing = {"names", "embeddings", "meta"} - set(z.files)
            if missing:
                raise GalleryError(f"{where}: not a face gallery (missing {sorted(missing)})")
            names, emb, meta_raw = z["names"], z["embeddings"], z["meta"]
    except GalleryError:
        raise
    except Exception as exc:  # numpy's .npy header parser raises many types on damaged bytes
        raise GalleryError(
            f"{where}: not a readable face gallery (.npz): {type(exc).__name__}: {exc}"
        ) from exc
    try:
        meta = bounded_json.loads(meta_raw.tobytes(), META_LIMITS)
    except JsonLimitError as exc:
        raise GalleryError(f"{where}: field 'meta' is not JSON within its limits: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise GalleryError(f"{where}: field 'meta.format' is not {FORMAT!r}")
    if meta.get("version") != VERSION:
        raise GalleryError(
            f"{where}: field 'meta.version' is {meta.get('version')!r}, this npucam reads {VERSION}"
        )
    if emb.dtype != np.float32 or emb.ndim != 2:
        raise GalleryError(f"{where}: field 'embeddings' must be float32 [N, D], got {emb.dtype}")
    if names.dtype.kind != "U" or names.shape != (emb.shape[0],):
        raise GalleryError(
            f"{where}: field 'names' must be {emb.shape[0]} strings, got {names.dtype} "
            f"{names.shape}"
        )
    if meta.get("embed_dim") != emb.shape[1]:
        raise GalleryError(
            f"{where}: field 'meta.embed_dim' {meta.get('embed_dim')} != embeddings' {emb.shape[1]}"
        )
    norms = np.linalg.norm(emb, axis=1)
    if not np.all(np.isfinite(emb)) or np.any(np.abs(norms - 1) > 1e-3):
        raise GalleryError(f"{where}: field 'embeddings' rows must be finite and unit-norm")
    extra = {k: v for k, v in meta.items() if k not in ("format", "version", "embed_dim", "model")}
    return Gallery(tuple(names.tolist()), emb, str(meta.get("model", "")), extra)


def write_gallery(path: str | Path, g: Gallery) -> None:
    """Write g to path atomically: a 0600 temp file in the same dir, fsync, os.replace."""
    path = Path(path)
    data = encode_gallery(g)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise GalleryError(f"{path}: cannot write the gallery: {exc}") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise GalleryError(f"{path}: cannot write the gallery: {exc}") from exc


class GalleryMissingError(GalleryError):
    """The gallery file does not exist (yet)."""


def read_gallery(path: str | Path, max_bytes: int = GALLERY_MAX_BYTES) -> Gallery:
    """Read a gallery file by the rules of pipeline.files.read_regular (a regular file, no
    symlink, never blocking, at most max_bytes); GalleryError naming the file on any
    problem (GalleryMissingError when there is none)."""
    path = Path(path)
    try:
        data = read_regular(path, max_bytes)
    except FileMissingError:
        raise GalleryMissingError(f"{path}: no such gallery file") from None
    except FileRuleError as exc:
        raise GalleryError(f"{path}: cannot read the gallery: {exc.reason}") from exc
    return decode_gallery(data, str(path), max_bytes)


class GalleryFile:
    """A gallery backed by a file, hot-reloaded when the file changes.

    `current` is always a complete Gallery (readers never see a half-loaded one);
    `reload_if_changed()` looks at the file at most every interval_s (pipeline.files.FileWatch)
    and re-reads it when its (mtime, size, inode) stamp changed, then swaps it in; a corrupt or
    vanished file leaves the previous gallery in use and the error in `last_error` (re-tried on
    the next stamp change). Edits (enrol/remove) are read-modify-write under a lock, then
    written atomically.
    """

    def __init__(
        self,
        path: str | Path,
        embed_dim: int = 512,
        model: str = "",
        interval_s: float = 0.0,
        max_bytes: int = GALLERY_MAX_BYTES,
    ) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self.last_error: GalleryError | None = None
        self._watch = FileWatch(self.path, interval_s)
        if self._watch.stamp is None:
            self.current = Gallery.empty(embed_dim, model)
        else:
            self.current = read_gallery(self.path, max_bytes)

    def reload_if_changed(self) -> bool:
        """True when a changed file was loaded; False if unchanged or the new one was bad."""
        change = self._watch.poll()
        if change is None:
            return False
        if change == "vanished":
            self.last_error = GalleryError(f"{self.path}: gallery file vanished; keeping it")
            log.warning("%s", self.last_error)
            return False
        try:
            g = read_gallery(self.path, self.max_bytes)
        except GalleryError as exc:
            self.last_error = exc
            log.error("%s; keeping the previous gallery (%d samples)", exc, len(self.current.names))
            return False
        self.current = g
        self.last_error = None
        log.info("%s: reloaded, %d identities", self.path, len(g.identities()))
        return True

    def _edit(self, change) -> Gallery:
        with self._lock:
            present = path_kind(self.path, follow=False) != "missing"
            base = read_gallery(self.path, self.max_bytes) if present else self.current
            g = change(base)
            write_gallery(self.path, g)
            self.current = g
            self._watch.mark()
            return g

    def enrol(self, name: str, embeddings: np.ndarray, model: str = "") -> Gallery:
        """Add samples for name (float [K, D]) and write the file."""

        def change(g: Gallery) -> Gallery:
            if model and g.model and model != g.model:
                raise GalleryError(
                    f"{self.path}: gallery holds {g.model!r} embeddings, not {model!r}"
                )
            if model and not g.model:
                g = Gallery(g.names, g.embeddings, model, g.meta)
            return g.add(name, embeddings)

        return self._edit(change)

    def remove(self, name: str) -> Gallery:
        """Drop every sample of name and write the file."""
        return self._edit(lambda g: g.remove(name))


# ---- from images to embeddings, with the quality gate -------------------------------------


class FaceDetector(Protocol):
    def detect(self, image: np.ndarray, colour_order: str = "bgr") -> DetectorOutput: ...


class FaceEmbedder(Protocol):
    """AdaFace on any backend (npu.models.adaface.model.AdaFaceCpu, adaface_steps.AdafaceBundle)."""

    def embed(self, chw: np.ndarray) -> np.ndarray: ...
    def embed_dim(self) -> int: ...
    def model(self) -> str | None: ...
    def backend(self) -> str: ...
    def colour_order(self) -> ColourOrder: ...
    def fingerprint(self) -> str: ...


@dataclass(frozen=True)
class QualityGate:
    """Enrolment quality: face box side >= min_face_px (image pixels), detector score >=
    min_score, a roughly frontal pose (|nose offset| <= max_nose_offset, see
    `nose_offset`), and sharpness (variance of the Laplacian of the grey aligned 112x112
    crop) >= min_sharpness; faces whose box touches the image border are rejected too.
    """

    min_face_px: float = 40.0
    min_score: float = 0.75
    min_sharpness: float = 30.0
    max_nose_offset: float = 0.25

    def reject_reason(self, face: FaceObservation) -> str | None:
        """None when the face passes; else a reason a user can act on."""
        w, h = face.box[2], face.box[3]
        if min(w, h) < self.min_face_px:
            return f"face too small: {min(w, h):.0f} px < {self.min_face_px:.0f} px"
        if face.score < self.min_score:
            return f"low detector score: {face.score:.2f} < {self.min_score:.2f}"
        if face.at_border:
            return "face cut by the image border"
        offset = nose_offset(face.keypoints)
        if abs(offset) > self.max_nose_offset:
            return (
                f"face turned aside: nose offset {offset:+.2f}, limit ±{self.max_nose_offset:.2f}"
            )
        if face.sharpness < self.min_sharpness:
            return f"too blurry: sharpness {face.sharpness:.1f} < {self.min_sharpness:.1f}"
        return None


def nose_offset(keypoints: np.ndarray) -> float:
    """A yaw proxy from the first three keypoints (eye, eye, nose tip; BlazeFace and YuNet
    order): where the nose projects onto the eye-to-eye segment, as a fraction of it, minus
    0.5: about 0 for a frontal face (the ArcFace template gives 2e-5), near ±0.5 in profile.
    """
    kp = np.asarray(keypoints, dtype=np.float64)
    a, b, nose = kp[0], kp[1], kp[2]
    axis = b - a
    n2 = float(axis @ axis)
    return 0.0 if n2 == 0 else float((nose - a) @ axis / n2 - 0.5)


def sharpness(crop: np.ndarray) -> float:
    """Variance of the Laplacian of crop (uint8 [H, W, 3]) in grey: higher is sharper."""
    grey = cv2.cvtColor(crop, cv2.COLOR_BGR2GRAY)
    return float(cv2.Laplacian(grey, cv2.CV_64F).var())


@dataclass
class FaceObservation:
    """One detected face: box float32 [4] xywh, score, keypoints float32 [K, 2], the
    aligned crop (uint8 [112, 112, 3], the image's channel order), the image -> crop
    matrix float64 [2, 3], its sharpness, whether its box touches the image border, and
    the embedding (float32 [D], un-normalised) when computed.
    """

    box: np.ndarray
    score: float
    keypoints: np.ndarray
    crop: np.ndarray
    matrix: np.ndarray
    sharpness: float
    at_border: bool
    embedding: np.ndarray | None = None


def observe_faces(
    image: np.ndarray, detections: DetectorOutput, border_px: float = 1.0
) -> list[FaceObservation]:
    """Align every detection of image (uint8 [H, W, 3]), largest face first.

    BlazeFace's 6 keypoints use the 4-point fit (an approximation, stages.align); 5-point
    detectors (YuNet) use the standard fit.
    """
    h, w = image.shape[:2]
    out = []
    for i in np.argsort(-(detections.boxes[:, 2] * detections.boxes[:, 3]), kind="stable"):
        kp = detections.keypoints[i]
        if kp.shape[0] == 6:
            crop, m = align_face_4pt(image, blazeface_alignment_points(kp))
        elif kp.shape[0] == 5:
            crop, m = align_face(image, kp)
        else:
            raise GalleryError(f"detector gives {kp.shape[0]} keypoints; alignment needs 5 or 6")
        x, y, bw, bh = detections.boxes[i]
        at_border = bool(
            x <= border_px or y <= border_px or x + bw >= w - border_px or y + bh >= h - border_px
        )
        out.append(
            FaceObservation(
                detections.boxes[i],
                float(detections.scores[i]),
                kp,
                crop,
                m,
                sharpness(crop),
                at_border,
            )
        )
    return out


def read_image(path: str | Path) -> np.ndarray:
    """An image file -> uint8 [H, W, 3] BGR; GalleryError naming the file if it is not one."""
    path = Path(path)
    if not path.is_file():
        raise GalleryError(f"{path}: no such image file")
    data = np.fromfile(str(path), dtype=np.uint8)
    image = cv2.imdecode(data, cv2.IMREAD_COLOR) if data.size else None
    if image is None:
        raise GalleryError(f"{path}: not a readable image (OpenCV could not decode it)")
    return image


class FaceEncoder:
    """detect -> align -> embed for still images or frames (BGR, as Frame)."""

    def __init__(self, detector: FaceDetector, embedder: FaceEmbedder) -> None:
        self.detector = detector
        self.embedder = embedder

    def faces(self, image: np.ndarray, embed: bool = True) -> list[FaceObservation]:
        """Every face of a BGR image, largest first, with embeddings when embed=True."""
        obs = observe_faces(image, self.detector.detect(image, colour_order="bgr"))
        if embed:
            for f in obs:
                f.embedding = self.embed_crop(f.crop)
        return obs

    def embed_crop(self, crop_bgr: np.ndarray) -> np.ndarray:
        """An aligned BGR crop -> float32 [D], in the channel order the model expects."""
        return self.embedder.embed(embedder_input(crop_bgr, "bgr", self.embedder.colour_order()))

    def enrolment_face(
        self, image: np.ndarray, gate: QualityGate, where: str = "image"
    ) -> FaceObservation:
        """The one enrollable face of image, not embedded yet; FaceRejected with the reason.

        More than one face is refused (which one would be meant?) unless the largest is at
        least twice the area of the next.
        """
        obs = self.faces(image, embed=False)
        if not obs:
            raise FaceRejected(where, "no face found")
        if len(obs) > 1:
            a0 = obs[0].box[2] * obs[0].box[3]
            a1 = obs[1].box[2] * obs[1].box[3]
            if a0 < 2 * a1:
                raise FaceRejected(where, f"{len(obs)} faces of similar size; need one")
        reason = gate.reject_reason(obs[0])
        if reason:
            raise FaceRejected(where, f"rejected: {reason}")
        return obs[0]

    def enrolment_sample(
        self, image: np.ndarray, gate: QualityGate, where: str = "image"
    ) -> np.ndarray:
        """The embedding (float32 [D]) of the one enrollable face of image (enrolment_face)."""
        return self.embed_crop(self.enrolment_face(image, gate, where).crop)
