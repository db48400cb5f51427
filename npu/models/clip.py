"""CLIP zero-shot classification: HF CLIPTokenizer ids, CLIPImageProcessor pixels, both towers.

The public CLIP API: `Tokenizer` (clip_tokenizer), `preprocess` (clip_preprocess), the towers
(clip_towers) and `ClipModel`, which loads an HF CLIPModel directory (config.json,
*.safetensors, vocab.json, merges.txt) on the cpu backend, or a CLIP bundle (spec b.2) on the
simulated or real NPU (`load_bundle`), and classifies images against labels as HF does:
logits = exp(logit_scale) · cosine(image, prompt), softmax per image over prompts.
`write_sim_bundle` turns a checkpoint into a bundle the simulator runs; `check_bundle` runs a
bundle's self-test records with spec b.9's gates.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from npu.models.clip_preprocess import (
    CROP,
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    RESIZE_SHORTEST,
    ImageInputError,
    axis_weights,
    check_image,
    normalize,
    preprocess,
    resize_crop,
    resized_size,
)
from npu.models.clip_tokenizer import (
    BOS_TOKEN,
    CONTEXT_LENGTH,
    EOS_TOKEN,
    Tokenizer,
    TokenizerError,
    bytes_to_unicode,
)
from npu.models.clip_towers import (
    T_BATCH,
    V_BATCH,
    CheckpointError,
    ClipConfig,
    ClipTowers,
    EncodeInputError,
    HostWeights,
    TowerConfig,
    layer_norm,
    load_checkpoint,
    logits_and_probs,
    run_tower,
)
from npu.ops import NumpyOps
from pipeline.errors import NpucamError

__all__ = [
    "BOS_TOKEN",
    "CONTEXT_LENGTH",
    "CROP",
    "DEFAULT_TEMPLATE",
    "EOS_TOKEN",
    "OPENAI_CLIP_MEAN",
    "OPENAI_CLIP_STD",
    "RESIZE_SHORTEST",
    "T_BATCH",
    "V_BATCH",
    "CheckLine",
    "CheckpointError",
    "ClipConfig",
    "ClipInputError",
    "ClipModel",
    "ClipTowers",
    "EncodeInputError",
    "HostWeights",
    "ImageInputError",
    "Tokenizer",
    "TokenizerError",
    "TowerConfig",
    "ZeroShot",
    "axis_weights",
    "bytes_to_unicode",
    "check_bundle",
    "check_image",
    "layer_norm",
    "load_bundle",
    "load_checkpoint",
    "logits_and_probs",
    "normalize",
    "preprocess",
    "prompts_for",
    "resize_crop",
    "resized_size",
    "run_tower",
    "write_sim_bundle",
]

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
        return cls(ClipTowers(cfg, host, NumpyOps(gemms)), tokenizer)

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


# -- the bundle path (spec b.2, b.5-b.7) on a device: the simulated NPU or XRT ------------

GEMM_M = 256  # rows per GEMM dispatch (flm.GEMM's M % 256)
GEMM_K_ALIGN = 512  # flm.GEMM's K % 512 (docs/device.md)
GEMM_N_ALIGN = 128  # a multiple of every tile_n
TOWER_GEMMS = ("qkv", "o", "fc1", "fc2")


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _host_tensors(host: HostWeights) -> dict[str, np.ndarray]:
    """Spec b.2's host tensor names -> float32 arrays."""
    return {
        "v.patch_w": host.v_patch_w, "v.cls": host.v_cls, "v.pos": host.v_pos,
        "v.ln_pre.w": host.v_ln_pre[0], "v.ln_pre.b": host.v_ln_pre[1],
        "v.ln_post.w": host.v_ln_post[0], "v.ln_post.b": host.v_ln_post[1],
        "v.proj": host.v_proj, "t.tok_emb": host.t_tok_emb, "t.pos": host.t_pos,
        "t.ln_final.w": host.t_ln_final[0], "t.ln_final.b": host.t_ln_final[1],
        "t.proj": host.t_proj,
    }  # fmt: skip


