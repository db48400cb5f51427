"""The simulator's CLIP tower kernels: `clip_mha` (attention over row views of the qkv GEMM's
output) and `addln` (residual add + LayerNorm), as taconite-clip dispatches them
(docs/clip.md).

On hardware both are compiled IRON kernels whose geometry lives in the xclbin and instruction
stream; IRON's clip_vit_h14 app is unpublished (docs/clip.md), so the simulator reads the geometry
from the `op` record's fields (docs/device.md §3):

- `clip_mha`, args (Q, K, V, O): Q, K and V are the same rows of the qkv output at row stride
  `ld` (default 3·heads·d), Q at column 0, K at `k_col` (default heads·d), V at `v_col`
  (default 2·heads·d), head h at h·d within each; O is written at row stride `o_ld` (default
  heads·d), head h at column h·d. One dispatch spans `rows` rows cut into independent blocks
  of `block` rows (default `rows`): within a block, keys at or past `seq` are masked, and
  with `causal=1` a query sees only keys at or before it. Scores are multiplied by `qscale`
  (the kernel's compiled 1/√d), softmax in float32 with exp, O rounded to bf16.
- `addln`, args (X, D, Y, H), each bf16 [rows, dim]: Y = bf16(X + D) and H = bf16(LN(Y)),
  LayerNorm without affine (mean and biased variance in float32, `eps`), computed from the
  rounded Y, as the host entry computes LN(bf16(x)).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from npu.bf16 import bf16_to_f32, f32_to_bf16
from npu.device import Buffer, DeviceError, KernelSpec
from npu.sim_kernels import sim_kernel

if TYPE_CHECKING:
    from npu.bundle_writer import BundleWriter

MHA_KIND = "clip_mha"
ADDLN_KIND = "addln"


def _float_field(spec: KernelSpec, name: str) -> float:
    raw = spec.get_str(name)
    try:
        value = float(raw)
    except ValueError:
        raise DeviceError(f"{spec.where()}: `{name}={raw}` is not a number") from None
    if not np.isfinite(value) or value <= 0:
        raise DeviceError(f"{spec.where()}: `{name}={raw}` must be a finite number > 0")
    return value


def _rows_view(buf: Buffer, rows: int, cols: int, stride: int, col: int = 0) -> np.ndarray:
    """bf16 (uint16) [rows, cols] at row stride `stride` elements, from column `col`."""
    u16 = buf.host[: buf.nbytes - buf.nbytes % 2].view(np.uint16)[col:]
    return np.lib.stride_tricks.as_strided(u16, (rows, cols), (stride * 2, 2), writeable=True)


@sim_kernel(MHA_KIND)
class SimClipMha:
    """Attention over `rows` rows of CLIP's fused qkv output, in blocks (module docstring)."""

    def __init__(self, spec: KernelSpec) -> None:
        self.spec = spec
        self.heads, self.d = spec.get_int("heads"), spec.get_int("d")
        self.rows = spec.get_int("rows")
        self.block = spec.get_int("block", self.rows)
        self.seq = spec.get_int("seq")
        self.causal = spec.get_flag("causal")
        width = self.heads * self.d
        self.ld = spec.get_int("ld", 3 * width)
        self.k_col = spec.get_int("k_col", width)
        self.v_col = spec.get_int("v_col", 2 * width)
        self.o_ld = spec.get_int("o_ld", width)
        self.qscale = _float_field(spec, "qscale")
        for ok, what in (
            (self.heads > 0 and self.d > 0, "heads and d must be > 0"),
            (self.block > 0 and self.rows % self.block == 0, "rows is not a multiple of block"),
            (0 < self.seq <= self.block, f"seq={self.seq} outside 1..block={self.block}"),
            (max(self.k_col, self.v_col) + width <= self.ld, "a K or V column range passes ld"),
            (width <= self.ld and width <= self.o_ld, "ld and o_ld must hold heads·d columns"),
        ):
            if not ok:
                raise DeviceError(f"{spec.where()}: {what}")
        span = (self.rows - 1) * self.ld
        self.arg_bytes = (
            (span + width) * 2,
            (span + self.k_col + width) * 2,
            (span + self.v_col + width) * 2,
            ((self.rows - 1) * self.o_ld + width) * 2,
        )
        self.writes = (3,)
        self.flops = 4 * self.heads * self.rows * self.block * self.d

    def _operand(self, buf: Buffer, col: int) -> np.ndarray:
        """float32 [blocks, heads, block, d] of the columns from `col`."""
        width = self.heads * self.d
        x = bf16_to_f32(_rows_view(buf, self.rows, width, self.ld, col))
        return x.reshape(self.rows // self.block, self.block, self.heads, self.d).transpose(
            0, 2, 1, 3
        )

    def execute(self, args: Sequence[Buffer], insts: np.ndarray) -> None:
        q = self._operand(args[0], 0)
        k = self._operand(args[1], self.k_col)
        v = self._operand(args[2], self.v_col)
        s = np.matmul(q, k.transpose(0, 1, 3, 2)) * np.float32(self.qscale)
        keep = np.arange(self.block)[None, :] < self.seq
        if self.causal:
            keep = keep & np.tril(np.ones((self.block, self.block), dtype=bool))
        s = np.where(keep, s, -np.inf)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        o = np.matmul(p, v).astype(np.float32).transpose(0, 2, 1, 3)
        out = _rows_view(args[3], self.rows, self.heads * self.d, self.o_ld)
        out[...] = f32_to_bf16(o.reshape(self.rows, self.heads * self.d))


