"""The simulator's kernel kinds: what a bundle kernel computes, read from its record (shapes,
tiling, epilogue; docs/device.md), run in numpy with the NPU's number formats; a kind registers
with `sim_kernel` (GEMM and MHA here, CLIP's in npu/sim_clip.py, AdaFace's in npu/sim_conv.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from npu.bf16 import bf16_to_f32, bfp16_packed_size, f32_to_bf16, pack_bfp16, unpack_bfp16
from npu.device import (
    Buffer,
    DeviceError,
    KernelSpec,
)
from npu.ops import EPILOGUES, LOG2E, gemm_epilogue

# IRON's CT_MAX_K_FOR_N (the common commit): the ct_k a GEMM record without one was built with.
CT_MAX_K_FOR_N = {16: 16, 32: 32, 64: 128, 128: 32}
# First words of the sim's own instruction streams (real ones hold the compiled program).
SIM_GEMM_MAGIC = int.from_bytes(b"NPGM", "little")
SIM_MHA_MAGIC = int.from_bytes(b"NPMH", "little")


class SimKernelModel(Protocol):
    """What the simulator knows of one kernel record: operand sizes, work, and semantics."""

    arg_bytes: tuple[int, ...]  # the bytes each argument buffer must hold at least
    writes: tuple[int, ...]  # the arguments it writes (IRON's convention: the last)
    flops: int

    def execute(self, args: Sequence[Buffer], insts: np.ndarray) -> None:
        """Compute the outputs into the argument buffers; insts: the (patched) u32 words."""
        ...


SIM_KERNELS: dict[str, Callable[[KernelSpec], SimKernelModel]] = {}


def sim_kernel(kind: str) -> Callable:
    """Register a kernel kind (a record tag, or a record's `kind=` field) with the simulator."""

    def register(factory: Callable[[KernelSpec], SimKernelModel]) -> Callable:
        SIM_KERNELS[kind] = factory
        return factory

    return register


def _bf16_matrix(buf: Buffer, rows: int, cols: int, stride: int) -> np.ndarray:
    """A bf16 [rows, cols] view at row stride `stride` elements (stride < cols overlaps)."""
    u16 = buf.host[: buf.nbytes - buf.nbytes % 2].view(np.uint16)
    return np.lib.stride_tricks.as_strided(u16, (rows, cols), (stride * 2, 2), writeable=False)


def gemm_tiles(spec: KernelSpec, k: int) -> tuple[int, int, int]:
    """(tile_n, tile_k, ct_k) of a GEMM record; IRON's defaults where a field is absent:
    tile_n 128 when K == 512 else 64, tile_k 512, ct_k CT_MAX_K_FOR_N[tile_n]."""
    tile_n = spec.get_int("tile_n", 128 if k == 512 else 64)
    tile_k = spec.get_int("tile_k", 512)
    if "ct_k" not in spec.fields and tile_n not in CT_MAX_K_FOR_N:
        raise DeviceError(f"{spec.where()}: `ct_k=` missing and tile_n={tile_n} has no default")
    return tile_n, tile_k, spec.get_int("ct_k", CT_MAX_K_FOR_N.get(tile_n, 0))


def pack_gemm_b(
    w: np.ndarray, bias: np.ndarray | None, tile_n: int, tile_k: int, ct_k: int
) -> np.ndarray:
    """The sim's GEMM B buffer: pack_bfp16(w) then, with a bias, N bf16 bias values.

    w: float32 [K, N]; bias: float32 [N] or None. Returns uint8 [K*N/8*9 (+ 2N)].
    """
    packed = pack_bfp16(w, tile_n, tile_k, ct_k)
    if bias is None:
        return packed
    return np.concatenate([packed, f32_to_bf16(np.asarray(bias, np.float32)).view(np.uint8)])


@dataclass(frozen=True)
class GemmProgram:
    """What a real GEMM's instruction stream fixes and a taconite-sapiens2 `gemm` record does
    not carry: B's tile order, whether B ends in a bias, the epilogue and B's columns.

    taconite reads only `M K N lda c_stride rows a_elems c_elems ctx insts`; the simulator,
    having no xclbin, reads the rest from its own instruction words (SIM_GEMM_MAGIC, then
    these six), which the sim bundle writer emits and no runtime reads (docs/device.md).
    epilogue "swiglu" writes silu(g)·u of B's column halves g | u, so b_cols = 2·N.
    """

    tile_n: int
    tile_k: int
    ct_k: int
    bias: bool
    epilogue: str
    b_cols: int

    def words(self, count: int = 16) -> bytes:
        """The instruction stream: the magic word, the six fields, zero padding to `count`."""
        head = [SIM_GEMM_MAGIC, self.tile_n, self.tile_k, self.ct_k, int(self.bias),
                EPILOGUES.index(self.epilogue), self.b_cols]  # fmt: skip
        return np.array(head + [0] * (count - len(head)), np.uint32).tobytes()

    @classmethod
    def read(cls, spec: KernelSpec) -> GemmProgram | None:
        """The program in spec's instruction stream, or None when it is not the sim's."""
        words = np.frombuffer(spec.insts, np.uint32)
        if len(words) < 7 or words[0] != SIM_GEMM_MAGIC:
            return None
        tile_n, tile_k, ct_k, bias, epi, b_cols = (int(w) for w in words[1:7])
        if epi >= len(EPILOGUES) or bias > 1:
            raise DeviceError(f"{spec.where()}: the sim GEMM program has a bad epilogue or bias")
        return cls(tile_n, tile_k, ct_k, bool(bias), EPILOGUES[epi], b_cols)


@sim_kernel("gemm")
class SimGemm:
    """flm.GEMM: C = epilogue(A @ B + bias) over `rows` rows, args (A, B, C).

    A bf16, row r = the K values from element r·lda of the A argument (rows overlap when
    lda < K); C bf16, row r written at element r·c_stride, N' columns; B pack_gemm_b's
    layout (bfp16ebs8 in tile_n / tile_k / ct_k order, then bias bf16 when it has one).
    Accumulation in f32, C rounded to bf16 (conv_even), as flm.GEMM's default rounding.

    Two record forms. taconite-sapiens2's (the stream holds a GemmProgram): the record's
    `rows` rows in one dispatch, A and C arguments of at least `a_elems` / `c_elems`
    elements, N' = N, B's columns, bias, epilogue and tiles from the program. The generic
    form (no program; CLIP's towers, DeviceOps): M rows (or `rows`), tile_n / tile_k / ct_k /
    bias / epilogue from the record, B has N columns and swiglu halves them (N' = N/2).
    """

    def __init__(self, spec: KernelSpec) -> None:
        self.spec = spec
        m, k, n = spec.get_int("M"), spec.get_int("K"), spec.get_int("N")
        self.m, self.k = m, k
        prog = GemmProgram.read(spec)
        if prog is None:
            self.tiles = gemm_tiles(spec, k)
            self.epilogue = spec.get_str("epilogue", "none")
            if self.epilogue not in EPILOGUES:
                raise DeviceError(
                    f"{spec.where()}: `epilogue={self.epilogue}` is not none|silu|gelu|swiglu"
                )
            self.bias = spec.get_flag("bias")
            self.b_cols = n
            self.n_out = n // 2 if self.epilogue == "swiglu" else n
        else:
            self.tiles = (prog.tile_n, prog.tile_k, prog.ct_k)
            self.epilogue, self.bias, self.b_cols, self.n_out = (
                prog.epilogue, prog.bias, prog.b_cols, n,
            )  # fmt: skip
            if self.b_cols != (2 * n if self.epilogue == "swiglu" else n):
                raise DeviceError(
                    f"{spec.where()}: the program's B has {self.b_cols} columns for N={n} "
                    f"and epilogue {self.epilogue}"
                )
        tile_n, tile_k = self.tiles[:2]
        for ok, what in (
            (m > 0 and m % 256 == 0, f"M={m} is not a multiple of 256"),
            (k > 0 and k % tile_k == 0, f"K={k} is not a multiple of tile_k={tile_k}"),
            (self.b_cols > 0 and self.b_cols % tile_n == 0,
             f"N={self.b_cols} is not a multiple of tile_n={tile_n}"),
        ):  # fmt: skip
            if not ok:
                raise DeviceError(f"{spec.where()}: flm.GEMM needs {what}")
        self.rows = spec.get_int("rows", m)
        self.lda = spec.get_int("lda", k)
        self.c_stride = spec.get_int("c_stride", self.n_out)
        self.packed = bfp16_packed_size(k, self.b_cols)
        self.b_bytes = self.packed + (2 * self.b_cols if self.bias else 0)
        if "b_bytes" in spec.fields and spec.get_int("b_bytes") != self.b_bytes:
            raise DeviceError(
                f"{spec.where()}: b_bytes={spec.fields['b_bytes']}, but a [{k}, {self.b_cols}] B"
                f"{' with bias' if self.bias else ''} is {self.b_bytes} bytes"
            )
        if self.rows < 1 or self.lda < 1 or self.c_stride < self.n_out:
            raise DeviceError(
                f"{spec.where()}: rows={self.rows}, lda={self.lda}, c_stride={self.c_stride}; "
                f"need rows, lda >= 1 and c_stride >= N'={self.n_out}"
            )
        a_elems = self._view(spec, "a_elems", (self.rows - 1) * self.lda + k, "lda", self.lda, k)
        c_elems = self._view(
            spec, "c_elems", (self.rows - 1) * self.c_stride + self.n_out, "c_stride",
            self.c_stride, self.n_out,
        )  # fmt: skip
        self.arg_bytes = (a_elems * 2, self.b_bytes, c_elems * 2)
        self.writes = (2,)
        self.flops = 2 * self.rows * k * self.b_cols
        self._weights: tuple[tuple[int, int], np.ndarray, np.ndarray | None] | None = None

    def _view(self, spec: KernelSpec, name: str, need: int, stride: str, s: int, w: int) -> int:
        """The elements of the A or C view: the record's `name=`, which must cover `need`."""
        elems = spec.get_int(name, need)
        if elems < need:
            raise DeviceError(
                f"{spec.where()}: `{name}={elems}` is smaller than its {self.rows} rows at "
                f"{stride}={s} ({w} values each) span: {need} elements"
            )
        return elems

    def weights(self, b: Buffer) -> tuple[np.ndarray, np.ndarray | None]:
        """B unpacked to float32 [K, b_cols] (+ bias); cached until B is synced again."""
        tag = (b.id, b.root.version)  # type: ignore[attr-defined]
        if self._weights is None or self._weights[0] != tag:
            w = unpack_bfp16(b.host[: self.packed], self.k, self.b_cols, *self.tiles)
            bias = None
            if self.bias:
                bias = bf16_to_f32(b.host[self.packed : self.b_bytes].view(np.uint16))
            self._weights = (tag, w, bias)
        return self._weights[1], self._weights[2]

    def execute(self, args: Sequence[Buffer], insts: np.ndarray) -> None:
        a = bf16_to_f32(_bf16_matrix(args[0], self.rows, self.k, self.lda))
        w, bias = self.weights(args[1])
        c = gemm_epilogue(a @ w, bias, self.epilogue)
        out = args[2].host[: args[2].nbytes - args[2].nbytes % 2].view(np.uint16)
        rows = np.lib.stride_tricks.as_strided(
            out, (self.rows, self.n_out), (self.c_stride * 2, 2), writeable=True
        )
        rows[...] = f32_to_bf16(c)


@dataclass(frozen=True)
class MhaProgram:
    """The attention geometry a taconite-sapiens2 MHA kernel has compiled into its stream:
    `tokens` rows, `heads` x `hd`; q, k and v are the same rows of one staging buffer at row
    stride `ld`, at columns q_col / k_col / v_col (head h at + h·hd); O rows at stride o_ld.

    The record (`mha q_elems= k_elems= v_elems= o_elems= ctx= insts=`) carries none of this;
    the simulator reads it from its own instruction words (SIM_MHA_MAGIC, then these eight),
    which the sim bundle writer emits and no runtime reads (docs/device.md).
    """

    tokens: int
    heads: int
    hd: int
    ld: int
    q_col: int
    k_col: int
    v_col: int
    o_ld: int

    def words(self, count: int = 16) -> bytes:
        head = [SIM_MHA_MAGIC, self.tokens, self.heads, self.hd, self.ld, self.q_col,
                self.k_col, self.v_col, self.o_ld]  # fmt: skip
        return np.array(head + [0] * (count - len(head)), np.uint32).tobytes()

    @classmethod
    def read(cls, spec: KernelSpec) -> MhaProgram:
        words = np.frombuffer(spec.insts, np.uint32)
        if len(words) < 9 or words[0] != SIM_MHA_MAGIC:
            raise DeviceError(
                f"{spec.where()}: the simulator cannot run this mha kernel: its geometry is "
                "compiled into the instruction stream, and this stream is not one the sim "
                "bundle writer made"
            )
        return cls(*(int(w) for w in words[1:9]))


class SimStagedMha:
    """taconite-sapiens2's attention: args (Q, K, V, O), Q / K / V three views of one staged
    bf16 buffer from offset 0, row t = [q_t·log2(e)/sqrt(hd) | k_t per head | v_t per head].

    Head h of token t: q at Q[t·ld + q_col + h·hd], k at K[t·ld + k_col + h·hd], v at
    V[t·ld + v_col + h·hd] (hd values each); O[t·o_ld + h·hd] = softmax₂(q·kᵀ)·v, where
    softmax₂ uses exp2 (the host's log2(e) prescale), over all `tokens` keys, no mask. Scores
    and softmax in f32, O rounded to bf16. Geometry from the MhaProgram in the stream; the
    argument sizes from the record's q_elems / k_elems / v_elems / o_elems, each checked to
    cover what the kernel reads.
    """

    def __init__(self, spec: KernelSpec) -> None:
        self.spec = spec
        self.p = p = MhaProgram.read(spec)
        if min(p.tokens, p.heads, p.hd) < 1:
            raise DeviceError(f"{spec.where()}: the mha program has no tokens, heads or hd")
        width = p.heads * p.hd
        reads = {
            "q_elems": (p.tokens - 1) * p.ld + p.q_col + width,
            "k_elems": (p.tokens - 1) * p.ld + p.k_col + width,
            "v_elems": (p.tokens - 1) * p.ld + p.v_col + width,
            "o_elems": (p.tokens - 1) * p.o_ld + width,
        }
        sizes = []
        for name, need in reads.items():
            elems = spec.get_int(name)
            if elems < need:
                raise DeviceError(
                    f"{spec.where()}: `{name}={elems}` is smaller than the {need} elements the "
                    f"kernel reads ({p.tokens} tokens x {p.heads} heads x {p.hd})"
                )
            sizes.append(2 * elems)
        self.arg_bytes = tuple(sizes)
        self.writes = (3,)
        self.flops = 4 * p.heads * p.tokens * p.tokens * p.hd

    def _heads(self, buf: Buffer, col: int) -> np.ndarray:
        """float32 [heads, tokens, hd] read from buf at row stride ld, from column col."""
        p = self.p
        u16 = buf.host[: buf.nbytes - buf.nbytes % 2].view(np.uint16)[col:]
        rows = np.lib.stride_tricks.as_strided(
            u16, (p.tokens, p.heads, p.hd), (p.ld * 2, p.hd * 2, 2), writeable=False
        )
        return bf16_to_f32(rows).transpose(1, 0, 2)

    def execute(self, args: Sequence[Buffer], insts: np.ndarray) -> None:
        p = self.p
        cols = (p.q_col, p.k_col, p.v_col)
        q, k, v = (self._heads(b, c) for b, c in zip(args[:3], cols, strict=True))
        s = np.matmul(q, k.transpose(0, 2, 1))
        e = np.exp2(s - s.max(axis=-1, keepdims=True))
        e /= e.sum(axis=-1, keepdims=True)
        o = f32_to_bf16(np.matmul(e, v).astype(np.float32)).transpose(1, 0, 2)
        out = args[3].host[: args[3].nbytes - args[3].nbytes % 2].view(np.uint16)
        rows = np.lib.stride_tricks.as_strided(
            out, (p.tokens, p.heads, p.hd), (p.o_ld * 2, p.hd * 2, 2), writeable=True
        )
        rows[...] = o


@sim_kernel("mha")
def _mha_kernel(spec: KernelSpec) -> SimKernelModel:
    """A `mha` record: taconite-sapiens2's form (q_elems=, geometry in the stream) or the
    generic one (heads= d= seq=, fields as SimMha documents)."""
    return SimStagedMha(spec) if "q_elems" in spec.fields else SimMha(spec)


class SimMha:
    """IRON MHA, the generic record form: O = softmax(Q Kᵀ) V per head, args (Q, K, V, O),
    all bf16, Q / K / V separate buffers.

    Record fields: heads, kv_heads (default heads; query head h reads kv head
    h // (heads / kv_heads)), d, seq (valid keys), seq_pad (default seq; the compiled
    length of every operand), causal (0|1), token_major (0|1: operands are [seq_pad, heads,
    d] instead of [heads, seq_pad, d]), qscale (`host`, the default: the host prescaled Q by
    scale·log2(e) and the kernel uses exp2, as Sapiens2's staging; or a number: the kernel
    multiplies the scores by it and uses exp), seq_word (optional: the instruction word that
    holds the valid key count; a patch of it changes `seq` at run time). Keys at or past the
    valid count are masked; scores and softmax in f32, O rounded to bf16.
    """

    def __init__(self, spec: KernelSpec) -> None:
        self.spec = spec
        self.heads = spec.get_int("heads")
        self.kv_heads = spec.get_int("kv_heads", self.heads)
        self.d = spec.get_int("d")
        self.seq = spec.get_int("seq")
        self.seq_pad = spec.get_int("seq_pad", self.seq)
        self.causal = spec.get_flag("causal")
        self.token_major = spec.get_flag("token_major")
        raw = spec.get_str("qscale", "host")
        try:
            self.qscale = None if raw == "host" else float(raw)
        except ValueError:
            raise DeviceError(
                f"{spec.where()}: `qscale={raw}` is neither host nor a number"
            ) from None
        self.seq_word = spec.get_int("seq_word") if "seq_word" in spec.fields else None
        if self.seq_word is not None and (self.seq_word + 1) * 4 > len(spec.insts):
            raise DeviceError(f"{spec.where()}: seq_word={self.seq_word} is past the stream")
        for ok, what in (
            (self.heads > 0 and self.d > 0 and self.seq > 0, "heads, d and seq must be > 0"),
            (self.kv_heads > 0 and self.heads % self.kv_heads == 0, "heads % kv_heads != 0"),
            (self.seq <= self.seq_pad, f"seq={self.seq} > seq_pad={self.seq_pad}"),
        ):
            if not ok:
                raise DeviceError(f"{spec.where()}: {what}")
        q_bytes = self.heads * self.seq_pad * self.d * 2
        kv_bytes = self.kv_heads * self.seq_pad * self.d * 2
        self.arg_bytes = (q_bytes, kv_bytes, kv_bytes, q_bytes)
        self.writes = (3,)
        self.flops = 4 * self.heads * self.seq_pad * self.seq_pad * self.d

    def _operand(self, buf: Buffer, heads: int) -> np.ndarray:
        n = heads * self.seq_pad * self.d
        u16 = buf.host[: 2 * n].view(np.uint16)
        if self.token_major:
            return bf16_to_f32(u16.reshape(self.seq_pad, heads, self.d)).transpose(1, 0, 2)
        return bf16_to_f32(u16.reshape(heads, self.seq_pad, self.d))

    def execute(self, args: Sequence[Buffer], insts: np.ndarray) -> None:
        valid = self.seq if self.seq_word is None else int(insts[self.seq_word])
        if not 0 < valid <= self.seq_pad:
            raise DeviceError(f"{self.spec.key}: valid key count {valid} outside 1..{self.seq_pad}")
        q = self._operand(args[0], self.heads)
        rep = self.heads // self.kv_heads
        k = np.repeat(self._operand(args[1], self.kv_heads), rep, axis=0)
        v = np.repeat(self._operand(args[2], self.kv_heads), rep, axis=0)
        s = np.matmul(q, k.transpose(0, 2, 1))
        if self.qscale is not None:
            s *= np.float32(self.qscale * LOG2E)
        keep = np.arange(self.seq_pad)[None, :] < valid
        if self.causal:
            keep = keep & np.tril(np.ones((self.seq_pad, self.seq_pad), dtype=bool))
        s = np.where(keep, s, -np.inf)
        p = np.exp2(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        o = f32_to_bf16(np.matmul(p, v).astype(np.float32))
        if self.token_major:
            o = o.transpose(1, 0, 2)
        args[3].host[: o.nbytes] = np.ascontiguousarray(o).reshape(-1).view(np.uint8)
