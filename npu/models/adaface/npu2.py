"""AdaFace IR-18 / IR-101 on NPU2: the conv dispatches one 112 x 112 face makes at the released
sizes, as npucam's lowering and exporter lay them out (npu.models.adaface.checkpoint
`lower_iresnet`: stride 2 as a stride-1 conv then `subsample`, the 1x1 shortcut on the
subsampled input; export: one dispatch per input-channel group of at most 64, widths padded
to a multiple of 4), priced by npu.sim_cost (docs/device.md §6).

Released sizes: a 64-wide stem and four stages of widths 64, 128, 256, 512 with [2, 2, 2, 2]
(IR-18) and [3, 13, 30, 3] (IR-101) units (docs/face-id.md). taconite-adaface's README
counts 16 distinct conv kernels for each (IRON's grouping, which npucam's differs from), so
each holds the whole device: 16 contexts.
"""

from __future__ import annotations

from pathlib import Path

from npu.models.adaface.config import INPUT_SIZE
from npu.models.adaface.export import DEFAULT_MAX_ICG, STEM_CHANNELS, channel_groups, padded_width
from npu.sim_cost import ADAFACE_HOST_S, Dispatch, ModelWork, PassWork, conv, host

VARIANTS = ("ir18", "ir101")
WIDTHS = (64, 128, 256, 512)
STEM = 64
UNITS = {"ir18": (2, 2, 2, 2), "ir101": (3, 13, 30, 3)}
MODEL_NAMES = {"ir18": "IR-18", "ir101": "IR-101"}  # the bundles' `model` param
CONTEXTS = 16


def dispatches(
    units: tuple[int, ...],
    widths: tuple[int, ...] = WIDTHS,
    stem: int = STEM,
    max_icg: int = DEFAULT_MAX_ICG,
) -> list[Dispatch]:
    """One face's conv dispatches (one per input-channel group, in record order), keyed by
    the exporter's ctx names (conv_k<k>_i<icg>_o<oc>_h<h>_w<wp>)."""
    out: list[Dispatch] = []

    def convolve(k: int, size: int, ict: int, oc: int) -> None:
        wp = padded_width(size)
        for _, icg in channel_groups(ict, max_icg):
            out.append(conv(f"conv_k{k}_i{icg}_o{oc}_h{size}_w{wp}", "conv", k, size, wp, icg, oc))

    convolve(3, INPUT_SIZE, STEM_CHANNELS, stem)
    size, width = INPUT_SIZE, stem
    for n, depth in zip(units, widths, strict=True):
        for u in range(n):
            convolve(3, size, width, depth)
            convolve(3, size, depth, depth)
            if u == 0:  # a stage opens with stride 2: subsample, then the conv shortcut
                size //= 2
                if width != depth:
                    convolve(1, size, width, depth)
            width = depth
    return out


def work(variant: str) -> ModelWork:
    """The released `variant` ("ir18" or "ir101") on NPU2: one face a pass, its convs plus
    the forward's host span (glue steps and the f32 head, timed with it by taconite)."""
    if variant not in UNITS:
        raise KeyError(f"adaface has no released variant {variant!r} ({', '.join(VARIANTS)})")
    steps = (*dispatches(UNITS[variant]), host("host", ADAFACE_HOST_S))
    contexts = tuple(f"adaface-{variant}/conv{i}" for i in range(CONTEXTS))
    return ModelWork(
        f"adaface-{variant}", contexts, {"forward": PassWork("forward", 1, steps)},
        "released sizes",
    )  # fmt: skip


def variant_of_bundle(path: Path) -> str | None:
    """The released variant a bundle holds (its `model` param: IR-18 / IR-101), else None."""
    from npu.bundle import Bundle

    bundle = Bundle.open(path)
    try:
        model = bundle.param("model", str) if bundle.has_param("model") else ""
    finally:
        bundle.close()
    return next((v for v, name in MODEL_NAMES.items() if name == model), None)
