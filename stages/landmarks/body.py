"""BlazePose body landmarks (33 + 2 alignment points) in a tracked ROI, as MediaPipe's pose graph
(google-ai-edge/mediapipe mediapipe/modules/pose_landmark/pose_landmark_cpu.pbtxt,
pose_landmark_by_roi_cpu.pbtxt, tensors_to_pose_landmarks_and_segmentation.pbtxt,
pose_detection_to_roi.pbtxt, pose_landmarks_to_roi.pbtxt; the heatmap refinement of
mediapipe/calculators/util/refine_landmarks_from_heatmap_calculator.cc), with the options the
0.10.21 wheel's graph really sets where they differ from those files (bench/mediapipe_graph.py).

The first ROI comes from the person detector's hip-centre and body-scale keypoints; every later
one from the previous frame's two alignment landmarks, one-euro filtered as upstream. A pose
flag under 0.5 loses the person, and the caller runs the detector again. The landmarks
themselves are not smoothed (MediaPipe's smooth_landmarks=False).
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from stages.landmarks.models import TfliteModel, pose_landmark_model
from stages.landmarks.rects import Rect, alignment_rect
from stages.landmarks.smoothing import OneEuro

BODY_NAMES = (
    "nose", "left_eye_inner", "left_eye", "left_eye_outer", "right_eye_inner", "right_eye",
    "right_eye_outer", "left_ear", "right_ear", "mouth_left", "mouth_right", "left_shoulder",
    "right_shoulder", "left_elbow", "right_elbow", "left_wrist", "right_wrist", "left_pinky",
    "right_pinky", "left_index", "right_index", "left_thumb", "right_thumb", "left_hip",
    "right_hip", "left_knee", "right_knee", "left_ankle", "right_ankle", "left_heel",
    "right_heel", "left_foot_index", "right_foot_index",
)  # fmt: skip
NUM_BODY = 33
ROI_SCALE = 1.25  # pose_detection_to_roi / pose_landmarks_to_roi RectTransformation
MIN_POSE_FLAG = 0.5  # ThresholdingCalculator in tensors_to_pose_landmarks_and_segmentation
HEATMAP_KERNEL = 9  # the options default: the 0.10.21 graph sets none (the .pbtxt says 7)
HEATMAP_MIN_CONFIDENCE = 0.5  # RefineLandmarksFromHeatmapCalculatorOptions default


@dataclass
class BodyLandmarks:
    """One person's body in image pixels.

    xy: float64 [33, 2]; visibility, presence: float64 [33] (sigmoid of the model's logits);
    flag: the pose-presence score; aux: float64 [2, 2] the alignment points (hip centre,
    body-scale point) the next ROI is built from; roi: the rect these came from.
    """

    xy: np.ndarray
    visibility: np.ndarray
    presence: np.ndarray
    flag: float
    aux: np.ndarray
    roi: Rect


def roi_from_detection(keypoints: np.ndarray) -> Rect:
    """The pose ROI from BlazePose detector keypoints [4, 2] (hip centre, body scale, ...)."""
    return alignment_rect(keypoints[0], keypoints[1], 90.0).transformed(ROI_SCALE)


def roi_from_landmarks(aux: np.ndarray) -> Rect:
    """The next frame's pose ROI from this frame's two alignment landmarks [2, 2]."""
    return alignment_rect(aux[0], aux[1], 90.0).transformed(ROI_SCALE)


def refine_from_heatmap(xy_norm: np.ndarray, heatmap: np.ndarray) -> np.ndarray:
    """Each landmark [N, 2] (crop-normalised) moved to the sigmoid-weighted mean of its 9x9
    heatmap window when the window's peak is >= 0.5 (heatmap float32 [H, W, N], logits).
    The upstream bounds check tests the column against the height, kept as is."""
    hm_h, hm_w, n = heatmap.shape
    out = xy_norm.copy()
    off = (HEATMAP_KERNEL - 1) // 2
    for i in range(n):
        col = int(xy_norm[i, 0] * hm_w)
        row = int(xy_norm[i, 1] * hm_h)
        if col < 0 or col >= hm_w or row < 0 or col >= hm_h:
            continue
        r0, r1 = max(0, row - off), min(hm_h, row + off + 1)
        c0, c1 = max(0, col - off), min(hm_w, col + off + 1)
        conf = 1.0 / (1.0 + np.exp(-heatmap[r0:r1, c0:c1, i].astype(np.float64)))
        total = conf.sum()
        if conf.size == 0 or total <= 0 or conf.max() < HEATMAP_MIN_CONFIDENCE:
            continue
        rows, cols = np.mgrid[r0:r1, c0:c1]
        out[i, 0] = (cols * conf).sum() / hm_w / total
        out[i, 1] = (rows * conf).sum() / hm_h / total
    return out


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


class BodyLandmarker:
    """`landmarks(image, roi)`: the body in one ROI, or None when the pose flag says nobody."""

    def __init__(self, model: TfliteModel | None = None) -> None:
        self.model = model or pose_landmark_model()
        self.size = self.model.size

    def landmarks(
        self, image: np.ndarray, roi: Rect, colour_order: str = "bgr"
    ) -> BodyLandmarks | None:
        crop = roi.crop(image, self.size)
        if colour_order == "bgr":
            crop = cv2.cvtColor(crop, cv2.COLOR_BGR2RGB)
        out = self.model.run(crop)
        flag = float(out["flag"].reshape(-1)[0])
        if flag < MIN_POSE_FLAG:
            return None
        raw = out["landmarks"].reshape(39, 5).astype(np.float64)
        xy_norm = refine_from_heatmap(raw[:, :2] / self.size, out["heatmap"][0])
        xy = roi.to_image(xy_norm * self.size, self.size)
        return BodyLandmarks(
            xy=xy[:NUM_BODY],
            visibility=_sigmoid(raw[:NUM_BODY, 3]),
            presence=_sigmoid(raw[:NUM_BODY, 4]),
            flag=flag,
            aux=xy[NUM_BODY : NUM_BODY + 2],
            roi=roi,
        )


class BodyTrack:
    """One person followed from frame to frame: `step(image, t)` runs the landmark model in the
    ROI the previous frame gave (or the detector's) and returns None once the person is lost;
    the track then needs `restart(detector_keypoints)` before the next step. The next ROI is
    built from the alignment points after MediaPipe's one-euro filter (min cutoff 0.01, beta
    10, derivative cutoff 1, object scale twice their distance; t in seconds, > 0)."""

    def __init__(self, landmarker: BodyLandmarker, detector_keypoints: np.ndarray) -> None:
        self.landmarker = landmarker
        self.filter = OneEuro(min_cutoff=0.01, beta=10.0, derivate_cutoff=1.0)
        self.roi: Rect | None = roi_from_detection(np.asarray(detector_keypoints, np.float64))

    @property
    def lost(self) -> bool:
        return self.roi is None

    def restart(self, detector_keypoints: np.ndarray) -> None:
        self.roi = roi_from_detection(np.asarray(detector_keypoints, np.float64))

    def step(self, image: np.ndarray, t: float, colour_order: str = "bgr") -> BodyLandmarks | None:
        if self.roi is None:
            return None
        body = self.landmarker.landmarks(image, self.roi, colour_order)
        if body is None:
            self.roi = None
            self.filter.reset()
        else:
            # OBJECT_SCALE_ROI: the alignment square of the unfiltered points (side 2 x distance)
            scale = 2.0 * float(np.linalg.norm(body.aux[1] - body.aux[0]))
            self.roi = roi_from_landmarks(self.filter.apply(t, body.aux, scale))
        return body
