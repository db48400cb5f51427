"""npu/sim.py: the simulated NPU executes bundle kernels, models time and shares the 16-context
cap across processes (docs/device.md)."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import time

import numpy as np
import pytest
import torch

from npu.bf16 import bf16_to_f32, f32_to_bf16, round_bf16, unpack_bfp16
from npu.bundle import Bundle
from npu.bundle_writer import BundleWriter
from npu.device import DeviceError, DeviceTimeout, kernel_spec
from npu.ops import LOG2E
from npu.sim import ContextRegistry, CostModel, SimDevice, SimFaults
from npu.sim_bundle import write_gemm, write_mha, write_xclbin

torch.set_num_threads(1)
M, K, N = 256, 512, 128


@pytest.fixture
def reg(tmp_path):
    return tmp_path / "hwctx"


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.delenv("TACONITE_CTX_CACHE", raising=False)
    monkeypatch.delenv("TACONITE_TIMING", raising=False)


def gemm_bundle(path, rng, epilogue="none", bias=True, n=N):
    w = rng.standard_normal((K, n)).astype(np.float32) * 0.05
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    with BundleWriter(path, 1) as bw:
        write_xclbin(bw, "gemm")
        write_gemm(bw, "g", w, ctx="gemm", bias=b, epilogue=epilogue)
    bundle = Bundle.open(path, version=1)
    return bundle, kernel_spec(bundle, next(bundle.tagged("gemm")))


def run_gemm(dev, spec, b_bytes, a_bf16):
    k = dev.load(spec)
    a, b, c = dev.alloc(a_bf16.nbytes), dev.alloc(b_bytes.nbytes), dev.alloc(M * N * 2)
    a.write(a_bf16)
    b.write(b_bytes)
    dev.to_device(a)
    dev.to_device(b)
    dev.run(k, [a, b, c])
    dev.from_device(c)
    return c.array(np.uint16)


@pytest.mark.parametrize("epilogue", ["none", "silu", "gelu", "swiglu"])
def test_gemm_equals_numpy_matmul_on_the_unpacked_weights(tmp_path, reg, epilogue):
    rng = np.random.default_rng(1)
    bundle, spec = gemm_bundle(tmp_path / "b", rng, epilogue)
    blob = bundle.view("g.b", "u8")
    a = f32_to_bf16(rng.standard_normal((M, K)).astype(np.float32))
    dev = SimDevice(registry_dir=reg)
    c = bf16_to_f32(run_gemm(dev, spec, blob, a))
    dev.close()
    # reference in float64 on exactly the operands the kernel reads
    w = unpack_bfp16(blob[: K * N // 8 * 9], K, N, 128, 512, 32).astype(np.float64)
    bias = bf16_to_f32(blob[K * N // 8 * 9 :].view(np.uint16)).astype(np.float64)
    ref = bf16_to_f32(a).astype(np.float64) @ w + bias
    mag = np.abs(bf16_to_f32(a)).astype(np.float64) @ np.abs(w) + np.abs(bias)
    if epilogue == "silu":
        ref = ref / (1 + np.exp(-ref))
    elif epilogue == "gelu":
        ref = torch.nn.functional.gelu(torch.from_numpy(ref)).numpy()  # exact erf GELU
    elif epilogue == "swiglu":
        g, u = ref[:, : N // 2], ref[:, N // 2 :]
        ref = g / (1 + np.exp(-g)) * u
        mag = mag[:, : N // 2] * mag[:, N // 2 :]
        c = c.reshape(-1)[: M * N // 2].reshape(M, N // 2)
    c = c.reshape(ref.shape)
    # C is rounded to bf16 once (<= 2^-9 relative); f32 accumulation over K=512 adds at most
    # ~K·2^-24 of sum|a||w|; epilogues in f32 add a few f32 ulps. 2^-8 relative + 1e-5 of the
    # magnitude bounds both with margin, and is far below bfp16's quantisation (2^-7).
    assert np.all(np.abs(c - ref) <= 2.0**-8 * np.abs(ref) + 1e-5 * mag)


def test_gemm_record_checks(tmp_path, reg):
    rng = np.random.default_rng(2)
    _, spec = gemm_bundle(tmp_path / "b", rng)
    dev = SimDevice(registry_dir=reg)
    bad = {
        "M": ("100", "flm.GEMM needs M=100 is not a multiple of 256"),
        "b_bytes": ("5", "b_bytes=5, but a \\[512, 128\\] B with bias is 73984 bytes"),
        "epilogue": ("relu", "`epilogue=relu` is not none|silu|gelu|swiglu"),
        "K": ("x", "`K=x` is malformed"),
    }
    for field, (value, msg) in bad.items():
        fields = {**spec.fields, field: value}
        with pytest.raises(DeviceError, match=f"^manifest.txt:3: {msg}"):
            dev.load(type(spec)(**{**spec.__dict__, "fields": fields}))
    with pytest.raises(DeviceError, match="no kernel kind 'conv'"):
        dev.load(type(spec)(**{**spec.__dict__, "kind": "conv"}))
    k = dev.load(spec)
    with pytest.raises(DeviceError, match="argument 2 is 16 bytes, the kernel reads 65536"):
        dev.run(k, [dev.alloc(M * K * 2), dev.alloc(73984), dev.alloc(16)])
    dev.close()


def mha_case(rng, heads, kv, s, d=64):
    q = rng.standard_normal((heads, s, d)).astype(np.float32)
    k = rng.standard_normal((kv, s, d)).astype(np.float32)
    v = rng.standard_normal((kv, s, d)).astype(np.float32)
    return q, k, v


def torch_attention(q, k, v, scale, causal):
    t = [torch.from_numpy(x.astype(np.float64))[None] for x in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(
        *t, is_causal=causal, scale=scale, enable_gqa=True
    )
    return out[0].numpy()


def mha_run(dev, spec, q, k, v, seq_pad, token_major=False, patch=None):
    kern = dev.load(spec)
    if patch is not None:
        kern.set_insts_words(patch)
    bufs = []
    for x in (q, k, v, np.zeros_like(q)):
        p = np.zeros((x.shape[0], seq_pad, x.shape[2]), np.uint16)
        p[:, : x.shape[1]] = f32_to_bf16(x)
        if token_major:
            p = p.transpose(1, 0, 2)
        buf = dev.alloc(p.nbytes)
        buf.write(p)
        dev.to_device(buf)
        bufs.append(buf)
    dev.run(kern, bufs)
    o = bufs[3].array(np.uint16)
    h, d = q.shape[0], q.shape[2]
    o = o.reshape(seq_pad, h, d).transpose(1, 0, 2) if token_major else o.reshape(h, seq_pad, d)
    return bf16_to_f32(o[:, : q.shape[1]]), kern


@pytest.mark.parametrize(
    ("causal", "token_major", "kv"), [(False, False, 2), (True, False, 2), (False, True, 1)]
)
def test_mha_equals_reference_attention(tmp_path, reg, causal, token_major, kv):
    heads, s, pad, d = 2, 100, 128, 64
    with BundleWriter(tmp_path / "b", 1) as bw:
        write_xclbin(bw, "mha")
        write_mha(bw, "attn", ctx="mha", heads=heads, kv_heads=kv, seq=s, seq_pad=pad,
                  causal=causal, token_major=token_major)  # fmt: skip
    bundle = Bundle.open(tmp_path / "b", version=1)
    spec = kernel_spec(bundle, next(bundle.tagged("mha")))
    q, k, v = mha_case(np.random.default_rng(3), heads, kv, s)
    scale = d**-0.5
    dev = SimDevice(registry_dir=reg)
    # qscale=host: the host prescales q by scale·log2(e) (rounded to bf16 with q)
    q_pre = round_bf16(q * np.float32(scale * LOG2E))
    o, _ = mha_run(dev, spec, q_pre, k, v, pad, token_major)
    dev.close()
    ref = torch_attention(q_pre / LOG2E, round_bf16(k), round_bf16(v), 1.0, causal)
    # O rounded to bf16 once (2^-9 relative); f32 scores/softmax over 100 keys add < 1e-5.
    assert np.all(np.abs(o - ref) <= 2.0**-8 * np.abs(ref) + 2e-5)


def test_mha_numeric_qscale_and_patched_valid_key_count(tmp_path, reg, monkeypatch):
    monkeypatch.setenv("TACONITE_CTX_CACHE", "1")
    heads, pad, d = 2, 64, 64
    with BundleWriter(tmp_path / "b", 1) as bw:
        write_xclbin(bw, "mha")
        write_xclbin(bw, "other")
        write_mha(bw, "attn", ctx="mha", heads=heads, seq=pad, seq_pad=pad, qscale="0.125",
                  seq_word=3)  # fmt: skip
        write_mha(bw, "attn2", ctx="other", heads=1, seq=64)
    bundle = Bundle.open(tmp_path / "b", version=1)
    spec, other = (kernel_spec(bundle, r) for r in bundle.tagged("mha"))
    rng = np.random.default_rng(4)
    s = 40
    q, k, v = mha_case(rng, heads, heads, s)
    dev = SimDevice(registry_dir=reg)
    o, kern = mha_run(dev, spec, q, k, v, pad, patch=[(3, s)])
    ref = torch_attention(round_bf16(q), round_bf16(k), round_bf16(v), 0.125, False)
    assert np.all(np.abs(o - ref) <= 2.0**-8 * np.abs(ref) + 2e-5)
    # evict the context, reload: the patch (valid keys = 40) must still hold
    dev.load(other)
    assert kern.words is None
    bufs = [dev.alloc(heads * pad * d * 2) for _ in range(4)]
    for buf, x in zip(bufs[:3], (q, k, v), strict=False):
        p = np.zeros((heads, pad, d), np.uint16)
        p[:, :s] = f32_to_bf16(x)
        buf.write(p)
    dev.run(kern, bufs)
    o2 = bf16_to_f32(bufs[3].array(np.uint16, (heads, pad, d)))[:, :s]
    np.testing.assert_array_equal(o2, o)
    assert dev.stats.evict >= 1 and dev.sim.creations == 3
    dev.close()


def test_device_time_follows_the_cost_model_exactly(tmp_path, reg):
    rng = np.random.default_rng(5)
    bundle, spec = gemm_bundle(tmp_path / "b", rng)
    cost = CostModel(
        flops_per_s=(("gemm", 1e12),), bytes_per_s=1e10, dispatch_s=1e-4,
        ctx_create_s=0.02, ctx_switch_s=0.003,
    )  # fmt: skip
    dev = SimDevice(cost, registry_dir=reg)
    blob = bundle.view("g.b", "u8")
    a = np.zeros((M, K), np.uint16)
    run_gemm(dev, spec, blob, a)
    flops = 2 * M * K * N  # 33_554_432 -> 33.55 us at 1 TFLOP/s
    nbytes = M * K * 2 + (K * N // 8 * 9 + 2 * N) + M * N * 2 + 16 * 4  # A + B(+bias) + C + insts
    compute, memory = flops / 1e12, nbytes / 1e10  # memory-bound: 40.4 us > 33.6 us
    assert memory > compute
    dispatch = 1e-4 + memory
    assert dev.sim.kernels["g"].dispatches == 1
    assert dev.sim.kernels["g"].flops == flops and dev.sim.kernels["g"].bytes == nbytes
    assert dev.sim.kernels["g"].device_s == pytest.approx(dispatch, rel=1e-12)
    assert dev.sim.device_time_s == pytest.approx(0.02 + 0.003 + dispatch, rel=1e-12)
    # a second dispatch on the same context: no creation, no switch
    kern = dev.load(spec)
    bufs = [dev.alloc(M * K * 2), dev.alloc(blob.nbytes), dev.alloc(M * N * 2)]
    dev.run(kern, bufs)
    assert dev.sim.device_time_s == pytest.approx(0.02 + 0.003 + 2 * dispatch, rel=1e-12)
    assert dev.sim.switches == 1 and dev.sim.creations == 1
    dev.close()


def test_switching_contexts_costs_a_switch_each_time(tmp_path, reg):
    with BundleWriter(tmp_path / "b", 1) as bw:
        write_xclbin(bw, "x")
        write_xclbin(bw, "y")
        write_mha(bw, "m1", ctx="x", heads=1, seq=64)
        write_mha(bw, "m2", ctx="y", heads=1, seq=64)
    bundle = Bundle.open(tmp_path / "b", version=1)
    s1, s2 = (kernel_spec(bundle, r) for r in bundle.tagged("mha"))
    cost = CostModel(flops_per_s=(("mha", 1e12),), bytes_per_s=1e12, dispatch_s=0.0,
                     ctx_create_s=0.0, ctx_switch_s=0.003)  # fmt: skip
    dev = SimDevice(cost, registry_dir=reg)
    k1, k2 = dev.load(s1), dev.load(s2)
    bufs = [dev.alloc(64 * 64 * 2) for _ in range(4)]
    for kern in (k1, k1, k2, k1, k2, k2):
        dev.run(kern, bufs)
    flops = 4 * 64 * 64 * 64
    assert dev.sim.switches == 4
    assert dev.sim.device_time_s == pytest.approx(4 * 0.003 + 6 * flops / 1e12, rel=1e-12)
    dev.close()


def _hold_contexts(reg, n, ready, release, bundle_dir, clean):
    bundle = Bundle.open(bundle_dir, version=1)
    dev = SimDevice(registry_dir=reg, hwctx_limit=4)
    for r in list(bundle.tagged("mha"))[:n]:
        dev.load(kernel_spec(bundle, r))
    ready.set()
    release.wait(30)
    if clean:
        dev.close()
    else:
        os._exit(0)  # dies holding its slots: the registry must prune them


def _ctx_bundle(path, n):
    with BundleWriter(path, 1) as bw:
        for i in range(n):
            write_xclbin(bw, f"c{i}")
            write_mha(bw, f"m{i}", ctx=f"c{i}", heads=1, seq=64)
    bundle = Bundle.open(path, version=1)
    return bundle, [kernel_spec(bundle, r) for r in bundle.tagged("mha")]


def test_two_processes_compete_for_the_machine_wide_cap(tmp_path, reg):
    bundle, specs = _ctx_bundle(tmp_path / "b", 6)
    ctx = mp.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_hold_contexts, args=(reg, 3, ready, release, tmp_path / "b", True))
    child.start()
    try:
        assert ready.wait(30)
        registry = ContextRegistry(reg, 4)
        assert sorted(pid for pid, _ in registry.held()) == [child.pid] * 3
        dev = SimDevice(registry_dir=reg, hwctx_limit=4)
        dev.load(specs[3])  # the 4th slot
        dev.load(specs[4])  # full: evict our own LRU context (m3), retry
        assert dev.stats.evict == 1 and dev.resident_contexts() == [specs[4].context_key]
        assert len(registry.held()) == 4
        release.set()
        child.join(30)
        assert child.exitcode == 0
        dev.load(specs[5])  # the child released its 3: room again
        dev.load(specs[3])
        assert dev.stats.evict == 1 and len(dev.resident_contexts()) == 3
        dev.close()
        assert registry.held() == []
    finally:
        release.set()
        child.join(30)


def test_a_full_machine_fails_after_evicting_everything_and_dead_pids_are_pruned(tmp_path, reg):
    bundle, specs = _ctx_bundle(tmp_path / "b", 6)
    ctx = mp.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_hold_contexts, args=(reg, 4, ready, release, tmp_path / "b", False))
    child.start()
    try:
        assert ready.wait(30)
        dev = SimDevice(registry_dir=reg, hwctx_limit=4, context_waits=3, context_wait_s=0.01)
        with pytest.raises(DeviceError, match=r"^load\(.*c4.xclbin MLIR_AIE\): .*HWCTX") as e:
            dev.load(specs[4])
        held = f"held by pid {child.pid} (4 contexts: c0.xclbin, c1.xclbin, c2.xclbin, c3.xclbin)"
        assert "every NPU hardware context is taken" in str(e.value) and held in str(e.value)
        assert dev.context_view()[""].waits == 3
        release.set()
        child.join(30)
        dev.load(specs[4])  # the dead child's 4 slot files are pruned
        assert len(ContextRegistry(reg, 4).held()) == 1
        dev.close()
    finally:
        release.set()
        child.join(30)


def test_faults_kernel_error_hang_and_context_failure(tmp_path, reg):
    _, specs = _ctx_bundle(tmp_path / "b", 2)
    faults = SimFaults(error_kernels={"m0"}, hang_kernels={"m1"}, watchdog_s=10.0)
    dev = SimDevice(registry_dir=reg, faults=faults)
    k0, k1 = dev.load(specs[0]), dev.load(specs[1])
    bufs = [dev.alloc(64 * 64 * 2) for _ in range(4)]
    with pytest.raises(DeviceError, match=r"^kernel finished in state 5$"):
        dev.run(k0, bufs)
    t0 = time.perf_counter()
    with pytest.raises(DeviceTimeout, match=r"dispatch of m1 not done .* past its deadline"):
        dev.run(k1, bufs)  # caught by the wait's deadline, long before the 10 s watchdog
    # wall-clock-ok: a lower bound (the 0.2 s deadline margin): a loaded host only lengthens it
    assert time.perf_counter() - t0 >= 0.2
    # the wait's deadline ended it, not the watchdog: that would be state 8 (the test below)
    assert dev.stats.timeouts == 1
    assert dev.stats.timeouts == 1 and dev.parked_contexts == 1
    faults.error_kernels.clear()
    faults.hang_kernels.clear()
    dev.run(k0, bufs)  # the device stays usable
    dev.run(k1, bufs)  # and m1 runs in its fresh context
    dev.close()
    assert ContextRegistry(reg).held() == []  # the parked slot is given back at close
    dev = SimDevice(registry_dir=reg)
    dev.load(specs[0])
    dev.faults.context_failures = 1
    dev.load(specs[1])  # the injected CREATE_HWCTX failure evicts m0's context and retries
    assert dev.stats.evict == 1 and dev.resident_contexts() == [specs[1].context_key]
    dev.close()


def test_a_hung_run_ends_in_timeout_when_the_watchdog_fires_first(tmp_path, reg):
    # the driver's job timeout (watchdog_s) shorter than the wait's deadline: TIMEOUT, state 8
    _, specs = _ctx_bundle(tmp_path / "b", 1)
    dev = SimDevice(registry_dir=reg, faults=SimFaults(hang_next=1, watchdog_s=0.05))
    k = dev.load(specs[0])
    bufs = [dev.alloc(64 * 64 * 2) for _ in range(4)]
    with pytest.raises(DeviceError, match=r"^kernel finished in state 8$"):
        dev.run(k, bufs)
    assert dev.stats.timeouts == 0 and dev.parked_contexts == 0
    dev.run(k, bufs)  # hang_next was one dispatch
    dev.close()


def test_sleep_flag_makes_wait_return_after_the_modelled_time(tmp_path, reg):
    _, specs = _ctx_bundle(tmp_path / "b", 1)
    cost = CostModel(dispatch_s=0.05, ctx_create_s=0.0, ctx_switch_s=0.0)
    dev = SimDevice(cost, sleep=True, registry_dir=reg)
    kern = dev.load(specs[0])
    bufs = [dev.alloc(64 * 64 * 2) for _ in range(4)]
    assert dev.run(kern, bufs) >= 0.05
    dev.close()


def test_a_paced_pass_takes_its_seconds_and_its_own_dispatches_none(tmp_path, reg):
    _, specs = _ctx_bundle(tmp_path / "b", 1)
    cost = CostModel(dispatch_s=0.2, ctx_create_s=0.0, ctx_switch_s=0.0)
    dev = SimDevice(cost, sleep=True, registry_dir=reg)
    kern = dev.load(specs[0])
    bufs = [dev.alloc(64 * 64 * 2) for _ in range(4)]
    t0 = time.perf_counter()
    with dev.paced(0.3):
        for _ in range(3):  # 3 x 0.2 s at the device's own rates, free inside the pass
            dev.run(kern, bufs)
    wall = time.perf_counter() - t0
    # wall-clock-ok: a lower bound (the pass's 0.3 s): a loaded host only makes it longer
    assert wall >= 0.3
    assert dev.sim.paced_s == pytest.approx(0.3) and dev.sim.paced_passes == 1
    assert dev.sim.dispatch_s == 0.0 and dev.sim.device_time_s == pytest.approx(0.3)
    assert dev.cost is cost  # the device's own rates are back after the pass
    t0 = time.perf_counter()
    for _ in range(3):  # the control, back to back: the same dispatches outside a pass
        assert dev.run(kern, bufs) >= 0.2
    control = time.perf_counter() - t0
    assert wall < control - 0.15  # 0.3 s against 0.6 s: the dispatches inside were free
    with pytest.raises(RuntimeError), dev.paced(5.0):
        raise RuntimeError("a failed pass")
    assert dev.sim.paced_passes == 1 and dev.cost is cost  # not charged
    dev.close()


def test_timing_lines_are_labelled_sim(tmp_path, reg, monkeypatch, capsys):
    monkeypatch.setenv("TACONITE_TIMING", "")
    _, specs = _ctx_bundle(tmp_path / "b", 1)
    dev = SimDevice(registry_dir=reg)
    kern = dev.load(specs[0])
    dev.run(kern, [dev.alloc(64 * 64 * 2) for _ in range(4)])
    dev.close()
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("[sim] loads=1 hits=1 evict=0 runs=1  load=")
    assert lines[1].startswith("[sim] device_time=") and "(simulated:" in lines[1]


def test_a_device_dropped_without_close_gives_its_slots_back(tmp_path, reg):
    _, specs = _ctx_bundle(tmp_path / "b", 2)
    dev = SimDevice(registry_dir=reg)
    dev.load(specs[0])
    dev.load(specs[1])
    registry = ContextRegistry(reg)
    assert len(registry.held()) == 2
    del dev
    gc.collect()  # kernels and the device reference each other: a cycle
    assert registry.held() == []


def test_a_missing_xclbin_fails_the_load(tmp_path, reg):
    _, specs = _ctx_bundle(tmp_path / "b", 1)
    (tmp_path / "b" / "kernels" / "c0.xclbin").unlink()
    dev = SimDevice(registry_dir=reg)
    with pytest.raises(DeviceError, match=r"^manifest.txt:\d+: xclbin .*c0.xclbin is missing$"):
        dev.load(specs[0])
    dev.close()


def test_gemm_reads_a_at_stride_lda_and_writes_c_at_c_stride(tmp_path, reg):
    rng = np.random.default_rng(13)
    _, spec = gemm_bundle(tmp_path / "b", rng, bias=False)
    lda, c_stride = 384, N + 32  # overlapping A rows (3x3-conv style); C rows with a gap
    spec = type(spec)(**{**spec.__dict__, "fields": {**spec.fields, "lda": "384",
                                                     "c_stride": str(c_stride)}})  # fmt: skip
    bundle = Bundle.open(tmp_path / "b", version=1)
    blob = bundle.view("g.b", "u8")
    flat = f32_to_bf16(rng.standard_normal((M - 1) * lda + K).astype(np.float32))
    dev = SimDevice(registry_dir=reg)
    kern = dev.load(spec)
    a, b = dev.alloc(flat.nbytes), dev.alloc(blob.nbytes)
    c = dev.alloc(((M - 1) * c_stride + N) * 2)
    c.host[:] = 0xFF  # the gap columns must stay untouched
    a.write(flat)
    b.write(blob)
    dev.run(kern, [a, b, c])
    rows = np.lib.stride_tricks.as_strided(bf16_to_f32(flat), (M, K), (lda * 4, 4))
    ref = rows.astype(np.float64) @ unpack_bfp16(blob, K, N, 128, 512, 32)
    out = np.zeros(M * c_stride, np.uint16)
    out[: c.nbytes // 2] = c.array(np.uint16)
    out = out.reshape(M, c_stride)
    got = bf16_to_f32(out[:, :N])
    mag = np.abs(rows) @ np.abs(unpack_bfp16(blob, K, N, 128, 512, 32))
    assert np.all(np.abs(got - ref) <= 2.0**-8 * np.abs(ref) + 1e-5 * mag)
    assert (out[:-1, N:] == 0xFFFF).all()
    dev.close()


def _hold_until(reg, n, ready, release_after, bundle_dir):
    bundle = Bundle.open(bundle_dir, version=1)
    dev = SimDevice(registry_dir=reg, hwctx_limit=4)
    for r in list(bundle.tagged("mha"))[:n]:
        dev.load(kernel_spec(bundle, r))
    ready.set()
    import time

    time.sleep(release_after)
    dev.close()


def test_finding_9_a_load_waits_for_a_slot_another_process_frees(tmp_path, reg):
    """taconite-sapiens2 waits up to WAITS x 100 ms for slots other programs hold once it has
    nothing of its own to give up; npucam failed at once."""
    _, specs = _ctx_bundle(tmp_path / "b", 6)
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    child = ctx.Process(target=_hold_until, args=(reg, 4, ready, 0.4, tmp_path / "b"))
    child.start()
    try:
        assert ready.wait(30)
        dev = SimDevice(registry_dir=reg, hwctx_limit=4, context_waits=50, context_wait_s=0.05)
        owned = type(specs[4])(**{**specs[4].__dict__, "owner": "sapiens2"})
        dev.load(owned)  # the child closes after 0.4 s, within the 2.5 s bound
        view = dev.context_view()["sapiens2"]
        assert view.resident == (owned.context_key,) and 1 <= view.waits < 50
        dev.close()
    finally:
        child.join(30)


def test_finding_9_the_device_views_its_context_budget_per_model(tmp_path, reg, monkeypatch):
    """Each kernel's context counts against the model that loaded it: what is resident per
    model, who evicted whose, and the cost of a load (the sim's modelled creation time)."""
    monkeypatch.setenv("TACONITE_CTX_CACHE", "3")
    _, specs = _ctx_bundle(tmp_path / "b", 4)
    owned = [type(s)(**{**s.__dict__, "owner": o}) for s, o in zip(specs, "aabb", strict=True)]
    dev = SimDevice(registry_dir=reg, cost=CostModel(ctx_create_s=0.02))
    for spec in owned:
        dev.load(spec)
    view = dev.context_view()
    assert view["a"].resident == (owned[1].context_key,) and view["a"].evicted == {"b": 1}
    assert view["b"].resident == (owned[2].context_key, owned[3].context_key)
    assert (view["b"].loads, view["b"].evicted, view["b"].load_cost_s) == (2, {}, 0.02)
    dev.close()


def _staged_mha(path, tokens, heads, hd, q_elems=None):
    from npu.sim_kernels import MhaProgram

    d = heads * hd
    with BundleWriter(path, 1) as bw:
        write_xclbin(bw, "mha")
        bw.file("kernels/mha.bin", MhaProgram(tokens, heads, hd, 3 * d, 0, d, 2 * d, d).words())
        bw.record("mha", q_elems=q_elems or tokens * 3 * d, k_elems=tokens * 3 * d,
                  v_elems=tokens * 3 * d, o_elems=tokens * d, ctx="mha",
                  insts="kernels/mha.bin")  # fmt: skip
    bundle = Bundle.open(path, version=1)
    return kernel_spec(bundle, next(bundle.tagged("mha")))


def test_staged_mha_reads_q_k_v_as_column_ranges_of_one_buffer_from_offset_0(tmp_path, reg):
    """taconite-sapiens2's attention kernel: rows [q·log2(e)/sqrt(hd) | k | v] of one buffer,
    passed three times from its start; O token-major. Against torch's attention in f64."""
    tokens, heads, hd = 37, 3, 16
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((tokens, heads, hd)).astype(np.float32) for _ in range(3))
    scale = LOG2E / np.sqrt(hd)
    stage = np.concatenate([(q * scale).reshape(tokens, -1), k.reshape(tokens, -1),
                            v.reshape(tokens, -1)], axis=1)  # fmt: skip
    dev = SimDevice(registry_dir=reg)
    kern = dev.load(_staged_mha(tmp_path / "b", tokens, heads, hd))
    buf, out = dev.alloc(stage.size * 2), dev.alloc(tokens * heads * hd * 2)
    buf.write(f32_to_bf16(stage))
    views = [dev.sub(buf, 0, buf.nbytes) for _ in range(3)]
    dev.run(kern, [*views, out])
    got = bf16_to_f32(out.array(np.uint16)).reshape(tokens, heads, hd)
    qr, kr, vr = (round_bf16(x).transpose(1, 0, 2) for x in (q * scale, k, v))
    want = torch_attention(qr / scale, kr, vr, 1 / np.sqrt(hd), False).transpose(1, 0, 2)
    np.testing.assert_allclose(got, want, rtol=2**-7, atol=2e-2)
    dev.close()


