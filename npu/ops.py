"""The op interface model forwards call: gemm and mha by key, with weights bound at load.

A forward is written once against these ops; `NumpyOps` runs them in float32 numpy (the cpu
backend, from HF checkpoints), and the device ops (xrt or sim) replay a bundle's kernels.
Every ops object names its backend so results can say which one produced them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from npu.bf16 import bf16_to_f32, f32_to_bf16
from npu.device import Buffer, Device, Kernel, KernelSpec, Launch, kernel_key, kernel_spec
from pipeline.errors import NpucamError

EPILOGUES = ("none", "silu", "gelu", "swiglu")
LOG2E = 1.4426950408889634
T = TypeVar("T")


class OpsError(NpucamError):
    """An op was called with a key or shape it was not bound for."""


@dataclass(frozen=True)
class GemmWeights:
    """One GEMM's weights. w: float32 [K, N]; bias: float32 [N] or None.

    epilogue: "silu" / "gelu" (exact erf) apply elementwise; "swiglu" splits the N columns
    into halves g | u and returns silu(g) * u ([rows, N/2]), as Sapiens2's fused gu GEMM.
    """

    w: np.ndarray
    bias: np.ndarray | None = None
    epilogue: str = "none"

    def __post_init__(self) -> None:
        if self.epilogue not in EPILOGUES:
            raise OpsError(f"unknown epilogue {self.epilogue!r}, expected one of {EPILOGUES}")
        if self.w.ndim != 2:
            raise OpsError(f"gemm weights must be [K, N], got shape {self.w.shape}")
        if self.bias is not None and self.bias.shape != (self.w.shape[1],):
            raise OpsError(f"bias shape {self.bias.shape} does not match N={self.w.shape[1]}")


class Ops(Protocol):
    """What a model forward needs from a backend."""

    backend: str

    def gemm(self, key: str, a: np.ndarray) -> np.ndarray:
        """a: float32 [rows, K] -> float32 [rows, N] (or N/2 for swiglu) of GEMM `key`."""
        ...

    def mha(
        self,
        key: str,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        *,
        scale: float,
        causal: bool = False,
    ) -> np.ndarray:
        """q, k, v: float32 [heads, S, d] -> float32 [heads, S, d] = softmax(scale·q·kᵀ)·v."""
        ...


def silu(x: np.ndarray) -> np.ndarray:
    """x·sigmoid(x), float32, without overflow warnings for large |x|."""
    return x * (0.5 * (1.0 + np.tanh(0.5 * x)))


def erf(x: np.ndarray) -> np.ndarray:
    """Vectorised erf (Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7), computed in float64."""
    z = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    return np.sign(x) * (1.0 - poly * np.exp(-z * z))


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU, as HF's `gelu` activation; float32 in, float32 out."""
    return (0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))).astype(np.float32)


def gemm_epilogue(c: np.ndarray, bias: np.ndarray | None, epilogue: str) -> np.ndarray:
    """epilogue(c + bias) of a GEMM's float32 [rows, N] product (the bias is added in place).

    Returns float32 [rows, N], or [rows, N/2] for swiglu: silu(g) * u of the halves g | u.
    """
    if bias is not None:
        c += bias
    if epilogue == "silu":
        return silu(c)
    if epilogue == "gelu":
        return gelu(c)
    if epilogue == "swiglu":
        half = c.shape[1] // 2
        return silu(c[:, :half]) * c[:, half:]
    return c


