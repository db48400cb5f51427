"""`npucam clip classify` on a tiny random HF CLIPModel directory with the cpu backend."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "npu" / "models"))
from conftest_clip import tiny_clip_dir  # noqa: E402, F401 (fixture)

from npu.models.clip import ClipModel  # noqa: E402
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
    model = ClipModel.from_pretrained(tiny_clip_dir)
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
    code, _, err = run(
        ["clip", "classify", str(tiny_clip_dir), str(image_files[0]), "-l", "cat", "--backend",
         "npu"],
        capsys,
    )  # fmt: skip
    assert code == 2 and "--backend npu" in err
