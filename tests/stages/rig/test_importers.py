"""Calibration import (stages/rig/importers.py) against Pose2Sim's own converters.

The reference is Pose2Sim 0.10.49's Pose2Sim/calibration.py, run unchanged in its own venv
(.venv-pose2sim, `make setup-test`) by bench/pose2sim_reference.py. On the demo's Qualisys
file npucam's import projects 3D points as OpenCV's projectPoints does with the TOML Pose2Sim
writes, within 0.01 px (the issue's bound; measured: 0, the two files are the same text). For
Vicon, EasyMocap, bioCV and OpenCap, a known camera is written in the format as Pose2Sim reads
it, imported, and its projections compared with the truth's (1e-6 px: float rounding only;
OpenCap's world turned as Pose2Sim turns it) and with Pose2Sim's conversion of the same file
(0.01 px). Bad input names the file and line or key; a pickle naming a global other than
numpy's array constructors is refused without running it.
"""

from __future__ import annotations

import pickle
import tomllib
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from pipeline.assets import pose2sim_demo
from pipeline.cli import main
from stages.rig.calibration import CalibrationError, Camera, read_calibration
from stages.rig.importers import import_calibration
from tests.stages.rig.pose2sim_reference import run_reference

FIXTURE = Path(__file__).parent / "data" / "pose2sim_Calib_qualisys.toml"
AGREE_PX = 0.01  # the bound between npucam's import and Pose2Sim's conversion
EXACT_PX = 1e-6  # an import against the camera written into the file: float rounding only


def pose2sim_convert(fmt: str, files: list[Path], out: Path) -> str:
    """The TOML text Pose2Sim's converter writes for `files`."""
    run_reference(fmt, out, *files, cwd=out.parent)
    return out.read_text()


def project_toml(table: dict, points: np.ndarray) -> np.ndarray:
    """cv2.projectPoints with one camera table of a TOML read by tomllib (not npucam)."""
    out = cv2.projectPoints(
        points.reshape(-1, 1, 3),
        np.array(table["rotation"], dtype=np.float64),
        np.array(table["translation"], dtype=np.float64),
        np.array(table["matrix"], dtype=np.float64),
        np.array(table["distortions"], dtype=np.float64),
    )[0]
    return out.reshape(-1, 2)


def volume_points() -> np.ndarray:
    """A 7x7x5 grid over a 4 x 4 x 2 m capture volume around the world's origin."""
    grid = np.mgrid[-2:2:7j, -2:2:7j, 0:2:5j].reshape(3, -1).T
    return np.ascontiguousarray(grid)


def in_front(cam: Camera, points: np.ndarray) -> np.ndarray:
    depth = (points @ cam.extrinsics[:, :3].T + cam.translation)[:, 2]
    return points[depth > 0.1]


def assert_projects_as_reference(ours_path: Path, reference_text: str) -> float:
    ours = read_calibration(ours_path)
    reference = tomllib.loads(reference_text)
    tables = [v for k, v in reference.items() if k != "metadata"]
    assert [t["name"] for t in tables] == [c.name for c in ours.cameras.values()]
    worst = 0.0
    for table, cam in zip(tables, ours.cameras.values(), strict=True):
        assert tuple(table["size"]) == cam.size
        pts = in_front(cam, volume_points())
        assert len(pts) > 20, cam.name
        diff = np.abs(cam.project(pts) - project_toml(table, pts)).max()
        assert diff < AGREE_PX, (cam.name, diff)
        worst = max(worst, float(diff))
    return worst


@pytest.mark.parametrize("demo", ["Demo_SinglePerson", "Demo_MultiPerson"])
def test_qualisys_demo_projects_as_pose2sims_converted_toml(demo, tmp_path):
    qca = pose2sim_demo(demo) / "calibration" / "Calib.qca.txt"
    assert (
        main(["calibrate", "import", "qualisys", str(qca), "-o", str(tmp_path / "ours.toml")]) == 0
    )
    reference = pose2sim_convert("qualisys", [qca], tmp_path / "Calib_qualisys.toml")
    worst = assert_projects_as_reference(tmp_path / "ours.toml", reference)
    print(f"{demo}: largest projection difference {worst:.2e} px")
    assert (tmp_path / "ours.toml").read_text() == reference  # toml_write's text, byte for byte


