"""Write an HF CLIPModel checkpoint as a CLIP bundle in taconite-clip's record layout, for the
simulated NPU (docs/clip.md).

The records are the ones taconite-clip reads: `gemm {v,t}_{qkv,o,fc1,fc2} M= K= N= b_bytes=
ctx= insts=` with K x N exactly dim x 3·dim, dim x dim, dim x N1, N1 x dim, and `op
{v,t}_{mha,addln} xclbin= insts= name=`. IRON's packed weight layout and its kernels'
geometry are unpublished (docs/clip.md), so the parts only the simulator reads are npucam's:
B is npu.sim's bfp16ebs8 packing with the tiling in `tile_n= tile_k= ct_k=`, biases and the
fc1 GELU are `bias=` / `epilogue=` fields, and the op records carry `kind=` plus geometry
(npu.sim_clip). The numerics follow taconite-clip's src/tower.rs (docs/clip.md): LN1 / LN2
affines folded into qkv / fc1, fc2's bias riding an extra fc1 column (N1 = MLP width + 1,
rounded up to 64), the attention scale compiled into the MHA kernel.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from npu.bundle_writer import BundleWriter
from npu.models.clip.checkpoint import HostWeights, load_checkpoint
from npu.models.clip.config import T_BATCH, V_BATCH, CheckpointError, ClipConfig, TowerConfig
from npu.models.clip.model import DEFAULT_TEMPLATE, ClipModel, ClipTowers, prompts_for
from npu.models.clip.post import logits_and_probs
from npu.models.clip.preprocess import (
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    RESIZE_SHORTEST,
    ImageInputError,
)
from npu.models.clip.tokenizer import Tokenizer
from npu.ops import GemmWeights, NumpyOps
from npu.sim_bundle import write_xclbin
from npu.sim_clip import write_addln, write_clip_mha
from npu.sim_kernels import CT_MAX_K_FOR_N, pack_gemm_b

GEMM_M = 256  # rows per GEMM dispatch: a tower's rows are a multiple of it
MHA_ROW_ALIGN = 64  # an MHA dispatch spans its tokens rounded up to this (IRON's B_q)
MLP_ALIGN = 64  # fc1's N (fc2's K) rounded up to this
# fc1's bias-carrying column: gelu(8) rounds to exactly 8.0 in bf16, and dividing fc2's bias by
# a power of two is exact, so the column adds bf16(bias) up to bfp16 rounding of the quotient.
BIAS_CARRIER = 8.0
Refset = tuple[Sequence[np.ndarray], Sequence[str]]


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def gemm_tiling(k: int, n: int) -> dict[str, int]:
    """The sim's B tiling for a [K, N] GEMM: IRON's defaults where they divide K and N
    (tile_k 512, tile_n 128 at K == 512 else 64), else the largest multiple of 8 that does."""

    def largest(limit: int, of: int) -> int:
        return next(t for t in range(min(limit, of), 0, -8) if of % t == 0 and t % 8 == 0)

    if k % 8 or n % 8:
        raise CheckpointError(f"a [{k}, {n}] GEMM: K and N must be multiples of 8")
    tile_n = 128 if k == 512 and n % 128 == 0 else largest(64, n)
    tile_k = largest(512, k)
    ct_k = largest(CT_MAX_K_FOR_N.get(tile_n, 128), tile_k)
    return {"tile_n": tile_n, "tile_k": tile_k, "ct_k": ct_k}


def _mlp_weights(fc1: GemmWeights, fc2: GemmWeights) -> tuple[GemmWeights, GemmWeights]:
    """fc1 / fc2 with fc2's bias moved onto an extra fc1 column (docs/clip.md)."""
    dim, mlp = fc1.w.shape
    n1 = _round_up(mlp + 1, MLP_ALIGN)
    w1 = np.zeros((dim, n1), np.float32)
    w1[:, :mlp] = fc1.w
    b1 = np.zeros(n1, np.float32)
    b1[:mlp] = fc1.bias if fc1.bias is not None else 0.0
    b1[mlp] = BIAS_CARRIER
    w2 = np.zeros((n1, fc2.w.shape[1]), np.float32)
    w2[:mlp] = fc2.w
    if fc2.bias is not None:
        w2[mlp] = fc2.bias / np.float32(BIAS_CARRIER)
    return GemmWeights(w1, b1, "gelu"), GemmWeights(w2)


