"""`npucam plan CONFIG`: capacity planning for a config's inference stage.

From per-item device times (a model's `cost_s` in the config, `--cost MODEL=S`, or measured:
each enabled model is loaded on the config's backend and one pass is timed after a warm-up;
on sim that is the simulator's modelled device time, never a hardware figure), it prints the
device time the config asks for per second (cameras x fps x items per frame x per-item cost),
the device utilisation that means, what share of the work will be dropped when it is over
1 (the scheduler drops it as `npu_busy` / `stale`), and the highest sustainable rates per
camera: the frame rate at which every camera's asked work fits, and how many people per
frame each camera can pose at its configured rate. For the models it loads it also shows the
hardware-context budget per model (contexts, the measured cost of a load) and, when together
they need more than the device's slots, what one pass of each in turn evicts of whom.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from npu import models
from pipeline.config import load_config
from pipeline.errors import NpucamError
from pipeline.graph import stage_class


class PlanError(NpucamError):
    """A config or option `npucam plan` cannot plan for."""


@dataclass(frozen=True)
class ModelCost:
    """One model's device time per pass and per item, and where the number came from."""

    model: str
    batch: int
    pass_s: float
    source: str  # "config", "--cost", "measured on sim (simulated)", ...

    @property
    def item_s(self) -> float:
        return self.pass_s / self.batch


@dataclass(frozen=True)
class ModelContextPlan:
    """One loaded model's hardware contexts: how many, the measured seconds of one load
    (None if it loaded none), and, over one pass of every loaded model in turn once they
    are warm, the contexts its pass reloads and whose contexts that evicts (by model)."""

    model: str
    contexts: int
    load_s: float | None
    reloads: int = 0
    evicts: dict[str, int] | None = None


@dataclass(frozen=True)
class CameraPlan:
    camera: str
    fps: float
    items: dict[str, float]  # model -> items per frame
    demand_s: float  # device seconds asked per second
    max_fps: float  # highest frame rate at which every camera's work fits, all scaled alike
    max_people: float | None  # people per frame posable at `fps` (None: pose not enabled)
    staleness_s: float = 0.0
    too_slow: tuple[str, ...] = ()  # models whose pass alone outlasts the staleness budget


@dataclass(frozen=True)
class Plan:
    config: str
    backend: str
    costs: dict[str, ModelCost]
    cameras: list[CameraPlan]
    contexts: dict[str, ModelContextPlan] = field(default_factory=dict)
    context_slots: int = 16

    @property
    def utilisation(self) -> float:
        return sum(c.demand_s for c in self.cameras)

    @property
    def dropped_share(self) -> float:
        """Share of the asked work the device cannot do (0 when it fits)."""
        u = self.utilisation
        return 0.0 if u <= 1 else 1 - 1 / u


def _infer_options(config):
    from stages.infer import Infer, InferOptions

    for i, stage in enumerate(config.stages):
        try:
            is_infer = stage_class(stage.kind) is Infer
        except LookupError:
            continue  # `npucam validate` names it
        if is_infer:
            try:
                return InferOptions.model_validate(stage.options)
            except Exception as exc:
                raise PlanError(
                    f"{config.path}: stages[{i}]: invalid infer options: {exc}"
                ) from None
    raise PlanError(f"{config.path}: no infer stage to plan for")


def measure_costs(
    config, options, names: list[str]
) -> tuple[dict[str, ModelCost], dict[str, tuple[tuple[str, ...], float | None]]]:
    """Load each model as the stage would and time one pass after a warm-up pass; also
    return each model's context keys and the device's measured cost of one of its context
    loads (its per-model context view)."""
    from stages.infer import open_stage_device
    from stages.runtimes import open_runtime, resolve

    device = open_stage_device(options, config.base_dir)
    if device is not None:
        device.sleep = False  # modelled time is read from the simulator, not waited for
    out, contexts = {}, {}
    try:
        for name in names:
            mo = options.model(name)
            rt = open_runtime(
                name,
                options.backend,
                mo.source(config.base_dir, f"{config.path}: {name}"),
                device=device,
                options=mo,
                base_dir=config.base_dir,
                synthetic_cache=resolve(config.base_dir, options.synthetic_cache),
            )
            rt.warm_up()
            sim = getattr(device, "sim", None)
            before = sim.dispatch_s + sim.ctx_switch_s if sim is not None else 0.0
            wall = rt.warm_up()
            if sim is not None:
                pass_s, how = sim.dispatch_s + sim.ctx_switch_s - before, "simulated"
            else:
                pass_s, how = wall, "wall clock"
            what = f"measured on {options.backend} ({how}{', synthetic' if rt.synthetic else ''})"
            out[name] = ModelCost(name, rt.batch_size, pass_s, what)
            view = device.context_view().get(name) if device is not None else None
            contexts[name] = (tuple(rt.contexts), view.load_cost_s if view else None)
            rt.close()
    finally:
        if device is not None:
            device.close()
    return out, contexts


