"""AdaFace IR-18 / IR-101 (cvlface iresnet) as a program of taconite-adaface steps.

The network of docs/face-id.md (cvlface's `Backbone` with `BasicBlockIR`
units) is lowered to the step records of docs/adaface-bundle.md: `affine` (a unit's leading BN),
`conv` (stride 1, BN folded into its weights) + `prelu_bias` or `bias`, `subsample` (stride
2), `add` and `head` (BN2d + Linear + BN1d folded into one f32 mat-vec). The cpu backend
(`AdaFaceCpu`) runs that program in float32, each conv as im2col + `ops.gemm`, matching the
torch module up to float32 rounding, and returns the un-normalised 512-d embedding, as
cvlface's Backbone does. The same IrProgram is what npu.models.adaface_export writes as a
bundle; npu.models.adaface_steps replays bundles on a device (sim or xrt).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from npu.models.adaface.config import INPUT_SIZE, AdaFaceError, ColourOrder
from npu.models.adaface.post import l2_normalize
from npu.ops import GemmWeights, NumpyOps, Ops


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
    """dst = src[:, :oh·stride:stride, :ow·stride:stride] with oh, ow = h // stride, w // stride
    (floor, as the bundle step); a stride-2 conv's or MaxPool2d(1, 2)'s output."""

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
            src = bufs[s.src]
            oh, ow = src.shape[1] // s.stride, src.shape[2] // s.stride
            bufs[s.dst] = src[:, : oh * s.stride : s.stride, : ow * s.stride : s.stride]
        elif isinstance(s, Add):
            bufs[s.dst] = bufs[s.a] + bufs[s.b]
        elif isinstance(s, Head):
            flat = bufs[s.src].reshape(-1).astype(np.float32)
            return (s.b2 + flat @ s.bT).astype(np.float32)
    raise AdaFaceError(f"{program.name}: program has no head step")


def head_fingerprint(b2: np.ndarray) -> str:
    """12 hex digits identifying a model by its head bias (rounded to bf16, so a cpu model and
    a bundle exported from the same weights agree): galleries record it."""
    import hashlib

    from npu.bf16 import f32_to_bf16

    return hashlib.sha256(f32_to_bf16(np.asarray(b2, np.float32)).tobytes()).hexdigest()[:12]


def model_fingerprint(model: str, b2: np.ndarray) -> str:
    """`<model>:<12 hex digits>`: what a gallery records of the model that made it; a cpu model
    and a bundle exported from the same weights and name agree (head_fingerprint)."""
    return f"{model}:{head_fingerprint(b2)}"


class AdaFaceCpu:
    """AdaFace on the cpu backend: `embed(chw) -> float32 [512]`, one face per call.

    The embedder interface it shares with npu.models.adaface_steps.AdafaceBundle (methods,
    as taconite's IrEmbedder): embed, embed_dim(), model(), backend(), colour_order(),
    fingerprint(). colour_order() is the channel order the backbone was trained on ("rgb"
    for cvlface's ir18/ir101 configs; "bgr" for the original AdaFace .ckpt weights): callers
    convert the aligned crop to it before `npu.models.adaface.preprocess.embedder_input`.
    """

    def __init__(self, program: IrProgram, colour_order: ColourOrder = "rgb") -> None:
        self.program = program
        self._colour_order = colour_order
        self._ops = NumpyOps(program.conv_gemms())

    def backend(self) -> str:
        return "cpu"

    def model(self) -> str:
        """The model's name (config.json `name`, default IR)."""
        return self.program.name

    def colour_order(self) -> ColourOrder:
        return self._colour_order

    def embed_dim(self) -> int:
        return self.program.embed_dim

    def fingerprint(self) -> str:
        head = self.program.steps[-1]
        assert isinstance(head, Head)
        return model_fingerprint(self.model(), head.b2)

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
