"""Model runtimes: the one interface every model plugs into the inference stage through.

A Runtime wraps one loaded model (npu.models.loading.load) on one backend and tells the scheduler
what it needs: its export batch size (the model spec reads it from the bundle: CLIP's
`v_batch` images a pass, 4; Sapiens2 and AdaFace one item a pass), the hardware contexts its
kernels use (the bundle's xclbin + kernel pairs, as npu.device.context_key names them), its
job type, how its jobs are keyed and ordered in the scheduler, and a device-cost estimate (a
measured warm-up pass). `prepare(jobs)` is the host glue, run in a worker thread while the
device runs the previous batch; `run(prepared)` is the device pass, on the device thread only
(XRT objects stay on one thread); it returns one output per slot of the export batch, padded
slots marked so the stage never publishes them, and the device seconds used.

Each model's runtime is in its stage package (stages/models/<model>/runtime.py: sapiens2,
adaface, clip), found through its spec's `runtime` ("module:Class"), so a model from elsewhere
brings its own. Backends are always named
explicitly (no silent fallback): `cpu` (numpy forward from an HF checkpoint / cvlface
directory), `sim` (the bundle on npu.sim.SimDevice), `npu` (the bundle on the XRT device).
Without a checkpoint or bundle a model may run its synthetic stand-in when its config allows
it; every output then says `synthetic: true`.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar, cast

import numpy as np
from pydantic import Field

from npu.device import Launch, Steps, busy_steps
from npu.models import ModelLoadError, npu2_work, released_variant, spec
from npu.models.loading import ModelSource, load
from npu.sim_cost import ModelWork, Npu2Pacer
from pipeline.errors import NpucamError
from pipeline.graph import StageOptions
from pipeline.messages import Frame
from stages.batches import QueuePolicy
from stages.job_policy import Target
from stages.jobs import Inferred, Job

log = logging.getLogger(__name__)

BACKENDS = ("cpu", "sim", "npu")
PACINGS = ("npu2", "stand-in", "none")


class JobInputError(NpucamError):
    """One job's input the model's host glue cannot use (no aligned face, an empty box...)."""


class ModelOptions(StageOptions):
    """One model's keys: its table in an infer stage ([stages.sapiens2], [stages.adaface]...).
    A runtime with keys of its own subclasses this (stages.models.clip.runtime.ClipOptions)."""

    enabled: bool = False
    checkpoint: str | None = Field(None, min_length=1)  # backend cpu: HF / cvlface directory
    bundle: str | None = Field(None, min_length=1)  # backends sim, npu: bundle directory
    synthetic: bool = False  # no checkpoint / bundle: use the synthetic model (else fail)
    max_wait_ms: float = Field(0.0, ge=0)  # a partial batch closes after its oldest waited this
    queue_size: int = Field(16, ge=1, le=100_000)
    # when its queue is full; default: block if the infer stage's inbox is block (the
    # back-pressure reaches the producers), else drop_oldest
    queue_policy: QueuePolicy | None = None
    cost_s: float | None = Field(None, gt=0)  # initial pass cost; default: measured warm-up
    share: float = Field(1.0, gt=0)  # weight in the device-time split between models

    def policy(self, inbox_blocks: bool) -> QueuePolicy:
        """The queue policy this model runs with, given whether the stage's inbox blocks."""
        if self.queue_policy is not None:
            return self.queue_policy
        return "block" if inbox_blocks else "drop_oldest"

    def source(self, base_dir: Path, where: str) -> ModelSource:
        """Where this model's weights come from, its paths resolved against the config's dir."""
        return ModelSource(
            checkpoint=resolve(base_dir, self.checkpoint),
            bundle=resolve(base_dir, self.bundle),
            synthetic=self.synthetic,
            where=where,
        )


def resolve(base: Path, raw: str | None) -> str | None:
    """A config path: absolute or ~ as given, else relative to the config's directory."""
    if raw is None:
        return None
    p = Path(raw).expanduser()
    return str(p if p.is_absolute() else base / p)


