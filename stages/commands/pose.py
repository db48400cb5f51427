"""`npucam pose ...`: Sapiens2-Pose on still images.

`pose image IMAGE --box x,y,w,h [--box ...] --model DIR` runs crop (stages.detect) ->
heatmaps (npu.models.sapiens2 on the chosen backend) -> DARK keypoints (npu.models.sapiens2.post)
and writes taconite's JSON, `[{"box": [x, y, w, h], "keypoints": [[x, y, score], ...]}]`,
each person also naming the backend and whether the weights are synthetic (`--synthetic`
runs the synthetic Sapiens2 when --model is not given or missing; its keypoints mean
nothing and stderr says SYNTHETIC). `--draw` saves the image with the keypoints whose score
is above --threshold and the skeleton links between them.

`pose check BUNDLE [--backend sim|npu]` replays every `ref` case of a bundle as taconite's
`sapiens2 check` does (docs/pose.md): the pixel max |diff| of our crop against the
reference crop, feature and heatmap cosines from the reference pixels, and the keypoint error
through the whole path over keypoints whose reference score > 0.3. A case passes when pixels
<= 2e-3, heatmap cosine >= 0.98 and mean keypoint error <= 1% of max(box w, box h); feature
cosine is reported, not gated. Exit codes: 0 done (check: all cases pass), 1 a check case
failed, 2 an error naming the file or argument at fault.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from npu.models.sapiens2.check import check_case
from pipeline.errors import NpucamError
from pipeline.files import path_kind
from stages.commands import models

BACKENDS = ("cpu", "sim", "npu")


class PoseCommandError(NpucamError):
    """A pose command argument or file that cannot be used."""


def parse_box(text: str) -> list[float]:
    """ "x,y,w,h" -> [x, y, w, h] (COCO, image pixels); w and h must be positive."""
    parts = text.split(",")
    try:
        box = [float(p) for p in parts]
    except ValueError:
        box = []
    if len(box) != 4 or not all(np.isfinite(box)) or box[2] <= 0 or box[3] <= 0:
        raise PoseCommandError(f"--box {text!r}: expected x,y,w,h with w, h > 0")
    return box


def read_rgb(path: str) -> np.ndarray:
    """An image file as uint8 [H, W, 3] RGB."""
    import cv2

    bgr = cv2.imread(path, cv2.IMREAD_COLOR)
    if bgr is None:
        raise PoseCommandError(f"{path}: not a readable image")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def check_model_path(model: str, backend: str) -> None:
    """PoseCommandError when an existing --model does not fit the backend."""
    path = Path(model)
    if path_kind(path) != "directory":
        raise PoseCommandError(f"--model {model}: not a directory")
    if backend == "cpu" and models.is_bundle(path) and path_kind(path / "config.json") != "file":
        raise PoseCommandError(
            f"--model {model} is a bundle; the cpu backend reads an HF checkpoint "
            "(config.json + safetensors); use --backend sim or npu for bundles"
        )


def load_model(model: str | None, backend: str, synthetic: bool = False):
    """The Sapiens2-Pose model a --model / --backend pair names (with synthetic, the
    synthetic stand-in when --model is not given or missing), for a `with` block."""
    if backend not in BACKENDS:
        raise PoseCommandError(f"--backend {backend}: expected one of {', '.join(BACKENDS)}")
    if model is not None and (not synthetic or path_kind(model) != "missing"):
        check_model_path(model, backend)
    return models.load_model("sapiens2", model, backend, synthetic)


def estimate(model, rgb: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Keypoints float32 [N, K, 3] (x, y, score) in image pixels for COCO boxes [N, 4]."""
    from npu.models.sapiens2.post import dark_keypoints
    from npu.models.sapiens2.preprocess import crop_persons

    cfg = model.config
    crops, windows = crop_persons(
        rgb, boxes, output_size=(cfg.H, cfg.W), mean=cfg.mean, std=cfg.std, padding=cfg.box_pad
    )
    return dark_keypoints(model.heatmaps(crops), windows, kernel=cfg.blur)