def _tower_records(
    bw: BundleWriter, t: str, tower: TowerConfig, gemms: dict[str, GemmWeights], fields: dict
) -> None:
    """The GEMM records and per-layer B tensors of one tower, then its MHA and AddLN ops."""
    layers: list[dict[str, GemmWeights]] = []
    for i in range(tower.layers):
        g = {name: gemms[f"{t}.{i}.{name}"] for name in ("qkv", "o")}
        g["fc1"], g["fc2"] = _mlp_weights(gemms[f"{t}.{i}.fc1"], gemms[f"{t}.{i}.fc2"])
        layers.append(g)
    for name in ("qkv", "o", "fc1", "fc2"):
        first = layers[0][name]
        k, n = first.w.shape
        tiles = gemm_tiling(k, n)
        b_bytes = 0
        for i, layer in enumerate(layers):
            packed = pack_gemm_b(layer[name].w, layer[name].bias, **tiles)
            bw.tensor(f"{t}.{i}.{name}", packed, "u8")
            b_bytes = packed.nbytes
        insts = f"kernels/{t}_{name}.bin"
        bw.file(insts, np.arange(16, dtype=np.uint32).tobytes())
        bw.record(
            "gemm", f"{t}_{name}", M=GEMM_M, K=k, N=n, b_bytes=b_bytes, ctx="gemm", insts=insts,
            bias=first.bias is not None, epilogue=first.epilogue, **tiles,
        )  # fmt: skip
    write_clip_mha(bw, f"{t}_mha", heads=tower.heads, d=tower.head_dim, **fields["mha"])
    write_addln(bw, f"{t}_addln", rows=fields["rows"], dim=tower.dim, eps=tower.eps)


def pass_rows(cfg: ClipConfig, v_stride: int, t_seq_pad: int) -> tuple[int, int, int]:
    """(v_mha_rows, v_rows, t_rows) of a bundle: an image's MHA span (its tokens rounded up
    to MHA_ROW_ALIGN) and each tower's pass rows, rounded up to GEMM_M (its GEMM chunks)."""
    v_mha = _round_up(cfg.v_tokens, MHA_ROW_ALIGN)
    v_rows = _round_up(max(V_BATCH * v_stride, (V_BATCH - 1) * v_stride + v_mha), GEMM_M)
    return v_mha, v_rows, _round_up(T_BATCH * t_seq_pad, GEMM_M)


