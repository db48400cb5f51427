"""`clip check`: a bundle-loaded CLIP against its self-test records, gated as taconite-clip's
bin/clip.rs `check` gates (commits 493a895 = f56c025; docs/clip.md, docs/bundles.md):
tokenizer cases, preprocessing, tower embeddings vs fp32 and the NPU app, zero-shot and end
to end. npucam's extra figures are information lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from npu.models.clip.model import ClipInputError, ClipModel
from npu.models.clip.post import logits_and_probs, softmax

# bin/clip.rs: min row cosine > bar vs fp32 and > 0.999 vs the Python NPU app
IMAGE_COS_GATE = (0.999, 0.999)
TEXT_COS_GATE = (0.998, 0.999)
PROB_GATE = 0.03
_HEX = re.compile(r"\+?[0-9A-Fa-f]+")  # Rust's u32::from_str_radix(_, 16)


@dataclass(frozen=True)
class CheckLine:
    """One line of a bundle check: ok is True / False, or None for information only."""

    name: str
    ok: bool | None
    detail: str


NOTHING_TO_CHECK = CheckLine("bundle", False, "no tok_test or refset records: nothing to check")


def unescape(s: str) -> str:
    """Python's `unicode_escape` of a text undone, exactly as taconite-sam3's bundle.rs
    `unescape` (493a895): `\\t \\n \\r \\\\` and `\\xNN \\uNNNN \\UNNNNNNNN` (the next 2 / 4 / 8
    characters, fewer at the end; nothing is pushed when they are not hex or not a valid
    character); any other `\\c` stays as written, a trailing lone `\\` stays."""
    out: list[str] = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        i += 1
        if c != "\\":
            out.append(c)
            continue
        if i == n:
            out.append("\\")
            break
        c = s[i]
        i += 1
        if c in "tnr\\":
            out.append({"t": "\t", "n": "\n", "r": "\r", "\\": "\\"}[c])
        elif c in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[c]
            digits, i = s[i : i + width], min(i + width, n)
            if _HEX.fullmatch(digits):
                code = int(digits, 16)
                if code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF:
                    out.append(chr(code))
        else:
            out += ["\\", c]
    return "".join(out)


def _cosines(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(min, mean) row cosine in float64 (bin/clip.rs `cosines`; 0 for a zero row)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    den = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    cos = np.where(den > 0, (a64 * b64).sum(1) / np.where(den > 0, den, 1.0), 0.0)
    return float(cos.min()), float(cos.mean())


def _tokenizer_lines(model: ClipModel) -> list[CheckLine]:
    bundle = model.bundle
    recs = list(bundle.tagged("tok_test"))
    if not recs:
        return []
    bad = []
    for rec in recs:
        idx = rec.field_as(0, int)
        want = bundle.view(f"tok.{idx}.ids", "i32").tolist()
        ids, _ = model.tokenizer.pad_ids([model.tokenizer.encode(unescape(rec.rest(1)))])
        if ids[0].tolist() != want:
            bad.append(f"{idx} ({unescape(rec.rest(1))!r}, manifest.txt:{rec.line})")
    return [
        CheckLine(
            "tokenizer",
            not bad,
            f"{len(recs) - len(bad)}/{len(recs)} texts tokenize as HF's CLIPTokenizer (ids "
            f"padded to {model.tokenizer.context_length})"
            + (f"; differ: {', '.join(bad)}" if bad else ""),
        )
    ]


def check_bundle(model: ClipModel, read_rgb: Any) -> list[CheckLine]:
    """Run a bundle-loaded model against its tok_test and refset records (docs/clip.md).

    read_rgb(path) -> uint8 RGB [H, W, 3] decodes the reference image files (the caller's
    image decoder: npu knows no file formats). Gates, as bin/clip.rs: every tok_test text
    (unescaped) tokenizes to its tok.<idx>.ids padded to the context length; a `.png` file's
    pixels equal HF's (others: information); image min cosine > 0.999 to fp32 and > 0.999 to
    ref.<j>.npu_image_embeds (text: > 0.998 and > 0.999; a missing npu_* tensor fails, as
    it ends taconite's check with an error); zero-shot top-1 equal for every image and max
    |Δprob| < 0.03; end to end per image, the same argmax label and |Δp| < 0.03 of that
    label's probability. A bundle with nothing to check fails.
    """
    bundle = model.bundle
    if bundle is None:
        raise ClipInputError("check needs a model loaded from a bundle (load_bundle)")
    lines = _tokenizer_lines(model)
    images_by_set: dict[str, list[str]] = {}
    labels_by_set: dict[str, list[str]] = {}
    for rec in bundle.tagged("ref_image"):
        images_by_set.setdefault(rec.field(0), []).append(rec.rest(2))
    for rec in bundle.tagged("ref_label"):
        labels_by_set.setdefault(rec.field(0), []).append(rec.rest(2))
    refsets = list(bundle.tagged("refset"))
    for rec in refsets:
        lines += _refset_lines(model, rec, images_by_set, labels_by_set, read_rgb)
    return lines or [NOTHING_TO_CHECK]


def _refset_lines(model, rec, images_by_set, labels_by_set, read_rgb) -> list[CheckLine]:
    bundle = model.bundle
    j = rec.field(0)
    files, labels = images_by_set.get(j, []), labels_by_set.get(j, [])
    ni, np_ = rec.get("images"), rec.get("prompts")
    pixels = bundle.array(f"ref.{j}.pixel_values", "f32")
    ids = bundle.array(f"ref.{j}.input_ids", "i32").astype(np.int64)
    if (len(files), len(labels)) != (ni, np_) or (len(pixels), len(ids)) != (ni, np_):
        return [CheckLine(f"set {j}", False, (
            f"manifest.txt:{rec.line}: images={ni} prompts={np_}, but {len(files)} ref_image / "
            f"{len(labels)} ref_label records and {len(pixels)} / {len(ids)} reference rows"
        ))]  # fmt: skip
    lines = []
    rgb = [read_rgb(bundle.path(f)) for f in files]
    ours_pixels = model.pixels(rgb)
    for i, f in enumerate(files):
        diff = int(np.count_nonzero(ours_pixels[i] != pixels[i]))
        dmax = float(np.abs(ours_pixels[i] - pixels[i]).max())
        lines.append(CheckLine(
            f"set {j} preprocess {f}", diff == 0 if f.endswith(".png") else None,
            f"{diff} of {pixels[i].size} values differ from HF's (max {dmax:.4f})",
        ))  # fmt: skip
    img = model.encode_images(pixels)
    txt = model.encode_texts(ids)
    for what, ours, (bar, bar_npu) in (
        ("image", img, IMAGE_COS_GATE), ("text", txt, TEXT_COS_GATE),
    ):  # fmt: skip
        min_f, mean_f = _cosines(ours, bundle.array(f"ref.{j}.{what}_embeds", "f32"))
        npu_name = f"ref.{j}.npu_{what}_embeds"
        if not bundle.has(npu_name):
            lines.append(CheckLine(f"set {j} {what} tower", False, (
                f"vs fp32 min cosine {min_f:.5f} (mean {mean_f:.5f}); {npu_name} is missing "
                "(taconite's check stops with an error here)"
            )))  # fmt: skip
            continue
        min_n, _ = _cosines(ours, bundle.array(npu_name, "f32"))
        lines.append(CheckLine(
            f"set {j} {what} tower", min_f > bar and min_n > bar_npu,
            f"vs fp32 min cosine {min_f:.5f} (mean {mean_f:.5f}; gate > {bar}), vs the NPU app "
            f"min {min_n:.5f} (gate > {bar_npu})",
        ))  # fmt: skip
    ref_logits = bundle.array(f"ref.{j}.logits", "f32")
    ref_probs = softmax(ref_logits)
    logits, probs = logits_and_probs(img, txt, model.logit_scale)
    dp = float(np.abs(probs - ref_probs).max())
    top = int((probs.argmax(1) == ref_probs.argmax(1)).sum())
    lines.append(CheckLine(
        f"set {j} zero-shot", top == ni and dp < PROB_GATE,
        f"top-1 agrees {top}/{ni}; logits max |diff| {float(np.abs(logits - ref_logits).max()):.3f}"
        f", probabilities {dp:.4f} (gate < {PROB_GATE})",
    ))  # fmt: skip
    result = model.classify(rgb, labels)
    for i, f in enumerate(files):
        row, rrow = result.probs[i], ref_probs[i]
        k, kr = int(row.argmax()), int(rrow.argmax())
        lines.append(CheckLine(
            f"set {j} end to end {f}", k == kr and abs(float(row[k] - rrow[k])) < PROB_GATE,
            f"{labels[k]} {row[k]:.3f} (reference {labels[kr]} {rrow[kr]:.3f}; gate: same label,"
            f" |dp| < {PROB_GATE})",
        ))  # fmt: skip
    lines.append(CheckLine(
        f"set {j} end to end, all labels", None,
        f"max |dp| {float(np.abs(result.probs - ref_probs).max()):.4f} over every label",
    ))  # fmt: skip
    return lines
