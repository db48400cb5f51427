"""The infer stage keeps the NPU busy with Sapiens2 boxes queued: while the device runs one
box's dispatches, the host glue of another runs (stages/device_thread.py's DeviceThread interleaving
Runtime.run_steps; the scheduler hands the second box out at once), so the device never
waits on host glue.

Backend npu over the test fake pyxrt (tests/npu/fake_pyxrt.py: its runs compute nothing and
take a fixed emulated time each, one after another on one device), a Sapiens2 bundle at the
real 0.4b widths, tokens and head with random weights (one context per record, so each
kernel gets its own time), NPU2-like dispatch times: every GEMM its FLOPs at 1.6 TFLOP/s
(the simulator's CostModel rate; the 0.4b box is then ~2.7 s of device time), the attention
33 ms (0.8 s over 24 layers). Device busy = the union of the fake's emulated run intervals
over a window after warm-up, independent of the stage's own counters. Before the interleaving
the host glue ran between dispatches of the same box (device busy ~0.6 at 2 layers with
today's glue, ~0.3 with the glue before issue 14). Both tests are `slow`: a busy fraction
on the wall clock is the host's as much as the code's, so the two-layer one compares the
interleaved passes with one pass at a time, run back to back.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "npu" / "models"))
from busy_intervals import union_s  # noqa: E402
from sapiens2_recording import fake_pyxrt, real_config, write_random_bundle  # noqa: E402

import npu.xrt  # noqa: E402
import stages.infer  # noqa: E402
from npu.models.sapiens2.export import record_layout  # noqa: E402
from npu.models.sapiens2.npu import gemm_keys  # noqa: E402
from pipeline.messages import now_ns  # noqa: E402
from stages.device_thread import DeviceThread  # noqa: E402
from stages.infer import Infer, InferOptions  # noqa: E402
from stages.models.sapiens2.job import PoseJob  # noqa: E402
from tests.stages.models.inferred_items import context as run_context  # noqa: E402

GEMM_FLOPS_PER_S = 1.6e12
MHA_S = 0.033


def dispatch_times(cfg) -> dict[str, float]:
    """Emulated seconds per dispatch by xclbin path (write_random_bundle(per_record=True)
    names each record's context after its key)."""
    layout = record_layout(cfg)
    times = {"/mha.xclbin": MHA_S}
    for key in gemm_keys(cfg):
        f = layout[key]
        cols = 2 * f["N"] if key == "gu" else f["N"]  # gate | up
        times[f"/{key}.xclbin"] = 2 * f["rows"] * f["K"] * cols / GEMM_FLOPS_PER_S
    return times


def box_device_s(cfg, times: dict[str, float]) -> float:
    """Emulated device seconds of one box (one dispatch per record and layer)."""
    from npu.models.sapiens2.npu import qkv_width

    per_layer = sum(times[f"/{k}.xclbin"] for k in ("o", "gu", "down")) + MHA_S
    total = sum(per_layer + times[f"/qkv{qkv_width(cfg, i)}.xclbin"] for i in range(cfg.layers))
    head = ["patch"] + [f"d{j}" for j in range(len(cfg.up))]
    head += [f"c{j}" for j in range(len(cfg.convs))] + ["pred"]
    return total + sum(times[f"/{k}.xclbin"] for k in head)


FRAME = np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)


def pose(camera: str, seq: int, track: int) -> PoseJob:
    t = now_ns()
    return PoseJob(camera=camera, seq=seq, capture_ts_ns=t, deadline_ns=t + 600 * 10**9,
                   track_id=track, box_xywh=np.array([100 + 150 * track, 40, 160, 400],
                   np.float32), score=0.9, image=FRAME)  # fmt: skip