def test_qualisys_demo_matches_pose2sims_published_conversion():
    """The demo's .qca.txt is the one Pose2Sim's S00_Demo_Session converted into the fixture
    (its cameras then named cam_01..cam_04): every number is the same."""
    ours = import_calibration("qualisys", [pose2sim_demo() / "calibration" / "Calib.qca.txt"])
    published = read_calibration(FIXTURE)
    assert [c.name for c in ours.cameras.values()] == ["cam01", "cam02", "cam03", "cam04"]
    for a, b in zip(ours.cameras.values(), published.cameras.values(), strict=True):
        assert a.size == b.size
        for field in ("matrix", "distortions", "rotation", "translation"):
            np.testing.assert_allclose(getattr(a, field), getattr(b, field), rtol=1e-12, atol=0)


# A known camera (world -> camera), written in each format as Pose2Sim reads it.
TRUTH = Camera(
    "7",
    (1920, 1080),
    [[1510.5, 0.0, 960.0], [0.0, 1512.25, 540.0], [0.0, 0.0, 1.0]],
    [-0.12, 0.05, 0.0011, -0.0007],
    cv2.Rodrigues(Rotation.from_euler("xyz", [100, 20, -35], degrees=True).as_matrix())[0],
    [0.4, 1.1, 3.2],
)
SECOND = Camera(
    "12",
    (1920, 1080),
    [[1400.0, 0.0, 960.0], [0.0, 1400.0, 540.0], [0.0, 0.0, 1.0]],
    [0.02, -0.01, 0.0, 0.0002],
    cv2.Rodrigues(Rotation.from_euler("xyz", [95, -30, 150], degrees=True).as_matrix())[0],
    [-0.3, 0.9, 4.0],
)


def _rot(cam: Camera) -> np.ndarray:
    return cam.extrinsics[:, :3]


def _num(value) -> str:
    return repr(float(value))


def write_vicon(path: Path, cams: list[Camera]) -> list[Path]:
    """Pose2Sim's read_vicon reads ORIENTATION (x y z w) through quat2mat, which transposes,
    then calib_vicon_fun transposes again: the quaternion is of world -> camera; POSITION is
    the camera centre in mm. A marker camera (TYPE without 'video') is skipped."""
    rows = ['<?xml version="1.0"?>', "<Cameras>"]
    for cam in cams:
        q = Rotation.from_matrix(_rot(cam)).as_quat()  # x, y, z, w
        aspect = cam.matrix[0, 0] / cam.matrix[1, 1]
        rows += [
            f'<Camera DEVICEID="{cam.name}" TYPE="VideoCamera" SENSOR_SIZE="1920 1080" '
            f'PIXEL_ASPECT_RATIO="{_num(aspect)}">',
            "<KeyFrames>",
            f'<KeyFrame FOCAL_LENGTH="{_num(cam.matrix[0, 0])}" '
            f'PRINCIPAL_POINT="{_num(cam.matrix[0, 2])} {_num(cam.matrix[1, 2])}" '
            f'VICON_RADIAL2="3 0 0 {_num(cam.distortions[0])} {_num(cam.distortions[1])}" '
            f'ORIENTATION="{" ".join(_num(v) for v in q)}" '
            f'POSITION="{" ".join(_num(v) for v in cam.centre * 1000)}" WORLD_ERROR="0.2"/>',
            "</KeyFrames>",
            "</Camera>",
        ]
    rows += [
        '<Camera DEVICEID="99" TYPE="Vantage" SENSOR_SIZE="2048 1088" PIXEL_ASPECT_RATIO="1">',
        '<KeyFrames><KeyFrame FOCAL_LENGTH="1" PRINCIPAL_POINT="0 0" VICON_RADIAL="0 0" '
        'ORIENTATION="0 0 0 1" POSITION="0 0 0" WORLD_ERROR="0"/></KeyFrames>',
        "</Camera>",
        "</Cameras>",
    ]
    path.write_text("\n".join(rows) + "\n")
    return [path]


def write_easymocap(folder: Path, cams: list[Camera]) -> list[Path]:
    intri = cv2.FileStorage(str(folder / "intri.yml"), cv2.FILE_STORAGE_WRITE)
    extri = cv2.FileStorage(str(folder / "extri.yml"), cv2.FILE_STORAGE_WRITE)
    for fs in (intri, extri):
        fs.startWriteStruct("names", cv2.FileNode_SEQ)
        for cam in cams:
            fs.write("", cam.name)
        fs.endWriteStruct()
    for cam in cams:
        intri.write(f"K_{cam.name}", np.array(cam.matrix))
        intri.write(f"dist_{cam.name}", np.append(cam.distortions, 0.0).reshape(1, 5))
        extri.write(f"R_{cam.name}", np.array(cam.rotation).reshape(3, 1))
        extri.write(f"Rot_{cam.name}", _rot(cam))
        extri.write(f"T_{cam.name}", np.array(cam.translation).reshape(3, 1))
    intri.release()
    extri.release()
    return [folder / "extri.yml", folder / "intri.yml"]  # Pose2Sim sorts them: extri first


