"""A CLIP bundle on a device, replaying taconite-clip's tower schedule (docs/clip.md).

Per tower the device holds the bf16 residual stream in two buffers xa / xb, one A and one C
buffer per GEMM record (run once per M-row chunk over sub-buffer views; fc2 reads fc1's C in
place), and per layer issues: qkv GEMM, the MHA dispatches (per image at its row offset, or
one over every prompt) on views of the qkv output, o GEMM, AddLN(xa, o.C -> xb, fc1.A),
fc1 GEMM (GELU), fc2 GEMM, AddLN(xb, fc2.C -> xa, qkv.A). The host enters once per pass
(bf16 residual, LayerNorm without affine as the first qkv A) and reads xa back at the end.
Only taconite's records and checks are required, so an IRON-exported bundle loads on the XRT
device; the simulated NPU additionally reads its own kind / tiling fields (docs/device.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from npu.backends import open_device
from npu.bf16 import bf16_to_f32, f32_to_bf16
from npu.bundle import Bundle, BundleError
from npu.device import Buffer, Device, Kernel, KernelSpec, kernel_key, kernel_spec
from npu.models.clip.checkpoint import HostWeights
from npu.models.clip.config import ClipConfig, TowerConfig
from npu.models.clip.model import ClipInputError, ClipModel, ClipTowers, layer_norm
from npu.models.clip.tokenizer import Tokenizer

BF16 = 2
TOWER_GEMMS = ("qkv", "o", "fc1", "fc2")


@dataclass
class GemmIo:
    """One GEMM record's operands for `rows` rows: A, C and each M-row chunk's views."""

    key: str
    kernel: Kernel
    k: int
    n: int
    b_bytes: int
    a: Buffer
    c: Buffer
    chunks: list[tuple[Buffer, Buffer]]


class DeviceTower:
    """One tower (`p` = "v" or "t") of a bundle on a device, as taconite-clip's Tower.

    mha_rows: (first row, rows) of each MHA dispatch, issued in this order every layer.
    """

    def __init__(
        self,
        device: Device,
        bundle: Bundle,
        specs: dict[str, KernelSpec],
        p: str,
        *,
        layers: int,
        dim: int,
        rows: int,
        eps: float,
        mha_rows: list[tuple[int, int]],
    ) -> None:
        self.device, self.p, self.dim, self.rows, self.eps = device, p, dim, rows, eps
        self._buffers: list[Buffer] = []
        self._kernels: dict[str, Kernel] = {}
        try:
            self._setup(bundle, specs, layers, mha_rows)
        except BaseException:
            self.close()
            raise

    def _kernel(self, spec: KernelSpec) -> Kernel:
        if spec.key not in self._kernels:
            self._kernels[spec.key] = self.device.load(spec)
        return self._kernels[spec.key]

    def _zeros(self, nbytes: int) -> Buffer:
        buf = self.device.alloc(nbytes)
        self._buffers.append(buf)
        buf.write(np.zeros(nbytes, np.uint8))
        self.device.to_device(buf)
        return buf

    def _io(self, spec: KernelSpec, a: Buffer | None = None) -> GemmIo:
        m, k, n = spec.get_int("M"), spec.get_int("K"), spec.get_int("N")
        if self.rows % m:
            raise BundleError(f"{spec.where()}: {self.rows} rows is not a multiple of M = {m}")
        a = a if a is not None else self._zeros(self.rows * k * BF16)
        c = self._zeros(self.rows * n * BF16)
        sub = self.device.sub
        chunks = [
            (sub(a, i * m * k * BF16, m * k * BF16), sub(c, i * m * n * BF16, m * n * BF16))
            for i in range(self.rows // m)
        ]
        return GemmIo(spec.key, self._kernel(spec), k, n, spec.get_int("b_bytes"), a, c, chunks)

    def _setup(
        self,
        bundle: Bundle,
        specs: dict[str, KernelSpec],
        layers: int,
        mha_rows: list[tuple[int, int]],
    ) -> None:
        p, dim, rows = self.p, self.dim, self.rows
        self.qkv = self._io(specs[f"{p}_qkv"])
        self.o = self._io(specs[f"{p}_o"])
        self.fc1 = self._io(specs[f"{p}_fc1"])
        fc2 = specs[f"{p}_fc2"]
        if fc2.get_int("K") != self.fc1.n:
            raise BundleError(f"{fc2.where()}: A width {self.fc1.n} != K {fc2.get_int('K')}")
        self.fc2 = self._io(fc2, self.device.sub(self.fc1.c, 0, rows * self.fc1.n * BF16))
        for io, k, n in (
            (self.qkv, dim, 3 * dim), (self.o, dim, dim), (self.fc1, dim, self.fc1.n),
            (self.fc2, self.fc1.n, dim),
        ):  # fmt: skip
            if (io.k, io.n) != (k, n):
                raise BundleError(
                    f"{specs[io.key].where()}: {io.key}: K x N = {io.k} x {io.n}, expected "
                    f"{k} x {n}"
                )
        self.mha = self._kernel(specs[f"{p}_mha"])
        self.addln = self._kernel(specs[f"{p}_addln"])
        self.xres = (self._zeros(rows * dim * BF16), self._zeros(rows * dim * BF16))
        self.weights: list[tuple[Buffer, ...]] = []
        for i in range(layers):
            layer = []
            for g, io in zip(TOWER_GEMMS, (self.qkv, self.o, self.fc1, self.fc2), strict=True):
                name = f"{p}.{i}.{g}"
                blob = bundle.view(name, "u8")
                if blob.nbytes != io.b_bytes:
                    raise BundleError(
                        f"tensor {name}: {blob.nbytes} bytes, but {specs[io.key].where()} "
                        f"has b_bytes={io.b_bytes}"
                    )
                buf = self.device.alloc(blob.nbytes)
                self._buffers.append(buf)
                buf.write(blob)
                self.device.to_device(buf)
                layer.append(buf)
            self.weights.append(tuple(layer))
        self.mha_views: list[list[Buffer]] = []
        for r0, n in mha_rows:
            if r0 + n > rows:
                raise BundleError(f"{p}: an MHA dispatch reaches row {r0 + n} of {rows}")
            qkv = self.device.sub(self.qkv.c, r0 * 3 * dim * BF16, n * 3 * dim * BF16)
            out = self.device.sub(self.o.a, r0 * dim * BF16, n * dim * BF16)
            self.mha_views.append([qkv, qkv, qkv, out])

    def _gemm(self, io: GemmIo, w: Buffer) -> None:
        for a, c in io.chunks:
            self.device.run(io.kernel, [a, w, c])

    def run(self, x: np.ndarray) -> np.ndarray:
        """x: float32 [n <= rows, dim] (padding rows zero) -> float32 [n, dim], the final
        residual stream (bf16 on the device between ops)."""
        n, dim = x.shape[0], self.dim
        if x.ndim != 2 or x.shape[1] != dim or n > self.rows:
            raise ClipInputError(f"{self.p} tower: rows {x.shape}, wanted <= [{self.rows}, {dim}]")
        xb = np.zeros((self.rows, dim), np.uint16)
        xb[:n] = f32_to_bf16(x)
        h = f32_to_bf16(layer_norm(bf16_to_f32(xb), self.eps))
        xa, xb_buf = self.xres
        xa.write(xb)
        self.qkv.a.write(h)
        self.device.to_device(xa)
        self.device.to_device(self.qkv.a)
        run = self.device.run
        for w_qkv, w_o, w_fc1, w_fc2 in self.weights:
            self._gemm(self.qkv, w_qkv)
            for views in self.mha_views:
                run(self.mha, views)
            self._gemm(self.o, w_o)
            run(self.addln, [xa, self.o.c, xb_buf, self.fc1.a])
            self._gemm(self.fc1, w_fc1)
            self._gemm(self.fc2, w_fc2)
            run(self.addln, [xb_buf, self.fc2.c, xa, self.qkv.a])
        self.device.from_device(xa)
        return bf16_to_f32(xa.array(np.uint16, (self.rows, dim))[:n])

    def close(self) -> None:
        """Free this tower's buffers and kernels (the device stays open)."""
        for buf in reversed(self._buffers):
            self.device.free(buf)
        for kernel in self._kernels.values():
            self.device.free_kernel(kernel)
        self._buffers, self._kernels = [], {}


