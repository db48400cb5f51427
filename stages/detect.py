"""The `detect` stage: frames -> det results and the NPU stage's work.

Person boxes (BlazePose, an ONNX detector, fixed regions, or an external detector over
ZeroMQ: stages.box_receiver) are tracked per camera (stages.tracker, shared with the dark
stage through stages.tracks.TrackRegistry); faces come from BlazeFace or YuNet, in the frame
or inside each person box. Each frame gives a Detections message (det/<camera>) and its
targets (tracked persons, faces with their alignment points, regions, the frame itself); the
one job policy (stages.job_policy) picks which enabled model gets a job on which target, and
the model's runtime makes it: Sapiens2 refreshes the tracks whose pose is oldest, AdaFace
takes faces, CLIP rate-limited regions, and a model from elsewhere what its spec declares.
A camera of a rig (a rig3d stage, stages.rig.groups) is posed by the rig instead: each frame
is placed in its rig's group, and only frames of posed groups get pose jobs, one per tracked
person (the largest boxes first, up to the rig's max_people), tagged with the group.
With `live` (stages.live_pose), MediaPipe's landmark models follow each person on every
frame, their boxes are the person boxes, and each tracked person's per-frame pose goes out
beside the Detections. Detectors and landmark models run on the stage's worker threads, each
camera pinned to one (stages.detect_workers; LiteRT interpreters stay on the thread that made
them).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from npu import models
from npu.models import RunsOn
from pipeline import security
from pipeline.config import Config
from pipeline.files import path_kind
from pipeline.graph import Outbox, Stage, StageOptions
from pipeline.messages import Detections, Frame, now_ns
from pipeline.queues import BoundedQueue, QueueClosed
from pipeline.startup import Startup
from stages import job_policy
from stages.align import blazeface_alignment_points
from stages.box_receiver import MAX_BOXES, MAX_MESSAGE_BYTES, BoxReceiver, BoxReceiverError
from stages.detect_workers import Lane, default_workers, lane_of
from stages.detectors.detections import DetectorOutput
from stages.infer_options import enabled_models
from stages.jobs import Job
from stages.live_pose import CameraLive, LiveOptions, LivePerson
from stages.preview import PreviewFrame, PreviewTap, run_taps
from stages.rig.groups import RigRegistry
from stages.runtimes import runtime_class
from stages.tracker import MAX_TRACKS, PersonTracker, iou_matrix
from stages.tracks import CameraTracks, NewestFrame, TrackRegistry

MIN_FACE_SEARCH_PX = 8  # face_in = "persons": person boxes narrower or lower are skipped
FACE_DUPLICATE_IOU = 0.5  # face_in = "persons": the same face found in two person boxes


class RegionOptions(StageOptions):
    """One fixed region: x, y, w, h in pixels, or fractions of the frame when normalized."""

    name: str = Field(min_length=1)
    x: float
    y: float
    w: float = Field(gt=0)
    h: float = Field(gt=0)
    normalized: bool = False


class TrackerOptions(StageOptions):
    """stages.tracker.PersonTracker's parameters (docs/scheduler.md)."""

    high_score: float = Field(0.5, ge=0, le=1)
    low_score: float = Field(0.1, ge=0, le=1)
    new_track_score: float = Field(0.6, ge=0, le=1)
    match_iou: float = Field(0.2, gt=0, le=1)
    low_match_iou: float = Field(0.5, gt=0, le=1)
    lost_buffer_s: float = Field(1.0, ge=0)
    max_tracks: int = Field(MAX_TRACKS, ge=1, le=100_000)  # live + lost tracks per camera


