"""npucam's CPU landmark path (stages/landmarks) against MediaPipe's own graphs on the same clip:
the runs and the agreement figures tests/stages/landmarks/test_landmarks_reference.py asserts and
bench/live_pose.py prints.

Usage: python bench/landmark_agreement.py CLIP [--frames N]
MediaPipe runs in the reference venv (.venv-mediapipe, `make setup-test`) through
bench/mediapipe_reference.py; both sides see timestamps (i + 1) / 30 s, as mediapipe.solutions
does. Differences are in % of the reference's body height (the vertical extent of its 33 body
landmarks in that frame). Frames where the two follow different people (mean body difference
over 50% of body height) are counted apart from the landmark differences.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stages.landmarks.detection import PoseDetector  # noqa: E402
from stages.landmarks.tracker import LandmarkTracker  # noqa: E402

REFERENCE_PYTHON = ROOT / ".venv-mediapipe" / "bin" / "python"
REFERENCE_SCRIPT = ROOT / "bench" / "mediapipe_reference.py"
SAME_PERSON = 0.5


def run_reference(clip: Path, out: Path, graph: str = "holistic", frames: int = 0) -> dict:
    """MediaPipe's graph on clip, in its own venv; returns the .npz arrays."""
    if not REFERENCE_PYTHON.is_file():
        raise RuntimeError(
            f"{REFERENCE_PYTHON}: the MediaPipe reference venv is missing; run `make setup-test`"
        )
    cmd = [str(REFERENCE_PYTHON), str(REFERENCE_SCRIPT), str(clip), str(out), "--graph", graph]
    cmd += ["--frames", str(frames)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{REFERENCE_SCRIPT} {clip} failed: {proc.stderr[-2000:]}")
    with np.load(out) as data:
        return {k: data[k] for k in data.files}


def run_npucam(clip: Path, parts: tuple[str, ...] = ("body", "hands"), frames: int = 0) -> dict:
    """The first tracked person's landmarks per frame (NaN where none), as run_reference's
    arrays; cpu_s is this process's CPU time for each frame's step."""
    tracker = LandmarkTracker(PoseDetector(), parts=parts, max_people=1)
    cap = cv2.VideoCapture(str(clip))
    if not cap.isOpened():
        raise RuntimeError(f"{clip}: cannot open")
    rows: dict[str, list[np.ndarray]] = {k: [] for k in ("pose", "left_hand", "right_hand", "face")}
    cpu: list[float] = []
    while frames <= 0 or len(cpu) < frames:
        ok, frame = cap.read()
        if not ok:
            break
        t0 = time.process_time()
        people = tracker.step(frame, (len(cpu) + 1) / 30)
        cpu.append(time.process_time() - t0)
        person = people[0] if people else None
        pose = np.full((33, 4), np.nan)
        hands = {s: np.full((21, 2), np.nan) for s in ("left", "right")}
        face = np.full((468, 2), np.nan)
        if person is not None:
            pose = np.concatenate(
                [person.body.xy, person.body.visibility[:, None], person.body.presence[:, None]],
                axis=1,
            )
            for side, hand in person.hands.items():
                if hand is not None:
                    hands[side] = hand.xy
            if person.face is not None:
                face = person.face.xy
        rows["pose"].append(pose)
        rows["left_hand"].append(hands["left"])
        rows["right_hand"].append(hands["right"])
        rows["face"].append(face)
    out = {k: np.array(v) for k, v in rows.items()}
    out["cpu_s"] = np.array(cpu)
    out["detector_runs"] = np.array(tracker.detector_runs)
    return out


@dataclass
class Agreement:
    """Frame counts and differences in % of body height (point-frames pooled)."""

    frames: int
    both: int
    only_ours: int
    only_reference: int
    other_person: int
    body_mean: float
    body_p95: float
    hand_frames: int
    hand_mean: float
    hand_p95: float

    def line(self, name: str) -> str:
        hands = (
            f"hands {self.hand_frames} hand-frames mean {self.hand_mean:.2f}% "
            f"p95 {self.hand_p95:.2f}%"
            if self.hand_frames
            else "hands: none in both"
        )
        return (
            f"{name}: {self.frames} frames, both {self.both} (other person {self.other_person}), "
            f"only npucam {self.only_ours}, only MediaPipe {self.only_reference}; body mean "
            f"{self.body_mean:.2f}% p95 {self.body_p95:.2f}%; {hands}"
        )


def agreement(ours: dict, ref: dict) -> Agreement:
    n = min(len(ours["pose"]), len(ref["pose"]))
    has_ours = np.isfinite(ours["pose"][:n, :, 0]).all(axis=1)
    has_ref = np.isfinite(ref["pose"][:n, :, 0]).all(axis=1)
    body: list[np.ndarray] = []
    hand: list[np.ndarray] = []
    other = hand_frames = 0
    for i in np.flatnonzero(has_ours & has_ref):
        r = ref["pose"][i, :, :2]
        height = float(np.ptp(r[:, 1]))
        err = np.linalg.norm(ours["pose"][i, :, :2] - r, axis=1) / height * 100
        if err.mean() > SAME_PERSON * 100:
            other += 1
            continue
        body.append(err)
        for side in ("left_hand", "right_hand"):
            if side not in ref:
                continue
            a, b = ours[side][i], ref[side][i]
            if np.isfinite(a).all() and np.isfinite(b).all():
                hand.append(np.linalg.norm(a - b, axis=1) / height * 100)
                hand_frames += 1
    b = np.concatenate(body) if body else np.array([np.nan])
    h = np.concatenate(hand) if hand else np.array([np.nan])
    return Agreement(
        frames=n,
        both=int((has_ours & has_ref).sum()),
        only_ours=int((has_ours & ~has_ref).sum()),
        only_reference=int((~has_ours & has_ref).sum()),
        other_person=other,
        body_mean=float(b.mean()),
        body_p95=float(np.percentile(b, 95)),
        hand_frames=hand_frames,
        hand_mean=float(h.mean()),
        hand_p95=float(np.percentile(h, 95)),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("clip", type=Path)
    ap.add_argument("--frames", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("/tmp/mediapipe_reference.npz"))
    args = ap.parse_args()
    ref = run_reference(args.clip, args.out, "holistic", args.frames)
    ours = run_npucam(args.clip, ("body", "hands"), args.frames)
    print(agreement(ours, ref).line(args.clip.name))


if __name__ == "__main__":
    main()
