"""stages/landmarks/video.py: a recorded clip's people on the 308 keypoints, frame by frame, as
the tracker gives them (the tracker itself is checked against MediaPipe in
test_landmarks_reference.py)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from pipeline.assets import asset_path
from stages.landmarks.schema import BODY_IDX, hand_indices
from stages.landmarks.video import VideoError, video_people


@pytest.mark.timeout(300)
def test_the_first_frames_of_a_person_walking_give_body_and_hand_keypoints():
    clip = asset_path("pose2sim_single_cam01.mp4")
    found = video_people(clip, max_people=1, frames=4, hands=True)
    cap = cv2.VideoCapture(str(clip))
    ok, image = cap.read()
    cap.release()
    assert ok
    assert found.size == (image.shape[1], image.shape[0])
    assert found.keypoints.shape == (4, 1, 308, 3) and found.track_ids == (0,)
    body = found.keypoints[:, 0, BODY_IDX]
    assert np.isfinite(body).all()
    assert ((body[..., 0] >= 0) & (body[..., 0] < found.size[0])).mean() > 0.9
    hands = [hand_indices(side)[0] for side in ("left", "right")]
    assert any(np.isfinite(found.keypoints[:, 0, idx]).all() for idx in hands)
    others = np.ones(308, bool)
    others[BODY_IDX] = False
    for idx in hands:
        others[idx] = False
    rest = found.keypoints[:, 0, others]  # face and the rest: not asked
    assert np.isnan(rest[..., :2]).all() and (rest[..., 2] == 0).all()


@pytest.mark.timeout(300)
def test_body_only_leaves_the_hands_to_the_body_models_wrists():
    found = video_people(asset_path("pose2sim_single_cam01.mp4"), frames=2)
    left = hand_indices("left")[0]
    assert np.isnan(found.keypoints[:, 0, left[1:], :2]).all()
    assert np.isfinite(found.keypoints[:, 0, left[0]]).all()  # the wrist, from the body


def test_a_file_that_is_not_a_video_is_named(tmp_path):
    bad = tmp_path / "cam09.mp4"
    bad.write_text("not a video")
    with pytest.raises(VideoError, match="cam09.mp4"):
        video_people(bad)
