"""`npucam clip classify` (cpu: tiny random HF CLIPModel; sim: its bundle) and `clip check`."""
# ruff: noqa: F811  (pytest fixtures imported from conftest_clip are parameters here)

from __future__ import annotations

import json
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "npu" / "models"))
from conftest_clip import tiny_clip_dir  # noqa: E402, F401 (fixture)

from npu.models.clip.checkpoint import from_pretrained as load_clip
from pipeline import cli  # noqa: E402

LABELS = ["cat", "person wearing a hard hat", "bicycle"]


@pytest.fixture(scope="module")
def image_files(tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("clip_images")
    rng = np.random.default_rng(0)
    paths = []
    for i, shape in enumerate([(120, 160, 3), (300, 200, 3)]):
        path = d / f"img{i}.png"
        cv2.imwrite(str(path), rng.integers(0, 256, shape, dtype=np.uint8))
        paths.append(path)
    return paths


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def label_args() -> list[str]:
    return [arg for label in LABELS for arg in ("--label", label)]


def test_classify_json_matches_the_model_api(tiny_clip_dir, image_files, capsys):  # noqa: F811
    code, out, _ = run(
        ["clip", "classify", str(tiny_clip_dir), *map(str, image_files), *label_args(), "--json"],
        capsys,
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["backend"] == "cpu" and doc["labels"] == LABELS
    model = load_clip(tiny_clip_dir)
    rgb = [cv2.cvtColor(cv2.imread(str(p)), cv2.COLOR_BGR2RGB) for p in image_files]
    expected = model.classify(rgb, LABELS)
    for i, entry in enumerate(doc["results"]):
        assert entry["image"] == str(image_files[i])
        assert np.allclose(entry["probs"], expected.probs[i], atol=1e-6)
        assert entry["top"] == expected.top(i)[0]


def test_classify_text_lists_labels_by_probability(tiny_clip_dir, image_files, capsys):  # noqa: F811
    code, out, _ = run(
        ["clip", "classify", str(tiny_clip_dir), str(image_files[0]), *label_args()], capsys
    )
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0] == f"{image_files[0]} (backend cpu):"
    rows = [line.split(maxsplit=1) for line in lines[1:]]
    assert sorted(label for _, label in rows) == sorted(LABELS)
    probs = [float(p) for p, _ in rows]
    assert probs == sorted(probs, reverse=True)
    assert abs(sum(probs) - 1.0) < 1e-3


def test_classify_errors_name_the_input(tiny_clip_dir, image_files, tmp_path, capsys):  # noqa: F811
    code, _, err = run(["clip", "classify", str(tiny_clip_dir), str(image_files[0])], capsys)
    assert code == 2 and "no labels" in err
    missing = tmp_path / "missing.png"
    code, _, err = run(
        ["clip", "classify", str(tiny_clip_dir), str(missing), "--label", "cat"], capsys
    )
    assert code == 2 and str(missing) in err
    code, _, err = run(
        ["clip", "classify", str(tiny_clip_dir), str(image_files[0]), "--label", "42"], capsys
    )
    assert code == 2 and "no letters" in err
    code, _, err = run(
        ["clip", "classify", str(tmp_path), str(image_files[0]), "--label", "cat"], capsys
    )
    assert code == 2 and "config.json" in err
    with pytest.raises(SystemExit):  # argparse refuses an unknown backend
        cli.main(["clip", "classify", str(tiny_clip_dir), str(image_files[0]), "-l", "cat",
                  "--backend", "gpu"])  # fmt: skip
    assert "invalid choice: 'gpu'" in capsys.readouterr().err


@pytest.fixture(scope="module")
def bundle_dir(tiny_clip_dir, image_files, tmp_path_factory):  # noqa: F811
    from npu.models.clip.export import write_sim_bundle

    rgb = [cv2.cvtColor(cv2.imread(str(p)), cv2.COLOR_BGR2RGB) for p in image_files]
    return write_sim_bundle(
        tiny_clip_dir,
        tmp_path_factory.mktemp("clip_cli_bundle") / "b",
        tok_tests=["a photo of a cat", "it's 7", "Ångström\tcafé 😀 back\\slash"],
        refsets=[(rgb, LABELS)],
    )


@pytest.fixture()
def sim_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("NPUCAM_SIM_HWCTX_DIR", str(tmp_path / "hwctx"))


def test_check_passes_on_a_sim_bundle(bundle_dir, sim_registry, capsys):
    code, out, _ = run(["clip", "check", str(bundle_dir)], capsys)
    assert code == 0, out
    assert "(backend sim)" in out and out.strip().endswith("ALL CHECKS PASSED")
    assert "[ok  ] tokenizer: 3/3 texts tokenize as HF's CLIPTokenizer (ids padded to 77)" in out


def test_check_fails_with_exit_1_when_references_disagree(
    bundle_dir, sim_registry, tmp_path, capsys
):
    import shutil

    from npu.bundle import Bundle

    broken = tmp_path / "broken"
    shutil.copytree(bundle_dir, broken)
    manifest = broken / "manifest.txt"
    manifest.write_text(
        manifest.read_text().replace("tok_test 0 a photo of a cat", "tok_test 0 a dog")
    )
    with Bundle.open(broken) as b:
        offset = b.entry("ref.0.pixel_values").offset
    with open(broken / "tensors.bin", "r+b") as f:
        f.seek(offset)
        f.write(np.float32(123.0).tobytes())
    code, out, _ = run(["clip", "check", str(broken)], capsys)
    assert code == 1
    assert "[FAIL] tokenizer: 2/3 texts tokenize as HF's CLIPTokenizer" in out
    assert "differ: 0 ('a dog', manifest.txt:" in out
    assert "[FAIL] set 0 preprocess refs/0/0.png: 1 of " in out
    assert "2 CHECK(S) FAILED" in out


def test_finding_7_clip_check_reads_tok_tests_as_taconite_escaped_and_padded(bundle_dir, capsys):
    """The exporter writes tok_test texts with Python's unicode_escape and their ids padded to
    the context length (77) with the pad id, as IRON's does; the check undoes the escape
    (taconite-sam3's unescape) and compares padded ids. Before, npucam tokenized the raw
    escaped text and compared unpadded ids, so a real bundle reported 0 of n."""
    from npu.bundle import Bundle

    text = (bundle_dir / "manifest.txt").read_text()
    assert "tok_test 2 \\xc5ngstr\\xf6m\\tcaf\\xe9 \\U0001f600 back\\\\slash" in text
    with Bundle.open(bundle_dir) as b:
        pad = b.param("pad", int)
        ids = b.view("tok.0.ids", "i32")
        # bos, 5 tokens, eos, then the pad id (= eos for this vocabulary) to 77
        assert len(ids) == 77 and ids[0] == b.param("bos", int) and (ids[7:] == pad).all()


def test_finding_7_clip_check_names_the_case_whose_id_changed(
    bundle_dir, sim_registry, tmp_path, capsys
):
    import shutil

    from npu.bundle import Bundle

    broken = tmp_path / "one_id"
    shutil.copytree(bundle_dir, broken)
    with Bundle.open(broken) as b:
        offset = b.entry("tok.2.ids").offset
    with open(broken / "tensors.bin", "r+b") as f:
        f.seek(offset + 4 * 3)  # the third token of case 2
        f.write(np.int32(320).tobytes())
    code, out, _ = run(["clip", "check", str(broken)], capsys)
    assert code == 1
    assert "[FAIL] tokenizer: 2/3 texts tokenize" in out
    assert "differ: 2 ('Ångström\\tcafé 😀 back\\\\slash', manifest.txt:" in out
    assert "1 CHECK(S) FAILED" in out


def test_classify_on_the_sim_backend_matches_cpu(
    bundle_dir, tiny_clip_dir, image_files, sim_registry, capsys
):  # noqa: F811
    args = [*map(str, image_files), *label_args(), "--json"]
    code, out, _ = run(["clip", "classify", str(bundle_dir), *args, "--backend", "sim"], capsys)
    assert code == 0
    sim = json.loads(out)
    code, out, _ = run(["clip", "classify", str(tiny_clip_dir), *args], capsys)
    cpu = json.loads(out)
    assert sim["backend"] == "sim" and cpu["backend"] == "cpu"
    for s, c in zip(sim["results"], cpu["results"], strict=True):
        assert np.allclose(s["probs"], c["probs"], atol=0.03)


def test_backend_and_model_kind_must_agree(bundle_dir, tiny_clip_dir, image_files, capsys):  # noqa: F811
    code, _, err = run(
        ["clip", "classify", str(bundle_dir), str(image_files[0]), "-l", "cat"], capsys
    )
    assert code == 2 and "a bundle runs on --backend sim or npu" in err
    code, _, err = run(
        [
            "clip",
            "classify",
            str(tiny_clip_dir),
            str(image_files[0]),
            "-l",
            "cat",
            "--backend",
            "sim",
        ],
        capsys,
    )
    assert code == 2 and "needs a CLIP bundle" in err


def test_npu_backend_without_hardware_is_a_clear_error(bundle_dir, capsys):
    code, _, err = run(["clip", "check", str(bundle_dir), "--backend", "npu"], capsys)
    assert code == 2
    assert err.startswith("npucam: error:") and ("pyxrt" in err or "accel" in err)


def test_finding_7_clip_check_reads_ref_image_paths_with_spaces(
    bundle_dir, sim_registry, tmp_path, capsys
):
    """taconite reads a ref_image path as rest(2), so a file name may hold spaces; npucam read
    field(2) and looked for `refs/0/first`."""
    import shutil

    moved = tmp_path / "spaces"
    shutil.copytree(bundle_dir, moved)
    (moved / "refs/0/0.png").rename(moved / "refs/0/first  image.png")
    manifest = moved / "manifest.txt"
    text = manifest.read_text()
    assert "ref_image 0 0 refs/0/0.png\n" in text
    manifest.write_text(
        text.replace("ref_image 0 0 refs/0/0.png", "ref_image 0 0 refs/0/first  image.png")
    )
    code, out, _ = run(["clip", "check", str(moved)], capsys)
    assert code == 0, out
    assert "[ok  ] set 0 preprocess refs/0/first  image.png: 0 of " in out


# ---- honest output: synthetic weights say so; a check with nothing to check fails ---------


def test_classify_with_synthetic_runs_the_stand_in_and_says_so(image_files, tmp_path, capsys):
    missing = tmp_path / "no-such-model"
    args = ["clip", "classify", str(missing), str(image_files[0]), *label_args(), "--synthetic"]
    code, out, err = run(args, capsys)
    assert code == 0
    assert "WARNING: SYNTHETIC clip weights" in err
    assert out.startswith("SYNTHETIC weights (clip-synthetic)")
    assert f"{image_files[0]} (backend cpu, SYNTHETIC weights):" in out
    code, out, _ = run([*args, "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["synthetic"] is True and doc["model_id"] == "clip-synthetic"


def test_classify_of_a_real_model_says_it_is_not_synthetic(tiny_clip_dir, image_files, capsys):  # noqa: F811
    args = ["clip", "classify", str(tiny_clip_dir), str(image_files[0]), *label_args()]
    code, out, err = run([*args, "--json"], capsys)
    assert code == 0 and json.loads(out)["synthetic"] is False and "SYNTHETIC" not in err
    code, out, _ = run(args, capsys)
    assert "SYNTHETIC" not in out


def test_a_synthetic_bundle_named_by_its_path_is_still_labelled_synthetic(
    image_files, sim_registry, capsys
):
    from npu.models.synthetic import bundle_path

    args = ["clip", "classify", str(bundle_path("clip")), str(image_files[0]), *label_args()]
    code, out, err = run([*args, "--backend", "sim", "--json"], capsys)
    assert code == 0 and json.loads(out)["synthetic"] is True
    assert "WARNING: SYNTHETIC clip weights" in err


def test_classify_without_a_model_names_the_synthetic_option(image_files, tmp_path, capsys):
    args = ["clip", "classify", str(tmp_path / "none"), str(image_files[0]), *label_args()]
    code, _, err = run(args, capsys)
    assert code == 2 and "no such file or folder" in err and "--synthetic" in err


def test_check_with_nothing_to_check_fails(tiny_clip_dir, tmp_path, sim_registry, capsys):  # noqa: F811
    from npu.models.clip.export import write_sim_bundle

    empty = write_sim_bundle(tiny_clip_dir, tmp_path / "no-refs")  # no tok_test, no refset
    code, out, _ = run(["clip", "check", str(empty)], capsys)
    assert code == 1
    assert "nothing to check" in out and out.strip().endswith("NOTHING CHECKED")
    assert "ALL CHECKS PASSED" not in out
