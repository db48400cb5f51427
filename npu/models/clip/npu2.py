"""CLIP ViT-H/14 on NPU2: the dispatches of one image pass (4 images, vision tower) and one
label pass (8 prompts, text tower) at the released sizes, as taconite-clip's Tower runs them
(per layer: qkv, one MHA per image or one over every prompt, o, AddLN, fc1 with GELU, fc2,
AddLN; each GEMM once per 256-row chunk of the pass's rows, in the bundle layout of
npu.models.clip.export), priced by npu.sim_cost (docs/device.md §6).

Released sizes (open_clip's ViT-H-14 model config): vision 32 layers of 1280, 16 heads, MLP
5120, 224 x 224 images in 14-pixel patches (257 tokens); text 24 layers of 1024, 16 heads,
MLP 4096, 77 tokens. Contexts: 8 (taconite-clip's README).
"""

from __future__ import annotations

from pathlib import Path

from npu.models.clip.config import T_BATCH, V_BATCH, ClipConfig, TowerConfig
from npu.models.clip.export import GEMM_M, MLP_ALIGN, pass_rows
from npu.sim_cost import (
    CLIP_TEXT_SCALE,
    Dispatch,
    ModelWork,
    PassWork,
    addln,
    attention,
    gemm,
    round_up,
)

VARIANTS = ("vit-h-14",)
VIT_H_14 = ClipConfig(
    vision=TowerConfig(layers=32, dim=1280, heads=16, mlp=5120, eps=1e-5, act="gelu"),
    text=TowerConfig(layers=24, dim=1024, heads=16, mlp=4096, eps=1e-5, act="gelu"),
    image_size=224, patch=14, context=77, vocab_size=49408, embed_dim=1024, eos_token_id=49407,
)  # fmt: skip
T_SEQ_PAD = 80  # rows per prompt (write_sim_bundle's default)
CONTEXTS = 8


def _tower(p: str, tower: TowerConfig, rows: int, mha: list[Dispatch]) -> list[Dispatch]:
    n1 = round_up(tower.mlp + 1, MLP_ALIGN)  # fc2's bias rides one extra fc1 column
    dim, chunks = tower.dim, rows // GEMM_M

    def g(name: str, k: int, n: int, gelu: bool = False) -> list[Dispatch]:
        return [gemm(f"{p}_{name}", "clip_gemm", GEMM_M, k, n, gelu=gelu)] * chunks

    ln = addln(f"{p}_addln", "addln", rows, dim)
    layer = [*g("qkv", dim, 3 * dim), *mha, *g("o", dim, dim), ln]
    layer += [*g("fc1", dim, n1, gelu=True), *g("fc2", n1, dim), ln]
    return layer * tower.layers


def dispatches(
    cfg: ClipConfig, v_stride: int | None = None, t_seq_pad: int = T_SEQ_PAD
) -> dict[str, list[Dispatch]]:
    """{"images": one vision pass of V_BATCH images, "texts": one text pass of T_BATCH
    prompts}; v_stride default: the tokens rounded up to 8 (264 for ViT-H/14)."""
    v, t = cfg.vision, cfg.text
    v_mha, v_rows, t_rows = pass_rows(cfg, v_stride or round_up(cfg.v_tokens, 8), t_seq_pad)
    v_att = attention("v_mha", "clip_mha", v.heads, v_mha, v_mha, v.head_dim)
    t_att = attention("t_mha", "clip_mha", t.heads, t_seq_pad, t_seq_pad, t.head_dim, T_BATCH)
    return {
        "images": _tower("v", v, v_rows, [v_att] * V_BATCH),
        "texts": _tower("t", t, t_rows, [t_att]),
    }


def work(variant: str = "vit-h-14") -> ModelWork:
    """ViT-H/14 on NPU2: "forward" (the image pass: 4 images) and "texts" (8 prompts)."""
    if variant not in VARIANTS:
        raise KeyError(f"clip has no released variant {variant!r} ({', '.join(VARIANTS)})")
    d = dispatches(VIT_H_14)
    passes = {
        "forward": PassWork("forward", V_BATCH, tuple(d["images"])),
        "texts": PassWork("texts", T_BATCH, tuple(d["texts"]), scale=CLIP_TEXT_SCALE),
    }
    contexts = tuple(f"clip-{variant}/xclbin{i}" for i in range(CONTEXTS))
    return ModelWork(f"clip-{variant}", contexts, passes, "released sizes")


def variant_of_bundle(path: Path) -> str | None:
    """ "vit-h-14" when a bundle's towers have ViT-H/14's widths and depths, else None."""
    from npu.bundle import Bundle

    bundle = Bundle.open(path)
    try:
        got = tuple(bundle.param(k, int) for k in ("v_layers", "v_dim", "t_layers", "t_dim"))
    finally:
        bundle.close()
    v, t = VIT_H_14.vision, VIT_H_14.text
    return "vit-h-14" if got == (v.layers, v.dim, t.layers, t.dim) else None
