"""The dark stage (stages/models/sapiens2/post.py): heatmaps -> keypoints in frame pixels, the
track's pose refresh finished, and with face_points a FaceJob per pose's face."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.messages import Frame, now_ns
from stages.models.sapiens2.post import Dark, DarkOptions
from stages.models.sapiens2.result import PoseResult
from stages.postprocess import PostprocessError
from stages.tracker import PersonTracker
from stages.tracks import TrackRegistry
from tests.stages.models.inferred_items import context, face_item, pose_item
from tests.stages.stream_fakes import peaked_heatmaps


def test_dark_maps_integer_peaks_to_their_window_pixels(tmp_path):
    h, w = 64, 48
    maps, peaks = peaked_heatmaps(5, h, w)
    window = (100.0, 200.0, 96.0, 128.0)  # cx, cy, w, h of the sampled region
    (result,) = Dark("dark", DarkOptions(), context(tmp_path)).process(pose_item(maps, window))
    assert isinstance(result, PoseResult)
    # UDP: heatmap px x -> cx - w/2 + x * w / (W - 1); a symmetric peak needs no DARK shift
    expect_x = 100.0 - 48.0 + peaks[:, 0] * 96.0 / (w - 1)
    expect_y = 200.0 - 64.0 + peaks[:, 1] * 128.0 / (h - 1)
    np.testing.assert_allclose(result.keypoints[:, 0], expect_x, atol=1e-3)
    np.testing.assert_allclose(result.keypoints[:, 1], expect_y, atol=1e-3)
    np.testing.assert_allclose(result.keypoints[:, 2], 1.0, atol=1e-6)
    assert result.keypoints.dtype == np.float32 and result.keypoints.shape == (5, 3)
    assert result.track_id == 4 and result.synthetic and result.backend == "sim"
    np.testing.assert_array_equal(result.box, [10, 20, 40, 80])
    assert result.since_previous_ms == pytest.approx(500.0)


def test_dark_refines_a_subpixel_peak(tmp_path):
    h, w = 64, 48
    yy, xx = np.mgrid[0:h, 0:w]
    x0, y0 = 20.3, 30.6
    maps = np.exp(-((xx - x0) ** 2 + (yy - y0) ** 2) / 8.0)[None].astype(np.float32)
    window = (0.0, 0.0, float(w - 1) * 2, float(h - 1) * 2)  # 2 image px per heatmap px
    (result,) = Dark("dark", DarkOptions(), context(tmp_path)).process(pose_item(maps, window))
    # Newton on the log of a Gaussian blurred by a Gaussian is exact up to the 11-tap kernel's
    # truncation: within 0.05 heatmap px (0.1 image px here); the argmax alone is 0.4 off.
    assert result.keypoints[0, 0] == pytest.approx(-(w - 1) + 2 * x0, abs=0.1)
    assert result.keypoints[0, 1] == pytest.approx(-(h - 1) + 2 * y0, abs=0.1)


def test_dark_finishes_the_tracks_pose_and_reports_its_age(tmp_path):
    ctx = context(tmp_path)
    tracker = PersonTracker("cam")
    t0 = now_ns()
    (tb,) = tracker.update(np.array([[10, 20, 40, 80]]), np.array([0.9]), t0)
    tracks = TrackRegistry.of(ctx).add("cam", tracker)
    tracker.pose_started(tb.track_id)
    tracks.pose_deadlines[tb.track_id] = t0 + 10**10
    maps, _ = peaked_heatmaps(3, 24, 18)
    item = pose_item(maps, (50, 50, 40, 40), track_id=tb.track_id)
    item.job.capture_ts_ns = t0  # the pose of the frame the tracker saw
    (result,) = Dark("dark", DarkOptions(), ctx).process(item)
    track = tracker.track(tb.track_id)
    assert not track.pose_running and track.pose_ts_ns == item.job.capture_ts_ns
    assert tb.track_id not in tracks.pose_deadlines
    assert result.since_previous_ms is None  # the track's first pose
    assert 0 <= result.age_ms < 5000


def test_dark_ignores_other_jobs_and_rejects_missing_windows(tmp_path):
    dark = Dark("dark", DarkOptions(), context(tmp_path))
    assert dark.process(face_item(np.ones(8, np.float32))) == []
    maps, _ = peaked_heatmaps(2, 24, 18)
    item = pose_item(maps, (1, 1, 1, 1))
    item.job.window = None
    with pytest.raises(PostprocessError, match="no crop window"):
        dark.process(item)


def test_dark_face_points_become_face_jobs_that_detect_sends_on(tmp_path):
    from npu.models.sapiens2.keypoints import face_points
    from stages.align import Align, AlignOptions, align_face
    from stages.detect import Detect, DetectOptions

    ctx = context(tmp_path)
    detect = Detect("detect", DetectOptions(person="none", face="none"), ctx)
    tracks = detect.camera_tracks("cam")
    maps, _ = peaked_heatmaps(308, 64, 48)
    image = np.random.default_rng(4).integers(0, 256, (240, 320, 3), np.uint8)
    item = pose_item(maps, (160, 120, 96, 128))
    item.job.image = image
    (pose,) = Dark("dark", DarkOptions(face_points=True), ctx).process(item)
    (face,) = tracks.pose_faces
    expected = face_points(pose.keypoints)
    assert expected is not None
    np.testing.assert_array_equal(face.landmarks, expected)
    assert face.landmark_source == "sapiens2" and face.track_id == item.job.track_id
    assert face.seq == item.job.seq and face.image is image  # the pose's own frame
    t = now_ns()
    out = detect.process(Frame("cam", 9, t, t + 10**10, image))
    assert face in out and not tracks.pose_faces  # sent once, with detect's next frame
    (aligned,) = Align("align", AlignOptions(), ctx).process(face)
    np.testing.assert_array_equal(aligned.aligned, align_face(image, expected)[0])
    # without the option, or with fewer than 308 keypoints, no face job
    Dark("dark", DarkOptions(), ctx).process(item)
    small = pose_item(peaked_heatmaps(17, 64, 48)[0], (160, 120, 96, 128))
    small.job.image = image
    Dark("dark", DarkOptions(face_points=True), ctx).process(small)
    assert not tracks.pose_faces


def test_dark_keeps_since_previous_when_the_track_expired_while_its_pose_ran(tmp_path):
    """A person who leaves the frame while their second pose is on the device: the tracker
    forgets the track, but the pose still comes from a track that had a pose before."""
    ctx = context(tmp_path)
    tracker = PersonTracker("cam", lost_buffer_s=0.5)
    t0 = now_ns()
    (tb,) = tracker.update(np.array([[10, 20, 40, 80]]), np.array([0.9]), t0)
    tracks = TrackRegistry.of(ctx).add("cam", tracker)
    tracks.finish_pose(tb.track_id, t0, t0)  # its first pose
    maps, _ = peaked_heatmaps(3, 24, 18)
    item = pose_item(maps, (50, 50, 40, 40), track_id=tb.track_id)  # made 0.5 s after it
    tracker.pose_started(tb.track_id)
    tracker.update(np.zeros((0, 4)), np.zeros(0), t0 + 2_000_000_000)  # gone 2 s: expired
    assert tracker.track(tb.track_id) is None
    (result,) = Dark("dark", DarkOptions(), ctx).process(item)
    assert result.since_previous_ms == pytest.approx(500.0)


def test_dark_hands_real_weight_poses_to_the_live_pose_and_never_synthetic_ones(tmp_path):
    ctx = context(tmp_path)
    tracks = TrackRegistry.of(ctx).add("cam", PersonTracker("cam"))
    dark = Dark("dark", DarkOptions(), ctx)
    maps, _ = peaked_heatmaps(3, 24, 18)
    dark.process(pose_item(maps, (50, 50, 40, 40), track_id=7))  # synthetic weights
    assert not tracks.keyframes
    real = pose_item(maps, (50, 50, 40, 40), track_id=7)
    real.synthetic = False
    (result,) = dark.process(real)
    (kf,) = tracks.keyframes
    assert (kf.track_id, kf.seq, kf.capture_ts_ns) == (7, real.job.seq, real.job.capture_ts_ns)
    np.testing.assert_array_equal(kf.keypoints, result.keypoints)
