"""npu/sim_clip.py (the simulator's CLIP kernels) and the GEMM tiling CLIP bundles use, against
independent references: torch's scaled_dot_product_attention, ml_dtypes' bf16 rounding and a
float64 LayerNorm.

Tolerances: the kernels round their outputs to bf16 (8-bit mantissa), so a result may differ
from a float64 reference by one bf16 rounding of the value: |diff| <= 2^-8·|ref| plus 1e-6
for float32 summation order; the residual add is exact (same f32 sum, same RNE rounding).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from npu.bf16 import bf16_to_f32, f32_to_bf16
from npu.bundle import Bundle
from npu.bundle_writer import BundleWriter
from npu.device import DeviceError, kernel_spec
from npu.models.clip.export import BIAS_CARRIER, _mlp_weights, gemm_tiling
from npu.ops import GemmWeights, gelu
from npu.sim import SimDevice
from npu.sim_bundle import write_xclbin
from npu.sim_clip import write_addln, write_clip_mha
from npu.sim_kernels import pack_gemm_b

torch.set_num_threads(1)
BF16_REL = 2.0**-8


def bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bf16 by ml_dtypes, as float32."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


@pytest.fixture
def device(tmp_path):
    dev = SimDevice(registry_dir=tmp_path / "hwctx")
    yield dev
    dev.close()


def load_op(path, write, device):
    with BundleWriter(path, 1) as bw:
        write(bw)
    bundle = Bundle.open(path, version=1)
    return device.load(kernel_spec(bundle, next(bundle.tagged("op"))))


def upload(device, values_f32: np.ndarray):
    u16 = f32_to_bf16(values_f32.astype(np.float32))
    buf = device.alloc(u16.nbytes)
    buf.write(u16)
    device.to_device(buf)
    return buf


def read(device, buf, shape) -> np.ndarray:
    device.from_device(buf)
    return bf16_to_f32(buf.array(np.uint16, shape))


@pytest.mark.parametrize(
    ("blocks", "block", "seq", "causal"), [(1, 64, 50, False), (4, 24, 19, True)]
)
def test_clip_mha_equals_torch_attention_per_block(tmp_path, device, blocks, block, seq, causal):
    heads, d = 3, 8
    width, rows = heads * d, blocks * block
    scale = d**-0.5
    rng = np.random.default_rng(1)
    qkv = bf16(rng.standard_normal((rows, 3 * width)))
    kernel = load_op(
        tmp_path / "b",
        lambda bw: write_clip_mha(
            bw, "m", heads=heads, d=d, rows=rows, block=block, seq=seq, causal=causal, qscale=scale
        ),  # fmt: skip
        device,
    )
    src = upload(device, qkv)
    out = device.alloc(rows * width * 2)
    device.run(kernel, [src, src, src, out])
    got = read(device, out, (rows, width))

    t = torch.from_numpy(qkv.astype(np.float64)).reshape(blocks, block, 3, heads, d)
    q, k, v = (t[:, :, j].transpose(1, 2) for j in range(3))  # [blocks, heads, block, d]
    keep = torch.arange(block)[None, :] < seq
    if causal:
        keep = keep & torch.ones(block, block, dtype=torch.bool).tril()
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale)
    ref = ref.transpose(1, 2).reshape(rows, width).numpy()
    assert np.all(np.abs(got - ref) <= BF16_REL * np.abs(ref) + 1e-6)


def test_clip_mha_blocks_are_independent(tmp_path, device):
    # the text tower's one dispatch over 8 prompts: changing one block changes no other
    heads, d, block, blocks = 2, 8, 16, 3
    width, rows = heads * d, blocks * block
    kernel = load_op(
        tmp_path / "b",
        lambda bw: write_clip_mha(
            bw, "m", heads=heads, d=d, rows=rows, block=block, seq=12, causal=True, qscale=0.25
        ),  # fmt: skip
        device,
    )
    rng = np.random.default_rng(2)
    qkv = bf16(rng.standard_normal((rows, 3 * width)))
    outs = []
    for x in (qkv, np.concatenate([qkv[:block], qkv[block:] * 0 + 1.5])):
        src, out = upload(device, x), device.alloc(rows * width * 2)
        device.run(kernel, [src, src, src, out])
        outs.append(read(device, out, (rows, width)))
    assert np.array_equal(outs[0][:block], outs[1][:block])
    assert not np.array_equal(outs[0][block:], outs[1][block:])


def test_addln_adds_exactly_and_normalises_without_affine(tmp_path, device):
    rows, dim, eps = 8, 40, 1e-5
    rng = np.random.default_rng(3)
    x, delta = bf16(rng.standard_normal((rows, dim)) * 3), bf16(rng.standard_normal((rows, dim)))
    x[5] = 0.0
    delta[5] = 0.0  # a padding row stays exactly zero
    kernel = load_op(
        tmp_path / "b", lambda bw: write_addln(bw, "a", rows=rows, dim=dim, eps=eps), device
    )
    bufs = [upload(device, x), upload(device, delta)]
    bufs += [device.alloc(rows * dim * 2), device.alloc(rows * dim * 2)]
    device.run(kernel, bufs)
    y, h = read(device, bufs[2], (rows, dim)), read(device, bufs[3], (rows, dim))
    assert np.array_equal(y, bf16(x + delta))
    y64 = y.astype(np.float64)
    mean = y64.mean(1, keepdims=True)
    ref = (y64 - mean) / np.sqrt(((y64 - mean) ** 2).mean(1, keepdims=True) + eps)
    assert np.all(np.abs(h - ref) <= BF16_REL * np.abs(ref) + 1e-6)
    assert not h[5].any()


def test_op_records_with_bad_geometry_are_named(tmp_path, device):
    with pytest.raises(DeviceError, match=r"manifest.txt:\d+: seq=30 outside 1..block=16"):
        load_op(
            tmp_path / "a",
            lambda bw: write_clip_mha(
                bw, "m", heads=2, d=8, rows=32, block=16, seq=30, qscale=0.5
            ),  # fmt: skip
            device,
        )
    with pytest.raises(DeviceError, match=r"manifest.txt:\d+: `eps=-1.0` must be"):
        load_op(tmp_path / "b", lambda bw: write_addln(bw, "a", rows=4, dim=8, eps=-1), device)
    with pytest.raises(DeviceError, match=r"argument 0 is 64 bytes, the kernel reads 256"):
        kernel = load_op(
            tmp_path / "c", lambda bw: write_addln(bw, "a", rows=4, dim=32, eps=1e-5), device
        )
        device.run(kernel, [device.alloc(64)] * 4)


def test_gemm_with_k_a_multiple_of_tile_k_only(tmp_path, device):
    # CLIP's K is the tower width (1280 for ViT-H), not a multiple of flm.GEMM's 512
    k, n, m = 40, 120, 256
    tiles = gemm_tiling(k, n)
    assert tiles == {"tile_n": 40, "tile_k": 40, "ct_k": 40}
    rng = np.random.default_rng(4)
    w, bias = rng.standard_normal((k, n)).astype(np.float32), rng.standard_normal(n)
    packed = pack_gemm_b(w, bias.astype(np.float32), **tiles)
    with BundleWriter(tmp_path / "g", 1) as bw:
        write_xclbin(bw, "gemm")
        bw.file("kernels/g.bin", np.arange(16, dtype=np.uint32).tobytes())
        bw.record("gemm", "g", M=m, K=k, N=n, b_bytes=packed.nbytes, ctx="gemm",
                  insts="kernels/g.bin", bias=True, **tiles)  # fmt: skip
    bundle = Bundle.open(tmp_path / "g", version=1)
    kernel = device.load(kernel_spec(bundle, next(bundle.tagged("gemm"))))
    a = bf16(rng.standard_normal((m, k)))
    a_buf, c_buf = upload(device, a), device.alloc(m * n * 2)
    b_buf = device.alloc(packed.nbytes)
    b_buf.write(packed)
    device.to_device(b_buf)
    device.run(kernel, [a_buf, b_buf, c_buf])
    got = read(device, c_buf, (m, n))
    ref = a.astype(np.float64) @ w + bias
    # B is bfp16ebs8 (8-bit mantissas per block of 8): ~2^-7 relative error per weight
    assert np.abs(got - ref).max() <= 0.02 * np.abs(ref).max()
    assert gemm_tiling(1280, 3840) == {"tile_n": 64, "tile_k": 320, "ct_k": 80}


def test_fc2_bias_rides_an_extra_fc1_column():
    rng = np.random.default_rng(5)
    dim, mlp, out = 16, 40, 16
    fc1 = GemmWeights(rng.standard_normal((dim, mlp)).astype(np.float32),
                      rng.standard_normal(mlp).astype(np.float32), "gelu")  # fmt: skip
    fc2 = GemmWeights(rng.standard_normal((mlp, out)).astype(np.float32),
                      rng.standard_normal(out).astype(np.float32))  # fmt: skip
    new1, new2 = _mlp_weights(fc1, fc2)
    assert new1.w.shape == (dim, 64) and new2.w.shape == (64, out) and new2.bias is None
    x = rng.standard_normal((5, dim)).astype(np.float32)
    h = gelu(x @ new1.w + new1.bias)
    assert np.all(h[:, mlp] == BIAS_CARRIER) and not h[:, mlp + 1 :].any()
    ref = gelu(x @ fc1.w + fc1.bias) @ fc2.w + fc2.bias
    assert np.allclose(h @ new2.w, ref, rtol=1e-5, atol=1e-5)
    assert bf16(np.float32(BIAS_CARRIER)) == BIAS_CARRIER  # the column survives bf16 C
