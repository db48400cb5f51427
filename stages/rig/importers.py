"""Other tools' camera calibrations converted to a `Calibration` (then written as Pose2Sim's TOML).

Each converter follows the function of Pose2Sim's Pose2Sim/calibration.py (pose2sim 0.10.49)
named in its docstring, so its output is the file Pose2Sim's converter writes for the same input.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from xml.parsers import expat

import cv2
import numpy as np

from stages.rig.calibration import (
    MAX_CAMERAS,
    MAX_FILE_BYTES,
    Calibration,
    CalibrationError,
    Camera,
    format_calibration,
    parse_calibration,
    read_calibration,
)

QUALISYS_SUBPIXELS = 64  # Qualisys writes intrinsics in 1/64 sensor pixels (Pose2Sim's read_qca)


@dataclass
class _Element:
    """An XML element with the line it starts on, for errors that name it."""

    tag: str
    attrib: dict[str, str]
    line: int
    children: list[_Element] = field(default_factory=list)

    def findall(self, path: str) -> list[_Element]:
        """The descendants along a slash-separated path of tags, in document order."""
        found = [self]
        for tag in path.split("/"):
            found = [c for e in found for c in e.children if c.tag == tag]
        return found


def _read_text_size(path: Path) -> None:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if size > MAX_FILE_BYTES:
        raise CalibrationError(f"{path}: larger than {MAX_FILE_BYTES} bytes")


def _read_text(path: Path) -> str:
    _read_text_size(path)
    try:
        return path.read_text(encoding="utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise CalibrationError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _parse_xml(path: Path) -> _Element:
    """The file's root element; expat expands no external entities."""
    parser = expat.ParserCreate()
    stack: list[_Element] = []
    roots: list[_Element] = []

    def start(tag: str, attrib: dict[str, str]) -> None:
        element = _Element(tag, dict(attrib), parser.CurrentLineNumber)
        (stack[-1].children if stack else roots).append(element)
        stack.append(element)

    def end(_tag: str) -> None:
        stack.pop()

    def no_entities(*_args) -> None:
        raise CalibrationError(f"{path}: line {parser.CurrentLineNumber}: XML entities refused")

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.EntityDeclHandler = no_entities
    try:
        parser.Parse(_read_text(path).encode("utf-8"), True)
    except expat.ExpatError as exc:
        raise CalibrationError(
            f"{path}: line {exc.lineno}, column {exc.offset}: not valid XML: "
            f"{expat.ErrorString(exc.code)}"
        ) from None
    return roots[0]


def _number(path: Path, element: _Element, key: str) -> float:
    value = element.attrib.get(key)
    if value is None:
        raise CalibrationError(f"{path}: line {element.line}: <{element.tag}> has no {key}")
    try:
        out = float(value)
    except ValueError:
        out = float("nan")
    if not np.isfinite(out):
        raise CalibrationError(
            f"{path}: line {element.line}: <{element.tag}> {key}={value!r:.40} is not a number"
        )
    return out


def _numbers(path: Path, element: _Element, key: str, count: int | None = None) -> list[float]:
    value = element.attrib.get(key)
    if value is None:
        raise CalibrationError(f"{path}: line {element.line}: <{element.tag}> has no {key}")
    try:
        out = [float(v) for v in value.split()]
    except ValueError:
        out = []
    if not out or not np.isfinite(out).all() or (count is not None and len(out) != count):
        want = f"{count} numbers" if count else "numbers"
        raise CalibrationError(
            f"{path}: line {element.line}: <{element.tag}> {key}={value!r:.60}: expected {want}"
        )
    return out


def _one(path: Path, parent: _Element, tag: str) -> _Element:
    found = parent.findall(tag)
    if len(found) != 1:
        raise CalibrationError(
            f"{path}: line {parent.line}: <{parent.tag}> needs one <{tag}>, has {len(found)}"
        )
    return found[0]


def natural_key(text: str) -> list:
    """Pose2Sim's natural_sort_key (Pose2Sim/common.py): digit runs compare as numbers."""
    return [int(c) if c.isdigit() else c.lower() for c in re.split(r"(\d+)", text)]


