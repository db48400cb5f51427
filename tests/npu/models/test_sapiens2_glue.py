"""The replay's host glue (npu/models/sapiens2/glue.py, model.stage_attention) against the
glue it replaced, bit for bit on random inputs: the staging, norms, residuals, deconv pairs
and scatter, InstanceNorm + SiLU and heatmap read of the replay before issue 14, kept here
verbatim as the reference (npu/models/sapiens2/model.py and npu.py at 1d2a137), then the
whole forward on the simulator against that replay's steps.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from sapiens2_torch_ref import tiny_sapiens2

import npu.models.sapiens2.model as s2model
from npu.bf16 import bf16_to_f32, f32_to_bf16, f32_to_bf16_into
from npu.models.sapiens2 import glue, kernels
from npu.models.sapiens2.checkpoint import from_pretrained
from npu.models.sapiens2.config import Config
from npu.models.sapiens2.export import write_sim_bundle
from npu.models.sapiens2.model import (
    Sapiens2Pose,
    deconv_pairs,
    deconv_scatter,
    instance_norm_silu,
    rms_norm,
)
from npu.models.sapiens2.npu import from_bundle, qkv_width
from npu.ops import LOG2E, run_gemm, run_mha
from npu.rows import RowPool

# -- the reference: the glue before issue 14, verbatim ---------------------------------------


def old_rope(x, cos, sin, prefix):
    patches = x[prefix:]
    half = patches.shape[-1] // 2
    rotated = np.concatenate([-patches[..., half:], patches[..., :half]], axis=-1)
    out = x.copy()
    out[prefix:] = patches * cos[:, None, :] + rotated * sin[:, None, :]
    return out


def old_stage_attention(qkv, cfg, kv, q_norm, k_norm, cos, sin):
    t, h, hd, d = len(qkv), cfg.heads, cfg.hd, cfg.D
    q = qkv[:, :d].reshape(t, h, hd)
    k = qkv[:, d : d + kv * hd].reshape(t, kv, hd)
    v = qkv[:, d + kv * hd : d + 2 * kv * hd].reshape(t, kv, hd)
    if cfg.qk_norm:
        q = rms_norm(q, cfg.eps) * q_norm
        k = rms_norm(k, cfg.eps) * k_norm
    out = np.empty((t, 3, h, hd), np.float32)
    out[:, 0] = old_rope(q, cos, sin, cfg.prefix) * np.float32(LOG2E / math.sqrt(hd))
    out[:, 1] = np.repeat(old_rope(k, cos, sin, cfg.prefix), h // kv, axis=1)
    out[:, 2] = np.repeat(v, h // kv, axis=1)
    return out.reshape(t, 3 * d)


def _put(flat, bits):
    """Flat.put before issue 14: bf16 bits copied into the mapping, then synced."""
    np.copyto(flat.host(bits.size), bits.reshape(-1))
    flat.written(bits.size)


class OldSteps:
    """The replay's Sapiens2Ops steps before issue 14 (npu.py at 1d2a137) on a replay's own
    buffers and kernels: every host write a whole f32_to_bf16 temporary, every dispatch run
    and waited alone; model.py's float32 glue (Sapiens2Pose._heatmap) around them."""

    def __init__(self, replay):
        self.r, self.config, self.backend = replay, replay.config, replay.backend
        self.flats = replay.flats

    def _gemm(self, key, weight):
        r = self.r
        rec, use = r.gemms[key], r.uses[key]
        run_gemm(r.device, r.kernels[key], rec, self.flats[use.a], r.weights[weight],
                 self.flats[use.c]).wait()  # fmt: skip
        return rec

    def _read_rows(self, rec, rows, cols):
        n = (rows - 1) * rec.c_stride + cols
        bits = self.flats["c"].bits(n)
        view = np.lib.stride_tricks.as_strided(bits, (rows, cols), (rec.c_stride * 2, 2))
        return bf16_to_f32(view)

    def patch(self, a):
        _put(self.flats["a"], f32_to_bf16(a))
        return self._read_rows(self._gemm("patch", "patch"), len(a), self.config.D)

    def attention(self, i, a, stage):
        cfg, r = self.config, self.r
        t, w = len(a), qkv_width(cfg, i)
        _put(self.flats["a"], f32_to_bf16(a))
        self._gemm(f"qkv{w}", f"{i}.qkv")
        qkv = bf16_to_f32(self.flats[f"qkv{w}"].bits(t * w)).reshape(t, w)
        _put(self.flats["stage"], f32_to_bf16(stage(qkv)))
        run_mha(r.device, r.kernels["mha"], r.mha, self.flats["stage"], self.flats["ao"]).wait()
        return self._read_rows(self._gemm("o", f"{i}.o"), t, cfg.D)

    def mlp(self, i, a):
        _put(self.flats["a"], f32_to_bf16(a))
        self._gemm("gu", f"{i}.gu")
        return self._read_rows(self._gemm("down", f"{i}.down"), len(a), self.config.D)

    def deconv(self, j, x):
        h0, w0 = x.shape[:2]
        _put(self.flats["a"], f32_to_bf16(deconv_pairs(x)))
        rec = self._gemm(f"d{j}", f"d{j}")
        windows = (h0 + 1) * (w0 + 2)
        rows = min(rec.rows, windows)
        out = np.zeros((windows, rec.n), np.float32)
        out[:rows] = self._read_rows(rec, rows, rec.n)
        return out

    def conv(self, j, y):
        _put(self.flats["a"], f32_to_bf16(y))
        return self._read_rows(self._gemm(f"c{j}", f"c{j}"), len(y), self.config.convs[j])

    def pred(self, y):
        _put(self.flats["a"], f32_to_bf16(y))
        return self._read_rows(self._gemm("pred", "pred"), len(y), self.config.K)


