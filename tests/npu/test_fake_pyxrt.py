"""The test fake pyxrt (tests/npu/fake_pyxrt.py) blocks and reports as the real bindings do
(Xilinx/XRT pyxrt.cpp): the facts npucam's waits are built on, proven of the fake itself."""

from __future__ import annotations

import gc
import importlib.util
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

_spec = importlib.util.spec_from_file_location(
    "fake_pyxrt", Path(__file__).with_name("fake_pyxrt.py")
)
fake = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake)


@pytest.fixture(autouse=True)
def fresh():
    fake.reset()
    yield
    fake.reset()


def kernel(path: str = "/b/gemm.xclbin"):
    return fake.kernel(fake.hw_context(fake.device(0), fake.uuid(path)), "MLIR_AIE")


def stall_of_other_thread(call) -> float:
    """The longest time a spinning thread could not run while `call` ran."""
    gap, stop = [0.0], threading.Event()

    def spin():
        last = time.perf_counter()
        while not stop.is_set():
            now = time.perf_counter()
            gap[0] = max(gap[0], now - last)
            last = now

    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.02)
    call()
    stop.set()
    t.join()
    return gap[0]


def test_wait_holds_the_gil_for_the_device_time_and_state_does_not_block():
    fake.default_dispatch_s = 0.5
    r = fake.run(kernel())
    r.start()
    assert int(r.state()) == 3 and r.state().name == "???"  # RUNNING, unbound in pyxrt
    t0 = time.perf_counter()
    assert r.wait() == fake.ert_cmd_state.ERT_CMD_STATE_COMPLETED
    # wall-clock-ok: a lower bound (a 0.5 s run): a loaded host only makes it longer
    assert time.perf_counter() - t0 >= 0.45
    # started inside the measured call: started before it, a loaded host could let the whole
    # device time pass while the spinning thread starts, and wait() would return at once
    # wall-clock-ok: a lower bound on a stall (the GIL held through a 0.5 s run): a loaded
    # host only lengthens the time the spinning thread cannot run
    assert stall_of_other_thread(lambda: (r.start(), r.wait())) > 0.3  # keeps the GIL
    r.start()
    states = {int(r.state()) for _ in range(1000)}
    # reads, never waits: a read that waited for the 0.5 s run would see it COMPLETED (4)
    assert states == {3}


def test_wait_with_a_timeout_returns_timeout_while_the_run_goes_on():
    fake.default_dispatch_s = 0.2
    r = fake.run(kernel())
    r.start()
    assert r.wait(20) == fake.ert_cmd_state.ERT_CMD_STATE_TIMEOUT
    assert int(r.state()) == 3
    assert r.wait() == fake.ert_cmd_state.ERT_CMD_STATE_COMPLETED


def test_the_enum_has_no_running_member_and_runs_queue_in_order():
    assert not hasattr(fake.ert_cmd_state, "ERT_CMD_STATE_RUNNING")
    assert int(fake.ert_cmd_state.ERT_CMD_STATE_SUBMITTED) == 7
    fake.default_dispatch_s = 0.05
    k = kernel()
    first, second = fake.run(k), fake.run(k)
    assert int(first.state()) == 1  # NEW before a start
    first.start()
    second.start()
    assert int(second.state()) == 7  # SUBMITTED: behind the first one
    with pytest.raises(RuntimeError, match="started while in flight"):
        first.start()
    second.wait()
    assert int(first.state()) == int(second.state()) == 4


def test_kernel_call_builds_a_run_per_call_and_skips_other_arguments():
    k = kernel()
    b = fake.bo(fake.device(0), 16, fake.bo.host_only, 0)
    r1, r2 = k(3, b, 2.5, "x", b), k(3, b)
    assert r1 is not r2 and len(fake.of("run")) == 2
    assert sorted(r1.args) == [0, 1, 4]  # the float and the str were dropped silently
    assert len(fake.of("start")) == 2


def test_the_call_log_is_bounded_and_counts_go_on_with_recording_off(monkeypatch):
    k = kernel()
    monkeypatch.setattr(fake, "max_calls", len(fake.calls) + 4)
    k()  # run, start
    k()
    with pytest.raises(RuntimeError, match="calls recorded"):
        k()  # a recording run past max_calls fails instead of growing without limit
    fake.record = False
    before = len(fake.calls)
    for _ in range(10):
        k()
    assert len(fake.calls) == before and fake.counts["start"] == 12
    with pytest.raises(RuntimeError, match="not being recorded"):
        fake.of("start")  # not an empty list that reads as "never called"


