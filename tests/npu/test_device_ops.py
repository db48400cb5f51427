"""DeviceOps (npu/ops.py) on the simulated NPU against the float32 NumpyOps backend."""

from __future__ import annotations

import numpy as np
import pytest

from npu.bundle import Bundle
from npu.bundle_writer import BundleWriter
from npu.ops import DeviceOps, GemmWeights, NumpyOps, OpsError
from npu.sim import SimDevice
from npu.sim_bundle import write_gemm, write_mha, write_xclbin

K, N = 512, 128


@pytest.fixture
def dev(tmp_path, monkeypatch):
    monkeypatch.delenv("TACONITE_CTX_CACHE", raising=False)
    d = SimDevice(registry_dir=tmp_path / "hwctx")
    yield d
    d.close()


@pytest.fixture
def model(tmp_path):
    """A bundle with one GEMM per epilogue (biased) and two MHAs, and the f32 weights."""
    rng = np.random.default_rng(7)
    gemms = {}
    with BundleWriter(tmp_path / "b", 1) as bw:
        write_xclbin(bw, "gemm")
        write_xclbin(bw, "mha")
        for epi in ("none", "silu", "gelu", "swiglu"):
            w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
            b = (rng.standard_normal(N) * 0.1).astype(np.float32)
            write_gemm(bw, f"g_{epi}", w, ctx="gemm", bias=b, epilogue=epi)
            gemms[f"g_{epi}"] = GemmWeights(w, b, epi)
        write_mha(bw, "attn", ctx="mha", heads=4, kv_heads=2, seq=50, seq_pad=64, seq_word=5)
        write_mha(bw, "text", ctx="mha", heads=2, seq=77, seq_pad=128, causal=True,
                  token_major=True, qscale="0.125")  # fmt: skip
    bundle = Bundle.open(tmp_path / "b", version=1)
    return bundle, gemms


def bind(dev, bundle, gemms):
    return DeviceOps.from_bundle(
        dev,
        bundle,
        gemms={k: (k, f"{k}.b") for k in gemms},
        mhas={"attn": "attn", "text": "text"},
    )


