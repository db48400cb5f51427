"""`clip check`: run a bundle-loaded CLIP against its self-test records with the upstream
gates (docs/clip.md): tokenizer cases, preprocessing, tower embeddings vs fp32 and the NPU app,
zero-shot and end to end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from npu.models.clip.model import ClipInputError, ClipModel
from npu.models.clip.post import logits_and_probs, softmax

# (gate vs fp32, gate vs the Python NPU app), minimum row cosine, per docs/clip.md
IMAGE_COS_GATE = (0.999, 0.999)
TEXT_COS_GATE = (0.998, 0.999)
PROB_GATE = 0.03


@dataclass(frozen=True)
class CheckLine:
    """One line of a bundle check: ok is True / False, or None for information only."""

    name: str
    ok: bool | None
    detail: str


def _min_cos(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    den = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    cos = np.where(den > 0, (a64 * b64).sum(1) / np.where(den > 0, den, 1.0), 0.0)
    return float(cos.min())


def check_bundle(model: ClipModel, read_rgb: Any) -> list[CheckLine]:
    """Run a bundle-loaded model against its tok_test and refset records (docs/clip.md).

    read_rgb(path) -> uint8 RGB [H, W, 3] decodes the reference image files (the caller's
    image decoder: npu knows no file formats). Gates: tokenizer ids equal; PNG pixels 0
    differing values (JPEG: information); image min cosine > 0.999 and text > 0.998 to
    fp32 (> 0.999 to ref.<j>.npu_* when present); zero-shot top-1 equal for every image and
    max |Δprob| < 0.03; end to end from the files, the same argmax and |Δp| < 0.03.
    """
    bundle = model.bundle
    if bundle is None:
        raise ClipInputError("check needs a model loaded from a bundle (load_bundle)")
    lines: list[CheckLine] = []
    tok_tests = list(bundle.tagged("tok_test"))
    bad = []
    for rec in tok_tests:
        idx = rec.field(0)
        want = bundle.view(f"tok.{idx}.ids", "i32").tolist()
        if model.tokenizer.encode(rec.rest(1)) != want:
            bad.append(idx)
    lines.append(
        CheckLine(
            "tokenizer",
            not bad,
            f"{len(tok_tests) - len(bad)}/{len(tok_tests)} tok_test cases equal"
            + (f"; differ: {', '.join(bad)}" if bad else ""),
        )
    )
    images_by_set: dict[str, list[str]] = {}
    labels_by_set: dict[str, list[str]] = {}
    for rec in bundle.tagged("ref_image"):
        images_by_set.setdefault(rec.field(0), []).append(rec.field(2))
    for rec in bundle.tagged("ref_label"):
        labels_by_set.setdefault(rec.field(0), []).append(rec.rest(2))
    for rec in bundle.tagged("refset"):
        j = rec.field(0)
        pixels = bundle.array(f"ref.{j}.pixel_values", "f32")
        ids = bundle.array(f"ref.{j}.input_ids", "i32").astype(np.int64)
        files = images_by_set.get(j, [])
        labels = labels_by_set.get(j, [])
        if len(files) != len(pixels) or len(labels) != len(ids):
            lines.append(CheckLine(f"set {j}", False, "records and ref tensors disagree"))
            continue
        rgb = [read_rgb(bundle.path(f)) for f in files]
        ours_pixels = model.pixels(rgb)
        for i, f in enumerate(files):
            diff = int(np.count_nonzero(ours_pixels[i] != pixels[i]))
            png = f.lower().endswith(".png")
            lines.append(
                CheckLine(
                    f"set {j} preprocess {f}",
                    diff == 0 if png else None,
                    f"{diff} differing values of {pixels[i].size}",
                )  # fmt: skip
            )
        img = model.encode_images(pixels)
        txt = model.encode_texts(ids)
        for what, ours, gates in (("image", img, IMAGE_COS_GATE), ("text", txt, TEXT_COS_GATE)):
            ref = bundle.array(f"ref.{j}.{what}_embeds", "f32")
            c = _min_cos(ours, ref)
            lines.append(CheckLine(f"set {j} {what} vs fp32", c > gates[0],
                                   f"min cosine {c:.5f} (gate > {gates[0]})"))  # fmt: skip
            npu_name = f"ref.{j}.npu_{what}_embeds"
            if bundle.has(npu_name):
                c = _min_cos(ours, bundle.array(npu_name, "f32"))
                lines.append(CheckLine(f"set {j} {what} vs NPU app", c > gates[1],
                                       f"min cosine {c:.5f} (gate > {gates[1]})"))  # fmt: skip
            else:
                lines.append(CheckLine(f"set {j} {what} vs NPU app", None, f"no {npu_name}"))
        ref_logits = bundle.array(f"ref.{j}.logits", "f32")
        ref_probs = softmax(ref_logits)
        logits, probs = logits_and_probs(img, txt, model.logit_scale)
        dp = float(np.abs(probs - ref_probs).max())
        top_ok = bool((probs.argmax(1) == ref_probs.argmax(1)).all())
        lines.append(CheckLine(
            f"set {j} zero-shot", top_ok and dp < PROB_GATE,
            f"top-1 {'agrees' if top_ok else 'differs'}; max |dprob| {dp:.4f} (gate < "
            f"{PROB_GATE}); max |dlogit| {float(np.abs(logits - ref_logits).max()):.4f} (info)",
        ))  # fmt: skip
        result = model.classify(rgb, labels)
        dp = float(np.abs(result.probs - ref_probs).max())
        top_ok = bool((result.probs.argmax(1) == ref_probs.argmax(1)).all())
        lines.append(CheckLine(
            f"set {j} end to end", top_ok and dp < PROB_GATE,
            f"argmax {'agrees' if top_ok else 'differs'}; max |dp| {dp:.4f} (gate < {PROB_GATE})",
        ))  # fmt: skip
    return lines
