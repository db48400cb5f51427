"""Calibration boards (ChArUco, checkerboard) in metres and their corners found in an image.

ChArUco corners come from OpenCV's cv2.aruco.CharucoDetector (marker detection, then corner
interpolation and sub-pixel refinement); checkerboard corners as Pose2Sim's findCorners
(Pose2Sim/calibration.py): cv2.findChessboardCorners refined by cv2.cornerSubPix, with
cv2.findChessboardCornersSB where that finds none.
A corner's id indexes the board's object points, so views of one board pair up across cameras.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import cv2
import numpy as np

from stages.rig.calibration import CalibrationError

MIN_CORNERS = 6  # fewer corners give an unreliable board pose; such a view counts as not found
# Pose2Sim's findCorners: an 11x11 search window, 30 iterations or a 0.001 px step
SUBPIX_WINDOW = (11, 11)
SUBPIX_CRITERIA = (cv2.TERM_CRITERIA_EPS + cv2.TERM_CRITERIA_MAX_ITER, 30, 0.001)


@dataclass(frozen=True)
class BoardView:
    """A board found in one image: ids int64 [N] into the board's object points and their
    image points float64 [N, 2] in pixels."""

    ids: np.ndarray
    image_points: np.ndarray


@dataclass(frozen=True)
class Charuco:
    """A ChArUco board: squares (columns, rows), lengths in metres, an OpenCV ArUco dictionary
    name (cv2.aruco.DICT_*), laid out as cv2.aruco.CharucoBoard.generateImage draws it."""

    squares: tuple[int, int]
    square_length: float
    marker_length: float
    dictionary: str = "DICT_4X4_50"

    def __post_init__(self) -> None:
        sx, sy = self.squares
        if sx < 2 or sy < 2 or not 0 < self.marker_length < self.square_length:
            raise CalibrationError(
                f"ChArUco board: need at least 2x2 squares and 0 < marker_length < square_length, "
                f"got squares {self.squares}, lengths {self.square_length}, {self.marker_length}"
            )
        code = getattr(cv2.aruco, self.dictionary, None)
        if not self.dictionary.startswith("DICT_") or not isinstance(code, int):
            raise CalibrationError(f"ChArUco board: unknown ArUco dictionary {self.dictionary!r}")
        markers = sx * sy // 2
        size = cv2.aruco.getPredefinedDictionary(code).bytesList.shape[0]
        if markers > size:
            raise CalibrationError(
                f"ChArUco board: {sx}x{sy} squares need {markers} markers, "
                f"{self.dictionary} has {size}"
            )

    @cached_property
    def opencv(self) -> cv2.aruco.CharucoBoard:
        dictionary = cv2.aruco.getPredefinedDictionary(getattr(cv2.aruco, self.dictionary))
        return cv2.aruco.CharucoBoard(
            self.squares, self.square_length, self.marker_length, dictionary
        )

    @cached_property
    def object_points(self) -> np.ndarray:
        """float64 [N, 3]: the inner corners in the board frame (x right, y down, z = 0), m."""
        return self.opencv.getChessboardCorners().astype(np.float64)

    @cached_property
    def _detector(self) -> cv2.aruco.CharucoDetector:
        return cv2.aruco.CharucoDetector(self.opencv)

    def detect(self, image: np.ndarray) -> BoardView | None:
        """uint8 [H, W] or BGR [H, W, 3] -> the corners found, or None below MIN_CORNERS."""
        corners, ids, _, _ = self._detector.detectBoard(_gray(image))
        if ids is None or len(ids) < MIN_CORNERS:
            return None
        return BoardView(
            ids.reshape(-1).astype(np.int64), corners.reshape(-1, 2).astype(np.float64)
        )


@dataclass(frozen=True)
class Checkerboard:
    """A checkerboard: inner corners (columns, rows) and square length in metres. Its corners
    have no identity under a half turn, so it serves intrinsics only (docs/rig.md)."""

    corners: tuple[int, int]
    square_length: float

    def __post_init__(self) -> None:
        if min(self.corners) < 2 or not self.square_length > 0:
            raise CalibrationError(
                f"checkerboard: need at least 2x2 inner corners and square_length > 0, "
                f"got {self.corners}, {self.square_length}"
            )

    @cached_property
    def object_points(self) -> np.ndarray:
        """float64 [N, 3]: inner corners row by row, as findChessboardCorners orders them."""
        cols, rows = self.corners
        grid = np.mgrid[0:cols, 0:rows].T.reshape(-1, 2) * self.square_length
        return np.column_stack([grid, np.zeros(len(grid))])

    def detect(self, image: np.ndarray) -> BoardView | None:
        """uint8 [H, W] or BGR [H, W, 3] -> all corners, or None if the board is not found."""
        gray = _gray(image)
        found, corners = cv2.findChessboardCorners(gray, self.corners, None)
        if found:
            corners = cv2.cornerSubPix(gray, corners, SUBPIX_WINDOW, (-1, -1), SUBPIX_CRITERIA)
        else:
            found, corners = cv2.findChessboardCornersSB(gray, self.corners)
        if not found:
            return None
        return BoardView(np.arange(len(corners)), corners.reshape(-1, 2).astype(np.float64))


Board = Charuco | Checkerboard


def _gray(image: np.ndarray) -> np.ndarray:
    image = np.asarray(image)
    if image.dtype != np.uint8 or not (
        image.ndim == 2 or (image.ndim == 3 and image.shape[2] in (1, 3))
    ):
        raise CalibrationError(
            f"board images must be uint8 [H, W] or BGR [H, W, 3], got {image.dtype} {image.shape}"
        )
    return (
        cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)
        if image.ndim == 3 and image.shape[2] == 3
        else image.reshape(image.shape[:2])
    )
