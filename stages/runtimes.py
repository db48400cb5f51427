"""Model runtimes: the one interface every model plugs into the inference stage through.

A Runtime wraps one loaded model on one backend and tells the scheduler what it needs: its
export batch size (read from the bundle: CLIP's `v_batch` images a pass, 4; Sapiens2 and
AdaFace one item a pass), the hardware contexts its kernels use (the bundle's xclbin +
kernel pairs, as npu.device.context_key names them), and a device-cost estimate (a measured
warm-up pass). `prepare(jobs)` is the host glue, run in a worker thread while the device
runs the previous batch: Sapiens2 crops at its own input size with stages.detect.crop_persons
from the job's frame (BGR -> RGB), AdaFace normalises the aligned face in the model's colour
order (stages.align.embedder_input), CLIP crops the box and preprocesses it as
CLIPImageProcessor (ClipModel.pixels) and polls CLIP's `labels_file` for a new label set
(ClipRuntime.poll_labels_file). `run(prepared)` is the device pass, on the device
thread only (XRT objects stay on one thread); it returns one output per slot of the export
batch, padded slots marked so the stage never publishes them, and the device seconds used.

Backends, always named explicitly (no silent fallback): `cpu` (numpy forward from an HF
checkpoint / cvlface directory), `sim` (the bundle on npu.sim.SimDevice), `npu` (the bundle
on the XRT device). Without a checkpoint or bundle a runtime may use the synthetic model of
npu.models.synthetic when its config allows it; every output then says `synthetic: true`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from pipeline.errors import NpucamError
from pipeline.files import file_stamp
from stages.jobs import ClipJob, FaceJob, Job, PoseJob

log = logging.getLogger(__name__)

BACKENDS = ("cpu", "sim", "npu")
MODELS = ("sapiens2", "adaface", "clip")


class RuntimeLoadError(NpucamError):
    """A model that cannot be loaded as configured (missing path, wrong backend, bad bundle)."""


class JobInputError(NpucamError):
    """One job's input the model's host glue cannot use (no aligned face, an empty box...)."""


class LabelsFileError(NpucamError):
    """A CLIP labels file that cannot be used: unreadable, not UTF-8, no labels, a label
    without letters. The message names the file and, where there is one, the line."""


def read_labels_file(path: str | Path) -> list[tuple[int, str]]:
    """A CLIP labels file -> [(line number, label)]: UTF-8 text (a BOM is skipped), one label
    per line, surrounding whitespace stripped; blank lines and lines starting with `#` are
    skipped."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise LabelsFileError(
            f"{path}: cannot read the labels file: {exc.strerror or exc}"
        ) from exc
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise LabelsFileError(f"{path}:{line}: not UTF-8 ({exc.reason})") from exc
    labels = []
    for n, line in enumerate(text.split("\n"), 1):
        label = line.strip()
        if label and not label.startswith("#"):
            labels.append((n, label))
    if not labels:
        raise LabelsFileError(f"{path}: no labels (only blank lines and # comments)")
    return labels


@dataclass(slots=True)
class Prepared:
    """A batch ready for the device: `inputs` has one row per slot of the export batch.

    jobs: the real jobs (slots 0..len-1); slots past them are padding (copies of the first
    usable input). failed: slot -> the error of a job whose host glue failed (its slot holds
    padding too). windows: float32 [size, 4] sampled regions (pose only).
    """

    model: str
    jobs: tuple[Job, ...]
    size: int
    inputs: np.ndarray
    failed: dict[int, Exception] = field(default_factory=dict)
    windows: np.ndarray | None = None

    @property
    def mask(self) -> tuple[bool, ...]:
        """Per slot: True for a real job whose input was prepared."""
        return tuple(i < len(self.jobs) and i not in self.failed for i in range(self.size))


@dataclass(slots=True)
class SlotOutput:
    """One slot's output: `padded` slots (and `error` ones) are never published."""

    output: np.ndarray | None
    padded: bool = False
    error: Exception | None = None
    window: np.ndarray | None = None


@dataclass(slots=True)
class Ran:
    """A device pass: one SlotOutput per slot and the device seconds it took."""

    outputs: list[SlotOutput]
    device_s: float


