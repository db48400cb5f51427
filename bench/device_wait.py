"""How a device wait affects the other threads of the process: npucam's waits (npu/xrt.py,
paced run.state() polls; one dispatch at a time and two in flight with run_all) against
pyxrt's blocking run.wait(), on the test fake pyxrt (tests/npu/fake_pyxrt.py), which holds
the GIL in wait() as the real bindings do.

A "pipeline" thread runs a job every 5 ms (small numpy ops and a dict loop, ~2 ms alone);
a tick whose job could not start before the next one is skipped, as a camera's latest frame.
The device thread runs back-to-back dispatches of D ms. Printed per strategy and D: the
pipeline's rate and p95 lag (job end - tick) as ratios of its own run with no device (same
process, just before), the device's busy fraction (emulated device time / wall) and the
device thread's CPU. docs/inference.md ("Device waits") records a run.

    .venv/bin/python bench/device_wait.py [--seconds 3] [--dispatch-ms 1 5 20]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("fake_pyxrt", ROOT / "tests/npu/fake_pyxrt.py")
fake = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake)
sys.modules["pyxrt"] = fake

from npu import xrt  # noqa: E402
from npu.device import KernelSpec  # noqa: E402

TICK_S = 0.005


def job(img: np.ndarray) -> None:
    """~2 ms of mixed numpy and Python work, like a detector's glue."""
    acc = {}
    for i in range(117):
        x = img[i % 96] * 1.5 + 0.25
        acc[i % 7] = float(x.max()) + acc.get(i % 7, 0.0)


def pipeline(stop: threading.Event, out: list[tuple[float, float]]) -> None:
    img = np.random.default_rng(0).random((96, 128), np.float32)
    t0 = time.perf_counter()
    k = 0
    while not stop.is_set():
        tick = t0 + k * TICK_S
        now = time.perf_counter()
        if now < tick:
            time.sleep(tick - now)
        elif now > tick + TICK_S:  # missed: skip to the latest tick
            k = int((now - t0) / TICK_S)
            continue
        job(img)
        out.append((tick, time.perf_counter()))
        k += 1


def measure(seconds: float, device: threading.Thread | None, stop: threading.Event) -> dict:
    jobs: list[tuple[float, float]] = []
    p = threading.Thread(target=pipeline, args=(stop, jobs))
    p.start()
    if device is not None:
        device.start()
    time.sleep(seconds)
    stop.set()
    p.join()
    if device is not None:
        device.join()
    lags = sorted(e - t for t, e in jobs)
    return {"rate": len(jobs) / seconds, "p95": lags[int(0.95 * (len(lags) - 1))]}


def run_device(strategy: str, dispatch_s: float, stop: threading.Event, stats: dict) -> None:
    node = Path(tempfile.mkdtemp()) / "accel0"
    node.write_bytes(b"")
    fake.reset()
    fake.default_dispatch_s = dispatch_s
    dev = xrt.XrtDevice(str(node))
    insts = np.arange(1, 9, dtype=np.uint32).tobytes()
    k = dev.load(KernelSpec("g", "gemm", Path("/b/gemm.xclbin"), "MLIR_AIE", insts))
    bufs = [[dev.alloc(64)] for _ in range(8)]
    for _ in range(4):
        dev.run(k, bufs[0])  # measured: waits are paced from here on
    first = len(fake.timeline)
    c0, t0 = time.thread_time(), time.perf_counter()
    while not stop.is_set():
        if strategy == "run.wait()":
            r = fake.run(k.xk)
            for i, v in enumerate((3, k.insts_bo, len(insts), bufs[0][0].bo)):
                r.set_arg(i, v)
            r.start()
            r.wait()
        elif strategy == "npucam wait":
            dev.run(k, bufs[0])
        else:
            dev.run_all([(k, b) for b in bufs], depth=2)
    wall = time.perf_counter() - t0
    emulated = sum(e - b for _, b, e in fake.timeline[first:])
    stats.update(busy=emulated / wall, cpu=(time.thread_time() - c0) / wall)
    dev.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--dispatch-ms", type=float, nargs="+", default=[1.0, 5.0, 20.0])
    args = ap.parse_args()
    print(
        "| dispatch | strategy | pipeline rate (x alone) | p95 lag ms (x alone) | device busy "
        "| device-thread CPU |"
    )
    print("|---|---|---|---|---|---|")
    for ms in args.dispatch_ms:
        for strategy in ("run.wait()", "npucam wait", "npucam run_all(depth=2)"):
            alone = measure(args.seconds, None, threading.Event())
            stop, stats = threading.Event(), {}
            dev = threading.Thread(target=run_device, args=(strategy, ms / 1000, stop, stats))
            busy = measure(args.seconds, dev, stop)
            print(
                f"| {ms:g} ms | {strategy} | {busy['rate']:.0f}/s "
                f"({busy['rate'] / alone['rate']:.2f}) | {busy['p95'] * 1e3:.2f} "
                f"({busy['p95'] / alone['p95']:.1f}) | {stats['busy']:.3f} | {stats['cpu']:.1%} |"
            )


if __name__ == "__main__":
    main()
