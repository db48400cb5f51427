"""MediaPipe's own landmark graphs run on a clip, written to an .npz: the independent reference
for stages/landmarks (tests/stages/landmarks/test_reference.py, bench/live_pose.py).

Runs ONLY in the reference venv (.venv-mediapipe, `make setup-test`; mediapipe 0.10.21 pins
numpy<2 and protobuf<5, which the project venv cannot share) and never imports npucam.
Usage: .venv-mediapipe/bin/python bench/mediapipe_reference.py CLIP OUT.npz
       [--frames N] [--graph pose|holistic]
Outputs, per frame, in image pixels (NaN where MediaPipe gave nothing): pose [F, 33, 4]
(x, y, visibility, presence), left_hand / right_hand [F, 21, 2] (holistic only; MediaPipe's
left is the person's left), face [F, 468, 2] (holistic only), cpu_s [F] the process CPU
seconds each frame's `process` took (every MediaPipe thread counted).
"""

from __future__ import annotations

import argparse
import time

import cv2
import numpy as np
from mediapipe.python.solutions import holistic, pose


def _points(landmarks, n: int, w: int, h: int, extra: bool = False) -> np.ndarray:
    out = np.full((n, 4 if extra else 2), np.nan)
    if landmarks is None:
        return out
    for i, lm in enumerate(landmarks.landmark):
        row = [lm.x * w, lm.y * h] + ([lm.visibility, lm.presence] if extra else [])
        out[i] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("clip")
    ap.add_argument("out")
    ap.add_argument("--frames", type=int, default=0, help="0 = all")
    ap.add_argument("--graph", choices=("pose", "holistic"), default="pose")
    args = ap.parse_args()
    if args.graph == "pose":
        solution = pose.Pose(static_image_mode=False, model_complexity=1, smooth_landmarks=False)
    else:
        solution = holistic.Holistic(
            static_image_mode=False,
            model_complexity=1,
            smooth_landmarks=False,
            refine_face_landmarks=False,
        )
    cap = cv2.VideoCapture(args.clip)
    if not cap.isOpened():
        raise SystemExit(f"{args.clip}: cannot open")
    rows: dict[str, list[np.ndarray]] = {k: [] for k in ("pose", "left", "right", "face")}
    cpu: list[float] = []
    while args.frames <= 0 or len(cpu) < args.frames:
        ok, frame = cap.read()
        if not ok:
            break
        h, w = frame.shape[:2]
        rgb = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
        t0 = time.process_time()
        res = solution.process(rgb)
        cpu.append(time.process_time() - t0)
        rows["pose"].append(_points(res.pose_landmarks, 33, w, h, extra=True))
        if args.graph == "holistic":
            rows["left"].append(_points(res.left_hand_landmarks, 21, w, h))
            rows["right"].append(_points(res.right_hand_landmarks, 21, w, h))
            rows["face"].append(_points(res.face_landmarks, 468, w, h))
    solution.close()
    out = {"pose": np.array(rows["pose"]), "cpu_s": np.array(cpu)}
    if args.graph == "holistic":
        out |= {
            "left_hand": np.array(rows["left"]),
            "right_hand": np.array(rows["right"]),
            "face": np.array(rows["face"]),
        }
    np.savez(args.out, **out)


if __name__ == "__main__":
    main()
