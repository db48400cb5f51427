"""Sapiens2 host pre/post-processing against HF's implementations, in one run, on one core.

  1. crop: npu.models.sapiens2.preprocess.crop_persons vs HF's crop_and_resize + the
     processor's fused normalisation (torch grid_sample), 1024x768 crops from a 1920x1080
     frame; one box set that grows its region (bicubic) and one that shrinks it (bilinear).
  2. DARK: npu.models.sapiens2.post.dark_keypoints vs HF's post_process_pose_estimation on
     308x256x192 peaked heatmaps (Gaussian peaks + noise), 1 and 4 persons.

Both sides run single-threaded (OMP_NUM_THREADS=1, torch.set_num_threads(1)); times are the
best of --repeat runs; the max |diff| of the outputs is printed with each ratio.

Run: .venv/bin/python bench/pose_post.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from types import SimpleNamespace

import numpy as np
import torch
from transformers.models.sapiens2.image_processing_sapiens2 import (
    Sapiens2ImageProcessor,
    box_xywh_to_cxcywh,
    crop_and_resize,
)

from npu.models.sapiens2.config import IMAGENET_MEAN, IMAGENET_STD
from npu.models.sapiens2.post import dark_keypoints
from npu.models.sapiens2.preprocess import crop_persons, crop_windows

torch.set_num_threads(1)


def best_of(repeat: int, fn) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def hf_crop(image: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    t = torch.from_numpy(image).permute(2, 0, 1).float()
    out = crop_and_resize(t, box_xywh_to_cxcywh(torch.from_numpy(boxes)), (1024, 768))
    mean = torch.tensor(IMAGENET_MEAN) * 255.0
    std = torch.tensor(IMAGENET_STD) * 255.0
    return ((out - mean[:, None, None]) / std[:, None, None]).numpy()


def peaked(rng, n: int) -> np.ndarray:
    yy, xx = np.mgrid[0:256, 0:192].astype(np.float32)
    cx = rng.uniform(0, 192, (n, 308, 1, 1))
    cy = rng.uniform(0, 256, (n, 308, 1, 1))
    s = rng.uniform(1.5, 5, (n, 308, 1, 1))
    a = rng.uniform(0.05, 1.0, (n, 308, 1, 1))
    hm = a * np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * s * s))
    return (hm + rng.normal(0, 0.003, hm.shape)).astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (1080, 1920, 3), dtype=np.uint8)
    box_sets = {
        "bicubic (grow), 4 boxes ~200x400": np.array(
            [[100, 80, 180, 400], [700, 300, 220, 380], [1500, 500, 150, 300], [-40, 600, 200, 410]]
        ).astype(np.float32),
        "bilinear (shrink), 4 boxes ~700x1000": np.array(
            [[100, 20, 500, 1e3], [800, 100, 650, 950], [1300, -100, 700, 1200], [50, 50, 900, 800]]
        ).astype(np.float32),
    }  # fmt: skip
    print(f"crop 1024x768, one core, best of {args.repeat}")
    for name, boxes in box_sets.items():
        t_ours, (ours, _) = best_of(args.repeat, lambda b=boxes: crop_persons(image, b))
        t_hf, ref = best_of(args.repeat, lambda b=boxes: hf_crop(image, b))
        n = len(boxes)
        print(
            f"  {name}: ours {1e3 * t_ours / n:.1f} ms/box, HF {1e3 * t_hf / n:.1f} ms/box,"
            f" HF/ours {t_hf / t_ours:.2f}x, max|diff| {np.abs(ours - ref).max():.1e}"
        )

    proc = Sapiens2ImageProcessor()
    print(f"DARK 308x256x192, one core, best of {args.repeat}")
    for n in (1, 4):
        hm = peaked(rng, n)
        boxes = box_sets["bicubic (grow), 4 boxes ~200x400"][:n]
        outputs = SimpleNamespace(heatmaps=torch.from_numpy(hm))
        t_ours, ours = best_of(
            args.repeat, lambda h=hm, b=boxes: dark_keypoints(h, crop_windows(b))
        )
        t_hf, ref = best_of(
            args.repeat,
            lambda o=outputs, b=boxes: proc.post_process_pose_estimation(o, boxes=[b.tolist()])[0],
        )
        ref_kp = np.stack([p["keypoints"].numpy() for p in ref])
        ref_sc = np.stack([p["scores"].numpy() for p in ref])
        print(
            f"  {n} person(s): ours {1e3 * t_ours / n:.1f} ms/person, HF {1e3 * t_hf / n:.1f}"
            f" ms/person, HF/ours {t_hf / t_ours:.1f}x, max|diff| keypoints "
            f"{np.abs(ours[..., :2] - ref_kp).max():.1e} px, scores "
            f"{np.abs(ours[..., 2] - ref_sc).max():.1e}"
        )


if __name__ == "__main__":
    main()
