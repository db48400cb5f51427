"""The post-processing stages: Dark (heatmaps -> keypoints in frame pixels), FaceMatch
(embeddings -> gallery identities, hot reload) and ClipLabels (zero-shot probabilities)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from npu.models.clip.post import ZeroShotError, label_probabilities, logits_and_probs
from pipeline.config import parse_config
from pipeline.graph import Context, Outbox
from pipeline.messages import Frame, now_ns
from pipeline.metrics import Metrics
from pipeline.queues import BoundedQueue
from pipeline.wire import decode, encode_result
from stages.gallery import GalleryFile
from stages.jobs import Inferred
from stages.models.adaface.job import FaceInferred, FaceJob
from stages.models.adaface.post import FaceMatch, FaceMatchOptions
from stages.models.adaface.result import FaceResult
from stages.models.clip.job import ClipInferred, ClipJob
from stages.models.clip.post import ClipLabels, ClipLabelsOptions
from stages.models.clip.result import ClipResult
from stages.models.sapiens2.job import PoseInferred, PoseJob
from stages.models.sapiens2.post import Dark, DarkOptions
from stages.models.sapiens2.result import PoseResult
from stages.postprocess import PostprocessError
from stages.tracker import PersonTracker
from stages.tracks import TrackRegistry
from tests.stages.stream_fakes import peaked_heatmaps


def context(tmp_path: Path) -> Context:
    config = parse_config({"stages": [{"kind": "capture"}]}, tmp_path / "run.toml")
    return Context(config, Metrics())


def frame_fields(seq: int = 3) -> dict:
    t = now_ns()
    return {"camera": "cam", "seq": seq, "capture_ts_ns": t, "deadline_ns": t + 10**10}


def pose_item(heatmaps: np.ndarray, window, track_id: int = 4) -> Inferred:
    job = PoseJob(
        **frame_fields(),
        track_id=track_id,
        box_xywh=np.array([10, 20, 30, 60], np.float32),
        score=0.9,
        image=np.zeros((4, 4, 3), np.uint8),
        pose_age_s=0.5,
        window=np.asarray(window, np.float32),
    )
    return PoseInferred(job=job, output=heatmaps, backend="sim", model="m", synthetic=True)


# ---- Dark ---------------------------------------------------------------------------------


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


# ---- FaceMatch ----------------------------------------------------------------------------


def face_item(embedding: np.ndarray) -> Inferred:
    job = FaceJob(
        **frame_fields(),
        box_xywh=np.array([5, 6, 20, 24], np.float32),
        score=0.8,
        landmarks=np.arange(10, dtype=np.float32).reshape(5, 2),
        track_id=2,
        landmark_source="yunet",
    )
    return FaceInferred(job=job, output=embedding, backend="sim", model="adaface", synthetic=False)


def unit(rng: np.random.Generator, d: int = 512) -> np.ndarray:
    v = rng.normal(size=d).astype(np.float32)
    return v / np.linalg.norm(v)


def test_face_match_identifies_an_enrolled_face_and_returns_null_below_threshold(tmp_path):
    rng = np.random.default_rng(0)
    alice, bob = unit(rng), unit(rng)
    GalleryFile(tmp_path / "gallery.npz").enrol("alice", alice[None])
    GalleryFile(tmp_path / "gallery.npz").enrol("bob", bob[None])
    stage = FaceMatch("face", FaceMatchOptions(gallery="gallery.npz"), context(tmp_path))

    probe = 3.0 * (alice + 0.3 * unit(rng))  # any norm: the stage normalises
    (r,) = stage.process(face_item(probe))
    assert isinstance(r, FaceResult) and r.identity == "alice"
    expected = float(alice @ probe / np.linalg.norm(probe))
    assert r.similarity == pytest.approx(expected, abs=1e-5)
    assert r.margin == pytest.approx(expected - float(bob @ probe / np.linalg.norm(probe)), 1e-4)
    assert np.linalg.norm(r.embedding) == pytest.approx(1.0, abs=1e-6)
    assert r.extra["reason"] == "match" and r.track_id == 2

    (stranger,) = stage.process(face_item(unit(rng)))
    assert stranger.identity is None and stranger.extra["reason"] == "below_threshold"
    assert stranger.similarity < 0.4


def test_face_match_hot_reloads_the_gallery(tmp_path):
    rng = np.random.default_rng(1)
    carol = unit(rng)
    path = tmp_path / "gallery.npz"
    GalleryFile(path).enrol("dave", unit(rng)[None])
    stage = FaceMatch(
        "face", FaceMatchOptions(gallery="gallery.npz", reload_interval_s=0), context(tmp_path)
    )
    assert stage.process(face_item(carol))[0].identity is None
    GalleryFile(path).enrol("carol", carol[None])  # another process enrols; atomic replace
    assert stage.process(face_item(carol))[0].identity == "carol"
    path.write_bytes(b"not a gallery")  # a corrupt file keeps the previous gallery
    assert stage.process(face_item(carol))[0].identity == "carol"
    assert stage.gallery.last_error is not None


def test_face_match_without_gallery_publishes_the_embedding_on_the_wire(tmp_path):
    stage = FaceMatch("face", FaceMatchOptions(), context(tmp_path))
    e = unit(np.random.default_rng(2), 64)
    (r,) = stage.process(face_item(2 * e))
    msg = decode(encode_result(r, now_ns()))
    assert msg.topic == "face/cam" and msg.header["identity"] is None
    assert msg.header["synthetic"] is False and msg.header["model"] == "adaface"
    np.testing.assert_allclose(msg.arrays["embedding"], e, atol=1e-6)
    np.testing.assert_array_equal(msg.arrays["box"], [5, 6, 25, 30])
    assert msg.arrays["landmarks"].shape == (5, 2)
    with pytest.raises(PostprocessError, match="zero or not finite"):
        stage.process(face_item(np.zeros(64, np.float32)))


# ---- ClipLabels ---------------------------------------------------------------------------


def clip_item(image_embed, text, labels, scale=100.0, track_id=None) -> Inferred:
    job = ClipJob(
        **frame_fields(),
        box_xywh=np.array([0, 0, 64, 48], np.float32),
        image=np.zeros((48, 64, 3), np.uint8),
        track_id=track_id,
    )
    extra = {"labels": labels, "text_embeds": text, "logit_scale": scale}
    return ClipInferred(job=job, output=image_embed, backend="cpu", model="clip", synthetic=True,
                    extra=extra)  # fmt: skip


def test_clip_labels_probabilities_sum_to_1_with_the_right_top_label(tmp_path):
    rng = np.random.default_rng(3)
    labels = ["a dog", "a cat", "a person wearing a hard hat", "a phone"]
    text = rng.normal(size=(4, 16)).astype(np.float32)
    image = (text[2] / np.linalg.norm(text[2]) + 0.2 * rng.normal(size=16)).astype(np.float32)
    stage = ClipLabels("clip", ClipLabelsOptions(), context(tmp_path))
    (r,) = stage.process(clip_item(image, text, labels, track_id=7))
    assert isinstance(r, ClipResult)
    assert r.probabilities.sum() == pytest.approx(1.0, abs=1e-6)
    assert r.top[0] == "a person wearing a hard hat"
    _, ref = logits_and_probs(image[None], text, 100.0)  # the CLIP model's own zero-shot
    np.testing.assert_allclose(r.probabilities, ref[0], atol=1e-6)
    msg = decode(encode_result(r, now_ns()))
    assert msg.topic == "clip/cam" and msg.header["top_label"] == "a person wearing a hard hat"
    assert msg.header["labels"] == labels and msg.header["track_id"] == 7
    np.testing.assert_allclose(msg.arrays["probabilities"], r.probabilities)


def test_clip_labels_bad_outputs_are_clear_errors(tmp_path):
    stage = ClipLabels("clip", ClipLabelsOptions(), context(tmp_path))
    text = np.eye(3, 8, dtype=np.float32)
    with pytest.raises(PostprocessError, match="2 labels but 3"):
        stage.process(clip_item(np.ones(8, np.float32), text, ["a", "b"]))
    item = clip_item(np.ones(8, np.float32), text, ["a", "b", "c"])
    del item.extra["logit_scale"]
    with pytest.raises(PostprocessError, match="lacks logit_scale"):
        stage.process(item)
    with pytest.raises(ZeroShotError, match=r"\[L >= 1, 5\]"):
        label_probabilities(np.ones(5), text, 100.0)
    assert stage.process(face_item(np.ones(8, np.float32))) == []


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


def test_face_match_warns_once_when_the_gallery_holds_another_models_embeddings(tmp_path, caplog):
    rng = np.random.default_rng(5)
    GalleryFile(tmp_path / "g.npz").enrol("erin", unit(rng)[None], model="IR-101")
    stage = FaceMatch("face", FaceMatchOptions(gallery="g.npz"), context(tmp_path))
    with caplog.at_level("WARNING"):
        stage.process(face_item(unit(rng)))  # face_item's model is "adaface"
        stage.process(face_item(unit(rng)))
    warnings = [r for r in caplog.records if "similarities across models" in r.message]
    assert len(warnings) == 1 and "'IR-101'" in warnings[0].message


# ---- how the graph carries Inferred items to these stages ---------------------------------


def test_a_stale_inferred_is_dropped_stale_under_its_camera_by_the_inbox():
    async def main():
        m = Metrics()
        q = BoundedQueue("dark", 4, "drop_oldest", m)
        item = pose_item(np.zeros((17, 8, 6), np.float32), [20, 30, 40, 60])
        fresh = pose_item(np.zeros((17, 8, 6), np.float32), [20, 30, 40, 60], track_id=5)
        item.job.deadline_ns = now_ns() - 1
        await q.put(item)
        await q.put(fresh)
        q.close()
        return m, [x async for x in q]

    m, got = asyncio.run(main())
    assert [x.job.track_id for x in got] == [5]
    assert m.dropped("dark", "cam", "stale") == 1
    assert m.dropped("dark", "", "stale") == 0


def test_each_inferred_kind_reaches_exactly_its_own_postprocess_inbox():
    async def main():
        m = Metrics()
        stages = {"dark": Dark, "face_match": FaceMatch, "clip_labels": ClipLabels}
        queues = {name: BoundedQueue(name, 8, "drop_oldest", m) for name in stages}
        out = Outbox("infer", [(n, cls.accepts, queues[n]) for n, cls in stages.items()], m)
        text = np.eye(3, 16, dtype=np.float32)
        await out.send(pose_item(np.zeros((17, 8, 6), np.float32), [20, 30, 40, 60]))
        await out.send(face_item(np.ones(16, np.float32)))
        await out.send(clip_item(text[0], text, ["a", "b", "c"]))
        got = {}
        for name, q in queues.items():
            q.close()
            got[name] = [type(x) async for x in q]
        return got

    got = asyncio.run(main())
    assert got == {
        "dark": [PoseInferred],
        "face_match": [FaceInferred],
        "clip_labels": [ClipInferred],
    }


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
