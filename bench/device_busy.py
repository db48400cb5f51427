"""Device busy of the infer stage running Sapiens2-Pose 0.4b at full depth, with the dispatch
order the driver needs (a consumer on another hardware context waits for its producer:
docs/device.md, "Ordering"), against the old chaining (`[attention, o]` and `[gu, down]`
started together) in the same process.

The stage is stages/infer.py with backend npu: npu.xrt.XrtDevice over the test fake pyxrt
(tests/npu/fake_pyxrt.py), whose runs compute nothing and take each kernel's NPU2 time from
the calibrated cost model (npu/sim_cost.py `NPU2`, priced on the dispatches of
npu/models/sapiens2/npu2.py at the released 0.4b sizes), on one timeline for every context
(`serial`: one array time-slicing contexts that each take all its columns). The bundle is the
released 0.4b layout (24 layers, D 1024, 3081 tokens, head up (1024, 768), convs (512, 512,
256)) with random weights and one context per record, written once to
.cache/npucam/bench/. One host thread (NPUCAM_HOST_THREADS=1) does the host glue. Jobs are
always queued (2 cameras x 2 tracks, a frame every 0.1 s).

Busy = the union of the fake's emulated run intervals over `--seconds` after two boxes were
published, independent of the stage's counters; the process CPU time a box over the same
window says whether the host kept up (on a shared machine it is the first suspect). The
cost of the added waits is the device idle right before each `o` and `down` (the gap between
the run before it on the device's timeline and its start), a box, against the same gap in
the reference run, where they were queued behind their producers. The old
chaining is replayed by wrapping each forward's steps so that an attention or gate-up step
and the step after it are started before either is waited for (what `_backbone` yielded
before), with the fake's hazards only recorded (`fail_hazards` off), so that it runs; it is
the reference the cost of the added waits is measured against, and its hazard count says
how often it raced.

Run: .venv/bin/python bench/device_busy.py [--seconds 60] [--layers 24] [--no-reference]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import os
import sys
import time
import types
from collections.abc import Generator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("NPUCAM_HOST_THREADS", "1")


def _load(name: str, rel: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / rel)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


fake = _load("fake_pyxrt", "tests/npu/fake_pyxrt.py")
sys.modules["pyxrt"] = fake
bundles = _load("sapiens2_recording", "tests/npu/models/sapiens2_recording.py")
intervals = _load("busy_intervals", "tests/stages/busy_intervals.py")

import npu.models.sapiens2.npu as s2npu  # noqa: E402
import npu.xrt  # noqa: E402
from npu.device import Launch, Steps  # noqa: E402
from npu.models.sapiens2 import npu2  # noqa: E402
from npu.models.sapiens2.config import Config  # noqa: E402
from npu.sim_cost import NPU2  # noqa: E402
from pipeline.assets import cache_dir  # noqa: E402
from pipeline.config import parse_config  # noqa: E402
from pipeline.graph import Context  # noqa: E402
from pipeline.messages import now_ns  # noqa: E402
from pipeline.metrics import Metrics  # noqa: E402
from stages.infer import Infer, InferOptions  # noqa: E402
from stages.models.sapiens2.job import PoseJob  # noqa: E402

RELEASED = dataclasses.replace(npu2.RELEASED["0.4b"], flip_pairs=((1, 2),))
PRODUCERS = {"mha", "gu"}  # the steps the old chaining did not wait for before the next
CONSUMERS = {"o", "down"}  # the dispatches that now wait for them
FRAME = np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)


def config(layers: int) -> Config:
    """The released 0.4b layout, its first `layers` layers (24: all)."""
    return dataclasses.replace(RELEASED, layers=layers, kv_heads=RELEASED.kv_heads[:layers])


def bundle_path(cfg: Config) -> Path:
    path = cache_dir() / "bench" / f"sapiens2-0.4b-released-{cfg.layers}l-per-record-v2"
    if not (path / "manifest.txt").is_file():
        print(f"writing {path} (once) ...", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        bundles.write_random_bundle(cfg, path, per_record=True)
    return path


def dispatch_times(cfg: Config) -> tuple[dict[str, float], float]:
    """NPU2 seconds per dispatch by xclbin path (one context per record, named after its
    key) and the device seconds of one box."""
    times: dict[str, float] = {}
    box = 0.0
    for d in npu2.dispatches(cfg):
        s = NPU2.dispatch_s(d)
        times[f"/{d.key}.xclbin"] = s
        box += s
    return times, box


def old_chaining(steps: Steps) -> Generator[list[Launch], None, object]:
    """The same forward with a producer's step and the one after it merged into one step:
    the consumer is started before the producer is waited for, as before issue 26."""
    try:
        launches = list(next(steps))
        while True:
            while launches and all(x.kernel.spec.key in PRODUCERS for x in launches):
                launches += steps.send(None)
            yield launches
            launches = list(steps.send(None))
    except StopIteration as stop:
        return stop.value


def idle_before(start: float, end: float) -> dict[str, float]:
    """Device idle seconds within [start, end] by the record key of the run that ended each
    idle gap (the fake's serial timeline: runs never overlap)."""
    idle: dict[str, float] = {}
    reach = None
    for run_id, begin, stop in sorted(fake.timeline, key=lambda span: span[1]):
        if reach is not None:
            lo, hi = max(reach, start), min(begin, end)
            if hi > lo:
                key = Path(fake.run_xclbin[run_id]).stem
                idle[key] = idle.get(key, 0.0) + hi - lo
        reach = stop if reach is None else max(reach, stop)
    return idle


def pose(camera: str, seq: int, track: int) -> PoseJob:
    t = now_ns()
    return PoseJob(camera=camera, seq=seq, capture_ts_ns=t, deadline_ns=t + 600 * 10**9,
                   track_id=track, box_xywh=np.array([100 + 150 * track, 40, 160, 400],
                   np.float32), score=0.9, image=FRAME)  # fmt: skip


def device_busy(cfg: Config, seconds: float, chaining: str, tmp: Path) -> dict:
    fake.reset()
    fake.record, fake.serial = False, True
    fake.fail_hazards = chaining == "ordered"
    times, box_s = dispatch_times(cfg)
    bundle = bundle_path(cfg)
    fake.dispatch_s.update(times)
    node = tmp / "accel0"
    node.write_bytes(b"")
    npu.xrt.DEVICE_NODE, npu.xrt._device = str(node), None
    replay = s2npu.Sapiens2Replay
    original = replay.heatmap_steps
    if chaining == "old":
        replay.heatmap_steps = lambda self, *a, **k: old_chaining(original(self, *a, **k))
    options = InferOptions.model_validate(
        {"backend": "npu", "sapiens2": {"enabled": True, "bundle": str(bundle)}}
    )
    config = parse_config({"stages": [{"kind": "capture"}]}, tmp / "run.toml")
    stage = Infer("infer", options, Context(config, Metrics()))
    window: list[float] = []
    published: list[int] = []
    cpu: list[float] = []  # process CPU seconds (all threads) at the window's ends

    async def source():
        while stage.scheduler is None:
            await asyncio.sleep(0.01)
        seq = 0
        while len(window) < 2:
            for cam in ("c0", "c1"):
                for track in (0, 1):
                    yield pose(cam, seq, track)
            seq += 1
            done = stage.published["sapiens2"]
            now = time.perf_counter()
            if not window and done >= 2 or window and now - window[0] >= seconds:
                window.append(now)
                published.append(done)
                cpu.append(time.process_time())
            await asyncio.sleep(0.1)

    class Out:
        async def send(self, item):
            pass

    try:
        asyncio.run(asyncio.wait_for(stage.run(source(), Out()), timeout=seconds + 900))
    finally:
        replay.heatmap_steps = original
    start, end = window
    spans = [(b, e) for _, b, e in fake.timeline]
    boxes = published[1] - published[0]
    idle = idle_before(start, end)
    return {
        "chaining": chaining,
        "busy": intervals.union_s(spans, start, end) / (end - start),
        "boxes": boxes,
        "s_per_box": (end - start) / boxes if boxes else float("inf"),
        "cpu_per_box": (cpu[1] - cpu[0]) / boxes if boxes else float("inf"),
        "idle_per_box": sum(idle.values()) / boxes if boxes else float("inf"),
        "consumer_idle_per_box": (
            sum(v for k, v in idle.items() if k in CONSUMERS) / boxes if boxes else float("inf")
        ),
        "idle_by_next": {k: v / boxes for k, v in idle.items()} if boxes else {},
        "box_device_s": box_s,
        "errors": stage.errors["sapiens2"],
        "hazards": len(fake.hazards),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--layers", type=int, default=24, help="the first n layers (24: full depth)")
    ap.add_argument("--no-reference", action="store_true", help="skip the old chaining's run")
    args = ap.parse_args()
    import tempfile

    print(f"load average before: {os.getloadavg()}", flush=True)
    cfg = config(args.layers)
    bundle_path(cfg)
    runs = ["ordered"] if args.no_reference else ["ordered", "old"]
    got = []
    for chaining in runs:
        with tempfile.TemporaryDirectory() as tmp:
            r = device_busy(cfg, args.seconds, chaining, Path(tmp))
        got.append(r)
        print(
            f"{r['chaining']:>8}: device busy {r['busy']:.3f} over {args.seconds:.0f} s, "
            f"{r['boxes']} boxes ({r['s_per_box']:.2f} s and {r['cpu_per_box']:.2f} s of "
            f"process CPU a box; NPU2 device time {r['box_device_s']:.2f} s a box), "
            f"{r['errors']} errors, {r['hazards']} hazards; device idle {r['idle_per_box']:.3f} "
            f"s a box, {r['consumer_idle_per_box']:.3f} s of it right before o / down",
            flush=True,
        )
        worst = sorted(r["idle_by_next"].items(), key=lambda kv: -kv[1])[:6]
        print(
            "          idle a box by the run that ended the gap: "
            + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in worst),
            flush=True,
        )
    if len(got) == 2:
        new, old = got
        print(
            f"ordered / old busy: {new['busy'] / old['busy']:.3f}; device idle right before "
            f"o / down: {new['consumer_idle_per_box'] - old['consumer_idle_per_box']:+.3f} s "
            f"a box more ordered (the added waits' cost); wall a box "
            f"{new['s_per_box'] - old['s_per_box']:+.3f} s"
        )
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
