"""`npucam face enroll/identify/list/remove` end to end on real images and a tiny IR model."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import skimage.data

from npu.bundle import Bundle
from pipeline.assets import asset_path
from pipeline.errors import NpucamError
from stages.commands import face as face_commands
from stages.gallery import FaceObservation, read_gallery


def _run(argv: list[str]) -> int:
    """Parse and run like pipeline.cli.main: NpucamError -> exit 2 with its message."""
    parser = argparse.ArgumentParser(prog="npucam")
    face_commands.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except NpucamError as exc:
        print(f"npucam: error: {exc}")
        return 2


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    import torch

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("face")
    path = Path(__file__).resolve().parents[1] / "npu" / "models" / "adaface_torch_ref.py"
    spec = importlib.util.spec_from_file_location("adaface_torch_ref", path)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    model = ref.save_cvlface_dir(ref.tiny_ir(seed=9), root / "model", name="IR-tiny")
    astronaut = cv2.cvtColor(skimage.data.astronaut(), cv2.COLOR_RGB2BGR)
    cv2.imwrite(str(root / "astronaut.png"), astronaut)
    cv2.imwrite(str(root / "astronaut2.jpg"), cv2.convertScaleAbs(astronaut, beta=10))
    cap = cv2.VideoCapture(str(asset_path("carphone_pristine.mp4")))
    ok, frame = cap.read()
    cap.release()
    assert ok
    big = cv2.resize(frame, None, fx=3, fy=3, interpolation=cv2.INTER_CUBIC)
    cv2.imwrite(str(root / "carphone.png"), big)
    cv2.imwrite(str(root / "blank.png"), np.zeros((120, 160, 3), np.uint8))
    (root / "notes.jpg").write_text("not an image")
    return root, model


def test_enroll_identify_list_remove_round_trip(files, capsys):
    root, model = files
    gallery = str(root / "g.npz")
    base = ["--gallery", gallery]
    assert (
        _run(
            ["face", "enroll", "eileen", str(root / "astronaut.png"), "--model", str(model), *base]
        )
        == 0
    )
    assert (
        _run(["face", "enroll", "caller", str(root / "carphone.png"), "--model", str(model), *base])
        == 0
    )
    capsys.readouterr()
    assert _run(["face", "list", *base]) == 0
    out = capsys.readouterr().out
    assert "2 identities" in out and "eileen\t1 sample(s)" in out and "caller" in out

    rc = _run(
        [
            "face",
            "identify",
            str(root / "astronaut2.jpg"),
            "--model",
            str(model),
            "--json",
            "--threshold",
            "0.9",
            "--margin",
            "0.0",
            *base,
        ]
    )
    result = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(result["faces"]) == 1
    assert result["faces"][0]["identity"] == "eileen" and result["faces"][0]["similarity"] > 0.95

    assert _run(["face", "remove", "eileen", *base]) == 0
    capsys.readouterr()
    rc = _run(
        ["face", "identify", str(root / "astronaut2.jpg"), "--model", str(model), "--json", *base]
    )
    face = json.loads(capsys.readouterr().out)["faces"][0]
    # a random tiny network embeds every face alike, so only "eileen is gone" is meaningful
    assert face["best"] == "caller" and face["identity"] in ("caller", None)
    assert rc == (0 if face["identity"] else 1)
    assert _run(["face", "remove", "eileen", *base]) == 2
    assert "no identity 'eileen'" in capsys.readouterr().out


def test_enroll_reports_bad_images_and_refuses_when_none_pass(files, capsys):
    root, model = files
    gallery = str(root / "bad.npz")
    rc = _run(
        [
            "face",
            "enroll",
            "nobody",
            str(root / "blank.png"),
            str(root / "notes.jpg"),
            str(root / "missing.png"),
            "--model",
            str(model),
            "--gallery",
            gallery,
        ]
    )
    captured = capsys.readouterr()
    assert rc == 2
    assert "blank.png: no face found" in captured.err
    assert "notes.jpg: not a readable image" in captured.err
    assert "missing.png: no such image file" in captured.err
    assert "nothing enrolled" in captured.out
    assert not Path(gallery).exists()
    # one good image among bad ones: enrolled, the others reported
    rc = _run(
        [
            "face",
            "enroll",
            "eileen",
            str(root / "notes.jpg"),
            str(root / "astronaut.png"),
            "--model",
            str(model),
            "--gallery",
            gallery,
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0 and "1 sample(s), 1 rejected" in captured.out


def test_identify_without_faces_or_model_or_with_a_corrupt_gallery(files, capsys, monkeypatch):
    root, model = files
    gallery = root / "c.npz"
    assert (
        _run(
            [
                "face",
                "enroll",
                "eileen",
                str(root / "astronaut.png"),
                "--model",
                str(model),
                "--gallery",
                str(gallery),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert (
        _run(
            [
                "face",
                "identify",
                str(root / "blank.png"),
                "--model",
                str(model),
                "--gallery",
                str(gallery),
            ]
        )
        == 1
    )
    assert "no face found" in capsys.readouterr().out
    monkeypatch.delenv("NPUCAM_FACE_MODEL", raising=False)
    assert _run(["face", "identify", str(root / "blank.png"), "--gallery", str(gallery)]) == 2
    assert "pass --model" in capsys.readouterr().out
    assert (
        _run(
            [
                "face",
                "identify",
                str(root / "blank.png"),
                "--model",
                str(model),
                "--backend",
                "npu",
                "--gallery",
                str(gallery),
            ]
        )
        == 2
    )
    assert "npu backend is unavailable" in capsys.readouterr().out  # no XRT/NPU here
    gallery.write_bytes(b"corrupt")
    assert _run(["face", "list", "--gallery", str(gallery)]) == 2
    assert "c.npz: not a readable face gallery" in capsys.readouterr().out


def test_identify_refuses_a_gallery_of_another_model(files, capsys, tmp_path):
    root, model = files
    import torch  # noqa: F401 - the torch reference builds the second model

    spec = importlib.util.spec_from_file_location(
        "adaface_torch_ref",
        Path(__file__).resolve().parents[1] / "npu" / "models" / "adaface_torch_ref.py",
    )
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    other = ref.save_cvlface_dir(ref.tiny_ir(seed=10), tmp_path / "other", name="IR-tiny")
    gallery = str(tmp_path / "g.npz")
    assert (
        _run(
            [
                "face",
                "enroll",
                "eileen",
                str(root / "astronaut.png"),
                "--model",
                str(model),
                "--gallery",
                gallery,
            ]
        )
        == 0
    )
    assert (
        _run(
            [
                "face",
                "identify",
                str(root / "astronaut.png"),
                "--model",
                str(other),
                "--gallery",
                gallery,
            ]
        )
        == 2
    )
    assert "not this model" in capsys.readouterr().out


def _sim_bundle(tmp_path, seed: int):
    """A tiny IR (torch) exported as a bundle for the simulated NPU (npu.models.adaface_export,
    taconite-adaface's record format; the reference tensors are the exporter's)."""
    from npu.models.adaface.export import export_bundle

    spec = importlib.util.spec_from_file_location(
        "adaface_torch_ref",
        Path(__file__).resolve().parents[1] / "npu" / "models" / "adaface_torch_ref.py",
    )
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    net = ref.tiny_ir(seed=seed)
    sd = {k: v.numpy() for k, v in net.state_dict().items()}
    x = np.random.default_rng(seed).uniform(-1, 1, (3, 112, 112)).astype(np.float32)
    return net, export_bundle(sd, tmp_path / f"b{seed}", x, model="IR-tiny", max_icg=16)


def _without(bundle: Path, tensor: str, dst: Path) -> Path:
    """A copy of the bundle whose tensor table lacks `tensor`."""
    shutil.copytree(bundle, dst)
    table = (dst / "tensors.txt").read_text().splitlines()
    (dst / "tensors.txt").write_text("".join(f"{t}\n" for t in table if t.split()[0] != tensor))
    return dst


@pytest.fixture
def sim_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("NPUCAM_SIM_HWCTX_DIR", str(tmp_path / "hwctx"))


def test_face_check_on_a_sim_bundle_matches(tmp_path, capsys, sim_registry):
    _, bundle = _sim_bundle(tmp_path, seed=11)
    assert _run(["face", "check", str(bundle), "--backend", "sim", "--reps", "2"]) == 0
    out = capsys.readouterr().out
    assert "RESULT: MATCH" in out and "cosine(embed() API, recorded replay) = 1.00000" in out
    assert "IR-tiny forward:" in out and "simulated device time" in out
    assert "(mean of 1 reps;" in out


def test_face_check_reports_a_mismatch_and_missing_refs(tmp_path, capsys, sim_registry):
    _, bundle = _sim_bundle(tmp_path, seed=12)
    # a CPU reference that is noise: the check must fail, not pass; a recorder embedding
    # that is noise is information only (taconite's cli_run decides on the CPU cosine)
    for name, code, result in (
        ("ref.cpu_embedding", 1, "RESULT: MISMATCH"), ("ref.npu_embedding", 0, "RESULT: MATCH"),
    ):  # fmt: skip
        wrong = tmp_path / f"wrong_{name}"
        shutil.copytree(bundle, wrong)
        with Bundle.open(wrong) as b:
            e = b.entry(name)
        with open(wrong / "tensors.bin", "r+b") as f:
            f.seek(e.offset)
            f.write(np.random.default_rng(0).normal(size=512).astype("<f4").tobytes())
        assert _run(["face", "check", str(wrong), "--backend", "sim"]) == code
        assert result in capsys.readouterr().out
    # as run_ir18: no recorder embedding is n/a, no CPU reference is a failure
    no_npu = _without(bundle, "ref.npu_embedding", tmp_path / "no_npu")
    assert _run(["face", "check", str(no_npu), "--backend", "sim"]) == 0
    assert "n/a (ref.npu_embedding not in the bundle)" in capsys.readouterr().out
    no_cpu = _without(bundle, "ref.cpu_embedding", tmp_path / "no_cpu")
    assert _run(["face", "check", str(no_cpu), "--backend", "sim"]) == 1
    assert "RESULT: FAIL (no ref.cpu_embedding" in capsys.readouterr().out
    assert _run(["face", "check", str(tmp_path / "nothing"), "--backend", "sim"]) == 1
    out = capsys.readouterr().out
    assert "nothing" in out and "RESULT: FAIL (the bundle could not be checked)" in out


def test_enrol_on_cpu_identify_on_sim(files, tmp_path, capsys, sim_registry):
    root, _ = files
    net, bundle = _sim_bundle(tmp_path, seed=15)
    spec = importlib.util.spec_from_file_location(
        "adaface_torch_ref",
        Path(__file__).resolve().parents[1] / "npu" / "models" / "adaface_torch_ref.py",
    )
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    cpu_model = ref.save_cvlface_dir(net, tmp_path / "cpu", name="IR-tiny")
    gallery = str(tmp_path / "g.npz")
    img = str(root / "astronaut.png")
    assert (
        _run(["face", "enroll", "eileen", img, "--model", str(cpu_model), "--gallery", gallery])
        == 0
    )
    capsys.readouterr()
    rc = _run(
        ["face", "identify", str(root / "astronaut2.jpg"), "--model", str(bundle),
         "--backend", "sim", "--gallery", gallery, "--json", "--threshold", "0.9"]
    )  # fmt: skip
    face = json.loads(capsys.readouterr().out)["faces"][0]
    assert rc == 0 and face["identity"] == "eileen" and face["similarity"] > 0.95


def test_enroll_from_a_camera_keeps_the_best_samples_spread_over_time(files, capsys, tmp_path):
    _, model = files
    gallery = tmp_path / "cam.npz"
    argv = ["face", "enroll", "caller", "--camera", "sample:carphone_pristine.mp4",
            "--seconds", "2", "--samples", "3",
            "--model", str(model), "--gallery", str(gallery)]  # fmt: skip
    assert _run(argv) == 0
    out = capsys.readouterr().out
    m = re.search(
        r"camera 'sample:carphone_pristine.mp4': (\d+) frame\(s\) read, (\d+) passed", out
    )
    assert m and int(m.group(1)) >= 10 and int(m.group(2)) >= 3, out
    rejected = int(m.group(1)) - int(m.group(2))
    assert f"enrolled 'caller': 3 sample(s), {rejected} rejected" in out
    g = read_gallery(gallery)
    assert g.names == ("caller",) * 3 and g.model
    assert np.allclose(np.linalg.norm(g.embeddings, axis=1), 1, atol=1e-5)
    assert gallery.stat().st_mode & 0o777 == 0o600


def _candidate(t_s: float, sharp: float) -> face_commands._Candidate:
    face = FaceObservation(
        np.zeros(4, np.float32), 0.9, np.zeros((6, 2), np.float32),
        np.zeros((112, 112, 3), np.uint8), np.zeros((2, 3)), sharp, False,
    )  # fmt: skip
    return face_commands._Candidate(t_s, face)


def test_spread_best_skips_near_duplicate_frames():
    # 10 s of frames at 10 fps; the sharpest three are consecutive frames around t = 5 s
    cands = [_candidate(i / 10, 50.0 + (100 if 49 <= i <= 51 else i % 7)) for i in range(100)]
    picked = face_commands.spread_best(cands, 4)
    times = [c.t_s for c in picked]
    assert len(picked) == 4 and times == sorted(times)
    assert min(np.diff(times)) >= 9.9 / 8 - 1e-9  # span / (2n)
    assert sum(4.9 <= t <= 5.1 for t in times) == 1  # one of the three near-duplicates
    assert [c.t_s for c in face_commands.spread_best(cands[:1], 3)] == [0.0]


def test_enroll_from_a_camera_without_faces_or_frames_fails_cleanly(files, capsys, tmp_path):
    _, model = files
    gallery = tmp_path / "none.npz"
    base = ["--model", str(model), "--gallery", str(gallery)]
    rc = _run(["face", "enroll", "nobody", "--camera", "synthetic:", "--seconds", "0.5", *base])
    out = capsys.readouterr().out
    assert rc == 2 and "no face found)" in out
    assert "camera 'synthetic:': no face passed the quality gate" in out
    assert "nothing enrolled" in out and not gallery.exists()
    missing = tmp_path / "missing.mp4"
    assert _run(["face", "enroll", "x", "--camera", f"file:{missing}", *base]) == 2
    out = capsys.readouterr().out
    assert f"camera 'file:{missing}': cannot read a frame" in out and not gallery.exists()
    assert _run(["face", "enroll", "x", "--camera", "bogus://host/x", *base]) == 2
    assert "bogus://host/x" in capsys.readouterr().out
    assert _run(["face", "enroll", "x", str(missing), "--camera", "synthetic:", *base]) == 2
    assert "either IMAGES or --camera" in capsys.readouterr().out
    assert not gallery.exists()


# ---- honest output: the synthetic AdaFace, explicitly, and said so everywhere -------------


def test_synthetic_enrol_and_identify_say_so_in_text_and_json(files, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NPUCAM_SIM_HWCTX_DIR", str(tmp_path / "hwctx"))  # this test's contexts
    root, _ = files
    gallery = str(tmp_path / "g.npz")
    missing = str(tmp_path / "no-bundle")  # as on a fresh clone: the bundle is not there
    base = ["--gallery", gallery, "--model", missing, "--backend", "sim", "--synthetic"]
    assert _run(["face", "enroll", "eileen", str(root / "astronaut.png"), *base]) == 0
    out = capsys.readouterr()
    assert "SYNTHETIC weights IR-synthetic:" in out.out
    assert "WARNING: SYNTHETIC adaface weights" in out.err
    assert _run(["face", "identify", str(root / "astronaut.png"), *base]) == 0
    out = capsys.readouterr().out
    assert out.startswith("SYNTHETIC weights (IR-synthetic:")
    assert re.search(r"-> eileen similarity 1\.000 margin \S+ SYNTHETIC$", out, re.M), out
    assert _run(["face", "identify", str(root / "astronaut.png"), *base, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["synthetic"] is True and doc["model"] == read_gallery(gallery).model


def test_real_weights_are_not_called_synthetic(files, tmp_path, capsys):
    root, model = files
    base = ["--gallery", str(tmp_path / "g.npz"), "--model", str(model)]
    assert _run(["face", "enroll", "eileen", str(root / "astronaut.png"), *base]) == 0
    capsys.readouterr()
    assert _run(["face", "identify", str(root / "astronaut.png"), *base, "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["synthetic"] is False and "SYNTHETIC" not in out.err


def test_a_missing_model_without_synthetic_names_the_option(files, tmp_path, capsys):
    root, _ = files
    argv = ["face", "enroll", "x", str(root / "astronaut.png"), "--gallery", str(tmp_path / "g")]
    assert _run([*argv, "--model", str(tmp_path / "none"), "--backend", "sim"]) == 2
    out = capsys.readouterr().out
    assert "no such file or folder" in out and "--synthetic" in out


def test_the_pipelines_faces_match_a_gallery_the_cli_enrolled_without_a_model_warning(
    files, tmp_path, monkeypatch, capsys, caplog
):
    """The face_match stage used to warn that a gallery of the synthetic AdaFace held
    another model's embeddings: the gallery recorded the fingerprint, the faces the bare
    model name. Both are the fingerprint now."""
    from npu.models.loading import ModelSource
    from pipeline.config import parse_config
    from pipeline.graph import Context
    from pipeline.messages import now_ns
    from pipeline.metrics import Metrics
    from stages.models.adaface.job import FaceInferred, FaceJob
    from stages.models.adaface.post import FaceMatch, FaceMatchOptions
    from stages.runtimes import open_runtime

    monkeypatch.setenv("NPUCAM_SIM_HWCTX_DIR", str(tmp_path / "hwctx"))
    root, _ = files
    gallery = tmp_path / "g.npz"
    base = ["--gallery", str(gallery), "--backend", "sim", "--synthetic"]
    assert _run(["face", "enroll", "eileen", str(root / "astronaut.png"), *base]) == 0
    rt = open_runtime("adaface", "sim", ModelSource(bundle=str(tmp_path / "x"), synthetic=True))
    assert rt.model_id == read_gallery(gallery).model  # what the infer stage's faces carry
    config = parse_config({"stages": [{"kind": "capture"}]}, tmp_path / "run.toml")
    stage = FaceMatch("face", FaceMatchOptions(gallery="g.npz"), Context(config, Metrics()))
    t = now_ns()
    job = FaceJob(camera="kiosk", seq=1, capture_ts_ns=t, deadline_ns=t + 10**10,
                  box_xywh=np.zeros(4, np.float32), score=0.9,
                  landmarks=np.zeros((5, 2), np.float32), track_id=1)  # fmt: skip
    item = FaceInferred(job=job, output=read_gallery(gallery).embeddings[0], backend="sim",
                        model=rt.model_id, synthetic=True)  # fmt: skip
    with caplog.at_level("WARNING"):
        (result,) = stage.process(item)
    assert result.identity == "eileen"
    assert not [r for r in caplog.records if "similarities across models" in r.getMessage()]
    rt.close()
