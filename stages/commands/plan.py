"""`npucam plan CONFIG`: capacity planning for a config as it will run.

It probes each camera (files and streams with OpenCV, live ones with a short timeout) for
its frame rate, runs the config's detect stage on sampled frames to measure its cost per
frame on this machine and the people and faces in view, prices each enabled model at the
calibrated NPU2 time of the released model it is or stands in for (on sim with pacing
stand-in or none: measured), and runs the inference stage's scheduler on the jobs detect
would issue (its rate limits and intervals). It prints per resource (NPU, CPU) what is
asked and what will run, the bottleneck by name, drops by reason and the rates each camera
can sustain; --json gives the same for programs. docs/operations.md shows how to size a
deployment with it.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict
from pathlib import Path

from npu import models
from stages.planning.npu import PlanError
from stages.planning.plan import (
    DEFAULT_FPS,
    DEFAULT_FRAMES,
    DEFAULT_HORIZON_S,
    DEFAULT_PROBE_S,
    Plan,
    make_plan,
)

__all__ = ["PlanError", "format_plan", "make_plan", "plan_json", "register"]


def _rate(x: float) -> str:
    return f"{x:.2f}/s" if x >= 0.1 or x == 0 else f"{x:.3f}/s"


def format_plan(plan: Plan) -> str:  # noqa: C901
    """The plan as the CLI prints it."""
    pacing = f", pacing {plan.pacing}" if plan.pacing else ""
    backend = f" (backend {plan.backend}{pacing})" if plan.backend else ""
    lines = [f"plan for {plan.config}{backend}", "", "cameras:"]
    for c in plan.cameras:
        size = f"{c.size[0]}x{c.size[1]}" if c.size else "size unknown"
        det = "" if c.detect_ms is None else f", detect {c.detect_ms:.1f} ms"
        lines.append(
            f"  {c.camera}: {c.kind}, {c.fps:.2f} fps ({c.fps_source}), {size}, decode "
            f"{c.decode_ms:.2f} ms{det} a frame"
        )
        if c.detect_ms is not None:
            lines.append(f"    {c.people:.2f} people, {c.faces:.2f} faces a frame ({c.scene})")
        if c.live_ms_per_person is not None and c.detect_ms is not None:
            other = c.detect_ms - c.live_people * c.live_ms_per_person
            lines.append(
                f"    per-frame pose: {c.live_people:.2f} people followed a frame, "
                f"{c.live_ms_per_person:.1f} ms a person-frame (landmark models); the rest of "
                f"detect {max(other, 0.0):.1f} ms a frame"
            )
    if plan.costs:
        lines += ["", "device time per pass:"]
        for m in plan.costs.values():
            lines.append(
                f"  {m.model:9s} {m.pass_s:8.3f} s a pass of {m.batch} ({m.source}); "
                f"{len(m.contexts)} contexts"
            )
            if m.host_s:
                lines.append(
                    f"            the simulator's host work: {m.host_s * 1e3:.0f} ms a pass"
                )
        b = plan.budget
        per = ", ".join(f"{m} {n}" for m, n in b["per_model"].items())
        if b["fits"]:
            lines.append(
                f"  contexts: {b['needed']} of {b['slots']} ({per}): all resident together; "
                f"a switch between models costs {b['switch_s'] * 1e3:.1f} ms (an assumption)"
            )
        else:
            lines.append(
                f"  contexts: {b['needed']} needed, {b['slots']} slots ({per}): they do not fit "
                f"together; each model's turn after another reloads its contexts "
                f"({b['load_s'] * 1e3:.1f} ms each, an assumption; a full round "
                f"{b['reload_round_s'] * 1e3:.0f} ms)"
            )
        for m, share in plan.contexts.items():
            by = ", ".join(f"{n} by {who}" for who, n in sorted(share.evicted.items()))
            lines.append(
                f"    {m}: {share.resident} of {len(share.contexts)} resident at the end, "
                f"{share.loads} loads in the planned run; its contexts evicted: {by or 'none'}"
            )
    u = plan.utilisation
    lines += ["", "utilisation (asked -> predicted):"]
    if "npu" in u:
        by = ", ".join(f"{m} {u['npu'][m]:.2f}" for m in plan.costs)
        lines.append(
            f"  NPU: {100 * u['npu']['asked']:.0f}% -> {100 * u['npu']['predicted']:.0f}% busy "
            f"(asked device-s/s: {by})"
        )
    cpu = u["cpu"]
    lines.append(
        f"  CPU: {100 * cpu['asked']:.0f}% -> {100 * cpu['predicted']:.0f}% of {cpu['cores']} "
        f"cores (decode {cpu['capture']:.2f}, detect {cpu['detect']:.2f}, push "
        f"{cpu['push']:.2f}, simulator {cpu['infer_host']:.2f}, body fit "
        f"{cpu.get('body', 0.0):.2f} cores; load average "
        f"{plan.load_avg:.2f} before planning)"
    )
    if "detect" in u:
        d = u["detect"]
        who = "detect thread" if d["workers"] == 1 else f"detect's {d['workers']:.0f} workers"
        lines.append(
            f"  {who}: {100 * d['asked'] / d['capacity']:.0f}% -> "
            f"{100 * d['predicted'] / d['capacity']:.0f}% of the {d['capacity']:.2f} core"
            f"{'s they get' if d['workers'] > 1 else ' it gets'}"
        )
    lines += _live_lines(plan)
    lines += ["", f"bottleneck: {plan.bottleneck}", "", "drops by reason:"]
    if "detect" in plan.drops:
        d = plan.drops["detect"]
        lines.append(
            f"  detect queue_full: {100 * d['fraction']:.1f}% of frames "
            f"({d['queue_full_per_s']:.1f}/s)"
        )
    for m in plan.costs:
        reasons = plan.drops.get(m, {})
        text = ", ".join(f"{r} {_rate(n)}" for r, n in sorted(reasons.items())) or "none"
        lines.append(f"  {m}: {text}")
    if plan.results:
        lines += ["", f"results (over {plan.window_s:.0f} s simulated):"]
        for m, r in plan.results.items():
            lo, hi = plan.spread.get(m, (r, r))
            lines.append(
                f"  {m}: {_rate(r)} ({_rate(plan.passes.get(m, 0.0))} passes; "
                f"{_rate(lo)}-{_rate(hi)} over any 45 s)"
            )
    lines += ["", "sustainable per camera:"]
    for c in plan.cameras:
        parts = [f"detect keeps up with {c.detect_fps:.1f} of {c.fps:.1f} fps"]
        if c.pose_every_s is not None:
            every = "never" if math.isinf(c.pose_every_s) else f"every {c.pose_every_s:.1f} s"
            parts.append(f"a pose per person {every}")
        for m, r in c.results.items():
            if models.spec(m).kind != "pose":
                parts.append(f"{m} {_rate(r)}")
        lines.append(f"  {c.camera}: " + "; ".join(parts))
    lines += _rig_lines(plan)
    if plan.notes:
        lines += ["", "notes:"] + [f"  {n}" for n in plan.notes]
    return "\n".join(lines)


def _rig_lines(plan: Plan) -> list[str]:
    """Each live rig's predicted pose3d rate (stages/planning/rig_rate.py)."""
    if not plan.rigs:
        return []
    lines = ["", "pose3d per live rig (a message per group with a view; a person in it from "
             "min_views of their views):"]  # fmt: skip
    for r in plan.rigs:
        views = ", ".join(f"{c} {f:.0%}" for c, f in r.view_fraction.items())
        lines.append(
            f"  {r.rig}: {r.per_person_per_s:.2f} pose3d/s per person (seen by every camera, "
            f"in {r.min_views}+ views), {r.messages_per_s:.2f} messages/s, of "
            f"{r.group_fps:.2f} groups/s; limited by {r.limited_by} (frames detect "
            f"processes: {views})"
        )
    return lines