@dataclass(slots=True)
class Prepared:
    """A batch ready for the device: `inputs` has one row per slot of the export batch.

    jobs: the real jobs (slots 0..len-1); slots past them are padding (copies of the first
    usable input). failed: slot -> the error of a job whose host glue failed (its slot holds
    padding too). aux: per slot, what the host glue recorded beside the input (Sapiens2: the
    crop window, float32 [4]), None where it recorded nothing.
    """

    model: str
    jobs: tuple[Job, ...]
    size: int
    inputs: np.ndarray
    failed: dict[int, Exception] = field(default_factory=dict)
    aux: list[Any] | None = None
    outputs: np.ndarray | None = None

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
    aux: Any = None


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
    the numpy forward. The simulator's modelled time alone is in SimDevice.sim.

    pass_name / count: which of the model's passes fn runs, and how many (PacedTimer
    charges them; CLIP's label encoding runs ceil(labels / 8) "texts" passes).
    context_load_s: what one context load costs the passes it times, when that is modelled
    rather than measured by the device (None: the device's measured cost)."""

    context_load_s: float | None = None

    def measure(
        self, fn: Callable[[], Any], pass_name: str = "forward", count: int = 1
    ) -> tuple[Any, float]:
        t0 = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t0


@dataclass
class Pacing:
    """How a sim device paces a stage's passes ([stages.sim] pacing, docs/device.md §6):
    "npu2": each pass takes the modelled NPU2 time of the released model it is (a synthetic
    model: the one it stands in for; `pace_as` names another variant per model), its own
    dispatches none; "stand-in": the model's own dispatches' modelled time (npu.sim's
    CostModel); "none": no waiting at all. `pacer` is the stage's one modelled NPU2 (its
    16 contexts are shared by every model)."""

    mode: str = "npu2"
    pace_as: dict[str, str] = field(default_factory=dict)
    pacer: Npu2Pacer = field(default_factory=lambda: Npu2Pacer())


class PacedTimer(DeviceTimer):
    """Device seconds of a pass paced as NPU2: the pacer charges `work`'s pass (with any
    context loads and switch), the device waits that long from the pass's start, and the
    stand-in's own dispatches cost no modelled time (npu.sim.SimDevice.paced)."""

    def __init__(self, device: Any, pacer: Npu2Pacer, work: ModelWork) -> None:
        self.device, self.pacer, self.work = device, pacer, work
        self.last_charge_s = 0.0  # the modelled seconds of the last pass measured
        # its passes are charged the modelled NPU2 load, not the stand-in's own creations
        self.context_load_s = pacer.costs.ctx_load_s

    def measure(
        self, fn: Callable[[], Any], pass_name: str = "forward", count: int = 1
    ) -> tuple[Any, float]:
        charge = self.pacer.charge(self.work, pass_name, count)
        self.last_charge_s = charge.total_s
        t0 = time.perf_counter()
        with self.device.paced(charge.total_s):
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


# a runtime's Options and job types, so that `self.options` and the job hooks are typed
ModelOptionsT = TypeVar("ModelOptionsT", bound=ModelOptions)
JobT = TypeVar("JobT", bound=Job)


class Runtime(Generic[ModelOptionsT, JobT]):
    """One loaded model on one backend (see the module docstring). A model's runtime sets
    `job_type` (what its inbox takes), `inferred_type` (what it sends on, so the graph routes
    each output to that kind's postprocess stage) and `Options` (its config table)."""

    job_type: ClassVar[type[Job]] = Job
    inferred_type: ClassVar[type[Inferred]] = Inferred
    Options: ClassVar[type[ModelOptions]] = ModelOptions

    def __init__(
        self,
        model: Any,
        *,
        name: str,
        backend: str,
        model_id: str,
        synthetic: bool,
        device: Any = None,
        batch_size: int = 1,
        contexts: tuple[str, ...] = (),
        options: ModelOptionsT | None = None,
    ) -> None:
        if batch_size < 1:
            raise ModelLoadError(f"{name}: export batch size {batch_size} < 1")
        self.model = model
        self.name = name
        self.backend = backend
        self.model_id = model_id
        self.synthetic = synthetic
        self.device = device
        self.batch_size = batch_size
        self.contexts = contexts
        self.options: ModelOptionsT = (
            options if options is not None else cast(ModelOptionsT, self.Options())
        )
        self.max_wait_ms = self.options.max_wait_ms
        self.timer: DeviceTimer = DeviceTimer()
        # "npu2 as <released model>", "stand-in", "none" on sim; "" on cpu and npu
        self.pacing = ""

    @classmethod
    def check_options(cls, options: ModelOptions, base_dir: Path, where: str) -> list[str]:
        """`key: problem` lines for this model's table at validation time (`where` names
        it, e.g. stages[3].clip); paths resolve against base_dir."""
        return []

    def attach(self, context: Any) -> None:
        """After loading: the run's shared objects (pipeline.graph.Context.shared) this
        model's host glue uses, if any (Sapiens2 reads each track's newest frame)."""

    def started(self, base_dir: Path) -> None:
        """After loading, on the device thread: anything the model computes once before its
        first job (CLIP encodes its label prompts). base_dir resolves the options' paths."""

    @classmethod
    def make_job(cls, target: Target, frame: Frame) -> Job:
        """This model's job on one target of a frame (the detect stage calls it for each
        (model, target) pair stages.job_policy.decide picks; ModelSpec.runs_on says which
        targets). A model whose jobs come from a stage of its own need not define it."""
        raise NotImplementedError(f"{cls.__name__} makes no jobs from targets")

    # -- scheduling ----------------------------------------------------------------------

    def schedule_key(self, job: JobT) -> tuple | None:
        """Jobs with one key replace each other in the scheduler (a later frame supersedes):
        by default one per tracked person of a camera; None for jobs without a track."""
        track = getattr(job, "track_id", None)
        return None if track is None else (self.name, job.camera, track)

    def priority(self, job: JobT) -> int:
        """Smaller runs first among a camera's jobs of this model (default: arrival order)."""
        return 0

    # -- host glue -----------------------------------------------------------------------

    def prepare_one(self, job: JobT) -> np.ndarray | tuple[np.ndarray, Any]:
        """One job's model input, or (input, aux) to record aux beside it (Prepared.aux)."""
        raise NotImplementedError

    def prepare(self, jobs: Sequence[Job]) -> Prepared:
        """Host glue for up to batch_size jobs -> a full batch (padded with copies of the
        first usable input). A job whose glue fails for any reason (an NpucamError, or e.g. a
        cv2.error / ValueError from a degenerate input, wrapped in a JobInputError naming the
        camera) is marked failed, not the batch."""
        if not 0 < len(jobs) <= self.batch_size:
            raise JobInputError(f"{self.name}: {len(jobs)} jobs for a batch of {self.batch_size}")
        rows: list[np.ndarray | None] = []
        aux: list[Any] = []
        failed: dict[int, Exception] = {}
        for i, job in enumerate(jobs):
            item: Any = None
            if not isinstance(job, self.job_type):
                failed[i] = JobInputError(
                    f"camera {job.camera!r}: {type(job).__name__} sent to {self.name}"
                )
            else:
                try:
                    item = self.prepare_one(cast(JobT, job))
                except NpucamError as exc:
                    failed[i] = exc
                except Exception as exc:  # any host-glue failure (cv2.error...) fails this job
                    # named by camera, the infer stage logs it (rate-limited) with the slot's error
                    failed[i] = JobInputError(
                        f"{self.name}: camera {job.camera!r} #{job.seq}: host glue failed: "
                        f"{type(exc).__name__}: {exc}"
                    )
            row, extra = item if isinstance(item, tuple) else (item, None)
            rows.append(row)
            aux.append(extra)
        pad = next((r for r in rows if r is not None), None)
        if pad is None:
            pad = self.dummy_input()
        filled = [pad if r is None else r for r in rows]
        filled += [pad] * (self.batch_size - len(jobs))
        aux += [None] * (self.batch_size - len(jobs))
        recorded = aux if any(a is not None for a in aux) else None
        return Prepared(self.name, tuple(jobs), self.batch_size, np.stack(filled), failed, recorded,
                        self.output_rows())  # fmt: skip

    def output_rows(self) -> np.ndarray | None:
        """The outputs of a stepped pass over a full batch, allocated here on the prepare
        thread and faulted in (npu.host_memory.faulted: a large fresh array's first touch can
        stall for tens of ms), or None (the default): the pass allocates its own."""
        return None

    def dummy_input(self) -> np.ndarray:
        """A valid input of one slot (warm-up passes, all-failed batches)."""
        raise NotImplementedError

    def finish(self, job: JobT, slot: SlotOutput) -> None:
        """Before a slot's output is sent on: give the job what its postprocess needs from
        the pass (Sapiens2: the crop window its host glue recorded)."""

    # -- device --------------------------------------------------------------------------

    def forward(self, inputs: np.ndarray) -> list[np.ndarray]:
        """The device pass over a full batch: one output per slot."""
        raise NotImplementedError

    @property
    def stepped(self) -> bool:
        """Whether a pass runs as device steps (forward_steps), which the device thread may
        interleave with another pass's; False: whole passes only (forward)."""
        return False

    def forward_steps(self, inputs: np.ndarray, outputs: np.ndarray | None = None) -> Steps:
        """The device pass as steps (npu.device.Steps) returning one output per slot,
        written into `outputs` (output_rows') when given."""
        raise NotImplementedError

    def run(self, prepared: Prepared) -> Ran:
        """Run a prepared batch on the device (device thread only)."""
        self._check_size(prepared)
        outs, device_s = self.timer.measure(lambda: self.forward(prepared.inputs))
        return self._ran(prepared, outs, device_s)

    def run_steps(self, prepared: Prepared) -> Generator[Sequence[Launch], None, Ran]:
        """run() as steps (device thread only); the device seconds are its launches' own
        (npu.device.busy_steps), not the wall time, which the interleaved pass shares."""
        self._check_size(prepared)
        steps = self.forward_steps(prepared.inputs, prepared.outputs)
        outs, device_s = yield from busy_steps(steps)
        return self._ran(prepared, outs, device_s)

    def _check_size(self, prepared: Prepared) -> None:
        if prepared.size != self.batch_size or len(prepared.inputs) != self.batch_size:
            raise JobInputError(
                f"{self.name}: batch of {len(prepared.inputs)} slots, export size {self.batch_size}"
            )

    def _ran(self, prepared: Prepared, outs: list[np.ndarray], device_s: float) -> Ran:
        mask = prepared.mask
        result = []
        for i, out in enumerate(outs):
            padded = i >= len(prepared.jobs)
            error = prepared.failed.get(i)
            aux = None if prepared.aux is None else prepared.aux[i]
            result.append(SlotOutput(out if mask[i] else None, padded, error, aux))
        return Ran(result, device_s)

    def warm_up(self) -> float:
        """One pass over dummy inputs (loads kernels and contexts); its device seconds."""
        inputs = np.stack([self.dummy_input()] * self.batch_size)
        _, device_s = self.timer.measure(lambda: self.forward(inputs))
        return device_s

    def extra(self) -> dict:
        """What every output of this model carries beside the array (CLIP: labels...)."""
        return {}

    def gauges(self) -> dict[str, float]:
        """This model's own gauges beside the scheduler's (the infer stage's model_gauges)."""
        return {}

    def close(self) -> None:
        close = getattr(self.model, "close", None)
        if callable(close) and self.backend != "cpu":
            close()


def runtime_class(name: str, where: str = "") -> type[Runtime]:
    """The Runtime subclass model `name`'s spec names ("module:Class")."""
    target = spec(name, where).runtime
    module_name, _, cls_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), cls_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Runtime)):
        raise ModelLoadError(f"model {name}: runtime {target} is not a Runtime class")
    return cls


