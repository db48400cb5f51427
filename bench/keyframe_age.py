"""Sapiens2 keyframe age and the per-frame pose's lag on configs/demo.toml (simulated NPU at
NPU2's pace): a run where a refresh takes its track's newest frame when its pass is dispatched
(stages/models/sapiens2/runtime.py, `freshen`), against a reference run in the same
invocation where it keeps the frame it was queued with (the behaviour before issue 29).

Keyframe age: capture -> post-processing of each Sapiens2 pose (`age_ms` of a pose message
without `live`), in device passes of 2.4 s (Sapiens2 0.4b on NPU2, docs/device.md). Lag: the
same figure of the per-frame poses. Coverage: tracked person-frames of det/ with their
per-frame pose. Usage: .venv/bin/python bench/keyframe_age.py [--seconds 90]
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

PASS_MS = 2400.0  # Sapiens2 0.4b's modelled NPU2 pass (configs/demo.toml, docs/device.md)
QUEUED_FRAME = (
    "import stages.models.sapiens2.runtime as r\n"
    "r.Sapiens2Runtime.freshen = lambda self, job: None\n"
)
RUN = "import sys\nfrom pipeline.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def run(seconds: float, fresh: bool, tmp: Path) -> dict:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    text = (REPO / "configs" / "demo.toml").read_text()
    text = text.replace('bind = "tcp://127.0.0.1:5560"', f'bind = "{endpoint}"')
    config = tmp / f"demo-{fresh}.toml"
    config.write_text(text.replace('"../.cache', f'"{REPO}/.cache'))
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVHWM, 100_000)
    sub.connect(endpoint)
    code = RUN if fresh else QUEUED_FRAME + RUN
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "run", str(config), "--duration", str(seconds)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    keyframe, lag = [], []
    persons: dict[tuple[str, int], set[int]] = {}
    live: dict[tuple[str, int], set[int]] = {}
    end = time.monotonic() + seconds + 30
    while time.monotonic() < end and proc.poll() is None:
        if not sub.poll(200):
            continue
        h = wire.decode(sub.recv_multipart()).header
        if h["kind"] == "det":
            ids = {t for t, lab in zip(h["track_ids"], h["labels"], strict=True) if lab == "person"}
            persons[(h["camera"], h["seq"])] = ids - {None}
        elif h["kind"] == "pose" and h.get("live"):
            lag.append(h["age_ms"])
            live.setdefault((h["camera"], h["seq"]), set()).add(h["track_id"])
        elif h["kind"] == "pose":
            keyframe.append(h["age_ms"])
    proc.wait(timeout=60)
    sub.close()
    ctx.term()
    wanted = sum(len(v) for v in persons.values())
    got = sum(len(v & live.get(k, set())) for k, v in persons.items())
    return {
        "keyframes": len(keyframe),
        "kf_p50": float(np.percentile(keyframe, 50)) / PASS_MS if keyframe else float("nan"),
        "kf_p95": float(np.percentile(keyframe, 95)) / PASS_MS if keyframe else float("nan"),
        "lag_p50": float(np.percentile(lag, 50)) if lag else float("nan"),
        "lag_p95": float(np.percentile(lag, 95)) if lag else float("nan"),
        "coverage": got / wanted if wanted else float("nan"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=90.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = run(args.seconds, True, Path(tmp))
        queued = run(args.seconds, False, Path(tmp))
    print("run | Sapiens2 poses | keyframe age p50 / p95 (passes) | per-frame lag p50 / p95 ms "
          "| person-frames with a per-frame pose")  # fmt: skip
    for name, r in (("newest frame at dispatch", fresh), ("queued frame (reference)", queued)):
        print(
            f"{name} | {r['keyframes']} | {r['kf_p50']:.2f} / {r['kf_p95']:.2f} | "
            f"{r['lag_p50']:.0f} / {r['lag_p95']:.0f} | {100 * r['coverage']:.1f}%"
        )
    print(f"keyframe age p50 ratio (newest / queued): {fresh['kf_p50'] / queued['kf_p50']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
