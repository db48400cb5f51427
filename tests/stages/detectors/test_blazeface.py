"""BlazeFace (short and full range) on real faces, on no face, and on bad input."""

from __future__ import annotations

import numpy as np
import pytest

from stages.detectors.blazeface import BlazeFace
from stages.detectors.detections import DetectorError


@pytest.fixture(scope="module", params=["short", "full"])
def blazeface(request) -> BlazeFace:
    return BlazeFace(request.param)


def _inside(points: np.ndarray, box: np.ndarray, margin: float = 0.0) -> bool:
    x, y, w, h = box
    mx, my = margin * w, margin * h
    return bool(
        np.all(points[:, 0] >= x - mx)
        and np.all(points[:, 0] <= x + w + mx)
        and np.all(points[:, 1] >= y - my)
        and np.all(points[:, 1] <= y + h + my)
    )


def test_astronaut_has_one_face_with_keypoints_inside_its_box(blazeface, astronaut_bgr):
    d = blazeface.detect(astronaut_bgr)
    assert len(d) == 1
    assert d.scores[0] > 0.8
    x, y, w, h = d.boxes[0]
    # the face of skimage's astronaut (Eileen Collins) lies around x 180..270, y 80..180
    assert 160 < x < 200 and 60 < y < 100 and 80 < w < 120 and 80 < h < 120
    kp = d.keypoints[0]
    assert _inside(kp[:4], d.boxes[0])  # eyes, nose, mouth strictly inside
    assert _inside(kp, d.boxes[0], margin=0.05)  # ear tragions sit on the box edge
    assert kp[0, 0] < kp[1, 0]  # subject's right eye is on the image left: template #0


def test_bgr_and_rgb_inputs_agree(blazeface, astronaut_bgr):
    a = blazeface.detect(astronaut_bgr)
    b = blazeface.detect(np.ascontiguousarray(astronaut_bgr[..., ::-1]), colour_order="rgb")
    np.testing.assert_allclose(a.boxes, b.boxes, atol=1e-3)


def test_carphone_face_found_in_every_sampled_frame(carphone_frames):
    detector = BlazeFace("short")
    for i, frame in enumerate(carphone_frames):
        d = detector.detect(frame)
        assert len(d) == 1, f"frame {10 * i}: {len(d)} faces"
        assert d.scores[0] > 0.85
        x, y, w, h = d.boxes[0]
        # the talking face sits in the middle of the 176x144 frame
        assert 30 < x + w / 2 < 130 and 40 < y + h / 2 < 110 and 30 < w < 70
        assert _inside(d.keypoints[0, :4], d.boxes[0])


def test_no_face_in_a_blank_or_noise_image(blazeface):
    assert len(blazeface.detect(np.zeros((240, 320, 3), np.uint8))) == 0
    noise = np.random.default_rng(0).integers(0, 256, (240, 320, 3), dtype=np.uint8)
    d = blazeface.detect(noise)
    assert len(d) == 0
    assert d.boxes.shape == (0, 4) and d.keypoints.shape == (0, 6, 2)


def test_face_cut_by_the_border_gives_clipped_box_and_unclipped_keypoints(astronaut_bgr):
    cut = np.ascontiguousarray(astronaut_bgr[:, 215:])  # the left half of the face is gone
    d = BlazeFace("short").detect(cut)
    for box in d.boxes:
        assert box[0] >= 0 and box[1] >= 0
        assert box[0] + box[2] <= cut.shape[1] and box[1] + box[3] <= cut.shape[0]


def test_tiny_image_and_tiny_face_do_not_crash(astronaut_bgr):
    detector = BlazeFace("short")
    assert len(detector.detect(np.zeros((1, 1, 3), np.uint8))) == 0
    tiny = astronaut_bgr[::16, ::16].copy()  # 32x32: the face is ~6 px
    d = detector.detect(tiny)
    assert d.boxes.shape[1:] == (4,)


@pytest.mark.parametrize(
    "image",
    [np.zeros((10, 10), np.uint8), np.zeros((10, 10, 3), np.float32), "not an image"],
)
def test_bad_image_is_a_clear_error(image):
    with pytest.raises(DetectorError, match="image must be"):
        BlazeFace("short").detect(image)


def test_wrong_model_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "garbage.tflite"
    bad.write_bytes(b"not a flatbuffer")
    with pytest.raises(DetectorError, match="garbage.tflite"):
        BlazeFace("short", model_path=bad)
    with pytest.raises(DetectorError, match="not found"):
        BlazeFace("short", model_path=tmp_path / "missing.tflite")


def test_model_of_the_other_variant_is_rejected_by_shape():
    from pipeline.assets import asset_path

    with pytest.raises(DetectorError, match=r"\[1,128,128,3\]"):
        BlazeFace("short", model_path=asset_path("face_detection_full_range.tflite"))
