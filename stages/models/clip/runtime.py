"""CLIP in the infer stage: a ClipJob's box on its frame -> the image embedding, with the label
set in effect and its text embeddings (hot-reloaded from a labels file)."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from npu.models import ModelLoadError
from pipeline.errors import NpucamError
from pipeline.files import FileRefusedError, FileRuleError, FileWatch, read_regular
from pipeline.messages import Frame
from stages.job_policy import Target
from stages.jobs import Job, frame_fields
from stages.models.clip.job import ClipInferred, ClipJob
from stages.runtimes import JobInputError, ModelOptions, Prepared, Ran, Runtime, resolve

log = logging.getLogger(__name__)


class LabelsFileError(NpucamError):
    """A CLIP labels file that cannot be used: unreadable, not UTF-8, no labels, a label
    without letters. The message names the file and, where there is one, the line."""


LABELS_FILE_MAX_BYTES = 1 << 20  # [stages.clip] labels_file_max_bytes
MAX_LABELS = 1000  # [stages.clip] labels_max: labels in effect (each is a text-tower prompt)


def read_labels_file(
    path: str | Path, max_bytes: int = LABELS_FILE_MAX_BYTES, max_labels: int = MAX_LABELS
) -> list[tuple[int, str]]:
    """A CLIP labels file -> [(line number, label)]: UTF-8 text (a BOM is skipped), one label
    per line, surrounding whitespace stripped; blank lines and lines starting with `#` are
    skipped. Read by pipeline.files.read_regular's rules (a regular file, no symlink, never
    blocking, at most max_bytes), with at most max_labels labels."""
    path = Path(path)
    try:
        raw = read_regular(path, max_bytes)
    except FileRuleError as exc:
        raise LabelsFileError(f"{path}: cannot read the labels file: {exc.reason}") from exc
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
    if len(labels) > max_labels:
        raise LabelsFileError(
            f"{path}: {len(labels)} labels, over the limit of {max_labels} (labels_max)"
        )
    return labels


LABELS_CHECK_S = 1.0  # the labels file is stat'ed at most this often


LABEL_SETS_CACHED = 8  # text embeddings kept for this many most recent label sets


LABELS_RETRY_MAX_S = 60.0  # longest wait before re-encoding a label set that keeps failing


class ClipOptions(ModelOptions):
    """[stages.clip]: the model keys plus the zero-shot labels and prompt template.

    labels_file (relative to the config file): one label per line, re-read when it changes
    while the stage runs; once readable it wins over `labels` (ClipRuntime)."""

    max_wait_ms: float = Field(150.0, ge=0)
    labels: list[str] = []
    labels_file: str | None = Field(None, min_length=1)
    labels_file_max_bytes: int = Field(LABELS_FILE_MAX_BYTES, ge=1, le=1 << 30)
    labels_max: int = Field(MAX_LABELS, ge=1, le=100_000)
    template: str | None = None  # default: the bundle's prompt_template, "a photo of a {}"


class ClipRuntime(Runtime[ClipOptions, ClipJob]):
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

    job_type = ClipJob
    inferred_type = ClipInferred
    Options = ClipOptions

    def __init__(self, model: Any, **kw: Any) -> None:
        super().__init__(model, **kw)
        options: ClipOptions = self.options  # type: ignore[assignment]
        self.labels = list(options.labels)
        self.template = options.template
        self.text_embeds: np.ndarray | None = None
        self.labels_file: Path | None = None
        self.label_errors = 0  # bad / empty / vanished labels files, failed encodings
        self.last_label_error: str | None = None
        self.label_sets_loaded = 0  # label sets whose text embeddings were computed
        self._in_effect: tuple[tuple[str, ...], np.ndarray] | None = None
        self._embeds: OrderedDict[tuple[str, ...], np.ndarray] = OrderedDict()
        self._pending: tuple[str, ...] | None = None
        self._pending_lock = threading.Lock()
        self.watch: FileWatch | None = None  # the labels file, once load_labels has read it
        # device thread: the queued set whose encoding failed, its failures, next attempt
        self._failed: tuple[tuple[str, ...], int, float] | None = None

    @classmethod
    def make_job(cls, target: Target, frame: Frame) -> ClipJob:
        """A region to label: a tracked person's box, or the whole frame."""
        assert target.box_xywh is not None
        return ClipJob(
            **frame_fields(frame), box_xywh=target.box_xywh, image=frame.image,
            track_id=target.track_id,
        )  # fmt: skip

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
        options: ClipOptions = self.options  # type: ignore[assignment]
        labels = read_labels_file(
            self.labels_file, options.labels_file_max_bytes, options.labels_max
        )
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
                lambda: self.model.label_embeddings(list(labels), self.template),
                "texts",
                -(-len(labels) // self.model.towers.t_batch),
            )
            embeds = np.asarray(out, np.float32)
            self._embeds[labels] = embeds
            self.label_sets_loaded += 1
            while len(self._embeds) > LABEL_SETS_CACHED:
                self._embeds.popitem(last=False)
        else:
            self._embeds.move_to_end(labels)
        self._in_effect = (labels, embeds)
        self.labels = list(labels)
        self.text_embeds = embeds
        return device_s

    @classmethod
    def check_options(cls, options: ModelOptions, base_dir: Path, where: str) -> list[str]:
        """CLIP needs a label: in `labels`, or in a readable labels_file."""
        assert isinstance(options, ClipOptions)
        problems = []
        if len(options.labels) > options.labels_max:
            problems.append(
                f"{where}.labels: {len(options.labels)} labels, over labels_max "
                f"({options.labels_max})"
            )
        if options.labels_file is None:
            if not options.labels:
                problems.append(
                    f"{where}.labels: CLIP needs at least one label (in labels or in a labels_file)"
                )
            return problems
        try:
            read_labels_file(
                resolve(base_dir, options.labels_file),
                options.labels_file_max_bytes,
                options.labels_max,
            )
        except LabelsFileError as exc:
            if not options.labels:
                problems.append(f"{where}.labels_file: {exc} (and labels is empty)")
            elif isinstance(exc.__cause__, FileRefusedError):
                # a file the stage will never read as it is (a FIFO, a symlink, over the cap);
                # one missing or not yet valid falls back to `labels` (docs/configuration.md)
                problems.append(f"{where}.labels_file: {exc}")
        return problems

    def gauges(self) -> dict[str, float]:
        """The labels in effect, label sets encoded and labels-file errors."""
        return {
            "labels": len(self.labels),
            "label_sets_loaded": self.label_sets_loaded,
            "label_file_errors": self.label_errors,
        }

    def started(self, base_dir: Path) -> None:
        """Encode the startup label set (device thread), from the labels file (relative to
        base_dir) when it is readable, else the configured labels."""
        raw = self.options.labels_file  # type: ignore[attr-defined]
        self.labels_file = Path(resolve(base_dir, raw)) if raw is not None else None
        self.load_labels()

    def load_labels(self) -> float:
        """The startup label set (device thread): the labels file's when it is readable,
        else the configured `labels` (the file's error logged and counted); their device
        seconds. ModelLoadError when neither gives labels."""
        labels = tuple(self.labels)
        if self.labels_file is not None:
            self.watch = FileWatch(self.labels_file, LABELS_CHECK_S)
            try:
                labels = self._read_labels_file()
            except LabelsFileError as exc:
                if not labels:
                    raise ModelLoadError(f"{exc} (and no labels configured)") from exc
                self._label_error(f"{exc}; using the configured labels")
        return self._use(labels)

    def poll_labels_file(self, now: float | None = None) -> bool:
        """Host glue: re-read the labels file if its stamp changed (at most every
        LABELS_CHECK_S); True when a new label set is queued for the next run."""
        if self.watch is None:
            return False
        change = self.watch.poll(now)
        if change is None:
            return False
        if change == "vanished":
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