def test_staged_mha_view_sizes_must_cover_what_the_kernel_reads(tmp_path, reg):
    dev = SimDevice(registry_dir=reg)
    spec = _staged_mha(tmp_path / "b", 10, 2, 8, q_elems=9 * 48 + 15)
    with pytest.raises(DeviceError, match=r"`q_elems=447` is smaller than the 448 elements"):
        dev.load(spec)
    dev.close()


def test_taconite_form_gemm_runs_all_its_rows_in_one_dispatch(tmp_path, reg):
    """rows > M in one dispatch, A at lda < K (overlapping rows), C at c_stride > N, view
    sizes from the record (a_elems too small is refused at load)."""
    from npu.sim_kernels import GemmProgram, pack_gemm_b

    rows, k, n, lda, c_stride = 600, 512, 64, 96, 80
    rng = np.random.default_rng(6)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    prog = GemmProgram(64, 512, 128, False, "none", n)
    a_elems, c_elems = (rows - 1) * lda + k, (rows - 1) * c_stride + n
    with BundleWriter(tmp_path / "b", 1) as bw:
        write_xclbin(bw, "gemm")
        bw.file("kernels/g.bin", prog.words())
        bw.tensor("g", pack_gemm_b(w, None, 64, 512, 128), "u8")
        bw.record("gemm", "g", M=256, K=k, N=n, lda=lda, c_stride=c_stride, rows=rows,
                  a_elems=a_elems, c_elems=c_elems, ctx="gemm", insts="kernels/g.bin")  # fmt: skip
    bundle = Bundle.open(tmp_path / "b", version=1)
    spec = kernel_spec(bundle, next(bundle.tagged("gemm")))
    dev = SimDevice(registry_dir=reg)
    kern = dev.load(spec)
    flat = f32_to_bf16(rng.standard_normal(a_elems).astype(np.float32))
    a, b, c = dev.alloc(a_elems * 2), dev.alloc(bundle.entry("g").nbytes), dev.alloc(c_elems * 2)
    a.write(flat)
    b.write(bundle.view("g"))
    dev.run(kern, [a, b, c])
    assert dev.sim.kernels["g"].dispatches == 1
    rows_a = np.lib.stride_tricks.as_strided(bf16_to_f32(flat), (rows, k), (lda * 4, 4))
    ref = rows_a.astype(np.float64) @ unpack_bfp16(bundle.view("g"), k, n, 64, 512, 128)
    got = bf16_to_f32(np.lib.stride_tricks.as_strided(c.array(np.uint16), (rows, n),
                                                      (c_stride * 2, 2)))  # fmt: skip
    assert np.abs(got - ref).max() <= 2.0**-7 * np.abs(ref).max()
    small = type(spec)(**{**spec.__dict__, "fields": {**spec.fields, "a_elems": str(a_elems - 1)}})
    with pytest.raises(DeviceError, match=f"`a_elems={a_elems - 1}` is smaller than its 600 rows"):
        dev.load(small)
    dev.close()