# -- pieces, on random inputs ----------------------------------------------------------------


@pytest.fixture(params=[1, 2], ids=["1 thread", "2 threads"])
def pool(request):
    return RowPool(request.param)


def _cfg(**kw) -> Config:
    base = dict(D=256, I=512, layers=2, heads=4, hd=64, kv_heads=(4, 2), regs=8, patch=16,
                H=320, W=256, eps=1e-6, in_eps=1e-5, up=(32, 16), convs=(16,), K=17)  # fmt: skip
    base.update(kw)
    return Config(**base)


def _bf16_rows(rng, shape, scale=1.0):
    return f32_to_bf16((rng.normal(size=shape) * scale).astype(np.float32))


def test_f32_to_bf16_into_equals_f32_to_bf16_on_every_kind_of_value():
    rng = np.random.default_rng(0)
    special = np.array([0x7F800001, 0x7FC00000, 0xFFFFFFFF, 0x7FFFFFFF, 0xFF800001, 0x7F812345,
                        0x7F7FFFFF, 0x80000000, 1, 0x7F800000, 0xFF800000, 0x3F808000,
                        0x3F818000, 0x00008000], np.uint32)  # fmt: skip
    bits = np.concatenate([rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32),
                           special])  # fmt: skip
    x = bits.view(np.float32)
    out = np.empty(x.shape, np.uint16)
    assert np.array_equal(f32_to_bf16_into(x, out), f32_to_bf16(x))
    finite = x[np.isfinite(x)][:1000].reshape(40, 25)
    strided = np.empty((40, 50), np.uint16)[:, ::2]  # a strided destination
    f32_to_bf16_into(finite, strided)
    assert np.array_equal(strided, f32_to_bf16(finite))


@pytest.mark.parametrize("kv", [4, 2, 1])
@pytest.mark.parametrize("qk_norm", [True, False])
def test_staged_rows_equal_the_old_staging_bit_for_bit(pool, kv, qk_norm):
    cfg = _cfg(qk_norm=qk_norm)
    rng = np.random.default_rng(kv)
    t, w = cfg.tokens, (cfg.heads + 2 * kv) * cfg.hd
    qkv = _bf16_rows(rng, (t, w), 3.0)
    # v's bits go across as they are, a NaN made quiet: signalling and quiet NaNs, an infinity
    # and -0 in v, and a signalling NaN in a q head, against the rounding rule of the old path
    qkv[5, -1], qkv[6, -2], qkv[7, -3], qkv[8, -4] = 0x7F81, 0xFFC1, 0x7F80, 0x8000
    qkv[9, 0] = 0x7F81
    qn, kn = (rng.normal(size=cfg.hd).astype(np.float32) for _ in range(2))
    cos, sin = s2model.rope_tables(cfg)
    want = f32_to_bf16(old_stage_attention(bf16_to_f32(qkv), cfg, kv, qn, kn, cos, sin))
    pre = cfg.prefix

    def stage(f, r0, r1, out):
        lo = max(r0, pre)
        return s2model.stage_attention(f, cfg, kv, qn, kn, cos[lo - pre : r1 - pre],
                                       sin[lo - pre : r1 - pre], lo - r0, out)  # fmt: skip

    got = np.full((t, 3 * cfg.D), 0xEEEE, np.uint16)
    list(glue.stage_rows(pool, qkv, got, stage))
    assert np.array_equal(got, want)
    whole = s2model.stage_attention(bf16_to_f32(qkv), cfg, kv, qn, kn, cos, sin)
    assert np.array_equal(f32_to_bf16(whole), want)