class DetectOptions(StageOptions):
    cameras: list[str] | None = None  # cameras this stage detects on; others pass through
    person: Literal["blazepose", "onnx", "roi", "zmq", "none"] = "blazepose"
    person_min_score: float = Field(0.5, ge=0, le=1)
    person_model: str | None = Field(None, min_length=1)  # onnx file; or a pose_detection.tflite
    person_format: Literal["yolov8", "yolov5", "detr"] = "yolov8"
    person_input_size: int = Field(640, ge=32)
    person_class: int = Field(0, ge=0)
    person_regions: list[RegionOptions] = []
    boxes_endpoint: str | None = Field(None, min_length=1)  # person = "zmq": where to SUBscribe
    boxes_max_age_ms: float = Field(500.0, gt=0)
    # person = "zmq": a message with more boxes, or more bytes, is refused (counted)
    boxes_max_per_message: int = Field(MAX_BOXES, ge=1, le=100_000)
    boxes_max_message_bytes: int = Field(MAX_MESSAGE_BYTES, ge=1024, le=1 << 30)
    face: Literal["blazeface", "yunet", "roi", "none"] = "blazeface"
    face_variant: Literal["short", "full"] = "short"
    face_min_score: float | None = Field(None, ge=0, le=1)
    face_model: str | None = Field(None, min_length=1)  # yunet onnx; or a BlazeFace tflite
    face_regions: list[RegionOptions] = []  # face = "roi": BlazeFace inside each region
    # where faces are looked for: the whole frame, or inside each person box (small faces
    # in a wide frame become large in the box's crop)
    face_in: Literal["frame", "persons"] = "frame"
    tracker: TrackerOptions = TrackerOptions()
    pose: bool = True
    pose_jobs_per_frame: int = Field(1, ge=0)
    # a track whose pose job brought no result for this long gets a new job (the infer stage
    # may have dropped it; a queued job of the same track is replaced); None: at its deadline
    pose_retry_s: float | None = Field(None, gt=0)
    # npucam process (stages/record/process.py): every tracked person gets a pose job on every
    # frame, on that frame (no one-in-flight limit, no move to the track's newest frame)
    pose_every_frame: bool = False
    # npucam process resuming: camera -> seq; the camera's frames up to that seq are tracked
    # (so the trackers are as in an uninterrupted pass) but make no jobs
    jobs_after: dict[str, int] = {}
    faces: bool = True  # face jobs (to align and infer) for the faces found
    face_interval_s: float = Field(0.0, ge=0)  # min time between frames with face jobs
    clip: Literal["off", "persons", "frame"] = "off"
    clip_interval_s: float = Field(1.0, ge=0)
    clip_max_per_frame: int = Field(4, ge=1)
    # the per-frame whole-body pose (stages.live_pose): with it, person boxes come from the
    # landmark models following each person, and BlazePose detects only when tracking needs it
    live: LiveOptions = LiveOptions()
    # worker threads for detection and landmarks, each camera pinned to one; None: the cores
    # left after the NPU stage's host glue (stages.detect_workers.default_workers)
    workers: int | None = Field(None, ge=1, le=64)


def person_tracker(t: TrackerOptions, camera: str) -> PersonTracker:
    """A PersonTracker with the detect stage's tracker options (also npucam plan's)."""
    return PersonTracker(
        camera,
        high_score=t.high_score,
        low_score=t.low_score,
        new_track_score=t.new_track_score,
        match_iou=t.match_iou,
        low_match_iou=t.low_match_iou,
        lost_buffer_s=t.lost_buffer_s,
        max_tracks=t.max_tracks,
    )


def _xywh_to_xyxy(boxes: np.ndarray) -> np.ndarray:
    b = np.asarray(boxes, np.float32).reshape(-1, 4)
    return np.concatenate([b[:, :2], b[:, :2] + b[:, 2:]], axis=1)


def _regions(options: list[RegionOptions]) -> list:
    from stages.detectors.roi import Region

    return [Region(r.name, r.x, r.y, r.w, r.h, r.normalized) for r in options]


