"""cvlface iresnet checkpoints (safetensors) lowered to the step program of
npu.models.adaface.model: BatchNorms folded, stride 2 as a stride-1 conv + subsample, the head
as one f32 mat-vec (docs/adaface-bundle.md); the cpu backend's loader."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from npu.models.adaface.config import BN_EPS, INPUT_SIZE, AdaFaceError, parse_colour_order
from npu.models.adaface.model import (
    AdaFaceCpu,
    Add,
    Affine,
    Bias,
    Conv,
    Head,
    IrProgram,
    PreluBias,
    Step,
    Subsample,
)


def _bn_fold(sd: dict[str, np.ndarray], prefix: str, affine: bool = True):
    """A BatchNorm's eval-mode per-channel (scale, shift) in float64."""
    try:
        mean = sd[prefix + "running_mean"].astype(np.float64)
        var = sd[prefix + "running_var"].astype(np.float64)
        if affine:
            gamma = sd[prefix + "weight"].astype(np.float64)
            beta = sd[prefix + "bias"].astype(np.float64)
        else:
            gamma, beta = np.ones_like(mean), np.zeros_like(mean)
    except KeyError as exc:
        raise AdaFaceError(f"checkpoint lacks BatchNorm tensor {exc.args[0]}") from None
    scale = gamma / np.sqrt(var + BN_EPS)
    return scale, beta - mean * scale


