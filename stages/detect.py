"""Person boxes -> Sapiens2 input crops, as HF Sapiens2ImageProcessor's crop_and_resize.

Each COCO box is padded by 1.25, widened or heightened to the crop's aspect, and sampled on
an align-corners grid with torch.grid_sample semantics (zero padding; bilinear when the crop
shrinks the region, bicubic with A = -0.75 when it grows it), then ImageNet-normalised.
Reference: transformers 5.23.0 models/sapiens2/image_processing_sapiens2.py (spec sapiens2 §2).

The `detect` stage (the second half of this file) turns frames into det results and the
NPU stage's work: person boxes (BlazePose, an ONNX detector, fixed regions, or an external
detector over ZeroMQ) tracked per camera (stages.tracker), faces (BlazeFace, YuNet), and
PoseJob / FaceJob / ClipJob items (stages.jobs); the infer stage crops with crop_persons.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import zmq
from pydantic import Field

from pipeline import security
from pipeline.config import Config
from pipeline.errors import NpucamError
from pipeline.graph import Outbox, Stage, StageOptions
from pipeline.messages import Detections, Frame, now_ns
from pipeline.queues import BoundedQueue
from pipeline.security import Curve, SocketSecurity
from stages.align import blazeface_alignment_points
from stages.detectors.detections import Detections as FaceDetections
from stages.jobs import ClipJob, FaceJob, PoseJob
from stages.preview import PreviewFrame, PreviewTap, run_taps
from stages.tracker import PersonTracker, PoseTag, iou_matrix

CROP_SIZE = (1024, 768)
BOX_PADDING = 1.25
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
BICUBIC_A = -0.75


class CropError(NpucamError):
    """A crop request with an unusable image or box."""


def _check_image(image_rgb: np.ndarray) -> None:
    if not isinstance(image_rgb, np.ndarray):
        raise CropError(f"image_rgb must be a numpy array, got {type(image_rgb).__name__}")
    if image_rgb.dtype != np.uint8:
        raise CropError(f"image_rgb must be uint8, got dtype {image_rgb.dtype}")
    if image_rgb.ndim != 3 or image_rgb.shape[2] != 3:
        raise CropError(f"image_rgb must be [H, W, 3] RGB, got shape {image_rgb.shape}")
    if image_rgb.shape[0] < 2 or image_rgb.shape[1] < 2:
        raise CropError(f"image_rgb must be at least 2x2, got shape {image_rgb.shape}")


def _check_boxes(boxes_xywh: np.ndarray | list) -> np.ndarray:
    try:
        boxes = np.asarray(boxes_xywh, dtype=np.float64)
    except (TypeError, ValueError) as exc:  # ragged lists, non-numbers
        raise CropError(f"boxes_xywh is not an [N, 4] array of numbers: {exc}") from None
    if boxes.ndim == 1 and boxes.shape == (4,):
        boxes = boxes[None]
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise CropError(f"boxes_xywh must be [N, 4] (x, y, w, h), got shape {boxes.shape}")
    if boxes.shape[0] == 0:
        raise CropError("boxes_xywh is empty: at least one box is needed")
    for i, box in enumerate(boxes):
        if not np.all(np.isfinite(box)):
            raise CropError(f"boxes_xywh[{i}] = {box.tolist()} is not finite")
        if box[2] <= 0 or box[3] <= 0:
            raise CropError(f"boxes_xywh[{i}] = {box.tolist()} has a non-positive width or height")
    return boxes.astype(np.float32)


def crop_windows(
    boxes_xywh: np.ndarray, output_size: tuple[int, int] = CROP_SIZE, padding: float = BOX_PADDING
) -> np.ndarray:
    """The sampled window of each box: float32 [N, 4] as (cx, cy, w, h) in image pixels.

    boxes_xywh: float [N, 4] COCO boxes. Computed in float32 like HF's boxes_to_crop_params
    (box_xywh_to_cxcywh, then padding and aspect correction), so crops and keypoints built
    from these windows round exactly as HF's do.
    """
    boxes = _check_boxes(boxes_xywh)
    out_h, out_w = output_size
    x, y, w, h = boxes.T
    half = np.float32(0.5)
    aspect = np.float32(out_w / out_h)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported below
        cx = x + half * w
        cy = y + half * h
        sw = w * np.float32(padding)
        sh = h * np.float32(padding)
        wider = sw > sh * aspect
        win_w = np.where(wider, sw, sh * aspect)
        win_h = np.where(wider, sw / aspect, sh)
    windows = np.stack([cx, cy, win_w, win_h], axis=1).astype(np.float32)
    bad = ~np.all(np.isfinite(windows), axis=1) | np.any(windows[:, 2:] == 0, axis=1)
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        raise CropError(f"boxes_xywh[{i}] = {boxes[i].tolist()} is out of float32 range")
    return windows


def _source_coords(
    center: np.float32, size: np.float32, n_out: int, n_in: int
) -> tuple[np.ndarray, bool]:
    """Image coordinates sampled along one axis, float32 [n_out], with HF's rounding.

    HF builds the grid in float32 (j / scale + c - size/2), normalises it to [-1, 1] and
    grid_sample un-normalises it ((g + 1) * (n_in - 1) / 2); repeating that round trip keeps
    every sample point bit-identical. Also returns whether this axis shrinks (scale < 1).
    """
    # torch evaluates `int / tensor` as reciprocal(tensor) * int
    scale = (np.float32(1.0) / size) * np.float32(n_out - 1)
    grid = np.arange(n_out, dtype=np.float32) / scale + center - np.float32(0.5) * size
    norm = np.float32(2.0) * grid / np.float32(n_in - 1) - np.float32(1.0)
    coords = (norm + np.float32(1.0)) * np.float32((n_in - 1) / 2)
    return coords.astype(np.float32), bool(scale < 1)


def _cubic_weights(t: np.ndarray) -> np.ndarray:
    """Keys cubic convolution weights (A = -0.75) for taps -1, 0, 1, 2: float32 [..., 4]."""
    a = np.float32(BICUBIC_A)

    def near(x: np.ndarray) -> np.ndarray:
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: np.ndarray) -> np.ndarray:
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    one = np.float32(1.0)
    return np.stack([far(t + one), near(t), near(one - t), far(2 * one - t)], axis=-1)


def _taps(coords: np.ndarray, n_in: int, bicubic: bool) -> tuple[np.ndarray, np.ndarray]:
    """Source indices and weights along one axis: int [n_out, T], float32 [n_out, T].

    Taps outside the image get weight 0 (grid_sample's zero padding); their indices are
    clamped so the gather stays in bounds.
    """
    base = np.floor(coords)
    t = (coords - base).astype(np.float32)
    base = base.astype(np.int64)
    if bicubic:
        idx = base[:, None] + np.arange(-1, 3)[None, :]
        wts = _cubic_weights(t)
    else:
        idx = base[:, None] + np.arange(0, 2)[None, :]
        wts = np.stack([np.float32(1.0) - t, t], axis=-1)
    inside = (idx >= 0) & (idx < n_in)
    return np.clip(idx, 0, n_in - 1), np.where(inside, wts, np.float32(0.0)).astype(np.float32)


def _used(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct source indices the taps read, and each tap's position among them."""
    used, pos = np.unique(idx, return_inverse=True)
    return used, pos.reshape(idx.shape)


def _resample_rows(
    src: np.ndarray, idx: np.ndarray, wts: np.ndarray, block: int = 16
) -> np.ndarray:
    """out[i] = sum_t wts[i, t] * src[idx[i, t]]: float32 [S, F] -> float32 [n_out, F].

    The taps of consecutive outputs read a narrow band of rows (the grid is monotonic), so
    each block of outputs is one small dense GEMM over its band; weights of out-of-image
    taps are 0, so the band matrix holds exactly grid_sample's weights.
    """
    n_out = len(idx)
    out = np.empty((n_out, src.shape[1]), np.float32)
    for i0 in range(0, n_out, block):
        ib, wb = idx[i0 : i0 + block], wts[i0 : i0 + block]
        lo, hi = int(ib.min()), int(ib.max()) + 1
        band = np.zeros((len(ib), hi - lo), np.float32)
        rows = np.arange(len(ib))
        for t in range(ib.shape[1]):
            band[rows, ib[:, t] - lo] += wb[:, t]
        np.matmul(band, src[lo:hi], out=out[i0 : i0 + block])
    return out


def crop_persons(
    image_rgb: np.ndarray,
    boxes_xywh: np.ndarray,
    output_size: tuple[int, int] = CROP_SIZE,
    mean: tuple[float, float, float] = IMAGENET_MEAN,
    std: tuple[float, float, float] = IMAGENET_STD,
    padding: float = BOX_PADDING,
) -> tuple[np.ndarray, np.ndarray]:
    """Crop and normalise one Sapiens2 input per person box.

    image_rgb: uint8 [H, W, 3] in RGB order (convert OpenCV's BGR frames first).
    boxes_xywh: float [N, 4] COCO boxes (x, y, w, h) in image pixels.
    output_size: (height, width) of the crops; 1024 x 768 for the released models.
    mean, std: per-channel normalisation (ImageNet's); padding: the box scale (1.25).
    Returns crops float32 [N, 3, out_h, out_w] = (v - 255 mean) / (255 std) of the sampled
    values v (0..255 scale, bicubic may overshoot), and windows float32 [N, 4] as
    (cx, cy, w, h) of the sampled region, for mapping keypoints back.

    The grid is separable (x depends only on the column, y only on the row), so each crop
    is one horizontal pass over the pixels it touches and one vertical pass, each as banded
    GEMMs; both are exact reformulations of grid_sample's per-pixel sum (only the float32
    summation order differs).
    """
    _check_image(image_rgb)
    windows = crop_windows(boxes_xywh, output_size, padding)
    out_h, out_w = output_size
    in_h, in_w = image_rgb.shape[:2]
    mean255 = np.asarray(mean, dtype=np.float32) * np.float32(255.0)
    std255 = np.asarray(std, dtype=np.float32) * np.float32(255.0)
    crops = np.empty((len(windows), 3, out_h, out_w), dtype=np.float32)
    for n, (cx, cy, win_w, win_h) in enumerate(windows):
        with np.errstate(over="ignore", invalid="ignore"):
            xs, shrink_x = _source_coords(cx, win_w, out_w, in_w)
            ys, shrink_y = _source_coords(cy, win_h, out_h, in_h)
        if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))):
            box = np.asarray(boxes_xywh, dtype=np.float64).reshape(-1, 4)[n].tolist()
            raise CropError(f"boxes_xywh[{n}] = {box} is out of float32 range")
        bicubic = not (shrink_x or shrink_y)
        x_idx, x_w = _taps(xs, in_w, bicubic)
        y_idx, y_w = _taps(ys, in_h, bicubic)
        rows, row_tap = _used(y_idx)
        cols, col_tap = _used(x_idx)
        # only the pixels some tap reads, channel-first: float32 [3, R, C]
        r, c = len(rows), len(cols)
        src = np.empty((3, r, c), np.float32)
        if rows[-1] - rows[0] + 1 == r and cols[-1] - cols[0] + 1 == c:
            picked = image_rgb[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
        else:
            picked = image_rgb[rows[:, None], cols[None, :]]
        src[...] = picked.transpose(2, 0, 1)
        r, c = len(rows), len(cols)
        # horizontal pass on the transposed view: [C, 3R] -> [out_w, 3R]
        horiz = _resample_rows(src.reshape(3 * r, c).T, col_tap, x_w)
        horiz = horiz.reshape(out_w, 3, r)
        vert = np.empty((3, out_h, out_w), np.float32)
        for ch in range(3):
            vert[ch] = _resample_rows(horiz[:, ch, :].T, row_tap, y_w)
        np.subtract(vert, mean255[:, None, None], out=vert)
        np.divide(vert, std255[:, None, None], out=crops[n])
    return crops, windows


# ---- the detect stage ---------------------------------------------------------------------
# Frames -> det/<camera> Detections (person and face boxes with track ids) + PoseJobs for the
# tracks whose pose is oldest + FaceJobs + rate-limited ClipJobs (stages.jobs). Detectors run
# in the stage's own worker thread (LiteRT interpreters stay on the thread that made them).

_DETECT_LOG = logging.getLogger("stages.detect")
MALFORMED_LOGGED = 5  # external box messages logged in full; then one line per 100
MIN_FACE_SEARCH_PX = 8  # face_in = "persons": person boxes narrower or lower are skipped
FACE_DUPLICATE_IOU = 0.5  # face_in = "persons": the same face found in two person boxes
POSE_FACES_KEPT = 8  # face jobs from pose keypoints waiting for detect's next frame


class RegionOptions(StageOptions):
    """One fixed region: x, y, w, h in pixels, or fractions of the frame when normalized."""

    name: str = Field(min_length=1)
    x: float
    y: float
    w: float = Field(gt=0)
    h: float = Field(gt=0)
    normalized: bool = False


class TrackerOptions(StageOptions):
    """stages.tracker.PersonTracker's parameters (docs/scheduler.md)."""

    high_score: float = Field(0.5, ge=0, le=1)
    low_score: float = Field(0.1, ge=0, le=1)
    new_track_score: float = Field(0.6, ge=0, le=1)
    match_iou: float = Field(0.2, gt=0, le=1)
    low_match_iou: float = Field(0.5, gt=0, le=1)
    lost_buffer_s: float = Field(1.0, ge=0)


class DetectOptions(StageOptions):
    cameras: list[str] | None = None  # cameras this stage detects on; others pass through
    person: Literal["blazepose", "onnx", "roi", "zmq", "none"] = "blazepose"
    person_min_score: float = Field(0.5, ge=0, le=1)
    person_model: str | None = Field(None, min_length=1)  # onnx file; or a pose_detection.tflite
    person_format: Literal["yolov8", "yolov5", "detr"] = "yolov8"
    person_input_size: int = Field(640, ge=32)
    person_class: int = Field(0, ge=0)
    person_regions: list[RegionOptions] = []
    boxes_endpoint: str | None = Field(None, min_length=1)  # person = "zmq": where to SUBscribe
    boxes_max_age_ms: float = Field(500.0, gt=0)
    face: Literal["blazeface", "yunet", "roi", "none"] = "blazeface"
    face_variant: Literal["short", "full"] = "short"
    face_min_score: float | None = Field(None, ge=0, le=1)
    face_model: str | None = Field(None, min_length=1)  # yunet onnx; or a BlazeFace tflite
    face_regions: list[RegionOptions] = []  # face = "roi": BlazeFace inside each region
    # where faces are looked for: the whole frame, or inside each person box (small faces
    # in a wide frame become large in the box's crop)
    face_in: Literal["frame", "persons"] = "frame"
    tracker: TrackerOptions = TrackerOptions()
    pose: bool = True
    pose_jobs_per_frame: int = Field(1, ge=0)
    # a track whose pose job brought no result for this long gets a new job (the infer stage
    # may have dropped it; a queued job of the same track is replaced); None: at its deadline
    pose_retry_s: float | None = Field(None, gt=0)
    faces: bool = True  # face jobs (to align and infer) for the faces found
    face_interval_s: float = Field(0.0, ge=0)  # min time between frames with face jobs
    clip: Literal["off", "persons", "frame"] = "off"
    clip_interval_s: float = Field(1.0, ge=0)
    clip_max_per_frame: int = Field(4, ge=1)


FLOAT32_MAX = float(np.finfo(np.float32).max)


class BoxMessageError(NpucamError):
    """An external detector's box message that does not follow the documented format."""


class BoxReceiverError(NpucamError):
    """A box receiver that cannot connect to its endpoint."""


@dataclass(frozen=True, slots=True)
class ExternalBoxes:
    """One decoded box message: camera, boxes float32 [N, 4] (x, y, w, h) in frame pixels,
    scores float32 [N], and the optional seq and ts (ns) the sender attached."""

    camera: str
    boxes: np.ndarray
    scores: np.ndarray
    seq: int | None = None
    ts_ns: int | None = None


def _int_or_none(msg: dict, key: str) -> int | None:
    value = msg.get(key)
    if value is None:
        return None
    if type(value) is not int:  # noqa: E721 - a bool is not a seq
        raise BoxMessageError(f"'{key}' must be an integer, got {value!r}")
    return value


def _fits_float32(v: int | float) -> bool:
    """True for a finite number float32 can hold (a huge JSON integer would overflow)."""
    if isinstance(v, float) and not math.isfinite(v):
        return False
    return abs(v) <= FLOAT32_MAX  # exact for ints of any size


def decode_box_message(raw: bytes, cameras: Sequence[str] | None = None) -> ExternalBoxes:
    """Parse one external-detector message (docs/configuration.md, person = "zmq").

    raw: UTF-8 JSON object {"camera": str, "boxes": [[x, y, w, h], ...], "scores": [...]
    (optional, default 1.0), "seq": int (optional), "ts": int ns (optional)}. cameras: the
    names accepted (None: any). BoxMessageError says what is wrong.
    """
    try:
        msg = json.loads(bytes(raw))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BoxMessageError(f"not UTF-8 JSON: {exc}") from None
    except RecursionError:
        raise BoxMessageError("JSON nested too deeply") from None
    if not isinstance(msg, dict):
        raise BoxMessageError(f"expected a JSON object, got {type(msg).__name__}")
    camera = msg.get("camera")
    if not isinstance(camera, str) or not camera:
        raise BoxMessageError(f"'camera' must be a non-empty string, got {camera!r}")
    if cameras is not None and camera not in cameras:
        raise BoxMessageError(f"camera {camera!r} is not one of {', '.join(cameras)}")
    where = f"camera {camera!r}"
    boxes = msg.get("boxes")
    if not isinstance(boxes, list):
        raise BoxMessageError(f"{where}: 'boxes' must be a list of [x, y, w, h], got {boxes!r}")
    rows = []
    for i, box in enumerate(boxes):
        if not (
            isinstance(box, list)
            and len(box) == 4
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in box)
        ):
            raise BoxMessageError(f"{where}: boxes[{i}] must be 4 numbers [x, y, w, h]: {box!r}")
        if not all(_fits_float32(v) for v in box) or box[2] <= 0 or box[3] <= 0:
            raise BoxMessageError(
                f"{where}: boxes[{i}] = {box} needs finite float32 values and w, h > 0"
            )
        rows.append(box)
    scores = msg.get("scores", [1.0] * len(rows))
    if not (
        isinstance(scores, list)
        and len(scores) == len(rows)
        and all(isinstance(s, int | float) and not isinstance(s, bool) for s in scores)
    ):
        raise BoxMessageError(f"{where}: 'scores' must be {len(rows)} numbers, got {scores!r}")
    if not all(0 <= s <= 1 for s in scores):
        raise BoxMessageError(f"{where}: scores must lie in [0, 1], got {scores}")
    return ExternalBoxes(
        camera=camera,
        boxes=np.array(rows, np.float32).reshape(-1, 4),
        scores=np.array(scores, np.float32).reshape(-1),
        seq=_int_or_none(msg, "seq"),
        ts_ns=_int_or_none(msg, "ts"),
    )


