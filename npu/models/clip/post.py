"""CLIP zero-shot as HF CLIPModel and taconite-clip compute it: logits = logit_scale ·
cos(image, text) and a softmax over labels (docs/clip.md)."""

from __future__ import annotations

import numpy as np

from pipeline.errors import NpucamError


class ZeroShotError(NpucamError):
    """Embeddings that cannot be compared: wrong shapes, zero or not finite."""


def _normalise_rows(x: np.ndarray) -> np.ndarray:
    """Each row times 1/max(‖row‖, 1e-12) (docs/clip.md), in float64 for the norm."""
    norm = np.sqrt(np.sum(x.astype(np.float64) ** 2, axis=-1, keepdims=True))
    return (x / np.maximum(norm, 1e-12)).astype(np.float32)


def logits_and_probs(
    image_embeds: np.ndarray, text_embeds: np.ndarray, logit_scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """[ni, e], [nt, e] -> (logits [ni, nt] = scale·cos, softmax over prompts per image)."""
    logits = np.float32(logit_scale) * (
        _normalise_rows(image_embeds) @ _normalise_rows(text_embeds).T
    )
    return logits.astype(np.float32), softmax(logits)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of logits float [n, L] after subtracting each row's maximum, in
    float64 (taconite-clip's `softmax`): float32 [n, L]."""
    shifted = np.asarray(logits, np.float64)
    shifted = shifted - shifted.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def label_probabilities(
    image_embed: np.ndarray, text_embeds: np.ndarray, logit_scale: float
) -> np.ndarray:
    """CLIP zero-shot (docs/clip.md): softmax over labels of logit_scale · cos(image, text).

    image_embed: float [D]; text_embeds: float [L, D]; logit_scale: the exp'd scale (100 for
    the released models). Returns float32 [L], summing to 1.
    """
    img = np.asarray(image_embed, np.float64).reshape(-1)
    txt = np.asarray(text_embeds, np.float64)
    if txt.ndim != 2 or txt.shape[1] != img.shape[0] or txt.shape[0] == 0:
        raise ZeroShotError(
            f"text embeddings must be [L >= 1, {img.shape[0]}], got shape {txt.shape}"
        )
    img_n, txt_n = np.linalg.norm(img), np.linalg.norm(txt, axis=1)
    if img_n == 0 or np.any(txt_n == 0) or not np.isfinite(img).all():
        raise ZeroShotError("CLIP embeddings must be finite and non-zero")
    return softmax((float(logit_scale) * (txt @ img) / (txt_n * img_n))[None])[0]