class Detect(Stage[DetectOptions]):
    """Frames -> Detections (det/<camera>) + the enabled models' jobs (stages.job_policy)."""

    kind = "detect"
    accepts = (Frame,)
    Options = DetectOptions

    def __init__(self, name, options, context) -> None:
        super().__init__(name, options, context)
        self.startup = Startup.of(context)
        self.startup.expect(name)  # the sources read once the detectors are loaded
        self._local = threading.local()  # each worker thread's own _Detectors
        self._receiver_lock = threading.Lock()
        self.receiver: BoxReceiver | None = None
        self.tracks = TrackRegistry.of(context)
        self.rigs = RigRegistry.of(context)
        # camera -> model -> capture time of its last jobs (models on an interval)
        self._marks: dict[str, dict[str, int]] = {}
        self.wanted = job_policy.wanted(_declared(context.config), options)
        self._cadence = {w.model: w.runs_on.cadence for w in self.wanted}
        # a model refreshes tracks (Sapiens2): keep each track's newest frame for its jobs
        self._refreshes = (
            options.pose and "refresh" in self._cadence.values() and not options.pose_every_frame
        )
        self._makers = {w.model: runtime_class(w.model) for w in self.wanted}
        # person = "none": faces are tracked themselves, so a face still carries a track id
        self._face_trackers: dict[str, PersonTracker] = {}
        self._live: dict[str, CameraLive] = {}
        self.model = "+".join(m for m in (self._person_model(), self._face_model()) if m)

    def _person_model(self) -> str:
        o = self.options
        if o.live.enabled:
            return "mediapipe-landmarks"
        return {
            "blazepose": "blazepose-detector",
            "onnx": f"onnx:{Path(o.person_model or '').name}",
            "roi": "roi",
            "zmq": "external",
            "none": "",
        }[o.person]

    def _face_model(self) -> str:
        o = self.options
        return {
            "blazeface": f"blazeface-{o.face_variant}",
            "yunet": "yunet",
            "roi": f"blazeface-{o.face_variant}-roi",
            "none": "",
        }[o.face]

    @classmethod
    def check(cls, config: Config, index: int) -> list[str]:
        opts = config.stages[index].options
        key = f"stages[{index}]"
        problems = []
        names = [c.name for c in config.cameras]
        for j, cam in enumerate(opts.get("cameras") or []):
            if cam not in names:
                problems.append(f"{key}.cameras[{j}]: no camera named {cam!r}")
        person, face = opts.get("person", "blazepose"), opts.get("face", "blazeface")
        if person == "onnx" and not opts.get("person_model"):
            problems.append(f"{key}.person_model: person = 'onnx' needs the model's .onnx file")
        if person == "roi" and not opts.get("person_regions"):
            problems.append(f"{key}.person_regions: person = 'roi' needs at least one region")
        if person == "zmq" and not opts.get("boxes_endpoint"):
            problems.append(f"{key}.boxes_endpoint: person = 'zmq' needs the detector's endpoint")
        live = opts.get("live")
        if isinstance(live, dict) and live.get("enabled") and person != "blazepose":
            problems.append(
                f"{key}.live: the per-frame pose follows people with MediaPipe's landmark "
                f"models and seeds them with BlazePose: it needs person = 'blazepose', not "
                f"{person!r}"
            )
        if face == "yunet" and not opts.get("face_model"):
            problems.append(f"{key}.face_model: face = 'yunet' needs the YuNet .onnx file")
        if face == "roi" and not opts.get("face_regions"):
            problems.append(f"{key}.face_regions: face = 'roi' needs at least one region")
        if opts.get("face_in") == "persons" and (person == "none" or face == "roi"):
            problems.append(
                f"{key}.face_in: 'persons' needs a person detector and face = 'blazeface' or "
                "'yunet'"
            )
        for field_name in ("person_model", "face_model"):
            path = opts.get(field_name)
            if isinstance(path, str) and path_kind(config.base_dir / path) != "file":
                problems.append(f"{key}.{field_name}: no such file: {path}")
        if person == "zmq" and isinstance(opts.get("boxes_endpoint"), str):
            problems.extend(security.check_curve(config, bind=False, socket=f"detect {key} boxes"))
        return problems

    @classmethod
    def produces(cls, options: DetectOptions) -> tuple[type, ...]:
        """The job types of the registered models this stage's keys give jobs to: a model
        whose target it finds (persons with a person detector, faces with a face detector,
        regions with `clip`, always the frame) and whose jobs its keys leave on."""
        found = {"frame"}
        if options.person != "none":
            found.add("person")
        if options.face != "none":
            found.add("face")
        if options.clip != "off":
            found.add("region")
        declared = [(m, models.spec(m).runs_on) for m in models.names()]
        return tuple(
            runtime_class(w.model).job_type
            for w in job_policy.wanted(declared, options)
            if w.runs_on.target in found
        )

    @property
    def person_detector(self) -> Any:
        return self._local.detectors.person

    @property
    def face_detector(self) -> Any:
        return self._local.detectors.face

    def load(self) -> None:
        """Build this thread's detectors (a worker's own: LiteRT interpreters stay on the
        thread that made them) and, once per stage, the box receiver; a failure closes the
        receiver if it had started."""
        if getattr(self._local, "detectors", None) is not None:
            return
        try:
            with self._receiver_lock:
                if self.options.person == "zmq" and self.receiver is None:
                    self._start_receiver()
            self._local.detectors = self._build()
        except BaseException:
            self.close()
            raise

    def _start_receiver(self) -> None:
        o = self.options
        curve = security.curve_for(
            self.context.config, bind=False, socket=f"detect {self.name} boxes"
        )
        self.receiver = BoxReceiver(
            o.boxes_endpoint,
            self._cameras(),
            lambda camera: self.metrics.drop(self.name, camera, "error"),
            curve,
            f"detect {self.name} boxes",
            max_boxes=o.boxes_max_per_message,
            max_bytes=o.boxes_max_message_bytes,
        )

    def _build(self) -> _Detectors:
        from stages.detectors.blazeface import BlazeFace
        from stages.detectors.blazepose import BlazePosePerson
        from stages.detectors.onnx_person import OnnxPersonDetector
        from stages.detectors.roi import DetectInRegions, FixedRegions
        from stages.detectors.yunet import YuNet

        o = self.options
        base = self.context.config.base_dir

        def path(p: str | None) -> Path | None:
            return None if p is None else base / p

        d = _Detectors()
        if o.person == "blazepose" and o.live.enabled:
            from stages.landmarks.detection import PoseDetector

            d.live = PoseDetector(path(o.person_model), o.live.detector_min_score)
            if o.live.seed_detector == "blazepose-tiles":
                from stages.landmarks.tiles import TiledDetector

                d.live = TiledDetector(d.live)
        elif o.person == "blazepose":
            d.person = BlazePosePerson(path(o.person_model), o.person_min_score)
        elif o.person == "onnx":
            d.person = OnnxPersonDetector(
                path(o.person_model),
                o.person_format,
                o.person_input_size,
                o.person_class,
                o.person_min_score,
            )
        elif o.person == "roi":
            d.person = FixedRegions(_regions(o.person_regions))
        if o.face in ("blazeface", "roi"):
            face = BlazeFace(o.face_variant, path(o.face_model), o.face_min_score)
            d.face = (
                face if o.face == "blazeface" else DetectInRegions(face, _regions(o.face_regions))
            )
        elif o.face == "yunet":
            kwargs = {} if o.face_min_score is None else {"score_threshold": o.face_min_score}
            d.face = YuNet(path(o.face_model), **kwargs)
        return d

    def gauges(self) -> dict[str, float]:
        """On `stats` and Prometheus (any thread): clock jumps and refused tracks over this
        stage's cameras; with person = "zmq", the box messages received and refused, the
        receiver's reconnects and whether its thread is alive."""
        trackers = [t.tracker for c in self._cameras() if (t := self.tracks.get(c)) is not None]
        trackers += list(self._face_trackers.values())
        out: dict[str, float] = {
            "clock_jumps": sum(t.clock_jumps for t in trackers),
            "tracks_refused": sum(t.tracks_refused for t in trackers),
        }
        live = [self._live[c] for c in self._cameras() if c in self._live]
        if self.options.live.enabled:
            out.update(
                live_frames=sum(c.tracker.frames for c in live),
                live_detector_runs=sum(c.tracker.detector_runs for c in live),
                keyframes_fused=sum(c.keyframes_fused for c in live),
                keyframes_unmatched=sum(c.keyframes_unmatched for c in live),
            )
        r = self.receiver
        if r is not None:
            out.update(
                boxes_received=r.received,
                boxes_malformed=r.malformed,
                boxes_reconnects=r.reconnects,
                box_receiver_alive=float(r.failure is None),
            )
        return out

    def _cameras(self) -> list[str]:
        return self.options.cameras or [c.name for c in self.context.config.cameras]

    def close(self) -> None:
        """Stop the box receiver (blocking; see BoxReceiver.close)."""
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None

    def _tracker(self, camera: str) -> PersonTracker:
        return person_tracker(self.options.tracker, camera)

    def camera_tracks(self, camera: str) -> CameraTracks:
        tracks = self.tracks.get(camera)
        if tracks is None:
            tracks = self.tracks.add(camera, self._tracker(camera))
        return tracks

    def _face_track_ids(self, frame: Frame, faces: DetectorOutput) -> list[int | None]:
        """Track ids of faces tracked on their own (no person detector), by face index."""
        tracker = self._face_trackers.get(frame.camera)
        if tracker is None:
            tracker = self._face_trackers[frame.camera] = self._tracker(frame.camera)
        ids: list[int | None] = [None] * len(faces)
        for tb in tracker.update(_xywh_to_xyxy(faces.boxes), faces.scores, frame.capture_ts_ns):
            ids[tb.detection] = tb.track_id
        return ids

    def live_cost(self) -> tuple[float, int]:
        """(CPU seconds of the landmark models, person-frames) of the per-frame pose so far,
        over every camera (the person detector's time is not in it)."""
        live = list(self._live.values())
        cpu = sum(c.cpu_s - c.detector_cpu_s for c in live)
        return cpu, sum(c.person_frames for c in live)

    def _camera_live(self, camera: str) -> CameraLive:
        live = self._live.get(camera)
        if live is None:  # made on the camera's worker thread, like the detectors
            detector = self._local.detectors.live
            assert detector is not None
            live = self._live[camera] = CameraLive(camera, self.options.live, detector)
        return live

    def _persons(self, frame: Frame) -> tuple[np.ndarray, np.ndarray]:
        """Person boxes float32 [N, 4] xywh and scores float32 [N] of one frame."""
        if self.receiver is not None:
            if self.receiver.failure is not None:  # its thread died: no boxes will come
                raise BoxReceiverError(
                    f"detect {self.name}: the box receiver of {self.receiver.endpoint} stopped: "
                    f"{type(self.receiver.failure).__name__}: {self.receiver.failure}"
                )
            got = self.receiver.latest(
                frame.camera, round(self.options.boxes_max_age_ms * 1e6), now_ns()
            )
            return got.boxes, got.scores
        if self.person_detector is None:
            return np.zeros((0, 4), np.float32), np.zeros(0, np.float32)
        d = self.person_detector.detect(frame.image, "bgr")
        return d.boxes, d.scores

    def _faces(self, image: np.ndarray, person_xywh: np.ndarray) -> DetectorOutput | None:
        """Faces in the frame, or inside each person box (face_in = "persons"; a face two
        overlapping boxes both found is kept once, the higher score)."""
        if self.face_detector is None:
            return None
        if self.options.face_in == "frame":
            return self.face_detector.detect(image, "bgr")
        h, w = image.shape[:2]
        found: list[DetectorOutput] = []
        for x, y, bw, bh in np.asarray(person_xywh, np.float64):
            x0, y0 = max(0, math.floor(x)), max(0, math.floor(y))
            x1, y1 = min(w, math.ceil(x + bw)), min(h, math.ceil(y + bh))
            if x1 - x0 < MIN_FACE_SEARCH_PX or y1 - y0 < MIN_FACE_SEARCH_PX:
                continue
            d = self.face_detector.detect(np.ascontiguousarray(image[y0:y1, x0:x1]), "bgr")
            offset = np.array([x0, y0], np.float32)
            d.boxes = d.boxes.copy()
            d.boxes[:, :2] += offset
            d.keypoints = d.keypoints + offset
            found.append(d)
        if not found:
            return DetectorOutput.empty(0)
        boxes = np.concatenate([d.boxes for d in found])
        scores = np.concatenate([d.scores for d in found])
        keypoints = np.concatenate([d.keypoints for d in found])
        order = np.argsort(-scores, kind="stable")
        iou = iou_matrix(_xywh_to_xyxy(boxes), _xywh_to_xyxy(boxes))
        keep: list[int] = []
        for i in order:
            if all(iou[i, j] <= FACE_DUPLICATE_IOU for j in keep):
                keep.append(int(i))
        return DetectorOutput(boxes[keep], scores[keep], keypoints[keep], found[0].names)

    def process(self, frame: Frame) -> list:
        """One frame -> [Detections, *live poses, *jobs] (blocking): its persons (with `live`,
        followed by the landmark models, each with its per-frame pose), faces, regions and the
        frame itself as targets, and a job for each (model, target) stages.job_policy picks,
        made by the model's runtime; then the faces the dark stage found in poses."""
        self.load()
        o = self.options
        h, w = frame.image.shape[:2]
        people: list[LivePerson] = []
        if o.live.enabled:
            live = self._camera_live(frame.camera)
            people = live.people(frame)
            person_xywh = np.array([p.box_xywh for p in people], np.float32).reshape(-1, 4)
            person_scores = np.array([p.score for p in people], np.float32)
            # a person the landmark model follows is a confirmed track: the tracker's score
            # thresholds are for detector boxes
            track_scores = np.ones(len(people), np.float32)
        else:
            person_xywh, person_scores = self._persons(frame)
            track_scores = person_scores
        faces = self._faces(frame.image, person_xywh)
        tracks = self.camera_tracks(frame.camera)
        rig = self.rigs.of_camera(frame.camera)
        rig_tag = None
        if rig is not None:
            rig_tag = rig.place(
                frame.camera, frame.seq, frame.capture_ts_ns, frame.deadline_ns, (int(w), int(h))
            )
        with tracks.lock:
            ids, boxes_of = self._track(frame, tracks, person_xywh, track_scores)
            keyframes = list(tracks.keyframes)
            tracks.keyframes.clear()
            if self._refreshes:  # a refresh takes its track's newest frame (Sapiens2Runtime)
                tracks.tracked_on(
                    {
                        tid: NewestFrame(
                            frame.seq,
                            frame.capture_ts_ns,
                            frame.deadline_ns,
                            frame.image,
                            job_policy.xywh(box),
                        )
                        for tid, box in boxes_of.items()
                    }
                )
            # (holding tracks.lock: the tracker's pose queue and tracks); a rig posed by the
            # per-frame poses gets them below, and Sapiens2 refreshes its tracks as keyframes
            by_jobs = rig is not None and not rig.live
            targets = job_policy.person_targets(
                tracks.tracker, boxes_of, o.pose, rig if by_jobs else None,
                rig_tag if by_jobs else None, every=o.pose_every_frame,
            )  # fmt: skip
            face_ids, face_targets = self._face_targets(frame, faces, person_xywh, ids)
            targets += face_targets
            if o.clip != "off":
                xywh = {tid: job_policy.xywh(b) for tid, b in boxes_of.items()}
                targets += job_policy.regions(xywh, (int(w), int(h)), o.clip == "frame")
            targets.append(job_policy.Target("frame", np.array([0, 0, w, h], np.float32)))
            marks = self._marks.setdefault(frame.camera, {})
            picked = job_policy.decide(
                self.wanted, targets, frame.capture_ts_ns, marks,
                refresh_all=(by_jobs and rig_tag is not None) or o.pose_every_frame,
            )  # fmt: skip
            if frame.seq <= o.jobs_after.get(frame.camera, -1):
                picked = []  # written by the pass being resumed: tracked only
            jobs = [self._job(model, target, frame, tracks) for model, target in picked]
        if rig_tag is not None and by_jobs:
            refreshed = [t.track_id for m, t in picked if self._cadence[m] == "refresh"]
            rig.posed(frame.camera, frame.seq, refreshed)
        elif rig_tag is not None and o.live.enabled:  # the per-frame poses pose the group
            rig.posed(frame.camera, frame.seq, rig.chosen(boxes_of))
        if o.faces:
            with tracks.lock:
                jobs.extend(tracks.pose_faces)
                tracks.pose_faces.clear()
        n_faces = 0 if faces is None else len(faces)
        det = Detections(
            camera=frame.camera,
            seq=frame.seq,
            capture_ts_ns=frame.capture_ts_ns,
            deadline_ns=frame.deadline_ns,
            backend="cpu",
            model=self.model or "none",
            width=int(w),
            height=int(h),
            source=frame.source,
            boxes=np.concatenate(
                [_xywh_to_xyxy(person_xywh)]
                + ([_xywh_to_xyxy(faces.boxes)] if faces is not None else [])
            ).reshape(-1, 4),
            scores=np.concatenate(
                [np.asarray(person_scores, np.float32)]
                + ([np.asarray(faces.scores, np.float32)] if faces is not None else [])
            ),
            labels=("person",) * len(person_scores) + ("face",) * n_faces,
            extra={"track_ids": ids + face_ids},
        )
        poses = live.results(frame, people, ids, keyframes) if o.live.enabled else []
        return [det, *poses, *jobs]

    def _track(
        self, frame: Frame, tracks: CameraTracks, person_xywh: np.ndarray, scores: np.ndarray
    ) -> tuple[list[int | None], dict[int, np.ndarray]]:
        """Track a frame's person boxes (call holding tracks.lock): the track id of each
        box (None: not tracked) and the tracked boxes, float32 [4] xyxy by track id."""
        jumps = tracks.tracker.clock_jumps
        tracked = tracks.tracker.update(_xywh_to_xyxy(person_xywh), scores, frame.capture_ts_ns)
        if tracks.tracker.clock_jumps != jumps:
            tracks.clock_jumped(tracks.tracker.last_jump_ns)
        ids: list[int | None] = [None] * len(scores)
        for tb in tracked:
            ids[tb.detection] = tb.track_id
        tracks.expire_poses(now_ns())
        return ids, {tb.track_id: tb.box for tb in tracked}

    def _face_targets(
        self,
        frame: Frame,
        faces: DetectorOutput | None,
        person_xywh: np.ndarray,
        ids: list[int | None],
    ) -> tuple[list[int | None], list[job_policy.Target]]:
        """Each face's track id (its own face track without a person detector, else the
        smallest person box containing it) and the face targets, with their alignment
        points where the detector gives them (YuNet's 5; BlazeFace's 6 -> 4)."""
        if faces is None:
            return [], []
        own_ids = self._face_track_ids(frame, faces) if self.options.person == "none" else None
        person_xyxy = _xywh_to_xyxy(person_xywh)
        face_ids: list[int | None] = []
        targets = []
        for i in range(len(faces)):
            track_id = (
                own_ids[i]
                if own_ids is not None
                else _containing_track(faces.boxes[i], person_xyxy, ids)
            )
            face_ids.append(track_id)
            kp = faces.keypoints[i]
            landmarks, source = None, ""
            if kp.shape[0] == 5:
                landmarks, source = kp, "yunet"
            elif kp.shape[0] == 6:
                landmarks, source = blazeface_alignment_points(kp), "blazeface"
            targets.append(
                job_policy.Target(
                    "face",
                    np.asarray(faces.boxes[i], np.float32),
                    track_id=track_id,
                    score=float(faces.scores[i]),
                    landmarks=None if landmarks is None else np.asarray(landmarks, np.float32),
                    landmark_source=source,
                )
            )
        return face_ids, targets

    def _job(
        self, model: str, target: job_policy.Target, frame: Frame, tracks: CameraTracks
    ) -> Job:
        """Model `model`'s job on a target, made by its runtime; a refresh is marked started
        in its tracker with its retry deadline (call holding tracks.lock)."""
        job = self._makers[model].make_job(target, frame)
        every = self.options.pose_every_frame
        if self._cadence[model] == "refresh" and target.track_id is not None and not every:
            tid = target.track_id
            tracks.tracker.pose_started(tid)
            retry = self.options.pose_retry_s
            tracks.pose_deadlines[tid] = (
                frame.deadline_ns
                if retry is None
                else min(frame.deadline_ns, frame.capture_ts_ns + round(retry * 1e9))
            )
        return job

    async def run(self, inbox: BoundedQueue | None, out: Outbox) -> None:
        """Frames -> the camera's worker (stages.detect_workers): a frame is taken from the
        inbox only while some worker could start it, so with one worker the inbox's `latest`
        policy decides what waits, as before; with more, a frame whose worker is busy waits
        in that worker's lane (the newest per camera; a replaced one is a queue_full drop)."""
        assert inbox is not None
        loop = asyncio.get_running_loop()
        wanted = self.options.cameras
        n = self.options.workers or default_workers()
        pools = [
            ThreadPoolExecutor(1, thread_name_prefix=f"detect-{self.name}-{i}") for i in range(n)
        ]
        lanes = [Lane() for _ in range(n)]
        pinned = lane_of(self._cameras(), n)
        busy = [False] * n
        can_start = asyncio.Event()
        can_start.set()
        previews = _preview_targets(self.context, out)

        def idle_worker() -> bool:
            return any(not b and not len(lane) for b, lane in zip(busy, lanes, strict=True))

        async def work(i: int) -> None:
            while (frame := await lanes[i].get()) is not None:
                busy[i] = True
                try:
                    await self._one(frame, pools[i], out)
                finally:
                    busy[i] = False
                    if idle_worker():
                        can_start.set()

        tasks: list[asyncio.Task] = []
        try:
            try:
                await asyncio.gather(*(loop.run_in_executor(p, self.load) for p in pools))
            finally:
                self.startup.opened(self.name)
            self.metrics.add_gauges(self.name, self.gauges)
            tasks = [asyncio.create_task(work(i)) for i in range(n)]
            while True:
                await can_start.wait()
                try:
                    frame = await inbox.get()
                except QueueClosed:
                    break
                if wanted is not None and frame.camera not in wanted:
                    await out.send(frame)
                    continue
                for tap, queue in previews:
                    # never waits nor evicts a result: a full inbox skips this preview
                    if tap.due(frame.camera, frame.capture_ts_ns) and len(queue) < queue.size:
                        queue.put_nowait(PreviewFrame.of(frame))
                if lanes[pinned.get(frame.camera, 0)].put(frame) is not None:
                    self.metrics.drop(self.name, frame.camera, "queue_full")
                if not idle_worker():
                    can_start.clear()
            for lane in lanes:
                lane.close()
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            # close() joins the receiver's thread, so it runs on a worker, never the loop;
            # queued after every worker's running load or frame (on cancel), so no receiver
            # a load starts outlives it. Shielded: a second cancel must not unqueue it.
            others = [pool.submit(_nothing) for pool in pools[1:]]
            closed = loop.run_in_executor(pools[0], self._close_after, others)
            for pool in pools:
                pool.shutdown(wait=False)
            await asyncio.shield(closed)

    async def _one(self, frame: Frame, pool: ThreadPoolExecutor, out: Outbox) -> None:
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        try:
            items = await loop.run_in_executor(pool, self.process, frame)
        except Exception:
            self.item_failed(frame)
            return
        finally:
            self.metrics.observe_work(self.name, time.perf_counter() - start)
        for item in items:
            await out.send(item)

    def _close_after(self, others: list[Future]) -> None:
        """close(), on the first worker, once the other workers ran what they had queued."""
        wait(others)
        self.close()