class DeviceTimer:
    """Device seconds of a pass: the wall time the device thread spends in it. On npu that
    is the device plus the forward's own host steps between dispatches (nothing else can
    use the device meanwhile); on sim with `sleep` the modelled device time plus those
    steps, and the simulator's own numpy work where it exceeds the modelled time; on cpu
    the numpy forward. The simulator's modelled time alone is in SimDevice.sim."""

    def measure(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        t0 = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t0


def bundle_contexts(path: Path) -> tuple[str, ...]:
    """The hardware-context keys of a bundle's kernels: every xclbin record's path + kernel,
    and every kernel record naming its xclbin directly (`xclbin=` + `name=`, as CLIP's ops)."""
    from npu.bundle import Bundle
    from npu.device import context_key

    bundle = Bundle.open(path)
    try:
        keys = {context_key(x.path, x.kernel) for x in bundle.manifest.xclbins.values()}
        keys |= {
            context_key(r.path("xclbin"), r.value("name") if r.has("name") else "MLIR_AIE")
            for r in bundle.records
            if r.has("xclbin")
        }
        return tuple(sorted(keys))
    finally:
        bundle.close()


class Runtime:
    """One loaded model on one backend (see the module docstring)."""

    name: ClassVar[str] = ""
    job_type: ClassVar[type] = Job

    def __init__(
        self,
        model: Any,
        *,
        backend: str,
        model_id: str,
        synthetic: bool,
        device: Any = None,
        batch_size: int = 1,
        contexts: tuple[str, ...] = (),
        max_wait_ms: float = 0.0,
    ) -> None:
        if batch_size < 1:
            raise RuntimeLoadError(f"{self.name}: export batch size {batch_size} < 1")
        self.model = model
        self.backend = backend
        self.model_id = model_id
        self.synthetic = synthetic
        self.device = device
        self.batch_size = batch_size
        self.contexts = contexts
        self.max_wait_ms = max_wait_ms
        self.timer = DeviceTimer()

    # -- host glue -----------------------------------------------------------------------

    def prepare_one(self, job: Job) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """One job's model input (pose: (crop, window))."""
        raise NotImplementedError

    def prepare(self, jobs: Sequence[Job]) -> Prepared:
        """Host glue for up to batch_size jobs -> a full batch (padded with copies of the
        first usable input). A job whose glue fails for any reason (an NpucamError, or e.g. a
        cv2.error / ValueError from a degenerate input, wrapped in a JobInputError naming the
        camera) is marked failed, not the batch."""
        if not 0 < len(jobs) <= self.batch_size:
            raise JobInputError(f"{self.name}: {len(jobs)} jobs for a batch of {self.batch_size}")
        rows: list[np.ndarray | None] = []
        windows: list[np.ndarray | None] = []
        failed: dict[int, Exception] = {}
        for i, job in enumerate(jobs):
            if not isinstance(job, self.job_type):
                failed[i] = JobInputError(
                    f"camera {job.camera!r}: {type(job).__name__} sent to {self.name}"
                )
                rows.append(None)
                windows.append(None)
                continue
            try:
                item = self.prepare_one(job)
            except NpucamError as exc:
                failed[i] = exc
                rows.append(None)
                windows.append(None)
                continue
            except Exception as exc:  # any host-glue failure (cv2.error...) fails this job only
                # named by camera, the infer stage logs it (rate-limited) with the slot's error
                failed[i] = JobInputError(
                    f"{self.name}: camera {job.camera!r} #{job.seq}: host glue failed: "
                    f"{type(exc).__name__}: {exc}"
                )
                rows.append(None)
                windows.append(None)
                continue
            if isinstance(item, tuple):
                rows.append(item[0])
                windows.append(item[1])
            else:
                rows.append(item)
                windows.append(None)
        pad = next((r for r in rows if r is not None), None)
        if pad is None:
            pad = self.dummy_input()
        filled = [pad if r is None else r for r in rows]
        filled += [pad] * (self.batch_size - len(jobs))
        win = None
        if any(w is not None for w in windows):
            zero = np.zeros(4, np.float32)
            win = np.stack([zero if w is None else w for w in windows] +
                           [zero] * (self.batch_size - len(jobs)))  # fmt: skip
        return Prepared(self.name, tuple(jobs), self.batch_size, np.stack(filled), failed, win)

    def dummy_input(self) -> np.ndarray:
        """A valid input of one slot (warm-up passes, all-failed batches)."""
        raise NotImplementedError

    # -- device --------------------------------------------------------------------------

    def forward(self, inputs: np.ndarray) -> list[np.ndarray]:
        """The device pass over a full batch: one output per slot."""
        raise NotImplementedError

    def run(self, prepared: Prepared) -> Ran:
        """Run a prepared batch on the device (device thread only)."""
        if prepared.size != self.batch_size or len(prepared.inputs) != self.batch_size:
            raise JobInputError(
                f"{self.name}: batch of {len(prepared.inputs)} slots, export size {self.batch_size}"
            )
        outs, device_s = self.timer.measure(lambda: self.forward(prepared.inputs))
        mask = prepared.mask
        result = []
        for i, out in enumerate(outs):
            padded = i >= len(prepared.jobs)
            error = prepared.failed.get(i)
            real = mask[i]
            window = None if prepared.windows is None else prepared.windows[i]
            result.append(SlotOutput(out if real else None, padded, error, window))
        return Ran(result, device_s)

    def warm_up(self) -> float:
        """One pass over dummy inputs (loads kernels and contexts); its device seconds."""
        inputs = np.stack([self.dummy_input()] * self.batch_size)
        _, device_s = self.timer.measure(lambda: self.forward(inputs))
        return device_s

    def extra(self) -> dict:
        """What every output of this model carries beside the array (CLIP: labels...)."""
        return {}

    def close(self) -> None:
        close = getattr(self.model, "close", None)
        if callable(close) and self.backend != "cpu":
            close()


class Sapiens2Runtime(Runtime):
    """Sapiens2-Pose: PoseJob -> heatmaps float32 [K, h, w] and the crop window."""

    name = "sapiens2"
    job_type = PoseJob

    def prepare_one(self, job: PoseJob) -> tuple[np.ndarray, np.ndarray]:
        from stages.detect import crop_persons

        cfg = self.model.config
        if job.image is None:
            raise JobInputError(f"camera {job.camera!r} #{job.seq}: pose job without a frame")
        rgb = np.ascontiguousarray(job.image[..., ::-1])
        crops, windows = crop_persons(
            rgb,
            np.asarray(job.box_xywh, np.float32).reshape(1, 4),
            output_size=(cfg.H, cfg.W),
            mean=cfg.mean,
            std=cfg.std,
            padding=cfg.box_pad,
        )
        return crops[0], windows[0]

    def dummy_input(self) -> np.ndarray:
        cfg = self.model.config
        return np.zeros((3, cfg.H, cfg.W), np.float32)

    def forward(self, inputs: np.ndarray) -> list[np.ndarray]:
        return list(self.model.heatmaps(np.ascontiguousarray(inputs, np.float32)))


class AdaFaceRuntime(Runtime):
    """AdaFace: FaceJob (aligned BGR crop) -> the un-normalised embedding float32 [512]."""

    name = "adaface"
    job_type = FaceJob

    def prepare_one(self, job: FaceJob) -> np.ndarray:
        from stages.align import embedder_input

        if job.aligned is None:
            raise JobInputError(
                f"camera {job.camera!r} #{job.seq}: face job was not aligned (run align first)"
            )
        return embedder_input(job.aligned, "bgr", self.model.colour_order())

    def dummy_input(self) -> np.ndarray:
        return np.zeros((3, 112, 112), np.float32)

    def forward(self, inputs: np.ndarray) -> list[np.ndarray]:
        return [np.asarray(self.model.embed(x), np.float32) for x in inputs]


LABELS_CHECK_S = 1.0  # the labels file is stat'ed at most this often
LABEL_SETS_CACHED = 8  # text embeddings kept for this many most recent label sets
LABELS_RETRY_MAX_S = 60.0  # longest wait before re-encoding a label set that keeps failing


class ClipRuntime(Runtime):
    """CLIP image tower: ClipJob (box on the frame) -> image embedding float32 [D]; every
    output carries the label set in effect and its prompts' text embeddings.

    The text embeddings of a label set are computed once (on the device thread, one text
    tower pass per t_batch prompts) and cached. With a `labels_file`, the host glue
    (`prepare`, worker thread) stats the file at most every LABELS_CHECK_S and, when its
    (mtime, size, inode) changed, reads and checks it; the next `run` (device thread)
    encodes the new set if it is not cached and swaps it in. A bad, empty or vanished file
    keeps the labels in effect, logs the error (file and line) and counts it in
    `label_errors`. So does an encoding that fails (a device error or any other exception):
    the new set stays queued and is retried LABELS_CHECK_S later, the wait doubling with
    each failure of the same set up to LABELS_RETRY_MAX_S."""

    name = "clip"
    job_type = ClipJob

    def __init__(
        self,
        model: Any,
        *,
        labels: Sequence[str],
        template: str | None,
        labels_file: str | Path | None = None,
        **kw,
    ) -> None:
        super().__init__(model, **kw)
        self.labels = list(labels)
        self.template = template
        self.text_embeds: np.ndarray | None = None
        self.labels_file = Path(labels_file) if labels_file is not None else None
        self.label_errors = 0  # bad / empty / vanished labels files, failed encodings
        self.last_label_error: str | None = None
        self.label_sets_loaded = 0  # label sets whose text embeddings were computed
        self.label_device_s = 0.0  # device seconds spent encoding label sets
        self._in_effect: tuple[tuple[str, ...], np.ndarray] | None = None
        self._embeds: OrderedDict[tuple[str, ...], np.ndarray] = OrderedDict()
        self._pending: tuple[str, ...] | None = None
        self._pending_lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._next_check = 0.0
        # device thread: the queued set whose encoding failed, its failures, next attempt
        self._failed: tuple[tuple[str, ...], int, float] | None = None

    # -- the label set ---------------------------------------------------------------------

    def _label_error(self, message: str, exc: Exception | None = None) -> None:
        """Count and log a label-set failure; an unexpected exception (not an NpucamError)
        is logged with its traceback."""
        self.label_errors += 1
        self.last_label_error = message
        trace = exc if exc is not None and not isinstance(exc, NpucamError) else None
        log.error("%s; keeping the %d labels in effect", message, len(self.labels), exc_info=trace)

    def _read_labels_file(self) -> tuple[str, ...]:
        """The labels file's labels, each checked to have letters (LabelsFileError)."""
        assert self.labels_file is not None
        labels = read_labels_file(self.labels_file)
        for n, label in labels:
            try:
                self.model.tokenizer.encode_prompt(label, what=f"{self.labels_file}:{n}: label")
            except NpucamError as exc:
                raise LabelsFileError(str(exc)) from exc
        return tuple(label for _, label in labels)

    def _use(self, labels: tuple[str, ...]) -> float:
        """Make `labels` the set in effect, encoding its prompts unless cached (device
        thread); the device seconds spent."""
        device_s = 0.0
        embeds = self._embeds.get(labels)
        if embeds is None:
            out, device_s = self.timer.measure(
                lambda: self.model.label_embeddings(list(labels), self.template)
            )
            embeds = np.asarray(out, np.float32)
            self._embeds[labels] = embeds
            self.label_sets_loaded += 1
            self.label_device_s += device_s
            while len(self._embeds) > LABEL_SETS_CACHED:
                self._embeds.popitem(last=False)
        else:
            self._embeds.move_to_end(labels)
        self._in_effect = (labels, embeds)
        self.labels = list(labels)
        self.text_embeds = embeds
        return device_s

    def load_labels(self) -> float:
        """The startup label set (device thread): the labels file's when it is readable,
        else the configured `labels` (the file's error logged and counted); their device
        seconds. RuntimeLoadError when neither gives labels."""
        labels = tuple(self.labels)
        if self.labels_file is not None:
            self._stamp = file_stamp(self.labels_file)
            self._next_check = time.monotonic() + LABELS_CHECK_S
            try:
                labels = self._read_labels_file()
            except LabelsFileError as exc:
                if not labels:
                    raise RuntimeLoadError(f"{exc} (and no labels configured)") from exc
                self._label_error(f"{exc}; using the configured labels")
        return self._use(labels)

    def poll_labels_file(self, now: float | None = None) -> bool:
        """Host glue: re-read the labels file if its stamp changed (at most every
        LABELS_CHECK_S); True when a new label set is queued for the next run."""
        if self.labels_file is None:
            return False
        now = time.monotonic() if now is None else now
        if now < self._next_check:
            return False
        self._next_check = now + LABELS_CHECK_S
        stamp = file_stamp(self.labels_file)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        if stamp is None:
            self._label_error(f"{self.labels_file}: the labels file vanished")
            return False
        try:
            labels = self._read_labels_file()
        except LabelsFileError as exc:
            self._label_error(str(exc))
            return False
        with self._pending_lock:
            self._pending = labels
        return True

    def apply_pending_labels(self, now: float | None = None) -> float:
        """Device thread: swap in a label set the host glue queued; its device seconds.

        The set leaves the queue only once it is in effect (or replaced by a newer one): an
        encoding that raises keeps the labels in effect and the set queued, counts and logs
        the failure, and the set is retried LABELS_CHECK_S later, doubling with each failure
        of the same set up to LABELS_RETRY_MAX_S."""
        with self._pending_lock:
            labels = self._pending
        if labels is None:
            return 0.0
        if self._in_effect is not None and labels == self._in_effect[0]:
            self._dequeue(labels)
            return 0.0
        now = time.monotonic() if now is None else now
        failures = 0
        if self._failed is not None and self._failed[0] == labels:
            _, failures, retry_at = self._failed
            if now < retry_at:
                return 0.0
        try:
            device_s = self._use(labels)
        except Exception as exc:  # a device error or any other: the set is retried, not lost
            failures += 1
            wait_s = min(LABELS_CHECK_S * 2 ** (failures - 1), LABELS_RETRY_MAX_S)
            self._failed = (labels, failures, now + wait_s)
            self._label_error(
                f"{self.labels_file}: encoding the {len(labels)} new labels failed "
                f"({failures} time(s)): {type(exc).__name__}: {exc}; retrying in {wait_s:g} s",
                exc,
            )
            return 0.0
        self._failed = None
        self._dequeue(labels)
        log.info(
            "%s: %d labels now in effect (%.3f s to encode): %s",
            self.labels_file,
            len(labels),
            device_s,
            ", ".join(labels),
        )
        return device_s

    def _dequeue(self, labels: tuple[str, ...]) -> None:
        """Clear the queued set if it is still `labels` (the glue may have queued a newer)."""
        with self._pending_lock:
            if self._pending == labels:
                self._pending = None

    def prepare(self, jobs: Sequence[Job]) -> Prepared:
        self.poll_labels_file()
        return super().prepare(jobs)

    def run(self, prepared: Prepared) -> Ran:
        self.apply_pending_labels()
        return super().run(prepared)

    def prepare_one(self, job: ClipJob) -> np.ndarray:
        if job.image is None:
            raise JobInputError(f"camera {job.camera!r} #{job.seq}: CLIP job without a frame")
        h, w = job.image.shape[:2]
        x, y, bw, bh = (float(v) for v in np.asarray(job.box_xywh, np.float64).reshape(4))
        if not all(np.isfinite([x, y, bw, bh])):
            raise JobInputError(f"camera {job.camera!r} #{job.seq}: box {[x, y, bw, bh]}")
        x0, y0 = max(int(np.floor(x)), 0), max(int(np.floor(y)), 0)
        x1, y1 = min(int(np.ceil(x + bw)), w), min(int(np.ceil(y + bh)), h)
        if x1 <= x0 or y1 <= y0:
            raise JobInputError(
                f"camera {job.camera!r} #{job.seq}: box {[x, y, bw, bh]} is outside the "
                f"{w}x{h} frame"
            )
        rgb = np.ascontiguousarray(job.image[y0:y1, x0:x1, ::-1])
        return self.model.pixels([rgb])[0]

    def dummy_input(self) -> np.ndarray:
        size = self.model.towers.cfg.image_size
        return np.zeros((3, size, size), np.float32)

    def forward(self, inputs: np.ndarray) -> list[np.ndarray]:
        return list(self.model.encode_images(np.ascontiguousarray(inputs, np.float32)))

    def extra(self) -> dict:
        labels, embeds = self._in_effect if self._in_effect is not None else ((), None)
        return {
            "labels": list(labels),
            "text_embeds": embeds,
            "logit_scale": float(self.model.logit_scale),
        }


RUNTIMES: dict[str, type[Runtime]] = {
    "sapiens2": Sapiens2Runtime,
    "adaface": AdaFaceRuntime,
    "clip": ClipRuntime,
}


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: `checkpoint` (cpu) or `bundle` (sim, npu), else synthetic
    weights if `synthetic` allows it. `where` names the config key of this model."""

    checkpoint: str | None = None
    bundle: str | None = None
    synthetic: bool = False
    where: str = ""


def _load_model(name: str, backend: str, path: Path, device: Any) -> tuple[Any, str]:
    """(model, model id) of a real checkpoint (cpu) or bundle (sim / npu)."""
    if backend == "cpu":
        if name == "sapiens2":
            from npu.models.sapiens2 import from_pretrained

            return from_pretrained(path), path.name
        if name == "adaface":
            from npu.models.adaface import AdaFaceCpu

            model = AdaFaceCpu.from_pretrained(path)
            return model, model.model()
        from npu.models.clip import ClipModel

        return ClipModel.from_pretrained(path), path.name
    if name == "sapiens2":
        from npu.models.sapiens2 import from_bundle

        return from_bundle(path, device), path.name
    if name == "adaface":
        from npu.models.adaface_steps import AdafaceBundle

        model = AdafaceBundle.load(path, device)
        return model, model.model() or path.name
    from npu.models.clip import load_bundle

    return load_bundle(path, device), path.name


def _export_batch(name: str, model: Any, path: Path | None) -> int:
    """Items per device pass: CLIP's v_batch (from the bundle's params on sim / npu); a
    Sapiens2 or AdaFace bundle may declare `batch`, else one."""
    if name == "clip":
        return int(model.towers.v_batch)
    if path is not None and (path / "manifest.txt").is_file():
        from npu.bundle import Bundle

        bundle = Bundle.open(path)
        try:
            return bundle.param("batch", int) if bundle.has_param("batch") else 1
        finally:
            bundle.close()
    return 1


def open_runtime(
    name: str,
    backend: str,
    source: ModelSource,
    *,
    device: Any = None,
    max_wait_ms: float = 0.0,
    labels: Sequence[str] = (),
    template: str | None = None,
    labels_file: str | Path | None = None,
    synthetic_cache: str | Path | None = None,
) -> Runtime:
    """Load model `name` on `backend` from `source` (see ModelSource); device is the open
    SimDevice / XrtDevice for sim / npu, None for cpu. CLIP encodes its label prompts here
    (from `labels_file` when it is readable, else `labels`), so call it on the device
    thread. Errors name the config key."""
    if name not in RUNTIMES:
        raise RuntimeLoadError(
            f"{source.where or name}: unknown model (known: {', '.join(MODELS)})"
        )
    if backend not in BACKENDS:
        raise RuntimeLoadError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    key = "checkpoint" if backend == "cpu" else "bundle"
    raw = source.checkpoint if backend == "cpu" else source.bundle
    where = f"{source.where}.{key}" if source.where else key
    path = Path(raw) if raw else None
    if path is not None and path.exists():
        model, model_id = _load_model(name, backend, path, device)
        synthetic = False
        bundle_dir = path if backend != "cpu" else None
    elif source.synthetic:
        from npu.models import synthetic as syn

        if backend == "npu":
            raise RuntimeLoadError(
                f"{where}: {'no path set' if path is None else f'{path} does not exist'}, and "
                "synthetic models have no hardware bundle (use backend sim or cpu, or give the "
                "bundle path)"
            )
        reason = "not set" if path is None else f"{path} does not exist"
        log.warning(
            "%s: %s; using the SYNTHETIC %s (random weights, outputs are meaningless)",
            where,
            reason,
            name,
        )
        model = syn.load(name, backend, device, cache=synthetic_cache)
        model_id = syn.MODEL_NAMES[name]
        synthetic = True
        bundle_dir = syn.bundle_path(name, synthetic_cache) if backend != "cpu" else None
    else:
        missing = "is not set" if path is None else f"= {path} does not exist"
        raise RuntimeLoadError(
            f"{where} {missing} (backend {backend} needs "
            f"{'an HF checkpoint directory' if backend == 'cpu' else 'a bundle directory'}; "
            "or set synthetic = true for the small synthetic-weight model)"
        )
    contexts = bundle_contexts(bundle_dir) if bundle_dir is not None else ()
    kw = dict(
        backend=backend,
        model_id=model_id,
        synthetic=synthetic,
        device=device,
        batch_size=_export_batch(name, model, bundle_dir),
        contexts=contexts,
        max_wait_ms=max_wait_ms,
    )
    if name == "clip":
        rt = ClipRuntime(model, labels=labels, template=template, labels_file=labels_file, **kw)
        rt.load_labels()
        return rt
    return RUNTIMES[name](model, **kw)
