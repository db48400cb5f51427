"""`npucam pose image` (cpu, on a tiny saved HF model) and `npucam pose check` (sim bundle
whose ref cases come from HF's processor and torch model)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "npu" / "models"))
from sapiens2_torch_ref import save_tiny_sapiens2  # noqa: E402

from npu.models.sapiens2.checkpoint import from_pretrained
from npu.models.sapiens2.export import write_sim_bundle
from npu.models.sapiens2.keypoints import FLIP_PAIRS
from npu.models.sapiens2.post import dark_keypoints
from npu.models.sapiens2.preprocess import crop_persons
from pipeline.cli import main  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("pose") / "tiny"
    return save_tiny_sapiens2(path), path


@pytest.fixture
def image(tmp_path):
    rgb = np.random.default_rng(0).integers(0, 256, (90, 70, 3), dtype=np.uint8)
    path = tmp_path / "img.png"
    cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    return rgb, path


def test_pose_image_on_cpu_writes_keypoints_and_a_drawing(tiny, image, tmp_path, capsys):
    _, model_dir = tiny
    rgb, img = image
    out, png = tmp_path / "kp.json", tmp_path / "kp.png"
    argv = ["pose", "image", str(img), "--box", "10,5,30,40", "--box=-5,20,50,60.5"]
    argv += ["--model", str(model_dir), "-o", str(out), "--draw", str(png), "--threshold", "-9"]
    assert main(argv) == 0
    persons = json.loads(out.read_text())
    assert [p["box"] for p in persons] == [[10, 5, 30, 40], [-5, 20, 50, 60.5]]
    assert all(p["backend"] == "cpu" and len(p["keypoints"]) == 17 for p in persons)
    # the command is the API chain: crop -> cpu heatmaps -> DARK
    model = from_pretrained(model_dir)
    boxes = np.array([p["box"] for p in persons], np.float32)
    crops, windows = crop_persons(rgb, boxes, output_size=(64, 48))
    want = dark_keypoints(model.heatmaps(crops), windows)
    np.testing.assert_allclose(np.array([p["keypoints"] for p in persons]), want, rtol=1e-6)
    drawn = cv2.imread(str(png))
    assert drawn.shape == (90, 70, 3) and not np.array_equal(drawn[..., ::-1], rgb)
    assert "2 box(es) on cpu" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--box", "1,2,3"], "--box '1,2,3'"),
        (["--box", "1,2,0,4"], "--box '1,2,0,4'"),
        (["--box", "1,2,3,4", "--model", "/nonexistent"], "not a directory"),
    ],
)
def test_pose_image_bad_arguments_exit_2(tiny, image, capsys, args, needle):
    _, model_dir = tiny
    _, img = image
    argv = ["pose", "image", str(img), *args]
    if "--model" not in args:
        argv += ["--model", str(model_dir)]
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


def test_pose_image_unreadable_image_exit_2(tiny, tmp_path, capsys):
    _, model_dir = tiny
    bad = tmp_path / "x.png"
    bad.write_bytes(b"nope")
    assert main(["pose", "image", str(bad), "--box", "1,2,3,4", "--model", str(model_dir)]) == 2
    assert "not a readable image" in capsys.readouterr().err


def _hf_ref(model, rgb: np.ndarray, box: list[float]) -> dict:
    """A ref case from HF's processor and torch model (docs/pose.md's tensors)."""
    from transformers import Sapiens2ImageProcessor

    proc = Sapiens2ImageProcessor(size={"height": 64, "width": 48})
    pixels = proc(images=rgb, boxes=[[box]], return_tensors="pt").pixel_values
    with torch.no_grad():
        out = model(pixels)
        feats = model.model(pixels).last_hidden_state[0, 1 + model.config.num_register_tokens :]
    post = proc.post_process_pose_estimation(SimpleNamespace(heatmaps=out.heatmaps), boxes=[[box]])[
        0
    ][0]
    return {
        "rgb": rgb, "box": np.array(box), "pixels": pixels[0].numpy(),
        "features": feats.numpy(), "heatmaps": out.heatmaps[0].numpy(),
        "keypoints": post["keypoints"].numpy(), "scores": post["scores"].numpy(),
    }  # fmt: skip


def test_pose_check_replays_hf_ref_cases_on_sim(tiny, image, tmp_path, monkeypatch, capsys):
    from npu.bundle import Bundle
    from npu.models.sapiens2.npu import from_bundle
    from stages.commands.pose import check_case

    monkeypatch.setenv("NPUCAM_SIM_HWCTX_DIR", str(tmp_path / "hwctx"))
    torch_model, model_dir = tiny
    rgb, _ = image
    refs = {
        "a": _hf_ref(torch_model, rgb, [10.0, 5.0, 30.0, 40.0]),
        "b": _hf_ref(torch_model, rgb, [-5.0, 20.0, 50.0, 60.5]),
    }
    cpu = from_pretrained(model_dir)
    bundle = write_sim_bundle(cpu, tmp_path / "b", refs=refs)
    results = {}
    with Bundle.open(bundle) as b:
        model = from_bundle(bundle, "sim")
        for record in b.tagged("ref"):
            results[record.field(0)] = check_case(model, b, record)
    for r in results.values():
        # the crop is HF's to float rounding; bf16/bfp16 device heatmaps stay close to HF's
        assert r["pixels_max_diff"] <= 2e-3 and r["heatmaps_cos"] >= 0.98
        gate = r["mean_err_px"] <= 0.01 * r["box_size"]
        assert r["pass"] == gate
    # A random-weight model's heatmaps are noise, so DARK's Newton step is ill-conditioned and
    # the device's rounding moves some keypoints far (case a); real heatmaps are peaked.
    assert not results["a"]["pass"] and results["b"]["pass"]
    assert main(["pose", "check", str(bundle), "--backend", "sim"]) == 1
    out = capsys.readouterr().out
    assert "a: " in out and "FAIL" in out and out.count("PASS") == 1
    assert "1/2 ref cases pass on sim" in out

    del refs["a"]
    bundle = write_sim_bundle(cpu, tmp_path / "c", refs=refs)
    assert main(["pose", "check", str(bundle)]) == 0
    assert "1/1 ref cases pass on sim" in capsys.readouterr().out
    refs["b"]["keypoints"] = refs["b"]["keypoints"] + 5.0  # 7 px off: > 1% of the box
    refs["b"]["scores"] = np.full_like(refs["b"]["scores"], 1.0)
    bundle = write_sim_bundle(cpu, tmp_path / "d", refs=refs)
    assert main(["pose", "check", str(bundle)]) == 1


def test_pose_image_cpu_on_a_bundle_says_which_backend(tiny, image, tmp_path, capsys):
    _, model_dir = tiny
    _, img = image
    bundle = write_sim_bundle(from_pretrained(model_dir), tmp_path / "b")
    argv = ["pose", "image", str(img), "--box", "1,2,30,40", "--model", str(bundle)]
    assert main(argv) == 2
    assert "use --backend sim or npu" in capsys.readouterr().err


def test_pose_check_without_refs_exit_2(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NPUCAM_SIM_HWCTX_DIR", str(tmp_path / "hwctx"))
    _, model_dir = tiny
    bundle = write_sim_bundle(from_pretrained(model_dir), tmp_path / "b")
    assert main(["pose", "check", str(bundle)]) == 2
    assert "no ref records" in capsys.readouterr().err


# -- bundles in taconite-sapiens2's record form, both formats ------------------------------

LAYOUT_BOXES = {"near": [40.0, 30.0, 110.0, 150.0], "low": [120.0, 140.0, 80.0, 110.0],
                "small": [50.0, 50.0, 70.0, 90.0]}  # fmt: skip
TACONITE_FIELDS = {
    "gemm": {"M", "K", "N", "lda", "c_stride", "rows", "a_elems", "c_elems", "ctx", "insts"},
    "mha": {"q_elems", "k_elems", "v_elems", "o_elems", "ctx", "insts"},
}


@pytest.fixture(scope="module", params=[("0.4b", 1), ("1b", 2)], ids=["0.4b-format1", "1b-format2"])
def layout_bundle(request, tmp_path_factory):
    """(format version, bundle, cpu model) of a reduced 0.4b / 1b layout (sapiens2_torch_ref:
    real head dim, registers, MHA/GQA mix and 308 keypoints; widths / 4, depth 3, 64 x 48
    crops) whose heatmaps peak on a bright blob, with HF ref cases."""
    from sapiens2_torch_ref import LAYOUT_04B, LAYOUT_1B, blob_image, peaked_heatmaps
    from sapiens2_torch_ref import tiny_sapiens2 as build

    name, version = request.param
    d = tmp_path_factory.mktemp(f"layout{name}")
    torch_model = peaked_heatmaps(build(0, **(LAYOUT_04B if name == "0.4b" else LAYOUT_1B)), 40)
    torch_model.save_pretrained(d / "hf")
    cpu = from_pretrained(d / "hf")
    rgb = blob_image()
    refs = {case: _hf_ref(torch_model, rgb, box) for case, box in LAYOUT_BOXES.items()}
    return version, write_sim_bundle(cpu, d / "bundle", version=version, refs=refs), cpu


def test_pose_check_passes_on_taconite_form_bundles(layout_bundle, tmp_path, monkeypatch, capsys):
    """Format 1 (the 0.4b layout) and format 2 (the 1b layout, down's bias on the host) pass
    `pose check` against HF's torch model with taconite's gates (pixels <= 2e-3, heatmap
    cosine >= 0.98, mean keypoint error <= 1% of the box), from records that carry only the
    fields taconite reads."""
    from npu.bundle import Bundle

    monkeypatch.setenv("NPUCAM_SIM_HWCTX_DIR", str(tmp_path / "hwctx"))
    version, bundle, _ = layout_bundle
    with Bundle.open(bundle) as b:
        assert b.version == version
        for r in b.records:
            if r.tag in TACONITE_FIELDS:
                assert set(r.kv) == TACONITE_FIELDS[r.tag], r.text
        assert b.has("0.down.bias") == (version == 2) and not b.has("d0.bias")
        # real pairs, as taconite's Config::load needs (the 308-point list)
        pairs = tuple(tuple(map(int, p.split(":"))) for p in b.param("flip_pairs").split(","))
        assert pairs == FLIP_PAIRS
    assert main(["pose", "check", str(bundle)]) == 0
    out = capsys.readouterr().out
    assert "3/3 ref cases pass on sim" in out and "FAIL" not in out
    assert "keypoints (score > 0.3: 308)" in out  # the keypoint gate is not vacuous


def test_each_gemm_record_is_dispatched_once_per_layer_per_box(layout_bundle, tmp_path):
    from npu.models.sapiens2.npu import from_bundle, qkv_width
    from npu.sim import SimDevice

    _, bundle, cpu = layout_bundle
    cfg = cpu.config
    dev = SimDevice(registry_dir=tmp_path / "hwctx")
    model = from_bundle(bundle, dev)
    crops = np.random.default_rng(7).normal(size=(2, 3, cfg.H, cfg.W)).astype(np.float32)
    model.heatmaps(crops)
    counts = {k: t.dispatches for k, t in dev.sim.kernels.items()}
    want = {"patch": 1, "o": cfg.layers, "gu": cfg.layers, "down": cfg.layers,
            "mha": cfg.layers, "pred": 1}  # fmt: skip
    for i in range(cfg.layers):
        key = f"qkv{qkv_width(cfg, i)}"
        want[key] = want.get(key, 0) + 1
    want.update({f"d{j}": 1 for j in range(len(cfg.up))})
    want.update({f"c{j}": 1 for j in range(len(cfg.convs))})
    assert counts == {k: 2 * n for k, n in want.items()}  # two boxes
    assert sum(want.values()) == 1 + 5 * cfg.layers + len(cfg.up) + len(cfg.convs) + 1
    dev.close()


def _as_hf_snapshot(bundle: Path, cache: Path) -> Path:
    """The bundle laid out as a Hugging Face cache snapshot: every file a relative symlink
    from snapshots/<rev>/<path> into ../../blobs/<sha256>; returns the snapshot directory."""
    import hashlib

    repo = cache / "models--brishen--iron-sapiens2"
    snap = repo / "snapshots" / "0123abc"
    (repo / "blobs").mkdir(parents=True)
    for f in sorted(p for p in bundle.rglob("*") if p.is_file()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snap / f.relative_to(bundle)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(
            Path(*[".."] * (len(link.relative_to(repo).parts) - 1)) / blob.relative_to(repo)
        )
    return snap


def test_finding_8_a_bundle_laid_out_as_a_hugging_face_snapshot_loads_and_checks(
    layout_bundle, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("NPUCAM_SIM_HWCTX_DIR", str(tmp_path / "hwctx"))
    _, bundle, _ = layout_bundle
    snap = _as_hf_snapshot(bundle, tmp_path / "hub")
    assert (snap / "manifest.txt").is_symlink() and (snap / "kernels" / "mha.bin").is_symlink()
    assert str((snap / "kernels" / "mha.bin").readlink()).startswith("../../../blobs/")
    assert main(["pose", "check", str(snap)]) == 0
    assert "3/3 ref cases pass on sim" in capsys.readouterr().out


def test_pose_image_with_synthetic_says_so_and_real_weights_do_not(tiny, image, capsys):
    _, model_dir = tiny
    _, img = image
    assert main(["pose", "image", str(img), "--box", "5,5,40,60", "--synthetic"]) == 0
    out = capsys.readouterr()
    persons = json.loads(out.out)
    assert persons[0]["synthetic"] is True and len(persons[0]["keypoints"]) == 308
    assert "WARNING: SYNTHETIC sapiens2 weights" in out.err and "on cpu SYNTHETIC" in out.err
    assert main(["pose", "image", str(img), "--box", "5,5,40,60", "--model", str(model_dir)]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)[0]["synthetic"] is False and "SYNTHETIC" not in out.err


def test_pose_image_without_a_model_names_the_synthetic_option(image, capsys):
    _, img = image
    assert main(["pose", "image", str(img), "--box", "5,5,40,60"]) == 2
    assert "--synthetic" in capsys.readouterr().err


def test_a_head_of_three_transposed_convs_checks_and_runs_pose_image_on_sim(
    tmp_path, monkeypatch, capsys
):
    """Heatmaps are gh·2^len(up) x gw·2^len(up) (taconite-sapiens2 lib.rs `Config::heatmap`):
    a bundle whose head has three transposed convs gives 32 x 24 heatmaps from 4 x 3 patches
    (not 4·gh x 4·gw), passes `pose check` against HF's torch model and runs `pose image`,
    whose keypoints are the cpu forward's within bf16 rounding (1% of the box, the check's
    keypoint gate)."""
    from sapiens2_torch_ref import blob_image, peaked_heatmaps
    from sapiens2_torch_ref import tiny_sapiens2 as build

    monkeypatch.setenv("NPUCAM_SIM_HWCTX_DIR", str(tmp_path / "hwctx"))
    head = {"upsample_out_channels": [32, 16, 16], "conv_out_channels": [16]}
    torch_model = peaked_heatmaps(build(0, head_config=head), 40)
    torch_model.save_pretrained(tmp_path / "hf")
    cpu = from_pretrained(tmp_path / "hf")
    assert len(cpu.config.up) == 3 and cpu.config.heatmap_size == (32, 24)
    rgb = blob_image()
    refs = {case: _hf_ref(torch_model, rgb, box) for case, box in LAYOUT_BOXES.items()}
    assert refs["near"]["heatmaps"].shape == (17, 32, 24)
    bundle = write_sim_bundle(cpu, tmp_path / "bundle", refs=refs)
    assert main(["pose", "check", str(bundle)]) == 0
    out = capsys.readouterr().out
    assert "3/3 ref cases pass on sim" in out and "FAIL" not in out

    img, kp = tmp_path / "blob.png", tmp_path / "kp.json"
    cv2.imwrite(str(img), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    box = LAYOUT_BOXES["near"]
    argv = ["pose", "image", str(img), "--box", ",".join(map(str, box)), "--model", str(bundle)]
    assert main([*argv, "--backend", "sim", "-o", str(kp)]) == 0
    [person] = json.loads(kp.read_text())
    assert person["backend"] == "sim" and len(person["keypoints"]) == 17
    crops, windows = crop_persons(rgb, np.array([box], np.float32), output_size=(64, 48))
    want = dark_keypoints(cpu.heatmaps(crops), windows)[0]
    err = np.linalg.norm(np.array(person["keypoints"])[:, :2] - want[:, :2], axis=1)
    assert err.mean() <= 0.01 * max(box[2], box[3])
