"""Writes an AdaFace IR network as a taconite-adaface bundle (version 1) for the simulated NPU,
in the record format IRON's export_ir18.py / export_ir101.py write (docs/adaface-bundle.md).

The network comes as a cvlface-style state dict (numpy arrays) or as the IrProgram that
npu.models.adaface.checkpoint.lower_iresnet makes of one (BatchNorms folded, stride 2 as a stride-1
conv then `subsample`). Each conv becomes one `conv` record per input-channel group of at most
`max_icg` channels, its weights in the simulator's blocked layout (npu.sim_conv), with widths that
are not a multiple of 4 (the 14x14 and 7x7 stages) padded to one. Like IRON's exporter it records
reference tensors by running the network: ref.input (the bf16 tiled stem input), ref.input_chw (the
raw f32 input), ref.cpu_embedding (the f32 forward of the folded program) and ref.npu_embedding,
from `record_forward`, a host model of the NPU numerics written directly in CHW (no tiling, no
device), independent of the step interpreter that replays it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from npu.bf16 import round_bf16
from npu.bundle_writer import BundleWriter
from npu.models.adaface.checkpoint import from_pretrained as load_adaface
from npu.models.adaface.checkpoint import lower_iresnet
from npu.models.adaface.config import ColourOrder, parse_colour_order
from npu.models.adaface.model import (
    Add,
    Affine,
    Bias,
    Conv,
    Head,
    IrProgram,
    PreluBias,
    Subsample,
    run_program,
)
from npu.models.adaface.npu import BUNDLE_VERSION, to_tiled
from npu.ops import NumpyOps
from npu.sim_conv import pack_conv_weights, write_conv_kernel
from pipeline.errors import NpucamError

STEM_CHANNELS = 8  # the stem's RGB channels padded to a multiple of 8


WIDTH_MULTIPLE = 4  # conv input widths are zero-padded to a multiple of 4 (14 -> 16, 7 -> 8)


DEFAULT_MAX_ICG = 64  # input channels per dispatch (an assumption: IRON sizes groups to fit L1)


class ExportError(NpucamError):
    """The network cannot be written as an AdaFace bundle (names the step or tensor)."""


def channel_groups(ict: int, max_icg: int) -> list[tuple[int, int]]:
    """Input-channel groups (c0 in units of 8 channels, icg) covering ict channels in order,
    each at most max_icg (both multiples of 8): 48 by 32 -> [(0, 32), (4, 16)]."""
    return [(c // 8, min(max_icg, ict - c)) for c in range(0, ict, max_icg)]


def padded_width(w: int) -> int:
    """wp: w rounded up to a multiple of WIDTH_MULTIPLE."""
    return -(-w // WIDTH_MULTIPLE) * WIDTH_MULTIPLE


def _stem_input(input_chw: np.ndarray) -> np.ndarray:
    x = np.asarray(input_chw, np.float32)
    if x.ndim != 3 or x.shape[0] > STEM_CHANNELS or not np.isfinite(x).all():
        raise ExportError(
            f"input_chw must be finite float [c <= {STEM_CHANNELS}, h, w], got {x.shape}"
        )
    full = np.zeros((STEM_CHANNELS, *x.shape[1:]), np.float32)
    full[: x.shape[0]] = x
    return full


def _padded_weight(step: Conv, ict: int) -> np.ndarray:
    """The conv's weights float32 [oc, ict, k, k], extra input channels (the stem's) zero."""
    w = step.weight
    oc, ic, k, k2 = w.shape
    if k != k2 or k % 2 == 0 or ic > ict or oc % 8:
        raise ExportError(
            f"conv {step.key}: weights {w.shape} do not fit a [{ict}, ...] input "
            "(oc a multiple of 8, square odd kernel)"
        )
    out = np.zeros((oc, ict, k, k), np.float32)
    out[:, :ic] = w
    return out


def record_forward(
    program: IrProgram, input_chw: np.ndarray, max_icg: int = DEFAULT_MAX_ICG
) -> np.ndarray:
    """The NPU numerics (docs/adaface-bundle.md) on the host, in CHW: float32 [c <= 8, h, w]
    -> float32 [n].

    Each conv group's partial is the exact (float64) sum of bf16 products, rounded to float32
    and then bf16 (the simulator's conv kernel), summed over groups in float32 and rounded to
    bf16 once; glue ops round as the recorder's host ops; the head sums i ascending in f32.
    Parameters are rounded to bf16 as the bundle stores them.
    """
    bufs: dict[str, np.ndarray] = {program.input: round_bf16(_stem_input(input_chw))}
    for s in program.steps:
        if isinstance(s, Conv):
            x = bufs[s.src]
            ict, h, w = x.shape
            wgt = round_bf16(_padded_weight(s, ict)).astype(np.float64)
            k = wgt.shape[-1]
            p = k // 2
            xp = np.pad(x.astype(np.float64), ((0, 0), (p, p), (p, p)))
            acc = np.zeros((wgt.shape[0], h, w), np.float32)
            for c0, icg in channel_groups(ict, max_icg):
                lo = 8 * c0
                part = np.zeros((wgt.shape[0], h, w), np.float64)
                for ky in range(k):
                    for kx in range(k):
                        part += np.einsum(
                            "oi,ihw->ohw",
                            wgt[:, lo : lo + icg, ky, kx],
                            xp[lo : lo + icg, ky : ky + h, kx : kx + w],
                        )
                acc += round_bf16(part.astype(np.float32))
            bufs[s.dst] = round_bf16(acc)
        elif isinstance(s, Affine):
            scale, shift = round_bf16(s.scale)[:, None, None], round_bf16(s.shift)[:, None, None]
            bufs[s.dst] = round_bf16(bufs[s.src] * scale + shift)
        elif isinstance(s, PreluBias):
            t = round_bf16(bufs[s.buf] + round_bf16(s.bias)[:, None, None])
            bufs[s.buf] = round_bf16(np.where(t < 0, round_bf16(s.alpha)[:, None, None] * t, t))
        elif isinstance(s, Bias):
            bufs[s.buf] = round_bf16(bufs[s.buf] + round_bf16(s.bias)[:, None, None])
        elif isinstance(s, Subsample):
            x = bufs[s.src]
            oh, ow = x.shape[1] // s.stride, x.shape[2] // s.stride
            bufs[s.dst] = x[:, : oh * s.stride : s.stride, : ow * s.stride : s.stride]
        elif isinstance(s, Add):
            bufs[s.dst] = round_bf16(bufs[s.a] + bufs[s.b])
        elif isinstance(s, Head):
            flat = bufs[s.src].reshape(-1)
            bT = round_bf16(s.bT)
            e = np.asarray(s.b2, np.float32).copy()
            for i in range(flat.shape[0]):
                e += flat[i] * bT[i]
            return e
    raise ExportError(f"{program.name}: the program has no head step")


def export_bundle(
    network: Mapping[str, np.ndarray] | IrProgram,
    path: str | Path,
    input_chw: np.ndarray,
    *,
    model: str = "IR",
    max_icg: int = DEFAULT_MAX_ICG,
    cpu_embedding: np.ndarray | None = None,
    colour_order: ColourOrder = "rgb",
) -> Path:
    """Write `network` as an AdaFace bundle in the new directory `path`; returns it.

    network: a cvlface-style state dict (numpy arrays, any wrapper prefix) or an IrProgram.
    input_chw: float32 [3, h, w] (h = w = 112 for cvlface networks), the recorded input, in
    the network's preprocessing. model: the `model` param (e.g. IR-18). max_icg: input
    channels per conv dispatch (a positive multiple of 8). cpu_embedding: the fp32 reference
    to store (default: the folded program's f32 forward, npu.models.adaface.model.run_program).
    colour_order: the channel order the network was trained on, written as npucam's
    `colour_order` param (IRON's bundles have none; the reader then assumes rgb).
    """
    program = network if isinstance(network, IrProgram) else lower_iresnet(dict(network), model)
    if max_icg <= 0 or max_icg % 8:
        raise ExportError(f"max_icg={max_icg} is not a positive multiple of 8")
    stem = _stem_input(input_chw)
    raw = np.asarray(input_chw, np.float32)
    if cpu_embedding is None:
        cpu_embedding = run_program(program, raw, NumpyOps(program.conv_gemms()))
    npu_embedding = record_forward(program, raw, max_icg)

    ids: dict[str, int] = {}
    shapes: dict[str, tuple[int, int, int]] = {}
    kernels: dict[str, str] = {}  # ctx -> insts path

    def define(name: str, shape: tuple[int, int, int]) -> int:
        ids[name] = len(ids)
        shapes[name] = shape
        return ids[name]

    with BundleWriter(path, version=BUNDLE_VERSION) as wr:
        wr.param("model", model)
        wr.param("colour_order", parse_colour_order(colour_order, "colour_order"))
        wr.param("exporter", "npucam adaface_export (simulator kernels, blocked conv weights)")
        c, h, w = stem.shape
        wr.tensor("ref.input", to_tiled(stem), "bf16", shape=(c * h * w,))
        wr.tensor("ref.input_chw", raw.reshape(-1), "f32")
        wr.tensor("ref.cpu_embedding", np.asarray(cpu_embedding, np.float32).reshape(-1), "f32")
        wr.tensor("ref.npu_embedding", npu_embedding, "f32")
        wr.record("input", buf=define(program.input, (c, h, w)), c=c, h=h, w=w,
                  tensor="ref.input")  # fmt: skip
        for i, s in enumerate(program.steps):
            if isinstance(s, Conv):
                ict, h, w = shapes[s.src]
                wgt = _padded_weight(s, ict)
                oc, k = wgt.shape[0], wgt.shape[-1]
                wp = padded_width(w)
                groups = channel_groups(ict, max_icg)
                out = define(s.dst, (oc, h, w))
                for j, (c0, icg) in enumerate(groups):
                    ctx = f"conv_k{k}_i{icg}_o{oc}_h{h}_w{wp}"
                    if ctx not in kernels:
                        kernels[ctx] = write_conv_kernel(wr, ctx, k, h, wp, icg, oc)
                    wt = f"{s.key}.wt{j}"
                    wr.tensor(wt, pack_conv_weights(wgt[:, 8 * c0 : 8 * c0 + icg]), "bf16",
                              shape=(oc * icg * k * k,))  # fmt: skip
                    wr.record(
                        "conv", **{"in": ids[s.src]}, ict=ict, h=h, w=w, c0=c0, icg=icg, wp=wp,
                        oc=oc, oh=h, ow=w, owp=wp, ctx=ctx, insts=kernels[ctx], wt=wt, out=out,
                        first=j == 0, last=j == len(groups) - 1,
                    )  # fmt: skip
            elif isinstance(s, Affine):
                c, h, w = shapes[s.src]
                wr.tensor(f"s{i}.scale", s.scale, "bf16")
                wr.tensor(f"s{i}.shift", s.shift, "bf16")
                wr.record("affine", **{"in": ids[s.src]}, c=c, h=h, w=w, scale=f"s{i}.scale",
                          shift=f"s{i}.shift", out=define(s.dst, (c, h, w)))  # fmt: skip
            elif isinstance(s, PreluBias):
                c, h, w = shapes[s.buf]
                wr.tensor(f"s{i}.alpha", s.alpha, "bf16")
                wr.tensor(f"s{i}.bias", s.bias, "bf16")
                wr.record("prelu_bias", buf=ids[s.buf], c=c, h=h, w=w, alpha=f"s{i}.alpha",
                          bias=f"s{i}.bias")  # fmt: skip
            elif isinstance(s, Bias):
                c, h, w = shapes[s.buf]
                wr.tensor(f"s{i}.bias", s.bias, "bf16")
                wr.record("bias", buf=ids[s.buf], c=c, h=h, w=w, bias=f"s{i}.bias")
            elif isinstance(s, Subsample):
                c, h, w = shapes[s.src]
                out = define(s.dst, (c, h // s.stride, w // s.stride))
                wr.record("subsample", **{"in": ids[s.src]}, c=c, h=h, w=w, stride=s.stride,
                          out=out)  # fmt: skip
            elif isinstance(s, Add):
                c, h, w = shapes[s.a]
                wr.record("add", a=ids[s.a], b=ids[s.b], c=c, h=h, w=w,
                          out=define(s.dst, (c, h, w)))  # fmt: skip
            elif isinstance(s, Head):
                c, h, w = shapes[s.src]
                k, n = s.bT.shape
                if k != c * h * w:
                    raise ExportError(f"head: bT has {k} rows, its input is {c}x{h}x{w}")
                wr.tensor("head.bT", s.bT, "bf16")
                wr.tensor("head.b2", s.b2, "f32")
                wr.record("head", **{"in": ids[s.src]}, c=c, h=h, w=w, k=k, n=n, bT="head.bT",
                          b2="head.b2")  # fmt: skip
    return Path(path)


def export_pretrained(
    model_dir: str | Path,
    path: str | Path,
    input_chw: np.ndarray | None = None,
    max_icg: int = DEFAULT_MAX_ICG,
) -> Path:
    """export_bundle of a cvlface-style model dir (model.safetensors + optional config.json,
    read by npu.models.adaface.checkpoint.from_pretrained; `name` becomes the model param,
    `color_space` the colour_order param). Without input_chw the
    recorded input is a synthetic one: uniform(−1, 1) float32 [3, 112, 112], seed 0."""
    cpu = load_adaface(model_dir)
    if input_chw is None:
        input_chw = np.random.default_rng(0).uniform(-1, 1, (3, 112, 112)).astype(np.float32)
    return export_bundle(
        cpu.program,
        path,
        input_chw,
        model=cpu.model(),
        max_icg=max_icg,
        colour_order=cpu.colour_order(),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m npu.models.adaface_export MODEL_DIR OUT [--input X.npy] [--max-icg N]`."""
    p = argparse.ArgumentParser(
        prog="python -m npu.models.adaface_export",
        description="Write a cvlface-style AdaFace IR model as a bundle for the simulated NPU.",
    )
    p.add_argument("model_dir", help="model.safetensors (+ config.json) dir, or the file")
    p.add_argument("out", help="new bundle directory")
    p.add_argument("--input", help="recorded input: .npy float32 [3, 112, 112] (default random)")
    p.add_argument("--max-icg", type=int, default=DEFAULT_MAX_ICG, help="channels per dispatch")
    args = p.parse_args(argv)
    try:
        x = None
        if args.input:
            try:
                x = np.load(args.input, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise ExportError(f"{args.input}: not a .npy array: {exc}") from None
        out = export_pretrained(args.model_dir, args.out, x, args.max_icg)
    except NpucamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0