def test_patch_rows_equal_the_old_patch_staging_bit_for_bit():
    from npu.models.sapiens2 import kernels

    p, gh, gw = 4, 5, 3
    crop = (np.random.default_rng(5).normal(size=(3, gh * p, gw * p)) * 1e3).astype(np.float32)
    crop.reshape(-1)[:4] = [np.nan, np.inf, -0.0, 3.0e38]
    crop.view(np.uint32).reshape(-1)[4] = 0x7F800001  # a signalling NaN keeps its payload
    grid = crop.reshape(3, gh, p, gw, p).transpose(1, 3, 0, 2, 4)
    want = f32_to_bf16(np.ascontiguousarray(grid))
    got = np.full((gh, gw, 3, p, p), 0xEEEE, np.uint16)
    kernels.patches_bf16(crop.view(np.uint32), p, 0, 2, got[:2])
    kernels.patches_bf16(crop.view(np.uint32), p, 2, gh, got[2:])
    assert np.array_equal(got, want)


def test_rms_into_the_a_rows_and_residual_adds_equal_the_old_glue(pool):
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(3081, 1024)) * 4).astype(np.float32)
    got = np.empty(x.shape, np.uint16)
    glue.put_rms(pool, x, 1e-6, got)
    assert np.array_equal(got, f32_to_bf16(rms_norm(x, 1e-6)))
    c = np.full((3081, 1100), 0xEEEE, np.uint16)
    c[:, :1024] = _bf16_rows(rng, (3081, 1024))
    view = c[:, :1024]  # C read at a c_stride wider than D
    want = x + bf16_to_f32(view)
    glue.add_rows(pool, x, view)
    assert np.array_equal(x, want)


@pytest.mark.parametrize("biased", [False, True])
def test_a_residual_add_and_the_norm_after_it_in_one_pass_equal_the_old_glue(pool, biased):
    rng = np.random.default_rng(6)
    x = (rng.normal(size=(3081, 1024)) * 4).astype(np.float32)
    c = np.full((3081, 1100), 0xEEEE, np.uint16)
    c[:, :1024] = _bf16_rows(rng, (3081, 1024))
    view = c[:, :1024]  # C read at a c_stride wider than D
    bias = rng.normal(size=1024).astype(np.float32) if biased else None
    want_x = x + bf16_to_f32(view)
    if bias is not None:
        want_x += bias
    got = np.full(x.shape, 0xEEEE, np.uint16)
    glue.add_put_rms(pool, x, view, bias, 1e-6, got)
    assert np.array_equal(x, want_x)
    assert np.array_equal(got, f32_to_bf16(rms_norm(want_x, 1e-6)))


def _head_case(rng, h0, w0, c_in, c_out, bias):
    """A deconv's C as the device leaves it (uint16 at row stride N; the old glue added a
    host bias to all N columns, so N = 4·C_out then, else wider) and the scattered rows."""
    n = 4 * c_out + (0 if bias is not None else 16)
    rows = h0 * (w0 + 2) + w0 + 1
    c = _bf16_rows(rng, (rows * n,))
    full = np.zeros(((h0 + 1) * (w0 + 2), n), np.float32)
    full[:rows] = bf16_to_f32(c).reshape(rows, n)
    if bias is not None:
        full = full + bias[: 4 * c_out]
    want = deconv_scatter(full[:, : 4 * c_out], h0, w0, c_out)
    return c, n, want


