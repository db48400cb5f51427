"""The `rig3d` stage: the 2D poses of a rig's cameras -> `pose3d/<rig>` (docs/rig.md).

It registers its rig (stages.rig.groups.RigGroups) when built, so the run's detect stage
groups the rig's frames by capture time and poses the frames of the groups it picks, their
jobs tagged so the scheduler runs a group's views together. PoseResults from dark are
matched to their posed group by (camera, seq); a group is released, in capture order, once
every pose job detect made for it has a result, or when it has waited `wait_ms` since its
frames were captured. Each released group is associated across views, its rig person ids
kept through the 2D tracks, all keypoints triangulated and optionally filtered
(stages.rig.reconstruct), and published as a Pose3DResult. With `trc`, each rig person's
trajectory is written as an OpenSim .trc file at shutdown (stages.rig.trc).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from npu.models.sapiens2 import keypoints as keypoints308
from pipeline.config import NAME_PATTERN, Config
from pipeline.graph import Outbox, Stage, StageOptions
from pipeline.messages import now_ns
from pipeline.queues import BoundedQueue, QueueClosed
from stages.landmarks.result import LivePoseResult
from stages.models.sapiens2.result import PoseResult
from stages.rig.bone_fit import BoneFitParams
from stages.rig.calibration import MAX_CAMERAS, CalibrationError, coincident, read_calibration
from stages.rig.consistency import ConsistencyParams
from stages.rig.groups import PosedGroup, RigGroups, RigRegistry
from stages.rig.id_switches import IdSwitches
from stages.rig.pose3d import Pose3DResult
from stages.rig.reconstruct import FilterParams, People3D, Reconstructor, View2D
from stages.rig.trc import TrcError, write_trc

log = logging.getLogger(__name__)

POLL_S = 0.05  # how often posed groups' waits, the grouper and the camera clocks are checked


class Rig3DOptions(StageOptions):
    rig: str = Field(pattern=NAME_PATTERN)  # the rig's name: topic pose3d/<rig>
    cameras: list[str] = Field(min_length=2, max_length=MAX_CAMERAS)
    calibration: str = Field(min_length=1)  # Pose2Sim / anipose TOML, relative to the config
    fps: float = Field(30.0, ge=1e-3, le=1000)  # rate of rig cameras whose [[cameras]] has none
    tolerance_ms: float | None = Field(None, gt=0)  # group span; default half a frame period
    sync_wait_ms: float | None = Field(None, gt=0)  # wait for a view; default two periods
    pose_interval_ms: float = Field(0.0, ge=0)  # capture time between posed groups
    max_people: int = Field(4, ge=1, le=64)  # pose jobs per camera of a posed group
    # what poses a group: "keyframes", Sapiens2 jobs of the group's frames (dark's results);
    # "live", detect's per-frame poses of every group (its `live` table on, `to` this stage;
    # Sapiens2 keyframes are fused into them there, and dark's own results are not used)
    poses: Literal["keyframes", "live"] = "keyframes"
    wait_ms: float | None = Field(None, gt=0)  # for poses; default half the least staleness
    min_confidence: float = Field(0.3, ge=0, le=1)
    max_error_px: float = Field(15.0, gt=0)
    min_views: int = Field(2, ge=2)
    max_association_px: float = Field(20.0, gt=0)
    person_max_age: int = Field(30, ge=1)  # groups a rig person id outlives its tracks
    swap_sides: bool = False  # undo a view's left/right swaps (stages/rig/sides.py)
    # triangulate again, from another view subset, a keypoint that breaks its person's top
    # speed or bone lengths (stages/rig/consistency.py)
    consistency: bool = False
    max_speed_mps: float = Field(12.0, gt=0)
    bone_tolerance: float = Field(0.2, gt=0, lt=1)
    # with consistency: move the limb joints toward their bones' median lengths within what
    # their views saw (stages/rig/bone_fit.py); one bone_sigma_m off costs one pixel_sigma_px
    fit_bones: bool = False
    bone_sigma_m: float = Field(0.02, gt=0)
    pixel_sigma_px: float = Field(8.0, gt=0)
    filter: bool = False  # One Euro filter per rig person
    filter_min_cutoff: float = Field(1.0, gt=0)
    filter_beta: float = Field(1.0, ge=0)
    filter_d_cutoff: float = Field(1.0, gt=0)
    trc: str | None = Field(None, min_length=1)  # .trc path stem (relative to the config)
    trc_max_frames: int = Field(9000, ge=1)  # per rig person; later frames are not recorded

    @model_validator(mode="after")
    def _fit_needs_consistency(self):
        if self.fit_bones and not self.consistency:
            raise ValueError("`fit_bones` fits the bone lengths `consistency` keeps: set both")
        return self


def rig_fps(options: Rig3DOptions, config: Config) -> dict[str, float]:
    """camera -> its [[cameras]] fps, or the rig's `fps` for a camera without one."""
    rates = {c.name: c.fps for c in config.cameras}
    return {n: rates.get(n) or options.fps for n in options.cameras}


