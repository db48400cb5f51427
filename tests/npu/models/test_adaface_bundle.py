"""The AdaFace bundle step interpreter (spec a.2-a.3) on the simulated device.

A tiny IR network built in torch is lowered, exported as a sim bundle (conv weights in the
simulator's bf16 [oc, icg, k, k] layout) and replayed: it must match the torch forward with
cosine >= 0.999 (bf16 activations cost ~1e-5 here; the issue's gate). The numerics rules
(tiled layout, per-group bf16 partials, two roundings in prelu_bias) are checked directly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from adaface_torch_ref import tiny_ir  # beside this file
from ml_dtypes import bfloat16

from npu.bundle_writer import BundleWriter
from npu.models.adaface import (
    AdaFaceBundle,
    AdaFaceError,
    Conv,
    Head,
    IrProgram,
    PreluBias,
    cosine,
    from_tiled,
    lower_iresnet,
    to_tiled,
    write_sim_bundle,
)
from npu.sim import SimDevice, write_xclbin
from pipeline.errors import NpucamError

torch.set_num_threads(1)


def _bf16(x) -> np.ndarray:
    return np.asarray(x, np.float32).astype(bfloat16).astype(np.float32)


@pytest.fixture
def device(tmp_path):
    dev = SimDevice(registry_dir=tmp_path / "hwctx")
    yield dev
    dev.close()


def test_tiled_layout_is_the_spec_formula():
    c, h, w = 16, 3, 5
    chw = np.arange(c * h * w, dtype=np.float32).reshape(c, h, w)
    flat = to_tiled(chw).reshape(-1)
    for ch, y, x in [(0, 0, 0), (9, 2, 4), (15, 1, 3), (7, 0, 1)]:
        assert flat[((y * (c // 8) + ch // 8) * w + x) * 8 + ch % 8] == chw[ch, y, x]
    np.testing.assert_array_equal(from_tiled(to_tiled(chw)), chw)


def test_sim_bundle_of_a_tiny_ir_matches_torch(tmp_path, device):
    net = tiny_ir(seed=3, widths=(16, 32, 48, 64))
    program = lower_iresnet({k: v.numpy() for k, v in net.state_dict().items()}, "IR-tiny")
    x = np.random.default_rng(0).uniform(-1, 1, (3, 112, 112)).astype(np.float32)
    root = write_sim_bundle(program, tmp_path / "b", x, group=16)
    model = AdaFaceBundle.load(root, device)
    assert model.input_dims == (8, 112, 112) and model.embed_dim == 512
    assert model.model == "IR-tiny" and model.backend == "sim"
    assert model.num_conv_dispatches == 1 + 2 + 4 + 6 + 9 + 3  # groups of 16 channels
    with torch.no_grad():
        ref = net(torch.from_numpy(x)[None]).numpy()[0]
    e = model.embed(x)
    assert cosine(e, ref) >= 0.999
    np.testing.assert_array_equal(model.embed_recorded(), e)  # the recorded input replays
    y = np.random.default_rng(1).uniform(-1, 1, (3, 112, 112)).astype(np.float32)
    with torch.no_grad():
        assert cosine(model.embed(y), net(torch.from_numpy(y)[None]).numpy()[0]) >= 0.999
    # the device really ran every dispatch, in the contexts the bundle names
    assert device.sim.kernels["conv@9"].dispatches == 3
    assert len(device.resident_contexts()) <= 16


def _two_group_program(rng) -> IrProgram:
    w1 = rng.normal(0, 0.3, (16, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (16, 16, 3, 3)).astype(np.float32)
    alpha = rng.uniform(0, 0.5, 16).astype(np.float32)
    bias = rng.normal(0, 0.3, 16).astype(np.float32)
    k = 16 * 112 * 112
    bT = rng.normal(0, 0.01, (k, 4)).astype(np.float32)
    steps = [
        Conv("input", "a", "c1", w1),
        PreluBias("a", alpha, bias),
        Conv("a", "b", "c2", w2),
        Head("b", bT, np.zeros(4, np.float32)),
    ]
    return IrProgram("two-groups", (), (), steps)


def test_each_group_partial_is_rounded_to_bf16_before_the_f32_sum(tmp_path, device):
    rng = np.random.default_rng(7)
    program = _two_group_program(rng)
    x = rng.uniform(-1, 1, (3, 112, 112)).astype(np.float32)
    model = AdaFaceBundle.load(write_sim_bundle(program, tmp_path / "b", x, group=8), device)
    trace: dict = {}
    model.embed(x, trace)

    # independent reference in float64 torch convs on the bf16 values the device sees
    xin = _bf16(np.concatenate([x, np.zeros((5, 112, 112), np.float32)]))
    w1 = np.concatenate([program.steps[0].weight, np.zeros((16, 5, 3, 3), np.float32)], 1)
    conv = lambda a, w: torch.nn.functional.conv2d(  # noqa: E731
        torch.from_numpy(a.astype(np.float64))[None],
        torch.from_numpy(_bf16(w).astype(np.float64)),
        padding=1,
    )[0].numpy()
    a = _bf16(conv(xin, w1))  # one group (8 input channels): one rounding
    t = _bf16(a + _bf16(program.steps[1].bias)[:, None, None])
    a = _bf16(np.where(t < 0, _bf16(program.steps[1].alpha)[:, None, None] * t, t))
    np.testing.assert_array_equal(from_tiled(trace["a"]), a)  # prelu_bias's two roundings

    w2 = program.steps[2].weight
    p0, p1 = conv(a[:8], w2[:, :8]), conv(a[8:], w2[:, 8:])
    two = _bf16(_bf16(p0).astype(np.float32) + _bf16(p1))
    one = _bf16(p0 + p1)
    got = from_tiled(trace["b"])
    assert np.mean(two != one) > 0.05  # the rules are distinguishable on this data
    assert np.mean(got == two) > 0.999  # f32 vs f64 partials may flip a rare bf16 tie
    assert np.mean(got == one) < np.mean(got == two) - 0.05


def _bundle(tmp_path, lines_fn):
    with BundleWriter(tmp_path / "bad", version=1) as wr:
        write_xclbin(wr, "k")
        wr.file("kernels/k.bin", np.arange(4, dtype=np.uint32).tobytes())
        wr.tensor("ref.input", np.zeros(8 * 4 * 4, np.float32), "bf16")
        wr.tensor("wt", np.zeros(8 * 8 * 9, np.float32), "bf16")
        wr.tensor("bT", np.zeros(8 * 16 * 2, np.float32), "bf16")
        wr.tensor("b2", np.zeros(2, np.float32), "f32")
        wr.tensor("s8", np.zeros(8, np.float32), "f32")
        lines_fn(wr)
    return tmp_path / "bad"


GOOD_CONV = ("x", 8, 4, 4, 0, 8, 4, 8, 4, 4, 4, "k", "kernels/k.bin", "wt", "y", 1, 1)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda wr: None, "no input step"),
        (lambda wr: wr.record("conv", *GOOD_CONV), "manifest.txt:3: buffer x is not defined"),
        (
            lambda wr: (
                wr.record("input", "x", 8, 4, 4, "ref.input"),
                wr.record("conv", *GOOD_CONV),
            ),
            "last step must be a head",
        ),
        (
            lambda wr: wr.record("input", "x", 6, 4, 4, "ref.input"),
            "manifest.txt:3: input channels 6",
        ),
        (
            lambda wr: (
                wr.record("input", "x", 8, 4, 4, "ref.input"),
                wr.record("conv", *GOOD_CONV[:5], 4, *GOOD_CONV[6:]),
            ),
            "manifest.txt:4: icg 4",
        ),
        (
            lambda wr: (
                wr.record("input", "x", 8, 4, 4, "ref.input"),
                wr.record("conv", "nope", *GOOD_CONV[1:]),
            ),
            "buffer nope is not defined",
        ),
        (
            lambda wr: (
                wr.record("input", "x", 8, 4, 4, "ref.input"),
                wr.record("bias", "x", 8, 4, 4, "s8"),
            ),
            "manifest.txt:4: tensor s8 is",
        ),
        (
            lambda wr: (
                wr.record("input", "x", 8, 4, 4, "ref.input"),
                wr.record("head", "x", 8, 4, 4, 100, 2, "bT", "b2"),
            ),
            "head k 100 != c\\*h\\*w 128",
        ),
        (lambda wr: wr.record("dance", "x"), "unknown AdaFace step 'dance'"),
    ],
)
def test_malformed_bundles_name_the_line(tmp_path, device, build, match):
    with pytest.raises(NpucamError, match=match):
        AdaFaceBundle.load(_bundle(tmp_path, build), device)


def test_embed_input_checks(tmp_path, device):
    root = _bundle(
        tmp_path,
        lambda wr: (
            wr.record("input", "x", 8, 4, 4, "ref.input"),
            wr.record("conv", *GOOD_CONV[:14], "x2", 1, 1),
            wr.record("head", "x2", 8, 4, 4, 128, 2, "bT", "b2"),
        ),
    )
    model = AdaFaceBundle.load(root, device)
    assert model.embed(np.ones((3, 4, 4), np.float32)).shape == (2,)
    with pytest.raises(AdaFaceError, match="c x 4 x 4 with c <= 8"):
        model.embed(np.ones((9, 4, 4), np.float32))
    with pytest.raises(AdaFaceError, match="c x 4 x 4"):
        model.embed(np.ones(17, np.float32))
    with pytest.raises(AdaFaceError, match="NaN"):
        model.embed(np.full((3, 4, 4), np.nan, np.float32))


def test_hardware_weight_layout_is_refused_by_the_simulator(tmp_path, device):
    def build(wr):
        wr.tensor("hw.wt", np.zeros(100, np.float32), "bf16")  # not oc*icg*k*k
        wr.record("input", "x", 8, 4, 4, "ref.input")
        wr.record("conv", *GOOD_CONV[:13], "hw.wt", "x2", 1, 1)
        wr.record("head", "x2", 8, 4, 4, 128, 2, "bT", "b2")

    model = AdaFaceBundle.load(_bundle(tmp_path, build), device)
    with pytest.raises(NpucamError, match="manifest.txt:4: conv weights are not the simulator"):
        model.embed(np.ones((3, 4, 4), np.float32))
