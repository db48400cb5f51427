"""Frames for the `preview/<camera>` topic: which cameras a subscriber wants, and how often.

A publish stage with `preview = true` owns a PreviewTap. It follows the subscriptions its XPUB
socket reports (a prefix matching `preview/<camera>` is a viewer of that camera) and rate
limits each camera to `preview_fps` on the capture clock. A stage that consumes frames
before publish (detect) asks the taps of its targets and sends a PreviewFrame, a reference
to the frame it already holds, only when one is due: no viewer, no JPEG and no queue slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.config import Config
from pipeline.graph import stage_class
from pipeline.messages import Frame
from stages.topic_interest import TopicInterest

TOPIC = "preview/"


@dataclass(slots=True)
class PreviewFrame:
    """A frame on its way to publish's preview topic only. image: uint8 [H, W, 3] BGR."""

    camera: str
    seq: int
    capture_ts_ns: int
    deadline_ns: int
    image: np.ndarray
    source: str = ""

    @classmethod
    def of(cls, frame: Frame) -> PreviewFrame:
        return cls(
            frame.camera,
            frame.seq,
            frame.capture_ts_ns,
            frame.deadline_ns,
            frame.image,
            frame.source,
        )


class PreviewTap(TopicInterest):
    """One publish stage's preview demand: subscriptions per camera (TopicInterest on
    `preview/`) and the per-camera rate."""

    def __init__(self, fps: float, cameras: Sequence[str]) -> None:
        super().__init__(TOPIC, cameras)
        self.interval_ns = round(1e9 / fps)
        self.cameras = self.names
        self._last_ns: dict[str, int] = {}

    def due(self, camera: str, capture_ts_ns: int) -> bool:
        """wanted(camera) and 1 / fps since the camera's last preview (noted when True)."""
        if not self.wanted(camera):
            return False
        last = self._last_ns.get(camera)
        if last is not None and 0 <= capture_ts_ns - last < self.interval_ns:
            return False
        self._last_ns[camera] = capture_ts_ns
        return True


def run_taps(context: Any) -> dict[str, PreviewTap]:
    """The preview taps of one pipeline run, by the name of the publish stage owning each
    (one dict per run, owned by its Context)."""
    return context.shared("stages.preview", dict)


def frame_producers(config: Config, index: int) -> list[str]:
    """Names of the stages that can send frames to stages[index]: sources, and stages that
    take frames (detect, which sends PreviewFrames)."""
    names = config.stage_names
    target = names[index]
    found = []
    for i, stage in enumerate(config.stages):
        to = stage.to if stage.to is not None else names[i + 1 : i + 2]
        if target not in to:
            continue
        try:
            accepts = stage_class(stage.kind).accepts
        except LookupError:
            continue
        if not accepts or any(issubclass(Frame, a) for a in accepts):
            found.append(names[i])
    return found
