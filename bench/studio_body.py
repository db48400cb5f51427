"""The live body on real views: configs/studio-3d.toml (Pose2Sim's single-person lab videos,
the per-frame CPU pose, rig3d, the ANNY fit) run for a while, and the `body/studio` messages'
residuals (fitted keypoint to triangulated keypoint, metres) summarised: issue 31's "fitted
keypoints' median distance to the triangulated ones <= 25 mm" on the real demo, live.

Usage: .venv/bin/python bench/studio_body.py [--seconds 70]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ports import free_port  # noqa: E402

from pipeline import wire  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=70.0)
    args = ap.parse_args()
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    text = (REPO / "configs" / "studio-3d.toml").read_text()
    text = text.replace('"../.cache/', f'"{REPO}/.cache/')
    text = text.replace('bind = "tcp://127.0.0.1:5564"', f'bind = "{endpoint}"')
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "studio-3d.toml"
        config.write_text(text)
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"body/")
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.connect(endpoint)
        npucam = REPO / ".venv" / "bin" / "npucam"
        run = [str(npucam), "run", str(config), "--duration", str(args.seconds)]
        proc = subprocess.Popen(run, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        residuals, messages = [], 0
        end = time.monotonic() + args.seconds + 20
        while time.monotonic() < end and proc.poll() is None:
            if sub.poll(200):
                msg = wire.decode(sub.recv_multipart())
                messages += 1
                if msg.arrays["residuals"].size:
                    residuals.append(msg.arrays["residuals"].ravel())
        proc.wait(timeout=60)
        sub.close()
        ctx.term()
    print(f"body/studio messages {messages}, with a person {len(residuals)}")
    if not residuals:
        return 1
    every = np.concatenate(residuals)
    fitted = every[np.isfinite(every)]
    late = np.concatenate(residuals[len(residuals) // 2 :])
    late = late[np.isfinite(late)]
    print(
        f"fitted -> triangulated keypoint (m): median {np.median(fitted):.4f}, p95 "
        f"{np.percentile(fitted, 95):.4f} over {fitted.size} of {every.size} keypoints "
        f"(the rest not triangulated); second half of the run median {np.median(late):.4f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
