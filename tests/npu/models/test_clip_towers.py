"""CLIP towers (cpu backend) against HF CLIPModel (transformers 5.23.0) on tiny random models.

Tolerances: float32 numpy vs float32 torch differ only in summation order, LN-affine folding
(done in float64) and the erf approximation in npu.ops.gelu (|err| <= 1.5e-7), so embeddings
agree to cosine >= 0.99999 and probabilities to 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest_clip import tiny_clip_dir, tiny_clip_quick_gelu_dir  # noqa: F401 (fixtures)

from npu.models.clip.checkpoint import from_pretrained as load_clip
from npu.models.clip.model import ClipInputError, EncodeInputError
from npu.models.clip.preprocess import ImageInputError
from npu.models.clip.tokenizer import TokenizerError

torch = pytest.importorskip("torch")
torch.set_num_threads(1)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return (a64 * b64).sum(1) / np.linalg.norm(a64, axis=1) / np.linalg.norm(b64, axis=1)


def pooled(out) -> np.ndarray:
    """get_*_features returns a tensor or (in v5) an output with the projected pooler_output."""
    return getattr(out, "pooler_output", out).detach().numpy()


@pytest.fixture(scope="module", params=["gelu", "quick_gelu"])
def models(request, tiny_clip_dir, tiny_clip_quick_gelu_dir):  # noqa: F811
    from transformers import CLIPModel

    path = tiny_clip_dir if request.param == "gelu" else tiny_clip_quick_gelu_dir
    return load_clip(path), CLIPModel.from_pretrained(path).eval(), path


PROMPTS = ["a photo of a cat", "a person wearing a hard hat", "x " * 90, "don't 42!", "a", "dog",
           "a person holding a phone", "kitchen", "pizza at night"]  # fmt: skip


def test_image_embeddings_match_hf(models):
    ours, hf, _ = models
    pixels = np.random.default_rng(0).standard_normal((5, 3, 224, 224)).astype(np.float32)
    with torch.no_grad():
        ref = pooled(hf.get_image_features(pixel_values=torch.from_numpy(pixels)))
    got = ours.encode_images(pixels)
    assert got.shape == ref.shape == (5, 24)
    assert cosines(got, ref).min() >= 0.99999
    assert np.allclose(got, ref, rtol=1e-4, atol=1e-5)
    # different images really give different embeddings
    assert cosines(got[:1].repeat(4, 0), got[1:]).max() < 0.999


def test_text_embeddings_match_hf(models):
    ours, hf, _ = models
    ids, mask = ours.tokenizer(PROMPTS)
    with torch.no_grad():
        ref = pooled(
            hf.get_text_features(
                input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)
            )
        )
    got = ours.encode_texts(ids)
    assert got.shape == ref.shape == (len(PROMPTS), 24)
    assert cosines(got, ref).min() >= 0.99999
    assert np.allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_logits_and_probabilities_match_hf(models):
    from transformers import CLIPImageProcessor

    ours, hf, _ = models
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, shape, dtype=np.uint8) for shape in
              [(240, 320, 3), (224, 224, 3), (500, 90, 3)]]  # fmt: skip
    labels = ["cat", "dog", "person wearing a hard hat", "bicycle"]
    result = ours.classify(images, labels)
    proc = CLIPImageProcessor()
    pixels = proc(images=images, return_tensors="pt", input_data_format="channels_last")
    ids, mask = ours.tokenizer([f"a photo of a {label}" for label in labels])
    with torch.no_grad():
        out = hf(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            pixel_values=pixels["pixel_values"],
        )
    ref_logits = out.logits_per_image.numpy()
    assert result.backend == "cpu"
    assert result.probs.shape == (3, 4)
    assert np.allclose(result.logits, ref_logits, atol=1e-4)
    assert np.allclose(result.probs, ref_logits_softmax(ref_logits), atol=1e-5)
    assert np.allclose(result.probs.sum(1), 1.0, atol=1e-6)
    assert result.prompts[2] == "a photo of a person wearing a hard hat"


def ref_logits_softmax(logits: np.ndarray) -> np.ndarray:
    return torch.softmax(torch.from_numpy(logits), dim=1).numpy()


def test_partial_batch_equals_the_same_item_in_a_full_pass(models):
    ours, _, _ = models
    rng = np.random.default_rng(5)
    pixels = rng.standard_normal((4, 3, 224, 224)).astype(np.float32)
    full = ours.encode_images(pixels)
    alone = ours.encode_images(pixels[:1])
    assert alone.shape == (1, 24)
    assert np.array_equal(alone[0], full[0])
    last = ours.encode_images(pixels[3:])
    assert np.allclose(last[0], full[3], rtol=1e-5, atol=1e-6)

    ids, _ = ours.tokenizer(PROMPTS[:8])
    full_t = ours.encode_texts(ids)
    three = ours.encode_texts(ids[:3])
    assert three.shape == (3, 24)
    assert np.array_equal(three, full_t[:3])


def test_label_embeddings_are_cached_until_the_labels_change(models):
    ours, _, _ = models
    first = ours.label_embeddings(["cat", "dog"])
    assert ours.label_embeddings(["cat", "dog"]) is first
    changed = ours.label_embeddings(["cat", "bicycle"])
    assert changed is not first
    assert np.array_equal(changed[0], first[0]) and not np.allclose(changed[1], first[1])
    other_template = ours.label_embeddings(["cat", "dog"], template="a {} in the street")
    assert not np.allclose(other_template, first)


def test_bad_requests_raise_clear_errors(models):
    ours, _, _ = models
    image = np.zeros((50, 60, 3), np.uint8)
    with pytest.raises(ClipInputError, match="label list is empty"):
        ours.classify([image], [])
    with pytest.raises(TokenizerError, match="no letters"):
        ours.classify([image], ["cat", "123 !!"])
    with pytest.raises(ClipInputError, match="empty"):
        ours.classify([image], ["cat", "  "])
    with pytest.raises(ClipInputError, match="exactly once"):
        ours.classify([image], ["cat"], template="a photo")
    with pytest.raises(ImageInputError, match="image 1: zero-size"):
        ours.classify([image, np.zeros((0, 5, 3), np.uint8)], ["cat"])
    with pytest.raises(ImageInputError, match="image 0: expected uint8"):
        ours.classify([image.astype(np.float32)], ["cat"])
    with pytest.raises(ClipInputError, match="no images"):
        ours.classify([], ["cat"])
    with pytest.raises(EncodeInputError, match="outside the vocabulary"):
        ours.encode_texts(np.full((1, 77), 49408, dtype=np.int64))
    with pytest.raises(EncodeInputError, match=r"\[n, 3, 224, 224\]"):
        ours.encode_images(np.zeros((1, 3, 100, 100), np.float32))


def test_missing_checkpoint_pieces_are_named(tmp_path, tiny_clip_dir):  # noqa: F811
    from npu.models.clip.config import CheckpointError

    with pytest.raises(CheckpointError, match="not a directory"):
        load_clip(tmp_path / "nope")
    (tmp_path / "config.json").write_text((tiny_clip_dir / "config.json").read_text())
    with pytest.raises(CheckpointError, match=r"no \*.safetensors"):
        load_clip(tmp_path)
    with pytest.raises(ClipInputError, match="backend 'npu'"):
        load_clip(tiny_clip_dir, backend="npu")
