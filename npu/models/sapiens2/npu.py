"""A Sapiens2-Pose bundle replayed on a device (sim or npu) buffer for buffer and dispatch for
dispatch as taconite-sapiens2 runs it: model.rs `Model::load` (the flat buffers), `backbone`
and `head` (what the host writes and reads), npu.rs `Npu::open` / `run_gemm` / `run_mha` (the
records and the dispatches), at commits 93506d7 / 465946c (docs/bundles.md).

Only the fields taconite reads are read: `gemm <key> M K N lda c_stride rows a_elems c_elems
ctx insts`, `mha q_elems k_elems v_elems o_elems ctx insts`; heads, head dim, KV heads,
tokens and the SwiGLU width come from the params. The record's view sizes are the truth: each
is checked to cover what its rows need and what the host writes or reads, and an error names
the manifest line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from npu.bf16 import bf16_to_f32, f32_to_bf16
from npu.bundle import Bundle, BundleError
from npu.device import Buffer, Device, DeviceError, Kernel, kernel_spec, open_device
from npu.models.sapiens2.config import Config, ModelError
from npu.models.sapiens2.model import Sapiens2Pose, Stager, deconv_pairs
from npu.ops import Flat, GemmRecord, MhaRecord, run_gemm, run_mha

VERSION = 2  # format 2 leaves biases to the host; format 1 (0.4b) is read too
OWNER = "sapiens2"


def qkv_width(cfg: Config, i: int) -> int:
    """Layer i's qkv GEMM width (heads + 2·kv_heads[i])·hd: its record is `qkv<width>`."""
    return (cfg.heads + 2 * cfg.kv_heads[i]) * cfg.hd


def gemm_keys(cfg: Config) -> list[str]:
    """The gemm records the replay runs, in taconite's lookup order (model.rs Model::load)."""
    widths = sorted({qkv_width(cfg, i) for i in range(cfg.layers)})
    return [
        "patch", *(f"qkv{w}" for w in widths), "o", "gu", "down",
        *(f"d{j}" for j in range(len(cfg.up))), *(f"c{j}" for j in range(len(cfg.convs))),
        "pred",
    ]  # fmt: skip


@dataclass(frozen=True)
class HostUse:
    """What the host (or the kernel before it) writes into a GEMM's A and reads from its C,
    which the record must fit (model.rs `backbone` / `head`).

    a, c: the flat buffers the A and C views are cut from. lda: the row stride A is written
    at (None: set by the chain, checked separately). k, rows, n: at least this K, these rows,
    this N. c_stride: the row stride the host reads C at (None: the record's own, or C is
    chained on the device).
    """

    a: str
    lda: int | None
    k: int
    rows: int
    c: str
    c_stride: int | None
    n: int


def host_uses(cfg: Config) -> dict[str, HostUse]:
    """Each gemm record key's HostUse (docs/bundles.md, the Sapiens2 record table)."""
    d, t, p2 = cfg.D, cfg.tokens, 3 * cfg.patch**2
    uses = {"patch": HostUse("a", p2, p2, cfg.gh * cfg.gw, "c", d, d)}
    for w in {qkv_width(cfg, i) for i in range(cfg.layers)}:
        uses[f"qkv{w}"] = HostUse("a", d, d, t, f"qkv{w}", w, w)
    uses["o"] = HostUse("ao", d, d, t, "c", d, d)
    uses["gu"] = HostUse("a", d, d, t, "gu", None, cfg.I)
    uses["down"] = HostUse("gu", None, cfg.I, t, "c", d, d)
    cin, h0, w0 = d, cfg.gh, cfg.gw
    for j, co in enumerate(cfg.up):
        # the scatter reads windows up to row h0·(w0+2) + w0; C is read at row stride N
        uses[f"d{j}"] = HostUse("a", 2 * cin, 4 * cin, h0 * (w0 + 2) + w0 + 1, "c", None, 4 * co)
        cin, h0, w0 = co, 2 * h0, 2 * w0
    for j, co in enumerate(cfg.convs):
        uses[f"c{j}"] = HostUse("a", cin, cin, h0 * w0, "c", None, co)
        cin = co
    uses["pred"] = HostUse("a", cin, cin, h0 * w0, "c", None, cfg.K)
    return uses


