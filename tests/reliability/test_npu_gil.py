"""The capture -> detect -> publish path of one camera keeps its rate and latency while the
NPU is busy with Sapiens2, AdaFace and CLIP on the npu backend, over the test fake pyxrt
(tests/npu/fake_pyxrt.py through tests/npu/pyxrt_shim: every wait()/start()/sync() holds
the GIL as the real bindings do, wait() for the whole emulated dispatch).

`npucam run` (a subprocess, one BLAS thread as the other subprocess tests): camera `det`
(the bikes sample, looping at its 25 fps) -> detect (BlazePose + BlazeFace) -> publish;
beside it camera `busy` -> a pose, a face and a CLIP job per frame -> infer (backend npu,
the synthetic bundles of npu/models/*/synthetic.py, NPU2-like emulated dispatch times; more
work than the device can do). A file switches the jobs off and on in alternating phases, so
the det numbers with the models idle and with them busy come from one run and share the
host's load drift (its 2 cores serve other work too). Proven, from the det messages a
subscriber gets (lag = publish_ts - capture_ts): over the busy phases the det rate is >= 90%
of the idle phases' and the p95 lag within 1/0.9 of theirs (the minute-long test; the
15 s one allows 25 ms over it), with the emulated device busy (and idle in the idle phases).
A wait that holds the GIL (`run.wait()`, npucam's before issue 14) fails: 0.54-0.91x the
rate, 1.6-3.9x the p95 lag (docs/inference.md, "Device waits"). Both tests are `slow` (`make
test-slow`): a rate and a latency on the wall clock are never in the default run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq
from rel_helpers import percentile

from npu.models import synthetic
from pipeline import wire

TESTS = Path(__file__).resolve().parents[1]
SHIM = TESTS / "npu" / "pyxrt_shim"
# NPU2-like dispatch times (emulated device seconds, by xclbin path; the first match wins),
# from upstream's published totals over their dispatch counts: Sapiens2-0.4b's attention
# ~0.8 s over 24 layers, its GEMMs ~1 ms (2.4 s a box over ~2,100 dispatches); AdaFace
# IR-101 ~0.5 s a face over ~100 convs; CLIP ViT-H ~1.3 s a pass over ~220 dispatches.
DISPATCH_S = {"/mha.xclbin": 0.033, "adaface-": 0.005, "clip-": 0.006}
DEFAULT_S = 0.001  # Sapiens2's GEMMs
# Sapiens2 gets 3x the device time of each other model with work, as in configs/demo.toml
EXTRA = {"sapiens2": "share = 3.0", "clip": 'labels = ["a person", "a bicycle", "a car"]'}
SETTLE_S = 0.7  # after a switch: the queued jobs expire and the pass in progress ends


def config_text(endpoint: str, models: dict[str, Path], active: Path) -> str:
    tables = "".join(
        f"""
        [stages.{name}]
        enabled = true
        bundle = "{path}"
        {EXTRA.get(name, "")}
        """
        for name, path in models.items()
    )
    return f"""
        [pipeline]
        drain_timeout_s = 3.0
        [metrics]
        stats_interval_s = 0
        [[cameras]]
        name = "det"
        url = "sample:bikes.mp4"
        loop = true
        staleness_ms = 5000
        [[cameras]]
        name = "busy"
        url = "synthetic:?width=320&height=240&fps=5"
        staleness_ms = 500
        [[stages]]
        name = "capture-det"
        kind = "capture"
        cameras = ["det"]
        to = ["detect"]
        [[stages]]
        kind = "detect"
        cameras = ["det"]
        pose = false
        faces = false
        to = ["publish"]
        inbox = {{ size = 2, policy = "latest" }}
        [[stages]]
        kind = "publish"
        bind = "{endpoint}"
        wait_for_subscribers = 1
        to = []
        [[stages]]
        name = "capture-busy"
        kind = "capture"
        cameras = ["busy"]
        to = ["jobs"]
        [[stages]]
        name = "jobs"
        kind = "fault_stages:ModelJobs"
        active_file = "{active}"
        to = ["infer"]
        [[stages]]
        name = "results"
        kind = "fault_stages:Timed"
        to = []
        [[stages]]
        name = "infer"
        kind = "infer"
        backend = "npu"
        to = ["results"]
        inbox = {{ size = 6, policy = "drop_oldest" }}
        {tables}
    """


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def det_numbers(dets: list[dict], windows: list[tuple[int, int]]) -> dict:
    """Rate (det messages of frames captured in the windows, per second) and p95 lag, ms."""
    lags = [
        (h["publish_ts"] - h["capture_ts"]) / 1e6
        for h in dets
        if any(t0 <= h["capture_ts"] < t1 for t0, t1 in windows)
    ]
    seconds = sum(t1 - t0 for t0, t1 in windows) / 1e9
    return {"rate": len(lags) / seconds, "p95_ms": percentile(lags, 0.95), "n": len(lags)}


def run(tmp_path, write_config, cycles: int, phase_s: float, lag_slack_ms: float) -> None:
    cache = tmp_path / "synthetic"
    models = {m: synthetic.bundle_path(m, cache) for m in ("sapiens2", "adaface", "clip")}
    node, active, timeline = tmp_path / "accel0", tmp_path / "active", tmp_path / "timeline"
    node.write_bytes(b"")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    settings = {
        "device_node": str(node),
        "dispatch_s": DISPATCH_S,
        "default_dispatch_s": DEFAULT_S,
        "timeline_file": str(timeline),
    }
    env = {
        **os.environ,
        "PYTHONPATH": f"{SHIM}:{TESTS / 'reliability'}",
        "NPUCAM_FAKE_PYXRT": json.dumps(settings),
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
    }
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"det/det")
    sub.connect(endpoint)
    log = (tmp_path / "stderr").open("w")
    config = write_config(config_text(endpoint, models, active))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "run", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env=env,
        start_new_session=True,
    )
    dets: list[dict] = []
    windows: dict[bool, list[tuple[int, int]]] = {False: [], True: []}
    spans: dict[bool, list[tuple[float, float]]] = {False: [], True: []}

    def receive_for(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            assert proc.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
            if sub.poll(20):
                dets.append(wire.decode(sub.recv_multipart()).header)

    try:
        active.touch()  # warm-up with the jobs on: every model loaded and passing
        receive_for(0)
        end = time.monotonic() + 120
        while len(dets) < 10 or not timeline_started(tmp_path):
            assert time.monotonic() < end, "no warm-up"
            receive_for(0.1)
        receive_for(3.0)
        for _ in range(cycles):
            for on in (False, True):
                if on:
                    active.touch()
                else:
                    active.unlink(missing_ok=True)
                receive_for(SETTLE_S)
                t0, p0 = time.time_ns(), time.perf_counter()
                receive_for(phase_s)
                windows[on].append((t0, time.time_ns()))
                spans[on].append((p0, time.perf_counter()))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, (tmp_path / "stderr").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        sub.close(0)
        ctx.term()
    emulated = json.loads(timeline.read_text())

    def device(on: bool) -> float:
        """Emulated device seconds within the phases' windows, over their length."""
        windows = spans[on]
        busy = sum(max(0.0, min(e, t1) - max(b, t0)) for t0, t1 in windows for _, b, e in emulated)
        return busy / sum(t1 - t0 for t0, t1 in windows)

    idle, busy = det_numbers(dets, windows[False]), det_numbers(dets, windows[True])
    cycles_p95 = [
        (round(det_numbers(dets, [a])["p95_ms"]), round(det_numbers(dets, [b])["p95_ms"]))
        for a, b in zip(windows[False], windows[True], strict=True)
    ]
    print(
        f"\nDET models idle ({device(False):.0%} of the emulated device): {idle['rate']:.1f}/s, "
        f"p95 lag {idle['p95_ms']:.1f} ms; busy ({device(True):.0%}): {busy['rate']:.1f}/s "
        f"({busy['rate'] / idle['rate']:.2f}x), p95 lag {busy['p95_ms']:.1f} ms "
        f"({busy['p95_ms'] / idle['p95_ms']:.2f}x); p95 ms (idle, busy) per cycle {cycles_p95}"
    )
    assert device(True) >= 0.4 and device(False) < 0.05  # busy, then idle
    # wall-clock-ok: a rate and a latency against the idle phases of the same run; only the
    # slow tests call run()
    assert busy["rate"] >= 0.9 * idle["rate"], (idle, busy)
    # wall-clock-ok: as above
    assert busy["p95_ms"] <= idle["p95_ms"] / 0.9 + lag_slack_ms, (idle, busy)


def timeline_started(tmp_path: Path) -> bool:
    """The infer stage has loaded its models (its log line for the last one is written)."""
    return "clip on npu" in (tmp_path / "stderr").read_text()


@pytest.mark.slow  # a rate and a latency on the wall clock: never in the default run
def test_det_keeps_its_rate_and_lag_while_the_npu_is_busy(tmp_path, write_config):
    # 15 s in 1.5 s phases of ~40 messages: one late message moves a phase's p95, so the
    # default run allows 25 ms over the bound (a GIL-holding wait adds far more)
    run(tmp_path, write_config, cycles=5, phase_s=1.5, lag_slack_ms=25.0)


@pytest.mark.slow
def test_det_keeps_its_rate_and_lag_while_the_npu_is_busy_for_a_minute(tmp_path, write_config):
    # the bound as it is: on an otherwise idle 2-core host busy / idle p95 was 1.04x
    # and 1.07x with the NPU stage's threads lowered (npu/thread_priority.py), 1.13-1.22x
    # without; other sessions' load on the same cores swings one phase's p95 by 20-200 ms
    run(tmp_path, write_config, cycles=12, phase_s=2.5, lag_slack_ms=0.0)
