"""The face_match stage (stages/models/adaface/post.py): embeddings -> gallery identities, hot
reload, the FaceResult on the wire."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.messages import now_ns
from pipeline.wire import decode, encode_result
from stages.gallery import GalleryFile
from stages.models.adaface.post import FaceMatch, FaceMatchOptions
from stages.models.adaface.result import FaceResult
from stages.postprocess import PostprocessError
from tests.stages.models.inferred_items import context, face_item, unit


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


def test_face_match_warns_once_when_the_gallery_holds_another_models_embeddings(tmp_path, caplog):
    rng = np.random.default_rng(5)
    GalleryFile(tmp_path / "g.npz").enrol("erin", unit(rng)[None], model="IR-101")
    stage = FaceMatch("face", FaceMatchOptions(gallery="g.npz"), context(tmp_path))
    with caplog.at_level("WARNING"):
        stage.process(face_item(unit(rng)))  # face_item's model is "adaface"
        stage.process(face_item(unit(rng)))
    warnings = [r for r in caplog.records if "similarities across models" in r.message]
    assert len(warnings) == 1 and "'IR-101'" in warnings[0].message
