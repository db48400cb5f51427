"""Cameras at 30 fps this host sustains with people tracked on every frame: capture -> detect
-> publish (no NPU stage), N cameras playing one sample clip at 30 fps, N = 1, 2, ... until a
camera falls under 90% of its frames. "before": the person detector (BlazePose) on every frame
and the IoU tracker (detect without `live`); "after": the per-frame pose (`live`: landmark
models following each person, the detector only to find people; body + hands, max_people 2).
Both with detect's default workers (the cores less one). A frame counts when its det/ message
is published; "after" also counts the frames whose tracked people all had a per-frame pose.

Clips: bikes (640x272, 25 fps file played at 30) and Pose2Sim's cam01 scaled to 720x1280
(written to .cache/npucam/bench/, never committed). Usage:
.venv/bin/python bench/live_cameras.py [--seconds 20] [--max-cameras 4]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
import zmq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ports import free_port  # noqa: E402

from pipeline import wire  # noqa: E402
from pipeline.assets import asset_path  # noqa: E402

FPS = 30
KEEP_UP = 0.9  # a camera keeps up when >= 90% of its frames are published
WARMUP_S = 5.0


def clip_720p() -> Path:
    out = REPO / ".cache" / "npucam" / "bench" / "pose2sim_cam01_720x1280.mp4"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    cap = cv2.VideoCapture(str(asset_path("pose2sim_single_cam01.mp4")))
    writer = None
    while True:
        ok, image = cap.read()
        if not ok:
            break
        image = cv2.resize(image, (720, 1280), interpolation=cv2.INTER_AREA)
        if writer is None:
            writer = cv2.VideoWriter(str(out), cv2.VideoWriter_fourcc(*"mp4v"), 60, (720, 1280))
        writer.write(image)
    cap.release()
    assert writer is not None, "pose2sim_single_cam01.mp4: no frame read"
    writer.release()
    return out


def config(clip: Path, cameras: int, live: bool, endpoint: str) -> str:
    cams = "".join(
        f'[[cameras]]\nname = "c{i}"\nurl = "{clip}"\nloop = true\nfps = {FPS}\n\n'
        for i in range(cameras)
    )
    live_table = (
        '[stages.live]\nenabled = true\nparts = ["body", "hands"]\nmax_people = 2\n' if live else ""
    )
    return (
        f'{cams}[[stages]]\nkind = "capture"\n\n'
        f'[[stages]]\nkind = "detect"\nface = "none"\npose = false\nfaces = false\n'
        f'inbox = {{ size = 2, policy = "latest" }}\n{live_table}\n'
        f'[[stages]]\nkind = "publish"\nbind = "{endpoint}"\n'
    )


def measure(clip: Path, cameras: int, live: bool, seconds: float, tmp: Path) -> dict:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    path = tmp / f"live-{live}-{cameras}.toml"
    path.write_text(config(clip, cameras, live, endpoint))
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 100_000)
    for topic in (b"det/", b"pose/"):
        sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.connect(endpoint)
    total = WARMUP_S + seconds
    proc = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "npucam"), "run", str(path), "--duration", str(total + 5)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    dets: dict[str, set[int]] = {}
    people: dict[tuple[str, int], set[int]] = {}
    posed: dict[tuple[str, int], set[int]] = {}
    lags: list[int] = []  # capture -> publish of the per-frame poses, ns
    start = None
    end = time.monotonic() + total + 30
    while time.monotonic() < end and proc.poll() is None:
        if not sub.poll(200):
            continue
        h = wire.decode(sub.recv_multipart()).header
        now = time.monotonic()
        if start is None:
            start = now
        if now - start < WARMUP_S:
            continue
        if now - start > total:
            break
        key = (h["camera"], h["seq"])
        if h["kind"] == "det":
            dets.setdefault(h["camera"], set()).add(h["seq"])
            ids = {t for t, lab in zip(h["track_ids"], h["labels"], strict=True) if lab == "person"}
            people[key] = ids - {None}
        elif h.get("live"):
            posed.setdefault(key, set()).add(h["track_id"])
            lags.append(h["publish_ts"] - h["capture_ts"])
    proc.terminate()
    proc.wait(timeout=30)
    sub.close()
    ctx.term()
    rates = [len(dets.get(f"c{i}", ())) / seconds for i in range(cameras)]
    with_people = [k for k, v in people.items() if v]
    covered = sum(people[k] <= posed.get(k, set()) for k in with_people)
    lag = np.percentile(np.array(lags) / 1e6, [50, 95]) if lags else [float("nan")] * 2
    return {
        "lag_ms": (float(lag[0]), float(lag[1])),
        "fps": rates,
        "keeps_up": all(r >= KEEP_UP * FPS for r in rates),
        "posed": covered / len(with_people) if with_people else float("nan"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--max-cameras", type=int, default=4)
    args = ap.parse_args()
    clips = {"bikes 640x272": asset_path("bikes.mp4"), "Pose2Sim cam01 720x1280": clip_720p()}
    print(
        "clip | detect | cameras | published fps per camera | frames with every person posed "
        "| per-frame pose capture -> publish p50 / p95 ms"
    )
    summary = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, clip in clips.items():
            for live, mode in ((False, "before"), (True, "after")):
                sustained = 0
                for n in range(1, args.max_cameras + 1):
                    r = measure(clip, n, live, args.seconds, Path(tmp))
                    fps = ", ".join(f"{x:.1f}" for x in r["fps"])
                    posed = f"{100 * r['posed']:.1f}%" if live else "-"
                    lag = "{:.0f} / {:.0f}".format(*r["lag_ms"]) if live else "-"
                    print(f"{name} | {mode} | {n} | {fps} | {posed} | {lag}", flush=True)
                    if not r["keeps_up"]:
                        break
                    sustained = n
                summary.append((name, mode, sustained))
    print()
    for name, mode, n in summary:
        print(f"{name}, {mode}: {n} camera(s) at {FPS} fps sustained")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
