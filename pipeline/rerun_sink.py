"""npucam's output messages (docs/protocol.md) logged to a Rerun recording (rerun-sdk, the
optional extra `rerun`): each camera's preview JPEGs with its 2D skeletons, and each rig's 3D
people and fitted bodies, on one timeline, `capture` (the frames' capture time).

Entities (docs/rerun.md):
- `cameras/<camera>/image`: the preview JPEG (rr.EncodedImage), scaled up to the frame's
  pixels (rr.Transform3D scale = det's width / the preview's) so it lies under the skeletons;
- `cameras/<camera>/live_pose/<track_id>`: a per-frame pose (detect's `live`), and
  `cameras/<camera>/pose/<track_id>` a Sapiens2 pose (rr.Points2D, full-frame pixels,
  keypoints with a score above 0); `det` boxes at `cameras/<camera>/boxes` (rr.Boxes2D);
- `rigs/<rig>/people/<person_id>`: a pose3d person (rr.Points3D, metres, its triangulated
  keypoints); a person absent from the next message is cleared;
- `rigs/<rig>/bodies/<person_id>`: the ANNY body's fitted keypoints (rr.Points3D).
Points carry class 0 and their keypoint index, and the `meta` message's skeleton is logged
once as the recording's rr.AnnotationContext, so Rerun draws the limbs (rerun's
`ClassDescription.keypoint_connections`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np
import rerun as rr

from pipeline.wire import Message

TIMELINE = "capture"
KINDS = ("meta", "preview", "det", "pose", "pose3d", "body")


class RerunSink:
    """`log(message)` -> whether it was logged; `logged` counts the messages by kind."""

    def __init__(self, recording: rr.RecordingStream) -> None:
        self.rec = recording
        self.logged: Counter[str] = Counter()
        self._frame_width: dict[str, int] = {}  # camera -> det's frame width
        self._people: dict[str, set[int]] = {}  # entity root -> ids on it last time

    def log(self, msg: Message) -> bool:
        kind = msg.header.get("kind")
        if kind not in KINDS:
            return False
        if kind == "meta":
            self._meta(msg.header.get("meta", {}))
        else:
            self.rec.set_time(
                TIMELINE, timestamp=np.datetime64(int(msg.header["capture_ts"]), "ns")
            )
            getattr(self, f"_{kind}")(msg)
        self.logged[kind] += 1
        return True

    def _meta(self, meta: dict) -> None:
        pose = meta.get("pose", {})
        names = pose.get("names", [])
        edges = [(int(a), int(b)) for a, b, *_ in pose.get("skeleton", [])]
        self.rec.log(
            "/",
            rr.AnnotationContext(
                [
                    rr.ClassDescription(
                        info=rr.AnnotationInfo(id=0, label="person"),
                        keypoint_annotations=[
                            rr.AnnotationInfo(id=i, label=n) for i, n in enumerate(names)
                        ],
                        keypoint_connections=edges,
                    )
                ]
            ),
            static=True,
        )

    def _preview(self, msg: Message) -> None:
        camera = msg.header["camera"]
        width = int(msg.header["width"])
        scale = self._frame_width.get(camera, width) / width
        path = f"cameras/{camera}/image"
        self.rec.log(path, rr.Transform3D(scale=[scale, scale, 1.0]))
        self.rec.log(
            path,
            rr.EncodedImage(contents=msg.arrays["jpeg"].tobytes(), media_type="image/jpeg"),
        )

    def _det(self, msg: Message) -> None:
        camera = msg.header["camera"]
        self._frame_width[camera] = int(msg.header["width"])
        boxes = msg.arrays.get("boxes")
        if boxes is not None and len(boxes):
            self.rec.log(
                f"cameras/{camera}/boxes",
                rr.Boxes2D(
                    array=boxes.astype(np.float32),
                    array_format=rr.Box2DFormat.XYXY,
                    labels=[str(lb) for lb in msg.header.get("labels", [])],
                ),
            )
        else:
            self.rec.log(f"cameras/{camera}/boxes", rr.Clear(recursive=False))

    def _pose(self, msg: Message) -> None:
        kp = msg.arrays["keypoints"]
        keep = np.flatnonzero(np.isfinite(kp[:, :2]).all(axis=1) & (kp[:, 2] > 0))
        kind = "live_pose" if msg.header.get("live") else "pose"
        path = f"cameras/{msg.header['camera']}/{kind}/{msg.header['track_id']}"
        self.rec.log(path, rr.Points2D(kp[keep, :2], class_ids=0, keypoint_ids=keep))

    def _pose3d(self, msg: Message) -> None:
        points = msg.arrays["points"]
        root = f"rigs/{msg.header['camera']}/people"
        self._people_3d(root, msg.header["person_ids"], points[..., :3])

    def _body(self, msg: Message) -> None:
        root = f"rigs/{msg.header['camera']}/bodies"
        self._people_3d(root, msg.header["person_ids"], msg.arrays["keypoints"], ordered=False)

    def _people_3d(
        self, root: str, ids: Iterable[int], points: np.ndarray, ordered: bool = True
    ) -> None:
        """Each person's finite points at root/<id>, keypoint ids their row indices when the
        rows are the 308 keypoints (ordered); the ids seen last time and not now cleared."""
        now = [int(i) for i in ids]
        for pid, xyz in zip(now, points, strict=True):
            keep = np.flatnonzero(np.isfinite(xyz).all(axis=1))
            cloud = (
                rr.Points3D(xyz[keep], class_ids=0, keypoint_ids=keep)
                if ordered
                else rr.Points3D(xyz[keep])
            )
            self.rec.log(f"{root}/{pid}", cloud)
        for gone in self._people.get(root, set()) - set(now):
            self.rec.log(f"{root}/{gone}", rr.Clear(recursive=False))
        self._people[root] = set(now)