def _tensor(sd: dict[str, np.ndarray], key: str, ndim: int) -> np.ndarray:
    if key not in sd:
        raise AdaFaceError(f"checkpoint lacks tensor {key}")
    t = sd[key]
    if t.ndim != ndim:
        raise AdaFaceError(f"checkpoint tensor {key} has shape {t.shape}, expected {ndim} dims")
    return t


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def _strip_prefix(sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Drop a wrapper prefix ('net.', 'model.net.', ...) in front of `input_layer.0.weight`."""
    stems = [k for k in sd if k.endswith("input_layer.0.weight")]
    if len(stems) != 1:
        raise AdaFaceError(
            "not a cvlface iresnet state dict: expected one '...input_layer.0.weight', "
            f"found {len(stems)}"
        )
    prefix = stems[0][: -len("input_layer.0.weight")]
    return {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}


def _stage_starts(
    shapes: list[tuple[int, int, bool]], k: int, units: tuple[int, ...] | None
) -> set[int]:
    """The units that open a stage, i.e. have stride 2, in the IR layout (docs/face-id.md).

    shapes: per unit (input width, depth, has a conv shortcut); k: the head Linear's input
    size (width·s·s after the body); units: units per stage from the model's config, if any.
    cvlface's get_block makes each stage [unit(in, depth, stride 2)] + [unit(depth, depth,
    stride 1)] * (n - 1), so a conv shortcut (in != depth) always opens a stage and so does
    unit 0; the body divides 112 by 2 per stage, which the head's s tells. A stage keeping
    the previous stage's width opens with a MaxPool2d(1, 2) shortcut, which has no weights:
    the units can then be placed only by the config's `units`.
    """
    width = shapes[-1][1]
    side = round((k / width) ** 0.5) if width and k % width == 0 else 0
    n_stages = (INPUT_SIZE // side).bit_length() - 1 if side else -1
    if side == 0 or side * side * width != k or side << n_stages != INPUT_SIZE:
        raise AdaFaceError(
            f"output_layer.3.weight reads {k} values, not {width}·s·s with s = 112 / 2^n"
        )
    required = {0} | {i for i, (_, _, conv) in enumerate(shapes) if conv}
    for i, (w_in, depth, conv) in enumerate(shapes):
        if (w_in != depth) != conv:
            raise AdaFaceError(
                f"body.{i}: width {w_in}->{depth} "
                + ("needs a conv shortcut" if w_in != depth else "has a conv shortcut")
            )
    if units is not None:
        if sum(units) != len(shapes) or min(units, default=0) < 1:
            raise AdaFaceError(
                f"config units {list(units)} do not add up to the {len(shapes)} body units"
            )
        starts = {sum(units[:j]) for j in range(len(units))}
        if not required <= starts:
            i = min(required - starts)
            raise AdaFaceError(f"config units {list(units)}: body.{i} changes width mid-stage")
    elif len(required) == n_stages:
        starts = required
    else:
        raise AdaFaceError(
            f"the head reads a {side}x{side} map, so {n_stages} units have stride 2, but the "
            f"weights show only {len(required)} stage starts (unit 0 and the conv shortcuts): "
            "a stage keeps its predecessor's width; give config.json units per stage"
        )
    if len(starts) != n_stages:
        raise AdaFaceError(
            f"{len(starts)} stages halve 112 to {INPUT_SIZE >> len(starts)}, but the head "
            f"reads a {side}x{side} map"
        )
    return starts


def lower_iresnet(
    state_dict: dict[str, np.ndarray], name: str = "IR", units: tuple[int, ...] | None = None
) -> IrProgram:
    """A cvlface iresnet state dict (numpy arrays) -> its IrProgram.

    Widths and units per stage are read from the weights (IR-18 is [2,2,2,2], IR-101
    [3,13,30,3] at widths 64..512; smaller test networks work the same); which units have
    stride 2 follows the IR layout (see _stage_starts), or `units` (per stage) when given.
    A stride-2 unit runs its convs at stride 1 and then subsamples with floor(h / 2) rows, as
    the bundle's `subsample` step.
    """
    sd = _strip_prefix(state_dict)
    steps: list[Step] = []
    stem_w = _tensor(sd, "input_layer.0.weight", 4)
    if stem_w.shape[1] != 3 or stem_w.shape[2:] != (3, 3):
        raise AdaFaceError(f"stem conv must be [C, 3, 3, 3], got {stem_w.shape}")
    scale, shift = _bn_fold(sd, "input_layer.1.")
    steps.append(Conv("input", "x0", "stem", _f32(stem_w * scale[:, None, None, None])))
    steps.append(PreluBias("x0", _f32(_tensor(sd, "input_layer.2.weight", 1)), _f32(shift)))

    shapes: list[tuple[int, int, bool]] = []
    width = stem_w.shape[0]
    while f"body.{len(shapes)}.res_layer.1.weight" in sd:
        p = f"body.{len(shapes)}."
        w1 = _tensor(sd, p + "res_layer.1.weight", 4)
        w2 = _tensor(sd, p + "res_layer.4.weight", 4)
        depth = w1.shape[0]
        if w1.shape[1] != width or w2.shape[:2] != (depth, depth):
            raise AdaFaceError(f"{p}res_layer: conv shapes {w1.shape}, {w2.shape} do not chain")
        shapes.append((width, depth, p + "shortcut_layer.0.weight" in sd))
        width = depth
    if not shapes:
        raise AdaFaceError("checkpoint has no body units (body.0.res_layer.1.weight)")
    lin_w = _tensor(sd, "output_layer.3.weight", 2).astype(np.float64)
    starts = _stage_starts(shapes, lin_w.shape[1], units)

    cur, size = "x0", INPUT_SIZE
    stage_units: list[int] = []
    widths: list[int] = []
    for i, (width, depth, has_conv_shortcut) in enumerate(shapes):
        p = f"body.{i}."
        stride = 2 if i in starts else 1
        if stride == 2:
            stage_units.append(0)
            widths.append(depth)
            size //= 2
        stage_units[-1] += 1

        scale, shift = _bn_fold(sd, p + "res_layer.0.")
        steps.append(Affine(cur, f"u{i}.bn", _f32(scale), _f32(shift)))
        scale, shift = _bn_fold(sd, p + "res_layer.2.")
        w1 = sd[p + "res_layer.1.weight"]
        steps.append(
            Conv(f"u{i}.bn", f"u{i}.c1", f"u{i}.conv1", _f32(w1 * scale[:, None, None, None]))
        )
        alpha = _f32(_tensor(sd, p + "res_layer.3.weight", 1))
        steps.append(PreluBias(f"u{i}.c1", alpha, _f32(shift)))
        scale, shift = _bn_fold(sd, p + "res_layer.5.")
        w2 = sd[p + "res_layer.4.weight"]
        steps.append(
            Conv(f"u{i}.c1", f"u{i}.c2", f"u{i}.conv2", _f32(w2 * scale[:, None, None, None]))
        )
        steps.append(Bias(f"u{i}.c2", _f32(shift)))
        res = f"u{i}.c2"
        if stride == 2:
            steps.append(Subsample(res, f"u{i}.res", 2))
            res = f"u{i}.res"

        short = cur
        if stride == 2:
            steps.append(Subsample(cur, f"u{i}.sub", 2))
            short = f"u{i}.sub"
        if has_conv_shortcut:
            ws = _tensor(sd, p + "shortcut_layer.0.weight", 4)
            if ws.shape != (depth, width, 1, 1):
                raise AdaFaceError(f"{p}shortcut_layer.0.weight: shape {ws.shape}")
            scale, shift = _bn_fold(sd, p + "shortcut_layer.1.")
            steps.append(
                Conv(short, f"u{i}.sc", f"u{i}.shortcut", _f32(ws * scale[:, None, None, None]))
            )
            steps.append(Bias(f"u{i}.sc", _f32(shift)))
            short = f"u{i}.sc"
        steps.append(Add(res, short, f"u{i}.out"))
        cur = f"u{i}.out"
    width = shapes[-1][1]

    lin_b = _tensor(sd, "output_layer.3.bias", 1).astype(np.float64)
    s2, t2 = _bn_fold(sd, "output_layer.0.")
    s1, t1 = _bn_fold(sd, "output_layer.4.", affine=False)
    per_flat_scale = np.repeat(s2, size * size)
    per_flat_shift = np.repeat(t2, size * size)
    w = lin_w * per_flat_scale[None, :]
    b = lin_b + lin_w @ per_flat_shift
    bT = (w * s1[:, None]).T
    b2 = b * s1 + t1
    steps.append(Head(cur, _f32(bT), _f32(b2)))
    return IrProgram(name, tuple(stage_units), tuple(widths), steps)


def _load_safetensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, TypeError) as exc:
        raise AdaFaceError(f"{path}: cannot read safetensors: {exc}") from exc


def from_pretrained(model_dir: str | Path) -> AdaFaceCpu:
    """Load a cvlface-style dir: model.safetensors (or one *.safetensors) and optional
    config.json ({"color_space": "RGB"|"BGR", "name": ..., "units": [per stage]}; units
    is needed only when a stage keeps its predecessor's width). A .safetensors file works
    too.
    """
    path = Path(model_dir)
    config: dict = {}
    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if (path / "model.safetensors").is_file():
            files = [path / "model.safetensors"]
        if len(files) != 1:
            raise AdaFaceError(
                f"{path}: expected model.safetensors (or exactly one *.safetensors), "
                f"found {[f.name for f in files]}"
            )
        weights = files[0]
        cfg_path = path / "config.json"
        if cfg_path.is_file():
            try:
                config = json.loads(cfg_path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise AdaFaceError(f"{cfg_path}: not valid JSON: {exc}") from exc
            if not isinstance(config, dict):
                raise AdaFaceError(f"{cfg_path}: expected a JSON object")
    elif path.is_file():
        weights = path
    else:
        raise AdaFaceError(f"{path}: no such model directory or file")
    space = parse_colour_order(
        str(config.get("color_space", "RGB")), f"{path}: config.json color_space"
    )
    units = config.get("units")
    if units is not None and not (
        isinstance(units, list) and all(type(n) is int and n > 0 for n in units)
    ):
        raise AdaFaceError(f"{path}: config.json units must be a list of positive integers")
    try:
        program = lower_iresnet(
            _load_safetensors(weights),
            str(config.get("name", "IR")),
            None if units is None else tuple(units),
        )
    except AdaFaceError as exc:
        raise AdaFaceError(f"{weights}: {exc}") from None
    return AdaFaceCpu(program, space)