def device_busy(tmp_path, monkeypatch, layers: int | None, seconds: float) -> dict:
    """Run the stage with Sapiens2 jobs always queued (2 cameras x 2 tracks, a new frame
    every 0.1 s) for `seconds` after both warm-up passes and two more; the emulated device's
    busy fraction over that window, and what ran."""
    fake = fake_pyxrt()
    fake.record = False  # ~20k calls a box: only counted (fake.timeline has the runs)
    fake.serial = True  # one device time-slicing the contexts, as this busy figure assumes
    monkeypatch.setitem(sys.modules, "pyxrt", fake)
    node = tmp_path / "accel0"
    node.write_bytes(b"")
    monkeypatch.setattr(npu.xrt, "DEVICE_NODE", str(node))
    monkeypatch.setattr(npu.xrt, "_device", None)
    cfg = real_config("0.4b", layers)
    bundle = write_random_bundle(cfg, tmp_path / "s2", per_record=True)
    times = dispatch_times(cfg)
    fake.dispatch_s.update(times)
    options = InferOptions.model_validate(
        {"backend": "npu", "sapiens2": {"enabled": True, "bundle": str(bundle)}}
    )
    stage = Infer("infer", options, run_context(tmp_path))
    window: list[float] = []

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
            if not window and done >= 2 or window and time.perf_counter() - window[0] >= seconds:
                window.append(time.perf_counter())
            await asyncio.sleep(0.1)

    class Out:
        async def send(self, item):
            pass

    asyncio.run(asyncio.wait_for(stage.run(source(), Out()), timeout=seconds + 600))
    start, end = window
    spans = [(b, e) for _, b, e in fake.timeline]
    return {
        "busy": union_s(spans, start, end) / (end - start),
        "box_device_s": box_device_s(cfg, times),
        "published": stage.published["sapiens2"],
        "errors": stage.errors["sapiens2"],
        "drops": Counter(stage.scheduler.stats.drops_by_reason()),
    }


@pytest.mark.slow  # a busy fraction on the wall clock: never in the default run
def test_queued_boxes_keep_the_device_busier_interleaved_than_one_at_a_time_at_two_layers(
    tmp_path, monkeypatch
):
    # 2 layers of the real widths and the real head: 0.56 s of device time a box against
    # ~0.45 s of host glue (the whole model: 2.7 s against ~0.8 s), so the head's host steps
    # often outlast what the other passes have queued. Two runs back to back, sharing the
    # host's load: the control runs the passes one at a time (DeviceThread interleave=1),
    # then the default three (npu.device.INTERLEAVE). Measured on 2 shared cores: 0.60
    # against 0.79-0.80 (1.32x; two interleaved 0.74-0.77); the bound, 1.12x, fails when
    # the passes stop overlapping. (A fixed busy >= 0.68 here failed CI at 0.514 on a
    # loaded host: the host, not the code.)
    class OneAtATime(DeviceThread):
        def __init__(self, name: str) -> None:
            super().__init__(name, interleave=1)

    (tmp_path / "one").mkdir()
    (tmp_path / "three").mkdir()
    with monkeypatch.context() as m:
        m.setattr(stages.infer, "DeviceThread", OneAtATime)
        control = device_busy(tmp_path / "one", monkeypatch, layers=2, seconds=8.0)
    got = device_busy(tmp_path / "three", monkeypatch, layers=2, seconds=8.0)
    print(f"device busy one pass at a time {control['busy']:.3f}, interleaved {got['busy']:.3f}")
    for run in (control, got):
        assert run["errors"] == 0 and run["published"] >= 10, run
    assert got["busy"] >= 1.12 * control["busy"], (control, got)


@pytest.mark.slow
def test_queued_boxes_keep_the_device_busy_for_a_minute_at_full_depth(tmp_path, monkeypatch):
    # measured 0.967 (2 shared cores, load average ~3); 0.90-0.91 before three passes in
    # flight, the heatmaps faulted in on the prepare thread and the patch rows compiled
    got = device_busy(tmp_path, monkeypatch, layers=None, seconds=60.0)
    print(f"device busy {got['busy']:.3f} over 60 s at full depth: {got}")  # for the record
    assert got["errors"] == 0 and got["published"] >= 20, got
    assert got["busy"] >= 0.95, got