def _rotate(rotation: np.ndarray, translation: np.ndarray, ang_x: float, ang_z: float):
    """Pose2Sim's rotate_cam(r, t, ang_x, 0, ang_z) (Pose2Sim/common.py): [R | t] turned by
    Rz(ang_z) Ry(0) Rx(ang_x), the matrices built as Pose2Sim builds them."""
    cx, sx, cz, sz = np.cos(ang_x), np.sin(ang_x), np.cos(ang_z), np.sin(ang_z)
    rx = np.array([[1.0, 0.0, 0.0], [0.0, cx, -sx], [0.0, sx, cx]])
    ry = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [-0.0, 0.0, 1.0]])
    rz = np.array([[cz, -sz, 0.0], [sz, cz, 0.0], [0.0, 0.0, 1.0]])
    turn = rz @ ry @ rx
    return turn @ rotation, turn @ translation


def _camera(name, size, matrix, distortions, rotation_matrix, translation, where: str) -> Camera:
    rvec = cv2.Rodrigues(np.asarray(rotation_matrix, dtype=np.float64))[0].ravel()
    camera = Camera(name, size, matrix, distortions, rvec, translation)
    # the converted camera passes the checks of any file npucam reads (their errors name
    # the key, as `WHERE: [camera] matrix: ...`)
    parse_calibration(format_calibration(Calibration({"camera": camera})), where)
    return camera


def _calibration(cameras: list[Camera], path: Path) -> Calibration:
    if not cameras:
        raise CalibrationError(f"{path}: no camera to convert")
    if len(cameras) > MAX_CAMERAS:
        raise CalibrationError(f"{path}: {len(cameras)} cameras, at most {MAX_CAMERAS}")
    names = [c.name for c in cameras]
    for name in names:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
            raise CalibrationError(
                f"{path}: camera name {name!r:.60} cannot name a TOML table (letters, digits, "
                "'-' or '_')"
            )
        if names.count(name) > 1:
            raise CalibrationError(f"{path}: two cameras are named {name!r}")
    # as Pose2Sim's toml_write: a table per camera named as it, metadata not adjusted, error 0
    return Calibration({c.name: c for c in cameras}, {"adjusted": False, "error": 0.0})


def import_qualisys(paths: Sequence[Path], binning: int = 1) -> Calibration:
    """A Qualisys `.qca.txt` (XML): Pose2Sim's read_qca and calib_qca_fun. Video cameras only
    (`model` containing "video" or "none"), sorted by serial in natural order; intrinsics in
    1/64 sensor pixels, divided by the binning factor, the principal point shifted by the
    video field of view's left / top; `transform` is the camera's orientation (r11..r33, read
    by column) and position (mm) in the world, turned to world -> camera and then half a turn
    about the camera's x axis (Qualisys' camera frame looks along -z)."""
    (path,) = _single(paths, "qualisys")
    if binning < 1:
        raise CalibrationError(f"{path}: binning factor {binning}: expected 1 or more")
    root = _parse_xml(path)
    cameras = []
    for tag in root.findall("cameras/camera"):
        model = tag.attrib.get("model", "").lower()
        if not any(kind in model for kind in ("video", "none")):
            continue
        name = tag.attrib.get("serial")
        if not name:
            raise CalibrationError(f"{path}: line {tag.line}: <camera> has no serial")
        fov = _one(path, tag, "fov_video")
        left, top = _number(path, fov, "left"), _number(path, fov, "top")
        width = (_number(path, fov, "right") - left + 1) / binning
        height = (_number(path, fov, "bottom") - top + 1) / binning
        intr = _one(path, tag, "intrinsic")

        def sub(key: str, intr=intr) -> float:
            return _number(path, intr, key) / QUALISYS_SUBPIXELS / binning

        distortions = [sub(k) for k in ("radialDistortion1", "radialDistortion2")]
        distortions += [sub(k) for k in ("tangentalDistortion1", "tangentalDistortion2")]
        matrix = [
            [sub("focalLengthU"), 0.0, sub("centerPointU") - left],
            [0.0, sub("focalLengthV"), sub("centerPointV") - top],
            [0.0, 0.0, 1.0],
        ]
        tr = _one(path, tag, "transform")
        rows = np.array([[_number(path, tr, f"r{i}{j}") for j in (1, 2, 3)] for i in (1, 2, 3)])
        position = np.array([_number(path, tr, k) for k in ("x", "y", "z")]) / 1000
        # Pose2Sim: R = rows.T; world_to_camera_persp: R.T (= rows), -R.T @ position
        rotation, translation = _rotate(rows, -rows @ position, np.pi, 0.0)
        where = f"{path}: line {tag.line}: camera {name!r}"
        _whole_size(width, height, where, "fov_video")
        cameras.append(
            _camera(name, (width, height), matrix, distortions, rotation, translation, where)
        )
    cameras.sort(key=lambda c: natural_key(c.name))
    return _calibration(cameras, path)