def draw(rgb: np.ndarray, keypoints: np.ndarray, boxes: np.ndarray, threshold: float):
    """uint8 [H, W, 3] BGR with boxes, skeleton links and keypoints above threshold."""
    import cv2

    from npu.models.sapiens2.keypoints import SKELETON

    out = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)
    radius = max(1, round(max(out.shape[:2]) / 300))
    for box, kp in zip(boxes, keypoints, strict=True):
        x, y, w, h = (round(v) for v in box)
        cv2.rectangle(out, (x, y), (x + w, y + h), (0, 200, 255), radius)
        ok = kp[:, 2] > threshold
        if len(kp) == 308:
            for a, b in SKELETON:
                if ok[a] and ok[b]:
                    pa, pb = (tuple(int(round(v)) for v in kp[i, :2]) for i in (a, b))
                    cv2.line(out, pa, pb, (255, 128, 0), radius, cv2.LINE_AA)
        for px, py, _ in kp[ok]:
            cv2.circle(out, (int(round(px)), int(round(py))), radius + 1, (0, 255, 0), -1)
    return out


def cmd_image(args: argparse.Namespace) -> int:
    boxes = np.array([parse_box(b) for b in args.box], dtype=np.float32)
    rgb = read_rgb(args.image)
    with load_model(args.model, args.backend, args.synthetic) as loaded:
        keypoints = estimate(loaded.model, rgb, boxes)
        backend = loaded.model.backend
    persons = [
        {
            "box": [float(v) for v in box],
            "keypoints": [[float(v) for v in k] for k in kp],
            "backend": backend,
            "synthetic": loaded.synthetic,
        }
        for box, kp in zip(boxes, keypoints, strict=True)
    ]
    text = json.dumps(persons)
    if args.output:
        try:
            Path(args.output).write_text(text + "\n")
        except OSError as exc:
            raise PoseCommandError(f"-o {args.output}: cannot write: {exc}") from None
    else:
        print(text)
    if args.draw:
        import cv2

        if not cv2.imwrite(args.draw, draw(rgb, keypoints, boxes, args.threshold)):
            raise PoseCommandError(f"--draw {args.draw}: cannot write the image")
    confident = int((keypoints[:, :, 2] > args.threshold).sum())
    print(
        f"pose: {len(boxes)} box(es) on {backend}{models.tag(loaded)}, {confident} of "
        f"{keypoints[:, :, 0].size} keypoints with score > {args.threshold}",
        file=sys.stderr,
    )
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from npu.bundle import Bundle

    with load_model(args.bundle, args.backend) as loaded:
        model = loaded.model
        bundle = Bundle.open(args.bundle)
        cases = list(bundle.tagged("ref"))
        if not cases:
            raise PoseCommandError(f"{args.bundle}/manifest.txt: no ref records to check")
        results = [check_case(model, bundle, r) for r in cases]
    for r in results:
        print(
            f"{r['name']}: pixels max|d| {r['pixels_max_diff']:.2e}, features cos "
            f"{r['features_cos']:.6f}, heatmaps cos {r['heatmaps_cos']:.6f}, keypoints "
            f"(score > 0.3: {r['keypoints']}) mean {r['mean_err_px']:.3f} px max "
            f"{r['max_err_px']:.3f} px ({100 * r['mean_err_px'] / r['box_size']:.3f}% of box"
            + (
                f"; vs the Python NPU app {r['mean_err_vs_app_px']:.3f} px"
                if "mean_err_vs_app_px" in r
                else ""
            )
            + ") "
            f"[{model.backend}] {'PASS' if r['pass'] else 'FAIL'}"
        )
    failed = sum(not r["pass"] for r in results)
    print(f"check: {len(results) - failed}/{len(results)} ref cases pass on {model.backend}")
    return 1 if failed else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    pose = subparsers.add_parser("pose", help="Sapiens2-Pose keypoints from person boxes")
    sub = pose.add_subparsers(dest="pose_command", required=True, metavar="SUBCOMMAND")
    img = sub.add_parser("image", help="keypoints for person boxes in one image")
    img.add_argument("image", help="image file (any format OpenCV reads)")
    img.add_argument(
        "--box", action="append", required=True, help="person box x,y,w,h (repeatable)"
    )
    img.add_argument(
        "--model", help="HF Sapiens2ForPoseEstimation directory (cpu) or a bundle (sim, npu)"
    )
    img.add_argument("--backend", choices=BACKENDS, default="cpu")
    models.add_synthetic_flag(img, "Sapiens2")
    img.add_argument("-o", "--output", help="write the JSON here instead of stdout")
    img.add_argument("--draw", help="save an annotated copy of the image here")
    img.add_argument("--threshold", type=float, default=0.3, help="score to draw (0.3)")
    img.set_defaults(func=cmd_image)
    chk = sub.add_parser("check", help="replay a bundle's ref cases (taconite sapiens2 check)")
    chk.add_argument("bundle", help="bundle directory with ref records")
    chk.add_argument("--backend", choices=("sim", "npu"), default="sim")
    chk.set_defaults(func=cmd_check)
