"""The Sapiens2 replay against taconite-sapiens2's device ABI (issue 13's findings 1-6): what
the host stages, which buffers each dispatch gets, and that the simulator, an executable copy
of taconite's device contract, computes wrong numbers for any other staging.

References: the float32 cpu forward of the same weights (itself checked against HF's torch
model in test_sapiens2.py); gate cosine >= 0.999 on heatmaps (bf16 activations, bfp16
weights), wrong stagings fall below 0.99. The recording fake pyxrt (tests/npu/fake_pyxrt.py)
shows the buffers, offsets and syncs; docs/bundles.md holds the one-layer table it must match.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from sapiens2_recording import fake_pyxrt, layer_events, write_real_width_bundle
from sapiens2_torch_ref import tiny_sapiens2

import npu.models.sapiens2.model as s2model
import npu.models.sapiens2.npu as s2npu
from npu.bf16 import bf16_to_f32, f32_to_bf16
from npu.bundle import Bundle, BundleError
from npu.models.sapiens2.checkpoint import from_pretrained
from npu.models.sapiens2.export import write_sim_bundle
from npu.models.sapiens2.model import KeyedOps, Sapiens2Pose, stage_attention
from npu.models.sapiens2.npu import from_bundle
from npu.ops import GemmWeights, NumpyOps

torch.set_num_threads(1)
DOCS = Path(__file__).parents[3] / "docs" / "bundles.md"
TACONITE_FIELDS = {
    "gemm": {"M", "K", "N", "lda", "c_stride", "rows", "a_elems", "c_elems", "ctx", "insts"},
    "mha": {"q_elems", "k_elems", "v_elems", "o_elems", "ctx", "insts"},
}


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def cpu(tmp_path_factory):
    """The tiny random HF model (an MHA and a GQA layer) at 128 x 96: 51 tokens, and 768 head
    pixels, so the 1x1 convs' one dispatch covers more rows than M = 256. Its attention
    output projections are scaled up 20x so that the attention moves the heatmaps enough
    for a wrongly staged attention to show (HF's init leaves it a small correction)."""
    path = tmp_path_factory.mktemp("s2abi") / "tiny"
    model = tiny_sapiens2(0, image_size=[128, 96])
    with torch.no_grad():
        for layer in model.model.model.layer:
            layer.attention.o_proj.weight.mul_(20.0)
    model.save_pretrained(path)
    return from_pretrained(path)


@pytest.fixture(scope="module")
def crops(cpu):
    cfg = cpu.config
    return np.random.default_rng(3).normal(size=(1, 3, cfg.H, cfg.W)).astype(np.float32)


@pytest.fixture(scope="module")
def want(cpu, crops):
    return cpu.heatmaps(crops)


@pytest.fixture(scope="module")
def bundle(cpu, tmp_path_factory):
    return write_sim_bundle(cpu, tmp_path_factory.mktemp("s2abi_b") / "b")


@pytest.fixture
def sim(tmp_path):
    from npu.sim import SimDevice

    dev = SimDevice(registry_dir=tmp_path / "hwctx")
    yield dev
    dev.close()


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """(XrtDevice over the recording fake pyxrt, the fake module)."""
    from npu.xrt import XrtDevice

    mod = fake_pyxrt()
    monkeypatch.setitem(sys.modules, "pyxrt", mod)
    monkeypatch.delenv("TACONITE_CTX_CACHE", raising=False)
    node = tmp_path / "accel0"
    node.write_bytes(b"")
    dev = XrtDevice(str(node))
    yield dev, mod
    dev.close()


def _records(path: Path) -> list:
    with Bundle.open(path) as b:
        return list(b.records)


# -- finding 1: one token-major staging buffer, q / k / v views from offset 0 ---------------


def test_finding_1_the_stage_holds_token_major_rows_of_q_scaled_k_and_v_per_head(
    cpu, bundle, crops, want, sim
):
    model = from_bundle(bundle, sim)
    got = model.heatmaps(crops)
    assert _cos(got, want) >= 0.999
    cfg, replay = model.config, model.ops
    # after the forward the buffers hold the last layer's: its qkv C and its staged rows
    last = cfg.layers - 1
    t, w = cfg.tokens, s2npu.qkv_width(cfg, last)
    qkv = bf16_to_f32(replay.flats[f"qkv{w}"].root.array(np.uint16)[: t * w]).reshape(t, w)
    staged = stage_attention(qkv, cfg, cfg.kv_heads[last], model.host[f"{last}.q_norm"],
                             model.host[f"{last}.k_norm"], model._cos, model._sin)  # fmt: skip
    stage = replay.flats["stage"].root.array(np.uint16)[: t * 3 * cfg.D].reshape(t, 3, cfg.D)
    assert np.array_equal(stage.reshape(t, -1), f32_to_bf16(staged))
    # k and v of the GQA layer (2 kv heads for 4 query heads) are repeated to every head
    hd = cfg.hd
    k = stage[:, 1].reshape(t, cfg.heads, hd)
    assert cfg.kv_heads[last] == 2 and np.array_equal(k[:, 0], k[:, 1])
    assert np.array_equal(k[:, 2], k[:, 3]) and not np.array_equal(k[:, 1], k[:, 2])


def _head_major(stage, cfg):
    t = len(stage)
    return stage.reshape(t, 3, cfg.heads, cfg.hd).transpose(1, 2, 0, 3).reshape(t, -1)


def _unscaled_q(stage, cfg):
    out = stage.copy()
    out[:, : cfg.D] /= np.float32(np.log2(np.e) / np.sqrt(cfg.hd))
    return out


def _kv_not_repeated(stage, cfg):
    """k and v as npucam staged them for the GQA layers: kv heads only, then zeros."""
    t, d, h, hd = len(stage), cfg.D, cfg.heads, cfg.hd
    out = stage.copy()
    for part in (1, 2):
        heads = stage[:, part * d : (part + 1) * d].reshape(t, h, hd)
        distinct = heads[:, :: h // 2] if h > 2 else heads
        block = np.zeros((t, h, hd), np.float32)
        block[:, : distinct.shape[1]] = distinct
        out[:, part * d : (part + 1) * d] = block.reshape(t, d)
    return out


@pytest.mark.parametrize("wrong", [_head_major, _unscaled_q, _kv_not_repeated])
def test_finding_1_any_other_staging_computes_wrong_numbers_on_the_sim(
    cpu, bundle, crops, want, sim, monkeypatch, wrong
):
    cfg = cpu.config
    real = s2model.stage_attention
    # the replay's call passes its uint16 rows as the last argument (`out`); without it the
    # staging returns float32 rows, which the wrong order rearranges and the glue rounds
    monkeypatch.setattr(s2model, "stage_attention", lambda *a: wrong(real(*a[:-1]), cfg))
    got = from_bundle(bundle, sim).heatmaps(crops)
    assert _cos(got, want) < 0.99


def test_finding_1_a_k_view_cut_at_its_column_offset_fails_on_the_sim(
    bundle, crops, sim, monkeypatch
):
    """npucam passed q, k and v as separate buffers; the kernel reads k at its compiled
    column offset from the view's start, so a k view cut at column D (not at the stage's
    origin) is too short for what the kernel reads, and the sim refuses the dispatch."""

    def offset_views(device, kernel, rec, stage, o):
        d = bundle_config.D
        k = device.sub(stage.root, 2 * d, 2 * (rec.k_elems - d))
        return device.run(kernel, [stage.view(rec.q_elems), k, stage.view(rec.v_elems, 2),
                                   o.view(rec.o_elems)])  # fmt: skip

    model = from_bundle(bundle, sim)
    bundle_config = model.config
    monkeypatch.setattr(s2npu, "run_mha", offset_views)
    with pytest.raises(Exception, match="argument 1 is"):
        model.heatmaps(crops)  # too short for what the kernel reads past its start


# -- finding 2: mha records carry only q_elems k_elems v_elems o_elems ctx insts --------------


def test_finding_2_records_carry_only_taconites_fields_and_load_on_the_fake_pyxrt(
    bundle, crops, tmp_path, fake
):
    """The sim writer writes no heads= d= seq= epilogue= tile or bias fields; the runtime
    derives the geometry from the params and never reads the instruction streams, so a
    bundle whose streams are arbitrary words loads and dispatches on (fake) hardware."""
    dev, mod = fake
    for r in _records(bundle):
        if r.tag in TACONITE_FIELDS:
            assert set(r.kv) == TACONITE_FIELDS[r.tag], r.text
    alien = tmp_path / "alien"
    shutil.copytree(bundle, alien)
    for f in (alien / "kernels").glob("*.bin"):
        f.write_bytes(np.full(8, 0xDEADBEEF, np.uint32).tobytes())
    model = from_bundle(alien, dev)
    cfg = model.config
    assert (cfg.heads, cfg.hd, cfg.tokens, cfg.kv_heads) == (4, 16, 3 + 48, (4, 2))
    model.heatmaps(crops)
    starts = mod.of("start")
    assert len(starts) == 1 + 5 * cfg.layers + len(cfg.up) + len(cfg.convs) + 1


def test_finding_2_a_missing_view_size_names_the_mha_line(bundle, tmp_path, sim):
    broken = tmp_path / "broken"
    shutil.copytree(bundle, broken)
    text = (broken / "manifest.txt").read_text()
    (broken / "manifest.txt").write_text(re.sub(r" o_elems=\d+", "", text))
    with pytest.raises(BundleError, match=r"/manifest.txt:\d+: `o_elems=` missing"):
        from_bundle(broken, sim)


def test_finding_2_the_sim_refuses_an_attention_stream_it_did_not_write(bundle, tmp_path, sim):
    alien = tmp_path / "alien"
    shutil.copytree(bundle, alien)
    (alien / "kernels" / "mha.bin").write_bytes(np.arange(16, dtype=np.uint32).tobytes())
    with pytest.raises(Exception, match="the simulator cannot run this mha kernel"):
        from_bundle(alien, sim)


# -- finding 3: format 2 host biases are optional and size-checked -------------------------


def test_finding_3_a_format_2_bundle_with_only_down_bias_loads_and_matches(
    cpu, crops, want, tmp_path, sim
):
    b = write_sim_bundle(cpu, tmp_path / "v2", version=2)
    with Bundle.open(b) as bb:
        assert bb.version == 2 and bb.has("0.down.bias") and not bb.has("d0.bias")
    assert _cos(from_bundle(b, sim).heatmaps(crops), want) >= 0.999
    none = write_sim_bundle(cpu, tmp_path / "v2_none", version=2, host_bias=())
    assert _cos(from_bundle(none, sim).heatmaps(crops), want) >= 0.999


def test_finding_3_a_deconv_bias_left_to_the_host_is_added_per_phase(cpu, crops, tmp_path, sim):
    rng = np.random.default_rng(4)
    weights = dict(cpu.weights)
    d0 = weights["d0"]
    weights["d0"] = GemmWeights(d0.w, rng.normal(size=d0.w.shape[1]).astype(np.float32))
    biased = Sapiens2Pose(cpu.config, KeyedOps(NumpyOps(weights), cpu.config), cpu.host,
                          weights=weights)  # fmt: skip
    b = write_sim_bundle(biased, tmp_path / "v2d", version=2, host_bias=("down", "deconv"))
    model = from_bundle(b, sim)
    assert "d0.bias" in model.host and "0.down.bias" in model.host
    ref = biased.heatmaps(crops)
    assert _cos(model.heatmaps(crops), ref) >= 0.999 and _cos(ref, cpu.heatmaps(crops)) < 0.999


def test_finding_3_a_host_bias_of_the_wrong_size_names_the_tensor(cpu, tmp_path, sim):
    b = write_sim_bundle(cpu, tmp_path / "v2", version=2)
    text = (b / "tensors.txt").read_text()
    name, _, shape, offset, nbytes = next(
        line.split() for line in text.splitlines() if line.startswith("1.down.bias ")
    )
    (b / "tensors.txt").write_text(
        text.replace(f"1.down.bias f32 {shape} {offset} {nbytes}", f"1.down.bias f32 3 {offset} 12")
    )
    with pytest.raises(BundleError, match="tensor 1.down.bias is 3 x F32, wanted 64 x F32"):
        from_bundle(b, sim)


# -- finding 4: one dispatch per GEMM over all its rows, views of a_elems / c_elems ----------


def test_finding_4_each_gemm_runs_once_over_all_its_rows_with_its_records_views(
    bundle, crops, fake
):
    dev, mod = fake
    model = from_bundle(bundle, dev)
    replay = model.ops
    assert replay.gemms["c0"].rows == 768 > replay.gemms["c0"].m  # more rows than one tile
    model.heatmaps(crops)
    subs = {c[4]: (c[1], c[2], c[3]) for c in mod.calls if c[0] == "bo.sub"}
    args = {}
    for c in mod.calls:
        if c[0] == "set_arg" and c[2] >= 3:
            args.setdefault(c[1], {})[c[2] - 3] = c[4]
    runs = {run.id: key for key, k in replay.kernels.items() for run in k.runs.values()}
    started = [runs[c[1]] for c in mod.of("start")]
    cfg = model.config
    assert started.count("c0") == started.count("pred") == started.count("d1") == 1
    assert started.count("o") == started.count("gu") == started.count("down") == cfg.layers
    for run_id, key in runs.items():
        if key == "mha":
            continue
        rec = replay.gemms[key]
        a, c = subs[args[run_id][0]], subs[args[run_id][2]]
        assert (a[1], a[2]) == (2 * rec.a_elems, 0) and (c[1], c[2]) == (2 * rec.c_elems, 0)


def test_finding_4_the_sim_computes_a_dispatch_of_more_rows_than_m_in_one_go(
    bundle, crops, want, sim
):
    model = from_bundle(bundle, sim)
    assert _cos(model.heatmaps(crops), want) >= 0.999
    assert {k: t.dispatches for k, t in sim.sim.kernels.items() if k in ("c0", "c1", "pred")} == {
        "c0": 1, "c1": 1, "pred": 1,
    }  # fmt: skip


# -- finding 5: no epilogue field, any lda -------------------------------------------------


def test_finding_5_gate_up_needs_no_epilogue_field_and_lda_below_k_is_accepted(
    bundle, crops, want, sim
):
    records = {r.fields[0]: r for r in _records(bundle) if r.tag == "gemm"}
    assert not any(r.has("epilogue") for r in records.values())
    below = {k for k, r in records.items() if r.get("lda") < r.get("K")}
    # dense host A read at lda = C_in under a K padded to 512 (zero B rows), as taconite's
    # patch (K 768) or 1b's c1 / pred (K 768 / 256) need on flm.GEMM
    assert {"patch", "qkv192", "gu", "c0", "c1", "pred", "d0", "d1"} <= below
    assert records["down"].get("lda") == records["gu"].get("c_stride")  # the SwiGLU chain
    assert _cos(from_bundle(bundle, sim).heatmaps(crops), want) >= 0.999


# -- finding 6: gate+up -> down and attention -> o stay on the device ------------------------


@pytest.mark.parametrize(
    ("tag", "key", "name", "needle"),
    [
        ("gemm", "o ", "a_elems", "gemm o: a_elems=100 is smaller than its"),
        ("gemm", "down ", "c_elems", "gemm down: c_elems=100 is smaller than its"),
        ("mha", "", "k_elems", "mha: k_elems=100, but k of the staged rows"),
    ],
)
def test_views_shorter_than_their_rows_span_load_with_a_warning_naming_the_line(
    bundle, tmp_path, fake, caplog, tag, key, name, needle
):
    """taconite checks only that the host's writes and reads fit its flat buffers, so such a
    record loads (on hardware; the simulator's kernel model refuses to read past a view)."""
    b = tmp_path / "b"
    shutil.copytree(bundle, b)
    lines = (b / "manifest.txt").read_text().splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith(f"{tag} {key}"))
    lines[at] = re.sub(rf"\b{name}=\d+", f"{name}=100", lines[at])
    (b / "manifest.txt").write_text("\n".join(lines) + "\n")
    with caplog.at_level("WARNING", logger="npu.models.sapiens2.npu"):
        model = from_bundle(b, fake[0])
    assert model.ops.config.layers == 2
    [warning] = [r.getMessage() for r in caplog.records if needle in r.getMessage()]
    assert f"/manifest.txt:{at + 1}: " in warning


def test_finding_6_the_gu_and_attention_outputs_never_cross_to_the_host(bundle, crops, fake):
    dev, mod = fake
    model = from_bundle(bundle, dev)
    replay = model.ops
    start = len(mod.calls)
    model.features(crops[0])
    chained = {replay.flats[n].root.bo.id for n in ("gu", "ao")}
    subs = {c[4]: c[1] for c in mod.calls if c[0] == "bo.sub"}
    synced = [c for c in mod.calls[start:] if c[0] == "sync" and subs.get(c[1], c[1]) in chained]
    assert synced == []
    events = layer_events(mod, replay, start, model.config.layers)
    by_step = {(e.layer, e.step, e.arg): e.buffer for e in events}
    for i in range(model.config.layers):
        assert by_step[(i, "gu", "C")] == by_step[(i, "down", "A")] == "gu"
        assert by_step[(i, "mha", "o")] == by_step[(i, "o", "A")] == "ao"


# -- docs/bundles.md's one-layer table at the real 0.4b widths -----------------------------


def _doc_table() -> list[tuple]:
    text = DOCS.read_text()
    body = text.split("<!-- sapiens2-layer-table -->")[1]
    rows = []
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0].isdigit():
            layer, step, arg, buf, offset, nbytes = cells
            rows.append((int(layer), step, arg, buf.strip("`"), int(offset),
                         int(nbytes.replace(",", ""))))  # fmt: skip
    return rows


def test_one_layers_buffers_offsets_and_syncs_match_the_table_in_docs_bundles(
    tmp_path, monkeypatch, fake
):
    """At 0.4b's real widths (3081 tokens, D 1024, I 4096; an MHA layer then a GQA one) the
    recording fake sees, for each layer, exactly docs/bundles.md's dispatches, arguments,
    buffers, offsets and byte counts, and the host syncs between them."""
    dev, mod = fake
    b = write_real_width_bundle(tmp_path / "real", monkeypatch)
    model = from_bundle(b, dev)
    cfg = model.config
    assert cfg.tokens == 3081
    start = len(mod.calls)
    model.features(np.zeros((3, cfg.H, cfg.W), np.float32))
    got = [(e.layer, e.step, e.arg, e.buffer, e.offset, e.nbytes)
           for e in layer_events(mod, model.ops, start, 2)]  # fmt: skip
    table = _doc_table()
    assert len(table) == 44 and got == table