class BoxReceiver:
    """Person boxes from an external detector: a SUB socket connected to `endpoint` in a
    thread, keeping each camera's latest message. Each message is one JSON part (or
    [topic, JSON]: the last part is read). Malformed ones are counted in `malformed` (and as
    `error` drops of the stage) and skipped."""

    def __init__(
        self,
        endpoint: str,
        cameras: Sequence[str],
        on_malformed: Callable[[str], None] = lambda camera: None,
        curve: Curve | None = None,
        socket_name: str = "detect boxes",
    ) -> None:
        self.endpoint = endpoint
        self.cameras = tuple(cameras)
        self.malformed = 0
        self.received = 0
        self._on_malformed = on_malformed
        self._latest: dict[str, tuple[int, ExternalBoxes]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._guard = SocketSecurity(self._ctx, curve, socket_name)
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        try:
            self._guard.connect(self._sock, endpoint)
        except zmq.ZMQError as exc:
            self._release()
            raise BoxReceiverError(f"{socket_name}: cannot connect to {endpoint}: {exc}") from None
        except BaseException:
            self._release()
            raise
        self._thread = threading.Thread(target=self._loop, name="detect-boxes", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._sock.poll(100):
                    continue
                parts = self._sock.recv_multipart()
                self.handle(parts[-1])
        finally:
            self._release()

    def _release(self) -> None:
        self._sock.close(0)
        self._guard.close()
        self._ctx.term()

    def handle(self, raw: bytes) -> ExternalBoxes | None:
        """Decode one message and keep it as its camera's latest; None if malformed."""
        try:
            boxes = decode_box_message(raw, self.cameras)
        except BoxMessageError as exc:
            self.malformed += 1
            camera = ""
            with contextlib.suppress(Exception):
                camera = str(json.loads(raw).get("camera", ""))
            self._on_malformed(camera if camera in self.cameras else "")
            if self.malformed <= MALFORMED_LOGGED or self.malformed % 100 == 0:
                _DETECT_LOG.warning(
                    "%s: malformed box message #%d skipped: %s", self.endpoint, self.malformed, exc
                )
            return None
        with self._lock:
            self._latest[boxes.camera] = (now_ns(), boxes)
            self.received += 1
        return boxes

    def latest(self, camera: str, max_age_ns: int, at_ns: int | None = None) -> ExternalBoxes:
        """The camera's latest boxes if received within max_age_ns, else no boxes."""
        at = now_ns() if at_ns is None else at_ns
        with self._lock:
            got = self._latest.get(camera)
        if got is None or at - got[0] > max_age_ns:
            return ExternalBoxes(camera, np.zeros((0, 4), np.float32), np.zeros(0, np.float32))
        return got[1]

    def close(self) -> None:
        """Stop the thread, which closes the socket and terminates the context (blocking: up
        to its 100 ms poll, at most 2 s)."""
        self._stop.set()
        self._thread.join(timeout=2.0)


class CameraTracks:
    """One camera's tracker and its outstanding pose jobs, shared by detect (which submits
    them) and the dark stage (which finishes them); every access holds `lock`."""

    def __init__(self, tracker: PersonTracker) -> None:
        self.tracker = tracker
        self.lock = threading.Lock()
        # track id -> when its pose job counts as lost (its deadline, or the retry time)
        self.pose_deadlines: dict[int, int] = {}
        # face jobs built from Sapiens2 face keypoints (the dark stage's face_points), sent
        # on by detect with its next frame of this camera; the newest POSE_FACES_KEPT
        self.pose_faces: deque[FaceJob] = deque(maxlen=POSE_FACES_KEPT)

    def expire_poses(self, at_ns: int) -> None:
        """Free the tracks whose pose job is past its deadline (or retry time) unanswered."""
        for track_id, deadline in list(self.pose_deadlines.items()):
            if at_ns > deadline:
                del self.pose_deadlines[track_id]
                self.tracker.pose_finished(track_id, None, at_ns)

    def finish_pose(self, track_id: int, capture_ts_ns: int, at_ns: int) -> PoseTag | None:
        with self.lock:
            self.pose_deadlines.pop(track_id, None)
            return self.tracker.pose_finished(track_id, capture_ts_ns, at_ns)


# Each pipeline run's trackers by camera, found through its stage Context.
_RUN_TRACKS: weakref.WeakKeyDictionary[Any, dict[str, CameraTracks]] = weakref.WeakKeyDictionary()


def run_tracks(context: Any) -> dict[str, CameraTracks]:
    """The per-camera trackers of one pipeline run (shared by its detect and dark stages)."""
    return _RUN_TRACKS.setdefault(context, {})


def _xywh_to_xyxy(boxes: np.ndarray) -> np.ndarray:
    b = np.asarray(boxes, np.float32).reshape(-1, 4)
    return np.concatenate([b[:, :2], b[:, :2] + b[:, 2:]], axis=1)


def _xyxy_to_xywh(box: np.ndarray) -> np.ndarray:
    b = np.asarray(box, np.float32).reshape(4)
    return np.array([b[0], b[1], b[2] - b[0], b[3] - b[1]], np.float32)


def _regions(options: list[RegionOptions]) -> list:
    from stages.detectors.roi import Region

    return [Region(r.name, r.x, r.y, r.w, r.h, r.normalized) for r in options]


class Detect(Stage):
    """Frames -> Detections (det/<camera>) + PoseJob / FaceJob / ClipJob (stages.jobs)."""

    kind = "detect"
    accepts = (Frame,)
    Options = DetectOptions

    def __init__(self, name, options, context) -> None:
        super().__init__(name, options, context)
        self.person_detector = None
        self.face_detector = None
        self.receiver: BoxReceiver | None = None
        self.tracks = run_tracks(context)
        self._last_clip_ns: dict[str, int] = {}
        self._last_face_ns: dict[str, int] = {}
        # person = "none": faces are tracked themselves, so a face still carries a track id
        self._face_trackers: dict[str, PersonTracker] = {}
        self._loaded = False
        self.model = "+".join(m for m in (self._person_model(), self._face_model()) if m)

    def _person_model(self) -> str:
        o = self.options
        return {
            "blazepose": "blazepose-detector",
            "onnx": f"onnx:{Path(o.person_model or '').name}",
            "roi": "roi",
            "zmq": "external",
            "none": "",
        }[o.person]

    def _face_model(self) -> str:
        o = self.options
        return {
            "blazeface": f"blazeface-{o.face_variant}",
            "yunet": "yunet",
            "roi": f"blazeface-{o.face_variant}-roi",
            "none": "",
        }[o.face]

    @classmethod
    def check(cls, config: Config, index: int) -> list[str]:
        opts = config.stages[index].options
        key = f"stages[{index}]"
        problems = []
        names = [c.name for c in config.cameras]
        for j, cam in enumerate(opts.get("cameras") or []):
            if cam not in names:
                problems.append(f"{key}.cameras[{j}]: no camera named {cam!r}")
        person, face = opts.get("person", "blazepose"), opts.get("face", "blazeface")
        if person == "onnx" and not opts.get("person_model"):
            problems.append(f"{key}.person_model: person = 'onnx' needs the model's .onnx file")
        if person == "roi" and not opts.get("person_regions"):
            problems.append(f"{key}.person_regions: person = 'roi' needs at least one region")
        if person == "zmq" and not opts.get("boxes_endpoint"):
            problems.append(f"{key}.boxes_endpoint: person = 'zmq' needs the detector's endpoint")
        if face == "yunet" and not opts.get("face_model"):
            problems.append(f"{key}.face_model: face = 'yunet' needs the YuNet .onnx file")
        if face == "roi" and not opts.get("face_regions"):
            problems.append(f"{key}.face_regions: face = 'roi' needs at least one region")
        if opts.get("face_in") == "persons" and (person == "none" or face == "roi"):
            problems.append(
                f"{key}.face_in: 'persons' needs a person detector and face = 'blazeface' or "
                "'yunet'"
            )
        for field_name in ("person_model", "face_model"):
            path = opts.get(field_name)
            if isinstance(path, str) and not (config.base_dir / path).is_file():
                problems.append(f"{key}.{field_name}: no such file: {path}")
        if person == "zmq" and isinstance(opts.get("boxes_endpoint"), str):
            problems.extend(security.check_curve(config, bind=False, socket=f"detect {key} boxes"))
        return problems

    def load(self) -> None:
        """Build the detectors (in the thread that will run them) and the box receiver; a
        failure closes the receiver if it had started."""
        if self._loaded:
            return
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        self._loaded = True

    def _build(self) -> None:
        from stages.detectors.blazeface import BlazeFace
        from stages.detectors.blazepose import BlazePosePerson
        from stages.detectors.onnx_person import OnnxPersonDetector
        from stages.detectors.roi import DetectInRegions, FixedRegions
        from stages.detectors.yunet import YuNet

        o = self.options
        base = self.context.config.base_dir

        def path(p: str | None) -> Path | None:
            return None if p is None else base / p

        if o.person == "blazepose":
            self.person_detector = BlazePosePerson(path(o.person_model), o.person_min_score)
        elif o.person == "onnx":
            self.person_detector = OnnxPersonDetector(
                path(o.person_model),
                o.person_format,
                o.person_input_size,
                o.person_class,
                o.person_min_score,
            )
        elif o.person == "roi":
            self.person_detector = FixedRegions(_regions(o.person_regions))
        elif o.person == "zmq":
            cameras = o.cameras or [c.name for c in self.context.config.cameras]
            curve = security.curve_for(
                self.context.config, bind=False, socket=f"detect {self.name} boxes"
            )
            self.receiver = BoxReceiver(
                o.boxes_endpoint,
                cameras,
                lambda camera: self.metrics.drop(self.name, camera, "error"),
                curve,
                f"detect {self.name} boxes",
            )
        if o.face in ("blazeface", "roi"):
            face = BlazeFace(o.face_variant, path(o.face_model), o.face_min_score)
            self.face_detector = (
                face if o.face == "blazeface" else DetectInRegions(face, _regions(o.face_regions))
            )
        elif o.face == "yunet":
            kwargs = {} if o.face_min_score is None else {"score_threshold": o.face_min_score}
            self.face_detector = YuNet(path(o.face_model), **kwargs)

    def close(self) -> None:
        """Stop the box receiver (blocking; see BoxReceiver.close)."""
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None

    def _tracker(self, camera: str) -> PersonTracker:
        t = self.options.tracker
        return PersonTracker(
            camera,
            high_score=t.high_score,
            low_score=t.low_score,
            new_track_score=t.new_track_score,
            match_iou=t.match_iou,
            low_match_iou=t.low_match_iou,
            lost_buffer_s=t.lost_buffer_s,
        )

    def camera_tracks(self, camera: str) -> CameraTracks:
        tracks = self.tracks.get(camera)
        if tracks is None:
            tracks = self.tracks.setdefault(camera, CameraTracks(self._tracker(camera)))
        return tracks

    def _face_track_ids(self, frame: Frame, faces: FaceDetections) -> list[int | None]:
        """Track ids of faces tracked on their own (no person detector), by face index."""
        tracker = self._face_trackers.get(frame.camera)
        if tracker is None:
            tracker = self._face_trackers[frame.camera] = self._tracker(frame.camera)
        ids: list[int | None] = [None] * len(faces)
        for tb in tracker.update(_xywh_to_xyxy(faces.boxes), faces.scores, frame.capture_ts_ns):
            ids[tb.detection] = tb.track_id
        return ids

    def _persons(self, frame: Frame) -> tuple[np.ndarray, np.ndarray]:
        """Person boxes float32 [N, 4] xywh and scores float32 [N] of one frame."""
        if self.receiver is not None:
            got = self.receiver.latest(
                frame.camera, round(self.options.boxes_max_age_ms * 1e6), now_ns()
            )
            return got.boxes, got.scores
        if self.person_detector is None:
            return np.zeros((0, 4), np.float32), np.zeros(0, np.float32)
        d = self.person_detector.detect(frame.image, "bgr")
        return d.boxes, d.scores

    def _faces(self, image: np.ndarray, person_xywh: np.ndarray) -> FaceDetections | None:
        """Faces in the frame, or inside each person box (face_in = "persons"; a face two
        overlapping boxes both found is kept once, the higher score)."""
        if self.face_detector is None:
            return None
        if self.options.face_in == "frame":
            return self.face_detector.detect(image, "bgr")
        h, w = image.shape[:2]
        found: list[FaceDetections] = []
        for x, y, bw, bh in np.asarray(person_xywh, np.float64):
            x0, y0 = max(0, math.floor(x)), max(0, math.floor(y))
            x1, y1 = min(w, math.ceil(x + bw)), min(h, math.ceil(y + bh))
            if x1 - x0 < MIN_FACE_SEARCH_PX or y1 - y0 < MIN_FACE_SEARCH_PX:
                continue
            d = self.face_detector.detect(np.ascontiguousarray(image[y0:y1, x0:x1]), "bgr")
            offset = np.array([x0, y0], np.float32)
            d.boxes = d.boxes.copy()
            d.boxes[:, :2] += offset
            d.keypoints = d.keypoints + offset
            found.append(d)
        if not found:
            return FaceDetections.empty(0)
        boxes = np.concatenate([d.boxes for d in found])
        scores = np.concatenate([d.scores for d in found])
        keypoints = np.concatenate([d.keypoints for d in found])
        order = np.argsort(-scores, kind="stable")
        iou = iou_matrix(_xywh_to_xyxy(boxes), _xywh_to_xyxy(boxes))
        keep: list[int] = []
        for i in order:
            if all(iou[i, j] <= FACE_DUPLICATE_IOU for j in keep):
                keep.append(int(i))
        return FaceDetections(boxes[keep], scores[keep], keypoints[keep], found[0].names)

    def process(self, frame: Frame) -> list:
        """One frame -> [Detections, *PoseJobs, *FaceJobs, *ClipJobs] (blocking)."""
        self.load()
        o = self.options
        h, w = frame.image.shape[:2]
        person_xywh, person_scores = self._persons(frame)
        faces = self._faces(frame.image, person_xywh)
        ids = [None] * len(person_scores)
        tracks = self.camera_tracks(frame.camera)
        pose_jobs: list[PoseJob] = []
        clip_jobs: list[ClipJob] = []
        with tracks.lock:
            tracked = tracks.tracker.update(
                _xywh_to_xyxy(person_xywh), person_scores, frame.capture_ts_ns
            )
            for tb in tracked:
                ids[tb.detection] = tb.track_id
            boxes_of = {tb.track_id: tb.box for tb in tracked}
            tracks.expire_poses(now_ns())
            if o.pose and o.pose_jobs_per_frame:
                for track in tracks.tracker.pose_queue():
                    if len(pose_jobs) == o.pose_jobs_per_frame:
                        break
                    if track.track_id not in boxes_of:
                        continue  # lost this frame: no box to pose
                    since = track.pose_ts_ns
                    pose_jobs.append(
                        PoseJob(
                            **_job_fields(frame),
                            track_id=track.track_id,
                            box_xywh=_xyxy_to_xywh(boxes_of[track.track_id]),
                            score=track.score,
                            image=frame.image,
                            pose_age_s=None
                            if since is None
                            else (frame.capture_ts_ns - since) / 1e9,
                        )
                    )
                    tracks.tracker.pose_started(track.track_id)
                    retry = o.pose_retry_s
                    tracks.pose_deadlines[track.track_id] = (
                        frame.deadline_ns
                        if retry is None
                        else min(frame.deadline_ns, frame.capture_ts_ns + round(retry * 1e9))
                    )
            if o.clip != "off":
                clip_jobs = self._clip_jobs(frame, boxes_of, w, h)

        face_jobs: list[FaceJob] = []
        face_ids: list[int | None] = []
        if faces is not None:
            person_xyxy = _xywh_to_xyxy(person_xywh)
            own_ids = self._face_track_ids(frame, faces) if o.person == "none" else None
            want_faces = (
                o.faces
                and len(faces) > 0
                and self._due(self._last_face_ns, frame, o.face_interval_s)
            )
            for i in range(len(faces)):
                track_id = (
                    own_ids[i]
                    if own_ids is not None
                    else _containing_track(faces.boxes[i], person_xyxy, ids)
                )
                face_ids.append(track_id)
                if not want_faces:
                    continue
                kp = faces.keypoints[i]
                if kp.shape[0] == 5:
                    landmarks, source = kp, "yunet"
                elif kp.shape[0] == 6:
                    landmarks, source = blazeface_alignment_points(kp), "blazeface"
                else:
                    continue  # no alignment points (a region box, not a face detector)
                face_jobs.append(
                    FaceJob(
                        **_job_fields(frame),
                        box_xywh=np.asarray(faces.boxes[i], np.float32),
                        score=float(faces.scores[i]),
                        landmarks=np.asarray(landmarks, np.float32),
                        image=frame.image,
                        track_id=track_id,
                        landmark_source=source,
                    )
                )
        if o.faces:
            with tracks.lock:
                face_jobs.extend(tracks.pose_faces)
                tracks.pose_faces.clear()
        n_faces = 0 if faces is None else len(faces)
        det = Detections(
            camera=frame.camera,
            seq=frame.seq,
            capture_ts_ns=frame.capture_ts_ns,
            deadline_ns=frame.deadline_ns,
            backend="cpu",
            model=self.model or "none",
            width=int(w),
            height=int(h),
            source=frame.source,
            boxes=np.concatenate(
                [_xywh_to_xyxy(person_xywh)]
                + ([_xywh_to_xyxy(faces.boxes)] if faces is not None else [])
            ).reshape(-1, 4),
            scores=np.concatenate(
                [np.asarray(person_scores, np.float32)]
                + ([np.asarray(faces.scores, np.float32)] if faces is not None else [])
            ),
            labels=("person",) * len(person_scores) + ("face",) * n_faces,
            extra={"track_ids": ids + face_ids},
        )
        return [det, *pose_jobs, *face_jobs, *clip_jobs]

    @staticmethod
    def _due(last_ns: dict[str, int], frame: Frame, interval_s: float) -> bool:
        """Per-camera rate limit on capture time: True (and noted) once interval_s passed."""
        last = last_ns.get(frame.camera)
        if last is not None and frame.capture_ts_ns - last < interval_s * 1e9:
            return False
        last_ns[frame.camera] = frame.capture_ts_ns
        return True

    def _clip_jobs(
        self, frame: Frame, boxes_of: dict[int, np.ndarray], w: int, h: int
    ) -> list[ClipJob]:
        o = self.options
        last = self._last_clip_ns.get(frame.camera)
        if last is not None and frame.capture_ts_ns - last < o.clip_interval_s * 1e9:
            return []
        if o.clip == "frame":
            regions = [(None, np.array([0, 0, w, h], np.float32))]
        else:
            regions = [(tid, _xyxy_to_xywh(b)) for tid, b in sorted(boxes_of.items())]
            regions = [(t, b) for t, b in regions if b[2] >= 2 and b[3] >= 2]
            regions = regions[: o.clip_max_per_frame]
        if not regions:
            return []
        self._last_clip_ns[frame.camera] = frame.capture_ts_ns
        return [
            ClipJob(**_job_fields(frame), box_xywh=box, image=frame.image, track_id=tid)
            for tid, box in regions
        ]

    async def run(self, inbox: BoundedQueue | None, out: Outbox) -> None:
        assert inbox is not None
        loop = asyncio.get_running_loop()
        wanted = self.options.cameras
        worker = ThreadPoolExecutor(1, thread_name_prefix=f"detect-{self.name}")
        previews = _preview_targets(self.context, out)
        try:
            await loop.run_in_executor(worker, self.load)
            async for frame in inbox:
                if wanted is not None and frame.camera not in wanted:
                    await out.send(frame)
                    continue
                for tap, queue in previews:
                    # never waits nor evicts a result: a full inbox skips this preview
                    if tap.due(frame.camera, frame.capture_ts_ns) and len(queue) < queue.size:
                        queue.put_nowait(PreviewFrame.of(frame))
                start = time.perf_counter()
                try:
                    items = await loop.run_in_executor(worker, self.process, frame)
                except Exception:
                    self.item_failed(frame)
                    continue
                finally:
                    self.metrics.observe_work(self.name, time.perf_counter() - start)
                for item in items:
                    await out.send(item)
        finally:
            # close() joins the receiver's thread, so it runs on the worker, never the loop;
            # queued there it also comes after a load or frame still running (on cancel), so
            # no receiver that load starts outlives it. Shielded: a second cancel must not
            # unqueue it.
            closed = loop.run_in_executor(worker, self.close)
            worker.shutdown(wait=False)
            await asyncio.shield(closed)


def _preview_targets(context: Any, out: Outbox) -> list[tuple[PreviewTap, BoundedQueue]]:
    """The publish stages among detect's targets that want previews, with their inboxes."""
    taps = run_taps(context)
    return [(taps[name], queue) for name, _, queue in out.targets if name in taps]


def _job_fields(frame: Frame) -> dict:
    h, w = frame.image.shape[:2]
    return {
        "camera": frame.camera,
        "seq": frame.seq,
        "capture_ts_ns": frame.capture_ts_ns,
        "deadline_ns": frame.deadline_ns,
        "frame_size": (int(w), int(h)),
    }


def _containing_track(
    face_xywh: np.ndarray, person_xyxy: np.ndarray, ids: list[int | None]
) -> int | None:
    """The track of the smallest person box that contains the face's centre."""
    cx = float(face_xywh[0] + face_xywh[2] / 2)
    cy = float(face_xywh[1] + face_xywh[3] / 2)
    best, best_area = None, math.inf
    for box, tid in zip(person_xyxy, ids, strict=True):
        if tid is None or not (box[0] <= cx <= box[2] and box[1] <= cy <= box[3]):
            continue
        area = float((box[2] - box[0]) * (box[3] - box[1]))
        if area < best_area:
            best, best_area = tid, area
    return best
