"""What `npucam plan` measures on this machine: each camera's frame rate and decode cost
(through the capture stage's own sources, the way its kind says: SourceKind.probe in
stages/source_kinds/registry.py; live ones all at once with a short timeout) and its scene:
the config's detect stage run over the sampled frames, giving the person tracks and faces of
every frame and the detect stage's cost per frame."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.config import Config
from pipeline.errors import NpucamError
from pipeline.graph import Context
from pipeline.messages import Frame
from pipeline.metrics import Metrics

TEST_CARD_SIZE = (640, 480)  # a camera whose frames cannot be read is measured on a test card


class ProbeError(NpucamError):
    """A camera or detect stage the planner cannot measure (names the camera or stage)."""


@dataclass
class CameraProbe:
    """One camera as it will run. fps: the rate its frames reach detect (a paced file: its
    `fps` or the file's own; a live source: measured; else the configured or assumed rate);
    fps_source says which; decode_s: seconds one frame costs to read; frames: consecutive
    sampled frames (uint8 BGR), empty when none could be read."""

    name: str
    kind: str
    fps: float
    fps_source: str
    staleness_s: float
    decode_s: float = 0.0
    size: tuple[int, int] | None = None  # width, height
    frames: list[np.ndarray] = field(default_factory=list, repr=False)
    note: str = ""


def probe_cameras(
    config: Config, default_fps: float, max_frames: int, timeout_s: float
) -> list[CameraProbe]:
    """Every camera of the config, probed (files: up to max_frames frames from the start;
    live sources: all at once, each for at most timeout_s). Cameras reading the same file
    share its frames."""
    from stages.capture import camera_curve, camera_spec

    read: dict[str, tuple[list[np.ndarray], float, float | None]] = {}
    out: list[CameraProbe | Callable[[], CameraProbe]] = []
    for cam in config.cameras:
        try:
            curve = camera_curve(cam, config)
        except NpucamError as exc:  # missing CURVE keys: the camera is not probed
            curve, note = None, f"not probed ({exc})"
        else:
            note = ""
        spec = camera_spec(cam, config, curve)
        staleness = cam.staleness_ms / 1000
        if note:
            rate = cam.fps or default_fps
            source = "configured" if cam.fps else "assumed (--fps)"
            out.append(CameraProbe(cam.name, spec.kind, rate, source, staleness, note=note))
            continue
        how = spec.source_kind.probe
        if how == "read":
            key = str(spec.path or spec.url)
            if key not in read:
                read[key] = _read_file(spec, max_frames)
            out.append(_read_probe(cam, spec, read[key], default_fps, staleness))
        elif how == "known":
            native, size = spec.source_kind.known_format(spec)
            rate = (spec.fps or native) if spec.realtime else 1000.0
            out.append(
                CameraProbe(
                    cam.name, spec.kind, rate, "configured", staleness, 0.0, size,
                    [_test_card(*size)] * 4,
                )
            )  # fmt: skip
        else:
            out.append(_probe_live(cam, spec, default_fps, timeout_s, max_frames))
    return [p if isinstance(p, CameraProbe) else p() for p in out]


def _read_probe(
    cam: Any,
    spec: Any,
    read: tuple[list[np.ndarray], float, float | None],
    default_fps: float,
    staleness: float,
) -> CameraProbe:
    """A camera probed by reading its first frames: paced at its `fps` or the source's
    native rate, else (unpaced, or no rate known) as fast as it decodes."""
    frames, decode_s, native = read
    rate = spec.fps or native
    if not frames:
        return CameraProbe(
            cam.name, spec.kind, cam.fps or default_fps,
            "configured" if cam.fps else "assumed (--fps)", staleness,
            note=f"{spec.path or spec.url}: no frame could be read",
        )  # fmt: skip
    if not spec.realtime or rate is None:
        # unpaced: as fast as it decodes (emit's back-pressure can only slow it)
        rate, source = 1.0 / max(decode_s, 1e-4), "unpaced (decode rate)"
    else:
        source = "configured" if spec.fps else "probed"
    h, w = frames[0].shape[:2]
    return CameraProbe(cam.name, spec.kind, rate, source, staleness, decode_s, (w, h), frames)


def _read_file(spec: Any, max_frames: int) -> tuple[list[np.ndarray], float, float | None]:
    from stages.sources import make_source

    try:
        source = make_source(spec, threading.Event())
        source.open()
    except Exception as exc:
        raise ProbeError(
            f"camera {spec.name!r}: cannot open {spec.path or spec.url}: {exc}"
        ) from None
    frames: list[np.ndarray] = []
    t0 = time.perf_counter()
    try:
        while len(frames) < max_frames:
            item = source.read(len(frames))
            if item is None:
                break
            frames.append(item[0])
        native = getattr(source, "native_fps", None)
    finally:
        source.close()
    decode_s = (time.perf_counter() - t0) / max(len(frames), 1)
    return frames, decode_s, native


def _probe_live(
    cam: Any, spec: Any, default_fps: float, timeout_s: float, max_frames: int
) -> Callable[[], CameraProbe]:
    """Start reading a live camera for at most timeout_s in a helper thread; the call it
    returns waits for that and gives the camera's measured rate and frames, or the
    configured / assumed rate when nothing arrived."""
    from stages.sources import make_source

    spec = dataclasses.replace(spec, stall_timeout_s=timeout_s)
    got: list[tuple[float, np.ndarray]] = []
    problem: list[str] = []
    stop = threading.Event()

    def read() -> None:
        try:
            source = make_source(spec, stop)
            source.open()
        except Exception as exc:
            problem.append(str(exc))
            return
        try:
            end = time.monotonic() + timeout_s
            while time.monotonic() < end and len(got) < max_frames and not stop.is_set():
                item = source.read(len(got))
                if item is None:
                    break
                got.append((time.perf_counter(), item[0]))
        except Exception as exc:
            problem.append(str(exc))
        finally:
            source.close()

    thread = threading.Thread(target=read, name=f"plan-probe-{cam.name}", daemon=True)
    thread.start()

    def result() -> CameraProbe:
        thread.join(timeout_s + 2.0)
        stop.set()
        staleness = cam.staleness_ms / 1000
        frames = [f for _, f in got]
        if len(got) >= 3:
            span = got[-1][0] - got[0][0]
            rate = (len(got) - 1) / span if span > 0 else default_fps
            h, w = frames[0].shape[:2]
            return CameraProbe(cam.name, spec.kind, rate, "probed", staleness, 0.0, (w, h), frames)
        why = problem[0] if problem else f"fewer than 3 frames in {timeout_s:g} s"
        return CameraProbe(
            cam.name, spec.kind, cam.fps or default_fps,
            "configured" if cam.fps else "assumed (--fps)", staleness,
            size=None if not frames else (frames[0].shape[1], frames[0].shape[0]), frames=frames,
            note=f"not reachable: {why}",
        )  # fmt: skip

    return result


def _test_card(width: int, height: int) -> np.ndarray:
    """A deterministic BGR test card (gradients and bars), for timing a detector."""
    y, x = np.mgrid[0:height, 0:width]
    img = np.stack([(x * 255 // max(width - 1, 1)), (y * 255 // max(height - 1, 1)),
                    ((x // 40 + y // 40) % 2) * 255], axis=-1)  # fmt: skip
    return img.astype(np.uint8)


@dataclass
class Scene:
    """One camera's scene as the detect stage's detectors see it: per sampled frame, the
    person boxes float32 [N, 4] (x1, y1, x2, y2) with their scores float32 [N], and the face
    boxes float32 [F, 4] (x1, y1, x2, y2); and the detect stage's mean seconds per frame on
    this machine. The planner tracks the boxes itself, as the detect stage does."""

    frames: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    detect_s: float
    source: str
    high_score: float = 0.5
    # with detect's per-frame pose (`live`): seconds of the landmark models a person-frame
    # (within detect_s), and the people they followed a frame
    live_person_s: float | None = None
    live_people: float = 0.0

    @property
    def mean_people(self) -> float:
        n = sum(int((sc >= self.high_score).sum()) for _, sc, _ in self.frames)
        return n / max(len(self.frames), 1)

    @property
    def mean_faces(self) -> float:
        return sum(len(f) for _, _, f in self.frames) / max(len(self.frames), 1)


def measure_scenes(
    config: Config, index: int, cameras: list[CameraProbe], max_frames: int
) -> dict[str, Scene]:
    """The detect stage config.stages[index], built as the run builds it, over each of its
    cameras' sampled frames (a test card where none were read), at the camera's rate."""
    from stages.detect import Detect, DetectOptions

    opts = DetectOptions.model_validate(config.stages[index].options)
    where = f"{config.path}: stages[{index}] (detect)"
    if opts.person == "zmq":  # the boxes come from another program: time the faces only
        opts = opts.model_copy(update={"person": "none"})
    detect = Detect(config.stage_names[index], opts, Context(config, Metrics()))
    try:
        detect.load()
    except Exception as exc:
        raise ProbeError(f"{where}: cannot build its detectors: {exc}") from None
    wanted = opts.cameras
    scenes: dict[str, Scene] = {}
    seen: dict[tuple[int, float], Scene] = {}  # cameras reading one file at one rate
    try:
        for cam in cameras:
            if wanted is not None and cam.name not in wanted:
                continue
            frames = cam.frames[:max_frames]
            key = (id(cam.frames), cam.fps)
            if frames and key in seen:
                scenes[cam.name] = seen[key]
                continue
            source = f"measured on {len(frames)} frames"
            if not frames:
                frames = [_test_card(*(cam.size or TEST_CARD_SIZE))] * 8
                source = "a test card (no frame read): people and faces not measured"
            scenes[cam.name] = _scene(detect, cam, frames, source)
            if cam.frames:
                seen[key] = scenes[cam.name]
    finally:
        detect.close()
    return scenes


def _scene(detect: Any, cam: CameraProbe, frames: list[np.ndarray], source: str) -> Scene:
    out = []
    period = round(1e9 / cam.fps)
    start = 10**15  # a clock of its own: only differences matter to the tracker
    detect.process(Frame(cam.name, -1, start - period, start, frames[0]))  # load and warm up
    cpu, stretch = [], []
    live_cpu0, live_n0 = detect.live_cost()
    for i, image in enumerate(frames):
        ts = start + i * period
        t0, c0 = time.perf_counter(), time.thread_time()
        det = detect.process(Frame(cam.name, i, ts, ts + 10**12, image))[0]
        c, w = time.thread_time() - c0, time.perf_counter() - t0
        cpu.append(c)
        stretch.append(w / c if c > 0 else 1.0)
        person = np.array([lab == "person" for lab in det.labels], bool)
        boxes = np.asarray(det.boxes, np.float32).reshape(-1, 4)
        scores = np.asarray(det.scores, np.float32).reshape(-1)
        out.append((boxes[person], scores[person], boxes[~person]))
    scene = Scene(out, detect_seconds(cpu, stretch), source, detect.options.tracker.high_score)
    if detect.options.live.enabled:
        live_cpu, live_n = detect.live_cost()
        n = live_n - live_n0
        scene.live_people = n / len(frames)
        if n:
            stretch_s = max(1.0, float(np.median(stretch)))
            scene.live_person_s = (live_cpu - live_cpu0) / n * stretch_s
    return scene


def detect_seconds(cpu: list[float], stretch: list[float]) -> float:
    """Wall seconds a frame of detect costs on this machine now: its mean CPU time times the
    median stretch (wall / CPU) of its frames, the share of a core the thread got. The median
    keeps a burst of other programs during the few seconds measured out of the estimate."""
    return float(np.mean(cpu)) * max(1.0, float(np.median(stretch)))
