"""Rig cameras (OpenCV pinhole or fisheye lens, world -> camera pose) and their calibration file.

The file is Pose2Sim's and anipose's TOML: a table per camera (name, size [w, h], matrix,
distortions, rotation as a Rodrigues vector, translation, fisheye) and [metadata]. Read as
Pose2Sim's computeP reads it (every table but metadata / capture_volume / charuco / checkerboard
is a camera, in file order; fisheye absent = false, as aniposelib's pinhole Camera writes it);
written in the layout of Pose2Sim's calibration.py toml_write, byte for byte.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import cv2
import numpy as np

from pipeline.errors import NpucamError

MAX_FILE_BYTES = 1 << 20
MAX_CAMERAS = 64
MAX_NAME_CHARS = 200
FOCAL_PX = (1.0, 1e6)  # a focal length in pixels: under a pixel or over a million is no lens
MAX_ROTATION_RAD = 100.0  # a Rodrigues vector's angle (OpenCV writes at most pi)
MAX_TRANSLATION = 1e9  # in the calibration's unit (m or mm)
ORTHONORMAL_TOLERANCE = 1e-9  # of R^T R - I, R from the Rodrigues vector
_NOT_CAMERAS = ("metadata", "capture_volume", "charuco", "checkerboard")  # as Pose2Sim's computeP
_REQUIRED = ("name", "size", "matrix", "distortions", "rotation", "translation")
_PINHOLE_DISTORTIONS = (4, 5, 8, 12, 14)  # the lengths OpenCV's distortion vector may have
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
# 10 fixed-point iterations stay within 1e-4 px of the exact inverse at k1 = -0.25 over a
# 1920x1080 image; OpenCV's default 5 leave 0.12 px there.
_UNDISTORT_CRITERIA = (cv2.TERM_CRITERIA_COUNT, 10, 0.0)


class CalibrationError(NpucamError):
    """A calibration file or calibration input npucam cannot use; names the file and the
    table/key, or the camera."""


def _frozen(values, shape: tuple[int, ...] | None = None) -> np.ndarray:
    out = np.array(values, dtype=np.float64)
    if shape is not None:
        out = out.reshape(shape)
    out.setflags(write=False)
    return out


@dataclass(frozen=True, eq=False)
class Camera:
    """One calibrated camera; rotation (Rodrigues) and translation map world -> camera
    coordinates, as OpenCV's rvec / tvec: x_cam = R @ x_world + t."""

    name: str
    size: tuple[int, int]  # (width, height) in pixels
    matrix: np.ndarray  # float64 [3, 3]
    distortions: np.ndarray  # float64 [n]: OpenCV's (k1, k2, p1, p2[, k3, ...]), fisheye (k1..k4)
    rotation: np.ndarray  # float64 [3]
    translation: np.ndarray  # float64 [3]
    fisheye: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", (int(self.size[0]), int(self.size[1])))
        object.__setattr__(self, "matrix", _frozen(self.matrix, (3, 3)))
        object.__setattr__(self, "distortions", _frozen(self.distortions).ravel())
        object.__setattr__(self, "rotation", _frozen(self.rotation, (3,)))
        object.__setattr__(self, "translation", _frozen(self.translation, (3,)))

    @cached_property
    def extrinsics(self) -> np.ndarray:
        """float64 [3, 4]: [R | t], world -> camera."""
        rot = cv2.Rodrigues(np.array(self.rotation))[0]
        return np.column_stack([rot, self.translation])

    @property
    def centre(self) -> np.ndarray:
        """float64 [3]: the camera's optical centre in world coordinates, -R^T t."""
        return -self.extrinsics[:, :3].T @ self.translation

    @property
    def focal(self) -> float:
        """Mean focal length (fx + fy) / 2 in pixels: the scale of normalized -> pixel units."""
        return float(self.matrix[0, 0] + self.matrix[1, 1]) / 2

    def project(self, points: np.ndarray) -> np.ndarray:
        """World points float [N, 3] -> image points float64 [N, 2] in pixels, through the lens
        (cv2.projectPoints, or cv2.fisheye.projectPoints)."""
        pts = np.ascontiguousarray(points, dtype=np.float64).reshape(-1, 1, 3)
        if not len(pts):
            return np.zeros((0, 2))
        project = cv2.fisheye.projectPoints if self.fisheye else cv2.projectPoints
        out = project(pts, self.rotation, self.translation, self.matrix, self.distortions)[0]
        return out.reshape(-1, 2)

    def normalize(self, pixels: np.ndarray) -> np.ndarray:
        """Image points float [N, 2] in pixels -> undistorted normalized coordinates float64
        [N, 2] (x/z, y/z in the camera frame), the inverse of the lens model
        (cv2.undistortPointsIter, or cv2.fisheye.undistortPoints)."""
        pts = np.ascontiguousarray(pixels, dtype=np.float64).reshape(-1, 1, 2)
        if not len(pts):
            return np.zeros((0, 2))
        if self.fisheye:
            out = cv2.fisheye.undistortPoints(pts, self.matrix, self.distortions)
        else:
            out = cv2.undistortPointsIter(
                pts, self.matrix, self.distortions, None, None, _UNDISTORT_CRITERIA
            )
        return out.reshape(-1, 2)


