"""YuNet's row layout -> DetectorOutput, and clear errors without a model.

No YuNet weights ship in any wheel here (docs/architecture.md, "Assets"), so the detector
itself is only tested for its error paths; the row mapping is tested on rows in FaceDetectorYN's
layout.
"""

from __future__ import annotations

import numpy as np
import pytest

from stages.align import ARCFACE_TEMPLATE, align_face
from stages.detectors.detections import DetectorError
from stages.detectors.yunet import YuNet, yunet_rows_to_detections


def test_rows_map_to_boxes_template_ordered_points_and_scores():
    row = np.zeros(15, np.float32)
    row[0:4] = [-5, 10, 50, 60]  # a face running off the left edge
    row[4:14] = (ARCFACE_TEMPLATE * 0.5 + 20).reshape(-1)
    row[14] = 0.93
    d = yunet_rows_to_detections(row[None], width=100, height=100)
    np.testing.assert_allclose(d.boxes, [[0, 10, 45, 60]])
    np.testing.assert_allclose(d.scores, [0.93])
    _, m = align_face(np.zeros((100, 100, 3), np.uint8), d.keypoints[0])
    np.testing.assert_allclose(m[:, :2], 2 * np.eye(2), atol=1e-4)  # points in template order
    assert len(yunet_rows_to_detections(None, 10, 10)) == 0


def test_missing_or_bad_model_is_a_clear_error(tmp_path):
    with pytest.raises(DetectorError, match="YuNet model not found"):
        YuNet(tmp_path / "face_detection_yunet.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not onnx")
    with pytest.raises(DetectorError, match="bad.onnx"):
        YuNet(bad)