def _is_deconv(key: str) -> bool:
    return key[0] == "d" and key[1:].isdigit()


def _check_gemm(rec: GemmRecord, use: HostUse, where: str) -> None:
    """BundleError naming the record's manifest line unless it fits its HostUse."""
    checks = [
        (use.lda is None or rec.lda == use.lda, f"lda={rec.lda}, but A is written at row "
                                                f"stride {use.lda}"),
        (rec.k >= use.k, f"K={rec.k}, the host's A rows hold {use.k} values"),
        (rec.rows >= use.rows, f"rows={rec.rows}, the host needs {use.rows}"),
        (rec.n >= use.n, f"N={rec.n}, the host reads {use.n} columns"),
        (rec.c_stride >= rec.n, f"c_stride={rec.c_stride} < N={rec.n}: C rows would overlap"),
        (use.c_stride is None or rec.c_stride == use.c_stride,
         f"c_stride={rec.c_stride}, but the host reads C at row stride {use.c_stride}"),
        (not _is_deconv(rec.key) or rec.c_stride == rec.n,
         f"c_stride={rec.c_stride} != N={rec.n}: taconite reads a deconv's C at row stride N"),
        (rec.a_elems >= (rec.rows - 1) * rec.lda + rec.k,
         f"a_elems={rec.a_elems} is smaller than its {rec.rows} rows at lda={rec.lda}, "
         f"K={rec.k} span ({(rec.rows - 1) * rec.lda + rec.k})"),
        (rec.c_elems >= (rec.rows - 1) * rec.c_stride + rec.n,
         f"c_elems={rec.c_elems} is smaller than its {rec.rows} rows at c_stride="
         f"{rec.c_stride}, N={rec.n} span ({(rec.rows - 1) * rec.c_stride + rec.n})"),
    ]  # fmt: skip
    for ok, what in checks:
        if not ok:
            raise BundleError(f"{where}/{rec.where}: gemm {rec.key}: {what}")


def _check_mha(rec: MhaRecord, cfg: Config, where: str) -> None:
    """The staged rows [T, 3D] and the output [T, D] must fit the record's views."""
    t, d = cfg.tokens, cfg.D
    for name, elems, need, what in (
        ("q_elems", rec.q_elems, (t - 1) * 3 * d + d, "q of the staged rows"),
        ("k_elems", rec.k_elems, (t - 1) * 3 * d + 2 * d, "k of the staged rows"),
        ("v_elems", rec.v_elems, t * 3 * d, "the staged rows"),
        ("o_elems", rec.o_elems, t * d, "the attention output"),
    ):
        if elems < need:
            raise BundleError(
                f"{where}/{rec.where}: mha: {name}={elems}, but {what} ({t} tokens x "
                f"{3 * d if name != 'o_elems' else d}) span {need} elements"
            )