def _nothing() -> None:
    """A worker's turn that does nothing: it runs once what was queued before it has."""


@dataclass
class _Detectors:
    """One worker thread's detectors (None: not configured). live: the person detector that
    seeds the per-frame landmark tracker (stages.landmarks.detection)."""

    person: Any = None
    face: Any = None
    live: Any = None


def _declared(config: Config) -> list[tuple[str, RunsOn | None]]:
    """What each model the detect stage may make jobs for runs on: the models enabled in the
    config's infer stages, or every registered one when the infer stage runs elsewhere
    (stages.infer_options.enabled_models)."""
    enabled = enabled_models(config)
    names = models.names() if enabled is None else enabled
    return [(m, models.spec(m).runs_on) for m in names]


def _preview_targets(context: Any, out: Outbox) -> list[tuple[PreviewTap, BoundedQueue]]:
    """The publish stages among detect's targets that want previews, with their inboxes."""
    taps = run_taps(context)
    return [(taps[name], queue) for name, _, queue in out.targets if name in taps]


def _containing_track(
    face_xywh: np.ndarray, person_xyxy: np.ndarray, ids: list[int | None]
) -> int | None:
    """The track of the smallest person box that contains the face's centre."""
    cx = float(face_xywh[0] + face_xywh[2] / 2)
    cy = float(face_xywh[1] + face_xywh[3] / 2)
    best, best_area = None, math.inf
    for box, tid in zip(person_xyxy, ids, strict=True):
        if tid is None or not (box[0] <= cx <= box[2] and box[1] <= cy <= box[3]):
            continue
        area = float((box[2] - box[0]) * (box[3] - box[1]))
        if area < best_area:
            best, best_area = tid, area
    return best