def write_biocv(folder: Path, cams: list[Camera]) -> list[Path]:
    paths = []
    for i, cam in enumerate(cams):
        pose = np.column_stack([_rot(cam), np.array(cam.translation) * 1000])
        lines = [str(cam.size[0]), str(cam.size[1])]
        lines += [" ".join(repr(float(v)) for v in row) for row in cam.matrix]
        lines += [""] + [" ".join(repr(float(v)) for v in row) for row in pose]
        lines += ["0 0 0 1", "", " ".join(repr(float(v)) for v in cam.distortions) + " 0.0", ""]
        path = folder / f"{i:02d}.calib"
        path.write_text("\n".join(lines))
        paths.append(path)
    return paths


def write_opencap(folder: Path, cams: list[Camera]) -> list[Path]:
    """OpenCap's CameraParams as Pose2Sim's calib_opencap_fun reads them: imageSize (h, w),
    distortion [1, 5], intrinsicMat, rotation, translation [3, 1] in mm (world -> camera)."""
    paths = []
    for i, cam in enumerate(cams):
        params = {
            "imageSize": np.array([[cam.size[1]], [cam.size[0]]]),
            "distortion": np.append(cam.distortions, 0.0).reshape(1, 5),
            "intrinsicMat": np.array(cam.matrix),
            "rotation": _rot(cam),
            "translation": np.array(cam.translation).reshape(3, 1) * 1000,
        }
        path = folder / f"cam{i}.pickle"
        path.write_bytes(pickle.dumps(params))
        paths.append(path)
    return paths


# OpenCap's world stands on a vertical board: Pose2Sim turns it by Rx(-pi/2) then Rz(pi)
OPENCAP_TURN = np.array([[-1.0, 0.0, 0.0], [0.0, 0.0, -1.0], [0.0, -1.0, 0.0]])
WRITERS = {
    "vicon": write_vicon,
    "easymocap": write_easymocap,
    "biocv": write_biocv,
    "opencap": write_opencap,
}


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_import_projects_the_known_camera_and_as_pose2sim(fmt, tmp_path):
    known = [TRUTH, SECOND]
    if fmt == "vicon":  # Vicon's lens model has no tangential terms (read_vicon writes 0, 0)
        known = [replace(c, distortions=[*c.distortions[:2], 0.0, 0.0]) for c in known]
    target = tmp_path / "calib.xcp" if fmt == "vicon" else tmp_path
    files = WRITERS[fmt](target, known)
    out = tmp_path / "ours.toml"
    assert main(["calibrate", "import", fmt, *map(str, files), "-o", str(out)]) == 0
    ours = list(read_calibration(out).cameras.values())
    assert len(ours) == 2
    turn = OPENCAP_TURN if fmt == "opencap" else np.eye(3)
    for truth, cam in zip(known, ours, strict=True):
        pts = in_front(truth, volume_points())
        assert np.abs(cam.project(pts @ turn.T) - truth.project(pts)).max() < EXACT_PX, fmt
        np.testing.assert_allclose(cam.centre, turn @ truth.centre, atol=1e-9)
    names = [c.name for c in ours]
    assert names == (["cam_00", "cam_01"] if fmt in ("biocv", "opencap") else ["7", "12"])
    reference = pose2sim_convert(fmt, files, tmp_path / f"Calib_{fmt}.toml")
    assert_projects_as_reference(out, reference)


def test_toml_formats_read_as_the_file_itself(tmp_path):
    out = tmp_path / "ours.toml"
    assert main(["calibrate", "import", "anipose", str(FIXTURE), "-o", str(out)]) == 0
    assert out.read_text() == FIXTURE.read_text()