def _bound(table: Mapping[str, T], op: str, key: str, backend: str) -> T:
    """What op `key` was bound to; OpsError if it was not bound on this backend."""
    try:
        return table[key]
    except KeyError:
        raise OpsError(f"{op} {key!r} is not bound on the {backend} backend") from None


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, causal: bool = False
) -> np.ndarray:
    """Reference softmax attention in float32. q, k, v: [heads, S, d] -> [heads, S, d]."""
    s = np.matmul(q, k.transpose(0, 2, 1)) * np.float32(scale)
    if causal:
        n = s.shape[-1]
        s = np.where(np.tril(np.ones((s.shape[-2], n), dtype=bool)), s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return np.matmul(p, v).astype(np.float32)


class NumpyOps:
    """The cpu backend: float32 numpy GEMMs and attention over weights bound by key."""

    backend = "cpu"

    def __init__(self, gemms: dict[str, GemmWeights]) -> None:
        self._gemms = dict(gemms)

    def gemm(self, key: str, a: np.ndarray) -> np.ndarray:
        gw = _bound(self._gemms, "gemm", key, self.backend)
        if a.ndim != 2 or a.shape[1] != gw.w.shape[0]:
            raise OpsError(f"gemm {key!r}: A is {a.shape}, wanted [rows, {gw.w.shape[0]}]")
        c = gemm_epilogue(np.matmul(a.astype(np.float32, copy=False), gw.w), gw.bias, gw.epilogue)
        return c.astype(np.float32, copy=False)

    def mha(
        self,
        key: str,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        *,
        scale: float,
        causal: bool = False,
    ) -> np.ndarray:
        if q.ndim != 3 or k.shape != v.shape or q.shape[0] != k.shape[0]:
            raise OpsError(f"mha {key!r}: q {q.shape}, k {k.shape}, v {v.shape}")
        return attention(q, k, v, scale, causal)


# -- the device backend (npu or sim) ------------------------------------------------------


@dataclass(frozen=True)
class DeviceGemm:
    """A GEMM kernel and its B as the bundle stores it.

    b: uint8 bytes, bfp16ebs8-packed [K, N] in the record's tile order, followed by bias bf16
    [N] when the record says bias=1 (docs/device.md); uploaded once.
    """

    spec: KernelSpec
    b: np.ndarray


def _mha_dims(spec: KernelSpec) -> tuple[int, int, int, int, int]:
    """(heads, kv_heads, d, seq, seq_pad) of an mha record (docs/device.md §3)."""
    heads, d = spec.get_int("heads"), spec.get_int("d")
    kv = spec.get_int("kv_heads", heads)
    seq = spec.get_int("seq")
    return heads, kv, d, seq, spec.get_int("seq_pad", seq)


def _gemm_strides(spec: KernelSpec) -> tuple[int, int, int]:
    """(lda, c_stride, N') of a gemm record: A's and C's row strides in elements (defaults K
    and N') and the columns of C per row (N, or N/2 after a swiglu epilogue)."""
    k = spec.get_int("K")
    n_out = spec.get_int("N") // (2 if spec.get_str("epilogue", "none") == "swiglu" else 1)
    return spec.get_int("lda", k), spec.get_int("c_stride", n_out), n_out


@dataclass
class _RowBuffers:
    """A GEMM's padded A / C roots and the M-row chunk sub-buffers cut from them."""

    rows: int
    a: Buffer
    c: Buffer
    chunks: list[tuple[Buffer, Buffer]]


class DeviceOps:
    """The op interface on a device (npu.xrt.XrtDevice or npu.sim.SimDevice).

    gemm(key, a) rounds A to bf16, pads the rows to a multiple of the kernel's M, runs the
    kernel once per M-row chunk over sub-buffers of one A and one C buffer, and returns the
    bf16 C as float32 (read at the record's c_stride, cut to N'). mha(key, q, k, v)
    writes bf16 Q/K/V padded to the record's seq_pad and returns the bf16 O as float32
    [heads, S, d]. backend is the device's ("npu" or "sim").
    Ops bound to the same record (e.g. every layer's qkv) share one loaded kernel and one
    set of A / C buffers; each has its own B.
    """

    def __init__(
        self,
        device: Device,
        gemms: Mapping[str, DeviceGemm] | None = None,
        mhas: Mapping[str, KernelSpec] | None = None,
    ) -> None:
        self.device = device
        self.backend = device.backend
        self._kernels: dict[tuple[str, str, str], Kernel] = {}
        self._gemms: dict[str, tuple[Kernel, Buffer, KernelSpec]] = {}
        self._rows: dict[int, _RowBuffers] = {}
        self._mhas: dict[str, tuple[Kernel, list[Buffer], KernelSpec]] = {}
        for key, g in (gemms or {}).items():
            self._bind_gemm(key, g)
        for key, spec in (mhas or {}).items():
            self._bind_mha(key, spec)

    @classmethod
    def from_bundle(
        cls,
        device: Device,
        bundle: Any,
        gemms: Mapping[str, tuple[str, str]] | None = None,
        mhas: Mapping[str, str] | None = None,
    ) -> DeviceOps:
        """Bind GEMMs {op key: (record key, B tensor name)} and MHAs {op key: record key} of
        a bundle (npu.bundle.Bundle); records are found by their first field (or tag)."""
        records = {kernel_key(r): r for r in bundle.records}
        specs: dict[str, KernelSpec] = {}

        def spec(key: str) -> KernelSpec:
            if key not in records:
                raise OpsError(f"{bundle.root}/manifest.txt: no kernel record {key}")
            if key not in specs:
                specs[key] = kernel_spec(bundle, records[key])
            return specs[key]

        return cls(
            device,
            gemms={
                k: DeviceGemm(spec(r), np.asarray(bundle.view(t, "u8")))
                for k, (r, t) in (gemms or {}).items()
            },
            mhas={k: spec(r) for k, r in (mhas or {}).items()},
        )

    def _kernel(self, spec: KernelSpec) -> Kernel:
        ident = (spec.key, spec.source, spec.context_key)
        if ident not in self._kernels:
            self._kernels[ident] = self.device.load(spec)
        return self._kernels[ident]

    def _bind_gemm(self, key: str, g: DeviceGemm) -> None:
        spec = g.spec
        lda, c_stride, n_out = _gemm_strides(spec)
        if spec.get_int("rows", spec.get_int("M")) != spec.get_int("M"):
            raise OpsError(
                f"{spec.where()}: rows={spec.fields['rows']}; DeviceOps runs M-row chunks "
                "(a record of taconite-sapiens2's one-dispatch form runs on its own replay)"
            )
        if lda <= 0 or c_stride < n_out:
            raise OpsError(
                f"{spec.where()}: lda={lda}, c_stride={c_stride}; need lda > 0 and "
                f"c_stride >= N'={n_out}"
            )
        b = np.ascontiguousarray(g.b).reshape(-1).view(np.uint8)
        kernel = self._kernel(spec)
        buf = self.device.alloc(b.nbytes)
        buf.write(b)
        self.device.to_device(buf)
        self._gemms[key] = (kernel, buf, spec)

    def _bind_mha(self, key: str, spec: KernelSpec) -> None:
        heads, kv, d, _, seq_pad = _mha_dims(spec)
        kernel = self._kernel(spec)
        sizes = [heads, kv, kv, heads]
        bufs = [self.device.alloc(h * seq_pad * d * 2) for h in sizes]
        self._mhas[key] = (kernel, bufs, spec)

    def _row_buffers(self, kernel: Kernel, spec: KernelSpec, rows: int) -> _RowBuffers:
        m, k = spec.get_int("M"), spec.get_int("K")
        lda, c_stride, n_out = _gemm_strides(spec)
        padded = -(-rows // m) * m
        have = self._rows.get(id(kernel))
        if have is not None and have.rows >= padded:
            return have
        if have is not None:
            self.device.free(have.a)
            self.device.free(have.c)
        a = self.device.alloc(((padded - 1) * lda + k) * 2)
        c = self.device.alloc(padded * c_stride * 2)
        chunks = [
            (
                self.device.sub(a, i * m * lda * 2, ((m - 1) * lda + k) * 2),
                self.device.sub(c, i * m * c_stride * 2, ((m - 1) * c_stride + n_out) * 2),
            )
            for i in range(padded // m)
        ]
        self._rows[id(kernel)] = _RowBuffers(padded, a, c, chunks)
        return self._rows[id(kernel)]

    def _run_rows(
        self, kernel: Kernel, b_buf: Buffer, spec: KernelSpec, rb: _RowBuffers, rows: int
    ) -> np.ndarray:
        """Sync A, run the M-row chunks covering `rows`, return C float32 [rows, N']."""
        _, c_stride, n_out = _gemm_strides(spec)
        n_chunks = -(-rows // spec.get_int("M"))
        for a_sub, _ in rb.chunks[:n_chunks]:
            self.device.to_device(a_sub)
        for a_sub, c_sub in rb.chunks[:n_chunks]:
            self.device.run(kernel, [a_sub, b_buf, c_sub])
        for _, c_sub in rb.chunks[:n_chunks]:
            self.device.from_device(c_sub)
        return bf16_to_f32(rb.c.array(np.uint16, (rb.rows, c_stride))[:rows, :n_out])

    def gemm(self, key: str, a: np.ndarray) -> np.ndarray:
        kernel, b_buf, spec = _bound(self._gemms, "gemm", key, self.backend)
        m, k = spec.get_int("M"), spec.get_int("K")
        lda = _gemm_strides(spec)[0]
        if lda != k:
            raise OpsError(f"gemm {key!r}: {spec.where()} has lda={lda} != K")
        if a.ndim != 2 or a.shape[1] != k or a.shape[0] == 0:
            raise OpsError(f"gemm {key!r}: A is {a.shape}, wanted [rows, {k}]")
        rows = a.shape[0]
        rb = self._row_buffers(kernel, spec, rows)
        a_host = rb.a.array(np.uint16, (rb.rows, k))
        a_host[:rows] = f32_to_bf16(a)
        a_host[rows : -(-rows // m) * m] = 0
        return self._run_rows(kernel, b_buf, spec, rb, rows)

    def mha(
        self,
        key: str,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        *,
        scale: float,
        causal: bool = False,
    ) -> np.ndarray:
        kernel, bufs, spec = _bound(self._mhas, "mha", key, self.backend)
        heads, kv, d, seq, seq_pad = _mha_dims(spec)
        s = q.shape[1] if q.ndim == 3 else -1
        if q.shape != (heads, s, d) or k.shape != (kv, s, d) or v.shape != k.shape:
            raise OpsError(
                f"mha {key!r}: q {q.shape}, k {k.shape}, v {v.shape}; the kernel takes "
                f"q [{heads}, S, {d}] and k, v [{kv}, S, {d}]"
            )
        if s != seq and not ("seq_word" in spec.fields and 0 < s <= seq_pad):
            raise OpsError(f"mha {key!r}: S={s}, the kernel was compiled for seq={seq}")
        if causal != spec.get_flag("causal"):
            raise OpsError(f"mha {key!r}: causal={causal}, the kernel has causal={int(not causal)}")
        qscale = spec.get_str("qscale", "host")
        if qscale == "host":
            q = q * np.float32(scale * LOG2E)
        elif not np.isclose(scale, float(qscale), rtol=1e-6, atol=0.0):
            raise OpsError(f"mha {key!r}: scale={scale}, the kernel applies qscale={qscale}")
        if "seq_word" in spec.fields:
            kernel.set_insts_words([(spec.get_int("seq_word"), s)])
        token_major = spec.get_flag("token_major")
        for buf, x, h in zip(bufs[:3], (q, k, v), (heads, kv, kv), strict=True):
            padded = np.zeros((h, seq_pad, d), np.uint16)
            padded[:, :s] = f32_to_bf16(x)
            if token_major:
                padded = padded.transpose(1, 0, 2)
            buf.write(padded)
            self.device.to_device(buf)
        self.device.run(kernel, bufs)
        self.device.from_device(bufs[3])
        o = bufs[3].array(np.uint16)
        o = (
            o.reshape(seq_pad, heads, d).transpose(1, 0, 2)
            if token_major
            else o.reshape(heads, seq_pad, d)
        )
        return bf16_to_f32(o[:, :s])

    def close(self) -> None:
        """Free this ops object's kernels and buffers (the device stays open)."""
        for _, buf, _ in self._gemms.values():
            self.device.free(buf)
        for rb in self._rows.values():
            self.device.free(rb.a)
            self.device.free(rb.c)
        for _, bufs, _ in self._mhas.values():
            for buf in bufs:
                self.device.free(buf)
        for kernel in self._kernels.values():
            self.device.free_kernel(kernel)
        self._kernels, self._gemms, self._rows, self._mhas = {}, {}, {}, {}


# -- taconite-sapiens2's device buffers and dispatches (npu.rs Flat, GemmSpec, run_gemm) ---

GEMM_RECORD_FIELDS = ("M", "K", "N", "lda", "c_stride", "rows", "a_elems", "c_elems")
MHA_RECORD_FIELDS = ("q_elems", "k_elems", "v_elems", "o_elems")


@dataclass(frozen=True)
class GemmRecord:
    """A taconite-sapiens2 `gemm` record: exactly the fields npu.rs `GemmSpec` reads, all
    required (plus `ctx=` and `insts=`, which KernelSpec holds). One dispatch runs `rows`
    rows: A a view of a_elems elements (rows at stride lda), C one of c_elems (stride
    c_stride); M is the compiled tile height, read and otherwise unused, as in taconite."""

    key: str
    m: int
    k: int
    n: int
    lda: int
    c_stride: int
    rows: int
    a_elems: int
    c_elems: int
    where: str

    @classmethod
    def of(cls, spec: KernelSpec) -> GemmRecord:
        return cls(spec.key, *(spec.get_int(f) for f in GEMM_RECORD_FIELDS), spec.where())


@dataclass(frozen=True)
class MhaRecord:
    """A taconite-sapiens2 `mha` record: the q, k, v and o view sizes (elements), nothing
    else; the attention's geometry is compiled into its instruction stream."""

    q_elems: int
    k_elems: int
    v_elems: int
    o_elems: int
    where: str

    @classmethod
    def of(cls, spec: KernelSpec) -> MhaRecord:
        return cls(*(spec.get_int(f) for f in MHA_RECORD_FIELDS), spec.where())


class Flat:
    """A flat bf16 device buffer, as taconite-sapiens2's npu.rs `Flat`: one root of `elems`
    bf16 values, zeroed and synced when allocated and never re-zeroed (later uses see what
    earlier ones left past what they write). Every kernel argument is a view of it from
    offset 0; host writes and reads cover its first n elements and sync just those.

    Views are cut once per (size, argument slot) and reused, so XRT's per-argument-tuple run
    cache hits where taconite builds a fresh run each dispatch; the device sees the same
    buffers, offsets and sizes.
    """

    def __init__(self, device: Device, elems: int, name: str) -> None:
        if elems < 1:
            raise OpsError(f"buffer {name}: {elems} elements")
        self.device, self.elems, self.name = device, elems, name
        self.root = device.alloc(elems * 2)
        self._views: dict[tuple[int, int], Buffer] = {}

    def view(self, elems: int, slot: int = 0) -> Buffer:
        """The first `elems` elements as a sub-buffer at offset 0 (npu.rs `Flat::view`)."""
        if elems > self.elems:
            raise OpsError(f"{self.name}: a view of {elems} elements over a buffer of {self.elems}")
        key = (elems, slot)
        if key not in self._views:
            self._views[key] = self.device.sub(self.root, 0, elems * 2)
        return self._views[key]

    def host(self, n: int | None = None) -> np.ndarray:
        """The host mapping's first n elements (default all), uint16, for the host to write
        bf16 into; written(n) then syncs them. No sync happens here."""
        n = self.elems if n is None else n
        if n > self.elems:
            raise OpsError(f"{self.name}: {n} elements of a buffer of {self.elems}")
        return self.root.array(np.uint16)[:n]

    def written(self, n: int) -> None:
        """The host wrote the first n elements: sync them to the device (npu.rs `fill_rows`)."""
        self.device.to_device(self.view(n))

    def bits(self, n: int) -> np.ndarray:
        """The first n elements, synced from the device: a uint16 view of the host mapping."""
        buf = self.view(n)
        self.device.from_device(buf)
        return self.root.array(np.uint16)[:n]

    def free(self) -> None:
        self.device.free(self.root)
        self._views.clear()


def run_gemm(
    device: Device, kernel: Kernel, rec: GemmRecord, a: Flat, b: Buffer, c: Flat
) -> Launch:
    """Start one dispatch of a GEMM over all its rows: (A view of a_elems, B, C view of
    c_elems); its Launch. A dispatch that reads this one's C, or writes its A or C, may be
    started before this one is waited for only on the same hardware context: the driver
    orders runs within a context and not across them (docs/device.md, "Ordering")."""
    return device.start(kernel, [a.view(rec.a_elems), b, c.view(rec.c_elems)])


def run_mha(device: Device, kernel: Kernel, rec: MhaRecord, stage: Flat, o: Flat) -> Launch:
    """Start the attention: q, k and v three views of the staging buffer, all from offset 0,
    and the o view (npu.rs `run_mha`); its Launch. A consumer of o on another hardware
    context (Sapiens2's `o` GEMM) starts only once it has been waited for (run_gemm)."""
    views = [stage.view(rec.q_elems, 0), stage.view(rec.k_elems, 1), stage.view(rec.v_elems, 2)]
    return device.start(kernel, [*views, o.view(rec.o_elems)])
