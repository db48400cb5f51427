"""The calibrated NPU2 cost model: what each kernel of the released models takes on an NPU2,
with constants fitted to taconite's published NPU2 timings (docs/device.md §6 lists each
constant, its source and its fit; bench/calibrate_npu2.py redoes the fit).

A model's pass is a list of `Dispatch`es at its real shapes (each model package's `npu2`
module writes them, from the model's config at its released sizes); `Npu2Costs` prices
them per kernel build ("family"): a fixed cost per dispatch, FLOPs at the family's
effective rate, bytes at its effective bandwidth and, for GELU GEMMs, a cost per output
element. `Npu2Pacer` charges passes on one simulated NPU2: the pass, plus context loads when
the model's contexts are not among the 16 resident and a switch when another model ran last.
These are model estimates, never hardware measurements.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

NPU2_SLOTS = 16  # NPU2's hardware contexts, machine-wide (the driver's hwctx_limit: docs/device.md)


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


@dataclass(frozen=True)
class Family:
    """One kernel build's cost: `fixed_s + flops / flops_per_s + nbytes / bytes_per_s +
    epilogue_elems * epilogue_s` per dispatch (an infinite rate drops its term)."""

    fixed_s: float
    flops_per_s: float = math.inf
    bytes_per_s: float = math.inf
    epilogue_s: float = 0.0
    source: str = ""


@dataclass(frozen=True)
class Dispatch:
    """One kernel dispatch of a released model as NPU2 runs it.

    key: the kernel's manifest record key; family: its kernel build (a key of
    Npu2Costs.families); dims: its geometry as its constructor names it (gemm: rows, K, N;
    attention: heads, blocks, rows, keys, head dim; addln: rows, dim; conv: k, h, wp, icg,
    oc); flops / nbytes: the work it does, compiled padding included; epilogue_elems: output
    elements of a GELU epilogue; seconds: a fixed span (family "host", host work of the
    forward timed with it)."""

    key: str
    family: str
    dims: tuple[int, ...] = ()
    flops: float = 0.0
    nbytes: float = 0.0
    epilogue_elems: float = 0.0
    seconds: float = 0.0


def gemm(
    key: str,
    family: str,
    rows: int,
    k: int,
    n: int,
    *,
    tiles: tuple[int, int, int] = (1, 1, 1),
    gelu: bool = False,
) -> Dispatch:
    """A GEMM of `rows` x K x N (N: the B columns, both halves of a paired SwiGLU), its
    rows, K and N rounded up to the kernel's tiles (M, K, N multiples)."""
    mt, kt, nt = tiles
    r, kk, nn = round_up(rows, mt), round_up(k, kt), round_up(n, nt)
    return Dispatch(
        key, family, (rows, k, n), flops=2.0 * r * kk * nn,
        epilogue_elems=float(r * nn) if gelu else 0.0,
    )  # fmt: skip


def attention(
    key: str, family: str, heads: int, rows: int, keys: int, hd: int, blocks: int = 1
) -> Dispatch:
    """Attention over `blocks` independent blocks of rows queries x keys, per head: QKᵀ and
    PV, 4·heads·blocks·rows·keys·hd FLOPs."""
    return Dispatch(
        key, family, (heads, blocks, rows, keys, hd), flops=4.0 * heads * blocks * rows * keys * hd
    )  # fmt: skip


def addln(key: str, family: str, rows: int, dim: int) -> Dispatch:
    """CLIP's AddLN: Y = X + D and H = LayerNorm(Y) over rows x dim bf16 (4 operands)."""
    return Dispatch(key, family, (rows, dim), nbytes=8.0 * rows * dim)


def conv(key: str, family: str, k: int, h: int, wp: int, icg: int, oc: int) -> Dispatch:
    """AdaFace's k x k stride-1 conv over one input-channel group (h x wp pixels)."""
    return Dispatch(
        key, family, (k, h, wp, icg, oc), flops=2.0 * h * wp * oc * icg * k * k,
        nbytes=2.0 * (h * wp * icg + oc * icg * k * k + h * wp * oc),
    )  # fmt: skip


def host(key: str, seconds: float) -> Dispatch:
    """A fixed host span inside the forward (taconite times it with the pass)."""
    return Dispatch(key, "host", seconds=seconds)


@dataclass(frozen=True)
class PassWork:
    """One device pass of a released model: its dispatches in order, the items it serves,
    and a calibration factor for the whole pass (1 unless docs/device.md says otherwise)."""

    name: str
    items: int
    dispatches: tuple[Dispatch, ...]
    scale: float = 1.0


@dataclass(frozen=True)
class ModelWork:
    """A released model on NPU2: its passes by name ("forward", the runtime's pass; CLIP
    also "texts", its label pass), its hardware contexts (the published count) and where its
    shapes come from."""

    name: str
    contexts: tuple[str, ...]
    passes: dict[str, PassWork]
    source: str = ""


@dataclass(frozen=True)
class Npu2Costs:
    """The calibrated constants (docs/device.md §6)."""

    families: dict[str, Family]
    ctx_switch_s: float
    ctx_load_s: float
    slots: int = NPU2_SLOTS

    def dispatch_s(self, d: Dispatch) -> float:
        if d.family == "host":
            return d.seconds
        f = self.families[d.family]
        return (
            f.fixed_s
            + d.flops / f.flops_per_s
            + d.nbytes / f.bytes_per_s
            + d.epilogue_elems * f.epilogue_s
        )

    def pass_s(self, work: PassWork) -> float:
        """Modelled seconds of one pass, its contexts resident."""
        return work.scale * sum(self.dispatch_s(d) for d in work.dispatches)

    def by_key(self, work: PassWork) -> dict[str, float]:
        """Modelled seconds of one pass per kernel key (summed over its dispatches)."""
        out: dict[str, float] = {}
        for d in work.dispatches:
            out[d.key] = out.get(d.key, 0.0) + work.scale * self.dispatch_s(d)
        return out

    def by_family(self, work: PassWork) -> dict[str, float]:
        out: dict[str, float] = {}
        for d in work.dispatches:
            out[d.family] = out.get(d.family, 0.0) + work.scale * self.dispatch_s(d)
        return out


# Fitted by bench/calibrate_npu2.py to the published figures of docs/device.md §6 (the
# fixed cost per dispatch is taconite's single-dispatch median, an assumption for every
# family except CLIP's GEMMs, whose per-chunk cost the fit gives).
SINGLE_DISPATCH_S = 232e-6
NPU2 = Npu2Costs(
    families={
        "flm_gemm": Family(
            SINGLE_DISPATCH_S,
            flops_per_s=2.0118e12,
            source="Sapiens2 0.4b GEMMs 1600 ms of npu a box",
        ),
        "s2_mha": Family(
            SINGLE_DISPATCH_S,
            flops_per_s=1.2169e12,
            source="Sapiens2 0.4b MHA 800 ms of npu a box",
        ),
        "clip_gemm": Family(
            590.745e-6,
            flops_per_s=19.143e12,
            epilogue_s=0.692694e-9,
            source="CLIP vision qkv 0.12, o 0.10, fc2 0.12 (least squares), fc1 0.27 s (GELU)",
        ),
        "clip_mha": Family(
            SINGLE_DISPATCH_S, flops_per_s=1.33407e12, source="CLIP vision MHA 0.08 s"
        ),
        "addln": Family(SINGLE_DISPATCH_S, bytes_per_s=15.21e9, source="CLIP vision AddLN 0.07 s"),
        "conv": Family(
            SINGLE_DISPATCH_S,
            flops_per_s=89.344e9,
            source="AdaFace IR-18 0.2 s and IR-101 0.5 s a face (with the per-forward host span)",
        ),
    },  # fmt: skip
    ctx_switch_s=2.9e-3,
    ctx_load_s=2.9e-3,
)
# The text tower's kernels, priced with the vision-fitted constants, give less than taconite's
# 0.45 s for 8 prompts; the pass is scaled to it (docs/device.md §6).
CLIP_TEXT_SCALE = 1.5622
ADAFACE_HOST_S = 92.397e-3


@dataclass(frozen=True)
class PassCharge:
    """What one charged pass cost: total = pass + context loads (+ a switch)."""

    total_s: float
    pass_s: float
    loads: int
    switched: bool


@dataclass
class Npu2Pacer:
    """The modelled NPU2 of one device: charges released models' passes in the order they
    run. Its contexts are an LRU of `costs.slots`: a pass whose model's contexts are not all
    resident loads the missing ones (ctx_load_s each, evicting the least recent); a pass of
    another model than the last one, with nothing to load, switches (ctx_switch_s)."""

    costs: Npu2Costs = NPU2
    resident: OrderedDict[str, None] = field(default_factory=OrderedDict)
    last_model: str | None = None
    loads: int = 0
    switches: int = 0

    def charge(self, work: ModelWork, pass_name: str = "forward", count: int = 1) -> PassCharge:
        """Charge `count` passes `pass_name` of `work` back to back."""
        pw = work.passes[pass_name]
        loads = self._use(work.contexts)
        switched = loads == 0 and self.last_model not in (None, work.name)
        self.last_model = work.name
        self.loads += loads
        self.switches += switched
        pass_s = count * self.costs.pass_s(pw)
        extra = loads * self.costs.ctx_load_s + (self.costs.ctx_switch_s if switched else 0.0)
        return PassCharge(pass_s + extra, pass_s, loads, switched)

    def _use(self, contexts: Iterable[str]) -> int:
        keys = list(contexts)[-self.costs.slots :]
        missing = [k for k in keys if k not in self.resident]
        for k in keys:
            if k in self.resident:
                self.resident.move_to_end(k)
        for k in missing:
            while len(self.resident) >= self.costs.slots:
                victim = next(k2 for k2 in self.resident if k2 not in keys)
                del self.resident[victim]
            self.resident[k] = None
        return len(missing)