@pytest.mark.parametrize("biased", [False, True])
def test_deconv_scatter_and_instance_norm_silu_into_pairs_equal_the_old_glue(pool, biased):
    rng = np.random.default_rng(2)
    h0, w0, co = 12, 10, 24
    bias = rng.normal(size=4 * co + 8).astype(np.float32) if biased else None
    c, n, want_y = _head_case(rng, h0, w0, 32, co, bias)
    # the scatter's rows, read in place from C: model.deconv_scatter's (with the bias)
    offs, boffs = glue.deconv_rows(h0, w0, n, co)
    y = np.empty((4 * h0 * w0, co), np.float32)
    kernels.gather_rows(c, offs, np.empty(0, np.float32) if bias is None else bias, boffs, y)
    assert np.array_equal(y, want_y.reshape(-1, co))
    # InstanceNorm + SiLU of those rows into the next deconv's pairs, over stale bits
    want = f32_to_bf16(deconv_pairs(instance_norm_silu(want_y.reshape(-1, co), 1e-5)
                                    .reshape(2 * h0, 2 * w0, co)))  # fmt: skip
    a = np.full(want.size + 100, 0xBEEF, np.uint16)
    pairs = glue.pairs_view(a, 2 * h0, 2 * w0, co)
    glue.zero_pair_pads(pairs)
    list(glue.instance_norm_silu_to(pool, c, offs, bias, boffs, co, 1e-5, 2 * w0,
                                    glue.pair_writer(pairs)))  # fmt: skip
    assert np.array_equal(a[: want.size], want.reshape(-1))
    assert (a[want.size :] == 0xBEEF).all()


def test_conv_rows_instance_norm_silu_and_heatmaps_equal_the_old_glue(pool):
    rng = np.random.default_rng(3)
    px, co, c_stride, k = 3000, 40, 64, 17
    c = _bf16_rows(rng, (px * c_stride,), 2.0)
    view = np.lib.stride_tricks.as_strided(c, (px, co), (c_stride * 2, 2))
    old_y = bf16_to_f32(view)
    want = f32_to_bf16(instance_norm_silu(old_y, 1e-5))
    y = np.empty((px, co), np.float32)
    list(glue.read_rows(pool, view, y))
    assert np.array_equal(y, old_y)
    a = np.full(px * co + 10, 0xBEEF, np.uint16)
    offs = glue.conv_rows(px, c_stride)
    list(glue.instance_norm_silu_to(pool, c, offs, None, None, co, 1e-5, 1,
                                    glue.dense_writer(a, co)))  # fmt: skip
    assert np.array_equal(a[: px * co], want.reshape(-1)) and (a[px * co :] == 0xBEEF).all()
    hm = np.empty((k, px), np.float32)
    list(glue.heatmaps_into(pool, c, px, c_stride, hm))
    pred = np.lib.stride_tricks.as_strided(c, (px, k), (c_stride * 2, 2))
    assert np.array_equal(hm, bf16_to_f32(pred).T)


def test_instance_norm_silu_over_many_chunks_equals_the_reference_on_any_thread_count(pool):
    # 20000 px x 8 channels: chunks of 16384 rows (whole sum blocks), so two chunks, on
    # one or two threads, the last block short; the same bits as model.instance_norm_silu
    rng = np.random.default_rng(6)
    c = _bf16_rows(rng, (20000 * 8,), 2.0)
    want = f32_to_bf16(instance_norm_silu(bf16_to_f32(c).reshape(-1, 8), 1e-5))
    a = np.full(c.size, 0xBEEF, np.uint16)
    list(glue.instance_norm_silu_to(pool, c, glue.conv_rows(20000, 8), None, None, 8, 1e-5, 1,
                                    glue.dense_writer(a, 8)))  # fmt: skip
    assert np.array_equal(a, want.reshape(-1))


def test_instance_norm_silu_refuses_rows_past_the_end_of_c(pool):
    c = np.zeros(100 * 8 - 1, np.uint16)  # one value short of 100 rows of 8
    a = np.zeros(100 * 8, np.uint16)
    with pytest.raises(ValueError, match="offset 792 \\+ 8 of a C of 799"):
        list(glue.instance_norm_silu_to(pool, c, glue.conv_rows(100, 8), None, None, 8, 1e-5,
                                        1, glue.dense_writer(a, 8)))  # fmt: skip
    assert not a.any()


