"""The face gallery: file format, round trips, hot reload, corruption, and the quality gate."""

from __future__ import annotations

import importlib.util
import io
import os
import stat
import threading
from pathlib import Path

import cv2
import numpy as np
import pytest
import skimage.data

from npu.models.adaface.checkpoint import from_pretrained as load_adaface
from stages.detectors.blazeface import BlazeFace
from stages.gallery import (
    FORMAT,
    FaceEncoder,
    Gallery,
    GalleryError,
    GalleryFile,
    QualityGate,
    decode_gallery,
    encode_gallery,
    read_gallery,
    read_image,
    write_gallery,
)

D = 16


def _unit(rng, n=1, d=D):
    e = rng.normal(size=(n, d)).astype(np.float32)
    return e / np.linalg.norm(e, axis=1, keepdims=True)


def _torch_ref():
    path = Path(__file__).resolve().parents[1] / "npu" / "models" / "adaface_torch_ref.py"
    spec = importlib.util.spec_from_file_location("adaface_torch_ref", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> FaceEncoder:
    import torch

    torch.set_num_threads(1)
    ref = _torch_ref()
    path = ref.save_cvlface_dir(ref.tiny_ir(seed=5), tmp_path_factory.mktemp("m") / "ir")
    return FaceEncoder(BlazeFace("short"), load_adaface(path))


@pytest.fixture(scope="module")
def astronaut() -> np.ndarray:
    return cv2.cvtColor(skimage.data.astronaut(), cv2.COLOR_RGB2BGR)


# ---- matching ---------------------------------------------------------------------------


def test_identify_accepts_by_threshold_and_margin():
    rng = np.random.default_rng(0)
    a, b = _unit(rng, 2)
    g = Gallery.empty(D).add("ann", a).add("bob", b)
    m = g.identify(a * 3.0, threshold=0.5, margin=0.05)
    assert (m.name, m.reason) == ("ann", "match") and m.similarity == pytest.approx(1.0)
    assert m.second == pytest.approx(float(a @ b))
    # halfway between the two: above the threshold, but no margin
    m = g.identify(a + b, threshold=0.1, margin=0.05)
    assert m.name is None and m.reason == "ambiguous" and m.best in ("ann", "bob")
    m = g.identify(_unit(rng)[0], threshold=0.99, margin=0.0)
    assert m.name is None and m.reason == "below_threshold"
    assert Gallery.empty(D).identify(a, 0.5, 0.05).reason == "empty_gallery"


def test_identity_scores_its_best_sample_and_remove_drops_all_samples():
    rng = np.random.default_rng(1)
    s = _unit(rng, 3)
    g = Gallery.empty(D).add("ann", s[:2]).add("bob", s[2])
    assert g.identities() == {"ann": 2, "bob": 1}
    assert g.identify(s[1], 0.5, 0.0).name == "ann"
    g2 = g.remove("ann")
    assert g2.identities() == {"bob": 1} and g2.embeddings.shape == (1, D)
    with pytest.raises(GalleryError, match="no identity 'ann'"):
        g2.remove("ann")


@pytest.mark.parametrize("name", ["", " ann", "a\nb", "x" * 129])
def test_bad_identity_names_are_refused(name):
    with pytest.raises(GalleryError, match="identity name"):
        Gallery.empty(D).add(name, np.ones(D))


def test_bad_embeddings_are_refused():
    with pytest.raises(GalleryError, match="dim 8"):
        Gallery.empty(D).add("ann", np.ones(8))
    with pytest.raises(GalleryError, match="finite and non-zero"):
        Gallery.empty(D).add("ann", np.zeros(D))


# ---- the file ---------------------------------------------------------------------------


def test_file_round_trip_is_atomic_private_and_pickle_free(tmp_path):
    rng = np.random.default_rng(2)
    path = tmp_path / "g.npz"
    store = GalleryFile(path, embed_dim=D, model="IR-x:abc")
    store.enrol("ann", _unit(rng, 2), model="IR-x:abc")
    store.enrol("bob", _unit(rng), model="IR-x:abc")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["g.npz"]  # no temp file left behind
    # a restart: a new object reads what the old one wrote
    again = GalleryFile(path)
    assert again.current.identities() == {"ann": 2, "bob": 1}
    assert again.current.model == "IR-x:abc"
    np.testing.assert_array_equal(again.current.embeddings, store.current.embeddings)
    with np.load(path, allow_pickle=False) as z:  # the documented layout
        assert set(z.files) == {"names", "embeddings", "meta"}
        assert z["embeddings"].dtype == np.float32
    with pytest.raises(GalleryError, match="holds 'IR-x:abc' embeddings"):
        store.enrol("cy", _unit(rng), model="IR-y:def")
    store.remove("ann")
    assert read_gallery(path).identities() == {"bob": 1}


def test_corrupt_files_give_errors_naming_the_file_and_field(tmp_path):
    rng = np.random.default_rng(3)
    good = encode_gallery(Gallery.empty(D).add("ann", _unit(rng)))
    with pytest.raises(GalleryError, match="here: not a readable face gallery"):
        decode_gallery(b"garbage", "here")
    with pytest.raises(GalleryError, match="not a readable"):
        decode_gallery(good[: len(good) // 2], "here")
    buf = io.BytesIO()
    np.savez(buf, names=np.array(["a"]), embeddings=np.ones((1, D), np.float32))
    with pytest.raises(GalleryError, match="missing \\['meta'\\]"):
        decode_gallery(buf.getvalue(), "here")
    buf = io.BytesIO()
    meta = np.frombuffer(
        f'{{"format": "{FORMAT}", "version": 99, "embed_dim": {D}}}'.encode(), np.uint8
    )
    np.savez(buf, names=np.array(["a"]), embeddings=_unit(rng), meta=meta)
    with pytest.raises(GalleryError, match="meta.version"):
        decode_gallery(buf.getvalue(), "here")
    buf = io.BytesIO()  # an object array would need pickle: refused, never unpickled
    np.savez(buf, names=np.array([{"x": 1}], dtype=object), embeddings=_unit(rng), meta=meta)
    with pytest.raises(GalleryError, match="here"):
        decode_gallery(buf.getvalue(), "here")
    with pytest.raises(GalleryError, match="no such gallery"):
        read_gallery(tmp_path / "missing.npz")


def test_hot_reload_picks_up_changes_and_a_corrupt_file_keeps_the_previous(tmp_path):
    rng = np.random.default_rng(4)
    a, b = _unit(rng, 2)
    path = tmp_path / "g.npz"
    write_gallery(path, Gallery.empty(D).add("ann", a))
    live = GalleryFile(path)
    assert not live.reload_if_changed()  # unchanged
    write_gallery(path, read_gallery(path).add("bob", b))  # another process enrols
    assert live.reload_if_changed()
    assert live.current.identify(b, 0.5, 0.05).name == "bob"
    path.write_bytes(b"half-written junk")
    assert not live.reload_if_changed()
    assert "g.npz" in str(live.last_error) and "not a readable" in str(live.last_error)
    assert live.current.identify(b, 0.5, 0.05).name == "bob"  # previous gallery in use
    path.unlink()
    assert not live.reload_if_changed() and "vanished" in str(live.last_error)
    write_gallery(path, Gallery.empty(D).add("cy", a))
    assert live.reload_if_changed() and live.last_error is None
    assert live.current.identities() == {"cy": 1}


def test_reload_while_identifying_never_sees_a_broken_gallery(tmp_path):
    rng = np.random.default_rng(5)
    people = {f"p{i}": _unit(rng)[0] for i in range(8)}
    path = tmp_path / "g.npz"
    write_gallery(path, Gallery.empty(D).add("p0", people["p0"]))
    live = GalleryFile(path)
    errors: list[BaseException] = []
    stop = threading.Event()

    def identify_loop():
        try:
            while not stop.is_set():
                g = live.current
                m = g.identify(people["p0"], 0.5, 0.0)
                assert m.name == "p0" or m.reason == "ambiguous"
                assert len(g.names) == g.embeddings.shape[0]
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    reader = threading.Thread(target=identify_loop)
    reader.start()
    writer = GalleryFile(path)
    reloads = 0
    for name, e in list(people.items())[1:]:
        writer.enrol(name, e)
        os.utime(path, ns=(1, 10**9 * reloads + 7))  # make the stamp change even in 1 tick
        reloads += live.reload_if_changed()
    stop.set()
    reader.join()
    assert not errors
    assert reloads == 7 and len(live.current.identities()) == 8


# ---- enrolment from images --------------------------------------------------------------


def test_enrol_and_identify_the_astronaut(encoder, astronaut, tmp_path):
    gate = QualityGate()
    sample = encoder.enrolment_sample(astronaut, gate, "astronaut")
    store = GalleryFile(tmp_path / "g.npz", embed_dim=encoder.embedder.embed_dim())
    store.enrol("eileen", sample)
    brighter = cv2.convertScaleAbs(astronaut, alpha=1.0, beta=12)
    faces = encoder.faces(brighter)
    assert len(faces) == 1
    m = store.current.identify(faces[0].embedding, threshold=0.9, margin=0.0)
    assert m.name == "eileen" and m.similarity > 0.95


def test_quality_gate_reasons(encoder, astronaut):
    gate = QualityGate()
    with pytest.raises(GalleryError, match="blank: no face found"):
        encoder.enrolment_sample(np.zeros((200, 200, 3), np.uint8), gate, "blank")
    small = cv2.resize(astronaut, (128, 128), interpolation=cv2.INTER_AREA)
    with pytest.raises(GalleryError, match="small: rejected: face too small"):
        encoder.enrolment_sample(small, gate, "small")
    blurred = cv2.GaussianBlur(astronaut, (0, 0), 3)
    with pytest.raises(GalleryError, match="blurred: rejected: too blurry"):
        encoder.enrolment_sample(blurred, gate, "blurred")
    cut = np.ascontiguousarray(astronaut[60:, 200:])  # face runs off the left edge
    with pytest.raises(GalleryError, match="cut: (rejected: face cut by the image border|no face)"):
        encoder.enrolment_sample(cut, gate, "cut")
    strict = QualityGate(min_score=0.999)
    with pytest.raises(GalleryError, match="detector score"):
        encoder.enrolment_sample(astronaut, strict, "strict")


def test_read_image_rejects_non_images(tmp_path):
    bad = tmp_path / "notes.jpg"
    bad.write_text("this is not a jpeg")
    with pytest.raises(GalleryError, match="notes.jpg: not a readable image"):
        read_image(bad)
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    with pytest.raises(GalleryError, match="empty.png: not a readable image"):
        read_image(empty)
    with pytest.raises(GalleryError, match="no such image"):
        read_image(tmp_path / "missing.png")


def test_turned_faces_are_rejected_by_nose_offset(astronaut):
    from stages.align import ARCFACE_TEMPLATE
    from stages.gallery import FaceObservation, nose_offset

    assert abs(nose_offset(ARCFACE_TEMPLATE)) < 1e-3
    turned = ARCFACE_TEMPLATE.copy()
    turned[2, 0] = turned[0, 0] + 0.1 * (turned[1, 0] - turned[0, 0])  # nose near one eye
    assert nose_offset(turned) == pytest.approx(-0.4, abs=0.01)
    assert nose_offset(np.zeros((5, 2))) == 0.0  # degenerate eyes: no verdict, no crash
    crop = np.ascontiguousarray(astronaut[80:192, 170:282])
    face = FaceObservation(
        np.array([0, 0, 100, 100], np.float32), 0.95, turned, crop, np.eye(2, 3), 500.0, False
    )
    assert "face turned aside: nose offset -0.40" in QualityGate().reject_reason(face)
    face.keypoints = ARCFACE_TEMPLATE
    assert QualityGate().reject_reason(face) is None
