"""A simulated NPU: the XRT device's interface, executing bundle kernels in numpy.

Since an xclbin cannot be executed, the simulator reads what a kernel computes from its
manifest record (kind, shapes, tiling, epilogue: docs/device.md) and runs that in numpy
with the NPU's number formats (bf16 operands, bfp16ebs8 GEMM weights, bf16 results), at
start, after checking that it is ordered after what it shares bytes with on other hardware
contexts (the driver orders runs only within one: docs/device.md, "Ordering"). It
models device time (per dispatch from FLOPs and bytes, context creation and switches) and
the machine-wide 16-context limit through a lock-file registry every process shares.
Simulated times are labelled "sim" and are never hardware measurements.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import itertools
import math
import os
import tempfile
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from npu.bf16 import bf16_to_f32, bfp16_packed_size, f32_to_bf16, pack_bfp16, unpack_bfp16
from npu.device import (
    CONTEXT_WAIT_S,
    CONTEXT_WAITS,
    ERT_CMD_STATE_COMPLETED,
    ERT_CMD_STATE_ERROR,
    ERT_CMD_STATE_RUNNING,
    ERT_CMD_STATE_SUBMITTED,
    ERT_CMD_STATE_TIMEOUT,
    Buffer,
    DeviceCore,
    DeviceError,
    DeviceLaunch,
    KernelSpec,
    KernelTiming,
    Parked,
    check_insts_stream,
    patched_insts,
)
from npu.ops import EPILOGUES, LOG2E, gemm_epilogue

if TYPE_CHECKING:
    from npu.bundle_writer import BundleWriter

HWCTX_LIMIT = 16  # NPU2's per-device hardware-context limit, shared by every process
REGISTRY_ENV = "NPUCAM_SIM_HWCTX_DIR"
# IRON's CT_MAX_K_FOR_N (the common commit): the ct_k a GEMM record without one was built with.
CT_MAX_K_FOR_N = {16: 16, 32: 32, 64: 128, 128: 32}
# First words of the sim's own instruction streams (real ones hold the compiled program).
SIM_GEMM_MAGIC = int.from_bytes(b"NPGM", "little")
SIM_MHA_MAGIC = int.from_bytes(b"NPMH", "little")


@dataclass(frozen=True)
class CostModel:
    """Simulated device time. A dispatch costs
    `dispatch_s + max(flops / flops_per_s[kind], bytes / bytes_per_s)` (a roofline);
    creating a context costs `ctx_create_s`; a dispatch whose context differs from the
    previous dispatch's costs `ctx_switch_s` more (the incoming design reconfigures tiles).

    Defaults are effective NPU2 rates derived from upstream's published timings, not peaks:
    GEMM 1.6 TFLOP/s (CLIP's vision fc1, 443 GFLOP in 0.27 s on a Ryzen AI 9 HX 370), MHA
    1.2 TFLOP/s (Sapiens2-0.4b's 24 x 16-head 3081-token attention in ~0.8 s), 60 GB/s of
    DRAM bandwidth, 2.9 ms per switch (the shim's 8-column GEMM figure). ctx_create_s (30 ms)
    and dispatch_s (50 us) are assumptions: no upstream number exists.
    """

    flops_per_s: tuple[tuple[str, float], ...] = (("gemm", 1.6e12), ("mha", 1.2e12))
    default_flops_per_s: float = 1.0e12
    bytes_per_s: float = 60e9
    dispatch_s: float = 50e-6
    ctx_create_s: float = 30e-3
    ctx_switch_s: float = 2.9e-3

    def rate(self, kind: str) -> float:
        return dict(self.flops_per_s).get(kind, self.default_flops_per_s)

    def dispatch(self, kind: str, flops: int, nbytes: int) -> float:
        """Simulated seconds of one dispatch (no context switch)."""
        return self.dispatch_s + max(flops / self.rate(kind), nbytes / self.bytes_per_s)


# The cost of a stand-in's own dispatches inside SimDevice.paced: none (the pass is charged).
FREE = CostModel((), math.inf, math.inf, 0.0, 0.0, 0.0)


@dataclass
class SimFaults:
    """Fault injection. error_kernels: kernel keys whose runs end in ERT_CMD_STATE_ERROR;
    hang_kernels: keys whose runs hang; hang_next: the next n dispatches (any kernel) hang;
    context_failures: the next n context creations fail as CREATE_HWCTX does. A hung run
    stays RUNNING (and so does every run queued behind it on its context) until watchdog_s
    wall seconds after its start, the driver's job timeout (amdxdna's HWCTX_MAX_TIMEOUT,
    60 s), when it ends in ERT_CMD_STATE_TIMEOUT; the wait's deadline normally gives up on
    it first (docs/inference.md)."""

    error_kernels: set[str] = field(default_factory=set)
    hang_kernels: set[str] = field(default_factory=set)
    hang_next: int = 0
    context_failures: int = 0
    watchdog_s: float = 60.0


@dataclass
class SimKernelTime:
    """Per-kernel simulated counters (sim seconds, not hardware measurements)."""

    dispatches: int = 0
    device_s: float = 0.0
    flops: int = 0
    bytes: int = 0


@dataclass
class SimTime:
    """Simulated device time ("sim"): device_time_s = dispatches + creations + switches +
    paced passes (SimDevice.paced: the modelled time of the real model a stand-in replaces)."""

    device_time_s: float = 0.0
    dispatch_s: float = 0.0
    ctx_create_s: float = 0.0
    ctx_switch_s: float = 0.0
    creations: int = 0
    switches: int = 0
    paced_s: float = 0.0
    paced_passes: int = 0
    kernels: dict[str, SimKernelTime] = field(default_factory=dict)

    def line(self) -> str:
        return (
            f"[sim] device_time={self.device_time_s:.6f}s (simulated: dispatch="
            f"{self.dispatch_s:.6f}s create={self.ctx_create_s:.6f}s x{self.creations}"
            f" switch={self.ctx_switch_s:.6f}s x{self.switches}"
            f" paced={self.paced_s:.6f}s x{self.paced_passes})"
        )


# -- the machine-wide context registry -------------------------------------------------


def default_registry_dir() -> Path:
    """`$NPUCAM_SIM_HWCTX_DIR`, else <tmp>/npucam-sim-hwctx-<uid>: one per user and machine."""
    env = os.environ.get(REGISTRY_ENV)
    if env:
        return Path(env)
    return Path(tempfile.gettempdir()) / f"npucam-sim-hwctx-{os.getuid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ContextRegistry:
    """The simulated driver's hwctx table: one file `<pid>-<n>.ctx` per held context in a
    directory every process shares, guarded by flock on `.lock`; files of dead PIDs are
    pruned (os.kill(pid, 0)) before counting against the limit."""

    _serial = itertools.count(1)

    def __init__(self, directory: Path, limit: int = HWCTX_LIMIT) -> None:
        self.dir = Path(directory)
        self.limit = limit
        self.dir.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _locked(self):
        with (self.dir / ".lock").open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _prune(self) -> list[Path]:
        held = []
        for p in self.dir.glob("*.ctx"):
            try:
                pid = int(p.name.split("-", 1)[0])
            except ValueError:
                continue
            if _alive(pid):
                held.append(p)
            else:
                p.unlink(missing_ok=True)
        return held

    def held(self) -> list[tuple[int, str]]:
        """(pid, context label) of every live context on the machine."""
        with self._locked():
            out = []
            for p in self._prune():
                with contextlib.suppress(OSError):
                    out.append((int(p.name.split("-", 1)[0]), p.read_text()))
            return out

    def acquire(self, label: str) -> Path:
        """Take a slot, or raise RuntimeError as the driver's CREATE_HWCTX ioctl fails."""
        with self._locked():
            held = self._prune()
            if len(held) >= self.limit:
                raise RuntimeError(
                    f"DRM_IOCTL_AMDXDNA_CREATE_HWCTX IOCTL failed (err=-16): Device or resource "
                    f"busy (sim: {len(held)} of {self.limit} contexts held machine-wide)"
                )
            slot = self.dir / f"{os.getpid()}-{next(self._serial)}-{id(self):x}.ctx"
            slot.write_text(label)
            return slot

    def release(self, slot: Path) -> None:
        with self._locked():
            slot.unlink(missing_ok=True)


# -- kernel kinds ------------------------------------------------------------------------


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


# -- the device --------------------------------------------------------------------------


def _release_slots(registry: ContextRegistry, slots: set[Path]) -> None:
    for slot in list(slots):
        registry.release(slot)
    slots.clear()


class SimBuffer(Buffer):
    """A host buffer standing in for a host_only BO; `version` counts syncs to the device."""

    def __init__(self, host: np.ndarray, root: Buffer | None = None, offset: int = 0) -> None:
        super().__init__(host, root, offset)
        self.version = 0


@dataclass
class SimKernel:
    """A loaded simulated kernel; `words` (the patched stream) exists while it is resident."""

    device: SimDevice
    spec: KernelSpec
    model: SimKernelModel
    patches: dict[int, int] = field(default_factory=dict)
    timing: KernelTiming = field(default_factory=KernelTiming)
    words: np.ndarray | None = None
    pending: list[DeviceLaunch] = field(default_factory=list)
    freed: bool = False

    def set_insts_words(self, words: Iterable[tuple[int, int]]) -> None:
        self.device.set_insts_words(self, words)


Access = tuple[Buffer, int, int, bool]  # (root buffer, first byte, end byte, written)


def footprint(model: SimKernelModel, buffers: Sequence[Buffer]) -> list[Access]:
    """The bytes of their roots a dispatch's arguments cover, and which it writes."""
    return [
        (b.root, b.offset, b.offset + b.nbytes, i in model.writes) for i, b in enumerate(buffers)
    ]


class SimLaunch(DeviceLaunch):
    """A simulated run, computed at start. Its state (what run.state() would read) is
    SUBMITTED, then RUNNING until ready_at (the modelled end; at once without sleep), then
    `final`; a hung one stays RUNNING until the watchdog, then TIMEOUT."""

    def __init__(
        self,
        device: SimDevice,
        kernel: SimKernel,
        buffers: Sequence[Buffer],
        t0: float,
        final: int,
        hung: bool,
        ready_at: float,
        accesses: list[Access],
    ) -> None:
        super().__init__(device, kernel, buffers, t0)
        self.final, self.hung, self.ready_at = final, hung, ready_at
        self.footprint = accesses  # what it reads and writes (footprint())


class SimDevice(DeviceCore[SimKernel, SimBuffer]):
    """The simulated NPU (backend "sim"). Same interface as npu.xrt.XrtDevice.

    cost: the CostModel; sleep: runs take the modelled time in wall time (the device
    serialises dispatches, so a wait sees a run finish when a real NPU would; without it
    every run is done at once); registry_dir / hwctx_limit: the
    machine-wide context table (default $NPUCAM_SIM_HWCTX_DIR or a per-user temp dir, 16);
    faults: SimFaults for reliability tests; context_waits / context_wait_s: the bounded wait
    for slots other processes hold (taconite-sapiens2's 50 x 100 ms by default).
    """

    backend = "sim"
    label = "sim"

    def __init__(
        self,
        cost: CostModel | None = None,
        *,
        sleep: bool = False,
        registry_dir: Path | str | None = None,
        hwctx_limit: int = HWCTX_LIMIT,
        faults: SimFaults | None = None,
        context_waits: int = CONTEXT_WAITS,
        context_wait_s: float = CONTEXT_WAIT_S,
    ) -> None:
        self.cost = cost or CostModel()
        self.sleep = sleep
        self.faults = faults or SimFaults()
        self.registry = ContextRegistry(
            Path(registry_dir) if registry_dir is not None else default_registry_dir(), hwctx_limit
        )
        super().__init__()
        self.set_context_wait(context_waits, context_wait_s)
        self.sim = SimTime()
        self._last_context: str | None = None
        self._busy_until = 0.0
        self._hung_runs: dict[str, SimLaunch] = {}  # context key -> its hung run in flight
        # a device dropped without close() still gives its machine-wide slots back
        self._slots: set[Path] = set()
        self._release_slots = weakref.finalize(self, _release_slots, self.registry, self._slots)
        if self._timing:
            atexit.register(self.close)  # print the timing lines even if never closed

    # contexts and kernels

    def _create_context(self, key: str) -> Path:
        if self.faults.context_failures > 0:
            self.faults.context_failures -= 1
            raise RuntimeError("DRM_IOCTL_AMDXDNA_CREATE_HWCTX IOCTL failed (sim fault)")
        slot = self.registry.acquire(key.replace("\n", " "))
        self._slots.add(slot)
        self.sim.creations += 1
        self.sim.ctx_create_s += self.cost.ctx_create_s
        self.sim.device_time_s += self.cost.ctx_create_s
        return slot

    def _context_cost(self, wall: float) -> float:
        return self.cost.ctx_create_s

    def _context_holders(self) -> str:
        """The registry's live slots by pid: `held by pid <p> (<n> contexts: <xclbin>, ...)`."""
        by_pid: dict[int, list[str]] = {}
        for pid, label in self.registry.held():
            by_pid.setdefault(pid, []).append(Path(label.rsplit(" ", 1)[0]).name)
        return "; ".join(
            f"held by pid {pid}{' (this process)' if pid == os.getpid() else ''} "
            f"({len(names)} contexts: {', '.join(sorted(names))})"
            for pid, names in sorted(by_pid.items())
        )

    def _destroy_context(self, key: str, slot: Path) -> None:
        if self._last_context == key:
            self._last_context = None
        self._slots.discard(slot)
        self.registry.release(slot)

    def _unload(self, kernel: SimKernel) -> None:
        kernel.words = None

    def _resident(self, kernel: SimKernel) -> None:
        self._contexts.acquire(kernel.spec.context_key, kernel.spec.owner)
        if kernel.words is None:
            kernel.words = patched_insts(kernel.spec.insts, kernel.patches)

    def _new_kernel(self, spec: KernelSpec) -> SimKernel:
        factory = SIM_KERNELS.get(spec.kind)
        if factory is None:
            raise DeviceError(
                f"{spec.where()}: the simulator has no kernel kind {spec.kind!r}"
                f" (it knows {', '.join(sorted(SIM_KERNELS))})"
            )
        check_insts_stream(spec)
        if not spec.xclbin.is_file():
            raise DeviceError(f"{spec.where()}: xclbin {spec.xclbin} is missing")
        kernel = SimKernel(self, spec, factory(spec))
        self.sim.kernels.setdefault(spec.key, SimKernelTime())
        return kernel

    def _patch(self, kernel: SimKernel, words: list[tuple[int, int]]) -> None:
        if kernel.words is not None:
            for i, v in words:
                kernel.words[i] = v

    # buffers

    def _new_buffer(self, nbytes: int) -> SimBuffer:
        return SimBuffer(np.zeros(nbytes, np.uint8))

    def _new_sub(self, root: Buffer, offset: int, nbytes: int) -> SimBuffer:
        return SimBuffer(root.host[offset : offset + nbytes], root, offset)

    def _drop_buffers(self, gone: list[Buffer]) -> None:
        for b in gone:
            b.freed = True
            self._buffers.pop(b.id, None)

    def to_device(self, buf: Buffer) -> None:
        buf.check_live()
        with self._lock:
            self._check_sync(buf, to_device=True)
        buf.root.version += 1  # type: ignore[attr-defined]

    def from_device(self, buf: Buffer) -> None:
        buf.check_live()
        with self._lock:
            self._check_sync(buf, to_device=False)

    # ordering, as the driver orders runs (docs/device.md, "Ordering")

    def _unretired(self, but: str | None = None) -> Iterator[SimLaunch]:
        """Launches not yet seen finished (waited for, or retired by finished()), on every
        context but `but` (none to look for when nothing is in flight: the common case)."""
        if not self._in_flight:
            return
        for key, kernels in self._users.items():
            if key != but:
                for kernel in kernels:
                    yield from kernel.pending  # type: ignore[misc]

    def _check_order(self, kernel: SimKernel, accesses: list[Access]) -> None:
        """DeviceError unless the dispatch is ordered after every unretired launch on another
        hardware context whose bytes it shares, one of the two writing them: the driver
        orders runs only within a context (a hazard the sim would otherwise hide by
        executing each dispatch at its start)."""
        for other in self._unretired(but=kernel.spec.context_key):
            for root, lo, hi, written in accesses:
                for o_root, o_lo, o_hi, o_written in other.footprint:
                    if root is o_root and lo < o_hi and o_lo < hi and (written or o_written):
                        raise DeviceError(
                            f"{kernel.spec.where()}: {kernel.spec.key} "
                            f"{'writes' if written else 'reads'} bytes [{max(lo, o_lo)}, "
                            f"{min(hi, o_hi)}) of buffer {root.id} that {other.kernel.spec.key}"
                            f" ({other.kernel.spec.where()}), started on another hardware "
                            f"context and not yet waited for, "
                            f"{'writes' if o_written else 'reads'}: the driver does not "
                            "order runs across contexts; wait for it first"
                        )

    def _check_sync(self, buf: Buffer, to_device: bool) -> None:
        """DeviceError for a sync of bytes an unretired launch writes (or, to the device,
        reads): the host would race the device."""
        lo, hi = buf.offset, buf.offset + buf.nbytes
        for other in self._unretired():
            for root, o_lo, o_hi, written in other.footprint:
                if root is buf.root and lo < o_hi and o_lo < hi and (written or to_device):
                    raise DeviceError(
                        f"a sync {'to' if to_device else 'from'} the device of bytes "
                        f"[{max(lo, o_lo)}, {min(hi, o_hi)}) of buffer {root.id} that "
                        f"{other.kernel.spec.key} ({other.kernel.spec.where()}), not yet "
                        f"waited for, {'writes' if written else 'reads'}"
                    )

    # runs

    def start(self, kernel: SimKernel, buffers: Sequence[Buffer]) -> SimLaunch:
        with self._lock:
            self._check_usable()
            self._reap()
            t0 = time.perf_counter()
            if kernel.freed:
                raise DeviceError(f"{kernel.spec.key}: kernel was freed")
            model = kernel.model
            if len(buffers) != len(model.arg_bytes):
                raise DeviceError(
                    f"{kernel.spec.key}: {kernel.spec.kind} takes {len(model.arg_bytes)} buffers,"
                    f" got {len(buffers)}"
                )
            for i, (b, need) in enumerate(zip(buffers, model.arg_bytes, strict=True)):
                b.check_live()
                if b.nbytes < need:
                    raise DeviceError(
                        f"{kernel.spec.key}: argument {i} is {b.nbytes} bytes,"
                        f" the kernel reads {need}"
                    )
            accesses = footprint(model, buffers)
            self._check_order(kernel, accesses)
            self._resident(kernel)
            assert kernel.words is not None
            key = kernel.spec.key
            ctx_key = kernel.spec.context_key
            nbytes = sum(b.nbytes for b in buffers) + len(kernel.spec.insts)
            dispatch = self.cost.dispatch(kernel.spec.kind, model.flops, nbytes)
            faults = self.faults
            behind = self._hung_runs.get(ctx_key)
            hung = behind is not None and self._state(behind) == ERT_CMD_STATE_RUNNING
            if not hung and (key in faults.hang_kernels or faults.hang_next > 0):
                faults.hang_next = max(0, faults.hang_next - 1)
                hung = True
            state = ERT_CMD_STATE_ERROR if key in faults.error_kernels else ERT_CMD_STATE_COMPLETED
            if not hung and state == ERT_CMD_STATE_COMPLETED:
                model.execute(buffers, kernel.words)
            switch = 0.0
            if self._last_context != ctx_key:
                switch = self.cost.ctx_switch_s
                self.sim.switches += 1
                self._last_context = ctx_key
            self.sim.ctx_switch_s += switch
            self.sim.dispatch_s += dispatch
            self.sim.device_time_s += switch + dispatch
            kt = self.sim.kernels[key]
            kt.dispatches += 1
            kt.device_s += dispatch
            kt.flops += model.flops
            kt.bytes += nbytes
            expected = switch + dispatch
            ready_at = t0
            if self.sleep and not hung:  # a hung run holds no place on the device clock
                ready_at = max(t0, self._busy_until) + expected
                self._busy_until = ready_at
            launch = SimLaunch(self, kernel, buffers, t0, state, hung, ready_at, accesses)
            if hung and behind is None:
                self._hung_runs[ctx_key] = launch
            begin = ready_at - expected if self.sleep and not hung else launch.t_start
            self._submitted(launch, expected, paced=self.sleep, begin=begin)
            return launch

    def _state(self, launch: SimLaunch) -> int:
        now = time.perf_counter()
        if launch.hung:
            if now - launch.t_start >= self.faults.watchdog_s:
                return ERT_CMD_STATE_TIMEOUT
            return ERT_CMD_STATE_RUNNING
        if now < launch.ready_at:
            return ERT_CMD_STATE_SUBMITTED if now < launch.begin else ERT_CMD_STATE_RUNNING
        return launch.final

    def _park(
        self, key: str, ctx: Path | None, kernels: list[SimKernel], launches: list[SimLaunch]
    ) -> list[object]:
        """The context's slot stays held (in the machine-wide registry too) until its hung
        runs end; nothing writes the buffers of a simulated hung run, so they stay."""
        for kernel in kernels:
            kernel.words = None
        self._hung_runs.pop(key, None)
        if self._last_context == key:
            self._last_context = None
        return [ctx]

    def _release_parked(self, parked: Parked) -> None:
        if parked.ctx is not None:
            self._slots.discard(parked.ctx)
            self.registry.release(parked.ctx)

    @contextlib.contextmanager
    def paced(self, seconds: float) -> Iterator[None]:
        """A pass that takes `seconds` of modelled device time (the real model's, which the
        dispatches made inside stand in for: they cost none). The device clock runs from the
        pass's start, or the end of the work before it; with `sleep` the block returns no
        earlier than that, sleeping without the GIL. A pass that raises is not charged."""
        with self._lock:
            start = max(time.perf_counter(), self._busy_until)
            saved, self.cost = self.cost, FREE
        try:
            yield
        finally:
            with self._lock:
                self.cost = saved
        with self._lock:
            self._busy_until = start + seconds
            self.sim.paced_s += seconds
            self.sim.paced_passes += 1
            self.sim.device_time_s += seconds
        if self.sleep:
            time.sleep(max(0.0, start + seconds - time.perf_counter()))

    def _shutdown(self) -> None:
        self._release_slots()

    def _timing_lines(self) -> list[str]:
        return [*super()._timing_lines(), self.sim.line()]


# -- writing bundles for the simulator ----------------------------------------------------


def write_xclbin(writer: BundleWriter, ctx: str, kernel: str = "MLIR_AIE") -> None:
    """An `xclbin <ctx> kernels/<ctx>.xclbin <kernel>` record and a placeholder file (the
    simulator never reads an xclbin; hardware bundles come from IRON's exporter)."""
    writer.xclbin(ctx, f"kernels/{ctx}.xclbin", kernel, data=b"npucam sim placeholder xclbin\n")


def _insts(writer: BundleWriter, key: str, words: int) -> str:
    rel = f"kernels/{key}.bin"
    writer.file(rel, np.arange(words, dtype=np.uint32).tobytes())
    return rel


def write_gemm(
    writer: BundleWriter,
    key: str,
    w: np.ndarray,
    *,
    ctx: str,
    m: int = 256,
    bias: np.ndarray | None = None,
    epilogue: str = "none",
    tile_n: int | None = None,
    tile_k: int = 512,
    ct_k: int | None = None,
    lda: int | None = None,
    c_stride: int | None = None,
    rows: int | None = None,
) -> str:
    """A `gemm` record for the simulator plus its B tensor (pack_gemm_b); returns the
    tensor's name (`<key>.b`). w: float32 [K, N]; bias: float32 [N] or None.

    lda / c_stride / rows, when any is given, write the strided record form of
    taconite-sapiens2 (docs/pose.md): lda (default K), c_stride (default N'), rows
    (default M), and the view sizes a_elems = (rows-1)·lda + K, c_elems = (rows-1)·c_stride + N'.
    """
    k, n = w.shape
    tile_n = tile_n or (128 if k == 512 else 64)
    ct_k = ct_k or CT_MAX_K_FOR_N[tile_n]
    b = pack_gemm_b(w, bias, tile_n, tile_k, ct_k)
    name = f"{key}.b"
    writer.tensor(name, b, "u8")
    fields: dict[str, object] = dict(
        ctx=ctx, insts=_insts(writer, key, 16), M=m, K=k, N=n, tile_n=tile_n,
        tile_k=tile_k, ct_k=ct_k, bias=bias is not None, epilogue=epilogue, b_bytes=b.nbytes,
    )  # fmt: skip
    if lda is not None or c_stride is not None or rows is not None:
        n_out = n // 2 if epilogue == "swiglu" else n
        fields.update(strided_gemm_fields(k, n_out, m, lda, c_stride, rows))
    writer.record("gemm", key, **fields)
    return name


def strided_gemm_fields(
    k: int, n_out: int, m: int, lda: int | None, c_stride: int | None, rows: int | None
) -> dict[str, int]:
    """The strided gemm record fields lda, c_stride, rows, a_elems, c_elems (defaults K, N',
    M); a_elems / c_elems are the A / C view sizes of `rows` rows at those strides."""
    lda, c_stride, rows = lda or k, c_stride or n_out, rows or m
    return dict(
        lda=lda, c_stride=c_stride, rows=rows, a_elems=(rows - 1) * lda + k,
        c_elems=(rows - 1) * c_stride + n_out,
    )  # fmt: skip


def write_mha(
    writer: BundleWriter,
    key: str,
    *,
    ctx: str,
    heads: int,
    seq: int,
    d: int = 64,
    kv_heads: int | None = None,
    seq_pad: int | None = None,
    causal: bool = False,
    token_major: bool = False,
    qscale: str = "host",
    seq_word: int | None = None,
) -> None:
    """An `mha` record for the simulator (fields as SimMha documents)."""
    fields: dict[str, object] = dict(
        ctx=ctx, insts=_insts(writer, key, 16), heads=heads, kv_heads=kv_heads or heads, d=d,
        seq=seq, seq_pad=seq_pad or seq, causal=causal, token_major=token_major, qscale=qscale,
    )  # fmt: skip
    if seq_word is not None:
        fields["seq_word"] = seq_word
    writer.record("mha", key, **fields)


# Kernel kinds defined in their own modules register themselves on import.
import npu.sim_clip  # noqa: E402, F401  (clip_mha, addln)
import npu.sim_conv  # noqa: E402, F401  (adaface_conv)
