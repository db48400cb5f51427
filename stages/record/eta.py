"""`npucam process`'s ETA: the device time the planner prices the pass's work at (a Sapiens2
pose per tracked person per frame; stages/planning/npu.py's device_costs on the config), for the
frames left at the persons per frame seen so far, scaled toward the measured pace (elapsed time
over the planned time of the work done) as frames are measured. Pure: the caller passes the
elapsed time (a test, a virtual clock's)."""

from __future__ import annotations

from dataclasses import dataclass

PRIOR_FRAMES = 2.0  # the planner's costs weigh as much as this many measured frames


@dataclass(frozen=True)
class Estimate:
    """remaining_s: the ETA; planned_s: the planner's time for what is left; pace: measured
    seconds per planned second so far (1.0 before anything is done)."""

    remaining_s: float
    planned_s: float
    pace: float


@dataclass(frozen=True)
class PassCost:
    """pose_s: device seconds of one Sapiens2 pose (the planner's item time); frame_s: device
    seconds a frame costs besides its poses (0 with no other model in the pass)."""

    pose_s: float
    frame_s: float = 0.0

    def planned_s(self, frames: float, poses: float) -> float:
        return frames * self.frame_s + poses * self.pose_s


def estimate(
    cost: PassCost, frames_left: int, frames_done: int, poses_done: int, elapsed_s: float
) -> Estimate | None:
    """The ETA of `frames_left` frames, from the frames and poses done in the last `elapsed_s`
    seconds (counted from a frame that was done, so the start-up is not in the pace); None
    before one is done (no persons per frame known yet). The planned time left is the frames
    left at the poses per frame seen, at the planner's costs; it is scaled by
    1 + w * (pace - 1), w = n / (n + PRIOR_FRAMES) for n frames measured: the planner counts
    as PRIOR_FRAMES frames of evidence, and the measured pace takes over as the pass goes
    (the host's detection, not the device, may be what sets it)."""
    if frames_done <= 0:
        return None
    per_frame = poses_done / frames_done
    planned_left = cost.planned_s(frames_left, frames_left * per_frame)
    planned_done = cost.planned_s(frames_done, poses_done)
    pace = elapsed_s / planned_done if planned_done > 0 else 1.0
    w = frames_done / (frames_done + PRIOR_FRAMES)
    return Estimate(planned_left * (1.0 + w * (pace - 1.0)), planned_left, pace)