@pytest.mark.parametrize("epilogue", ["none", "silu", "gelu", "swiglu"])
def test_gemm_on_sim_matches_numpy_ops(dev, model, epilogue):
    bundle, gemms = model
    ops, ref = bind(dev, bundle, gemms), NumpyOps(gemms)
    assert ops.backend == "sim" and ref.backend == "cpu"
    key = f"g_{epilogue}"
    a = np.random.default_rng(8).standard_normal((300, K)).astype(np.float32)  # 2 chunks, padded
    got, want = ops.gemm(key, a), ref.gemm(key, a)
    assert got.shape == want.shape == (300, N // 2 if epilogue == "swiglu" else N)
    assert got.dtype == np.float32
    # Worst-case bound from the device's number formats, propagated through the epilogue:
    # bfp16ebs8 moves each weight by at most half a mantissa step, <= 2^-7 of the largest |w|
    # in its block of 8 consecutive k; A and the bias are rounded to bf16 (2^-9 relative);
    # C (and the epilogue's output) is rounded to bf16 (2^-9; 2^-8 leaves room for f32 math).
    gw = gemms[key]
    bmax = np.repeat(np.abs(gw.w).reshape(K // 8, 8, N).max(axis=1), 8, axis=0)
    lin = a @ gw.w + gw.bias
    e = 2.0**-7 * (np.abs(a) @ bmax) + 2.0**-8 * (np.abs(a) @ np.abs(gw.w) + np.abs(gw.bias))
    e += 2.0**-8 * np.abs(lin)
    if epilogue in ("silu", "gelu"):
        e *= 1.13  # max |silu'| and |gelu'| ~ 1.1 and 1.13
    elif epilogue == "swiglu":
        g, u, eg, eu = lin[:, : N // 2], lin[:, N // 2 :], e[:, : N // 2], e[:, N // 2 :]
        e = 1.1 * eg * np.abs(u) + np.abs(g) * eu + 1.1 * eg * eu
    err = np.abs(got - want)
    assert np.all(err <= e + 2.0**-8 * np.abs(want))
    # and the typical error is far inside the bound (~2^-7 · sqrt(K) · rms|a| · rms|w|)
    assert np.mean(err) < 0.1 * np.mean(e)
    assert dev.stats.runs == 2  # one dispatch per 256-row chunk


def test_gemm_reuses_its_chunk_buffers_and_zero_pads(dev, model):
    bundle, gemms = model
    ops = bind(dev, bundle, gemms)
    rng = np.random.default_rng(9)
    big = rng.standard_normal((512, K)).astype(np.float32)
    small = big[:10]
    first = ops.gemm("g_none", big)
    again = ops.gemm("g_none", small)  # stale rows 10..255 must not leak in (zero padding)
    np.testing.assert_array_equal(again, first[:10])
    assert dev.stats.runs == 3


def test_mha_on_sim_matches_numpy_ops_with_gqa_padding_and_patch(dev, model):
    bundle, gemms = model
    ops = bind(dev, bundle, gemms)
    rng = np.random.default_rng(10)
    s, scale = 40, 64**-0.5  # fewer tokens than compiled: the valid count is patched in
    q = rng.standard_normal((4, s, 64)).astype(np.float32)
    k = rng.standard_normal((2, s, 64)).astype(np.float32)
    v = rng.standard_normal((2, s, 64)).astype(np.float32)
    got = ops.mha("attn", q, k, v, scale=scale)
    want = NumpyOps({}).mha("attn", q, np.repeat(k, 2, 0), np.repeat(v, 2, 0), scale=scale)
    # q·scale·log2e, k and v rounded to bf16 (2^-9 each) move each score by ~2^-9·|s| and O
    # by ~1e-2 at most for these unit-variance inputs; O is rounded to bf16 (2^-9).
    assert got.shape == (4, s, 64)
    assert np.all(np.abs(got - want) <= 0.03 + 2.0**-8 * np.abs(want))
    words = np.frombuffer(ops._mhas["attn"][0].words, np.uint32)
    assert words[5] == s


def test_causal_token_major_mha_with_kernel_scale(dev, model):
    bundle, gemms = model
    ops = bind(dev, bundle, gemms)
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((2, 77, 64)).astype(np.float32) for _ in range(3))
    got = ops.mha("text", q, k, v, scale=0.125, causal=True)
    want = NumpyOps({}).mha("text", q, k, v, scale=0.125, causal=True)
    assert np.all(np.abs(got - want) <= 0.03 + 2.0**-8 * np.abs(want))
    with pytest.raises(OpsError, match="causal=False, the kernel has causal=1"):
        ops.mha("text", q, k, v, scale=0.125)
    with pytest.raises(OpsError, match="scale=0.1, the kernel applies qscale=0.125"):
        ops.mha("text", q, k, v, scale=0.1, causal=True)
    with pytest.raises(OpsError, match="S=76, the kernel was compiled for seq=77"):
        ops.mha("text", q[:, :76], k[:, :76], v[:, :76], scale=0.125, causal=True)


def test_bad_calls_name_the_op(dev, model):
    bundle, gemms = model
    ops = bind(dev, bundle, gemms)
    with pytest.raises(OpsError, match=r"gemm 'nope' is not bound on the sim backend"):
        ops.gemm("nope", np.zeros((1, K), np.float32))
    with pytest.raises(OpsError, match=r"gemm 'g_none': A is \(3, 100\), wanted \[rows, 512\]"):
        ops.gemm("g_none", np.zeros((3, 100), np.float32))
    with pytest.raises(OpsError, match=r"mha 'attn': q \(4, 8, 32\)"):
        z = np.zeros((4, 8, 32), np.float32)
        ops.mha("attn", z, z, z, scale=1.0)
    with pytest.raises(OpsError, match="no kernel record missing"):
        DeviceOps.from_bundle(dev, bundle, mhas={"x": "missing"})


def test_ops_on_one_record_share_its_kernel_and_buffers(dev, model):
    bundle, gemms = model
    layers = {f"{i}.o": ("g_none", f"g_{e}.b") for i, e in enumerate(("none", "silu"))}
    ops = DeviceOps.from_bundle(dev, bundle, gemms=layers)
    a = np.random.default_rng(12).standard_normal((20, K)).astype(np.float32)
    # layer 1 runs the `none` kernel over g_silu's B: a plain GEMM with those weights
    w = gemms["g_silu"]
    want = NumpyOps({"x": GemmWeights(w.w, w.bias)}).gemm("x", a)
    got = ops.gemm("1.o", a)
    assert np.abs(got - want).max() < 0.05
    assert not np.allclose(ops.gemm("0.o", a), got)
    assert len(ops._kernels) == 1 and len(dev.stats.kernels) == 1
    ops.close()


def test_close_frees_kernels_buffers_and_contexts(dev, model):
    bundle, gemms = model
    ops = bind(dev, bundle, gemms)
    ops.gemm("g_none", np.ones((4, K), np.float32))
    assert len(dev.resident_contexts()) == 2
    ops.close()
    assert dev.resident_contexts() == [] and dev.registry.held() == []


def _within_format_bound(got: np.ndarray, a: np.ndarray, gw: GemmWeights) -> bool:
    """|got - a·w - bias| within the no-epilogue worst-case bound of
    test_gemm_on_sim_matches_numpy_ops (bfp16 B, bf16 A / bias / C)."""
    bmax = np.repeat(np.abs(gw.w).reshape(K // 8, 8, N).max(axis=1), 8, axis=0)
    lin = a @ gw.w + gw.bias
    e = 2.0**-7 * (np.abs(a) @ bmax) + 2.0**-8 * (np.abs(a) @ np.abs(gw.w) + np.abs(gw.bias))
    e += 2.0**-8 * np.abs(lin)
    return bool(np.all(np.abs(got - lin) <= e))


def test_gemm_reads_c_at_c_stride_and_keeps_n_columns(dev, tmp_path):
    rng = np.random.default_rng(11)
    w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
    b = (rng.standard_normal(N) * 0.1).astype(np.float32)
    with BundleWriter(tmp_path / "s", 1) as bw:
        write_xclbin(bw, "gemm")
        write_gemm(bw, "wide_c", w, ctx="gemm", bias=b, c_stride=N + 64)
    bundle = Bundle.open(tmp_path / "s", version=1)
    ops = DeviceOps.from_bundle(dev, bundle, gemms={"wide_c": ("wide_c", "wide_c.b")})
    a = np.random.default_rng(13).standard_normal((300, K)).astype(np.float32)
    got = ops.gemm("wide_c", a)
    assert got.shape == (300, N) and _within_format_bound(got, a, GemmWeights(w, b))
    ops.close()


def test_a_one_dispatch_record_is_refused_by_the_m_row_chunked_ops(dev, tmp_path):
    """A record with rows != M is taconite-sapiens2's one-dispatch form, which the Sapiens2
    replay runs; DeviceOps, which runs M-row chunks, refuses it by name."""
    with BundleWriter(tmp_path / "r", 1) as bw:
        write_xclbin(bw, "gemm")
        write_gemm(bw, "g", np.zeros((K, N), np.float32), ctx="gemm", rows=300)
    with pytest.raises(OpsError, match="manifest.txt:3: rows=300; DeviceOps runs M-row chunks"):
        DeviceOps.from_bundle(dev, Bundle.open(tmp_path / "r", 1), gemms={"g": ("g", "g.b")})


def test_c_stride_below_n_is_refused(dev, tmp_path):
    with BundleWriter(tmp_path / "n", 1) as bw:
        write_xclbin(bw, "gemm")
        write_gemm(bw, "g", np.zeros((K, N), np.float32), ctx="gemm", c_stride=N - 1)
    with pytest.raises(OpsError, match=f"c_stride={N - 1}"):
        DeviceOps.from_bundle(
            dev, Bundle.open(tmp_path / "n", version=1), gemms={"g": ("g", "g.b")}
        )
