"""`npucam clip classify MODEL IMAGES... --label L ...`: CLIP zero-shot labels for image files.

Images are decoded with OpenCV (BGR -> RGB), preprocessed as HF CLIPImageProcessor and
classified against `template` filled with each label (npu.models.clip.ClipModel on the cpu
backend, from an HF CLIPModel directory). Prints each image's labels by probability, or JSON
with `--json`. Exit codes: 0 done, 2 an error naming the file or argument at fault.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import cv2
import numpy as np

from npu.models.clip import DEFAULT_TEMPLATE, ClipInputError, ClipModel
from pipeline.errors import NpucamError

BACKENDS = ("cpu",)


class ImageReadError(NpucamError):
    """An image file that OpenCV cannot decode."""


def read_rgb(path: str | Path) -> np.ndarray:
    """Image file -> uint8 RGB [H, W, 3] (grey and alpha images converted)."""
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise ImageReadError(f"{path}: cannot read image (missing or not a supported format)")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def cmd_classify(args: argparse.Namespace) -> int:
    if args.backend not in BACKENDS:
        raise ClipInputError(
            f"--backend {args.backend}: clip classify runs on {', '.join(BACKENDS)} only "
            "(the CLIP bundle path for sim/npu is not built yet)"
        )
    if not args.label:
        raise ClipInputError("no labels: pass --label L at least once")
    images = [read_rgb(p) for p in args.images]
    model = ClipModel.from_pretrained(args.model, backend=args.backend)
    result = model.classify(images, args.label, args.template)
    if args.json:
        doc = {
            "model": str(args.model),
            "backend": result.backend,
            "template": args.template,
            "labels": list(result.labels),
            "results": [
                {
                    "image": str(path),
                    "top": result.top(i)[0],
                    "probs": [float(p) for p in result.probs[i]],
                }
                for i, path in enumerate(args.images)
            ],
        }
        json.dump(doc, sys.stdout, indent=2)
        print()
        return 0
    for i, path in enumerate(args.images):
        print(f"{path} (backend {result.backend}):")
        order = np.argsort(-result.probs[i], kind="stable")
        for j in order[: args.top or None]:
            print(f"  {result.probs[i, j]:.4f}  {result.labels[j]}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    clip = subparsers.add_parser("clip", help="CLIP zero-shot labels")
    sub = clip.add_subparsers(dest="clip_command", required=True, metavar="SUBCOMMAND")
    p = sub.add_parser(
        "classify",
        help="label images with probabilities over --label prompts",
        description="Zero-shot CLIP: probabilities of each --label for each image.",
    )
    p.add_argument("model", type=Path, help="HF CLIPModel directory (config.json, safetensors, "
                   "vocab.json, merges.txt)")  # fmt: skip
    p.add_argument("images", nargs="+", help="image files (any format OpenCV reads)")
    p.add_argument("--label", "-l", action="append", default=[], help="a label (repeat)")
    p.add_argument(
        "--template",
        default=DEFAULT_TEMPLATE,
        help=f"prompt template (default {DEFAULT_TEMPLATE!r})",
    )
    p.add_argument("--backend", default="cpu", help="cpu (HF checkpoint in numpy)")
    p.add_argument("--top", type=int, default=0, help="print only the top K labels")
    p.add_argument(
        "--json", action="store_true", help="print JSON (probs per image, in --label order)"
    )
    p.set_defaults(func=cmd_classify)
