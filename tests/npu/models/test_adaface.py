"""The cpu AdaFace forward against a torch IR network (docs/face-id.md) built in the test.

Tolerance: cosine >= 0.99999 (the issue's gate). Both run in float32; BN folding and the
im2col GEMM order change rounding only, so in practice the cosine is ~1 - 1e-9.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from adaface_torch_ref import save_cvlface_dir, tiny_ir  # beside this file

from npu.models.adaface.checkpoint import from_pretrained as load_adaface
from npu.models.adaface.checkpoint import lower_iresnet
from npu.models.adaface.config import AdaFaceError
from npu.models.adaface.model import Head, IrProgram, Subsample, run_program
from npu.models.adaface.post import cosine, l2_normalize
from npu.ops import NumpyOps

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    net = tiny_ir(seed=1)
    path = save_cvlface_dir(net, tmp_path_factory.mktemp("ir") / "tiny", name="IR-tiny")
    return net, path


def _torch_embed(net, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return net(torch.from_numpy(x)[None]).numpy()[0]


def test_cpu_forward_matches_torch(tiny):
    net, path = tiny
    model = load_adaface(path)
    assert model.program.units == (1, 1, 1, 1)
    assert model.program.widths == (8, 16, 24, 32)
    assert model.embed_dim() == 512 and model.colour_order() == "rgb"
    assert model.model() == "IR-tiny" and model.backend() == "cpu"
    assert model.fingerprint().startswith("IR-tiny:")
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = rng.uniform(-1, 1, (3, 112, 112)).astype(np.float32)
        ours, ref = model.embed(x), _torch_embed(net, x)
        assert ours.dtype == np.float32 and ours.shape == (512,)
        assert cosine(ours, ref) >= 0.99999
        np.testing.assert_allclose(ours, ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())


def test_two_units_per_stage_and_no_prefix_and_bgr_config(tmp_path):
    net = tiny_ir(seed=2, stem=8, widths=(8, 16, 16 + 8, 32), units=(2, 2, 1, 2))
    path = save_cvlface_dir(net, tmp_path / "m", prefix="", color_space="BGR")
    model = load_adaface(path)
    assert model.program.units == (2, 2, 1, 2)
    assert model.colour_order() == "bgr"
    x = np.random.default_rng(1).uniform(-1, 1, (3, 112, 112)).astype(np.float32)
    assert cosine(model.embed(x), _torch_embed(net, x)) >= 0.99999


def test_normalized_embedding_and_cosine_helpers(tiny):
    model = load_adaface(tiny[1])
    x = np.zeros((3, 112, 112), np.float32)
    e = model.embed_normalized(x)
    assert abs(np.linalg.norm(e) - 1.0) < 1e-5
    assert cosine(np.zeros(4), np.ones(4)) == 0.0
    np.testing.assert_array_equal(l2_normalize(np.zeros((2, 3))), np.zeros((2, 3)))


def test_bad_inputs_and_checkpoints_are_clear_errors(tiny, tmp_path):
    model = load_adaface(tiny[1])
    with pytest.raises(AdaFaceError, match=r"\[3, 112, 112\]"):
        model.embed(np.zeros((3, 100, 100), np.float32))
    with pytest.raises(AdaFaceError, match="NaN"):
        model.embed(np.full((3, 112, 112), np.nan, np.float32))
    with pytest.raises(AdaFaceError, match="no such model"):
        load_adaface(tmp_path / "missing")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(AdaFaceError, match="cannot read safetensors"):
        load_adaface(bad)
    from safetensors.numpy import save_file

    other = tmp_path / "other"
    other.mkdir()
    save_file({"encoder.weight": np.zeros((2, 2), np.float32)}, str(other / "model.safetensors"))
    with pytest.raises(AdaFaceError, match="not a cvlface iresnet"):
        load_adaface(other)


def _sd(net) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in net.state_dict().items()}


def test_a_stage_keeping_its_predecessors_width_has_stride_2(tmp_path):
    """Stage 2 keeps stage 1's width (16 -> 16): its first unit has a MaxPool2d(1, 2) shortcut
    and no weights that say stride 2. Guessing "stride 2 iff the width changes" gets it wrong;
    the lowering refuses to guess and takes the stage layout from config.json's units."""
    net = tiny_ir(seed=6, stem=8, widths=(16, 16, 24, 32), units=(2, 1, 1, 1))
    with pytest.raises(AdaFaceError, match="only 3 stage starts.*give config.json units"):
        lower_iresnet(_sd(net))
    path = save_cvlface_dir(net, tmp_path / "m", units=[2, 1, 1, 1])
    model = load_adaface(path)
    assert model.program.units == (2, 1, 1, 1) and model.program.widths == (16, 16, 24, 32)
    subsampled = [s.src for s in model.program.steps if isinstance(s, Subsample)]
    assert subsampled == ["u0.c2", "x0", "u2.c2", "u1.out", "u3.c2", "u2.out", "u4.c2", "u3.out"]
    x = np.random.default_rng(3).uniform(-1, 1, (3, 112, 112)).astype(np.float32)
    assert cosine(model.embed(x), _torch_embed(net, x)) >= 0.99999


def test_stage_layout_errors_name_the_unit_or_the_config(tmp_path):
    net = tiny_ir(seed=6, stem=8, widths=(16, 16, 24, 32), units=(2, 1, 1, 1))
    with pytest.raises(AdaFaceError, match="do not add up to the 5 body units"):
        lower_iresnet(_sd(net), units=(2, 2, 1, 1))
    with pytest.raises(AdaFaceError, match="body.4 changes width mid-stage"):
        lower_iresnet(_sd(net), units=(1, 2, 2))
    with pytest.raises(AdaFaceError, match="3 stages halve 112 to 14"):
        lower_iresnet(_sd(net), units=(3, 1, 1))
    bad = save_cvlface_dir(net, tmp_path / "m", units=[2, "1"])
    with pytest.raises(AdaFaceError, match="units must be a list of positive integers"):
        load_adaface(bad)
    # IR-18's layout: the first stage keeps the stem's width, and that is unit 0: no config
    ir18 = lower_iresnet(_sd(tiny_ir(seed=2, stem=8, widths=(8, 16, 24, 32), units=(2,) * 4)))
    assert ir18.units == (2, 2, 2, 2)


def test_subsample_keeps_floor_h_over_stride_rows_as_the_bundle_step():
    """docs/adaface-bundle.md §1: subsample output is (c, h/stride, w/stride) with integer
    division; an odd side loses its last row and column (ceil would give 4x4 here)."""
    x = np.arange(3 * 7 * 7, dtype=np.float32).reshape(3, 7, 7)
    k = 3 * 3 * 3
    program = IrProgram(
        "sub",
        (),
        (),
        [
            Subsample("input", "s", 2),
            Head("s", np.eye(k, dtype=np.float32), np.zeros(k, np.float32)),
        ],
    )
    out = run_program(program, x, NumpyOps({}))
    np.testing.assert_array_equal(out, x[:, 0:6:2, 0:6:2].reshape(-1))