def _whole_size(width: float, height: float, where: str, what: str) -> None:
    if not (width > 0 and height > 0 and width == round(width) and height == round(height)):
        raise CalibrationError(
            f"{where}: {what} gives an image of {width}x{height} pixels; expected two positive "
            "whole numbers"
        )


def _quaternion_matrix(x: float, y: float, z: float, w: float) -> np.ndarray:
    """Pose2Sim's quat2mat(quat, scalar_idx=3) (Pose2Sim/common.py), which returns the
    transpose of the quaternion's rotation matrix."""
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    ).T


def import_vicon(paths: Sequence[Path], binning: int = 1) -> Calibration:
    """A Vicon `.xcp` (XML): Pose2Sim's read_vicon and calib_vicon_fun. Video cameras only
    (`TYPE` containing "video"), sorted by DEVICEID in natural order; size from SENSOR_SIZE;
    from the first KeyFrame: FOCAL_LENGTH (fy = fx / PIXEL_ASPECT_RATIO), PRINCIPAL_POINT,
    k1, k2 from VICON_RADIAL2's 4th and 5th values (else VICON_RADIAL), no tangential terms,
    ORIENTATION a quaternion (x, y, z, w) and POSITION (mm), turned to world -> camera."""
    (path,) = _single(paths, "vicon")
    root = _parse_xml(path)
    cameras = []
    for tag in root.findall("Camera"):
        if "video" not in tag.attrib.get("TYPE", "").lower():
            continue
        name = tag.attrib.get("DEVICEID")
        if not name:
            raise CalibrationError(f"{path}: line {tag.line}: <Camera> has no DEVICEID")
        where = f"{path}: line {tag.line}: camera {name!r}"
        width, height = _numbers(path, tag, "SENSOR_SIZE", 2)
        _whole_size(width, height, where, "SENSOR_SIZE")
        keyframes = tag.findall("KeyFrames/KeyFrame")
        if not keyframes:
            raise CalibrationError(f"{where}: no <KeyFrames><KeyFrame>")
        key = keyframes[0]
        if "VICON_RADIAL2" in key.attrib:
            radial = _numbers(path, key, "VICON_RADIAL2")[3:5]
            if len(radial) != 2:
                raise CalibrationError(
                    f"{path}: line {key.line}: VICON_RADIAL2 needs at least 5 values"
                )
        else:
            radial = _numbers(path, key, "VICON_RADIAL", 2)
        fx = _number(path, key, "FOCAL_LENGTH")
        aspect = _number(path, tag, "PIXEL_ASPECT_RATIO")
        if aspect <= 0:
            raise CalibrationError(f"{where}: PIXEL_ASPECT_RATIO {aspect} is not positive")
        cx, cy = _numbers(path, key, "PRINCIPAL_POINT", 2)
        matrix = [[fx, 0.0, cx], [0.0, fx / aspect, cy], [0.0, 0.0, 1.0]]
        read = _quaternion_matrix(*_numbers(path, key, "ORIENTATION", 4))
        position = np.array(_numbers(path, key, "POSITION", 3)) / 1000
        rotation = read.T  # Pose2Sim's world_to_camera_persp
        cameras.append(
            _camera(
                name,
                (width, height),
                matrix,
                [*radial, 0.0, 0.0],
                rotation,
                -rotation @ position,
                where,
            )
        )
    cameras.sort(key=lambda c: natural_key(c.name))
    return _calibration(cameras, path)


def _storage(path: Path) -> cv2.FileStorage:
    _read_text(path)  # exists, readable, not too large
    try:
        fs = cv2.FileStorage(str(path), cv2.FILE_STORAGE_READ)
    except cv2.error as exc:
        raise CalibrationError(f"{path}: not an OpenCV YAML file: {exc.err}") from None
    if not fs.isOpened():
        raise CalibrationError(f"{path}: not an OpenCV YAML file")
    return fs


def _names(fs: cv2.FileStorage, path: Path) -> list[str]:
    node = fs.getNode("names")
    if node.empty() or not node.isSeq():
        raise CalibrationError(f"{path}: names: expected the list of camera names")
    return [node.at(i).string() for i in range(node.size())]


