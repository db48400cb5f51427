"""Device faults on the simulated NPU (npu.sim.SimFaults), in a running pipeline:
two synthetic cameras -> face jobs -> infer (backend sim, synthetic AdaFace) -> a sink.

Injected one after the other while frames keep flowing: a kernel that ends in ERROR, a
dispatch that hangs (caught by its wait's deadline: a `device_timeout` drop, its context
parked and the kernel reloaded; the parked context is given back once the emulated driver's
job timeout ends the hung run), and hardware-context creation failing as CREATE_HWCTX does
(the machine-wide context limit is 4, AdaFace needs 9: contexts are evicted and re-created
all the time). Proven for each: the affected jobs fail and are reported (per-model drops in
the metrics / `stats`, the stage's last_error names the fault), the stage recovers once the
fault clears (results for both cameras again; the time is measured), no deadlock (the
pipeline stops within its drain timeout with nothing abandoned), and no stuck context (the
machine-wide context registry never holds more than the cap and is empty after the run).
All device behaviour here is simulated; no NPU is involved.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest
from engine_stages import start

from npu.sim import ContextRegistry
from pipeline.messages import now_ns

CTX_CAP = 4
# Stopping drains the infer stage's backlog (its inbox and model queue, ~20 faces) at about a
# face a second here (9 contexts cycling through 4 slots); a deadlock instead waits out the
# drain timeout and is cancelled. The timeout leaves that drain room on a loaded 2-core host.
DRAIN_TIMEOUT_S = 15.0
CAMERAS = ("c0", "c1")
FAULT_STAGES = str(Path(__file__).parent)


@pytest.fixture(scope="module")
def synthetic_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("synthetic")


def config_text(cache: Path, registry: Path) -> str:
    cams = "".join(
        f"""
        [[cameras]]
        name = "{c}"
        url = "synthetic:?width=160&height=120&fps=8"
        staleness_ms = 5000
        """
        for c in CAMERAS
    )
    return f"""
        [pipeline]
        drain_timeout_s = {DRAIN_TIMEOUT_S}
        {cams}
        [[stages]]
        kind = "capture"
        [[stages]]
        name = "faces"
        kind = "fault_stages:FaceJobs"
        [[stages]]
        name = "infer"
        kind = "infer"
        backend = "sim"
        synthetic_cache = "{cache}"
        inbox = {{ size = 8, policy = "drop_oldest" }}
        adaface = {{ enabled = true, synthetic = true }}
        [stages.sim]
        pacing = "stand-in"
        registry_dir = "{registry}"
        dispatch_s = 0.001
        ctx_create_s = 0.002
        hwctx_limit = {CTX_CAP}
        [[stages]]
        name = "sink"
        kind = "fault_stages:Timed"
    """


def test_kernel_error_hang_and_context_failures_fail_jobs_then_the_stage_recovers(
    write_config, synthetic_cache, tmp_path, monkeypatch
):
    import sys

    monkeypatch.setattr(sys, "path", [FAULT_STAGES, *sys.path])
    registry_dir = tmp_path / "hwctx"
    path = write_config(config_text(synthetic_cache, registry_dir))
    registry = ContextRegistry(registry_dir)
    held_max = 0

    async def main():
        nonlocal held_max
        pipeline, task = await start(path)
        infer = pipeline.stages["infer"]
        sink = pipeline.stages["sink"]

        def results_after(t_ns: int) -> set[str]:
            return {item.job.camera for _, item in sink.items if item.job.capture_ts_ns > t_ns}

        async def wait(predicate, timeout: float, what: str) -> float:
            nonlocal held_max
            end = time.monotonic() + timeout
            while not predicate():
                held_max = max(held_max, len(registry.held()))
                assert time.monotonic() < end, f"timed out waiting for {what}"
                assert not task.done(), "the pipeline ended"
                await asyncio.sleep(0.01)
            return time.monotonic()

        measured = {}
        try:
            await wait(lambda: results_after(0) == set(CAMERAS), 60, "first results")
            dev = infer.device
            kernels = set(dev.sim.kernels)
            assert kernels

            def set_error():
                dev.faults.error_kernels = kernels

            def clear_error():
                dev.faults.error_kernels = set()

            def set_hang():
                dev.faults.watchdog_s = 1.0  # the driver's job timeout: the parked slot returns
                dev.faults.hang_next = 1  # one dispatch: a hang every time would fail the device

            def clear_hang():
                dev.faults.hang_next = 0

            def set_ctx():
                dev.faults.context_failures = 10**9

            def clear_ctx():
                dev.faults.context_failures = 0

            faults = {
                "kernel error": (set_error, clear_error),
                "hung dispatch": (set_hang, clear_hang),
                "context creation": (set_ctx, clear_ctx),
            }
            for name, (inject, clear) in faults.items():
                errors = infer.errors["adaface"]
                t_inject = time.monotonic()
                inject()
                t_reported = await wait(
                    lambda e=errors: infer.errors["adaface"] > e, 30, f"{name} reported"
                )
                last_error = infer.last_error["adaface"]
                await asyncio.sleep(0.3)  # more jobs fail while the fault stays
                clear()
                t_clear, t_clear_ns = time.monotonic(), now_ns()
                t_back = await wait(
                    lambda t=t_clear_ns: results_after(t) == set(CAMERAS), 30, f"{name} recovery"
                )
                measured[name] = (t_reported - t_inject, t_back - t_clear, last_error)
            snapshot = pipeline.metrics.snapshot()
            stats = infer.stats()
            parked_at_end = dev.parked_contexts
        finally:
            t_stop = time.monotonic()
            pipeline.stop()
            code = await asyncio.wait_for(task, 30)
            stop_s = time.monotonic() - t_stop
        return code, pipeline, measured, snapshot, stats, stop_s, parked_at_end

    code, pipeline, measured, snapshot, stats, stop_s, parked_at_end = asyncio.run(main())
    print()
    for name, (reported, recovered, last_error) in measured.items():
        print(
            f"DEVICE {name}: reported after {reported:.3f} s, results again "
            f"{recovered:.3f} s after it cleared ({last_error[:90]})"
        )
    print(f"DEVICE stop after the faults: {stop_s:.3f} s; contexts held at most {held_max}")
    assert code == 0 and pipeline.abandoned == []
    # wall-clock-ok: a hang guard: past the drain timeout the runner cancels (abandoned above)
    assert stop_s < DRAIN_TIMEOUT_S  # no deadlock: inside the drain timeout, nothing cancelled
    for name, (_, _, last_error) in measured.items():
        text = {"kernel error": "state 5", "hung dispatch": "past its deadline"}.get(
            name, "CREATE_HWCTX"
        )
        assert text in last_error, (name, last_error)
        # results came back after the fault cleared (`wait` above, a hang guard); how soon is
        # this host's speed (5.4 s once under make test-loaded): printed for docs/reliability.md
    # The hung dispatch was given up past its deadline (~0.2 s for these ~ms dispatches).
    given_up = re.search(
        r"not done ([0-9.]+) s after it began, past its deadline of ([0-9.]+) s",
        measured["hung dispatch"][2],
    )
    assert given_up, measured["hung dispatch"]
    waited, deadline = map(float, given_up.groups())
    # The stage's own account (its message) against the deadline rule (npu/device.py,
    # WaitPolicy): at least the 0.2 s margin, and never given up before it. How soon after is
    # this host's speed (the "at the deadline" check on the fake's clock: tests/npu/test_xrt.py).
    # wall-clock-ok: a lower bound, and a hang guard (5 s: without a deadline it hangs forever)
    assert deadline >= 0.2 and deadline <= waited < deadline + 5.0
    drops = snapshot["stages"]["infer/adaface"]["drops"]
    timeouts = sum(drops[c].get("device_timeout", 0) for c in CAMERAS if c in drops)
    assert timeouts == stats["runtimes"]["adaface"]["device_timeouts"] == 1
    # each fault failed a job at least (the waits for "reported" above), every failure counted
    assert (
        sum(drops[c].get("error", 0) for c in CAMERAS if c in drops) + timeouts
        == stats["runtimes"]["adaface"]["errors"]
        >= len(measured)
    )
    assert stats["device"]["failed"] is None
    assert parked_at_end == 0  # the hung run ended at the job timeout and its slot was reaped
    assert stats["runtimes"]["adaface"]["published"] > 0
    # No stuck context: never above the cap, and all given back once the stage stopped.
    assert 1 <= held_max <= CTX_CAP
    assert registry.held() == []
