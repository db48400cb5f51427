"""ClipModel: tokenizer, preprocessing and both towers on one backend, classifying images
against label prompts as HF does: logits = exp(logit_scale) · cosine(image, prompt), softmax
per image over prompts. `from_pretrained` loads an HF CLIPModel directory on the cpu backend;
npu.models.clip_bundle.load_bundle builds one over a bundle on a device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from npu.models.clip_preprocess import (
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    RESIZE_SHORTEST,
    check_image,
    normalize,
    resize_crop,
)
from npu.models.clip_tokenizer import Tokenizer
from npu.models.clip_towers import CheckpointError, ClipTowers, load_checkpoint, logits_and_probs
from npu.ops import NumpyOps
from pipeline.errors import NpucamError

DEFAULT_TEMPLATE = "a photo of a {}"
BACKENDS = ("cpu",)


class ClipInputError(NpucamError):
    """A classify request the model cannot take (no labels, bad template, bad label)."""


@dataclass(frozen=True)
class ZeroShot:
    """Zero-shot result: probs / logits float32 [images, labels], rows sum to 1 (probs)."""

    labels: tuple[str, ...]
    prompts: tuple[str, ...]
    probs: np.ndarray
    logits: np.ndarray
    backend: str

    def top(self, image: int) -> tuple[str, float]:
        """(label, probability) of the most probable label of one image (first on ties)."""
        j = int(np.argmax(self.probs[image]))
        return self.labels[j], float(self.probs[image, j])


def prompts_for(labels: Sequence[str], template: str = DEFAULT_TEMPLATE) -> list[str]:
    """Labels -> prompts by substituting each label for `{}` in the template."""
    if isinstance(labels, str):
        raise ClipInputError("labels must be a list of strings, got one string")
    if len(labels) == 0:
        raise ClipInputError("the label list is empty")
    if not isinstance(template, str) or template.count("{}") != 1:
        raise ClipInputError(f"prompt template {template!r} must contain '{{}}' exactly once")
    for i, label in enumerate(labels):
        if not isinstance(label, str) or not label.strip():
            raise ClipInputError(f"label {i} ({label!r}) is empty or not a string")
    return [template.replace("{}", label) for label in labels]


class ClipModel:
    """One loaded CLIP: tokenizer, preprocessing and both towers on one backend."""

    def __init__(
        self,
        towers: ClipTowers,
        tokenizer: Tokenizer,
        *,
        resize_shortest: int = RESIZE_SHORTEST,
        mean: tuple[float, float, float] = OPENAI_CLIP_MEAN,
        std: tuple[float, float, float] = OPENAI_CLIP_STD,
    ) -> None:
        self.towers = towers
        self.tokenizer = tokenizer
        self.resize_shortest = resize_shortest
        self.mean = mean
        self.std = std
        self._text_cache: tuple[tuple[str, ...], np.ndarray] | None = None
        self.template = DEFAULT_TEMPLATE
        self.bundle: Any = None

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, backend: str = "cpu") -> ClipModel:
        """HF CLIPModel directory: config.json, *.safetensors, and vocab.json + merges.txt
        (or the tokenizer.json transformers v5 saves)."""
        if backend not in BACKENDS:
            raise ClipInputError(
                f"backend {backend!r} cannot load an HF checkpoint; expected one of {BACKENDS}"
            )
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise CheckpointError(f"{model_dir}: not a directory")
        cfg, host, gemms = load_checkpoint(model_dir)
        tokenizer = Tokenizer.from_dir(model_dir, context_length=cfg.context)
        if tokenizer.vocab_size > cfg.vocab_size:
            raise CheckpointError(
                f"{model_dir}: tokenizer has {tokenizer.vocab_size} ids, model {cfg.vocab_size}"
            )
        return cls(ClipTowers.on_ops(cfg, host, NumpyOps(gemms)), tokenizer)

    @property
    def backend(self) -> str:
        return self.towers.backend

    @property
    def logit_scale(self) -> float:
        return self.towers.host.logit_scale

    def pixels(self, images_rgb: Sequence[np.ndarray]) -> np.ndarray:
        """uint8 RGB images [H, W, 3] -> float32 [n, 3, 224, 224] as CLIPImageProcessor."""
        if len(images_rgb) == 0:
            raise ClipInputError("no images to classify")
        crop = self.towers.cfg.image_size
        out = np.empty((len(images_rgb), 3, crop, crop), dtype=np.float32)
        for i, image in enumerate(images_rgb):
            check_image(image, what=f"image {i}")
            out[i] = normalize(resize_crop(image, self.resize_shortest, crop), self.mean, self.std)
        return out

    def encode_images(self, pixels: np.ndarray) -> np.ndarray:
        """float32 [n, 3, 224, 224] -> float32 [n, embed], HF get_image_features."""
        return self.towers.encode_images(pixels)

    def encode_texts(self, ids: np.ndarray | Sequence[Sequence[int]]) -> np.ndarray:
        """Token ids ([n, 77] padded, or a list of unpadded encodings) -> float32 [n, embed]."""
        if not isinstance(ids, np.ndarray):
            ids, _ = self.tokenizer.pad_ids([list(seq) for seq in ids])
        return self.towers.encode_texts(ids)

    def encode_prompts(self, prompts: Sequence[str]) -> np.ndarray:
        """Prompts -> float32 [n, embed]; a prompt without letters is an error."""
        ids = [self.tokenizer.encode_prompt(p, what=f"prompt {i}") for i, p in enumerate(prompts)]
        return self.encode_texts(ids)

    def label_embeddings(self, labels: Sequence[str], template: str | None = None) -> np.ndarray:
        """Text embeddings of the label prompts, cached until the labels or template change.

        template: `{}` is replaced by each label; default the model's (the bundle's
        prompt_template, else "a photo of a {}")."""
        prompts = tuple(prompts_for(labels, template or self.template))
        if self._text_cache is None or self._text_cache[0] != prompts:
            for i, label in enumerate(labels):
                self.tokenizer.encode_prompt(label, what=f"label {i}")  # letters required
            self._text_cache = (prompts, self.encode_prompts(prompts))
        return self._text_cache[1]

    def classify(
        self,
        images_rgb: Sequence[np.ndarray],
        labels: Sequence[str],
        template: str | None = None,
    ) -> ZeroShot:
        """Zero-shot: probabilities float32 [n_images, n_labels] over the label prompts."""
        template = template or self.template
        text = self.label_embeddings(labels, template)
        image = self.encode_images(self.pixels(images_rgb))
        logits, probs = logits_and_probs(image, text, self.logit_scale)
        return ZeroShot(
            labels=tuple(labels),
            prompts=tuple(prompts_for(labels, template)),
            probs=probs,
            logits=logits,
            backend=self.backend,
        )
