"""The one-euro filter MediaPipe's pose graph always applies to the two alignment landmarks
before it builds the next ROI (google-ai-edge/mediapipe
mediapipe/modules/pose_landmark/pose_landmark_filtering.pbtxt, "auxiliary landmarks", with the
0.10.21 wheel's options: min cutoff 0.01, beta 10, derivative cutoff 1, the alignment square as
OBJECT_SCALE_ROI; bench/mediapipe_graph.py prints them;
mediapipe/util/filtering/one_euro_filter.cc, low_pass_filter.cc and
mediapipe/calculators/util/landmarks_smoothing_calculator.cc OneEuroFilterImpl), vectorised
over points and axes.
"""

from __future__ import annotations

import numpy as np


def _alpha(cutoff: np.ndarray | float, frequency: float) -> np.ndarray:
    tau = 1.0 / (2 * np.pi * np.asarray(cutoff, np.float64))
    return 1.0 / (1.0 + tau * frequency)


class OneEuro:
    """Filters float [N, 2] pixel points: `apply(t_seconds, points)`, and `reset()` when the
    object is lost. Timestamps must be > 0 (as MediaPipe's, whose first frame is at 33.3 ms);
    the frequency is 30 Hz until two timestamps give it. Values are scaled by 1 / object
    scale: the caller's (LandmarksSmoothingCalculator's OBJECT_SCALE_ROI, the mean side of
    that ROI), else the mean side of the points' bounding box."""

    def __init__(
        self,
        min_cutoff: float = 0.01,
        beta: float = 10.0,
        derivate_cutoff: float = 1.0,
        frequency: float = 30.0,
    ) -> None:
        self.min_cutoff = min_cutoff
        self.beta = beta
        self.derivate_cutoff = derivate_cutoff
        self.default_frequency = frequency
        self.reset()

    def reset(self) -> None:
        self.frequency = self.default_frequency
        self.last_t = 0.0
        self.raw: np.ndarray | None = None
        self.value: np.ndarray | None = None
        self.dvalue: np.ndarray | None = None

    def apply(self, t: float, points: np.ndarray, object_scale: float | None = None) -> np.ndarray:
        x = np.asarray(points, np.float64)
        if t <= self.last_t:
            # upstream: a timestamp not after the last one (or not after 0) passes through
            return x.copy()
        if object_scale is None:
            lo, hi = x.min(axis=0), x.max(axis=0)
            object_scale = float((hi - lo).sum() / 2)
        scale = object_scale
        if scale < 1e-6:
            return x.copy()
        if self.last_t != 0:
            self.frequency = 1.0 / (t - self.last_t)
        self.last_t = t
        dx = np.zeros_like(x) if self.raw is None else (x - self.raw) / scale * self.frequency
        a_d = _alpha(self.derivate_cutoff, self.frequency)
        self.dvalue = dx if self.dvalue is None else a_d * dx + (1 - a_d) * self.dvalue
        a = _alpha(self.min_cutoff + self.beta * np.abs(self.dvalue), self.frequency)
        self.value = x if self.value is None else a * x + (1 - a) * self.value
        self.raw = x
        return self.value.copy()