class Sapiens2Replay:
    """A bundle's kernels, weights and taconite's flat buffers on a device: the Sapiens2Ops
    steps of npu.models.sapiens2.model, run as taconite-sapiens2 runs them.

    Buffers (model.rs Model::load): `a` (max a_elems of patch, gu, pred, qkv<w>, d<j>, c<j>),
    `c` (max c_elems of every gemm), `gu` (max of gu.c_elems, down.a_elems), one `qkv<w>`
    per width (its c_elems), `stage` (max of q/k/v_elems), `ao` (max of o_elems, o.a_elems);
    one buffer per weight tensor. Every argument is a view from offset 0; each GEMM runs once
    over all its rows; gu -> down and mha -> o stay on the device.
    """

    def __init__(self, device: Device, bundle: Bundle, cfg: Config) -> None:
        self.device, self.config, self.backend = device, cfg, device.backend
        where = str(bundle.root)
        records = {r.fields[0]: r for r in bundle.tagged("gemm") if r.fields}
        mha_records = list(bundle.tagged("mha"))
        if not mha_records:
            raise BundleError(f"{where}/manifest.txt: no mha record")
        specs = {}
        for key in gemm_keys(cfg):
            if key not in records:
                raise BundleError(f"{where}/manifest.txt: no gemm record {key} (no GEMM {key})")
            specs[key] = kernel_spec(bundle, records[key], owner=OWNER)
        # taconite keys the attention "mha" whatever the record's first field; the last wins
        mha_spec = kernel_spec(bundle, mha_records[-1], owner=OWNER)
        try:
            self.gemms = {key: GemmRecord.of(spec) for key, spec in specs.items()}
            self.mha = MhaRecord.of(mha_spec)
        except DeviceError as exc:
            raise BundleError(f"{where}/{exc}") from None
        self.uses = host_uses(cfg)
        for key, rec in self.gemms.items():
            _check_gemm(rec, self.uses[key], where)
        gu, down = self.gemms["gu"], self.gemms["down"]
        if down.lda != gu.c_stride:
            raise BundleError(
                f"{where}/{down.where}: gemm down: lda={down.lda}, but gu writes its C (down's "
                f"A) at c_stride={gu.c_stride} ({gu.where})"
            )
        _check_mha(self.mha, cfg, where)
        self._buffers: list[Buffer] = []
        self.flats: dict[str, Flat] = {}
        self.kernels: dict[str, Kernel] = {}
        try:
            self._allocate(cfg)
            self.weights = {name: self._upload(bundle, name) for name in weight_tensors(cfg)}
            for key, spec in specs.items():
                self.kernels[key] = device.load(spec)
            self.kernels["mha"] = device.load(mha_spec)
        except BaseException:
            self.close()
            raise

    def _allocate(self, cfg: Config) -> None:
        g = self.gemms
        a_keys = [k for k in g if k not in ("o", "down")]
        sizes = {
            "a": max(g[k].a_elems for k in a_keys),
            "c": max(r.c_elems for r in g.values()),
            "gu": max(g["gu"].c_elems, g["down"].a_elems),
            **{k: g[k].c_elems for k in g if k.startswith("qkv")},
            "stage": max(self.mha.q_elems, self.mha.k_elems, self.mha.v_elems),
            "ao": max(self.mha.o_elems, g["o"].a_elems),
        }
        for name, elems in sizes.items():
            self.flats[name] = Flat(self.device, elems, name)

    def _upload(self, bundle: Bundle, name: str) -> Buffer:
        blob = np.asarray(bundle.view(name)).view(np.uint8)
        buf = self.device.alloc(max(blob.nbytes, 1))
        self._buffers.append(buf)
        buf.write(blob)
        self.device.to_device(buf)
        return buf

    def _gemm(self, key: str, weight: str) -> GemmRecord:
        """Dispatch GEMM `key` once over all its rows with B = tensor `weight`."""
        rec, use = self.gemms[key], self.uses[key]
        run_gemm(self.device, self.kernels[key], rec, self.flats[use.a], self.weights[weight],
                 self.flats[use.c])  # fmt: skip
        return rec

    def _read_rows(self, rec: GemmRecord, rows: int, cols: int) -> np.ndarray:
        """float32 [rows, cols] of `c` read at the record's c_stride (synced from the device)."""
        n = (rows - 1) * rec.c_stride + cols
        bits = self.flats["c"].bits(n)
        view = np.lib.stride_tricks.as_strided(bits, (rows, cols), (rec.c_stride * 2, 2))
        return bf16_to_f32(view)

    # the Sapiens2Ops steps

    def patch(self, a: np.ndarray) -> np.ndarray:
        self.flats["a"].put(f32_to_bf16(a))
        return self._read_rows(self._gemm("patch", "patch"), len(a), self.config.D)

    def attention(self, i: int, a: np.ndarray, stage: Stager) -> np.ndarray:
        cfg = self.config
        t, w = len(a), qkv_width(cfg, i)
        self.flats["a"].put(f32_to_bf16(a))
        self._gemm(f"qkv{w}", f"{i}.qkv")
        qkv = bf16_to_f32(self.flats[f"qkv{w}"].bits(t * w)).reshape(t, w)
        self.flats["stage"].put(f32_to_bf16(stage(qkv)))
        run_mha(self.device, self.kernels["mha"], self.mha, self.flats["stage"], self.flats["ao"])
        return self._read_rows(self._gemm("o", f"{i}.o"), t, cfg.D)

    def mlp(self, i: int, a: np.ndarray) -> np.ndarray:
        self.flats["a"].put(f32_to_bf16(a))
        self._gemm("gu", f"{i}.gu")
        return self._read_rows(self._gemm("down", f"{i}.down"), len(a), self.config.D)

    def deconv(self, j: int, x: np.ndarray) -> np.ndarray:
        h0, w0 = x.shape[:2]
        self.flats["a"].put(f32_to_bf16(deconv_pairs(x)))
        rec = self._gemm(f"d{j}", f"d{j}")
        windows = (h0 + 1) * (w0 + 2)
        rows = min(rec.rows, windows)
        out = np.zeros((windows, rec.n), np.float32)
        out[:rows] = self._read_rows(rec, rows, rec.n)
        return out

    def conv(self, j: int, y: np.ndarray) -> np.ndarray:
        self.flats["a"].put(f32_to_bf16(y))
        return self._read_rows(self._gemm(f"c{j}", f"c{j}"), len(y), self.config.convs[j])

    def pred(self, y: np.ndarray) -> np.ndarray:
        self.flats["a"].put(f32_to_bf16(y))
        return self._read_rows(self._gemm("pred", "pred"), len(y), self.config.K)

    def close(self) -> None:
        """Free the kernels and buffers (the device stays open)."""
        for kernel in self.kernels.values():
            self.device.free_kernel(kernel)
        for flat in self.flats.values():
            flat.free()
        for buf in self._buffers:
            self.device.free(buf)
        self.kernels, self.flats, self._buffers = {}, {}, []