class BundleLayers:
    """TowerLayers over the two DeviceTowers of a bundle; backend is the device's."""

    def __init__(self, device: Device, towers: dict[str, DeviceTower]) -> None:
        self.backend = device.backend
        self.towers = towers

    def run(self, tower: str, x: np.ndarray) -> np.ndarray:
        return self.towers[tower].run(x)


def _host_weights(bundle: Bundle, p: Any, vdim: int, tdim: int) -> HostWeights:
    """taconite-clip's host f32 tensors (docs/clip.md), shapes checked against the params."""
    patch, image_size, embed = p("patch", int), p("image_size", int), p("embed_dim", int)
    tokens, context = p("v_tokens", int), p("context", int)
    shapes = {
        "v.patch_w": (vdim, 3 * patch * patch), "v.cls": (vdim,), "v.pos": (tokens, vdim),
        "v.ln_pre.w": (vdim,), "v.ln_pre.b": (vdim,), "v.ln_post.w": (vdim,),
        "v.ln_post.b": (vdim,), "v.proj": (embed, vdim), "t.tok_emb": (-1, tdim),
        "t.pos": (context, tdim), "t.ln_final.w": (tdim,), "t.ln_final.b": (tdim,),
        "t.proj": (embed, tdim),
    }  # fmt: skip
    t: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        e = bundle.entry(name)
        if e.dtype != "f32":
            raise BundleError(f"tensor {name} is {e.dtype}, wanted f32")
        vocab = e.elems // tdim if name == "t.tok_emb" else 0
        full = tuple(vocab if s == -1 else s for s in shape)
        bundle.expect(name, "f32", int(np.prod(full)))
        t[name] = bundle.view(name, "f32").reshape(full)
    if (image_size // patch) ** 2 + 1 != tokens:
        raise BundleError(f"{bundle.root}/manifest.txt: v_tokens {tokens} != the patch grid's")
    return HostWeights(
        v_patch_w=t["v.patch_w"], v_cls=t["v.cls"], v_pos=t["v.pos"],
        v_ln_pre=(t["v.ln_pre.w"], t["v.ln_pre.b"]),
        v_ln_post=(t["v.ln_post.w"], t["v.ln_post.b"]), v_proj=t["v.proj"],
        t_tok_emb=t["t.tok_emb"], t_pos=t["t.pos"],
        t_ln_final=(t["t.ln_final.w"], t["t.ln_final.b"]), t_proj=t["t.proj"],
        logit_scale=p("logit_scale", float),
    )  # fmt: skip


def load_bundle(path: str | Path, device: Any = "sim") -> ClipModel:
    """A CLIP bundle on a device: an npu.sim.SimDevice / npu.xrt.XrtDevice, or the backend
    name "sim" / "npu" to open one. Every kernel loads at once; errors name the manifest line,
    record or tensor."""
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
    records = {kernel_key(r): r for r in bundle.records if r.tag in ("gemm", "op")}
    specs: dict[str, KernelSpec] = {}
    for t in ("v", "t"):
        for name in (*TOWER_GEMMS, "mha", "addln"):
            key = f"{t}_{name}"
            if key not in records:
                raise BundleError(f"{where}: no kernel record {key}")
            specs[key] = kernel_spec(bundle, records[key], owner="clip")
    dims = {t: p(f"{t}_dim", int) for t in ("v", "t")}
    host = _host_weights(bundle, p, dims["v"], dims["t"])
    v_stride, v_batch, t_pad, t_batch = (
        p("v_stride", int), p("v_batch", int), p("t_seq_pad", int), p("t_batch", int),
    )  # fmt: skip
    v_tokens, context, v_mha = p("v_tokens", int), p("context", int), p("v_mha_rows", int)
    rows = {"v": p("v_rows", int), "t": p("t_rows", int)}
    for ok, what in (
        (v_stride >= v_tokens and t_pad >= context, "v_stride / t_seq_pad below the tokens"),
        (v_batch >= 1 and t_batch >= 1, "v_batch and t_batch must be >= 1"),
        (v_mha >= v_tokens, f"v_mha_rows {v_mha} < v_tokens {v_tokens}"),
        (rows["v"] >= v_batch * v_stride, "v_rows is below v_batch x v_stride"),
        (rows["t"] >= t_batch * t_pad, "t_rows is below t_batch x t_seq_pad"),
    ):
        if not ok:
            raise BundleError(f"{where}: {what}")
    eos = p("eos", int)
    tokenizer = Tokenizer.from_files(
        bundle.path("vocab.json"), bundle.path("merges.txt"), context_length=context
    )
    if (tokenizer.bos_id, tokenizer.eos_id) != (p("bos", int), eos):
        raise BundleError(f"{where}: params bos/eos differ from the bundle's vocab.json")
    tokenizer.pad_id = p("pad", int)
    template, resize = p("prompt_template"), p("resize_shortest", int)
    mha_rows = {
        "v": [(im * v_stride, v_mha) for im in range(v_batch)],
        "t": [(0, t_batch * t_pad)],
    }
    dev = open_device(device)
    if dev is None:
        raise ClipInputError(f"{path}: a bundle runs on a device (backend sim or npu), not cpu")
    towers: dict[str, DeviceTower] = {}
    try:
        for t in ("v", "t"):
            towers[t] = DeviceTower(
                dev, bundle, specs, t, layers=p(f"{t}_layers", int), dim=dims[t],
                rows=rows[t], eps=p(f"{t}_eps", float), mha_rows=mha_rows[t],
            )  # fmt: skip
    except BaseException:
        for tower in towers.values():
            tower.close()
        raise
    layers = BundleLayers(dev, towers)

    def tower_cfg(t: str) -> TowerConfig:
        # heads are compiled into the MHA kernel (0: unknown to the host, which never needs
        # them); the MLP width is fc1's N, the bias-carrying column included
        mlp = towers[t].fc1.n
        return TowerConfig(p(f"{t}_layers", int), dims[t], 0, mlp, p(f"{t}_eps", float), "gelu")

    cfg = ClipConfig(
        vision=tower_cfg("v"), text=tower_cfg("t"), image_size=image_size,
        patch=p("patch", int), context=context, vocab_size=host.t_tok_emb.shape[0],
        embed_dim=p("embed_dim", int), eos_token_id=2 if p("eos_argmax", int) else eos,
    )  # fmt: skip
    clip_towers = ClipTowers(
        cfg, host, layers, v_stride=v_stride, t_stride=t_pad, v_batch=v_batch, t_batch=t_batch
    )
    model = ClipModel(clip_towers, tokenizer, resize_shortest=resize, mean=tuple(mean),
                      std=tuple(std))  # fmt: skip
    model.template = template
    model.bundle = bundle
    return model
