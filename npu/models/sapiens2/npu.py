"""A Sapiens2-Pose bundle replayed on a device (sim or npu) buffer for buffer and dispatch for
dispatch as taconite-sapiens2 runs it: model.rs `Model::load` (the flat buffers), `backbone`
and `head` (what the host writes and reads), npu.rs `Npu::open` / `run_gemm` / `run_mha` (the
records and the dispatches), at commits 93506d7 / 465946c (docs/bundles.md).

Only the fields taconite reads are read: `gemm <key> M K N lda c_stride rows a_elems c_elems
ctx insts`, `mha q_elems k_elems v_elems o_elems ctx insts`; heads, head dim, KV heads,
tokens and the SwiGLU width come from the params. A record whose layout (K, N, rows, lda,
c_stride) does not fit what the host writes or reads is refused, naming its manifest line; a
view shorter than its rows' span is only warned about, naming the line, since taconite runs
it (what the host writes or reads past a flat buffer fails at run time, as in taconite).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import npu.models.sapiens2.model as s2model
from npu.backends import open_device
from npu.bundle import Bundle, BundleError
from npu.device import (
    INTERLEAVE,
    Buffer,
    Device,
    DeviceError,
    Kernel,
    Launch,
    Steps,
    kernel_spec,
)
from npu.models.sapiens2 import glue, kernels
from npu.models.sapiens2.config import Config, ModelError
from npu.models.sapiens2.model import Sapiens2Pose
from npu.ops import Flat, GemmRecord, MhaRecord, run_gemm, run_mha
from npu.rows import row_pool

VERSION = 2  # format 2 leaves biases to the host; format 1 (0.4b) is read too
OWNER = "sapiens2"
log = logging.getLogger(__name__)


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
    """BundleError naming the record's manifest line unless its layout fits its HostUse; a
    warning naming it when its views are shorter than its rows' span (taconite checks only
    that the host's writes and reads fit the flat buffers, as Flat does here at run time)."""
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
    ]  # fmt: skip
    for ok, what in checks:
        if not ok:
            raise BundleError(f"{where}/{rec.where}: gemm {rec.key}: {what}")
    spans = [
        (rec.a_elems, (rec.rows - 1) * rec.lda + rec.k,
         f"a_elems={rec.a_elems} is smaller than its {rec.rows} rows at lda={rec.lda}, K={rec.k}"),
        (rec.c_elems, (rec.rows - 1) * rec.c_stride + rec.n,
         f"c_elems={rec.c_elems} is smaller than its {rec.rows} rows at c_stride="
         f"{rec.c_stride}, N={rec.n}"),
    ]  # fmt: skip
    for elems, need, what in spans:
        if elems < need:
            log.warning("%s/%s: gemm %s: %s span (%d)", where, rec.where, rec.key, what, need)


def _check_mha(rec: MhaRecord, cfg: Config, where: str) -> None:
    """A warning naming the record's line for each view shorter than the staged rows
    [T, 3D] or the output [T, D] it covers (taconite checks none: its flat buffers are sized
    from the views, and the host's writes are checked against those at run time)."""
    t, d = cfg.tokens, cfg.D
    for name, elems, need, what in (
        ("q_elems", rec.q_elems, (t - 1) * 3 * d + d, "q of the staged rows"),
        ("k_elems", rec.k_elems, (t - 1) * 3 * d + 2 * d, "k of the staged rows"),
        ("v_elems", rec.v_elems, t * 3 * d, "the staged rows"),
        ("o_elems", rec.o_elems, t * d, "the attention output"),
    ):
        if elems < need:
            log.warning(
                "%s/%s: mha: %s=%d, but %s (%d tokens x %d) span %d elements", where,
                rec.where, name, elems, what, t, 3 * d if name != "o_elems" else d, need,
            )  # fmt: skip