def _default_metadata() -> dict[str, object]:
    return {"adjusted": False, "error": 0.0}


@dataclass(frozen=True, eq=False)
class Calibration:
    """A rig's cameras by their table name in the file (in file order), and [metadata]."""

    cameras: dict[str, Camera]
    metadata: dict[str, object] = field(default_factory=_default_metadata)

    def camera(self, name: str) -> Camera:
        """The camera called `name` (its `name` key, not its table name)."""
        for cam in self.cameras.values():
            if cam.name == name:
                return cam
        known = ", ".join(repr(c.name) for c in self.cameras.values())
        raise CalibrationError(f"no camera named {name!r} in the calibration (it has {known})")


def read_calibration(path: str | os.PathLike) -> Calibration:
    """Read and validate a calibration file; errors name the file, the table and the key."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise CalibrationError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise CalibrationError(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    return parse_calibration(text, str(path))


def parse_calibration(text: str, source: str = "<calibration>") -> Calibration:
    """Parse calibration TOML text; `source` names it in errors."""
    if len(text) > MAX_FILE_BYTES:
        raise CalibrationError(f"{source}: larger than {MAX_FILE_BYTES} characters")
    try:
        doc = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise CalibrationError(f"{source}: not valid TOML: {exc}") from None
    tables = [(k, v) for k, v in doc.items() if isinstance(v, dict) and k not in _NOT_CAMERAS]
    if not tables:
        raise CalibrationError(f"{source}: no camera table (expected [cam_01], [cam_02], ...)")
    if len(tables) > MAX_CAMERAS:
        raise CalibrationError(f"{source}: {len(tables)} camera tables, at most {MAX_CAMERAS}")
    cameras = {key: _camera(table, f"{source}: [{key}]") for key, table in tables}
    seen: dict[str, str] = {}
    for key, cam in cameras.items():
        if cam.name in seen:
            raise CalibrationError(
                f"{source}: [{key}] name: {cam.name!r} is also the name of [{seen[cam.name]}]"
            )
        seen[cam.name] = key
    return Calibration(cameras, _metadata(doc.get("metadata", {}), source))


def _is_numbers(value: object, depth: int) -> bool:
    if isinstance(value, list):
        return depth > 0 and all(_is_numbers(v, depth - 1) for v in value)
    return isinstance(value, int | float) and not isinstance(value, bool)


def _array(table: dict, key: str, where: str, shapes: tuple[tuple[int, ...], ...], what: str):
    value = table[key]
    arr = None
    if _is_numbers(value, max(len(s) for s in shapes)):
        try:
            arr = np.array(value, dtype=np.float64)
        except ValueError:  # ragged nesting
            arr = None
    if arr is None or arr.shape not in shapes:
        raise CalibrationError(f"{where} {key}: expected {what}, got {value!r:.80}")
    if not np.isfinite(arr).all():
        raise CalibrationError(f"{where} {key}: every value must be finite, got {value!r:.80}")
    return arr


def _camera(table: dict, where: str) -> Camera:
    missing = [k for k in _REQUIRED if k not in table]
    if missing:
        raise CalibrationError(
            f"{where}: missing {', '.join(missing)} (a camera table needs {', '.join(_REQUIRED)})"
        )
    name = table["name"]
    if not (isinstance(name, str) and name.isprintable() and 0 < len(name) <= MAX_NAME_CHARS):
        raise CalibrationError(
            f"{where} name: expected a printable string of 1-{MAX_NAME_CHARS} characters, "
            f"got {name!r:.80}"
        )
    size = _array(table, "size", where, ((2,),), "[width, height] in pixels")
    if not ((size > 0).all() and (size == np.round(size)).all()):
        raise CalibrationError(
            f"{where} size: expected two positive whole numbers of pixels, got {table['size']!r}"
        )
    matrix = _array(table, "matrix", where, ((3, 3),), "a 3x3 camera matrix")
    lo, hi = FOCAL_PX
    focal_ok = lo <= matrix[0, 0] <= hi and lo <= matrix[1, 1] <= hi
    if not (focal_ok and (matrix[2] == (0, 0, 1)).all() and (matrix[1, 0] == 0)):
        raise CalibrationError(
            f"{where} matrix: expected [[fx, s, cx], [0, fy, cy], [0, 0, 1]] with fx, fy "
            f"{lo:g}-{hi:g} px, got {table['matrix']!r:.120}"
        )
    fisheye = table.get("fisheye", False)
    if not isinstance(fisheye, bool):
        raise CalibrationError(f"{where} fisheye: expected true or false, got {fisheye!r:.40}")
    lengths = (4,) if fisheye else _PINHOLE_DISTORTIONS
    distortions = _array(
        table,
        "distortions",
        where,
        tuple((n,) for n in lengths),
        " or ".join(map(str, lengths))
        + " distortion coefficients"
        + (" (fisheye k1..k4)" if fisheye else " (OpenCV's k1, k2, p1, p2, ...)"),
    )
    # Pose2Sim's older files write rotation and translation as columns [[x], [y], [z]].
    rotation = _array(table, "rotation", where, ((3,), (3, 1)), "a Rodrigues vector [x, y, z]")
    translation = _array(table, "translation", where, ((3,), (3, 1)), "a vector [x, y, z]")
    _check_pose(rotation.ravel(), translation.ravel(), where)
    return Camera(
        name, (int(size[0]), int(size[1])), matrix, distortions, rotation, translation, fisheye
    )


def _check_pose(rotation: np.ndarray, translation: np.ndarray, where: str) -> None:
    """A Rodrigues vector that gives a rotation (angle within MAX_ROTATION_RAD, R orthonormal
    with det 1) and a translation within MAX_TRANSLATION."""
    # max first: the norm of a 1e308 vector overflows
    big = float(np.abs(rotation).max())
    angle = big if big > MAX_ROTATION_RAD else float(np.linalg.norm(rotation))
    if not angle <= MAX_ROTATION_RAD:
        raise CalibrationError(
            f"{where} rotation: a Rodrigues vector of {angle:g} rad, over {MAX_ROTATION_RAD:g}: "
            "not a rotation this file could mean"
        )
    rot = cv2.Rodrigues(np.ascontiguousarray(rotation, np.float64))[0]
    off = float(np.abs(rot.T @ rot - np.eye(3)).max())
    if not (off <= ORTHONORMAL_TOLERANCE and np.linalg.det(rot) > 0):
        raise CalibrationError(f"{where} rotation: not a rotation (R^T R - I up to {off:.3g})")
    far = float(np.abs(translation).max())
    if not (far <= MAX_TRANSLATION and np.linalg.norm(translation) <= MAX_TRANSLATION):
        raise CalibrationError(
            f"{where} translation: {far:g} from the origin, over {MAX_TRANSLATION:g}"
        )


def coincident(cameras: list[Camera]) -> list[tuple[str, str]]:
    """Pairs of cameras whose optical centres coincide (within 1e-9 of the rig's extent):
    two views from one place triangulate nothing."""
    centres = np.array([c.centre for c in cameras]).reshape(-1, 3)
    scale = max(1.0, float(np.abs(centres).max(initial=0.0)))
    return [
        (a.name, b.name)
        for i, a in enumerate(cameras)
        for j, b in enumerate(cameras[i + 1 :], i + 1)
        if float(np.linalg.norm(centres[i] - centres[j])) <= 1e-9 * scale
    ]


def _metadata(value: object, source: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise CalibrationError(f"{source}: metadata must be a table, got {value!r:.40}")
    for key, item in value.items():
        scalar = isinstance(item, bool | int | float | str)
        if not (scalar or (isinstance(item, list) and _is_numbers(item, 1))):
            raise CalibrationError(
                f"{source}: [metadata] {key}: expected a number, boolean, string or list of "
                f"numbers, got {item!r:.60}"
            )
    return dict(value)


def _float(value: float) -> str:
    return repr(float(value))  # Python's shortest round-trip repr, as Pose2Sim's f-strings write


def _floats(values) -> str:
    return "[ " + ", ".join(_float(v) for v in values) + "]"


def _string(value: str) -> str:
    # a JSON string is a TOML basic string, but for DEL, which TOML wants escaped
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _meta_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, str):
        return _string(value)
    return "[" + ", ".join(_meta_value(v) for v in value) + "]"  # as Pose2Sim's str(list)


def format_calibration(calibration: Calibration) -> str:
    """The calibration as TOML text, in Pose2Sim's toml_write layout."""
    parts = []
    for key, cam in calibration.cameras.items():
        if not _BARE_KEY.fullmatch(key):
            raise CalibrationError(f"[{key}]: a table name must be letters, digits, '-' or '_'")
        parts.append(
            f"[{key}]\n"
            f"name = {_string(cam.name)}\n"
            f"size = {_floats(cam.size)}\n"
            f"matrix = [ {', '.join(_floats(row) for row in cam.matrix)}]\n"
            f"distortions = {_floats(cam.distortions)}\n"
            f"rotation = {_floats(cam.rotation)}\n"
            f"translation = {_floats(cam.translation)}\n"
            f"fisheye = {'true' if cam.fisheye else 'false'}\n\n"
        )
    meta = "".join(f"{k} = {_meta_value(v)}\n" for k, v in calibration.metadata.items())
    parts.append("[metadata]\n" + meta)
    return "".join(parts)


def write_calibration(path: str | os.PathLike, calibration: Calibration) -> None:
    """Write the calibration file (through a temporary file, so a reader never sees half; the
    temporary file is removed when the write fails)."""
    path = Path(path)
    text = format_calibration(calibration)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)  # a full disk left a 0-byte Calib.toml.tmp behind
        raise CalibrationError(f"{path}: cannot write: {exc.strerror or exc}") from None