def _two_context_gemms(path, rng):
    """Two [M, 512] x [512, 512] GEMMs, `p` and `q`, on contexts `ctx_p` and `ctx_q`, and a
    third, `p2`, on `ctx_p`: (bundle, {key: spec}, {key: B tensor name})."""
    w = rng.standard_normal((K, K)).astype(np.float32) * 0.05
    with BundleWriter(path, 1) as bw:
        write_xclbin(bw, "ctx_p")
        write_xclbin(bw, "ctx_q")
        names = {key: write_gemm(bw, key, w, ctx=ctx) for key, ctx in
                 (("p", "ctx_p"), ("q", "ctx_q"), ("p2", "ctx_p"))}  # fmt: skip
    bundle = Bundle.open(path, version=1)
    specs = {kernel_spec(bundle, r).key: kernel_spec(bundle, r) for r in bundle.tagged("gemm")}
    return bundle, specs, names


def test_a_dispatch_racing_an_unretired_launch_on_another_context_is_a_named_error(tmp_path, reg):
    """q reads the C that p, still unretired on another context, writes: the driver would
    not order them, so the sim refuses to start q, naming both records; on p's own context
    (p2) or once p was waited for, the same dispatch runs."""
    bundle, specs, names = _two_context_gemms(tmp_path / "b", np.random.default_rng(0))
    dev = SimDevice(registry_dir=reg)
    try:
        k = {key: dev.load(spec) for key, spec in specs.items()}
        bufs = {}
        for key, name in names.items():
            blob = np.asarray(bundle.view(name, "u8"))
            bufs[key] = dev.alloc(blob.nbytes)
            bufs[key].write(blob)
            dev.to_device(bufs[key])
        a, c = dev.alloc(M * K * 2), dev.alloc(2 * M * K * 2)
        c_p, c_q = dev.sub(c, 0, M * K * 2), dev.sub(c, M * K * 2, M * K * 2)
        p = dev.start(k["p"], [a, bufs["p"], c_p])
        with pytest.raises(DeviceError) as err:
            dev.start(k["q"], [dev.sub(c, 256, M * K * 2), bufs["q"], c_q])
        msg = str(err.value)
        assert msg.startswith(f"{specs['q'].where()}: q reads bytes [256, {M * K * 2})")
        assert f"that p ({specs['p'].where()}), started on another hardware context" in msg
        with pytest.raises(DeviceError, match=r"a sync from the device of bytes .* p \("):
            dev.from_device(c_p)
        with pytest.raises(DeviceError, match=r"a sync to the device of bytes .* p .* reads"):
            dev.to_device(a)
        dev.start(k["q"], [a, bufs["q"], c_q]).wait()  # shares only what both read
        dev.start(k["p2"], [c_p, bufs["p2"], c_q]).wait()  # p's context: ordered after p
        p.wait()
        dev.from_device(c_p)
        dev.start(k["q"], [c_p, bufs["q"], c_q]).wait()
    finally:
        dev.close()
