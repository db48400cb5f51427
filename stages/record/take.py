"""`npucam process`'s take (docs/recording.md): the messages a publish stage sends during the
pass, written frame by frame in recorded order as they complete, with the recording's own
capture times and without the fields that only say when this run ran (so a resumed pass writes
what an uninterrupted one does); a checkpoint, replaced atomically after every write, says how
far each camera got. The .trc files (stages/rig/trc.py) are made from the 3D lines at the end,
and the body exports (stages/body/recording.py) from the body lines.

OUT/2d/<camera>.jsonl   a line a frame: seq, capture_ts_ns, det, poses (Sapiens2), live
OUT/3d/<rig>.jsonl      a line a pose3d message; OUT/3d/<rig>_person<id>.trc
OUT/body/<rig>.jsonl    a line a body message; OUT/body/<rig>_person<id>.trc, and .mot, .bvh
                        (.glb) as `exports` asks
OUT/checkpoint.json     {"cameras": {camera: last seq written}, "groups": {rig: last group
                        written}, "files": {path: bytes}, "poses": Sapiens2 poses written}
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TextIO

import numpy as np
from pydantic import Field

from pipeline import wire
from pipeline.assets import ANNY_MODEL, asset_path
from pipeline.errors import NpucamError
from pipeline.graph import Context, Outbox, Stage, StageOptions
from pipeline.messages import Frame
from pipeline.queues import BoundedQueue
from stages import publish
from stages.body.model import AnnyModel
from stages.body.recording import BodyRecording
from stages.record.frame_log import FRAMES_DIR, INDEX_SUFFIX, read_index
from stages.record.segments import segment_stems
from stages.rig.trc import TrcError, write_trc

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.json"
# a body line's arrays, in stages/body/recording.py BodyRecording.add_frame's order
BODY_PARTS = ("keypoints", "rotations", "translation", "phenotype")
# header fields that say when this run ran, not what the recording holds
VOLATILE = frozenset(
    ("capture_ts", "capture_ts_str", "publish_ts", "publish_ts_str", "age_ms", "since_previous_ms")
)
OWN_TOPICS = ("det/", "pose/", "pose3d/", "body/")  # the rest (stats, meta) is not the take's


class TakeError(NpucamError):
    """A take folder the pass cannot resume (a checkpoint that does not match it)."""


@dataclass
class _Frame:
    det: dict | None = None
    poses: dict[int, dict] = field(default_factory=dict)
    live: list[dict] = field(default_factory=list)


@dataclass
class Checkpoint:
    """How far a take got: each camera's last seq written, each rig's last group written,
    and the size of every file at that point (the bytes after it are from an unfinished
    write)."""

    cameras: dict[str, int] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)
    poses: int = 0  # Sapiens2 poses in the 2D files

    @classmethod
    def read(cls, out: Path) -> Checkpoint:
        path = out / CHECKPOINT
        if not path.exists():
            return cls()
        try:
            data = json.loads(path.read_text())
            return cls(
                dict(data["cameras"]), dict(data["groups"]), dict(data["files"]), data["poses"]
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise TakeError(f"{path}: not a take checkpoint: {exc}") from None

    def write(self, out: Path) -> None:
        """Replace the checkpoint atomically (a process killed meanwhile leaves the old one)."""
        tmp = out / (CHECKPOINT + ".tmp")
        data = {
            "cameras": self.cameras,
            "groups": self.groups,
            "files": self.files,
            "poses": self.poses,
        }
        tmp.write_text(json.dumps(data, sort_keys=True))
        os.replace(tmp, out / CHECKPOINT)


def message_json(parts: Sequence[bytes], recorded_ns: int | None) -> dict:
    """A wire message as {"topic", "header", "arrays"}: the header without VOLATILE fields,
    its capture time the recorded one (capture_ts_ns); arrays as nested lists."""
    message = wire.decode(list(parts))
    header = {k: v for k, v in message.header.items() if k not in VOLATILE}
    header["capture_ts_ns"] = recorded_ns
    arrays = {k: v.tolist() for k, v in message.arrays.items()}
    return {"topic": message.topic, "header": header, "arrays": arrays}


class TakeWriter:
    """Writes the take. order: camera -> its recorded seqs in order; recorded: camera -> seq ->
    recorded capture time (ns); rigs: rig -> its cameras; bodies: the rigs with a body
    stage; poses: whether each tracked person gets a Sapiens2 pose on every frame (a frame
    is complete only once they came). A frame is written once it is complete: the camera's
    next det came (so the live poses detect sends with it did too), its poses came, and, for
    a rig's camera, a later or its own group's pose3d (and body) came. Not thread-safe: one
    caller (the publish stage's tap, on the loop). exports: the body files written besides
    the .trc (`mot`, `bvh`, `gltf`), from the ANNY model made by `make setup`."""

    def __init__(
        self,
        out: Path,
        order: dict[str, list[int]],
        recorded: dict[str, dict[int, int]],
        rigs: dict[str, list[str]],
        bodies: set[str],
        poses: bool,
        exports: Sequence[str] = (),
    ) -> None:
        self.out = out
        self.exports = tuple(exports)
        self.recorded = recorded
        self.rigs = rigs
        self.bodies = bodies
        self.poses = poses
        self.rig_of = {c: r for r, cams in rigs.items() for c in cams}
        self.checkpoint = Checkpoint.read(out)
        self._truncate()
        self._order = {c: list(seqs) for c, seqs in order.items()}
        self._next = {c: 0 for c in order}  # index in _order of the camera's next frame
        for camera, last in self.checkpoint.cameras.items():
            seqs = self._order.get(camera, [])
            self._next[camera] = sum(1 for s in seqs if s <= last)
        self._frames: dict[str, dict[int, _Frame]] = {c: {} for c in order}
        self._last_det: dict[str, int] = {}
        self._pose3d: dict[str, list[tuple[int, dict, dict]]] = {r: [] for r in rigs}
        self._bodies: dict[str, dict[int, list[bytes]]] = {r: {} for r in rigs}
        self._watermark: dict[str, dict[str, int]] = {r: {} for r in rigs}  # rig -> cam -> seq
        self._files: dict[str, TextIO] = {}
        self.frames_written = sum(self._next.values())
        self.poses_written = self.checkpoint.poses
        self.finished = False

    @property
    def total_frames(self) -> int:
        return sum(len(s) for s in self._order.values())

    def resume_after(self) -> dict[str, int]:
        """camera -> the last seq the take holds (detect's `jobs_after`)."""
        return dict(self.checkpoint.cameras)

    def message(self, parts: Sequence[bytes]) -> None:
        topic = bytes(parts[0]).decode()
        if not topic.startswith(OWN_TOPICS):
            return
        kind, _, camera = topic.partition("/")
        header = json.loads(bytes(parts[1]))
        seq = header["seq"]
        if kind in ("det", "pose"):
            if camera not in self._frames:
                return
            if kind == "det":
                self._last_det[camera] = max(seq, self._last_det.get(camera, -1))
            if seq <= self.checkpoint.cameras.get(camera, -1):
                return  # the pass being resumed wrote it
            frame = self._frames[camera].setdefault(seq, _Frame())
            entry = message_json(parts, self.recorded[camera].get(seq))
            if kind == "det":
                frame.det = entry
            elif header.get("live"):
                frame.live.append(entry)
            else:
                frame.poses[header["track_id"]] = entry
        elif kind == "pose3d" and camera in self._pose3d:
            if seq > self.checkpoint.groups.get(camera, -1):
                views = {c: int(s) for c, s in header["views"].items()}
                self._pose3d[camera].append((seq, views, self._group_json(parts, views)))
        elif kind == "body" and camera in self._bodies:
            self._bodies[camera][seq] = list(parts)
        self._write_ready()

    @property
    def complete(self) -> bool:
        """Every recorded frame's det came (the pass was not interrupted)."""
        return all(
            not seqs or self._last_det.get(c, -1) >= seqs[-1] for c, seqs in self._order.items()
        )

    def finish(self) -> None:
        """The pass ended: if it was not interrupted, write every frame and group that came
        (a pose missing now was dropped), then the .trc files; if it was, only what is
        complete, so the resumed pass takes the rest."""
        self.finished = self.complete
        self._write_ready()
        for f in self._files.values():
            f.close()
        self._files.clear()
        if not self.finished:
            return
        for rig in self.rigs:
            self._trc(self.out / "3d" / f"{rig}.jsonl")
            if rig in self.bodies:
                self._body_files(self.out / "body" / f"{rig}.jsonl")

    def _group_json(self, parts: Sequence[bytes], views: dict[str, int]) -> dict:
        times = [self.recorded[c][s] for c, s in views.items() if s in self.recorded.get(c, {})]
        return message_json(parts, sum(times) // len(times) if times else None)

    def _write_ready(self) -> None:
        wrote = self._write_groups()
        for camera in self._order:
            while self._frame_ready(camera):
                seq = self._order[camera][self._next[camera]]
                frame = self._frames[camera].pop(seq, _Frame())
                self._append(f"2d/{camera}.jsonl", self._frame_line(camera, seq, frame))
                self.poses_written += len(frame.poses)
                self._next[camera] += 1
                self.frames_written += 1
                self.checkpoint.cameras[camera] = seq
                self.checkpoint.poses = self.poses_written
                wrote = True
        if wrote:
            for name, f in self._files.items():
                f.flush()
                self.checkpoint.files[name] = f.tell()
            self.checkpoint.write(self.out)

    def _write_groups(self) -> bool:
        wrote = False
        for rig, pending in self._pose3d.items():
            while pending:
                seq, views, entry = pending[0]
                body = self._bodies[rig].pop(seq, None)
                later = any(s > seq for s in self._bodies[rig])  # so its body failed
                if rig in self.bodies and body is None and not self.finished and not later:
                    break  # its body has not come yet
                pending.pop(0)
                self._append(f"3d/{rig}.jsonl", entry)
                if body is not None:
                    self._append(f"body/{rig}.jsonl", self._group_json(body, views))
                self._watermark[rig].update(views)
                self.checkpoint.groups[rig] = seq
                wrote = True
        return wrote

    def _frame_ready(self, camera: str) -> bool:
        i = self._next[camera]
        if i >= len(self._order[camera]):
            return False
        if self.finished:
            return True
        seq = self._order[camera][i]
        frame = self._frames[camera].get(seq)
        if frame is None or frame.det is None or self._last_det.get(camera, -1) <= seq:
            return False
        if self.poses:
            header = frame.det["header"]
            labels = header.get("labels", [])
            ids = header.get("track_ids", [])
            tracked = {t for t, lab in zip(ids, labels, strict=False) if lab == "person"}
            if not tracked - {None} <= set(frame.poses):
                return False
        rig = self.rig_of.get(camera)
        return rig is None or self._watermark[rig].get(camera, -1) >= seq

    def _frame_line(self, camera: str, seq: int, frame: _Frame) -> dict:
        return {
            "seq": seq,
            "capture_ts_ns": self.recorded[camera].get(seq),
            "det": frame.det,
            "poses": [frame.poses[t] for t in sorted(frame.poses)],
            "live": sorted(frame.live, key=lambda e: e["header"].get("track_id") or -1),
        }

    def _append(self, name: str, line: dict) -> None:
        f = self._files.get(name)
        if f is None:
            path = self.out / name
            path.parent.mkdir(parents=True, exist_ok=True)
            f = self._files[name] = open(path, "a")  # noqa: SIM115 - open for the whole pass
        f.write(json.dumps(line) + "\n")

    def _truncate(self) -> None:
        """Cut every file back to its size at the checkpoint; a file the checkpoint does not
        know was begun after it and goes."""
        self.out.mkdir(parents=True, exist_ok=True)
        for folder in ("2d", "3d", "body"):
            for path in sorted((self.out / folder).glob("*.jsonl")):
                name = f"{folder}/{path.name}"
                size = self.checkpoint.files.get(name)
                if size is None:
                    path.unlink()
                elif path.stat().st_size < size:
                    raise TakeError(f"{path}: shorter than its checkpoint ({size} bytes)")
                else:
                    os.truncate(path, size)

    def _trc(self, path: Path) -> None:
        """One .trc per rig person of a rig's 3D lines (person_ids, [P, K, 4] points)."""
        if not path.exists():
            return
        tracks: dict[int, tuple[list[float], list[np.ndarray]]] = {}
        for text in path.read_text().splitlines():
            line = json.loads(text)
            header, points = line["header"], np.asarray(line["arrays"]["points"], np.float64)
            for p, person in enumerate(header["person_ids"]):
                times, frames = tracks.setdefault(person, ([], []))
                t = header["capture_ts_ns"] / 1e9
                if not times or t > times[-1]:
                    times.append(t)
                    frames.append(points[p, :, :3])
        for person, (times, frames) in sorted(tracks.items()):
            if len(times) < 2:
                continue  # one frame has no rate
            try:
                write_trc(
                    path.with_name(f"{path.stem}_person{person}.trc"),
                    np.stack(frames),
                    np.asarray(times),
                )
            except TrcError as exc:
                raise TakeError(f"{path}: person {person}: {exc}") from None

    def _body_files(self, path: Path) -> None:
        """The .trc and the formats of `exports` per fitted person of a rig's body lines (2+
        frames), made as the body stage makes its own (stages/body/recording.py); the
        keypoint names are those of the lines with people."""
        if not path.exists():
            return
        recording = BodyRecording(
            AnnyModel.load(asset_path(ANNY_MODEL)),
            {fmt: path.with_suffix("") for fmt in ("trc", *self.exports)},
            max_frames=sys.maxsize,
        )
        for text in path.read_text().splitlines():
            line = json.loads(text)
            header, arrays = line["header"], line["arrays"]
            t = header["capture_ts_ns"] / 1e9
            if header["person_ids"]:
                recording.names = tuple(header["keypoints"])
            for p, person in enumerate(header["person_ids"]):
                times = recording.people[person].times if person in recording.people else []
                if times and t <= times[-1]:
                    continue
                recording.add_frame(
                    person,
                    t,
                    *(np.asarray(arrays[k][p], np.float64) for k in BODY_PARTS),
                )
        expected = sum(len(t.times) >= 2 for t in recording.people.values()) * len(recording.paths)
        if len(recording.write("take")) < expected:
            raise TakeError(f"{path}: a body file failed to write (the log says which)")


class TakeOptions(StageOptions):
    out: str = Field(min_length=1)  # the take folder
    session: str = Field(min_length=1)  # the recording the pass reads
    publish: str = Field(min_length=1)  # the publish stage whose messages make the take
    poses: bool = True  # every tracked person gets a Sapiens2 pose on every frame
    rigs: dict[str, list[str]] = {}  # rig -> its cameras (its rig3d stage's)
    bodies: list[str] = []  # the rigs a body stage fits
    exports: list[Literal["mot", "bvh", "gltf"]] = []  # body files besides the .trc


class Take(Stage[TakeOptions]):
    """The publish stage's messages -> the take (TakeWriter). Nothing comes to its inbox
    (publish sends nothing on): it is named in publish's `to` so the engine wires it, and it
    ends once publish has sent its last message."""

    kind = "take"
    accepts = (Frame,)
    Options = TakeOptions

    def __init__(self, name: str, options: TakeOptions, context: Context) -> None:
        super().__init__(name, options, context)
        session = Path(options.session)
        order, recorded = recorded_frames(session)
        self.writer = TakeWriter(
            Path(options.out),
            order,
            recorded,
            options.rigs,
            set(options.bodies),
            options.poses,
            options.exports,
        )
        self.error: Exception | None = None
        self.taps = publish.taps(context, options.publish)
        self.taps.callables.append(self._tap)

    def _tap(self, parts: list) -> None:
        if self.error is not None:
            return
        try:
            self.writer.message(parts)
        except Exception as exc:  # kept for the end: publish must go on
            log.exception("stage %s: the take cannot be written", self.name)
            self.error = exc

    async def run(self, inbox: BoundedQueue | None, out: Outbox) -> None:
        assert inbox is not None
        async for _ in inbox:
            pass
        await asyncio.to_thread(self.taps.done.wait, self.context.config.pipeline.drain_timeout_s)
        if self.error is not None:
            raise self.error
        await asyncio.to_thread(self.writer.finish)


def recorded_frames(session: Path) -> tuple[dict[str, list[int]], dict[str, dict[int, int]]]:
    """The session's recorded frames: camera -> its seqs in order, and camera -> seq -> its
    recorded capture time (ns)."""
    order: dict[str, list[int]] = {}
    recorded: dict[str, dict[int, int]] = {}
    for folder in sorted((session / FRAMES_DIR).iterdir()):
        if folder.is_dir():
            entries = [
                e
                for stem in segment_stems(folder, INDEX_SUFFIX)
                for e in read_index(stem.with_suffix(INDEX_SUFFIX))
            ]
            order[folder.name] = [e.seq for e in entries]
            recorded[folder.name] = {e.seq: e.capture_ts_ns for e in entries}
    return order, recorded