def rig_groups(
    options: Rig3DOptions, config: Config, clock: Callable[[], int] = time.monotonic_ns
) -> RigGroups:
    """The grouping of the rig `options` describes, its cameras at their [[cameras]] fps (or
    the rig's `fps`): what the stage registers, and what `npucam plan` simulates."""
    o = options
    return RigGroups(
        o.rig,
        rig_fps(o, config),
        tolerance_ns=None if o.tolerance_ms is None else round(o.tolerance_ms * 1e6),
        wait_ns=None if o.sync_wait_ms is None else round(o.sync_wait_ms * 1e6),
        pose_interval_ns=round(o.pose_interval_ms * 1e6),
        max_people=o.max_people,
        clock=clock,
        live=o.poses == "live",
    )


def _staleness_ms(config: Config, cameras: list[str]) -> float:
    return min(c.staleness_ms for c in config.cameras if c.name in cameras)


class Rig3D(Stage[Rig3DOptions]):
    """PoseResults of a rig's cameras -> Pose3DResult on pose3d/<rig> (module docstring)."""

    kind = "rig3d"
    accepts = (PoseResult,)
    Options = Rig3DOptions

    def __init__(self, name: str, options: Rig3DOptions, context: Any) -> None:
        super().__init__(name, options, context)
        o = options
        config = context.config
        self.calibration_path = config.base_dir / o.calibration
        calibration = read_calibration(self.calibration_path)
        self.cameras = [calibration.camera(n) for n in o.cameras]
        self.groups = rig_groups(o, config)
        RigRegistry.of(context).add(self.groups)
        wait_ms = o.wait_ms if o.wait_ms is not None else _staleness_ms(config, o.cameras) / 2
        self.wait_ns = round(wait_ms * 1e6)
        self.min_fps = min(rig_fps(o, config).values())
        self.reconstructor = Reconstructor(
            self.cameras,
            min_confidence=o.min_confidence,
            max_error_px=o.max_error_px,
            min_views=o.min_views,
            max_association_px=o.max_association_px,
            person_max_age=o.person_max_age,
            filter_params=FilterParams(o.filter_min_cutoff, o.filter_beta, o.filter_d_cutoff)
            if o.filter
            else None,
            swap_sides=o.swap_sides,
            consistency=ConsistencyParams(
                o.max_speed_mps,
                o.bone_tolerance,
                fit=BoneFitParams(o.bone_sigma_m, o.pixel_sigma_px) if o.fit_bones else None,
            )
            if o.consistency
            else None,
        )
        self._results: dict[int, dict[tuple[str, int], PoseResult]] = defaultdict(dict)
        # K of the poses seen so far; before the first, Sapiens2's (meta.pose.count), so an
        # empty group's message still says K (docs/protocol.md, pose3d)
        self._keypoints = len(keypoints308.NAMES)
        self._size_warned: set[str] = set()
        self._trc: dict[int, tuple[list[float], list[np.ndarray]]] = {}
        self.counts = {
            "published": 0,
            "timed_out": 0,
            "people": 0,
            "late_poses": 0,
            "other_poses": 0,
        }
        # rig person ids that moved between people, an absent id remembered as long as its
        # tracks are
        self.id_switches = IdSwitches(memory=o.person_max_age)
        self._points_total = 0
        self._points_triangulated = 0
        self._clock_states: dict[str, str] = {}
        self._reprojection: dict[str, str] = {}  # info reprojection_<camera>, as of the last group

    @classmethod
    def check(cls, config: Config, index: int) -> list[str]:  # noqa: C901
        opts = config.stages[index].options
        key = f"stages[{index}]"
        cameras = opts.get("cameras")
        if not (isinstance(cameras, list) and all(isinstance(c, str) for c in cameras)):
            return []  # the options' validation says what is wrong
        problems = []
        names = [c.name for c in config.cameras]
        for j, cam in enumerate(cameras):
            if cam not in names:
                problems.append(f"{key}.cameras[{j}]: no camera named {cam!r} in [[cameras]]")
            elif cameras.index(cam) != j:
                problems.append(f"{key}.cameras[{j}]: camera {cam!r} is listed twice")
        raw = opts.get("calibration")
        if isinstance(raw, str) and raw:
            path = config.base_dir / raw
            try:
                calibration = read_calibration(path)
            except CalibrationError as exc:
                problems.append(f"{key}.calibration: {exc}")
            else:
                known = [c.name for c in calibration.cameras.values()]
                for j, cam in enumerate(cameras):
                    if cam not in known:
                        problems.append(
                            f"{key}.cameras[{j}]: camera {cam!r} is not in the calibration "
                            f"{path} (it has {', '.join(map(repr, known))})"
                        )
                rig = [calibration.camera(c) for c in dict.fromkeys(cameras) if c in known]
                for a, b in coincident(rig):
                    problems.append(
                        f"{key}.calibration: cameras {a!r} and {b!r} are at one place in {path}: "
                        "two views from one point triangulate nothing"
                    )
        detects = [s.options.get("cameras") for s in config.stages if s.kind == "detect"]
        if opts.get("poses") == "live":
            live = [
                s.options.get("live")
                for s in config.stages
                if s.kind == "detect" and isinstance(s.options.get("live"), dict)
            ]
            if not any(d.get("enabled") for d in live):
                problems.append(
                    f"{key}.poses: 'live' needs a detect stage with its `live` table enabled "
                    "(the per-frame poses that pose every group)"
                )
        for j, cam in enumerate(cameras):
            if cam in names and not any(d is None or cam in d for d in detects):
                problems.append(
                    f"{key}.cameras[{j}]: no detect stage detects on camera {cam!r}; the rig's "
                    "pose jobs come from detect"
                )
        for i, stage in enumerate(config.stages[:index]):
            if stage.kind == cls.kind and isinstance(stage.options.get("cameras"), list):
                shared = [c for c in cameras if c in stage.options["cameras"]]
                if shared:
                    problems.append(f"{key}.cameras: {shared[0]!r} is in the rig of stages[{i}]")
        wait = opts.get("wait_ms")
        rig_cams = [c for c in cameras if c in names]
        if isinstance(wait, int | float) and rig_cams:
            staleness = _staleness_ms(config, rig_cams)
            if wait >= staleness:
                problems.append(
                    f"{key}.wait_ms: {wait:g} ms is not below the rig cameras' staleness_ms "
                    f"({staleness:g}): every pose3d result would be stale when it leaves"
                )
        return problems

    # -- the run ------------------------------------------------------------------------

    async def run(self, inbox: BoundedQueue | None, out: Outbox) -> None:
        assert inbox is not None
        self.metrics.add_gauges(self.name, self.gauges)
        getter: asyncio.Future | None = None
        try:
            while True:
                if getter is None:
                    getter = asyncio.ensure_future(inbox.get())
                # polled even with no pose in flight: a group nobody is in gets no pose, and
                # still gets its message (docs/protocol.md, pose3d)
                await asyncio.wait({getter}, timeout=POLL_S)
                if getter.done():
                    try:
                        item = getter.result()
                    except QueueClosed:
                        break
                    finally:
                        getter = None
                    self._take(item)
                await self._release(out, now_ns())
            await self._release(out, now_ns(), flush=True)
        finally:
            if getter is not None:
                getter.cancel()
            if self.options.trc is not None:
                await asyncio.to_thread(self._write_trc)

    def _take(self, item: PoseResult) -> None:
        if item.camera not in self.groups.cameras:
            return  # another camera's pose (dark sends every camera's)
        if self.groups.live != isinstance(item, LivePoseResult):
            self.counts["other_poses"] += 1  # the kind of pose that does not pose this rig
            return
        group = self.groups.group_of(item.camera, item.seq)
        if group is None:
            self.counts["late_poses"] += 1  # its group has left, or was never posed
            return
        self._results[group][item.camera, item.track_id] = item

    async def _release(self, out: Outbox, now: int, flush: bool = False) -> None:
        """Publish the posed groups that are done, oldest capture first; a group not done
        and still within its wait holds the later ones back."""
        self.groups.expire()
        published = False
        plans = sorted(
            self.groups.posed_groups(), key=lambda g: min(v[1] for v in g.views.values())
        )
        for plan in plans:
            got = self._results.get(plan.id, {})
            expected = plan.expected()
            done = expected is not None and expected <= got.keys()
            waited = now > max(v[1] for v in plan.views.values()) + self.wait_ns
            if not (done or waited or flush):
                break
            self.counts["timed_out"] += not done
            results = list(self._results.pop(plan.id, {}).values())
            if self.groups.live and expected is not None:  # a person detect did not choose
                results = [r for r in results if (r.camera, r.track_id) in expected]
            self.groups.forget(plan.id)
            try:
                result = await asyncio.to_thread(self._reconstruct, plan, results)
            except Exception:
                self.item_failed(results[0] if results else plan)
                continue
            await out.send(result)
            published = True
        if published:  # the residuals change only with a reconstruction
            self._reprojection = {
                f"reprojection_{camera}": f"median {median:.1f} px, offset {dx:+.1f}, {dy:+.1f} "
                f"px over its last {n} points"
                for camera, (median, dx, dy, n) in self.reconstructor.residuals.summary().items()
            }
        self._report_clocks()

    def _report_clocks(self) -> None:
        """Each camera's clock against the rig's, and its recent reprojection error and offset
        as of the last group published (quality.RecentResiduals), on the stats topic (this
        stage's info); a camera whose times start or stop being corrected is logged."""
        report = self.groups.clock_report()
        offsets = self.groups.clock_offsets()
        info = {f"clock_{c}": v for c, v in report.items()}
        self.metrics.add_info(self.name, info | self._reprojection)
        for camera, text in report.items():
            state = text.split(",")[0]
            off = offsets.get(camera)
            self.metrics.set_camera_clock(camera, state, None if off is None else off / 1e6)
            if state != self._clock_states.get(camera, "not judged yet"):
                log.warning("stage %s: camera %r: %s", self.name, camera, text)
            self._clock_states[camera] = state

    def _reconstruct(self, plan: PosedGroup, results: list[PoseResult]) -> Pose3DResult:
        """One released group -> its Pose3DResult (blocking)."""
        self._check_sizes(plan)
        by_camera: dict[str, list[PoseResult]] = defaultdict(list)
        for r in sorted(results, key=lambda r: (r.camera, r.track_id)):
            by_camera[r.camera].append(r)
        if results:
            self._keypoints = int(results[0].keypoints.shape[0])
        k = self._keypoints
        views = {
            camera: View2D(
                tuple(r.track_id for r in rs),
                np.stack([np.asarray(r.keypoints, np.float64).reshape(k, 3) for r in rs]),
            )
            for camera, rs in by_camera.items()
        }
        capture_ts = plan.capture_ts_ns
        people = self.reconstructor(capture_ts / 1e9, views, k)
        self.id_switches.update(capture_ts / 1e9, people.ids, people.points)
        self._count(people)
        if self.options.trc is not None:
            self._record(capture_ts / 1e9, people)
        points = np.concatenate(
            [people.points, people.confidence[..., None].astype(np.float64)], axis=-1
        )
        first = results[0] if results else None
        return Pose3DResult(
            camera=self.options.rig,
            seq=plan.id,
            capture_ts_ns=capture_ts,
            deadline_ns=plan.deadline_ns,
            backend=first.backend if first else "none",
            model=first.model if first else "none",
            synthetic=any(r.synthetic for r in results),
            cameras=tuple(self.options.cameras),
            points=points.astype(np.float32),
            error=people.error,
            used=people.used.astype(np.uint8),
            person_ids=people.ids,
            tracks=people.tracks,
            views={c: v[0] for c, v in sorted(plan.views.items())},
            missing=plan.missing,
            skew_ns=plan.skew_ns,
            filtered=people.filtered,
            age_ms=(now_ns() - capture_ts) / 1e6,
        )

    def _check_sizes(self, plan: PosedGroup) -> None:
        for cam in self.cameras:
            size = self.groups.sizes.get(cam.name)
            if size is not None and size != cam.size and cam.name not in self._size_warned:
                self._size_warned.add(cam.name)
                log.warning(
                    "stage %s: camera %r sends %dx%d frames, but %s calibrates it at %dx%d: "
                    "its 3D points will be wrong (calibrate at the resolution it streams)",
                    self.name,
                    cam.name,
                    *size,
                    self.calibration_path,
                    *cam.size,
                )

    def _count(self, people: People3D) -> None:
        self.counts["published"] += 1
        self.counts["people"] += len(people.ids)
        self._points_total += people.confidence.size
        self._points_triangulated += int(np.isfinite(people.points[..., 0]).sum())

    def gauges(self) -> dict[str, float]:
        """The rig's sync numbers (RigGroups.gauges) and what it published: groups released,
        those that timed out waiting for poses, people, poses for no pending group, the
        fraction of published keypoints triangulated, with swap_sides the views of a person
        mirrored, with consistency the keypoints triangulated again (past their top speed, off
        their bone length), with fit_bones the limb joints fitted to their bone lengths, the
        rig person ids: made, and switched between people (jumps + rejoins,
        stages/rig/id_switches.py; positions that jumped and came back apart), and over each
        camera's recent points the largest median reprojection error and offset."""
        total = self._points_total
        ids = self.id_switches
        recent = self.reconstructor.residuals.summary().values()
        return {
            "rig_ids": float(ids.new_ids),
            "id_switches": float(ids.switches),
            "id_jumps": float(ids.jumps),
            "id_rejoins": float(ids.rejoins),
            "id_glitches": float(ids.glitches),
            **self.groups.gauges(),
            **{k: float(v) for k, v in self.counts.items()},
            "triangulated_fraction": self._points_triangulated / total if total else 0.0,
            "swapped_views": float(self.reconstructor.swapped_views),
            "consistency_moved": float(self.reconstructor.chosen.moved),
            "consistency_resized": float(self.reconstructor.chosen.resized),
            "bones_fitted": float(self.reconstructor.chosen.fitted),
            "reprojection_px_max": max((r[0] for r in recent), default=0.0),
            "reprojection_offset_px_max": max(
                (math.hypot(r[1], r[2]) for r in recent), default=0.0
            ),
        }

    # -- .trc ---------------------------------------------------------------------------

    def _record(self, t_s: float, people: People3D) -> None:
        for p, rid in enumerate(people.ids):
            times, frames = self._trc.setdefault(rid, ([], []))
            if len(times) < self.options.trc_max_frames:
                times.append(t_s)
                frames.append(people.points[p].astype(np.float32))

    def _write_trc(self) -> None:
        """Each rig person's trajectory as <trc stem>_person<id>.trc (Pose2Sim writes one
        file per person)."""
        base = self.context.config.base_dir / self.options.trc
        for rid, (times, frames) in sorted(self._trc.items()):
            path = base.with_name(f"{Path(base).stem}_person{rid}{base.suffix or '.trc'}")
            k = frames[0].shape[0]
            names = None if k == len(keypoints308.NAMES) else [f"k{i}" for i in range(k)]
            try:
                write_trc(
                    path,
                    np.stack(frames),
                    np.asarray(times),
                    names=names,
                    rate=None if len(times) > 1 else self.min_fps,
                )
            except TrcError as exc:
                log.error("stage %s: %s", self.name, exc)
                continue
            log.info("stage %s: wrote %s (%d frames)", self.name, path, len(times))