def test_map_keeps_no_owner_so_a_view_of_a_freed_bo_reads_garbage():
    b = fake.bo(fake.device(0), 8, fake.bo.host_only, 0)
    view = np.frombuffer(b.map(), np.uint8)
    view[:] = 1
    del b
    gc.collect()
    assert (view == 0xEE).all()


HUNG = """
import gc, importlib.util, signal, sys, threading, time
spec = importlib.util.spec_from_file_location("fake_pyxrt", sys.argv[1])
fake = importlib.util.module_from_spec(spec); spec.loader.exec_module(fake)
signal.signal(signal.SIGTERM, lambda *a: (print("handler ran", flush=True), sys.exit(0)))
ctx = fake.hw_context(fake.device(0), fake.uuid("/b/x.xclbin"))
k = fake.kernel(ctx, "MLIR_AIE")
fake.hang_next = 1
r = fake.run(k); r.start()
assert int(r.state()) == 3
what = sys.argv[2]
print("blocking", flush=True)
if what == "wait":
    threading.Thread(target=r.wait, daemon=True).start()
else:  # the context's destructor, with the hung run still in flight on it
    del k, r, ctx
    gc.collect()
while True:
    time.sleep(0.01)
"""


@pytest.mark.parametrize("what", ["wait", "context_destructor"])
def test_a_hung_run_blocks_its_wait_and_destructors_forever_holding_the_gil(tmp_path, what):
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HUNG), str(Path(fake.__file__)), what],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "blocking"
        time.sleep(0.5)
        proc.terminate()  # its Python handler needs the GIL, which the blocked call holds
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(2.0)
    finally:
        proc.kill()
        out, _ = proc.communicate()
    assert "handler ran" not in out
    assert os.WIFSIGNALED(proc.returncode) or proc.returncode < 0


# -- ordering: per hardware context, as the amdxdna driver (aie2_ctx.c) -------------------


def _gemm(k, a, b, c):
    """A run of k over (A, B, C) as XrtDevice sets it up: opcode, insts BO, count, buffers."""
    r = fake.run(k)
    for i, value in enumerate((3, fake.bo(fake.device(0), 64, 0, 0), 16, a, b, c)):
        r.set_arg(i, value)
    return r


def _root(nbytes: int = 4096):
    return fake.bo(fake.device(0), nbytes, fake.bo.host_only, 0)


def test_runs_on_one_context_queue_and_contexts_are_separate_timelines():
    fake.default_dispatch_s = 0.05
    k1, k2 = kernel("/b/ctx1.xclbin"), kernel("/b/ctx2.xclbin")
    runs = [_gemm(k, _root(), _root(), _root()) for k in (k1, k1, k2)]
    for r in runs:
        r.start()
    spans = {run_id: (begin, end) for run_id, begin, end in fake.timeline}
    one, two, other = (spans[r.id] for r in runs)
    assert two[0] == one[1]  # queued behind the first on its context
    assert other[0] < one[1]  # another context's run overlaps it
    assert [fake.run_xclbin[r.id] for r in runs] == ["/b/ctx1.xclbin"] * 2 + ["/b/ctx2.xclbin"]
    for r in runs:
        assert r.wait() == fake.ert_cmd_state.ERT_CMD_STATE_COMPLETED
    assert fake.hazards == []


def test_serial_puts_every_context_on_one_timeline():
    fake.default_dispatch_s, fake.serial = 0.02, True
    runs = [_gemm(kernel(f"/b/ctx{i}.xclbin"), _root(), _root(), _root()) for i in range(2)]
    for r in runs:
        r.start()
    (_, _, end), (_, begin, _) = fake.timeline
    assert begin == end
    for r in runs:
        r.wait()
    fake.reset()
    assert fake.serial is False