def _live_lines(plan: Plan) -> list[str]:
    """What detect's one thread fits of the per-frame pose: person-frames a second after the
    rest of its work at every camera's rate, and what goes first when it does not fit."""
    live = [c for c in plan.cameras if c.live_ms_per_person is not None and c.detect_ms]
    detect = plan.utilisation.get("detect")
    if not live or detect is None:
        return []
    other_s = sum(
        c.fps * max(c.detect_ms - c.live_people * c.live_ms_per_person, 0.0) / 1e3
        for c in live
        if c.detect_ms is not None and c.live_ms_per_person is not None
    )
    per_person_s = sum(c.live_ms_per_person or 0.0 for c in live) / len(live) / 1e3
    fits = max(detect["capacity"] - other_s, 0.0) / per_person_s
    asked = sum(c.fps * c.live_people for c in live)
    fps = sum(c.fps for c in live)
    return [
        "",
        "per-frame pose (detect's workers):"
        if detect["workers"] > 1
        else "per-frame pose (detect's one thread):",
        f"  fits {fits:.1f} person-frames/s after detect's other work; the cameras ask "
        f"{asked:.1f} ({fps:.1f} frames/s x the people followed): "
        f"{fits / fps:.2f} people a frame across the cameras at their full rate",
        "  what goes first: whole frames (detect's inbox keeps the latest: queue_full); every "
        "followed person keeps a pose on each frame detect processes",
    ]


