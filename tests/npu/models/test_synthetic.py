"""npu.models.synthetic: the tiny models keep the real interfaces, are deterministic, need no
torch, and their sim bundles (written once) compute what the cpu models compute.

Tolerances: the sim runs bf16 operands and bfp16 GEMM weights against the cpu's float32, so
the two agree to cosine >= 0.99 per output (the gate npu.models.adaface_steps uses against
fp32), not elementwise.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from npu.models import synthetic
from npu.models.adaface import synthetic as ada_synthetic
from npu.models.sapiens2 import synthetic as s2_synthetic
from npu.sim import SimDevice


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("synthetic-cache")


@pytest.fixture(scope="module")
def device(tmp_path_factory):
    dev = SimDevice(registry_dir=tmp_path_factory.mktemp("hwctx"))
    yield dev
    dev.close()


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_sapiens2_interface_and_determinism():
    model = s2_synthetic.build()
    cfg = model.config
    assert (cfg.K, cfg.H, cfg.W) == (308, 256, 192)
    x = np.random.default_rng(0).standard_normal((1, 3, 256, 192)).astype(np.float32)
    maps = model.heatmaps(x)
    assert maps.shape == (1, 308, 64, 48) and maps.dtype == np.float32
    assert np.isfinite(maps).all() and maps.std() > 0
    np.testing.assert_array_equal(maps, s2_synthetic.build().heatmaps(x))
    other = s2_synthetic.build(seed=99).heatmaps(x)
    assert not np.allclose(maps, other)


def test_adaface_interface_and_determinism():
    model = ada_synthetic.build()
    assert model.embed_dim() == 512 and model.colour_order() == "rgb"
    x = np.random.default_rng(1).uniform(-1, 1, (3, 112, 112)).astype(np.float32)
    e = model.embed(x)
    assert e.shape == (512,) and e.dtype == np.float32 and np.isfinite(e).all()
    np.testing.assert_array_equal(e, ada_synthetic.build().embed(x))
    # different faces give different embeddings (the network is not degenerate)
    assert _cos(e, model.embed(-x)) < 0.999


def test_clip_interface_real_tokenizer(cache):
    model = synthetic.load("clip", "cpu", cache=cache)
    tok = model.tokenizer
    assert tok.vocab_size == 49408
    # CLIP's ids for this prompt (openai/clip-vit-base-patch32's tokenizer)
    assert tok.encode("a photo of a cat") == [49406, 320, 1125, 539, 320, 2368, 49407]
    assert (model.towers.v_batch, model.towers.t_batch) == (4, 8)
    rgb = np.random.default_rng(2).integers(0, 256, (90, 120, 3), dtype=np.uint8)
    image = model.encode_images(model.pixels([rgb, rgb[::-1]]))
    assert image.shape == (2, 64) and np.isfinite(image).all()
    text = model.label_embeddings(["person", "car", "dog"])
    assert text.shape == (3, 64)
    z = model.classify([rgb], ["person", "car"])
    np.testing.assert_allclose(z.probs.sum(axis=1), 1.0, rtol=1e-5)


def test_sim_bundles_match_cpu_models(cache, device):
    rng = np.random.default_rng(3)
    pose_in = rng.standard_normal((1, 3, 256, 192)).astype(np.float32)
    cpu = s2_synthetic.build().heatmaps(pose_in)
    sim = synthetic.load("sapiens2", "sim", device, cache=cache).heatmaps(pose_in)
    assert sim.shape == cpu.shape and _cos(sim, cpu) > 0.99

    face_in = rng.uniform(-1, 1, (3, 112, 112)).astype(np.float32)
    cpu_e = ada_synthetic.build().embed(face_in)
    sim_face = synthetic.load("adaface", "sim", device, cache=cache)
    assert sim_face.backend() == "sim" and sim_face.embed_dim() == 512
    assert _cos(sim_face.embed(face_in), cpu_e) > 0.99

    clip_cpu = synthetic.load("clip", "cpu", cache=cache)
    clip_sim = synthetic.load("clip", "sim", device, cache=cache)
    assert clip_sim.backend == "sim" and clip_sim.towers.v_batch == 4
    pixels = rng.standard_normal((4, 3, 224, 224)).astype(np.float32)
    a, b = clip_cpu.encode_images(pixels), clip_sim.encode_images(pixels)
    for i in range(4):
        assert _cos(a[i], b[i]) > 0.99
    ta, tb = clip_cpu.label_embeddings(["a car"]), clip_sim.label_embeddings(["a car"])
    assert _cos(ta, tb) > 0.99


def test_bundle_written_once(cache):
    path = synthetic.bundle_path("sapiens2", cache)
    stamp = (path / "manifest.txt").stat().st_mtime_ns
    assert synthetic.bundle_path("sapiens2", cache) == path
    assert (path / "manifest.txt").stat().st_mtime_ns == stamp
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_bad_requests_are_named_errors(cache):
    with pytest.raises(synthetic.SyntheticError, match="no synthetic model 'yolo'"):
        synthetic.load("yolo", "cpu")
    with pytest.raises(synthetic.SyntheticError, match="cpu or sim only"):
        synthetic.load("adaface", "npu", cache=cache)


def test_no_torch_at_run_time():
    code = (
        "import sys, numpy as np\n"
        "from npu.models.sapiens2 import synthetic as s2\n"
        "from npu.models.adaface import synthetic as ada\n"
        "from npu.models.clip import synthetic as clip\n"
        "s2.build().heatmaps(np.zeros((1, 3, 256, 192), np.float32))\n"
        "ada.build().embed(np.zeros((3, 112, 112), np.float32))\n"
        "clip.state_dict()\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
