"""npu/xrt.py against a recording fake pyxrt: the call sequence of docs/device.md."""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from npu import xrt
from npu.device import (
    DeviceError,
    DeviceFailed,
    DeviceInterrupted,
    DeviceTimeout,
    KernelSpec,
    ctx_cache_cap,
)

_spec = importlib.util.spec_from_file_location(
    "fake_pyxrt", Path(__file__).with_name("fake_pyxrt.py")
)
fake = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake)

TO, FROM = "XCL_BO_SYNC_BO_TO_DEVICE", "XCL_BO_SYNC_BO_FROM_DEVICE"


@pytest.fixture
def node(tmp_path):
    p = tmp_path / "accel0"
    p.write_bytes(b"")
    return str(p)


@pytest.fixture
def dev(monkeypatch, node):
    fake.reset()
    monkeypatch.setitem(sys.modules, "pyxrt", fake)
    monkeypatch.delenv("TACONITE_CTX_CACHE", raising=False)
    monkeypatch.delenv("TACONITE_TIMING", raising=False)
    d = xrt.XrtDevice(node)
    yield d
    d.close()


def spec(key="g0", xclbin="/b/kernels/gemm.xclbin", words=8, name="MLIR_AIE") -> KernelSpec:
    insts = np.arange(1, words + 1, dtype=np.uint32).tobytes()
    return KernelSpec(key=key, kind="gemm", xclbin=Path(xclbin), kernel_name=name, insts=insts)


def test_missing_pyxrt_and_device_node_are_named_in_one_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pyxrt", None)
    with pytest.raises(DeviceError) as err:
        xrt.XrtDevice(str(tmp_path / "no-accel0"))
    msg = str(err.value)
    assert "pyxrt: not importable" in msg
    assert f"no {tmp_path / 'no-accel0'}" in msg


def test_missing_device_node_alone(monkeypatch, tmp_path):
    fake.reset()
    monkeypatch.setitem(sys.modules, "pyxrt", fake)
    with pytest.raises(DeviceError, match="npu backend is unavailable: device: no .*no-accel0"):
        xrt.XrtDevice(str(tmp_path / "no-accel0"))


def test_load_alloc_run_call_sequence(dev):
    k = dev.load(spec(words=6))
    a, c = dev.alloc(64), dev.alloc(32)
    assert (a.host == 0).all() and (c.host == 0).all()  # the fake fills 0xAB: zeroed by us
    a.write(np.arange(16, dtype=np.float32))
    dev.to_device(a)
    dev.run(k, [a, c])
    dev.from_device(c)
    seq = [x for x in fake.calls if x[0] != "bo.write"]
    ib, a_bo, c_bo = 100 + 1, None, None
    assert seq[:4] == [
        ("device", 0),
        ("xclbin", "/b/kernels/gemm.xclbin"),
        ("register_xclbin", "/b/kernels/gemm.xclbin"),
        ("hw_context", "/b/kernels/gemm.xclbin"),
    ]
    assert seq[4] == ("kernel", "/b/kernels/gemm.xclbin", "MLIR_AIE")
    # instruction BO: size in bytes, cacheable, the kernel's group_id(1) (the fake says 101)
    assert seq[5][:4] == ("bo", 24, fake.bo.cacheable, ib)
    insts_id = seq[5][4]
    assert seq[6] == ("sync", insts_id, TO)
    a_bo, c_bo = seq[7][4], seq[9][4]
    assert seq[7][:4] == ("bo", 64, fake.bo.host_only, 0)
    assert seq[8] == ("sync", a_bo, TO)
    assert seq[9][:4] == ("bo", 32, fake.bo.host_only, 0)
    assert seq[10] == ("sync", c_bo, TO)
    assert seq[11] == ("sync", a_bo, TO)
    run_id = seq[12][1]
    assert seq[12:] == [
        ("run", run_id, "MLIR_AIE"),
        ("set_arg", run_id, 0, "int", 3),
        ("set_arg", run_id, 1, "bo", insts_id),
        ("set_arg", run_id, 2, "int", 24),
        ("set_arg", run_id, 3, "bo", a_bo),
        ("set_arg", run_id, 4, "bo", c_bo),
        ("start", run_id),
        ("sync", c_bo, FROM),  # completion was read with state(), never run.wait()
    ]
    assert fake.state_calls >= 1
    # the instruction stream landed in the BO word for word
    assert bytes(k.insts_bo.map()) == k.spec.insts


