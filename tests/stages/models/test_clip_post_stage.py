"""The clip_labels stage (stages/models/clip/post.py): zero-shot label probabilities."""

from __future__ import annotations

import numpy as np
import pytest

from npu.models.clip.post import ZeroShotError, label_probabilities, logits_and_probs
from pipeline.messages import now_ns
from pipeline.wire import decode, encode_result
from stages.models.clip.post import ClipLabels, ClipLabelsOptions
from stages.models.clip.result import ClipResult
from stages.postprocess import PostprocessError
from tests.stages.models.inferred_items import clip_item, context, face_item


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