def plan_json(plan: Plan) -> dict:
    """The plan as JSON-able data (--json)."""
    data = asdict(plan)
    for name, cost in plan.costs.items():
        data["costs"][name].pop("work", None)
        data["costs"][name]["item_s"] = cost.item_s
    data["npu_utilisation"] = plan.npu_utilisation
    data["detect_drop_fraction"] = plan.detect_drop
    return _finite(data)


def _finite(value: object) -> object:
    """JSON-able data: tuples as lists, infinite numbers (never-posed people) as None."""
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


def _pair(text: str, what: str, kind: type) -> tuple[str, object]:
    name, sep, value = text.partition("=")
    try:
        parsed = kind(value)
    except ValueError:
        parsed = None
    ok = sep and name in models.names() and parsed is not None
    if ok and kind is float and not parsed > 0:  # type: ignore[operator]
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected MODEL={what} with MODEL one of {', '.join(models.names())}"
            + (", SECONDS > 0" if kind is float else "")
        )
    return name, parsed


def cmd_plan(args: argparse.Namespace) -> int:
    plan = make_plan(
        args.config,
        people=args.people,
        faces=args.faces,
        fps=args.fps,
        overrides=dict(args.cost or []),
        variants=dict(args.as_ or []),
        frames=args.frames,
        probe_timeout_s=args.probe_timeout,
        horizon_s=args.horizon,
    )
    if args.json:
        print(json.dumps(plan_json(plan), indent=2))
    else:
        print(format_plan(plan))
        print(f"\n(planned in {plan.planned_s:.1f} s)")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan",
        help="what a config asks of the NPU and the CPU, what drops, sustainable rates",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("config", type=Path, help="a pipeline config (split configs too)")
    p.add_argument(
        "--people",
        type=float,
        default=None,
        help="people per frame of every camera (default: measured on its frames)",
    )
    p.add_argument(
        "--faces",
        type=float,
        default=None,
        help="faces per frame (default: measured, or one per person)",
    )
    p.add_argument(
        "--fps",
        type=float,
        default=DEFAULT_FPS,
        help=f"fps of cameras neither probed nor configured ({DEFAULT_FPS:g})",
    )
    p.add_argument(
        "--cost",
        type=lambda t: _pair(t, "SECONDS", float),
        action="append",
        metavar="MODEL=S",
        help="device seconds of one pass of MODEL",
    )
    p.add_argument(
        "--as",
        dest="as_",
        type=lambda t: _pair(t, "VARIANT", str),
        action="append",
        metavar="MODEL=VARIANT",
        help="price MODEL as this released variant (e.g. adaface=ir18)",
    )
    p.add_argument(
        "--frames",
        type=int,
        default=DEFAULT_FRAMES,
        help=f"frames sampled per camera ({DEFAULT_FRAMES})",
    )
    p.add_argument(
        "--probe-timeout",
        type=float,
        default=DEFAULT_PROBE_S,
        help="seconds a live camera is read for its rate and scene, all at once "
        f"({DEFAULT_PROBE_S:g})",
    )
    p.add_argument(
        "--horizon",
        type=float,
        default=DEFAULT_HORIZON_S,
        help=f"simulated seconds of the scheduler run ({DEFAULT_HORIZON_S:g}; the "
        "first 30 warm up, the rest is lengthened to whole loops of the scene)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_plan)  # fmt: skip