def context_plan(
    contexts: dict[str, tuple[tuple[str, ...], float | None]], slots: int
) -> dict[str, ModelContextPlan]:
    """What each model's pass reloads and evicts when every model runs one pass in turn,
    once warm (the second round of the scheduler's context LRU, stages.scheduler)."""
    from stages.scheduler import ContextLRU

    lru = ContextLRU(slots)
    usable = {m: keys for m, (keys, _) in contexts.items() if 0 < len(keys) <= slots}
    for model, keys in usable.items():  # the first round only warms up
        lru.use(keys, model)
    plans = {}
    for model, (keys, load_s) in contexts.items():
        if model not in usable:
            plans[model] = ModelContextPlan(model, len(keys), load_s)
            continue
        before = dict(lru.evicted)
        loaded, _ = lru.use(keys, model)
        evicts = {}
        for (owner, by), n in lru.evicted.items():
            if by == model and n > before.get((owner, by), 0):
                evicts[owner] = n - before.get((owner, by), 0)
        plans[model] = ModelContextPlan(model, len(keys), load_s, len(loaded), evicts)
    return plans


def make_plan(
    path: str,
    *,
    people: float = 3.0,
    faces: float | None = None,
    clips: float = 1.0,
    fps: float = 10.0,
    overrides: dict[str, float] | None = None,
    measure: bool = True,
) -> Plan:
    """The plan of a config. people / faces / clips: pose, face and CLIP items per frame per
    camera (faces default to people); fps: for cameras whose config sets none; overrides:
    model -> pass seconds; measure: time models the config gives no cost_s for."""
    config = load_config(path)
    options = _infer_options(config)
    enabled = options.enabled()
    if not enabled:
        raise PlanError(f"{config.path}: the infer stage enables no model")
    if not config.cameras:
        raise PlanError(f"{config.path}: no [[cameras]] to plan for")
    overrides = dict(overrides or {})
    for name in overrides:
        if name not in enabled:
            raise PlanError(f"--cost {name}: not an enabled model (enabled: {', '.join(enabled)})")
    costs: dict[str, ModelCost] = {}
    contexts: dict[str, tuple[tuple[str, ...], float | None]] = {}
    unknown = []
    for name in enabled:
        batch = models.spec(name).default_batch
        if name in overrides:
            costs[name] = ModelCost(name, batch, overrides[name], "--cost")
        elif options.model(name).cost_s is not None:
            costs[name] = ModelCost(name, batch, options.model(name).cost_s, "config cost_s")
        else:
            unknown.append(name)
    if unknown:
        if not measure:
            raise PlanError(
                f"no device time for {', '.join(unknown)}: set cost_s in the config, pass "
                "--cost MODEL=SECONDS, or drop --no-measure"
            )
        measured, contexts = measure_costs(config, options, unknown)
        costs.update(measured)
    costs = {m: costs[m] for m in enabled}
    per_kind = {"pose": people, "face": people if faces is None else faces, "clip": clips}
    kind = {m: models.spec(m).kind for m in enabled}
    pose = next((m for m in enabled if kind[m] == "pose"), None)
    rows = []
    for cam in config.cameras:
        rate = cam.fps or fps
        items = {m: per_kind.get(kind[m], 1.0) for m in enabled}
        demand = rate * sum(items[m] * costs[m].item_s for m in enabled)
        rows.append((cam.name, rate, items, demand, cam.staleness_ms / 1000))
    total = sum(r[3] for r in rows)
    cameras = []
    for name, rate, items, demand, staleness in rows:
        max_people = None
        if pose is not None:
            # this camera's fair share of the device, less its non-pose work
            share = 1.0 / len(rows)
            other = rate * sum(items[m] * costs[m].item_s for m in items if m != pose)
            max_people = max(share - other, 0.0) / (rate * costs[pose].item_s)
        max_fps = rate / total if total > 0 else float("inf")
        slow = tuple(m for m in items if costs[m].pass_s > staleness)
        cameras.append(CameraPlan(name, rate, items, demand, max_fps, max_people, staleness, slow))
    from npu.device import ctx_cache_cap

    slots = options.context_slots or ctx_cache_cap()
    return Plan(str(config.path), options.backend, costs, cameras, context_plan(contexts, slots),
                slots)  # fmt: skip