def test_run_cache_per_argument_tuple(dev):
    k = dev.load(spec())
    a, b, c = dev.alloc(16), dev.alloc(16), dev.alloc(16)
    dev.run(k, [a, c])
    dev.run(k, [a, c])
    assert len(fake.of("run")) == 1 and len(fake.of("start")) == 2
    dev.run(k, [b, c])
    assert len(fake.of("run")) == 2
    dev.run(k, [a, c])
    assert len(fake.of("run")) == 2 and len(fake.of("start")) == 4


def test_same_tuple_in_flight_gets_a_one_off_run(dev):
    k = dev.load(spec())
    a, c = dev.alloc(16), dev.alloc(16)
    first = dev.start(k, [a, c])
    second = dev.start(k, [a, c])
    runs = [r[1] for r in fake.of("run")]
    assert len(runs) == 2
    first.wait()
    second.wait()
    dev.run(k, [a, c])
    assert len(fake.of("run")) == 2  # the cached (first) run restarted
    assert fake.of("start")[-1] == ("start", runs[0])


def test_freeing_a_buffer_drops_its_cached_runs(dev):
    k = dev.load(spec())
    root = dev.alloc(64)
    a, c = dev.sub(root, 0, 32), dev.alloc(16)
    dev.run(k, [a, c])
    dev.free(root)  # frees its sub-buffer a too
    assert k.runs == {}
    with pytest.raises(DeviceError, match="was freed"):
        dev.run(k, [a, c])
    a2 = dev.alloc(32)
    dev.run(k, [a2, c])
    assert len(fake.of("run")) == 2


def test_sub_of_a_sub_is_cut_from_the_root(dev):
    root = dev.alloc(256)
    s1 = dev.sub(root, 64, 128)
    s2 = dev.sub(s1, 32, 16)
    subs = fake.of("bo.sub")
    assert subs[0][1:4] == (root.bo.id, 128, 64)
    assert subs[1][1:4] == (root.bo.id, 16, 96)  # parent = root, offset re-based
    s2.host[:] = 7
    assert (root.host[96:112] == 7).all() and root.host[95] == 0 and root.host[112] == 0
    with pytest.raises(
        DeviceError, match=r"^sub-buffer \[120, \+16\) outside a buffer of 128 bytes$"
    ):
        dev.sub(s1, 120, 16)


def test_kernels_of_one_xclbin_and_name_share_a_context_freed_with_the_last(dev):
    k1, k2 = dev.load(spec("a")), dev.load(spec("b"))
    k3 = dev.load(spec("c", name="OTHER"))
    assert len(fake.of("hw_context")) == 2
    assert len(fake.of("bo")) == 3  # each kernel has its own instruction BO
    dev.free_kernel(k1)
    assert fake.of("hw_context.free") == []
    dev.free_kernel(k2)
    assert fake.of("hw_context.free") == [("hw_context.free", "/b/kernels/gemm.xclbin")]
    assert dev.resident_contexts() == [k3.spec.context_key]


def test_lru_cap_from_env_evicts_least_recent_and_reloads(monkeypatch, node):
    fake.reset()
    monkeypatch.setitem(sys.modules, "pyxrt", fake)
    monkeypatch.setenv("TACONITE_CTX_CACHE", "2")
    dev = xrt.XrtDevice(node)
    ks = [dev.load(spec(f"k{i}", f"/b/{i}.xclbin")) for i in range(3)]
    assert dev.stats.evict == 1 and dev.stats.loads == 3
    assert fake.of("hw_context.free") == [("hw_context.free", "/b/0.xclbin")]
    a = dev.alloc(16)
    dev.run(ks[2], [a])  # resident: a hit
    dev.run(ks[0], [a])  # evicted: reload, evicting k1's context
    assert fake.of("hw_context.free")[-1] == ("hw_context.free", "/b/1.xclbin")
    assert dev.stats.loads == 4 and dev.stats.evict == 2 and dev.stats.hits == 1
    assert fake.of("xclbin").count(("xclbin", "/b/0.xclbin")) == 1  # registered once
    dev.close()