class Sapiens2Replay:
    """A bundle's kernels, weights and taconite's flat buffers on a device, running the
    forward as taconite-sapiens2 runs it, with the host glue of npu.models.sapiens2.glue.

    Buffers (model.rs Model::load): `a` (max a_elems of patch, gu, pred, qkv<w>, d<j>, c<j>),
    `c` (max c_elems of every gemm), `gu` (max of gu.c_elems, down.a_elems), one `qkv<w>`
    per width (its c_elems), `stage` (max of q/k/v_elems), `ao` (max of o_elems, o.a_elems);
    one buffer per weight tensor. Every argument is a view from offset 0; each GEMM runs once
    over all its rows; gu -> down and mha -> o stay on the device, each consumer started only
    once its producer has finished (they run on different hardware contexts, which the
    driver does not order: docs/device.md, "Ordering"), as taconite's launch-and-wait does.

    `slots` sets of the flat buffers (and residual streams; default the passes a device
    thread interleaves, npu.device.INTERLEAVE) let that many forwards be in flight at once
    (`heatmap_steps(crop, slot)`): the device runs one box's dispatch while the host glue of
    another runs. `flats` is slot 0's set. The head keeps no float32 copy of its
    activations: InstanceNorm + SiLU reads each GEMM's C in place (glue.instance_norm_silu_to),
    so a forward's host scratch is per-thread chunks only.
    """

    def __init__(
        self,
        device: Device,
        bundle: Bundle,
        cfg: Config,
        host: dict[str, np.ndarray],
        slots: int = INTERLEAVE,
    ) -> None:
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
        self.host = host
        self.pool = row_pool()
        self._buffers: list[Buffer] = []
        self.slots: list[dict[str, Flat]] = []
        self.flats: dict[str, Flat] = {}
        self.kernels: dict[str, Kernel] = {}
        self._free_slots = list(range(slots))
        self._x = [np.empty((cfg.tokens, cfg.D), np.float32) for _ in range(slots)]
        try:
            for _ in range(slots):
                self.slots.append(self._allocate())
            self.flats = self.slots[0]
            self.weights = {name: self._upload(bundle, name) for name in weight_tensors(cfg)}
            for key, spec in specs.items():
                self.kernels[key] = device.load(spec)
            self.kernels["mha"] = device.load(mha_spec)
        except BaseException:
            self.close()
            raise
        self._prefix = host["prefix"].reshape(cfg.prefix, cfg.D)
        patches = cfg.gh * cfg.gw
        # plain ndarray views of the bundle's memmaps: a memmap's slice costs a Python-level
        # __array_finalize__, and the staging slices them per row chunk
        self._cos = host["rope.cos"].view(np.ndarray).reshape(patches, cfg.hd)
        self._sin = host["rope.sin"].view(np.ndarray).reshape(patches, cfg.hd)

    def _allocate(self) -> dict[str, Flat]:
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
        return {name: Flat(self.device, elems, name) for name, elems in sizes.items()}

    def _upload(self, bundle: Bundle, name: str) -> Buffer:
        blob = np.asarray(bundle.view(name)).view(np.uint8)
        buf = self.device.alloc(max(blob.nbytes, 1))
        self._buffers.append(buf)
        buf.write(blob)
        self.device.to_device(buf)
        return buf

    @contextmanager
    def slot(self) -> Iterator[int]:
        """A free slot for one forward in flight, given back when the forward ends."""
        if not self._free_slots:
            raise ModelError(
                f"sapiens2: {len(self.slots)} forwards already in flight on this replay"
            )
        slot = self._free_slots.pop(0)
        try:
            yield slot
        finally:
            self._free_slots.insert(0, slot)

    def _gemm(self, flats: dict[str, Flat], key: str, weight: str) -> Launch:
        """Start GEMM `key` once over all its rows with B = tensor `weight`."""
        rec, use = self.gemms[key], self.uses[key]
        return run_gemm(self.device, self.kernels[key], rec, flats[use.a], self.weights[weight],
                        flats[use.c])  # fmt: skip

    def _c_rows(self, flats: dict[str, Flat], rec: GemmRecord, rows: int, cols: int) -> np.ndarray:
        """`c`'s first rows x cols at the record's c_stride, synced from the device: uint16."""
        bits = flats["c"].bits((rows - 1) * rec.c_stride + cols)
        return np.lib.stride_tricks.as_strided(bits, (rows, cols), (rec.c_stride * 2, 2))

    # the forward, as steps: host glue, then the launches of one device step (yielded)

    def feature_steps(self, crop: np.ndarray, slot: int | None = None) -> Steps:
        """Steps of the backbone of one crop float32 [3, H, W] in `slot` (default: a free
        one, given back at the end); returns the final-normed patch tokens float32
        [gh*gw, D] (the final norm's weight is folded into d0)."""
        if slot is None:
            with self.slot() as free:
                return (yield from self.feature_steps(crop, free))
        cfg = self.config
        x = yield from self._backbone(crop, slot)
        out = np.empty((cfg.gh * cfg.gw, cfg.D), np.float32)
        tokens = x[cfg.prefix :]

        def rows(r0: int, r1: int) -> None:
            glue.rms_into(tokens[r0:r1], cfg.eps, out[r0:r1])

        self.pool.run(len(out), glue.chunk_rows(cfg.D), rows)
        return out

    def heatmap_steps(
        self, crop: np.ndarray, slot: int | None = None, out: np.ndarray | None = None
    ) -> Steps:
        """Steps of one crop float32 [3, H, W] in `slot` (default: a free one, given back at
        the end); returns its heatmaps float32 [K, Hh, Wh] (written into `out` if given)."""
        if slot is None:
            with self.slot() as free:
                return (yield from self.heatmap_steps(crop, free, out))
        x = yield from self._backbone(crop, slot)
        return (yield from self._head_steps(x, slot, out))

    def _backbone(self, crop: np.ndarray, slot: int) -> Steps:
        cfg, pool, dev = self.config, self.pool, self.device
        flats, x = self.slots[slot], self._x[slot]
        t, d, p = cfg.tokens, cfg.D, cfg.patch
        a = flats["a"]
        n_patch = cfg.gh * cfg.gw * 3 * p * p
        patches = a.host(n_patch).reshape(cfg.gh, cfg.gw, 3, p, p)
        bits = np.ascontiguousarray(crop, np.float32).view(np.uint32)

        def patch_rows(r0: int, r1: int) -> None:
            kernels.patches_bf16(bits, p, r0, r1, patches[r0:r1])

        pool.run(cfg.gh, 1, patch_rows)
        a.written(n_patch)
        yield [self._gemm(flats, "patch", "patch")]
        x[: cfg.prefix] = self._prefix
        yield from glue.read_rows(
            pool, self._c_rows(flats, self.gemms["patch"], t - cfg.prefix, d), x[cfg.prefix :]
        )
        a_rows = a.host(t * d).reshape(t, d)
        stage = flats["stage"]
        stage_rows = stage.host(t * 3 * d).reshape(t, 3 * d)
        # each residual add and the norm after it are one pass (glue.add_put_rms); the last
        # layer's add has no norm after it here (the head's final norm reads x)
        glue.put_rms(pool, x, cfg.eps, a_rows)
        for i in range(cfg.layers):
            w = qkv_width(cfg, i)
            a.written(t * d)
            yield [self._gemm(flats, f"qkv{w}", f"{i}.qkv")]
            qkv = flats[f"qkv{w}"].bits(t * w).reshape(t, w)
            yield from glue.stage_rows(pool, qkv, stage_rows, self._stager(i))
            stage.written(t * 3 * d)
            # a consumer on another hardware context starts only once its producer has
            # finished: the driver orders runs within a context, not across (docs/device.md)
            yield [run_mha(dev, self.kernels["mha"], self.mha, stage, flats["ao"])]
            yield [self._gemm(flats, "o", f"{i}.o")]
            o_rows = self._c_rows(flats, self.gemms["o"], t, d)
            glue.add_put_rms(pool, x, o_rows, None, cfg.eps, a_rows)
            a.written(t * d)
            yield [self._gemm(flats, "gu", f"{i}.gu")]
            yield [self._gemm(flats, "down", f"{i}.down")]
            down_rows = self._c_rows(flats, self.gemms["down"], t, d)
            bias = self.host.get(f"{i}.down.bias")
            if i + 1 < cfg.layers:
                glue.add_put_rms(pool, x, down_rows, bias, cfg.eps, a_rows)
            else:
                glue.add_rows(pool, x, down_rows)
                if bias is not None:
                    x += bias
        return x

    def _stager(self, i: int) -> Callable[[np.ndarray, int, int, np.ndarray], np.ndarray]:
        """Layer i's staging of qkv rows [r0, r1) (model.stage_attention, looked up at each
        call), with the RoPE table rows of the patch tokens among them."""
        cfg, pre = self.config, self.config.prefix
        kv, qn, kn = cfg.kv_heads[i], self.host[f"{i}.q_norm"], self.host[f"{i}.k_norm"]

        def stage(qkv: np.ndarray, r0: int, r1: int, out: np.ndarray) -> np.ndarray:
            lo = max(r0, pre)
            cos, sin = self._cos[lo - pre : r1 - pre], self._sin[lo - pre : r1 - pre]
            return s2model.stage_attention(qkv, cfg, kv, qn, kn, cos, sin, lo - r0, out)

        return stage

    def _head_steps(self, x: np.ndarray, slot: int, out: np.ndarray | None) -> Steps:
        cfg, pool = self.config, self.pool
        flats = self.slots[slot]
        a = flats["a"].host()
        h0, w0, cin = cfg.gh, cfg.gw, cfg.D
        pairs = glue.pairs_view(a, h0, w0, cin)
        glue.zero_pair_pads(pairs)
        glue.rms_rows_to(pool, x[cfg.prefix :], cfg.eps, w0, glue.pair_writer(pairs))
        flats["a"].written(pairs.size)
        for j, co in enumerate(cfg.up):
            rec = self.gemms[f"d{j}"]
            yield [self._gemm(flats, f"d{j}", f"d{j}")]
            rows = min(rec.rows, (h0 + 1) * (w0 + 2))
            c = flats["c"].bits((rows - 1) * rec.n + rec.n)
            offs, boffs = glue.deconv_rows(h0, w0, rec.n, co)
            bias = self.host.get(f"d{j}.bias")
            h0, w0, cin = 2 * h0, 2 * w0, co
            if j + 1 < len(cfg.up):
                pairs = glue.pairs_view(a, h0, w0, cin)
                glue.zero_pair_pads(pairs)
                write, written = glue.pair_writer(pairs), pairs.size
            else:
                write, written = glue.dense_writer(a, cin), h0 * w0 * cin
            yield from glue.instance_norm_silu_to(pool, c, offs, bias, boffs, co, cfg.in_eps, w0,
                                                  write)  # fmt: skip
            flats["a"].written(written)
        px = h0 * w0
        for j, co in enumerate(cfg.convs):
            rec = self.gemms[f"c{j}"]
            yield [self._gemm(flats, f"c{j}", f"c{j}")]
            c = flats["c"].bits((px - 1) * rec.c_stride + co)
            offs = glue.conv_rows(px, rec.c_stride)
            yield from glue.instance_norm_silu_to(pool, c, offs, None, None, co, cfg.in_eps, 1,
                                                  glue.dense_writer(a, co))  # fmt: skip
            flats["a"].written(px * co)
        rec = self.gemms["pred"]
        yield [self._gemm(flats, "pred", "pred")]
        c = flats["c"].bits((px - 1) * rec.c_stride + cfg.K)
        out = np.empty((cfg.K, h0, w0), np.float32) if out is None else out
        yield from glue.heatmaps_into(pool, c, px, rec.c_stride, out.reshape(cfg.K, px))
        return out

    def close(self) -> None:
        """Free the kernels and buffers (the device stays open)."""
        for kernel in self.kernels.values():
            self.device.free_kernel(kernel)
        for flats in self.slots:
            for flat in flats.values():
                flat.free()
        for buf in self._buffers:
            self.device.free(buf)
        self.kernels, self.flats, self.slots, self._buffers = {}, {}, [], []


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
    return Sapiens2Pose(cfg, Sapiens2Replay(dev, bundle, cfg, host), host)
