"""npu/sim_cost.py: the calibrated NPU2 cost model reproduces taconite's published NPU2 timings
within 5% for every released model at its real shapes (docs/device.md §6), and the pacer
charges context loads and switches as documented."""

from __future__ import annotations

import pytest

from npu.models.adaface import npu2 as adaface
from npu.models.clip import npu2 as clip
from npu.models.sapiens2 import npu2 as sapiens2
from npu.sim_cost import NPU2, ModelWork, Npu2Pacer, PassWork, gemm

TOL = 0.05  # the bar: each modelled figure within 5% of the published one


def near(got: float, want: float) -> bool:
    return abs(got / want - 1) <= TOL


def test_sapiens2_0_4b_box_is_2_4_s_of_npu_split_0_8_attention_1_6_gemms():
    pw = sapiens2.work("0.4b").passes["forward"]
    fam = NPU2.by_family(pw)
    assert near(NPU2.pass_s(pw), 2.4), NPU2.pass_s(pw)
    assert near(fam["s2_mha"], 0.8) and near(fam["flm_gemm"], 1.6), fam
    # taconite's dispatches per heatmaps() call: 1 + 5 layers + len(up) + len(convs) + 1
    assert len(pw.dispatches) == 127 and pw.items == 1


def test_sapiens2_1b_scales_from_its_shapes_as_the_brief_derives_its_work():
    small, big = (sapiens2.work(v).passes["forward"] for v in ("0.4b", "1b"))
    assert len(big.dispatches) == 207

    def backbone(pw: PassWork, family: str) -> float:
        keys = ("qkv", "o", "gu", "down", "mha")
        return sum(
            NPU2.dispatch_s(d)
            for d in pw.dispatches
            if d.family == family and d.key.startswith(keys)
        )

    # the brief's work: backbone GEMMs 2434 vs 8963 GFLOP, attention 933 vs 2333 GFLOP
    assert near(backbone(big, "flm_gemm") / backbone(small, "flm_gemm"), 8963 / 2434)
    assert near(backbone(big, "s2_mha") / backbone(small, "s2_mha"), 2333 / 933)
    assert NPU2.pass_s(big) > 2.5 * NPU2.pass_s(small)


@pytest.mark.parametrize(("variant", "published"), [("ir18", 0.2), ("ir101", 0.5)])
def test_adaface_face_takes_the_published_warm_forward(variant, published):
    pw = adaface.work(variant).passes["forward"]
    assert near(NPU2.pass_s(pw), published), NPU2.pass_s(pw)
    assert len(adaface.work(variant).contexts) == 16


def test_adaface_ir18_has_the_exporters_61_conv_dispatches():
    # docs/adaface-bundle.md: an IR-18-shaped network exports as 61 dispatches over 12 kernels
    ds = adaface.dispatches(adaface.UNITS["ir18"])
    assert len(ds) == 61 and len({d.key for d in ds}) == 12


def test_clip_pass_of_4_images_and_8_prompts_splits_as_taconite_publishes():
    w = clip.work()
    keys = NPU2.by_key(w.passes["forward"])
    for key, published in (
        ("v_fc1", 0.27), ("v_qkv", 0.12), ("v_o", 0.10), ("v_fc2", 0.12),
        ("v_mha", 0.08), ("v_addln", 0.07),
    ):  # fmt: skip
        assert near(keys[key], published), (key, keys[key])
    text = NPU2.pass_s(w.passes["texts"])
    assert near(text, 0.45)
    total = NPU2.pass_s(w.passes["forward"]) + text
    assert 1.2 <= total <= 1.4, total  # "NPU ~1.2-1.4 s" a 4-image x 8-prompt forward
    assert w.passes["forward"].items == 4 and w.passes["texts"].items == 8
    assert len(w.contexts) == 8


def test_gemm_rounds_rows_k_and_n_up_to_the_kernel_tiles():
    d = gemm("patch", "flm_gemm", 3072, 768, 1024, tiles=(256, 512, 64))
    assert d.flops == 2 * 3072 * 1024 * 1024 and d.dims == (3072, 768, 1024)
    assert gemm("x", "clip_gemm", 256, 1280, 5184).flops == 2 * 256 * 1280 * 5184


def _work(name: str, n_ctx: int, seconds: float) -> ModelWork:
    pw = PassWork("forward", 1, (gemm("g", "flm_gemm", 256, 512, 64),))
    scale = seconds / NPU2.pass_s(pw)
    pw = PassWork("forward", 1, pw.dispatches, scale=scale)
    return ModelWork(name, tuple(f"{name}/{i}" for i in range(n_ctx)), {"forward": pw})


def test_pacer_loads_missing_contexts_then_switches_between_resident_models():
    pacer = Npu2Pacer()
    a, b, big = _work("a", 6, 1.0), _work("b", 8, 0.5), _work("big", 16, 0.2)
    load, switch = NPU2.ctx_load_s, NPU2.ctx_switch_s
    first = pacer.charge(a)
    assert first.loads == 6 and first.total_s == pytest.approx(1.0 + 6 * load)
    assert pacer.charge(a).total_s == pytest.approx(1.0)  # resident, same model: the pass
    assert pacer.charge(b).loads == 8  # 6 + 8 fit in 16
    back = pacer.charge(a)
    assert back.loads == 0 and back.switched and back.total_s == pytest.approx(1.0 + switch)
    # a 16-context model evicts everything; the others reload after it
    assert pacer.charge(big).loads == 16
    again = pacer.charge(a)
    assert again.loads == 6 and again.total_s == pytest.approx(1.0 + 6 * load)
    three = pacer.charge(a, count=3)
    assert three.pass_s == pytest.approx(3.0)
