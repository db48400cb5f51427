"""A hung NPU dispatch in `npucam run` (a subprocess) on the npu backend, over the test fake
pyxrt (tests/npu/fake_pyxrt.py through tests/npu/pyxrt_shim on PYTHONPATH: `import pyxrt`
gets the fake, which blocks holding the GIL as the real bindings do, and whose hung runs and
their contexts block forever in wait() and in their destructors).

One camera -> one face job per frame -> infer (AdaFace, the synthetic bundle on `npu`, every
dispatch 2 ms of emulated device time) -> face_match -> publish. Once faces flow, a file
makes the next dispatch hang. Proven: that job fails past its dispatch's deadline (by the
stage's own account), is counted `device_timeout` on the
`stats` topic and in Prometheus, the next job completes (face results for later frames), and
SIGTERM exits 0 within 5 s with the hung run parked.
"""

from __future__ import annotations

import json
import re
import signal
import time
import urllib.request
from pathlib import Path

import zmq
from rel_helpers import NpucamRun

from npu.models import synthetic
from pipeline import wire

TESTS = Path(__file__).resolve().parents[1]
SHIM = TESTS / "npu" / "pyxrt_shim"
DISPATCH_S = 0.002


def config_text(endpoint: str, prom_port: int, bundle: Path) -> str:
    return f"""
        [pipeline]
        drain_timeout_s = 3.0
        [metrics]
        stats_interval_s = 0.1
        prometheus = "127.0.0.1:{prom_port}"
        [[cameras]]
        name = "c0"
        url = "synthetic:?width=160&height=120&fps=10"
        staleness_ms = 5000
        [[stages]]
        kind = "capture"
        to = ["faces"]
        [[stages]]
        name = "faces"
        kind = "fault_stages:FaceJobs"
        [[stages]]
        name = "infer"
        kind = "infer"
        backend = "npu"
        inbox = {{ size = 4, policy = "drop_oldest" }}
        adaface = {{ enabled = true, bundle = "{bundle}" }}
        [[stages]]
        kind = "face_match"
        [[stages]]
        kind = "publish"
        bind = "{endpoint}"
    """


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timeouts_of(header: dict) -> int:
    drops = header["stats"]["stages"].get("infer/adaface", {}).get("drops", {})
    return drops.get("c0", {}).get("device_timeout", 0)


def test_a_hung_dispatch_fails_its_job_the_next_completes_and_sigterm_exits(tmp_path, write_config):
    bundle = synthetic.bundle_path("adaface", tmp_path / "synthetic")
    node = tmp_path / "accel0"
    node.write_bytes(b"")
    hang = tmp_path / "hang"
    endpoint, prom = f"tcp://127.0.0.1:{free_port()}", free_port()
    settings = {"device_node": str(node), "default_dispatch_s": DISPATCH_S, "hang_file": str(hang)}
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    run = NpucamRun(
        write_config(config_text(endpoint, prom, bundle)),
        env={
            "PYTHONPATH": f"{SHIM}:{TESTS / 'reliability'}",
            "NPUCAM_FAKE_PYXRT": json.dumps(settings),
            "OMP_NUM_THREADS": "1",
        },
    )
    seen: list[tuple[int, str, dict]] = []

    def receive_until(predicate, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < end, f"timed out waiting for {what}"
            assert run.proc.poll() is None, run.wait(1)[1][-3000:]
            if sub.poll(50):
                m = wire.decode(sub.recv_multipart())
                seen.append((time.time_ns(), m.topic, m.header))

    def faces_after(t_ns: int) -> int:
        return sum(1 for _, topic, h in seen if topic == "face/c0" and h["capture_ts"] > t_ns)

    try:
        receive_until(lambda: faces_after(0) >= 3, 90, "first face results")
        hang.touch()
        receive_until(lambda: (hang.parent / "hang.started").exists(), 10, "the hung start")
        hung_ns = int((hang.parent / "hang.started").read_text())
        receive_until(
            lambda: any(t == "stats" and timeouts_of(h) >= 1 for _, t, h in seen),
            10,
            "the device_timeout drop on stats",
        )
        reported_ns = next(r for r, t, h in seen if t == "stats" and timeouts_of(h) >= 1)
        reported_s = (reported_ns - hung_ns) / 1e9
        receive_until(lambda: faces_after(reported_ns) >= 2, 10, "results after the hang")
        scrape = urllib.request.urlopen(f"http://127.0.0.1:{prom}/metrics", timeout=5).read()
        t_term = time.monotonic()
        run.signal(signal.SIGTERM)
        code, err = run.wait(timeout=10)
        exit_s = time.monotonic() - t_term
    finally:
        run.kill()
        sub.close(0)
        ctx.term()
    print(
        f"\nHANG reported on stats {reported_s:.3f} s after the hung start; "
        f"SIGTERM -> exit {exit_s:.3f} s"
    )
    assert code == 0, err[-3000:]
    # wall-clock-ok: the documented SIGTERM bound (docs/reliability.md), the drain's own timer
    assert exit_s < 5.0
    # the stage's own account: given up at the deadline of a ~2 ms dispatch (~0.2 s)
    given_up = re.search(
        r"not done ([0-9.]+) s after it began, past its deadline of ([0-9.]+) s", err
    )
    assert given_up, err[-3000:]
    waited, deadline = map(float, given_up.groups())
    # the stage's own account against the deadline rule: never before it. How soon after it
    # is this host's speed (0.36 s for a 0.15 s deadline once under make test-loaded); the
    # device-level "at the deadline" check is tests/npu/test_xrt.py's
    # test_a_hung_dispatch_times_out_parks_its_context_and_the_kernel_is_reloaded.
    # wall-clock-ok: a lower bound, and a hang guard (5 s: without a deadline the dispatch
    # would hang forever)
    assert deadline < 0.3 and deadline <= waited < deadline + 5.0
    # wall-clock-ok: a lower bound: the drop was not reported before the run's deadline (how
    # soon after it is the stats interval and this host's speed; the wait above is the guard)
    assert reported_s >= deadline
    assert (
        'npucam_drops_total{camera="c0",reason="device_timeout",stage="infer/adaface"} 1.0'
        in scrape.decode()
    )
    assert "XRT teardown skipped" in err
    assert "Traceback" not in err