def _matrix(fs: cv2.FileStorage, path: Path, key: str, sizes: tuple[int, ...]) -> np.ndarray:
    node = fs.getNode(key)
    value = None if node.empty() else node.mat()
    if value is None or value.size not in sizes or not np.isfinite(value).all():
        want = " or ".join(str(s) for s in sizes)
        raise CalibrationError(f"{path}: {key}: expected an OpenCV matrix of {want} numbers")
    return value.astype(np.float64)


def import_easymocap(paths: Sequence[Path], binning: int = 1) -> Calibration:
    """EasyMocap's `intri.yml` and `extri.yml` (OpenCV YAML): Pose2Sim's read_intrinsic_yml,
    read_extrinsic_yml and calib_easymocap_fun. Per camera in `names`: K_<name>, dist_<name>
    (its first four values: k1, k2, p1, p2), R_<name> (Rodrigues) and T_<name> (world ->
    camera); the image size is twice the principal point (as Pose2Sim; EasyMocap does not
    store it), rounded to whole pixels."""
    if len(paths) != 2:
        raise CalibrationError(
            f"easymocap: expected two files, intri.yml and extri.yml, got {len(paths)}"
        )
    intri, extri = _storage(paths[0]), _storage(paths[1])
    first = (_names(intri, paths[0]) or [""])[0]
    if intri.getNode(f"K_{first}").empty() and not intri.getNode(f"R_{first}").empty():
        intri, extri, paths = extri, intri, [paths[1], paths[0]]  # given in the other order
    cameras = []
    extrinsic_names = set(_names(extri, paths[1]))
    for name in _names(intri, paths[0]):
        if name not in extrinsic_names:
            raise CalibrationError(f"{paths[1]}: names: camera {name!r} of {paths[0]} missing")
        matrix = _matrix(intri, paths[0], f"K_{name}", (9,)).reshape(3, 3)
        distortions = _matrix(intri, paths[0], f"dist_{name}", (5,)).ravel()[:4]
        rvec = _matrix(extri, paths[1], f"R_{name}", (3,)).ravel()
        translation = _matrix(extri, paths[1], f"T_{name}", (3,)).ravel()
        size = (round(2 * matrix[0, 2]), round(2 * matrix[1, 2]))
        where = f"{paths[0]}: camera {name!r}"
        rotation = cv2.Rodrigues(rvec)[0]
        cameras.append(_camera(name, size, matrix, distortions, rotation, translation, where))
    return _calibration(cameras, paths[0])


def _biocv_file(path: Path, index: int) -> Camera:
    lines = _read_text(path).split("\n")

    def row(line: int, count: int) -> list[float]:
        text = lines[line] if line < len(lines) else ""
        try:
            values = [float(v) for v in text.split()]
        except ValueError:
            values = []
        if len(values) < count or not np.isfinite(values).all():
            raise CalibrationError(
                f"{path}: line {line + 1}: expected {count} numbers, got {text!r:.60}"
            )
        return values[:count]

    width, height = row(0, 1)[0], row(1, 1)[0]
    _whole_size(width, height, f"{path}: lines 1-2", "the width and height")
    matrix = np.array([row(i, 3) for i in (2, 3, 4)])
    pose = np.array([row(i, 4) for i in (6, 7, 8)])
    if len(lines) < 11:
        raise CalibrationError(f"{path}: {len(lines)} lines; expected the distortion line")
    distortions = row(len(lines) - 2, 4)  # Pose2Sim reads the next-to-last line
    name = f"cam_{index:02d}"
    where = f"{path}: camera {name!r}"
    return _camera(
        name, (width, height), matrix, distortions, pose[:, :3], pose[:, 3] / 1000, where
    )


def import_biocv(paths: Sequence[Path], binning: int = 1) -> Calibration:
    """bioCV's `.calib` files, one per camera: Pose2Sim's calib_biocv_fun. Line 1 width, line
    2 height, lines 3-5 the camera matrix, lines 7-9 [R | t] world -> camera (t in mm), the
    next-to-last line k1 k2 p1 p2; cameras named cam_00, cam_01, ... in the order given
    (Pose2Sim sorts the folder's *.calib by name)."""
    if not paths:
        raise CalibrationError("biocv: expected one .calib file per camera")
    return _calibration([_biocv_file(p, i) for i, p in enumerate(paths)], paths[0])


class _ArraysOnly(pickle.Unpickler):
    """Unpickles plain containers, numbers and numpy arrays only: any other global a pickle
    names (the way a pickle runs code) is refused (the Python docs' "Restricting Globals")."""

    ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refused global {module}.{name}")
        return super().find_class(module, name)