def test_context_creation_failure_evicts_one_more_and_retries(dev):
    fake.limit = 2  # another process holds the other slots
    a = dev.load(spec("a", "/b/a.xclbin"))
    dev.load(spec("b", "/b/b.xclbin"))
    dev.load(spec("c", "/b/c.xclbin"))
    assert fake.of("hw_context.full") == [("hw_context.full", "/b/c.xclbin")]
    assert fake.of("hw_context.free") == [("hw_context.free", "/b/a.xclbin")]
    assert dev.stats.evict == 1 and len(fake.live_contexts) == 2
    assert a.xk is None and a.runs == {}


def test_context_creation_fails_after_emptying_the_cache(dev):
    dev.load(spec("a", "/b/a.xclbin"))
    fake.limit = 0
    dev.set_context_wait(2, 0.001)
    with pytest.raises(DeviceError, match=r"^load\(/b/b.xclbin MLIR_AIE\): .*CREATE_HWCTX") as e:
        dev.load(spec("b", "/b/b.xclbin"))
    # after giving up its own context it waited for others' 2 x 1 ms; XRT cannot say who
    assert fake.of("hw_context.full") == [("hw_context.full", "/b/b.xclbin")] * 4
    assert "(NPU2 has 16; which programs hold them is unknown)" in str(e.value)
    assert dev.resident_contexts() == [] and dev.stats.evict == 1


def test_other_load_errors_are_reported_without_evicting(dev):
    dev.load(spec("a", "/b/a.xclbin"))
    fake.fail_contexts = 1
    with pytest.raises(DeviceError, match=r"^load\(/b/b.xclbin MLIR_AIE\): xclbin is corrupt"):
        dev.load(spec("b", "/b/b.xclbin"))
    assert dev.stats.evict == 0 and len(dev.resident_contexts()) == 1


def test_patches_are_written_and_reapplied_after_a_reload(monkeypatch, node):
    fake.reset()
    monkeypatch.setitem(sys.modules, "pyxrt", fake)
    monkeypatch.setenv("TACONITE_CTX_CACHE", "1")
    dev = xrt.XrtDevice(node)
    k = dev.load(spec("mha", "/b/mha.xclbin", words=8))
    k.set_insts_words([(2, 0xDEAD), (7, 5)])
    words = np.frombuffer(k.insts_bo.map(), np.uint32)
    assert words[2] == 0xDEAD and words[7] == 5 and words[0] == 1
    assert fake.calls[-1] == ("sync", k.insts_bo.id, TO)
    with pytest.raises(DeviceError, match=r"^instruction word 8 is past the stream$"):
        k.set_insts_words([(8, 1)])
    dev.load(spec("other", "/b/other.xclbin"))  # evicts mha's context
    assert k.insts_bo is None
    a = dev.alloc(16)
    dev.run(k, [a])  # reload: fresh instruction BO, patches re-applied before the launch
    words = np.frombuffer(k.insts_bo.map(), np.uint32)
    assert list(words) == [1, 2, 0xDEAD, 4, 5, 6, 7, 5]
    dev.close()


def test_patch_refused_while_a_launch_is_in_flight(dev):
    k = dev.load(spec())
    a = dev.alloc(16)
    launch = dev.start(k, [a])
    with pytest.raises(DeviceError, match="in flight"):
        k.set_insts_words([(0, 1)])
    launch.wait()
    k.set_insts_words([(0, 1)])


def test_run_state_other_than_completed_is_an_error(dev):
    k = dev.load(spec())
    a = dev.alloc(16)
    fake.next_states.append(fake.ert_cmd_state.ERT_CMD_STATE_ERROR)
    with pytest.raises(DeviceError, match=r"^kernel finished in state 5$"):
        dev.run(k, [a])
    dev.run(k, [a])  # the device stays usable


