"""Occasional keyframes (e.g. Sapiens2's 308 keypoints) fused into a per-frame CPU keypoint
stream, in pure numpy (docs/live-pose.md, "Keyframe fusion").

Per keypoint, each frame:
- CPU has it: the CPU point plus the keyframe's offset from the CPU point on the keyframe's own
  frame, decayed by 0.5 ** (age / offset_half_life_s); source CPU.
- only the keyframe has it: the keyframe point moved by the similarity transform (rotation,
  uniform scale, translation; least squares, no reflection) that maps its part's anchor points
  on the keyframe's frame onto the same anchors now; source KEYFRAME. Optionally pulled
  towards where optical flow carried it from the previous frame, when the flow passes its
  forward-backward check and lands within `flow_gate` part sizes of the similarity's guess.
- neither, or the part has fewer than 2 anchors on both frames: absent (NaN, score 0).
A keyframe-only point's score is the keyframe's score times 0.5 ** (age / score_half_life_s)
times 1 / (1 + residual / (motion_tol * part size)), residual being the RMS misfit of the
similarity on its anchors: it falls with age and with motion a similarity cannot explain.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stages.landmarks import flow

SOURCE_ABSENT, SOURCE_CPU, SOURCE_KEYFRAME = 0, 1, 2


@dataclass(frozen=True)
class Part:
    """Keypoints (members, indices into the K keypoints) that move with a body part, and the
    per-frame anchor points (indices into the anchor array) that measure its motion, as
    alternatives in order of preference (e.g. the face mesh, else the body's face points)."""

    name: str
    members: tuple[int, ...]
    anchors: tuple[tuple[int, ...], ...]


@dataclass
class Fused:
    """xy float64 [K, 2] (NaN absent), score float64 [K], source int8 [K] (SOURCE_*),
    age float64 [K]: seconds since the keyframe behind the point (NaN when none is)."""

    xy: np.ndarray
    score: np.ndarray
    source: np.ndarray
    age: np.ndarray


def fit_similarity(src: np.ndarray, dst: np.ndarray) -> tuple[complex, complex, float]:
    """(a, b, rms): z_dst ~ a * z_src + b over points [N, 2] as complex numbers (N >= 1;
    one point gives a translation), and the RMS residual."""
    zs = src[:, 0] + 1j * src[:, 1]
    zd = dst[:, 0] + 1j * dst[:, 1]
    ms, md = zs.mean(), zd.mean()
    var = float(np.sum(np.abs(zs - ms) ** 2))
    a = complex(np.sum((zd - md) * np.conj(zs - ms)) / var) if var > 1e-12 else 1.0 + 0j
    b = complex(md - a * ms)
    rms = float(np.sqrt(np.mean(np.abs(a * zs + b - zd) ** 2)))
    return a, b, rms


def _apply(a: complex, b: complex, xy: np.ndarray) -> np.ndarray:
    z = a * (xy[:, 0] + 1j * xy[:, 1]) + b
    return np.stack([z.real, z.imag], axis=1)


@dataclass
class _Frame:
    t: float
    cpu: np.ndarray
    anchors: np.ndarray


class KeyframeFusion:
    """`frame(t, cpu_xy, cpu_score, anchors, gray=None) -> Fused` once per frame;
    `keyframe(t, xy, score)` whenever a keyframe for an earlier (or this) frame t arrives. The
    fusion keeps `history_s` of frames to find the keyframe's own frame; an older keyframe
    raises ValueError."""

    def __init__(
        self,
        num_keypoints: int,
        parts: Sequence[Part],
        offset_half_life_s: float = 1.0,
        score_half_life_s: float = 2.0,
        motion_tol: float = 0.05,
        history_s: float = 10.0,
        use_flow: bool = False,
        flow_gate: float = 0.1,
    ) -> None:
        self.k = num_keypoints
        self.parts = tuple(parts)
        self.part_of = np.full(num_keypoints, -1, np.int64)
        for i, part in enumerate(self.parts):
            members = np.asarray(part.members, np.int64)
            if (members < 0).any() or (members >= num_keypoints).any():
                raise ValueError(f"part {part.name!r}: member outside 0..{num_keypoints - 1}")
            if (self.part_of[members] >= 0).any():
                raise ValueError(f"part {part.name!r}: a member already belongs to another part")
            self.part_of[members] = i
        self.offset_half_life_s = offset_half_life_s
        self.score_half_life_s = score_half_life_s
        self.motion_tol = motion_tol
        self.history_s = history_s
        self.use_flow = use_flow
        self.flow_gate = flow_gate
        self._history: deque[_Frame] = deque()
        self._kf: _Frame | None = None
        self._kf_xy = np.full((num_keypoints, 2), np.nan)
        self._kf_score = np.zeros(num_keypoints)
        self._prev_gray: np.ndarray | None = None
        self._prev_out: np.ndarray | None = None

    def keyframe(self, t: float, xy: np.ndarray, score: np.ndarray) -> None:
        xy = np.asarray(xy, np.float64)
        if xy.shape != (self.k, 2):
            raise ValueError(f"keyframe xy must be [{self.k}, 2], got {xy.shape}")
        frame = next((f for f in self._history if f.t == t), None)
        if frame is None:
            raise ValueError(f"keyframe at t={t}: that frame is not in the last {self.history_s} s")
        self._kf = frame
        self._kf_xy = xy.copy()
        self._kf_score = np.where(np.isfinite(xy).all(axis=1), np.asarray(score, np.float64), 0)
        self._prev_out = None  # flow restarts from the keyframe's propagated positions

    def _part_motion(
        self, part: Part, anchors: np.ndarray
    ) -> tuple[complex, complex, float, float] | None:
        """(a, b, rms, part size) of the first anchor set with >= 2 points on both frames."""
        assert self._kf is not None
        for alt in part.anchors:
            idx = np.asarray(alt, np.int64)
            src, dst = self._kf.anchors[idx], anchors[idx]
            both = np.isfinite(src).all(axis=1) & np.isfinite(dst).all(axis=1)
            if both.sum() < 2:
                continue
            a, b, rms = fit_similarity(src[both], dst[both])
            size = float(np.ptp(dst[both], axis=0).max())
            return a, b, rms, max(size, 1e-6)
        return None

    def frame(
        self,
        t: float,
        cpu_xy: np.ndarray,
        cpu_score: np.ndarray,
        anchors: np.ndarray,
        gray: np.ndarray | None = None,
    ) -> Fused:
        cpu = np.asarray(cpu_xy, np.float64)
        anchors = np.asarray(anchors, np.float64)
        if cpu.shape != (self.k, 2):
            raise ValueError(f"cpu xy must be [{self.k}, 2], got {cpu.shape}")
        self._history.append(_Frame(t, cpu.copy(), anchors.copy()))
        while self._history and self._history[0].t < t - self.history_s:
            self._history.popleft()
        has_cpu = np.isfinite(cpu).all(axis=1)
        xy = np.where(has_cpu[:, None], cpu, np.nan)
        score = np.where(has_cpu, np.asarray(cpu_score, np.float64), 0.0)
        source = np.where(has_cpu, SOURCE_CPU, SOURCE_ABSENT).astype(np.int8)
        age = np.full(self.k, np.nan)
        if self._kf is not None:
            kf_age = t - self._kf.t
            has_kf = np.isfinite(self._kf_xy).all(axis=1)
            shared = has_cpu & has_kf & np.isfinite(self._kf.cpu).all(axis=1)
            decay = 0.5 ** (kf_age / self.offset_half_life_s)
            xy[shared] = cpu[shared] + (self._kf_xy[shared] - self._kf.cpu[shared]) * decay
            age[shared] = kf_age
            only_kf = has_kf & ~has_cpu
            for p, part in enumerate(self.parts):
                members = np.flatnonzero(only_kf & (self.part_of == p))
                if members.size == 0:
                    continue
                motion = self._part_motion(part, anchors)
                if motion is None:
                    continue
                a, b, rms, size = motion
                guess = _apply(a, b, self._kf_xy[members])
                if self.use_flow and gray is not None and self._prev_gray is not None:
                    guess = self._flow_refine(members, guess, gray, size)
                xy[members] = guess
                source[members] = SOURCE_KEYFRAME
                age[members] = kf_age
                fade = 0.5 ** (kf_age / self.score_half_life_s)
                misfit = 1 + rms / (self.motion_tol * size)
                score[members] = self._kf_score[members] * fade / misfit
        self._prev_gray = gray
        self._prev_out = xy.copy()
        return Fused(xy, score, source, age)

    def _flow_refine(
        self, members: np.ndarray, guess: np.ndarray, gray: np.ndarray, size: float
    ) -> np.ndarray:
        if self._prev_out is None:
            return guess
        carried, ok = flow.track(self._prev_gray, gray, self._prev_out[members])
        near = np.linalg.norm(carried - guess, axis=1) <= self.flow_gate * size
        use = ok & near
        out = guess.copy()
        out[use] = 0.5 * (guess[use] + carried[use])
        return out
