"""The ONNX person detector's three output formats, on tiny ONNX graphs built in the test.

Each graph returns a fixed output tensor (plus 0 x the input's mean, so OpenCV keeps the
input connected), so the expected person boxes are known exactly: they are placed in the
letterboxed 64x64 model input and must come back in the 128x64 image's pixels.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from stages.detectors.detections import DetectorError  # noqa: E402
from stages.detectors.onnx_person import OnnxPersonDetector  # noqa: E402

SIZE = 64
IMAGE = np.full((64, 128, 3), 90, np.uint8)  # letterboxed: scale 0.5, pad_y 16


def _const_model(path, outputs: dict[str, np.ndarray]) -> str:
    nodes = [helper.make_node("ReduceMean", ["input"], ["m"], keepdims=1)]
    nodes.append(helper.make_node("Mul", ["m", "zero"], ["m0"]))
    inits = [numpy_helper.from_array(np.zeros((1, 1, 1, 1), np.float32), "zero")]
    outs = []
    for i, (name, value) in enumerate(outputs.items()):
        inits.append(numpy_helper.from_array(value.astype(np.float32), f"c{i}"))
        nodes.append(helper.make_node("Reshape", ["m0", f"s{i}"], [f"z{i}"]))
        inits.append(numpy_helper.from_array(np.array([1, 1, 1], np.int64), f"s{i}"))
        nodes.append(helper.make_node("Add", [f"c{i}", f"z{i}"], [name]))
        outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(value.shape)))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
        outs,
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


# two persons in input pixels (cx, cy, w, h), plus a duplicate of the first and a car
PERSON_A = [20, 32, 16, 24]  # -> image x 24..56, y 8..56
PERSON_B = [48, 30, 8, 8]  # -> image x 88..104, y 20..36


def _yolo_rows(objectness: bool) -> np.ndarray:
    rows = []
    for box, person, car in [
        (PERSON_A, 0.9, 0.1),
        ([21, 32, 16, 24], 0.8, 0.1),  # overlaps A: suppressed
        (PERSON_B, 0.7, 0.0),
        ([10, 10, 5, 5], 0.05, 0.95),  # a car
    ]:
        rows.append(box + ([1.0] if objectness else []) + [person, car])
    rows += [[0.0] * len(rows[0])] * 60  # real heads have far more rows than attributes
    return np.array(rows, np.float32)


def _check_two_persons(d):
    assert len(d) == 2
    np.testing.assert_allclose(d.boxes[0], [24, 8, 32, 48], atol=0.01)
    np.testing.assert_allclose(d.boxes[1], [88, 20, 16, 16], atol=0.01)
    assert d.scores[0] == pytest.approx(0.9, abs=1e-4) and d.keypoints.shape == (2, 0, 2)


def test_yolov8_channels_first_and_last(tmp_path):
    rows = _yolo_rows(objectness=False)
    for name, out in [("first", rows.T[None]), ("last", rows[None])]:
        path = _const_model(tmp_path / f"{name}.onnx", {"output0": out})
        _check_two_persons(OnnxPersonDetector(path, "yolov8", input_size=SIZE).detect(IMAGE))


def test_yolov5_multiplies_objectness(tmp_path):
    rows = _yolo_rows(objectness=True)
    rows[2, 4] = 0.5  # B: 0.5 * 0.7 = 0.35 < min_score
    path = _const_model(tmp_path / "v5.onnx", {"output": rows[None]})
    d = OnnxPersonDetector(path, "yolov5", input_size=SIZE, min_score=0.5).detect(IMAGE)
    assert len(d) == 1
    np.testing.assert_allclose(d.boxes[0], [24, 8, 32, 48], atol=0.01)


def test_detr_boxes_and_logits(tmp_path):
    boxes = np.array([PERSON_B, PERSON_A, [10, 10, 5, 5]], np.float32)[None] / SIZE
    logits = np.array([[-5, 0.847], [-5, 2.197], [3, -4]], np.float32)[None]  # sig .7/.9
    path = _const_model(tmp_path / "detr.onnx", {"dets": boxes, "labels": logits})
    d = OnnxPersonDetector(path, "detr", input_size=SIZE, person_class=1).detect(IMAGE)
    _check_two_persons(d)


def test_format_and_file_errors(tmp_path):
    rows = _yolo_rows(objectness=False)[None]
    path = _const_model(tmp_path / "m.onnx", {"output0": rows})
    with pytest.raises(DetectorError, match="output_format"):
        OnnxPersonDetector(path, "ssd")
    with pytest.raises(DetectorError, match="person_class 7 not among the 2 classes"):
        OnnxPersonDetector(path, "yolov8", input_size=SIZE, person_class=7).detect(IMAGE)
    with pytest.raises(DetectorError, match="detr format needs 2 outputs"):
        OnnxPersonDetector(path, "detr", input_size=SIZE).detect(IMAGE)
    with pytest.raises(DetectorError, match="not found"):
        OnnxPersonDetector(tmp_path / "none.onnx", "yolov8")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"junk")
    with pytest.raises(DetectorError, match="bad.onnx: OpenCV cannot load"):
        OnnxPersonDetector(bad, "yolov8")


def test_no_person_above_threshold_is_empty(tmp_path):
    rows = _yolo_rows(objectness=False)
    rows[:, 4] = 0.01
    path = _const_model(tmp_path / "none.onnx", {"output0": rows[None]})
    d = OnnxPersonDetector(path, "yolov8", input_size=SIZE).detect(IMAGE)
    assert len(d) == 0 and d.boxes.shape == (0, 4)