@pytest.mark.parametrize(
    ("raw", "cap"),
    [
        (None, 16),
        ("4", 4),
        ("+3", 3),
        ("1", 1),
        ("0", 16),
        ("-2", 16),
        ("5x", 16),
        ("", 16),
        (" 4", 16),
        ("1_0", 16),
        ("64", 64),
    ],
)
def test_ctx_cache_cap_parses_like_rusts_usize(raw, cap):
    env = {} if raw is None else {"TACONITE_CTX_CACHE": raw}
    assert ctx_cache_cap(env) == cap


def test_timing_line_printed_on_close_when_env_present_even_empty(monkeypatch, node, capsys):
    fake.reset()
    monkeypatch.setitem(sys.modules, "pyxrt", fake)
    monkeypatch.setenv("TACONITE_TIMING", "")
    dev = xrt.XrtDevice(node)
    k = dev.load(spec())
    a = dev.alloc(16)
    dev.run(k, [a])
    dev.run(k, [a])
    assert dev.stats.kernels["g0"].runs == 2
    dev.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("[xrt] loads=1 hits=2 evict=0 runs=2  load=")
    assert err[0].endswith("s)") and " run=" in err[0] and "(wait=" in err[0]


def test_no_timing_line_without_env(dev, capsys):
    dev.close()
    assert capsys.readouterr().err == ""


def test_xrt_device_returns_one_device_per_process(monkeypatch, node):
    fake.reset()
    monkeypatch.setitem(sys.modules, "pyxrt", fake)
    d1 = xrt.xrt_device(node)
    assert xrt.xrt_device(node) is d1
    d1.close()
    d2 = xrt.xrt_device(node)
    assert d2 is not d1 and len(fake.of("device")) == 2
    d2.close()


def test_device_command_names_each_missing_backend_and_why(monkeypatch, tmp_path, node, capsys):
    import argparse

    from npu.commands.device import backends, register

    monkeypatch.setenv("NPUCAM_SIM_HWCTX_DIR", str(tmp_path / "hwctx"))
    monkeypatch.setitem(sys.modules, "pyxrt", None)
    rows = {r["backend"]: r for r in backends(str(tmp_path / "no-accel0"))}
    assert rows["npu"]["available"] is False
    assert "pyxrt: not importable" in rows["npu"]["detail"]
    assert "no-accel0" in rows["npu"]["detail"]
    assert rows["sim"]["available"] and rows["cpu"]["available"]
    monkeypatch.setitem(sys.modules, "pyxrt", fake)
    rows = {r["backend"]: r for r in backends(node)}
    assert rows["npu"]["available"] is True
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["device", "--device-node", str(tmp_path / "no-accel0")])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("npu  missing    device: no ")
    assert "sim  available" in out


def test_a_bad_xclbin_fails_its_load_without_evicting_anything(dev):
    dev.load(spec("a", "/b/a.xclbin"))
    bad = KernelSpec("g", "gemm", Path("/b/corrupt.xclbin"), "MLIR_AIE", b"\0" * 8, {}, "m:4")
    with pytest.raises(DeviceError, match=r"^m:4: xclbin /b/corrupt.xclbin: .*not a valid xclbin"):
        dev.load(bad)
    assert dev.stats.evict == 0 and len(dev.resident_contexts()) == 1


def test_evicting_a_context_waits_for_its_launches_in_flight(monkeypatch, node):
    fake.reset()
    fake.dispatch_s["/b/a"] = 0.05
    monkeypatch.setitem(sys.modules, "pyxrt", fake)
    monkeypatch.setenv("TACONITE_CTX_CACHE", "1")
    dev = xrt.XrtDevice(node)
    k0 = dev.load(spec("a", "/b/a.xclbin"))
    launch = dev.start(k0, [dev.alloc(16)])
    dev.load(spec("b", "/b/b.xclbin"))  # evicts a's context with the launch still running
    # wall-clock-ok: the order of two reads of one clock (now, the fake run's end), no bound
    assert time.perf_counter() >= fake.timeline[-1][2]  # freed only after the run ended
    assert ("hw_context.free", "/b/a.xclbin") in fake.calls
    assert launch.wait() >= 0.05  # the state was collected at eviction
    assert fake.of("wait") == []
    dev.close()