def write_sim_bundle(
    model_dir: str | Path,
    path: str | Path,
    *,
    v_stride: int = 264,
    t_seq_pad: int = 80,
    template: str = DEFAULT_TEMPLATE,
    tok_tests: Sequence[str] = (),
    refsets: Sequence[tuple[Sequence[np.ndarray], Sequence[str]]] = (),
) -> Path:
    """Write an HF CLIPModel directory as a CLIP bundle the simulated NPU runs.

    Records and tensors follow spec b.2: params, `gemm {v,t}_{qkv,o,fc1,fc2}` (one kernel per
    shape, per-layer B tensors `{v,t}.<i>.<gemm>`), `op {v,t}_mha kind=mha`, the host f32
    tensors, vocab.json + merges.txt in the root, and `tok_test <idx> <text>` records with
    `tok.<idx>.ids`. IRON's packing is unpublished (spec Q3), so B is npu.sim's bfp16 layout
    with fc2's bias as a GEMM bias (not an extra fc1 column), and K / N are zero-padded to
    flm.GEMM's alignment; the host pads A and drops the extra C columns.
    refsets: (uint8 RGB images, labels) per set, written as `refset`/`ref_image`/`ref_label`
    records, the images as PNGs under refs/<j>/, and ref.<j>.{pixel_values, input_ids,
    image_embeds, text_embeds, logits} from this checkpoint in float32 on the cpu backend.
    There is no Python NPU app here, so no ref.<j>.npu_* tensors are written.
    """
    import cv2

    from npu.bundle_writer import BundleWriter
    from npu.sim import CT_MAX_K_FOR_N, pack_gemm_b, write_xclbin

    model_dir = Path(model_dir)
    cfg, host, gemms = load_checkpoint(model_dir)
    for tower in (cfg.vision, cfg.text):
        if tower.act != "gelu":
            raise CheckpointError(
                f"{model_dir}: hidden_act {tower.act!r}; the device GEMMs have no such epilogue"
            )
    tokenizer = Tokenizer.from_dir(model_dir, context_length=cfg.context)
    with BundleWriter(path, 1) as bw:
        params = {
            "v_layers": cfg.vision.layers, "v_dim": cfg.vision.dim, "v_tokens": cfg.v_tokens,
            "v_stride": v_stride, "v_batch": V_BATCH,
            "v_rows": _round_up(V_BATCH * v_stride, GEMM_M), "v_mha_rows": v_stride,
            "v_eps": cfg.vision.eps, "patch": cfg.patch, "image_size": cfg.image_size,
            "t_layers": cfg.text.layers, "t_dim": cfg.text.dim, "t_batch": T_BATCH,
            "t_seq_pad": t_seq_pad, "t_rows": _round_up(T_BATCH * t_seq_pad, GEMM_M),
            "t_eps": cfg.text.eps, "context": cfg.context, "embed_dim": cfg.embed_dim,
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
        write_xclbin(bw, "mha")
        for t, tower in (("v", cfg.vision), ("t", cfg.text)):
            for g in TOWER_GEMMS:
                for i in range(tower.layers):
                    gw = gemms[f"{t}.{i}.{g}"]
                    k, n = gw.w.shape
                    # fc1's C is fc2's A, so its N is padded to fc2's K alignment
                    n_align = GEMM_K_ALIGN if g == "fc1" else GEMM_N_ALIGN
                    kp, np_ = _round_up(k, GEMM_K_ALIGN), _round_up(n, n_align)
                    w = np.zeros((kp, np_), np.float32)
                    w[:k, :n] = gw.w
                    bias = None
                    if gw.bias is not None:
                        bias = np.zeros(np_, np.float32)
                        bias[:n] = gw.bias
                    tile_n = 128 if kp == 512 else 64
                    packed = pack_gemm_b(w, bias, tile_n, 512, CT_MAX_K_FOR_N[tile_n])
                    bw.tensor(f"{t}.{i}.{g}", packed, "u8")
                insts = f"kernels/{t}_{g}.bin"
                bw.file(insts, np.arange(16, dtype=np.uint32).tobytes())
                bw.record(
                    "gemm", f"{t}_{g}", M=GEMM_M, K=kp, N=np_, b_bytes=packed.nbytes, ctx="gemm",
                    insts=insts, tile_n=tile_n, tile_k=512, ct_k=CT_MAX_K_FOR_N[tile_n],
                    bias=bias is not None, epilogue=gw.epilogue,
                )  # fmt: skip
            seq, pad = (cfg.v_tokens, v_stride) if t == "v" else (cfg.context, t_seq_pad)
            insts = f"kernels/{t}_mha.bin"
            bw.file(insts, np.arange(16, dtype=np.uint32).tobytes())
            bw.record(
                "op", f"{t}_mha", kind="mha", ctx="mha", insts=insts, heads=tower.heads,
                d=tower.head_dim, seq=seq, seq_pad=pad, causal=int(t == "t"), qscale="host",
            )  # fmt: skip
        for name, value in _host_tensors(host).items():
            bw.tensor(name, np.ascontiguousarray(value, np.float32), "f32", shape=value.shape)
        for idx, text in enumerate(tok_tests):
            bw.record("tok_test", idx, tail=text)
            bw.tensor(f"tok.{idx}.ids", np.asarray(tokenizer.encode(text), np.int32), "i32")
        bw.file("vocab.json", json.dumps(tokenizer.vocab, ensure_ascii=False).encode("utf-8"))
        merges = sorted(tokenizer.ranks, key=tokenizer.ranks.__getitem__)
        bw.file("merges.txt", "".join(f"{a} {b}\n" for a, b in merges).encode("utf-8"))
        if refsets:
            cpu = ClipModel(ClipTowers(cfg, host, NumpyOps(gemms)), tokenizer)
        for j, (images, labels) in enumerate(refsets):
            bw.record("refset", j, images=len(images), prompts=len(labels))
            for i, image in enumerate(images):
                ok, png = cv2.imencode(".png", cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
                if not ok:
                    raise ImageInputError(f"refset {j} image {i}: PNG encoding failed")
                rel = f"refs/{j}/{i}.png"
                bw.file(rel, png.tobytes())
                bw.record("ref_image", j, i, rel)
            for i, label in enumerate(labels):
                bw.record("ref_label", j, i, tail=label)
            pixels = cpu.pixels(images)
            ids, _ = tokenizer.pad_ids([tokenizer.encode(q) for q in prompts_for(labels, template)])
            image_embeds = cpu.encode_images(pixels)
            text_embeds = cpu.encode_texts(ids)
            logits, _ = logits_and_probs(image_embeds, text_embeds, host.logit_scale)
            for name, value, dtype in (
                ("pixel_values", pixels, "f32"), ("input_ids", ids.astype(np.int32), "i32"),
                ("image_embeds", image_embeds, "f32"), ("text_embeds", text_embeds, "f32"),
                ("logits", logits, "f32"),
            ):  # fmt: skip
                bw.tensor(f"ref.{j}.{name}", np.ascontiguousarray(value), dtype, shape=value.shape)
    return Path(path)


class _PaddedGemms:
    """The op interface over a bundle's padded GEMMs: A zero-padded to the record's K, C cut
    to the tower's N where the host reads it (fc1's padded columns feed fc2's zero rows)."""

    def __init__(self, ops: Any, k_pad: dict[str, int], n_valid: dict[str, int]) -> None:
        self.ops = ops
        self.backend = ops.backend
        self._k = k_pad
        self._n = n_valid

    def gemm(self, key: str, a: np.ndarray) -> np.ndarray:
        k = self._k[key]
        if k > a.shape[1]:
            a = np.concatenate([a, np.zeros((len(a), k - a.shape[1]), np.float32)], axis=1)
        c = self.ops.gemm(key, a)
        n = self._n.get(key)
        return c[:, :n] if n is not None else c

    def mha(self, key: str, q, k, v, *, scale: float, causal: bool = False) -> np.ndarray:
        return self.ops.mha(key, q, k, v, scale=scale, causal=causal)


def _open_device(device: Any) -> Any:
    if device == "sim":
        from npu.sim import SimDevice

        return SimDevice()
    if device == "npu":
        from npu.xrt import open_device

        return open_device()
    if isinstance(device, str):
        raise ClipInputError(f"device {device!r}: expected 'sim', 'npu' or a device object")
    return device


def load_bundle(path: str | Path, device: Any = "sim") -> ClipModel:
    """A CLIP bundle (spec b.2) on a device: an npu.sim.SimDevice / npu.xrt.XrtDevice, or the
    backend name "sim" / "npu" to open one. Errors name the manifest line or tensor."""
    from npu.bundle import Bundle, BundleError
    from npu.device import kernel_key, kernel_spec
    from npu.ops import DeviceOps

    path = Path(path)
    bundle = Bundle.open(path)
    where = f"{path}/manifest.txt"
    if bundle.version != 1:
        raise BundleError(f"{where}: version {bundle.version}; the CLIP runtime reads version 1")
    p = bundle.param
    crop, image_size = p("crop", int), p("image_size", int)
    if crop != image_size:
        raise BundleError(f"{where}: param crop {crop} != image_size {image_size}")
    mean, std = bundle.param_list("mean", float), bundle.param_list("std", float)
    if len(mean) != 3 or len(std) != 3:
        raise BundleError(f"{where}: params mean and std need 3 values each")
    records = {kernel_key(r): r for r in bundle.records}

    def spec(key: str):
        if key not in records:
            raise BundleError(f"{where}: no kernel record {key}")
        return kernel_spec(bundle, records[key])

    towers: dict[str, TowerConfig] = {}
    k_pad: dict[str, int] = {}
    n_valid: dict[str, int] = {}
    for t in ("v", "t"):
        dim, layers, eps = p(f"{t}_dim", int), p(f"{t}_layers", int), p(f"{t}_eps", float)
        mha = spec(f"{t}_mha")
        heads, d = mha.get_int("heads"), mha.get_int("d")
        if heads * d != dim:
            raise BundleError(f"{mha.where()}: heads {heads} x d {d} != {t}_dim {dim}")
        shapes = {g: spec(f"{t}_{g}") for g in TOWER_GEMMS}
        ks = {g: s.get_int("K") for g, s in shapes.items()}
        ns = {g: s.get_int("N") for g, s in shapes.items()}
        need = {"qkv": (dim, 3 * dim), "o": (dim, dim), "fc1": (dim, 1), "fc2": (ns["fc1"], dim)}
        for g, (k, n) in need.items():
            if ks[g] < k or ns[g] < n or (g == "fc2" and ks[g] != ns["fc1"]):
                raise BundleError(f"{shapes[g].where()}: {t}_{g} is {ks[g]}x{ns[g]}, needs {k}x{n}")
        if shapes["fc1"].get_str("epilogue", "none") != "gelu":
            raise BundleError(f"{shapes['fc1'].where()}: {t}_fc1 must have epilogue=gelu")
        for i in range(layers):
            for g in TOWER_GEMMS:
                k_pad[f"{t}.{i}.{g}"] = ks[g]
                if g != "fc1":
                    n_valid[f"{t}.{i}.{g}"] = need[g][1]
        towers[t] = TowerConfig(layers, dim, heads, ns["fc1"], eps, "gelu")
    context, embed = p("context", int), p("embed_dim", int)
    patch = p("patch", int)
    tokens = (image_size // patch) ** 2 + 1
    if p("v_tokens", int) != tokens:
        raise BundleError(f"{where}: v_tokens {p('v_tokens', int)} != {tokens} for the patch grid")
    vdim, tdim = towers["v"].dim, towers["t"].dim
    shapes = {
        "v.patch_w": (vdim, 3 * patch * patch), "v.cls": (vdim,), "v.pos": (tokens, vdim),
        "v.ln_pre.w": (vdim,), "v.ln_pre.b": (vdim,), "v.ln_post.w": (vdim,),
        "v.ln_post.b": (vdim,), "v.proj": (embed, vdim), "t.tok_emb": (-1, tdim),
        "t.pos": (context, tdim), "t.ln_final.w": (tdim,), "t.ln_final.b": (tdim,),
        "t.proj": (embed, tdim),
    }  # fmt: skip
    host_t: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        e = bundle.entry(name)
        if e.dtype != "f32":
            raise BundleError(f"tensor {name} is {e.dtype}, wanted f32")
        vocab = e.elems // tdim if name == "t.tok_emb" else 0
        full = tuple(vocab if s == -1 else s for s in shape)
        bundle.expect(name, "f32", int(np.prod(full)))
        host_t[name] = bundle.view(name, "f32").reshape(full)
    host = HostWeights(
        v_patch_w=host_t["v.patch_w"], v_cls=host_t["v.cls"], v_pos=host_t["v.pos"],
        v_ln_pre=(host_t["v.ln_pre.w"], host_t["v.ln_pre.b"]),
        v_ln_post=(host_t["v.ln_post.w"], host_t["v.ln_post.b"]), v_proj=host_t["v.proj"],
        t_tok_emb=host_t["t.tok_emb"], t_pos=host_t["t.pos"],
        t_ln_final=(host_t["t.ln_final.w"], host_t["t.ln_final.b"]), t_proj=host_t["t.proj"],
        logit_scale=p("logit_scale", float),
    )  # fmt: skip
    eos = p("eos", int)
    cfg = ClipConfig(
        vision=towers["v"], text=towers["t"], image_size=image_size, patch=patch,
        context=context, vocab_size=host.t_tok_emb.shape[0], embed_dim=embed,
        eos_token_id=2 if p("eos_argmax", int) else eos,
    )  # fmt: skip
    for t in ("v", "t"):
        for i in range(towers[t].layers):
            for g in TOWER_GEMMS:
                bundle.entry(f"{t}.{i}.{g}")
    ops = DeviceOps.from_bundle(
        _open_device(device),
        bundle,
        gemms={
            f"{t}.{i}.{g}": (f"{t}_{g}", f"{t}.{i}.{g}")
            for t in ("v", "t")
            for i in range(towers[t].layers)
            for g in TOWER_GEMMS
        },
        mhas={"v.mha": "v_mha", "t.mha": "t_mha"},
    )
    clip_towers = ClipTowers(
        cfg,
        host,
        _PaddedGemms(ops, k_pad, n_valid),
        v_stride=p("v_stride", int),
        t_stride=p("t_seq_pad", int),
        v_batch=p("v_batch", int),
        t_batch=p("t_batch", int),
    )
    tokenizer = Tokenizer.from_files(
        bundle.path("vocab.json"), bundle.path("merges.txt"), context_length=context
    )
    if (tokenizer.bos_id, tokenizer.eos_id) != (p("bos", int), eos):
        raise BundleError(f"{where}: params bos/eos differ from the bundle's vocab.json")
    tokenizer.pad_id = p("pad", int)
    model = ClipModel(clip_towers, tokenizer, resize_shortest=p("resize_shortest", int),
                      mean=tuple(mean), std=tuple(std))  # fmt: skip
    model.template = p("prompt_template")
    model.bundle = bundle
    return model


# -- `clip check`: a bundle's self-test sets (spec b.9) -----------------------------------

# (gate vs fp32, gate vs the Python NPU app), minimum row cosine, per spec b.9
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


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp((logits - logits.max(axis=1, keepdims=True)).astype(np.float64))
    return e / e.sum(axis=1, keepdims=True)


def check_bundle(model: ClipModel, read_rgb: Any) -> list[CheckLine]:
    """Run a bundle-loaded model against its tok_test and refset records (spec b.9).

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
        ref_probs = _softmax(ref_logits)
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
