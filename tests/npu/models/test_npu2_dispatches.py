"""npu.models.<model>.npu2: the released models' dispatch lists are the ones each model's
replay makes. Applied to the synthetic models' own configs, each list must equal what the
simulator records when the synthetic model's bundle actually runs (kernel order, keys,
shapes and FLOPs), so at the released sizes it lists what the real model dispatches."""

from __future__ import annotations

import numpy as np
import pytest

from npu.bundle import Bundle
from npu.models import synthetic
from npu.models.adaface import npu2 as adaface_npu2
from npu.models.adaface import synthetic as ada_synthetic
from npu.models.clip import npu2 as clip_npu2
from npu.models.clip import synthetic as clip_synthetic
from npu.models.clip.config import ClipConfig
from npu.models.sapiens2 import npu2 as s2_npu2
from npu.models.sapiens2 import synthetic as s2_synthetic
from npu.sim import SimDevice
from npu.sim_cost import round_up


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("synthetic-cache")


@pytest.fixture
def recording(tmp_path):
    """A sim device and the (kernel key, kind, modelled FLOPs) of every dispatch it starts."""
    dev = SimDevice(registry_dir=tmp_path / "hwctx")
    seen: list[tuple[str, str, int]] = []
    start = dev.start

    def record(kernel, buffers):
        seen.append((kernel.spec.key, kernel.spec.kind, kernel.model.flops))
        return start(kernel, buffers)

    dev.start = record  # type: ignore[method-assign]
    yield dev, seen
    dev.close()


def test_adaface_list_is_the_synthetic_bundles_conv_dispatches(cache, recording):
    dev, seen = recording
    model = synthetic.load("adaface", "sim", dev, cache=cache)
    seen.clear()
    model.embed(np.random.default_rng(0).uniform(-1, 1, (3, 112, 112)).astype(np.float32))
    units = (1,) * len(ada_synthetic.WIDTHS)
    listed = adaface_npu2.dispatches(units, ada_synthetic.WIDTHS, ada_synthetic.STEM)
    assert [(d.key, int(d.flops)) for d in listed] == [(k, f) for k, _, f in seen]
    assert len(listed) == model.num_conv_dispatches()


def test_clip_lists_are_the_synthetic_towers_dispatches(cache, recording):
    dev, seen = recording
    model = synthetic.load("clip", "sim", dev, cache=cache)
    path = synthetic.bundle_path("clip", cache)
    cfg = ClipConfig.from_json(clip_synthetic.checkpoint_path(cache) / "config.json")
    bundle = Bundle.open(path)
    v_stride = bundle.param("v_stride", int)
    bundle.close()
    listed = clip_npu2.dispatches(cfg, v_stride=v_stride)
    seen.clear()
    model.encode_images(np.zeros((4, 3, 224, 224), np.float32))
    images = list(seen)
    seen.clear()
    model.encode_texts(model.tokenizer(["a photo of a person"] * 8)[0])
    for got, want in ((images, listed["images"]), (list(seen), listed["texts"])):
        assert [k for k, _, _ in got] == [d.key for d in want]
        for (key, kind, flops), d in zip(got, want, strict=True):
            # the sim counts AddLN as 8 rows x dim "FLOPs": the list's 8 rows x dim bytes
            assert flops == (d.nbytes if kind == "addln" else d.flops), key


def test_sapiens2_list_is_the_synthetic_forwards_dispatches(cache, recording):
    dev, seen = recording
    model = synthetic.load("sapiens2", "sim", dev, cache=cache)
    cfg = s2_synthetic.config()
    seen.clear()
    model.heatmaps(np.zeros((1, 3, cfg.H, cfg.W), np.float32))
    listed = s2_npu2.dispatches(cfg)
    assert [k for k, _, _ in seen] == [d.key for d in listed]
    bundle = Bundle.open(synthetic.bundle_path("sapiens2", cache))
    records = {r.fields[0]: r for r in bundle.tagged("gemm")}
    mha = next(bundle.tagged("mha"))
    for d in listed:
        if d.family == "s2_mha":  # taconite's mha record carries no geometry: the config does
            heads, _, rows, _, hd = d.dims
            assert (heads, hd) == (cfg.heads, cfg.hd)
            assert rows == round_up(cfg.tokens, s2_npu2.MHA_ROW_ALIGN)
            # q, k and v are views of one token-major [tokens, 3·D] buffer; o is [tokens, D]
            assert mha.get("q_elems", int) == cfg.tokens * 3 * cfg.D
            assert mha.get("o_elems", int) == cfg.tokens * cfg.D
            continue
        rows, k, n = d.dims
        rec = records[d.key]
        assert rec.get("K", int) == round_up(k, 512), d.key
        # taconite knows the gate+up GEMM by its key; its record's N is one SwiGLU half
        cols = n // 2 if d.key == "gu" else n
        assert cols <= rec.get("N", int) < cols + 64, d.key  # padded at most to the crop pad
        chunks = sum(1 for key, _, _ in seen if key == d.key)
        per_forward = sum(1 for x in listed if x.key == d.key)
        # taconite dispatches each GEMM once over all its rows (`rows=` of the record)
        assert chunks == per_forward and rec.get("rows", int) == rows, d.key
    bundle.close()