# -- waits, deadlines and hung dispatches (docs/inference.md, "Device waits") ----------------


@pytest.fixture
def frozen_guard():
    """A test whose code under test regresses to a GIL-holding block (run.wait() on a hung
    run, a parked object's destructor) freezes the interpreter: faulthandler's C watchdog
    then dumps every thread and exits, so the run fails instead of hanging."""
    import faulthandler

    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


class GapMeter:
    """A thread that spins on the clock and keeps the longest time it could not run."""

    def __init__(self) -> None:
        self.gap = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        last = time.perf_counter()
        while not self._stop.is_set():
            now = time.perf_counter()
            self.gap = max(self.gap, now - last)
            last = now

    def __enter__(self) -> GapMeter:
        self._thread.start()
        time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def warmed(dev, k, bufs, n=4):
    """Run k n times so that its expected time is measured (xrt.WARM_SAMPLES)."""
    for _ in range(n):
        dev.run(k, bufs)
    assert k.timing.samples >= xrt.WARM_SAMPLES


def test_a_wait_lets_other_threads_run_where_run_wait_stops_them(dev):
    fake.dispatch_s["/b/"] = 0.3
    k = dev.load(spec())
    a = dev.alloc(16)
    with GapMeter() as ours:
        assert dev.run(k, [a]) >= 0.3
    r = fake.run(k.xk)
    with GapMeter() as theirs:  # started inside: a loaded host may start the meter late
        r.start()
        r.wait()  # the binding's wait: one C call holding the GIL for the whole dispatch
    print(
        f"\nlongest stall of another thread: npucam's wait {ours.gap * 1e3:.1f} ms, "
        f"run.wait() {theirs.gap * 1e3:.1f} ms"
    )
    assert theirs.gap > 0.25  # the fake blocks as pyxrt does
    assert ours.gap < theirs.gap / 3
    assert fake.of("wait") == [("wait", r.id, 0)]  # only the test's own call


def test_waits_are_paced_by_the_measured_time_of_the_kernel(dev, monkeypatch):
    # when each state() poll came, from its run's start: the order of reads on one clock,
    # not a speed (poll counts were: a loaded host polls less often, paced or not)
    polled: list[tuple[int, float]] = []
    state = fake.run.state

    def timed_state(run):
        polled.append((run.t_start, time.perf_counter() - run.t_start))  # a run object restarts
        return state(run)

    monkeypatch.setattr(fake.run, "state", timed_state)
    fake.dispatch_s["/b/"] = 0.02
    k = dev.load(spec())
    a = dev.alloc(16)
    dev.run(k, [a])
    unpaced_first = min(t for _, t in polled)  # the first run is not paced: polled at once
    warmed(dev, k, [a])
    # the 20 ms, or more (a loaded host notices the end late), never less
    assert k.timing.expected_s >= 0.018
    expected = k.timing.expected_s
    polled.clear()
    for _ in range(5):
        dev.run(k, [a])
    firsts = {r: min(t for q, t in polled if q == r) for r, _ in polled}
    print(f"\nfirst state() poll of each paced 20 ms dispatch: {sorted(firsts.values())}")
    assert len(firsts) == 5  # every paced run is polled at its end (nothing else ends it)
    # paced: slept `pace` of the expected time before the first poll (a lower bound); each
    # run's expectation is its own (a running estimate), never under the 20 ms a run takes
    # wall-clock-ok: a lower bound: a loaded host only polls later
    assert all(t >= dev.waits.pace * 0.02 * 0.99 for t in firsts.values()), (expected, firsts)
    assert unpaced_first < min(firsts.values())  # the control: polled before any paced run
    launch = dev.start(k, [a])
    exp = launch.expected_s
    assert launch.deadline - launch.begin == pytest.approx(max(8 * exp, exp + 0.2))
    launch.wait()