QCA = """<?xml version='1.0' encoding='ASCII'?>
<calibration>
  <cameras>
    <camera avg-residual="0.4" model="none" serial="cam01">
      <fov_video bottom="1919" left="0" right="1087" top="0"/>
      <transform r11="1" r12="0" r13="0" r21="0" r22="1" r23="0" r31="0" r32="0" r33="1"
        x="0" y="0" z="{z}"/>
      <intrinsic centerPointU="34110.3" centerPointV="60680.7" focalLengthU="{fu}"
        focalLengthV="107588.8" radialDistortion1="0" radialDistortion2="0"
        tangentalDistortion1="0" tangentalDistortion2="0"/>
    </camera>
  </cameras>
</calibration>
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (QCA.format(z="-3000", fu="abc"), r"line 8: <intrinsic> focalLengthU='abc' is not a"),
        (QCA.format(z="-3000", fu="107599").replace(' x="0"', ""), r"line 6: <transform> has no x"),
        (
            QCA.format(z="-3000", fu="1").replace("1087", "1087.5"),
            r"line 4: camera 'cam01'.*"
            r"fov_video gives an image of 1088.5x1920.0",
        ),
        (QCA.format(z="-3000", fu="12"), r"line 4: camera 'cam01': \[camera\] matrix"),
        (
            QCA.format(z="-3000", fu="107599").replace("</camera>", ""),
            r"line 12, column 4: not valid XML: mismatched tag",
        ),
        (QCA.format(z="-3000", fu="107599").replace("none", "marker"), r"no camera to convert"),
        (
            QCA.format(z="-3000", fu="107599").replace(
                "<calibration>", '<!DOCTYPE c [<!ENTITY a "aaaaaaaa">]>\n<calibration>'
            ),
            r"line 2: XML entities refused",
        ),
    ],
)
def test_bad_qualisys_file_names_the_file_and_line(tmp_path, text, message):
    path = tmp_path / "Calib.qca.txt"
    path.write_text(text)
    with pytest.raises(CalibrationError, match=rf"{path}: {message}"):
        import_calibration("qualisys", [path])


def test_bad_biocv_line_and_missing_easymocap_key_are_named(tmp_path):
    (path,) = write_biocv(tmp_path, [TRUTH])
    lines = path.read_text().split("\n")
    lines[3] = "0 1512.25 oops"
    path.write_text("\n".join(lines))
    with pytest.raises(CalibrationError, match=rf"{path}: line 4: expected 3 numbers"):
        import_calibration("biocv", [path])
    extri, intri = write_easymocap(tmp_path, [TRUTH])
    intri.write_text(intri.read_text().replace("K_7", "K_8"))
    with pytest.raises(CalibrationError, match=rf"{intri}: K_7: expected an OpenCV matrix"):
        import_calibration("easymocap", [intri, extri])


class _Payload:
    def __reduce__(self):
        return (print, ("ran",))


def test_opencap_pickle_naming_any_other_global_is_refused_unrun(tmp_path, capsys):
    path = tmp_path / "cam0.pickle"
    path.write_bytes(pickle.dumps({"intrinsicMat": _Payload()}))
    with pytest.raises(CalibrationError, match=rf"{path}: not an OpenCap .*refused global"):
        import_calibration("opencap", [path])
    assert "ran" not in capsys.readouterr().out


def test_import_command_exits_2_naming_the_problem(tmp_path, capsys):
    out = tmp_path / "o.toml"
    assert main(["calibrate", "import", "optitrack", str(tmp_path / "a.xml"), "-o", str(out)]) == 2
    assert "no OptiTrack converter" in capsys.readouterr().err
    assert (
        main(["calibrate", "import", "qualisys", str(tmp_path / "none.qca.txt"), "-o", str(out)])
        == 2
    )
    assert "none.qca.txt: cannot read" in capsys.readouterr().err
    assert not out.exists()


def test_qualisys_binning_halves_the_image_and_lens_but_not_the_pose(tmp_path):
    """read_qca: size, focal length, centre and distortion divided by the binning factor
    (the demo's fov_video starts at 0, 0), the pose unchanged."""
    qca = pose2sim_demo() / "calibration" / "Calib.qca.txt"
    full = import_calibration("qualisys", [qca])
    binned = import_calibration("qualisys", [qca], binning=2)
    for a, b in zip(full.cameras.values(), binned.cameras.values(), strict=True):
        assert b.size == (a.size[0] // 2, a.size[1] // 2)
        np.testing.assert_allclose(b.matrix[:2], a.matrix[:2] / 2, rtol=1e-15)
        np.testing.assert_allclose(b.distortions, a.distortions / 2, rtol=1e-15)
        np.testing.assert_array_equal(b.rotation, a.rotation)
        np.testing.assert_array_equal(b.translation, a.translation)
    with pytest.raises(CalibrationError, match="a binning factor applies to Qualisys files only"):
        import_calibration("vicon", [qca], binning=2)
