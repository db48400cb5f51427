"""Face embeddings compared as taconite-adaface does: L2 normalisation and the f64 cosine
(docs/face-id.md)."""

from __future__ import annotations

import numpy as np


def l2_normalize(e: np.ndarray) -> np.ndarray:
    """e: float [..., D] -> float32 rows scaled to unit L2 norm (all-zero rows stay zero)."""
    e = np.asarray(e, dtype=np.float32)
    n = np.linalg.norm(e, axis=-1, keepdims=True)
    return (e / np.where(n > 0, n, 1)).astype(np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """f64 dot / (|a| |b|); 0.0 if either is all zero (as taconite's cosine)."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return 0.0 if na == 0 or nb == 0 else float(a @ b / (na * nb))