def test_final_norm_into_the_first_deconvs_pairs_equals_the_old_glue(pool):
    rng = np.random.default_rng(4)
    gh, gw, d = 16, 12, 64
    x = (rng.normal(size=(gh * gw, d)) * 3).astype(np.float32)
    want = f32_to_bf16(deconv_pairs(rms_norm(x, 1e-6).reshape(gh, gw, d)))
    a = np.full(want.size, 0xBEEF, np.uint16)
    pairs = glue.pairs_view(a, gh, gw, d)
    glue.zero_pair_pads(pairs)
    glue.rms_rows_to(pool, x, 1e-6, gw, glue.pair_writer(pairs))
    assert np.array_equal(a, want.reshape(-1))


# -- the whole forward on the simulator ------------------------------------------------------


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """The tiny random HF model at 128 x 96 (an MHA and a GQA layer), as format 1 and as
    format 2 with both host biases (random deconv bias, so the host adds it)."""
    from npu.ops import GemmWeights

    path = tmp_path_factory.mktemp("s2glue")
    tiny_sapiens2(0, image_size=[128, 96]).save_pretrained(path / "tiny")
    cpu = from_pretrained(path / "tiny")
    weights = dict(cpu.weights)
    d0 = weights["d0"]
    rng = np.random.default_rng(5)
    weights["d0"] = GemmWeights(d0.w, rng.normal(size=d0.w.shape[1]).astype(np.float32))
    biased = Sapiens2Pose(cpu.config, cpu.ops, cpu.host, weights=weights)
    return {
        "v1": write_sim_bundle(cpu, path / "v1"),
        "v2": write_sim_bundle(biased, path / "v2", version=2, host_bias=("down", "deconv")),
    }


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_replay_computes_what_the_old_replay_did_bit_for_bit(bundles, tmp_path, version,
                                                                 monkeypatch):  # fmt: skip
    from npu.sim import SimDevice

    dev = SimDevice(registry_dir=tmp_path / "hwctx")
    try:
        model = from_bundle(bundles[version], dev)
        cfg = model.config
        crops = np.random.default_rng(6).normal(size=(2, 3, cfg.H, cfg.W)).astype(np.float32)
        got = model.heatmaps(crops)
        got_features = model.features(crops[0])
        with monkeypatch.context() as m:
            m.setattr(s2model, "stage_attention", old_stage_attention)
            old = Sapiens2Pose(cfg, OldSteps(model.ops), model.host)
            want = old.heatmaps(crops)
            want_features = old.features(crops[0])
        assert np.array_equal(got, want)
        assert np.array_equal(got_features, want_features)
    finally:
        dev.close()


def test_forwards_interleaved_in_small_pieces_each_equal_the_forward_alone(
    bundles, tmp_path, monkeypatch
):
    # as many crops as the replay has slots (npu.device.INTERLEAVE) started together (no
    # staggering), host steps cut into pieces of a few values, so that each forward's head
    # resumes between the others' head pieces: each must still get its own heatmaps bit for
    # bit (no host scratch shared between forwards in flight)
    from npu.device import INTERLEAVE
    from npu.sim import SimDevice
    from stages.device_thread import Interleaved

    dev = SimDevice(registry_dir=tmp_path / "hwctx")
    try:
        model = from_bundle(bundles["v2"], dev)
        cfg = model.config
        n = len(model.ops.slots)
        assert n == INTERLEAVE >= 3
        crops = np.random.default_rng(7).normal(size=(n, 3, cfg.H, cfg.W)).astype(np.float32)
        want = [model.heatmaps(c[None])[0] for c in crops]
        monkeypatch.setattr(glue, "PIECE_ELEMS", 64)
        for _ in range(2):
            got: dict[int, np.ndarray] = {}
            active = Interleaved()
            for i, crop in enumerate(crops):
                done = lambda out, err, i=i, got=got: got.__setitem__(i, err or out)  # noqa: E731
                active.add(model.ops.heatmap_steps(crop), done)
            while len(active):
                active.step()
            assert all(np.array_equal(got[i], want[i]) for i in range(n))
        assert not np.array_equal(want[0], want[1])
    finally:
        dev.close()
