"""The simulator's AdaFace conv kernel (kind `adaface_conv`): one stride-1 "same" convolution
over one input-channel group, arguments (input, weights, output), as taconite-adaface's conv
dispatches (docs/adaface-bundle.md).

On hardware the conv geometry lives in the xclbin and its instruction stream, and the weights
are pre-packed in IRON's unpublished per-dispatch layout. The simulator's stand-ins, documented
in docs/adaface-bundle.md §4:

- geometry: the instruction stream's first 7 u32 words, `CONV_MAGIC k h wp icg oc owp`
  (write_conv_kernel writes them); the manifest's `conv` record is not read;
- input: bf16 tiled [h, icg/8, wp, 8]; output: bf16 tiled [h, oc/8, owp, 8] with owp == wp;
- weights: bf16 blocked [oc/8, icg/8, k, k, 8 (input lane), 8 (output lane)]
  (pack_conv_weights / unpack_conv_weights);
- numerics: bf16 operands, products summed in float64 (order-independent, so any correct
  host model reproduces it), rounded to float32 (the accumulator) and then to bf16 (RNE).
  Zero padding of k//2 on every side; columns x >= w of the input are zero, so the first w
  output columns are exact and the host crops the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from npu.bf16 import bf16_to_f32, f32_to_bf16
from npu.device import Buffer, DeviceError, KernelSpec
from npu.sim_bundle import write_xclbin
from npu.sim_kernels import sim_kernel

if TYPE_CHECKING:
    from npu.bundle_writer import BundleWriter

CONV_KIND = "adaface_conv"
CONV_MAGIC = 0x43464441  # b"ADFC" little-endian
GEOMETRY_WORDS = ("magic", "k", "h", "wp", "icg", "oc", "owp")


def conv_insts(k: int, h: int, wp: int, icg: int, oc: int, owp: int) -> bytes:
    """The simulator's instruction stream for one conv geometry: u32 little-endian words."""
    return np.array([CONV_MAGIC, k, h, wp, icg, oc, owp], dtype="<u4").tobytes()


def pack_conv_weights(w: np.ndarray) -> np.ndarray:
    """w: float [oc, icg, k, k] (oc, icg multiples of 8) -> float32 blocked
    [oc/8, icg/8, k, k, 8 (input lane), 8 (output lane)] (round to bf16 when writing)."""
    oc, icg, k, _ = w.shape
    blocks = np.asarray(w, np.float32).reshape(oc // 8, 8, icg // 8, 8, k, k)
    return np.ascontiguousarray(blocks.transpose(0, 2, 4, 5, 3, 1))


def unpack_conv_weights(packed: np.ndarray, oc: int, icg: int, k: int) -> np.ndarray:
    """The inverse of pack_conv_weights as taps: any [oc·icg·k·k] -> [k, k, icg, oc]."""
    blocks = np.asarray(packed).reshape(oc // 8, icg // 8, k, k, 8, 8)
    return np.ascontiguousarray(blocks.transpose(2, 3, 1, 4, 0, 5).reshape(k, k, icg, oc))


def write_conv_kernel(
    writer: BundleWriter, ctx: str, k: int, h: int, wp: int, icg: int, oc: int
) -> str:
    """An `xclbin <ctx>` record with its placeholder file plus the geometry instruction stream
    kernels/<ctx>.bin; returns the stream's bundle-relative path (a `conv` record's insts)."""
    write_xclbin(writer, ctx)
    rel = f"kernels/{ctx}.bin"
    writer.file(rel, conv_insts(k, h, wp, icg, oc, wp))
    return rel


@sim_kernel(CONV_KIND)
class SimAdafaceConv:
    """A stride-1, zero-padded k x k convolution over one input-channel group (module doc)."""

    def __init__(self, spec: KernelSpec) -> None:
        words = np.frombuffer(spec.insts, "<u4")
        if len(words) < len(GEOMETRY_WORDS) or words[0] != CONV_MAGIC:
            raise DeviceError(
                f"{spec.where()}: not a simulator conv stream (want the words "
                f"{' '.join(GEOMETRY_WORDS)}, magic {CONV_MAGIC:#x})"
            )
        k, h, wp, icg, oc, owp = (int(v) for v in words[1:7])
        for ok, what in (
            (k % 2 == 1, f"k={k} is not odd"),
            (h > 0 and wp > 0, f"h={h}, wp={wp} must be positive"),
            (icg > 0 and icg % 8 == 0, f"icg={icg} is not a positive multiple of 8"),
            (oc > 0 and oc % 8 == 0, f"oc={oc} is not a positive multiple of 8"),
            (owp == wp, f"owp={owp} differs from wp={wp}"),
        ):
            if not ok:
                raise DeviceError(f"{spec.where()}: conv geometry: {what}")
        self.k, self.h, self.wp, self.icg, self.oc = k, h, wp, icg, oc
        self.arg_bytes = (h * icg * wp * 2, oc * icg * k * k * 2, h * oc * wp * 2)
        self.writes = (2,)
        self.flops = 2 * h * wp * oc * icg * k * k

    def execute(self, args: Sequence[Buffer], insts: np.ndarray) -> None:
        k, h, wp, icg, oc = self.k, self.h, self.wp, self.icg, self.oc
        x = bf16_to_f32(args[0].array(np.uint16, (h, icg // 8, wp, 8)))
        taps = unpack_conv_weights(
            bf16_to_f32(args[1].array(np.uint16, (oc * icg * k * k,))), oc, icg, k
        ).astype(np.float64)
        p = k // 2
        xp = np.zeros((h + 2 * p, wp + 2 * p, icg), np.float64)
        xp[p : p + h, p : p + wp] = x.transpose(0, 2, 1, 3).reshape(h, wp, icg)
        y = np.zeros((h * wp, oc), np.float64)
        for ky in range(k):
            for kx in range(k):
                y += xp[ky : ky + h, kx : kx + wp].reshape(h * wp, icg) @ taps[ky, kx]
        tiled = y.astype(np.float32).reshape(h, wp, oc // 8, 8).transpose(0, 2, 1, 3)
        args[2].array(np.uint16)[: h * oc * wp] = f32_to_bf16(tiled).reshape(-1)