def test_a_queued_run_reads_submitted_and_is_not_taken_for_done(dev):
    fake.dispatch_s["/b/"] = 0.05
    k = dev.load(spec())
    a, b = dev.alloc(16), dev.alloc(16)
    first, second = dev.start(k, [a]), dev.start(k, [b])
    assert int(second.run.state()) == fake.ert_cmd_state.ERT_CMD_STATE_SUBMITTED == 7
    assert int(first.run.state()) == 3 and first.run.state().name == "???"
    t0 = time.perf_counter()
    second.wait()
    # wall-clock-ok: a lower bound (two 50 ms runs): a loaded host only makes it longer
    assert time.perf_counter() - t0 >= 0.08  # behind the first one's 50 ms, then its own
    first.wait()


def test_run_all_keeps_the_next_dispatch_queued_so_the_device_never_idles(dev):
    fake.dispatch_s["/b/"] = 0.05
    k = dev.load(spec())
    chunks = [[dev.alloc(16)] for _ in range(6)]
    warmed(dev, k, chunks[0])

    def idle(depth: int) -> float:
        first = len(fake.timeline)
        dev.run_all([(k, c) for c in chunks], depth=depth)
        spans = [(b, e) for _, b, e in fake.timeline[first:]]
        return sum(max(0.0, b - e) for (_, e), (b, _) in zip(spans, spans[1:], strict=False))

    one, two = idle(1), idle(2)
    print(
        f"\ndevice idle between 6 dispatches of 50 ms: depth 1 {one * 1e3:.2f} ms, "
        f"depth 2 {two * 1e3:.2f} ms"
    )
    assert one > 0 and two < one / 3


def test_run_all_waits_for_what_it_started_when_one_fails(dev):
    k = dev.load(spec())
    bufs = [[dev.alloc(16)] for _ in range(3)]
    fake.next_states.append(fake.ert_cmd_state.ERT_CMD_STATE_ERROR)
    with pytest.raises(DeviceError, match=r"^kernel finished in state 5$"):
        dev.run_all([(k, b) for b in bufs], depth=2)
    assert k.pending == []
    k.set_insts_words([(0, 7)])  # nothing is left in flight


def test_a_hung_dispatch_times_out_parks_its_context_and_the_kernel_is_reloaded(dev, frozen_guard):
    fake.dispatch_s["/b/"] = 0.002
    k = dev.load(spec(words=8))
    other = dev.load(spec("o", "/c/other.xclbin"))
    k.set_insts_words([(3, 0xBEEF)])
    w, c = dev.alloc(64), dev.alloc(64)
    w.write(np.arange(64, dtype=np.uint8))
    dev.to_device(w)
    warmed(dev, k, [w, c])
    old_ctx, old_ib, old_w = k.xk.ctx, k.insts_bo, w.bo
    contexts = len(fake.of("hw_context"))
    fake.hang_next = 1
    launch = dev.start(k, [w, c])
    deadline = launch.deadline
    with pytest.raises(DeviceTimeout, match=r"dispatch of g0 not done .* context was parked"):
        launch.wait()
    late = time.perf_counter() - deadline
    span = deadline - launch.begin
    assert span == pytest.approx(dev.waits.deadline_after(launch.expected_s))
    # wall-clock-ok: given up at its deadline, not a deadline later: bounded by the run's own
    # deadline span (~0.2 s), which the 1 ms polls after the deadline cannot come near
    assert 0 <= late < span
    assert fake.of("wait") == [] and dev.stats.timeouts == 1 and dev.parked_contexts == 1
    # reloaded at once: a fresh context and instruction BO, its patch re-applied
    assert len(fake.of("hw_context")) == contexts + 1
    assert k.xk.ctx is not old_ctx and k.insts_bo is not old_ib
    assert np.frombuffer(k.insts_bo.map(), np.uint32)[3] == 0xBEEF
    # the buffers the hung run touched moved to fresh BOs with the same bytes
    assert w.bo is not old_w and (w.host == np.arange(64, dtype=np.uint8)).all()
    # nothing parked is destroyed: its context still holds its slot, nothing blocked
    gc.collect()
    assert old_ctx.id in fake.live_contexts
    assert not fake.of("hw_context.free_blocked") and not fake.of("run.free_blocked")
    dev.run(k, [w, c])  # the next job runs in the fresh context
    dev.run(other, [c])  # and other contexts were never touched
    dev.close()  # with a context parked: XRT teardown skipped, nothing blocks
    assert dev.closed and old_ctx.id in fake.live_contexts