def test_a_consumer_on_another_context_started_before_its_producer_was_seen_faults():
    """o reads what mha writes: started before the host saw mha finish, the driver would not
    order them; the fake records the hazard and fails the consumer, whatever the timing."""
    mha, o = kernel("/b/mha.xclbin"), kernel("/b/gemm_k64.xclbin")
    ao, w, c = _root(), _root(), _root()
    stage = _root()
    producer = _gemm(mha, stage, stage, fake.bo(ao, 1024, 0))  # writes ao [0, 1024)
    consumer = _gemm(o, fake.bo(ao, 512, 256), w, c)  # reads ao [256, 768)
    producer.start()
    consumer.start()
    assert consumer.wait() == fake.ert_cmd_state.ERT_CMD_STATE_ERROR
    assert producer.wait() == fake.ert_cmd_state.ERT_CMD_STATE_COMPLETED
    [h] = fake.hazards
    assert (h.run, h.other, h.bo, h.lo, h.hi) == (consumer.id, producer.id, ao.id, 256, 768)
    assert h.xclbin == "/b/gemm_k64.xclbin" and h.other_xclbin == "/b/mha.xclbin"
    assert "reads" in h.what and "writes" in h.what
    fake.fail_hazards = False  # a benchmark's reference run: recorded, the run completes
    producer.start()
    again = _gemm(o, fake.bo(ao, 512, 256), w, c)
    again.start()
    assert again.wait() == fake.ert_cmd_state.ERT_CMD_STATE_COMPLETED
    assert [h.run for h in fake.hazards] == [consumer.id, again.id]


@pytest.mark.parametrize("seen", ["wait", "state"])
def test_a_consumer_started_after_the_host_saw_its_producer_finish_runs(seen):
    mha, o = kernel("/b/mha.xclbin"), kernel("/b/gemm_k64.xclbin")
    ao, stage = _root(), _root()
    producer = _gemm(mha, stage, stage, ao)
    producer.start()
    if seen == "wait":
        producer.wait()
    else:
        assert producer.state() == fake.ert_cmd_state.ERT_CMD_STATE_COMPLETED
    consumer = _gemm(o, ao, _root(), _root())
    consumer.start()
    assert consumer.wait() == fake.ert_cmd_state.ERT_CMD_STATE_COMPLETED
    assert fake.hazards == []


def test_same_context_disjoint_bytes_and_shared_reads_are_not_hazards():
    k1, k2 = kernel("/b/ctx1.xclbin"), kernel("/b/ctx2.xclbin")
    a, w, c = _root(), _root(), _root()
    runs = [
        _gemm(k1, a, w, fake.bo(c, 512, 0)),
        _gemm(k1, fake.bo(c, 512, 0), w, fake.bo(c, 512, 512)),  # same context: ordered
        _gemm(k2, a, w, fake.bo(c, 512, 1024)),  # reads what the others read, writes apart
    ]
    for r in runs:
        r.start()
    assert [int(r.wait()) for r in runs] == [4, 4, 4] and fake.hazards == []


def test_the_written_arguments_follow_the_last_bo_or_the_writes_table():
    """CLIP's addln (X, D, Y, H) writes Y and H: a run reading Y on another context races it,
    while one reading X does not."""
    ln, gemm = kernel("/b/kernels/addln.xclbin"), kernel("/b/gemm.xclbin")
    x, d, y, h = _root(), _root(), _root(), _root()
    addln = fake.run(ln)
    for i, value in enumerate((3, _root(), 16, x, d, y, h)):
        addln.set_arg(i, value)
    addln.start()
    reads_x, reads_y = _gemm(gemm, x, _root(), _root()), _gemm(gemm, y, _root(), _root())
    reads_x.start()
    reads_y.start()
    assert [int(r.wait()) for r in (addln, reads_x, reads_y)] == [4, 4, 5]
    assert [h.run for h in fake.hazards] == [reads_y.id]
    fake.reset()
    assert fake.writes == {"addln": (-2, -1)}


def test_host_syncs_of_bytes_an_unseen_run_touches_raise_and_are_recorded():
    k = kernel("/b/ctx1.xclbin")
    a, c = _root(), _root()
    r = _gemm(k, a, _root(), c)
    r.start()
    with pytest.raises(RuntimeError, match="FROM_DEVICE"):
        c.sync(fake.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE)
    with pytest.raises(RuntimeError, match="TO_DEVICE of bytes run .* reads"):
        fake.bo(a, 64, 64).sync(fake.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE)
    a.sync(fake.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE)  # reading what it reads: fine
    assert [(h.run, h.other, h.bo, h.lo, h.hi) for h in fake.hazards] == [
        (None, r.id, c.id, 0, 4096),
        (None, r.id, a.id, 64, 128),
    ]
    r.wait()
    c.sync(fake.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE)
    assert len(fake.hazards) == 2