def _opencap_file(path: Path, index: int) -> Camera:
    _read_text_size(path)
    try:
        with path.open("rb") as f:
            data = _ArraysOnly(f).load()
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except Exception as exc:  # a damaged or foreign pickle fails in many ways
        raise CalibrationError(f"{path}: not an OpenCap calibration pickle: {exc}") from None
    if not isinstance(data, dict):
        raise CalibrationError(f"{path}: expected a dict of arrays, got {type(data).__name__}")

    def array(key: str, size: int) -> np.ndarray:
        value = data.get(key)
        try:
            out = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            out = np.zeros(0)
        if out.size != size or not np.isfinite(out).all():
            raise CalibrationError(f"{path}: {key}: expected {size} finite numbers")
        return out

    height, width = array("imageSize", 2).ravel()
    where = f"{path}: camera cam_{index:02d}"
    _whole_size(width, height, where, "imageSize")
    distortions = array("distortion", 5).ravel()[:4]
    matrix = array("intrinsicMat", 9).reshape(3, 3)
    rotation = array("rotation", 9).reshape(3, 3)
    translation = array("translation", 3).ravel()
    # Pose2Sim: the camera's pose in the world (world_to_camera_persp), rotate_cam by -pi/2
    # about x and pi about z, back to world -> camera; the translation kept as it was, in mm
    world_r = rotation.T
    world_t = -world_r @ translation
    turned_r, _ = _rotate(world_r, world_t, -np.pi / 2, np.pi)
    return _camera(
        f"cam_{index:02d}",
        (width, height),
        matrix,
        distortions,
        turned_r.T,
        translation / 1000,
        where,
    )


def import_opencap(paths: Sequence[Path], binning: int = 1) -> Calibration:
    """OpenCap's `.pickle` files, one per camera: Pose2Sim's calib_opencap_fun. Each a dict:
    imageSize (height, width), distortion (its first 4), intrinsicMat, rotation and translation
    (world -> camera, mm); the world turned from OpenCap's vertical board to a horizontal
    floor as Pose2Sim turns it; cameras cam_00, cam_01, ... in the order given. Read with an
    unpickler that builds nothing but containers, numbers and numpy arrays."""
    if not paths:
        raise CalibrationError("opencap: expected one .pickle file per camera")
    return _calibration([_opencap_file(p, i) for i, p in enumerate(paths)], paths[0])


def import_toml(paths: Sequence[Path], binning: int = 1) -> Calibration:
    """A Pose2Sim / anipose / FreeMoCap / Caliscope TOML, which Pose2Sim reads unconverted
    (calibrate_cams_all: "No conversion needed"): read and checked as any calibration file."""
    (path,) = _single(paths, "toml")
    return read_calibration(path)


def _single(paths: Sequence[Path], fmt: str) -> tuple[Path]:
    if len(paths) != 1:
        raise CalibrationError(f"{fmt}: expected one file, got {len(paths)}")
    return (paths[0],)


Importer = Callable[[Sequence[Path], int], Calibration]
IMPORTERS: dict[str, Importer] = {
    "qualisys": import_qualisys,
    "vicon": import_vicon,
    "easymocap": import_easymocap,
    "biocv": import_biocv,
    "opencap": import_opencap,
    "anipose": import_toml,
    "pose2sim": import_toml,
    "freemocap": import_toml,
    "caliscope": import_toml,
}
# Pose2Sim's calib_optitrack_fun converts nothing (it raises)
REFUSED = {
    "optitrack": "Pose2Sim has no OptiTrack converter either; enter the values by hand",
}


def import_calibration(
    fmt: str, paths: Sequence[str | os.PathLike], binning: int = 1
) -> Calibration:
    """Convert `paths` (one file, or one per camera / intri + extri for some formats) from
    `fmt` (a key of IMPORTERS)."""
    if fmt in REFUSED:
        raise CalibrationError(f"{fmt}: {REFUSED[fmt]}")
    if fmt not in IMPORTERS:
        raise CalibrationError(f"unknown format {fmt!r}; known: {', '.join(IMPORTERS)}")
    if binning != 1 and fmt != "qualisys":
        raise CalibrationError(f"{fmt}: a binning factor applies to Qualisys files only")
    return IMPORTERS[fmt]([Path(p) for p in paths], binning)
