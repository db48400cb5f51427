"""Sapiens2-Pose sizes as the bundle params of docs/pose.md name them, read from a bundle's
params or a Hugging Face config.json (transformers 5.23.0 Sapiens2Config)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import NpucamError

IMAGENET_MEAN = (0.485, 0.456, 0.406)


IMAGENET_STD = (0.229, 0.224, 0.225)


class ModelError(NpucamError):
    """A Sapiens2 config, checkpoint or input the forward cannot use."""


@dataclass(frozen=True)
class Config:
    """Sapiens2-Pose sizes, named as the bundle params of docs/pose.md"""

    D: int
    I: int  # noqa: E741 (the bundle param's name for the MLP width)
    layers: int
    heads: int
    hd: int
    kv_heads: tuple[int, ...]
    regs: int
    patch: int
    H: int
    W: int
    eps: float
    in_eps: float
    up: tuple[int, ...]
    convs: tuple[int, ...]
    K: int
    box_pad: float = 1.25
    blur: int = 11
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    flip_pairs: tuple[tuple[int, int], ...] = ()
    rope_theta: float = 100.0
    qk_norm: bool = True

    def __post_init__(self) -> None:
        where = "sapiens2 config"
        if self.heads * self.hd != self.D:
            raise ModelError(f"{where}: D={self.D} != heads {self.heads} x hd {self.hd}")
        if self.hd % 4:
            raise ModelError(f"{where}: hd={self.hd} must be a multiple of 4 for 2-D RoPE")
        if len(self.kv_heads) != self.layers:
            raise ModelError(
                f"{where}: kv_heads has {len(self.kv_heads)} entries, layers={self.layers}"
            )
        for i, kv in enumerate(self.kv_heads):
            if kv <= 0 or self.heads % kv:
                raise ModelError(f"{where}: kv_heads[{i}]={kv} does not divide heads={self.heads}")
        if self.H % self.patch or self.W % self.patch:
            raise ModelError(
                f"{where}: image {self.H}x{self.W} is not a multiple of patch {self.patch}"
            )
        if not self.up:
            raise ModelError(f"{where}: up (the deconv widths) is empty")

    @property
    def gh(self) -> int:
        return self.H // self.patch

    @property
    def gw(self) -> int:
        return self.W // self.patch

    @property
    def prefix(self) -> int:
        """CLS + register tokens before the patches."""
        return 1 + self.regs

    @property
    def tokens(self) -> int:
        return self.prefix + self.gh * self.gw

    @property
    def heatmap_size(self) -> tuple[int, int]:
        f = 2 ** len(self.up)
        return self.gh * f, self.gw * f

    @classmethod
    def from_hf(cls, path: str | Path) -> Config:
        """From a Hugging Face Sapiens2ForPoseEstimation config.json (file or its directory)."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            cfg = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelError(f"{path}: cannot read the config: {exc}") from None

        def need(key: str, mapping: Mapping[str, Any] = cfg, where: str = "") -> Any:
            if key not in mapping:
                raise ModelError(f"{path}: missing field {where}{key}")
            return mapping[key]

        head = need("head_config") or {}
        for key, want in (("use_gated_mlp", True), ("hidden_act", "silu")):
            if cfg.get(key, want) != want:
                raise ModelError(f"{path}: {key}={cfg[key]!r}; the pose forward needs {want!r}")
        if head.get("use_pixel_shuffle"):
            raise ModelError(f"{path}: head_config.use_pixel_shuffle is set; pose uses deconvs")
        for key, want in (("upsample_kernel_sizes", 4), ("conv_kernel_sizes", 1)):
            sizes = head.get(key) or []
            if any(s != want for s in sizes):
                raise ModelError(f"{path}: head_config.{key}={sizes}; only {want} is supported")
        d, heads = int(need("hidden_size")), int(need("num_attention_heads"))
        layers = int(need("num_hidden_layers"))
        kv = cfg.get("num_key_value_heads_per_layer")
        if kv is None:
            first = cfg.get("num_first_full_attention_layers", 8)
            last = cfg.get("num_last_full_attention_layers", 8)
            gqa = cfg.get("num_key_value_attention_heads", 8)
            kv = [heads if (i < first or i >= layers - last) else gqa for i in range(layers)]
        size = need("image_size")
        h, w = (size, size) if isinstance(size, int) else size
        patch = need("patch_size")
        if not isinstance(patch, int):
            if patch[0] != patch[1]:
                raise ModelError(f"{path}: patch_size={patch}; only square patches are supported")
            patch = patch[0]
        labels = cfg.get("id2label") or {}
        return cls(
            D=d,
            I=int(need("intermediate_size")),
            layers=layers,
            heads=heads,
            hd=d // heads,
            kv_heads=tuple(int(k) for k in kv),
            regs=int(cfg.get("num_register_tokens", 8)),
            patch=int(patch),
            H=int(h),
            W=int(w),
            eps=float(cfg.get("rms_norm_eps", 1e-6)),
            in_eps=1e-5,
            up=tuple(int(c) for c in need("upsample_out_channels", head, "head_config.")),
            convs=tuple(int(c) for c in head.get("conv_out_channels") or ()),
            K=len(labels) if labels else int(cfg.get("num_labels", 308)),
            flip_pairs=tuple((int(a), int(b)) for a, b in cfg.get("flip_pairs") or ()),
            rope_theta=float(cfg.get("rope_theta", 100.0)),
            qk_norm=bool(cfg.get("use_qk_norm", True)),
        )

    @classmethod
    def from_params(
        cls, params: Mapping[str, str | Sequence[str]], where: str = "params"
    ) -> Config:
        """From bundle params (docs/pose.md): name -> value text (or its whitespace-split fields).

        Lists are comma-separated; flip_pairs is "a:b,c:d,..." with no empty item.
        """

        def text(name: str) -> str:
            if name not in params:
                raise ModelError(f"{where}: missing param {name}")
            v = params[name]
            return v if isinstance(v, str) else " ".join(v)

        def num(name: str, kind: type = int) -> Any:
            try:
                return kind(text(name))
            except ValueError:
                raise ModelError(
                    f"{where}: param {name}={text(name)!r} is not {kind.__name__}"
                ) from None

        def nums(name: str, kind: type = int, count: int | None = None) -> tuple:
            raw = text(name).replace(" ", ",")
            try:
                vals = tuple(kind(v) for v in raw.split(",") if v)
            except ValueError:
                raise ModelError(
                    f"{where}: param {name}={raw!r} is not a {kind.__name__} list"
                ) from None
            if count is not None and len(vals) != count:
                raise ModelError(f"{where}: param {name} has {len(vals)} values, wanted {count}")
            return vals

        pairs = []
        # taconite's Config::load: split at ",", every item a:b (an empty item is an error)
        for item in text("flip_pairs").split(","):
            a, sep, b = item.partition(":")
            if not sep or not a.isdigit() or not b.isdigit():
                raise ModelError(f"{where}: param flip_pairs has a bad pair {item!r} (want a:b)")
            pairs.append((int(a), int(b)))
        return cls(
            D=num("D"),
            I=num("I"),
            layers=num("layers"),
            heads=num("heads"),
            hd=num("hd"),
            kv_heads=nums("kv_heads"),
            regs=num("regs"),
            patch=num("patch"),
            H=num("H"),
            W=num("W"),
            eps=num("eps", float),
            in_eps=num("in_eps", float),
            up=nums("up"),
            convs=nums("convs"),
            K=num("K"),
            box_pad=num("box_pad", float),
            blur=num("blur"),
            mean=nums("mean", float, 3),
            std=nums("std", float, 3),
            flip_pairs=tuple(pairs),
        )