def weight_tensors(cfg: Config) -> list[str]:
    """The packed weight tensors (uploaded as raw bytes, any dtype; model.rs Model::load)."""
    names = ["patch"]
    for i in range(cfg.layers):
        names += [f"{i}.qkv", f"{i}.o", f"{i}.gu", f"{i}.down"]
    names += [f"d{j}" for j in range(len(cfg.up))] + [f"c{j}" for j in range(len(cfg.convs))]
    return [*names, "pred"]


def host_tensors(bundle: Bundle, cfg: Config) -> dict[str, np.ndarray]:
    """The f32 host tensors, sizes checked: prefix, {i}.q_norm / k_norm, rope.cos / sin, and
    the optional host biases {i}.down.bias [D] and d{j}.bias [4·up[j]] (taconite's
    `opt_f32s`: read whenever present, in any format version)."""
    patches = cfg.gh * cfg.gw
    sizes = {"prefix": cfg.prefix * cfg.D, "rope.cos": patches * cfg.hd,
             "rope.sin": patches * cfg.hd}  # fmt: skip
    for i in range(cfg.layers):
        sizes[f"{i}.q_norm"] = sizes[f"{i}.k_norm"] = cfg.hd
    optional = {f"{i}.down.bias": cfg.D for i in range(cfg.layers)}
    optional.update({f"d{j}.bias": 4 * c for j, c in enumerate(cfg.up)})
    sizes.update({name: n for name, n in optional.items() if bundle.has(name)})
    host = {}
    for name, elems in sizes.items():
        bundle.expect(name, "f32", elems)
        host[name] = bundle.f32(name).reshape(-1)
    return host


def from_bundle(path: str | Path, device: Any) -> Sapiens2Pose:
    """A bundle (format 1 or 2) on a device: an npu.sim.SimDevice or npu.xrt.XrtDevice, or the
    backend name "sim" / "npu" to open one."""
    path = Path(path)
    bundle = Bundle.open(path)
    where = f"{path}/manifest.txt"
    if bundle.version not in (1, VERSION):
        raise BundleError(
            f"{where}: version {bundle.version}, this runtime reads version {VERSION}; "
            "re-export the bundle"
        )
    cfg = Config.from_params(bundle.manifest.params, where=where)
    dev = open_device(device)
    if dev is None:
        raise ModelError(f"{path}: a bundle runs on a device (backend sim or npu), not cpu")
    host = host_tensors(bundle, cfg)
    for name in weight_tensors(cfg):
        bundle.entry(name)
    return Sapiens2Pose(cfg, Sapiens2Replay(dev, bundle, cfg), host)