def open_runtime(
    name: str,
    backend: str,
    source: ModelSource,
    *,
    device: Any = None,
    options: ModelOptions | None = None,
    base_dir: Path | None = None,
    synthetic_cache: str | Path | None = None,
    pacing: Pacing | None = None,
) -> Runtime:
    """Load model `name` on `backend` from `source` (npu.models.loading.load) and wrap it in its
    runtime with `options` (its config table; default: the runtime's defaults). device is
    the open device for sim / npu, None for cpu; pacing: how a sim device paces it (the
    infer stage passes its [stages.sim] pacing; None: by the model's own dispatches). Runs
    Runtime.started (CLIP encodes its label prompts), so call it on the device thread.
    Errors name the config key."""
    if backend not in BACKENDS:
        raise ModelLoadError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    cls = runtime_class(name, source.where)
    loaded = load(name, source, backend, device, synthetic_cache)
    rt = cls(
        loaded.model,
        name=name,
        backend=backend,
        model_id=loaded.model_id,
        synthetic=loaded.synthetic,
        device=device,
        batch_size=loaded.spec.export_batch(loaded.model, loaded.bundle_dir),
        contexts=bundle_contexts(loaded.bundle_dir) if loaded.bundle_dir is not None else (),
        options=options,
    )
    if backend == "sim":
        pace(rt, pacing or Pacing("stand-in"), loaded.bundle_dir)
    rt.started(base_dir if base_dir is not None else Path.cwd())
    return rt


def pace(rt: Runtime, pacing: Pacing, bundle_dir: Path | None) -> None:
    """Set a sim runtime's pacing: as NPU2 runs the released model it is (its timer charges
    that model's passes; the scheduler sees that model's contexts), else by its own
    dispatches; a model with no known released variant is paced by its own dispatches, and
    the log says so."""
    if pacing.mode not in PACINGS:
        raise ModelLoadError(f"pacing {pacing.mode!r}: expected one of {', '.join(PACINGS)}")
    if pacing.mode != "npu2":
        rt.pacing = pacing.mode
        return
    variant = pacing.pace_as.get(rt.name) or released_variant(rt.name, bundle_dir, rt.synthetic)
    if variant is None:
        rt.pacing = "stand-in"
        log.warning(
            "%s: no released model known for %s; paced by its own dispatches (stand-in)",
            rt.name,
            bundle_dir or "it",
        )
        return
    work = npu2_work(rt.name, variant)
    rt.timer = PacedTimer(rt.device, pacing.pacer, work)
    rt.contexts = work.contexts
    rt.pacing = f"npu2 as {work.name}"