def _write(
    path: Path,
    cfg: ClipConfig,
    host: HostWeights,
    gemms: dict[str, GemmWeights],
    tokenizer: Tokenizer,
    *,
    v_stride: int,
    t_seq_pad: int,
    template: str,
    tok_tests: Sequence[str],
    refsets: Sequence[Refset],
    device_refs: list[tuple[np.ndarray, np.ndarray]] | None,
) -> None:
    import cv2

    v_mha, v_rows, t_rows = pass_rows(cfg, v_stride, t_seq_pad)
    with BundleWriter(path, 1) as bw:
        params = {
            "v_layers": cfg.vision.layers, "v_dim": cfg.vision.dim, "v_tokens": cfg.v_tokens,
            "v_stride": v_stride, "v_batch": V_BATCH, "v_rows": v_rows, "v_mha_rows": v_mha,
            "v_eps": cfg.vision.eps, "patch": cfg.patch, "image_size": cfg.image_size,
            "t_layers": cfg.text.layers, "t_dim": cfg.text.dim, "t_batch": T_BATCH,
            "t_seq_pad": t_seq_pad, "t_rows": t_rows, "t_eps": cfg.text.eps,
            "context": cfg.context, "embed_dim": cfg.embed_dim,
            "logit_scale": repr(float(host.logit_scale)),
            "eos_argmax": int(cfg.eos_token_id == 2), "prompt_template": template,
            "bos": tokenizer.bos_id, "eos": tokenizer.eos_id, "pad": tokenizer.pad_id,
            "resize_shortest": RESIZE_SHORTEST, "crop": cfg.image_size,
            "mean": ",".join(map(repr, OPENAI_CLIP_MEAN)),
            "std": ",".join(map(repr, OPENAI_CLIP_STD)),
        }  # fmt: skip
        for name, value in params.items():
            bw.param(name, value)
        write_xclbin(bw, "gemm")
        v_fields = {
            "rows": v_rows,
            "mha": dict(rows=v_mha, seq=cfg.v_tokens, qscale=cfg.vision.head_dim**-0.5),
        }
        t_fields = {
            "rows": t_rows,
            "mha": dict(rows=T_BATCH * t_seq_pad, block=t_seq_pad, seq=cfg.context,
                        causal=True, qscale=cfg.text.head_dim**-0.5),
        }  # fmt: skip
        _tower_records(bw, "v", cfg.vision, gemms, v_fields)
        _tower_records(bw, "t", cfg.text, gemms, t_fields)
        for name, value in _host_tensors(host).items():
            bw.tensor(name, np.ascontiguousarray(value, np.float32), "f32", shape=value.shape)
        for idx, text in enumerate(tok_tests):
            # as IRON's exporter: the text escaped with Python's unicode_escape, the ids HF's
            # row padded to the context length (taconite-clip's check compares both so)
            bw.record("tok_test", idx, tail=text.encode("unicode_escape").decode("ascii"))
            ids, _ = tokenizer.pad_ids([tokenizer.encode(text)])
            bw.tensor(f"tok.{idx}.ids", ids[0].astype(np.int32), "i32")
        bw.file("vocab.json", json.dumps(tokenizer.vocab, ensure_ascii=False).encode("utf-8"))
        merges = sorted(tokenizer.ranks, key=tokenizer.ranks.__getitem__)
        bw.file("merges.txt", "".join(f"{a} {b}\n" for a, b in merges).encode("utf-8"))
        cpu = ClipModel(ClipTowers.on_ops(cfg, host, NumpyOps(gemms)), tokenizer)
        for j, (images, labels) in enumerate(refsets):
            bw.record("refset", j, images=len(images), prompts=len(labels))
            for i, image in enumerate(images):
                ok, png = cv2.imencode(".png", cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
                if not ok:
                    raise ImageInputError(f"refset {j} image {i}: PNG encoding failed")
                rel = f"refs/{j}/{i}.png"
                bw.file(rel, png.tobytes())
                bw.record("ref_image", j, i, tail=rel)  # read by rest(2), as taconite
            for i, label in enumerate(labels):
                bw.record("ref_label", j, i, tail=label)
            pixels, ids = refset_inputs(cpu, refsets[j], template)
            image_embeds = cpu.encode_images(pixels)
            text_embeds = cpu.encode_texts(ids)
            logits, _ = logits_and_probs(image_embeds, text_embeds, host.logit_scale)
            tensors = [
                ("pixel_values", pixels, "f32"), ("input_ids", ids.astype(np.int32), "i32"),
                ("image_embeds", image_embeds, "f32"), ("text_embeds", text_embeds, "f32"),
                ("logits", logits, "f32"),
            ]  # fmt: skip
            if device_refs is not None:
                tensors += [
                    ("npu_image_embeds", device_refs[j][0], "f32"),
                    ("npu_text_embeds", device_refs[j][1], "f32"),
                ]
            for name, value, dtype in tensors:
                bw.tensor(f"ref.{j}.{name}", np.ascontiguousarray(value), dtype, shape=value.shape)


def _host_tensors(host: HostWeights) -> dict[str, np.ndarray]:
    """taconite-clip's host tensor names (docs/clip.md) -> float32 arrays."""
    return {
        "v.patch_w": host.v_patch_w, "v.cls": host.v_cls, "v.pos": host.v_pos,
        "v.ln_pre.w": host.v_ln_pre[0], "v.ln_pre.b": host.v_ln_pre[1],
        "v.ln_post.w": host.v_ln_post[0], "v.ln_post.b": host.v_ln_post[1],
        "v.proj": host.v_proj, "t.tok_emb": host.t_tok_emb, "t.pos": host.t_pos,
        "t.ln_final.w": host.t_ln_final[0], "t.ln_final.b": host.t_ln_final[1],
        "t.proj": host.t_proj,
    }  # fmt: skip


def refset_inputs(model: ClipModel, refset: Refset, template: str) -> tuple[np.ndarray, np.ndarray]:
    """(pixel_values float32 [n, 3, S, S], input_ids int [m, context]) of a refset's images and
    its labels' prompts, as the bundle's ref tensors hold them."""
    images, labels = refset
    ids, _ = model.tokenizer.pad_ids(
        [model.tokenizer.encode(q) for q in prompts_for(labels, template)]
    )
    return model.pixels(images), ids


def write_sim_bundle(
    model_dir: str | Path,
    path: str | Path,
    *,
    v_stride: int | None = None,
    t_seq_pad: int = 80,
    template: str = DEFAULT_TEMPLATE,
    tok_tests: Sequence[str] = (),
    refsets: Sequence[Refset] = (),
    device_refs: bool = True,
) -> Path:
    """Write an HF CLIPModel directory as a CLIP bundle the simulated NPU runs.

    v_stride: rows per image in a pass (default the tokens rounded up to 8: 264 for ViT-H/14);
    t_seq_pad: rows per prompt. tok_tests: `tok_test` records (the text escaped with Python's
    unicode_escape) with `tok.<idx>.ids` (padded to the context length). refsets:
    (uint8 RGB images, labels) per set, written as `refset`/`ref_image`/`ref_label` records,
    the images as PNGs under refs/<j>/, and ref.<j>.{pixel_values, input_ids, image_embeds,
    text_embeds, logits} from the checkpoint in float32 on cpu. With device_refs, the
    ref.<j>.npu_{image,text}_embeds are this bundle's own embeddings on the simulated NPU
    (first written to a scratch directory): in place of IRON's Python NPU app, which is not
    available, they pin what the device path computed at export time.
    """
    model_dir = Path(model_dir)
    cfg, host, gemms = load_checkpoint(model_dir)
    for tower in (cfg.vision, cfg.text):
        if tower.act != "gelu":
            raise CheckpointError(
                f"{model_dir}: hidden_act {tower.act!r}; the device GEMMs have no such epilogue"
            )
    tokenizer = Tokenizer.from_dir(model_dir, context_length=cfg.context)
    args = dict(
        v_stride=v_stride or _round_up(cfg.v_tokens, 8), t_seq_pad=t_seq_pad, template=template,
        tok_tests=tok_tests, refsets=refsets,
    )  # fmt: skip
    refs = None
    if refsets and device_refs:
        refs = _device_embeddings(cfg, host, gemms, tokenizer, args)
    _write(Path(path), cfg, host, gemms, tokenizer, device_refs=refs, **args)
    return Path(path)


def _device_embeddings(
    cfg: ClipConfig, host: HostWeights, gemms: dict, tokenizer: Tokenizer, args: dict
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(image, text) embeddings of each refset from the bundle run on a fresh SimDevice."""
    from npu.models.clip.npu import load_bundle
    from npu.sim import SimDevice

    with tempfile.TemporaryDirectory(prefix="npucam-clip-export-") as tmp:
        scratch = Path(tmp) / "bundle"
        _write(scratch, cfg, host, gemms, tokenizer, device_refs=None,
               **{**args, "tok_tests": (), "refsets": ()})  # fmt: skip
        device = SimDevice()
        try:
            model = load_bundle(scratch, device)
            out = []
            for refset in args["refsets"]:
                pixels, ids = refset_inputs(model, refset, args["template"])
                out.append((model.encode_images(pixels), model.encode_texts(ids)))
            return out
        finally:
            device.close()