def test_runs_queued_behind_a_hung_one_on_its_context_fail_with_it(dev, frozen_guard):
    fake.dispatch_s["/b/"] = 0.002
    k = dev.load(spec())
    bufs = [[dev.alloc(16)] for _ in range(2)]
    warmed(dev, k, bufs[0])
    fake.hang_next = 1
    first, second = dev.start(k, bufs[0]), dev.start(k, bufs[1])
    with pytest.raises(DeviceTimeout, match="not done"):
        first.wait()
    with pytest.raises(DeviceTimeout, match="queued on the context of a hung dispatch"):
        second.wait()
    assert dev.parked_contexts == 1 and k.pending == []
    dev.run(k, bufs[1])
    dev.close()


def test_a_kernel_that_hangs_again_after_its_reload_marks_the_device_failed(dev, frozen_guard):
    fake.dispatch_s["/b/"] = 0.002
    k = dev.load(spec())
    a = dev.alloc(16)
    warmed(dev, k, [a])
    fake.hang_next = 2
    with pytest.raises(DeviceTimeout) as first:
        dev.run(k, [a])
    assert not isinstance(first.value, DeviceFailed) and dev.failed is None
    with pytest.raises(DeviceFailed, match="marked failed: g0 hung again after its context"):
        dev.run(k, [a])
    calls = sum(fake.counts.values())
    with pytest.raises(DeviceFailed, match="^the xrt device is marked failed: g0 hung again"):
        dev.run(k, [a])  # every later dispatch fails at once
    assert sum(fake.counts.values()) == calls  # without one pyxrt call: nothing is dispatched
    dev.close()


def test_more_than_two_parked_contexts_mark_the_device_failed(dev, frozen_guard):
    fake.dispatch_s["/"] = 0.002
    ks = [dev.load(spec(f"k{i}", f"/b/{i}.xclbin")) for i in range(3)]
    a = dev.alloc(16)
    for k in ks:
        warmed(dev, k, [a])
    for i, k in enumerate(ks):
        fake.hang_next = 1
        with pytest.raises(DeviceTimeout) as err:
            dev.run(k, [a])
        assert isinstance(err.value, DeviceFailed) == (i == 2)
    assert dev.failed == "3 contexts parked with hung dispatches"
    dev.close()


def test_a_parked_context_is_released_once_the_driver_ends_its_run(dev, frozen_guard):
    fake.dispatch_s["/b/"] = 0.002
    fake.tdr_s = 0.4  # the driver's job timeout (60 s on amdxdna)
    k = dev.load(spec())
    a = dev.alloc(16)
    warmed(dev, k, [a])
    fake.hang_next = 1
    with pytest.raises(DeviceTimeout):
        dev.run(k, [a])
    parked_ctx = fake.of("hw_context")[-2]  # the hung one (the last is the fresh one)
    assert dev.parked_contexts == 1
    time.sleep(0.6)  # past the job timeout and the reap interval
    dev.run(k, [a])
    gc.collect()
    assert dev.parked_contexts == 0
    assert ("hw_context.free", parked_ctx[1]) in fake.calls
    assert not fake.of("hw_context.free_blocked")
    dev.close()


def test_interrupt_gives_up_a_wait_at_once_and_parks_its_context(dev, frozen_guard):
    dev.waits = dataclasses.replace(dev.waits, deadline_margin_s=3600.0)
    k = dev.load(spec())
    a = dev.alloc(16)
    fake.hang_next = 1
    launch = dev.start(k, [a])
    threading.Timer(0.1, dev.interrupt, ("stopping the stage",)).start()
    t0 = time.perf_counter()
    with pytest.raises(DeviceInterrupted, match=r"^g0: dispatch abandoned in flight \(stopping"):
        launch.wait()
    # wall-clock-ok: a hang guard: without the interrupt the wait ends at its 3600 s deadline
    assert time.perf_counter() - t0 < 60
    assert dev.parked_contexts == 1 and dev.stats.timeouts == 0
    with pytest.raises(DeviceInterrupted, match="is stopping"):
        dev.run(k, [a])
    dev.close()
