"""Sapiens2-Pose 0.4b / 1b on NPU2: the dispatches one box makes at the released sizes, in
taconite-sapiens2's order (model.rs `backbone` then `head`: patch, per layer qkv, mha, o, gu,
down, then the deconvs, 1x1 convs and pred), priced by npu.sim_cost (docs/device.md §6).

Released sizes: backbone as docs/pose.md (24 / 40 layers of 1024 / 1536, 16 / 24 heads of
64, SwiGLU 4D, 8 registers, full attention in the first and last 8 layers and heads/2 KV
heads between, 1024 x 768 crops in 16-pixel patches); heads: 0.4b deconvs (1024, 768) and
1x1 convs (512, 512, 256), 1b (1536, 1024) and (768, 512, 256). Contexts: 6 (0.4b) and 7 (1b)
xclbins, as taconite-sapiens2's README says.
"""

from __future__ import annotations

from pathlib import Path

from npu.models.sapiens2.config import Config
from npu.sim_cost import Dispatch, ModelWork, PassWork, attention, gemm, round_up

VARIANTS = ("0.4b", "1b")
GEMM_TILES = (256, 512, 64)  # flm.GEMM's M, K and N multiples (docs/device.md §3)
MHA_ROW_ALIGN = 64  # IRON MHA's compiled length: tokens rounded up to its B_q


def _config(d: int, layers: int, heads: int, gqa: int, up: tuple, convs: tuple) -> Config:
    kv = tuple(heads if i < 8 or i >= layers - 8 else gqa for i in range(layers))
    return Config(
        D=d, I=4 * d, layers=layers, heads=heads, hd=64, kv_heads=kv, regs=8, patch=16,
        H=1024, W=768, eps=1e-6, in_eps=1e-5, up=up, convs=convs, K=308,
    )  # fmt: skip


RELEASED = {
    "0.4b": _config(1024, 24, 16, 8, (1024, 768), (512, 512, 256)),
    "1b": _config(1536, 40, 24, 12, (1536, 1024), (768, 512, 256)),
}
CONTEXTS = {"0.4b": 6, "1b": 7}


def dispatches(cfg: Config) -> list[Dispatch]:
    """One box's dispatches: rows are the tokens (3081) for the backbone GEMMs, the deconv
    windows (h0+1)(w0+2) and the heatmap pixels for the head; gu's N is both SwiGLU halves."""
    t, d = cfg.tokens, cfg.D
    out = [gemm("patch", "flm_gemm", cfg.gh * cfg.gw, 3 * cfg.patch**2, d, tiles=GEMM_TILES)]
    seq = round_up(t, MHA_ROW_ALIGN)
    for kv in cfg.kv_heads:
        w = (cfg.heads + 2 * kv) * cfg.hd
        out += [
            gemm(f"qkv{w}", "flm_gemm", t, d, w, tiles=GEMM_TILES),
            attention("mha", "s2_mha", cfg.heads, seq, seq, cfg.hd),
            gemm("o", "flm_gemm", t, d, d, tiles=GEMM_TILES),
            gemm("gu", "flm_gemm", t, d, 2 * cfg.I, tiles=GEMM_TILES),
            gemm("down", "flm_gemm", t, cfg.I, d, tiles=GEMM_TILES),
        ]
    c, h0, w0 = d, cfg.gh, cfg.gw
    for j, c_out in enumerate(cfg.up):
        rows = (h0 + 1) * (w0 + 2)
        out.append(gemm(f"d{j}", "flm_gemm", rows, 4 * c, 4 * c_out, tiles=GEMM_TILES))
        c, h0, w0 = c_out, 2 * h0, 2 * w0
    for j, c_out in enumerate(cfg.convs):
        out.append(gemm(f"c{j}", "flm_gemm", h0 * w0, c, c_out, tiles=GEMM_TILES))
        c = c_out
    out.append(gemm("pred", "flm_gemm", h0 * w0, c, cfg.K, tiles=GEMM_TILES))
    return out


def work(variant: str) -> ModelWork:
    """The released `variant` ("0.4b" or "1b") on NPU2: one box a pass."""
    if variant not in RELEASED:
        raise KeyError(f"sapiens2 has no released variant {variant!r} ({', '.join(VARIANTS)})")
    pw = PassWork("forward", 1, tuple(dispatches(RELEASED[variant])))
    contexts = tuple(f"sapiens2-{variant}/xclbin{i}" for i in range(CONTEXTS[variant]))
    return ModelWork(f"sapiens2-{variant}", contexts, {"forward": pw}, "released sizes")


def variant_of_bundle(path: Path) -> str | None:
    """The released variant a bundle holds (its D and layers params), None if neither."""
    from npu.bundle import Bundle

    bundle = Bundle.open(path)
    try:
        cfg = Config.from_params(bundle.manifest.params, where=f"{path}/manifest.txt")
    finally:
        bundle.close()
    for name, rel in RELEASED.items():
        if (cfg.D, cfg.layers, cfg.H, cfg.W) == (rel.D, rel.layers, rel.H, rel.W):
            return name
    return None