def format_plan(plan: Plan) -> str:
    lines = [f"plan for {plan.config} (backend {plan.backend})", "", "device time per item:"]
    for c in plan.costs.values():
        lines.append(
            f"  {c.model:9s} {c.item_s * 1e3:10.2f} ms/item  ({c.pass_s * 1e3:.2f} ms a pass "
            f"of {c.batch}; {c.source})"
        )
    lines += ["", "asked of the device:"]
    for cam in plan.cameras:
        items = ", ".join(f"{n:g} {m}" for m, n in cam.items.items())
        lines.append(
            f"  {cam.camera}: {cam.fps:g} fps x ({items}) per frame = {cam.demand_s:.3f} device-s/s"
        )
        for m in cam.too_slow:
            lines.append(
                f"  WARNING {cam.camera}: a {m} pass ({plan.costs[m].pass_s:.3f} s) outlasts the "
                f"camera's staleness budget ({cam.staleness_s:.3f} s): every {m} job of it will "
                "be dropped (raise staleness_ms)"
            )
    u = plan.utilisation
    lines += ["", f"device utilisation asked: {100 * u:.1f}%"]
    if u > 1:
        lines.append(
            f"over capacity: about {100 * plan.dropped_share:.1f}% of the asked work will be "
            "dropped (npu_busy / stale), shared fairly across cameras by device time"
        )
    else:
        lines.append(f"fits, with {100 * (1 - u):.1f}% of the device to spare")
    lines += ["", *format_contexts(plan)] if plan.contexts else []
    lines += ["", "highest sustainable rates per camera:"]
    for cam in plan.cameras:
        people = "" if cam.max_people is None else f", or {cam.max_people:.2f} people/frame posed"
        lines.append(
            f"  {cam.camera}: {cam.max_fps:.2f} fps at this mix{people} at {cam.fps:g} fps"
        )
    return "\n".join(lines)


def format_contexts(plan: Plan) -> list[str]:
    """The hardware-context lines of a plan (models it loaded only)."""
    total = sum(c.contexts for c in plan.contexts.values())
    lines = [f"hardware contexts ({plan.context_slots} slots; models loaded to measure):"]
    for c in plan.contexts.values():
        cost = "no load measured" if c.load_s is None else f"{c.load_s * 1e3:.1f} ms a load"
        lines.append(f"  {c.model:9s} {c.contexts:3d} contexts, {cost}")
    if total <= plan.context_slots:
        lines.append(f"  together {total} of {plan.context_slots}: all stay resident")
        return lines
    lines.append(
        f"  together {total} > {plan.context_slots}: one pass of each in turn, once warm, reloads"
    )
    for c in plan.contexts.values():
        if c.evicts is None:
            lines.append(f"    {c.model}: needs more contexts than the device has")
            continue
        whose = ", ".join(f"{n} of {m}'s" for m, n in c.evicts.items()) or "nothing"
        cost = "" if c.load_s is None else f" ({c.reloads * c.load_s * 1e3:.1f} ms)"
        lines.append(f"    {c.model}: {c.reloads} contexts{cost}, evicting {whose}")
    return lines


def _cost(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not sep or name not in models.names() or not seconds > 0:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected MODEL=SECONDS with MODEL one of {', '.join(models.names())}, "
            "SECONDS > 0"
        )
    return name, seconds


def cmd_plan(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    plan = make_plan(
        args.config,
        people=args.people,
        faces=args.faces,
        clips=args.clips,
        fps=args.fps,
        overrides=dict(args.cost or []),
        measure=not args.no_measure,
    )
    if args.json:
        data = asdict(plan)
        data["utilisation"] = plan.utilisation
        data["dropped_share"] = plan.dropped_share
        print(json.dumps(data, indent=2))
    else:
        print(format_plan(plan))
        print(f"\n(planned in {time.perf_counter() - t0:.1f} s)")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan",
        help="device utilisation a config asks for, and its sustainable rates",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("config", type=Path, help="a pipeline config with an infer stage")
    p.add_argument("--people", type=float, default=3.0, help="people posed per frame (3)")
    p.add_argument("--faces", type=float, default=None, help="faces per frame (= people)")
    p.add_argument("--clips", type=float, default=1.0, help="CLIP crops per frame (1)")
    p.add_argument("--fps", type=float, default=10.0, help="fps of cameras that set none (10)")
    p.add_argument(
        "--cost", type=_cost, action="append", metavar="MODEL=S", help="pass device seconds"
    )
    p.add_argument("--no-measure", action="store_true", help="never load models to time them")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_plan)
