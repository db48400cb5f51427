"""AdaFace IR-18 / IR-101 (cvlface iresnet) as a program of taconite-adaface steps.

The network of spec adaface-clip-align.md a.7 (cvlface's `Backbone` with `BasicBlockIR`
units) is lowered to the step records of spec a.2: `affine` (a unit's leading BN),
`conv` (stride 1, BN folded into its weights) + `prelu_bias` or `bias`, `subsample` (stride
2), `add` and `head` (BN2d + Linear + BN1d folded into one f32 mat-vec). The cpu backend
(`AdaFaceCpu`) runs that program in float32, each conv as im2col + `ops.gemm`, matching the
torch module up to float32 rounding. `AdaFaceBundle` replays a bundle's steps on a device
(sim or xrt) with the bf16 tiled numerics of spec a.3, as taconite-adaface's IrEmbedder.
Both return the un-normalised 512-d embedding, as cvlface's Backbone and taconite's head do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from npu.ops import GemmWeights, NumpyOps, Ops
from pipeline.errors import NpucamError

ColourOrder = Literal["rgb", "bgr"]
BN_EPS = 1e-5  # torch BatchNorm's default, used by cvlface's iresnet
INPUT_SIZE = 112


class AdaFaceError(NpucamError):
    """A checkpoint that is not a cvlface-style IR network, or an input the forward rejects."""


# ---- the step program (the records of spec a.2, with f32 parameters) -----------------------


@dataclass(frozen=True)
class Affine:
    """out = x·scale + shift per channel (a unit's leading BatchNorm)."""

    src: str
    dst: str
    scale: np.ndarray
    shift: np.ndarray


@dataclass(frozen=True)
class Conv:
    """dst = conv(src) with stride 1 and padding k//2, no bias; weights float32 [O, I, k, k]."""

    src: str
    dst: str
    key: str
    weight: np.ndarray


@dataclass(frozen=True)
class PreluBias:
    """In place: prelu(x + bias) with per-channel alpha (a folded BN shift, then PReLU)."""

    buf: str
    alpha: np.ndarray
    bias: np.ndarray


@dataclass(frozen=True)
class Bias:
    """In place: x + bias per channel (a folded BN shift)."""

    buf: str
    bias: np.ndarray


@dataclass(frozen=True)
class Subsample:
    """dst = src[:, ::stride, ::stride] (a stride-2 conv's or MaxPool2d(1, 2)'s output)."""

    src: str
    dst: str
    stride: int


@dataclass(frozen=True)
class Add:
    """dst = a + b (a unit's residual + shortcut)."""

    a: str
    b: str
    dst: str


@dataclass(frozen=True)
class Head:
    """e = b2 + flatten(src)·bT, flatten in (c, h, w) order; bT float32 [k, n], b2 [n]."""

    src: str
    bT: np.ndarray
    b2: np.ndarray


Step = Affine | Conv | PreluBias | Bias | Subsample | Add | Head


@dataclass
class IrProgram:
    """A lowered IR network: its steps in order, the input buffer name and its meta data."""

    name: str
    units: tuple[int, ...]
    widths: tuple[int, ...]
    steps: list[Step] = field(default_factory=list)
    input: str = "input"

    @property
    def embed_dim(self) -> int:
        head = self.steps[-1]
        assert isinstance(head, Head)
        return int(head.b2.shape[0])

    def conv_gemms(self) -> dict[str, GemmWeights]:
        """Every conv as a GEMM over im2col rows: w float32 [I·k·k, O], bound by key."""
        out = {}
        for s in self.steps:
            if isinstance(s, Conv):
                o = s.weight.shape[0]
                out[s.key] = GemmWeights(np.ascontiguousarray(s.weight.reshape(o, -1).T))
        return out


# ---- lowering a cvlface state dict ---------------------------------------------------------


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


def lower_iresnet(state_dict: dict[str, np.ndarray], name: str = "IR") -> IrProgram:
    """A cvlface iresnet state dict (numpy arrays) -> its IrProgram.

    Widths and units per stage are read from the weights (IR-18 is [2,2,2,2], IR-101
    [3,13,30,3] at widths 64..512; smaller test networks work the same). A unit whose first
    conv changes the spatial size is the first of its stage and has stride 2.
    """
    sd = _strip_prefix(state_dict)
    steps: list[Step] = []
    stem_w = _tensor(sd, "input_layer.0.weight", 4)
    if stem_w.shape[1] != 3 or stem_w.shape[2:] != (3, 3):
        raise AdaFaceError(f"stem conv must be [C, 3, 3, 3], got {stem_w.shape}")
    scale, shift = _bn_fold(sd, "input_layer.1.")
    steps.append(Conv("input", "x0", "stem", _f32(stem_w * scale[:, None, None, None])))
    steps.append(PreluBias("x0", _f32(_tensor(sd, "input_layer.2.weight", 1)), _f32(shift)))

    n_units = 0
    while f"body.{n_units}.res_layer.1.weight" in sd:
        n_units += 1
    if n_units == 0:
        raise AdaFaceError("checkpoint has no body units (body.0.res_layer.1.weight)")

    cur, width, size = "x0", stem_w.shape[0], INPUT_SIZE
    units: list[int] = []
    widths: list[int] = []
    for i in range(n_units):
        p = f"body.{i}."
        w1 = _tensor(sd, p + "res_layer.1.weight", 4)
        w2 = _tensor(sd, p + "res_layer.4.weight", 4)
        depth = w1.shape[0]
        if w1.shape[1] != width or w2.shape[:2] != (depth, depth):
            raise AdaFaceError(f"{p}res_layer: conv shapes {w1.shape}, {w2.shape} do not chain")
        has_conv_shortcut = p + "shortcut_layer.0.weight" in sd
        # cvlface starts each stage with a stride-2 unit: a new width, or the very first unit
        stride = 2 if (i == 0 or depth != width) else 1
        if stride == 2:
            units.append(0)
            widths.append(depth)
            size //= 2
        units[-1] += 1
        if depth != width and not has_conv_shortcut:
            raise AdaFaceError(f"{p}: width {width}->{depth} needs a conv shortcut")

        scale, shift = _bn_fold(sd, p + "res_layer.0.")
        steps.append(Affine(cur, f"u{i}.bn", _f32(scale), _f32(shift)))
        scale, shift = _bn_fold(sd, p + "res_layer.2.")
        steps.append(
            Conv(f"u{i}.bn", f"u{i}.c1", f"u{i}.conv1", _f32(w1 * scale[:, None, None, None]))
        )
        alpha = _f32(_tensor(sd, p + "res_layer.3.weight", 1))
        steps.append(PreluBias(f"u{i}.c1", alpha, _f32(shift)))
        scale, shift = _bn_fold(sd, p + "res_layer.5.")
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
        cur, width = f"u{i}.out", depth

    lin_w = _tensor(sd, "output_layer.3.weight", 2).astype(np.float64)
    lin_b = _tensor(sd, "output_layer.3.bias", 1).astype(np.float64)
    k = width * size * size
    if lin_w.shape[1] != k:
        raise AdaFaceError(
            f"output_layer.3.weight is {lin_w.shape}; the body ends at {width}x{size}x{size}"
        )
    s2, t2 = _bn_fold(sd, "output_layer.0.")
    s1, t1 = _bn_fold(sd, "output_layer.4.", affine=False)
    per_flat_scale = np.repeat(s2, size * size)
    per_flat_shift = np.repeat(t2, size * size)
    w = lin_w * per_flat_scale[None, :]
    b = lin_b + lin_w @ per_flat_shift
    bT = (w * s1[:, None]).T
    b2 = b * s1 + t1
    steps.append(Head(cur, _f32(bT), _f32(b2)))
    return IrProgram(name, tuple(units), tuple(widths), steps)


# ---- the f32 executor ----------------------------------------------------------------------


def im2col(x: np.ndarray, k: int) -> np.ndarray:
    """x: float32 [C, H, W] -> float32 [H·W, C·k·k] patches for a stride-1, pad k//2 conv.

    Column order (c, ky, kx) matches a torch weight [O, C, k, k] reshaped to [O, C·k·k].
    """
    c, h, w = x.shape
    if k == 1:
        return x.reshape(c, h * w).T
    p = k // 2
    xp = np.pad(x, ((0, 0), (p, p), (p, p)))
    cols = np.empty((c, k, k, h, w), dtype=np.float32)
    for dy in range(k):
        for dx in range(k):
            cols[:, dy, dx] = xp[:, dy : dy + h, dx : dx + w]
    return cols.reshape(c * k * k, h * w).T


def run_program(program: IrProgram, x: np.ndarray, ops: Ops) -> np.ndarray:
    """Run program in float32 on input x: float32 [3, 112, 112] -> float32 [embed_dim]."""
    bufs: dict[str, np.ndarray] = {program.input: x}
    for s in program.steps:
        if isinstance(s, Conv):
            src = bufs[s.src]
            _, h, w = src.shape
            out = ops.gemm(s.key, im2col(src, s.weight.shape[-1]))
            bufs[s.dst] = np.ascontiguousarray(out.T.reshape(-1, h, w))
        elif isinstance(s, Affine):
            bufs[s.dst] = bufs[s.src] * s.scale[:, None, None] + s.shift[:, None, None]
        elif isinstance(s, PreluBias):
            t = bufs[s.buf] + s.bias[:, None, None]
            bufs[s.buf] = np.where(t < 0, t * s.alpha[:, None, None], t)
        elif isinstance(s, Bias):
            bufs[s.buf] = bufs[s.buf] + s.bias[:, None, None]
        elif isinstance(s, Subsample):
            bufs[s.dst] = bufs[s.src][:, :: s.stride, :: s.stride]
        elif isinstance(s, Add):
            bufs[s.dst] = bufs[s.a] + bufs[s.b]
        elif isinstance(s, Head):
            flat = bufs[s.src].reshape(-1).astype(np.float32)
            return (s.b2 + flat @ s.bT).astype(np.float32)
    raise AdaFaceError(f"{program.name}: program has no head step")


# ---- the loaded model ----------------------------------------------------------------------


def head_fingerprint(b2: np.ndarray) -> str:
    """12 hex digits identifying a model by its head bias (rounded to bf16, so a cpu model and
    a bundle exported from the same weights agree): galleries record it."""
    import hashlib

    from npu.bf16 import f32_to_bf16

    return hashlib.sha256(f32_to_bf16(np.asarray(b2, np.float32)).tobytes()).hexdigest()[:12]


def l2_normalize(e: np.ndarray) -> np.ndarray:
    """e: float [..., D] -> float32 rows scaled to unit L2 norm (all-zero rows stay zero)."""
    e = np.asarray(e, dtype=np.float32)
    n = np.linalg.norm(e, axis=-1, keepdims=True)
    return (e / np.where(n > 0, n, 1)).astype(np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """f64 dot / (|a| |b|); 0.0 if either is all zero (as taconite's cosine)."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return 0.0 if na == 0 or nb == 0 else float(a @ b / (na * nb))


def _load_safetensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, TypeError) as exc:
        raise AdaFaceError(f"{path}: cannot read safetensors: {exc}") from exc


class AdaFaceCpu:
    """AdaFace on the cpu backend: `embed(chw) -> float32 [512]`, one face per call.

    colour_order is the channel order the backbone was trained on ("rgb" for cvlface's
    ir18/ir101 configs; "bgr" for the original AdaFace .ckpt weights): callers convert the
    aligned crop to it before `stages.align.embedder_input`.
    """

    backend = "cpu"

    def __init__(self, program: IrProgram, colour_order: ColourOrder = "rgb") -> None:
        self.program = program
        self.colour_order = colour_order
        self.model = program.name
        self._ops = NumpyOps(program.conv_gemms())

    @property
    def embed_dim(self) -> int:
        return self.program.embed_dim

    @property
    def fingerprint(self) -> str:
        head = self.program.steps[-1]
        assert isinstance(head, Head)
        return f"{self.model}:{head_fingerprint(head.b2)}"

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> AdaFaceCpu:
        """Load a cvlface-style dir: model.safetensors (or one *.safetensors) and optional
        config.json ({"color_space": "RGB"|"BGR", "name": ...}). A .safetensors file works too.
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
        space = str(config.get("color_space", "RGB")).lower()
        if space not in ("rgb", "bgr"):
            raise AdaFaceError(f"{path}: config.json color_space must be RGB or BGR: {space!r}")
        try:
            program = lower_iresnet(_load_safetensors(weights), str(config.get("name", "IR")))
        except AdaFaceError as exc:
            raise AdaFaceError(f"{weights}: {exc}") from None
        return cls(program, space)  # type: ignore[arg-type]

    def embed(self, chw: np.ndarray) -> np.ndarray:
        """chw: float32 [3, 112, 112], ((x/255) − 0.5)/0.5 in `colour_order` -> float32 [D]."""
        x = np.asarray(chw)
        if x.shape != (3, INPUT_SIZE, INPUT_SIZE):
            raise AdaFaceError(f"input must be [3, 112, 112], got {x.shape}")
        if not np.all(np.isfinite(x)):
            raise AdaFaceError("input contains NaN or infinite values")
        return run_program(self.program, x.astype(np.float32), self._ops)

    def embed_normalized(self, chw: np.ndarray) -> np.ndarray:
        """`embed` scaled to unit L2 norm: float32 [D]."""
        return l2_normalize(self.embed(chw))


# ---- the bundle step interpreter (spec a.2-a.3) on a device (sim or xrt) -------------------
#
# Activations live on the host as float32 arrays holding bf16-exact values, tiled
# [H, C/8, W, 8]: element (ch, y, x) at ((y·(C/8) + ch/8)·W + x)·8 + ch%8.


def to_tiled(chw: np.ndarray) -> np.ndarray:
    """float [C, H, W] (C % 8 == 0) -> float32 tiled [H, C/8, W, 8] (same values)."""
    c, h, w = chw.shape
    return np.ascontiguousarray(
        np.asarray(chw, np.float32).reshape(c // 8, 8, h, w).transpose(2, 0, 3, 1)
    )


def from_tiled(t: np.ndarray) -> np.ndarray:
    """float32 tiled [H, C/8, W, 8] -> float32 [C, H, W]."""
    h, g, w, _ = t.shape
    return np.ascontiguousarray(t.transpose(1, 3, 0, 2).reshape(g * 8, h, w))


def _lanes(v: np.ndarray) -> np.ndarray:
    """Per-channel float [C] -> [1, C/8, 1, 8], broadcastable over a tiled activation."""
    return np.asarray(v, np.float32).reshape(1, -1, 1, 8)


# the positional fields of a `conv` record, in order (spec a.2)
CONV_FIELDS = (
    "in", "ict", "h", "w", "c0", "icg", "wp", "oc", "oh", "ow", "owp", "ctx", "insts", "wt",
    "out", "first", "last",
)  # fmt: skip


@dataclass(frozen=True)
class ConvRecord:
    """One `conv` dispatch: input-channel group [8·c0, 8·c0 + icg) of `src` (ict, h, w)."""

    line: int
    src: str
    ict: int
    h: int
    w: int
    c0: int
    icg: int
    wp: int
    oc: int
    oh: int
    ow: int
    owp: int
    ctx: str
    insts: str
    wt: str
    dst: str
    first: bool
    last: bool


def conv_kernel_size(wt_elems: int, oc: int, icg: int) -> int:
    """The sim's conv ABI: wt is bf16 [oc, icg, k, k]; k from its element count (0 if none)."""
    k2, rem = divmod(wt_elems, oc * icg)
    k = int(round(k2**0.5))
    return k if rem == 0 and k * k == k2 and k % 2 == 1 else 0


def _sim_conv_factory():
    from npu.bf16 import bf16_to_f32, f32_to_bf16
    from npu.device import DeviceError
    from npu.sim import sim_kernel

    @sim_kernel("conv")
    class SimConv:
        """A stride-1 'same' conv over one input-channel group, args (input, wt, output).

        input bf16 tiled [h, icg/8, wp, 8] (columns >= w are zero); wt bf16 [oc, icg, k, k]
        (the simulator's layout: IRON's packed conv weights are unpublished, spec Q3);
        output bf16 tiled [h, oc/8, owp, 8] with owp == wp. f32 accumulation, output
        rounded to bf16, so each group's partial is bf16 (spec a.3). Fields: icg h wp oc
        owp k, set by the AdaFace step interpreter from the `conv` record.
        """

        def __init__(self, spec) -> None:
            self.icg, self.h, self.wp = spec.get_int("icg"), spec.get_int("h"), spec.get_int("wp")
            self.oc, self.owp, self.k = spec.get_int("oc"), spec.get_int("owp"), spec.get_int("k")
            if self.k == 0:
                raise DeviceError(
                    f"{spec.where()}: conv weights are not the simulator's bf16 [oc, icg, k, k]"
                    " layout (an IRON hardware bundle runs on --backend npu only)"
                )
            self.arg_bytes = (
                self.h * self.icg * self.wp * 2,
                self.oc * self.icg * self.k * self.k * 2,
                self.h * self.oc * self.owp * 2,
            )
            self.flops = 2 * self.h * self.wp * self.oc * self.icg * self.k * self.k
            self._w: tuple[tuple[int, int], np.ndarray] | None = None

        def execute(self, args, insts) -> None:
            tag = (args[1].id, args[1].root.version)
            if self._w is None or self._w[0] != tag:
                w = bf16_to_f32(args[1].array(np.uint16, (self.oc, self.icg * self.k * self.k)))
                self._w = (tag, np.ascontiguousarray(w.T))
            x = bf16_to_f32(args[0].array(np.uint16, (self.h, self.icg // 8, self.wp, 8)))
            cols = im2col(from_tiled(x), self.k)
            y = (cols @ self._w[1]).T.reshape(self.oc, self.h, self.wp)
            out = np.zeros((self.oc, self.h, self.owp), np.float32)
            out[:, :, : min(self.wp, self.owp)] = y[:, :, : self.owp]
            args[2].array(np.uint16)[: out.size] = f32_to_bf16(to_tiled(out)).reshape(-1)

    return SimConv


class AdaFaceBundle:
    """An AdaFace bundle replayed step by step on a device (taconite's IrEmbedder).

    `load(dir, device)` parses and checks every step and tensor (errors name the manifest
    line); kernels load on the first forward. `embed(chw)` takes float32 [c, 112, 112] CHW
    (c <= 8; missing stem channels are zero) in the bundle's documented order (cvlface
    RGB, spec Q1 open) and returns the un-normalised f32 embedding. One face per call; not
    thread-safe (one embedder per device).
    """

    def __init__(self, bundle, device, steps: list, input_step: tuple) -> None:
        self.bundle = bundle
        self.device = device
        self.backend = getattr(device, "backend", "npu")
        self.steps = steps
        self._input = input_step  # (record line, buf, c, h, w, tensor)
        self.model = bundle.param("model") if bundle.has_param("model") else "IR"
        self.colour_order: ColourOrder = "rgb"  # as taconite documents it (spec Q1 is open)
        self._kernels: dict[int, tuple] = {}

    # loading and checking

    @classmethod
    def load(cls, path: str | Path, device) -> AdaFaceBundle:
        from npu.bundle import Bundle

        _sim_conv_factory()  # make sure the simulator knows `conv`
        bundle = Bundle.open(path, version=1)
        shapes: dict[str, tuple[int, int, int]] = {}
        steps: list = []
        input_step = None
        pending: dict[str, tuple[int, int, int]] = {}

        def shape_of(r, name: str, want: tuple[int, int, int]) -> None:
            if name not in shapes:
                raise r.error(f"buffer {name} is not defined before use")
            if shapes[name] != want:
                raise r.error(f"buffer {name} has shape {shapes[name]}, the step says {want}")

        def bf16_tensor(r, name: str, elems: int) -> np.ndarray:
            try:
                return bundle.f32(bundle.expect(name, "bf16", elems).name).reshape(-1)
            except NpucamError as exc:
                raise r.error(str(exc)) from None

        for r in bundle.records:

            def u(i: int, r=r) -> int:
                return r.field_as(i, int)

            def s(i: int, r=r) -> str:
                return r.field_as(i, str)

            if r.tag == "input":
                if input_step is not None:
                    raise r.error("a second input step (there must be exactly one)")
                buf, c, h, w, tensor = s(0), u(1), u(2), u(3), s(4)
                if c == 0 or c % 8:
                    raise r.error(f"input channels {c} must be a positive multiple of 8")
                ref = bf16_tensor(r, tensor, c * h * w)
                shapes[buf] = (c, h, w)
                input_step = (r.line, buf, c, h, w, ref)
            elif r.tag == "conv":
                vals = {n: (s(i) if n in ("in", "ctx", "insts", "wt", "out") else u(i))
                        for i, n in enumerate(CONV_FIELDS)}  # fmt: skip
                cr = ConvRecord(
                    r.line, vals["in"], vals["ict"], vals["h"], vals["w"], vals["c0"],
                    vals["icg"], vals["wp"], vals["oc"], vals["oh"], vals["ow"], vals["owp"],
                    vals["ctx"], vals["insts"], vals["wt"], vals["out"], vals["first"] == 1,
                    vals["last"] == 1,
                )  # fmt: skip
                checks = (
                    (cr.icg > 0 and cr.icg % 8 == 0, f"icg {cr.icg}: not a positive multiple of 8"),
                    (8 * cr.c0 + cr.icg <= cr.ict, f"group 8*{cr.c0}+{cr.icg} > ict {cr.ict}"),
                    (cr.oc > 0 and cr.oc % 8 == 0, f"oc {cr.oc}: not a positive multiple of 8"),
                    (cr.wp >= cr.w, f"wp {cr.wp} < w {cr.w}"),
                    (cr.owp >= cr.ow, f"owp {cr.owp} < ow {cr.ow}"),
                    ({vals["first"], vals["last"]} <= {0, 1}, "first/last must be 0 or 1"),
                )
                for ok, what in checks:
                    if not ok:
                        raise r.error(what)
                shape_of(r, cr.src, (cr.ict, cr.h, cr.w))
                bundle.xclbin(cr.ctx)  # a BundleError naming the key if it is missing
                r.confined(cr.insts)
                if cr.first:
                    pending[cr.dst] = (cr.oc, cr.oh, cr.owp)
                elif pending.get(cr.dst) != (cr.oc, cr.oh, cr.owp):
                    raise r.error(f"conv into {cr.dst} continues no open accumulation")
                try:
                    wt = bundle.entry(cr.wt)
                except NpucamError as exc:
                    raise r.error(str(exc)) from None
                if wt.dtype != "bf16":
                    raise r.error(f"conv weights {cr.wt} must be bf16")
                if cr.last:
                    pending.pop(cr.dst)
                    shapes[cr.dst] = (cr.oc, cr.oh, cr.ow)
                steps.append(("conv", cr, wt.elems))
            elif r.tag == "affine":
                src, c, h, w, sc, sh, dst = s(0), u(1), u(2), u(3), s(4), s(5), s(6)
                shape_of(r, src, (c, h, w))
                steps.append(("affine", src, dst, bf16_tensor(r, sc, c), bf16_tensor(r, sh, c)))
                shapes[dst] = (c, h, w)
            elif r.tag == "prelu_bias":
                buf, c, h, w, al, bi = s(0), u(1), u(2), u(3), s(4), s(5)
                shape_of(r, buf, (c, h, w))
                steps.append(("prelu_bias", buf, bf16_tensor(r, al, c), bf16_tensor(r, bi, c)))
            elif r.tag == "bias":
                buf, c, h, w, bi = s(0), u(1), u(2), u(3), s(4)
                shape_of(r, buf, (c, h, w))
                steps.append(("bias", buf, bf16_tensor(r, bi, c)))
            elif r.tag == "subsample":
                src, c, h, w, stride, dst = s(0), u(1), u(2), u(3), u(4), s(5)
                if stride == 0:
                    raise r.error("subsample stride must be > 0")
                shape_of(r, src, (c, h, w))
                steps.append(("subsample", src, dst, stride))
                shapes[dst] = (c, -(-h // stride), -(-w // stride))
            elif r.tag == "add":
                a, b, c, h, w, dst = s(0), s(1), u(2), u(3), u(4), s(5)
                shape_of(r, a, (c, h, w))
                shape_of(r, b, (c, h, w))
                steps.append(("add", a, b, dst))
                shapes[dst] = (c, h, w)
            elif r.tag == "head":
                src, c, h, w, k, n, bt, b2 = s(0), u(1), u(2), u(3), u(4), u(5), s(6), s(7)
                if k != c * h * w:
                    raise r.error(f"head k {k} != c*h*w {c * h * w}")
                shape_of(r, src, (c, h, w))
                try:
                    b2v = bundle.array(bundle.expect(b2, "f32", n).name).astype(np.float32)
                except NpucamError as exc:
                    raise r.error(str(exc)) from None
                bT = bf16_tensor(r, bt, k * n).reshape(k, n)
                steps.append(("head", src, bT, b2v.reshape(-1)))
            else:
                raise r.error(f"unknown AdaFace step {r.tag!r}")
        if input_step is None:
            raise AdaFaceError(f"{path}: the bundle has no input step")
        if not steps or steps[-1][0] != "head":
            raise AdaFaceError(f"{path}: the last step must be a head")
        return cls(bundle, device, steps, input_step)

    # running

    @property
    def input_dims(self) -> tuple[int, int, int]:
        _, _, c, h, w, _ = self._input
        return c, h, w

    @property
    def embed_dim(self) -> int:
        return int(self.steps[-1][3].shape[0])

    @property
    def fingerprint(self) -> str:
        return f"{self.model}:{head_fingerprint(self.steps[-1][3])}"

    @property
    def num_conv_dispatches(self) -> int:
        return sum(1 for s in self.steps if s[0] == "conv")

    def _kernel(self, cr: ConvRecord, wt_elems: int):
        """(kernel, input buf, wt buf, output buf) of a conv record; loaded on first use."""
        if cr.line in self._kernels:
            return self._kernels[cr.line]
        from npu.device import KernelSpec

        x = self.bundle.xclbin(cr.ctx)
        insts_path = self.bundle.path(cr.insts)
        try:
            insts = insts_path.read_bytes()
        except OSError as exc:
            raise AdaFaceError(f"{insts_path}: {exc.strerror or exc}") from None
        k = conv_kernel_size(wt_elems, cr.oc, cr.icg)
        spec = KernelSpec(
            key=f"conv@{cr.line}",
            kind="conv",
            xclbin=x.path,
            kernel_name=x.kernel,
            insts=insts,
            fields={
                "icg": str(cr.icg),
                "h": str(cr.h),
                "wp": str(cr.wp),
                "oc": str(cr.oc),
                "owp": str(cr.owp),
                "k": str(k),
            },  # fmt: skip
            source=f"manifest.txt:{cr.line}",
        )
        dev = self.device
        kernel = dev.load(spec)
        xin = dev.alloc(cr.h * cr.icg * cr.wp * 2)
        wt = dev.alloc(wt_elems * 2)
        wt.write(self.bundle.view(cr.wt, "bf16"))
        dev.to_device(wt)
        out = dev.alloc(cr.oh * cr.oc * cr.owp * 2)
        self._kernels[cr.line] = (kernel, xin, wt, out)
        return self._kernels[cr.line]

    def _run(self, tiled_input: np.ndarray, trace: dict | None = None) -> np.ndarray:
        from npu.bf16 import bf16_to_f32, f32_to_bf16, round_bf16

        _, buf, *_ = self._input
        bufs: dict[str, np.ndarray] = {buf: tiled_input} if trace is None else trace
        bufs[buf] = tiled_input
        acc: dict[str, np.ndarray] = {}
        for step in self.steps:
            op = step[0]
            if op == "conv":
                cr, wt_elems = step[1], step[2]
                kernel, xin, wt, out = self._kernel(cr, wt_elems)
                g0 = cr.c0
                x = np.zeros((cr.h, cr.icg // 8, cr.wp, 8), np.float32)
                x[:, :, : cr.w] = bufs[cr.src][:, g0 : g0 + cr.icg // 8]
                xin.write(f32_to_bf16(x))
                self.device.to_device(xin)
                self.device.run(kernel, [xin, wt, out])
                self.device.from_device(out)
                part = bf16_to_f32(out.array(np.uint16, (cr.oh, cr.oc // 8, cr.owp, 8)))
                if cr.first:
                    acc[cr.dst] = np.zeros_like(part)
                acc[cr.dst] += part
                if cr.last:
                    bufs[cr.dst] = round_bf16(np.ascontiguousarray(acc.pop(cr.dst)[:, :, : cr.ow]))
            elif op == "affine":
                _, src, dst, scale, shift = step
                bufs[dst] = round_bf16(bufs[src] * _lanes(scale) + _lanes(shift))
            elif op == "prelu_bias":
                _, b, alpha, bias = step
                t = round_bf16(bufs[b] + _lanes(bias))
                bufs[b] = round_bf16(np.where(t < 0, _lanes(alpha) * t, t))
            elif op == "bias":
                _, b, bias = step
                bufs[b] = round_bf16(bufs[b] + _lanes(bias))
            elif op == "subsample":
                _, src, dst, stride = step
                bufs[dst] = np.ascontiguousarray(bufs[src][::stride, :, ::stride])
            elif op == "add":
                _, a, b, dst = step
                bufs[dst] = round_bf16(bufs[a] + bufs[b])
            elif op == "head":
                _, src, bT, b2 = step
                flat = from_tiled(bufs[src]).reshape(-1)
                return (b2 + flat @ bT).astype(np.float32)
        raise AdaFaceError("bundle ended without a head step")

    def embed(self, chw: np.ndarray, trace: dict | None = None) -> np.ndarray:
        """chw: float32 CHW [c, h, w] (c <= the input step's channels) -> float32 [embed_dim].

        trace: if given, filled with every buffer by name (float32 tiled [H, C/8, W, 8]).
        """
        from npu.bf16 import round_bf16

        c_in, h, w = self.input_dims
        x = np.asarray(chw, np.float32).reshape(-1)
        if x.size == 0 or x.size % (h * w) or x.size // (h * w) > c_in:
            raise AdaFaceError(f"input of {x.size} values is not c x {h} x {w} with c <= {c_in}")
        if not np.all(np.isfinite(x)):
            raise AdaFaceError("input contains NaN or infinite values")
        full = np.zeros((c_in, h, w), np.float32)
        full[: x.size // (h * w)] = x.reshape(-1, h, w)
        return self._run(round_bf16(to_tiled(full)), trace)

    def embed_recorded(self) -> np.ndarray:
        """Replay the input step's recorded tensor (tiled bf16) -> float32 [embed_dim]."""
        _, _, c, h, w, ref = self._input
        return self._run(ref.reshape(h, c // 8, w, 8).astype(np.float32))


def write_sim_bundle(
    program: IrProgram,
    path: str | Path,
    input_chw: np.ndarray,
    group: int = 32,
    npu_embedding: np.ndarray | None = None,
) -> Path:
    """Export program as an AdaFace bundle for the simulated device (spec a.2 records).

    Conv weights use the simulator's layout (bf16 [oc, icg, k, k] per dispatch); input
    channels are split into groups of `group`; widths below 16 are padded to a multiple of
    4 (wp). Tensors: ref.input (tiled bf16 [112, 1, 112, 8]), ref.input_chw (f32, the raw
    input), ref.cpu_embedding (this program's f32 forward), ref.npu_embedding if given.
    """
    from npu.bundle_writer import BundleWriter
    from npu.sim import write_xclbin

    x = np.asarray(input_chw, np.float32)
    if x.shape != (3, INPUT_SIZE, INPUT_SIZE):
        raise AdaFaceError(f"input_chw must be [3, 112, 112], got {x.shape}")
    shapes: dict[str, tuple[int, int, int]] = {}
    ctxs: set[str] = set()
    with BundleWriter(path, version=1) as wr:
        wr.param("model", program.name)
        stem = np.zeros((8, INPUT_SIZE, INPUT_SIZE), np.float32)
        stem[:3] = x
        wr.tensor("ref.input", to_tiled(stem), "bf16")
        wr.tensor("ref.input_chw", x.reshape(-1), "f32")
        wr.tensor(
            "ref.cpu_embedding", run_program(program, x, NumpyOps(program.conv_gemms())), "f32"
        )
        if npu_embedding is not None:
            wr.tensor("ref.npu_embedding", np.asarray(npu_embedding, np.float32), "f32")
        wr.record("input", program.input, 8, INPUT_SIZE, INPUT_SIZE, "ref.input")
        shapes[program.input] = (8, INPUT_SIZE, INPUT_SIZE)
        for i, s in enumerate(program.steps):
            if isinstance(s, Conv):
                ict, h, w = shapes[s.src]
                wgt = s.weight
                if wgt.shape[1] < ict:  # the stem's 3 channels padded to 8
                    wgt = np.concatenate(
                        [wgt, np.zeros((wgt.shape[0], ict - wgt.shape[1], *wgt.shape[2:]))], 1
                    )
                oc, k = wgt.shape[0], wgt.shape[-1]
                icg = min(ict, group)
                wp = w if w >= 16 else -(-w // 4) * 4
                ctx = f"conv_k{k}_i{icg}_o{oc}_{h}x{wp}"
                if ctx not in ctxs:
                    write_xclbin(wr, ctx)
                    wr.file(f"kernels/{ctx}.bin", np.arange(16, dtype=np.uint32).tobytes())
                    ctxs.add(ctx)
                n = ict // icg
                for j in range(n):
                    wt = f"s{i}.g{j}.wt"
                    wr.tensor(wt, wgt[:, j * icg : (j + 1) * icg], "bf16")
                    wr.record(
                        "conv", s.src, ict, h, w, j * icg // 8, icg, wp, oc, h, w, wp, ctx,
                        f"kernels/{ctx}.bin", wt, s.dst, int(j == 0), int(j == n - 1),
                    )  # fmt: skip
                shapes[s.dst] = (oc, h, w)
            elif isinstance(s, Affine):
                c, h, w = shapes[s.src]
                wr.tensor(f"s{i}.scale", s.scale, "bf16")
                wr.tensor(f"s{i}.shift", s.shift, "bf16")
                wr.record("affine", s.src, c, h, w, f"s{i}.scale", f"s{i}.shift", s.dst)
                shapes[s.dst] = (c, h, w)
            elif isinstance(s, PreluBias):
                c, h, w = shapes[s.buf]
                wr.tensor(f"s{i}.alpha", s.alpha, "bf16")
                wr.tensor(f"s{i}.bias", s.bias, "bf16")
                wr.record("prelu_bias", s.buf, c, h, w, f"s{i}.alpha", f"s{i}.bias")
            elif isinstance(s, Bias):
                c, h, w = shapes[s.buf]
                wr.tensor(f"s{i}.bias", s.bias, "bf16")
                wr.record("bias", s.buf, c, h, w, f"s{i}.bias")
            elif isinstance(s, Subsample):
                c, h, w = shapes[s.src]
                wr.record("subsample", s.src, c, h, w, s.stride, s.dst)
                shapes[s.dst] = (c, -(-h // s.stride), -(-w // s.stride))
            elif isinstance(s, Add):
                c, h, w = shapes[s.a]
                wr.record("add", s.a, s.b, c, h, w, s.dst)
                shapes[s.dst] = (c, h, w)
            elif isinstance(s, Head):
                c, h, w = shapes[s.src]
                k, n = s.bT.shape
                wr.tensor(f"s{i}.bT", s.bT, "bf16")
                wr.tensor(f"s{i}.b2", s.b2, "f32")
                wr.record("head", s.src, c, h, w, k, n, f"s{i}.bT", f"s{i}.b2")
    return Path(path)