@sim_kernel(ADDLN_KIND)
class SimAddLn:
    """Residual add then LayerNorm without affine over bf16 [rows, dim] (module docstring)."""

    def __init__(self, spec: KernelSpec) -> None:
        self.spec = spec
        self.rows, self.dim = spec.get_int("rows"), spec.get_int("dim")
        if self.rows <= 0 or self.dim <= 0:
            raise DeviceError(f"{spec.where()}: rows and dim must be > 0")
        self.eps = np.float32(_float_field(spec, "eps"))
        self.arg_bytes = (self.rows * self.dim * 2,) * 4
        self.writes = (2, 3)
        self.flops = 8 * self.rows * self.dim

    def execute(self, args: Sequence[Buffer], insts: np.ndarray) -> None:
        n = self.rows * self.dim
        x, delta = (bf16_to_f32(b.array(np.uint16)[:n]) for b in args[:2])
        y = f32_to_bf16(x + delta)
        args[2].array(np.uint16)[:n] = y
        yf = bf16_to_f32(y).reshape(self.rows, self.dim)
        mean = yf.mean(axis=1, keepdims=True, dtype=np.float32)
        centred = yf - mean
        var = np.mean(centred * centred, axis=1, keepdims=True, dtype=np.float32)
        h = centred / np.sqrt(var + self.eps)
        args[3].array(np.uint16)[:n] = f32_to_bf16(h.astype(np.float32)).reshape(-1)


def _op_record(writer: BundleWriter, key: str, kind: str, fields: dict[str, object]) -> None:
    """An `op <key> xclbin= insts= name=` record (taconite-clip's form) plus the simulator's
    kind and geometry fields; one placeholder xclbin per kind."""
    xclbin = f"kernels/{kind}.xclbin"
    writer.file(xclbin, b"npucam sim placeholder xclbin\n")
    insts = f"kernels/{key}.bin"
    writer.file(insts, np.arange(16, dtype=np.uint32).tobytes())
    writer.record("op", key, xclbin=xclbin, insts=insts, name="MLIR_AIE", kind=kind, **fields)


def write_clip_mha(
    writer: BundleWriter,
    key: str,
    *,
    heads: int,
    d: int,
    rows: int,
    seq: int,
    qscale: float,
    block: int | None = None,
    causal: bool = False,
) -> None:
    """An `op <key>` record the simulator runs as `clip_mha` (fields as SimClipMha reads)."""
    _op_record(
        writer, key, MHA_KIND,
        dict(heads=heads, d=d, rows=rows, block=block or rows, seq=seq, causal=causal,
             qscale=repr(float(qscale))),
    )  # fmt: skip


def write_addln(writer: BundleWriter, key: str, *, rows: int, dim: int, eps: float) -> None:
    """An `op <key>` record the simulator runs as `addln`."""
    _op_record(writer, key, ADDLN_KIND, dict(rows=rows, dim=dim, eps=repr(float(eps))))
