"""The Sapiens2-Pose bundle self-check, as taconite-sapiens2's `check` (docs/pose.md): each
`ref` case's crop, features, heatmaps and keypoints against the bundle's references; the
result is data, the CLI prints it."""

from __future__ import annotations

import numpy as np

from npu.bundle import BundleError
from npu.models.sapiens2.post import dark_keypoints
from npu.models.sapiens2.preprocess import crop_persons


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-300))


def check_case(model, bundle, record) -> dict:
    """One `ref <name> w= h=` case of a bundle: the metrics and verdict of docs/pose.md, gated
    as taconite-sapiens2's bin/sapiens2.rs `check` (@1e2c515 = 465946c); features cosine, the
    max error and the error against `.npu_keypoints` (when present) are information."""
    cfg = model.config
    name, w, h = record.field(0), record.get("w"), record.get("h")
    hh, wh = cfg.heatmap_size
    sizes = {
        "rgb": ("u8", h * w * 3), "box": ("f32", 4), "pixels": ("f32", 3 * cfg.H * cfg.W),
        "features": ("bf16", cfg.gh * cfg.gw * cfg.D), "heatmaps": ("bf16", cfg.K * hh * wh),
        "keypoints": ("f32", cfg.K * 2), "scores": ("f32", cfg.K),
    }  # fmt: skip
    ref = {}
    for part, (dtype, elems) in sizes.items():
        tensor = f"ref.{name}.{part}"
        try:
            bundle.expect(tensor, dtype, elems)
        except BundleError as exc:
            raise BundleError(
                f"{record.root}/manifest.txt:{record.line}: ref {name}: {exc}"
            ) from None
        ref[part] = bundle.view(tensor).copy() if dtype == "u8" else bundle.f32(tensor).reshape(-1)
    rgb = ref["rgb"].reshape(h, w, 3)
    box = ref["box"].astype(np.float32)
    pixels = ref["pixels"].reshape(1, 3, cfg.H, cfg.W)
    crops, windows = crop_persons(
        rgb, box[None], output_size=(cfg.H, cfg.W), mean=cfg.mean, std=cfg.std, padding=cfg.box_pad
    )
    features = model.features(pixels[0])
    heatmaps = model.heatmaps(pixels)
    keypoints = dark_keypoints(model.heatmaps(crops), windows, kernel=cfg.blur)[0]
    confident = ref["scores"] > 0.3
    err = np.linalg.norm(keypoints[:, :2] - ref["keypoints"].reshape(-1, 2), axis=1)[confident]
    result = {
        "name": name,
        "pixels_max_diff": float(np.abs(crops - pixels).max()),
        "features_cos": _cosine(features, ref["features"]),
        "heatmaps_cos": _cosine(heatmaps, ref["heatmaps"]),
        "keypoints": int(confident.sum()),
        "mean_err_px": float(err.mean()) if err.size else 0.0,
        "max_err_px": float(err.max()) if err.size else 0.0,
        "box_size": float(max(box[2], box[3])),
    }
    npu_name = f"ref.{name}.npu_keypoints"  # the Python IRON app's keypoints: information
    if bundle.has(npu_name):
        bundle.expect(npu_name, "f32", cfg.K * 2)
        vs_app = np.linalg.norm(keypoints[:, :2] - bundle.f32(npu_name).reshape(-1, 2), axis=1)
        result["mean_err_vs_app_px"] = float(vs_app[confident].mean()) if err.size else 0.0
    result["pass"] = (
        result["pixels_max_diff"] <= 2e-3
        and result["heatmaps_cos"] >= 0.98
        and result["mean_err_px"] <= 0.01 * result["box_size"]
    )
    return result
