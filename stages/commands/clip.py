"""`npucam clip classify MODEL IMAGES... --label L ...` and `npucam clip check BUNDLE`.

classify: images are decoded with OpenCV (BGR -> RGB), preprocessed as HF CLIPImageProcessor
and classified against the prompt template filled with each label (npu.models.clip). MODEL is
an HF CLIPModel directory for `--backend cpu`, or a CLIP bundle for `--backend sim` / `npu`;
the backend is never chosen silently. Prints each image's labels by probability, or JSON;
with --synthetic and no MODEL there, the synthetic CLIP runs and the output says SYNTHETIC.
check: a bundle's tokenizer cases and reference sets against their gates (docs/clip.md), on the
simulated NPU or the real one; prints ALL CHECKS PASSED or the failures, and fails when the
bundle has nothing to check (no tok_test or refset records).
Exit codes: 0 done / passed, 1 a check failed (or found nothing to check), 2 an error naming
the file or argument.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import cv2
import numpy as np

from npu.backends import open_device
from npu.models import spec
from npu.models.clip.check import NOTHING_TO_CHECK, check_bundle
from npu.models.clip.model import ClipInputError, ClipModel
from npu.models.loading import Loaded
from pipeline.errors import NpucamError
from pipeline.files import path_kind
from stages.commands import models

BACKENDS = ("cpu", "sim", "npu")


class ImageReadError(NpucamError):
    """An image file that OpenCV cannot decode."""


def read_rgb(path: str | Path) -> np.ndarray:
    """Image file -> uint8 RGB [H, W, 3] (grey and alpha images converted)."""
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise ImageReadError(f"{path}: cannot read image (missing or not a supported format)")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def load_model(path: Path, backend: str, check_only: bool = False) -> ClipModel | None:
    """An HF CLIPModel directory on cpu, or a bundle (manifest.txt) on sim / npu (with
    check_only, only the checks that path fits the backend)."""
    if backend not in BACKENDS:
        raise ClipInputError(f"--backend {backend}: expected one of {', '.join(BACKENDS)}")
    is_bundle = models.is_bundle(path)
    if backend == "cpu":
        if is_bundle:
            raise ClipInputError(
                f"{path}: a bundle runs on --backend sim or npu; cpu takes an HF CLIPModel dir"
            )
        return None if check_only else spec("clip").from_checkpoint(Path(path))
    if not is_bundle:
        raise ClipInputError(f"{path}: --backend {backend} needs a CLIP bundle (manifest.txt)")
    return None if check_only else spec("clip").from_bundle(Path(path), open_device(backend))


def classify_model(path: Path, backend: str, synthetic: bool):
    """classify's model, for a `with` block: load_model's checks when path exists, else
    (with --synthetic) the synthetic CLIP (stages.commands.models.load_model)."""
    if backend not in BACKENDS:
        raise ClipInputError(f"--backend {backend}: expected one of {', '.join(BACKENDS)}")
    if path_kind(path) != "missing":
        load_model(path, backend, check_only=True)
    return models.load_model("clip", str(path), backend, synthetic)


def cmd_classify(args: argparse.Namespace) -> int:
    if not args.label:
        raise ClipInputError("no labels: pass --label L at least once")
    images = [read_rgb(p) for p in args.images]
    with classify_model(args.model, args.backend, args.synthetic) as loaded:
        return _classify(args, images, loaded)


def _classify(args: argparse.Namespace, images: list[np.ndarray], loaded: Loaded) -> int:
    model = loaded.model
    result = model.classify(images, args.label, args.template)
    if args.json:
        doc = {
            "model": str(args.model),
            "model_id": loaded.model_id,
            "synthetic": loaded.synthetic,
            "backend": result.backend,
            "template": args.template or model.template,
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
    if loaded.synthetic:
        print(f"SYNTHETIC weights ({loaded.model_id}): these probabilities mean nothing")
    for i, path in enumerate(args.images):
        weights = ", SYNTHETIC weights" if loaded.synthetic else ""
        print(f"{path} (backend {result.backend}{weights}):")
        order = np.argsort(-result.probs[i], kind="stable")
        for j in order[: args.top or None]:
            print(f"  {result.probs[i, j]:.4f}  {result.labels[j]}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    model = load_model(args.bundle, args.backend)
    print(f"{args.bundle} (backend {model.backend}):")
    lines = check_bundle(model, read_rgb)
    for line in lines:
        mark = "info" if line.ok is None else ("ok" if line.ok else "FAIL")
        print(f"  [{mark:4s}] {line.name}: {line.detail}")
    failed = [line for line in lines if line.ok is False]
    if lines == [NOTHING_TO_CHECK]:
        print("NOTHING CHECKED")
    else:
        print("ALL CHECKS PASSED" if not failed else f"{len(failed)} CHECK(S) FAILED")
    return 0 if not failed else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    clip = subparsers.add_parser("clip", help="CLIP zero-shot labels and bundle checks")
    sub = clip.add_subparsers(dest="clip_command", required=True, metavar="SUBCOMMAND")
    p = sub.add_parser(
        "classify",
        help="label images with probabilities over --label prompts",
        description="Zero-shot CLIP: probabilities of each --label for each image.",
    )
    p.add_argument(
        "model",
        type=Path,
        help="HF CLIPModel directory (config.json, *.safetensors, vocab.json, merges.txt) for "
        "--backend cpu, or a CLIP bundle for sim / npu (with --synthetic it may be missing)",
    )
    p.add_argument("images", nargs="+", help="image files (any format OpenCV reads)")
    p.add_argument("--label", "-l", action="append", default=[], help="a label (repeat)")
    p.add_argument(
        "--template",
        default=None,
        help="prompt template with {} (default: the bundle's, else 'a photo of a {}')",
    )
    p.add_argument(
        "--backend",
        default="cpu",
        choices=BACKENDS,
        help="cpu: HF checkpoint in numpy (default); sim / npu: a bundle on the simulated / "
        "real NPU",
    )
    p.add_argument("--top", type=int, default=0, help="print only the top K labels")
    models.add_synthetic_flag(p, "CLIP", "MODEL")
    p.add_argument(
        "--json", action="store_true", help="print JSON (probs per image, in --label order)"
    )
    p.set_defaults(func=cmd_classify)
    c = sub.add_parser(
        "check",
        help="check a CLIP bundle against its reference sets",
        description="Tokenizer, preprocessing, embeddings and zero-shot against the bundle's "
        "tok_test and refset records with docs/clip.md's tolerances.",
    )
    c.add_argument("bundle", type=Path, help="CLIP bundle directory")
    c.add_argument("--backend", default="sim", choices=("sim", "npu"), help="default sim")
    c.set_defaults(func=cmd_check)
