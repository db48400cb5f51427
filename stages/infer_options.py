"""An infer stage's configuration: its keys (InferOptions, one table per registered model,
[stages.sim]), the checks `npucam validate` runs on them, and the device its backend opens
(npu.backends.open_device; sim built from [stages.sim], npu.sim.CostModel)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, create_model

from npu import models
from npu.backends import open_device
from pipeline.config import Config
from pipeline.errors import NpucamError
from pipeline.files import path_kind
from pipeline.graph import Stage, StageOptions, parse_kind, stage_class
from stages.runtimes import ModelOptions, resolve, runtime_class


class SimOptions(StageOptions):
    """[stages.sim]: the simulated device (backend sim). pacing (docs/device.md §6): "npu2"
    (each pass takes the modelled NPU2 time of the released model it is or stands in for),
    "stand-in" (the model's own dispatches at the rates below, npu.sim.CostModel's) or
    "none" (no waiting); pace_as: model -> the released variant to pace it as (e.g.
    adaface = "ir18"; default the bundle's, or the synthetic model's stands_in_for)."""

    pacing: Literal["npu2", "stand-in", "none"] = "npu2"
    pace_as: dict[str, str] = {}
    gemm_flops_per_s: float = Field(1.6e12, gt=0)
    mha_flops_per_s: float = Field(1.2e12, gt=0)
    default_flops_per_s: float = Field(1.0e12, gt=0)
    bytes_per_s: float = Field(60e9, gt=0)
    dispatch_s: float = Field(50e-6, ge=0)
    ctx_switch_s: float = Field(2.9e-3, ge=0)
    ctx_create_s: float = Field(30e-3, ge=0)
    hwctx_limit: int = Field(16, ge=1)  # machine-wide contexts (shared with other processes)
    registry_dir: str | None = Field(None, min_length=1)  # default $NPUCAM_SIM_HWCTX_DIR


class InferOptions(StageOptions):
    """An infer stage's keys, and one table per registered model ([stages.sapiens2],
    [stages.clip]...), each typed by its runtime's Options (stages.runtimes). Validating
    through InferOptions builds the class for the models registered now (infer_options)."""

    backend: Literal["cpu", "sim", "npu"]
    sim: SimOptions = SimOptions()
    context_slots: int | None = Field(None, ge=1)  # modelled LRU; default TACONITE_CTX_CACHE/16
    prepare_ahead_ms: float = Field(200.0, ge=0)  # hand out the next batch this early
    # how far (device-ms / share) a model may run ahead of the others; None: half the
    # cheapest pass (stages.scheduler)
    model_window_ms: float | None = Field(None, ge=0)
    synthetic_cache: str | None = Field(None, min_length=1)  # default <asset cache>/synthetic

    @property
    def model_window_s(self) -> float | None:
        """model_window_ms in seconds, as BatchScheduler takes it (None: its default)."""
        return None if self.model_window_ms is None else self.model_window_ms / 1000

    @classmethod
    def model_validate(cls, obj: Any, **kw: Any) -> InferOptions:
        if cls is InferOptions:
            return infer_options().model_validate(obj, **kw)
        return super().model_validate(obj, **kw)

    def model(self, name: str) -> ModelOptions:
        """The table of model `name`."""
        return getattr(self, name)

    def enabled(self) -> list[str]:
        """The enabled models, in registry order."""
        return [m for m in models.names() if self.model(m).enabled]


@functools.cache
def _options_for(names: tuple[str, ...]) -> type[InferOptions]:
    tables: dict[str, Any] = {}
    for name in names:
        options = runtime_class(name).Options
        tables[name] = (options, options())
    return create_model("InferOptions", __base__=InferOptions, **tables)


def _path_problems(where: str, path: Path, kind: str, key: str) -> list[str]:
    """What `run` would die on in a model path that exists: a bundle must be a directory
    whose manifest and tensor table npu.bundle reads (an empty or unreadable folder, or
    `bundle = "/etc"`, fails here, not in the device thread); a checkpoint a directory or
    a file."""
    if key == "checkpoint":
        if kind in ("file", "directory"):
            return []
        return [f"{where}: {path} is {kind}, not a checkpoint directory or file"]
    if kind != "directory":
        shown = "a file" if kind == "file" else kind
        return [f"{where}: {path} is {shown}, not a bundle directory"]
    from npu.bundle import Bundle

    try:
        Bundle.open(path).close()
    except (NpucamError, OSError, ValueError) as exc:
        return [f"{where}: not a usable bundle: {exc}"]
    return []


def infer_options() -> type[InferOptions]:
    """InferOptions with a table for every model registered now."""
    return _options_for(models.names())


def open_stage_device(options: InferOptions, base_dir: Path) -> Any:
    """The device of an infer stage's backend (npu.backends.open_device); sim built from its
    [stages.sim] table (paths relative to base_dir)."""
    if options.backend != "sim":
        return open_device(options.backend)
    from npu.sim import CostModel

    s = options.sim
    cost = CostModel(
        flops_per_s=(("gemm", s.gemm_flops_per_s), ("mha", s.mha_flops_per_s)),
        default_flops_per_s=s.default_flops_per_s,
        bytes_per_s=s.bytes_per_s,
        dispatch_s=s.dispatch_s,
        ctx_create_s=s.ctx_create_s,
        ctx_switch_s=s.ctx_switch_s,
    )
    return open_device(
        "sim",
        cost=cost,
        sleep=s.pacing != "none",
        registry_dir=resolve(base_dir, s.registry_dir),
        hwctx_limit=s.hwctx_limit,
    )


def check_infer(config: Config, index: int) -> list[str]:
    """Every enabled model's path for the backend exists, or synthetic is allowed; and
    each runtime's own checks of its table (Runtime.check_options)."""
    try:
        options = InferOptions.model_validate(config.stages[index].options)
    except Exception:
        return []  # check_stages reported the validation errors
    problems = []
    enabled = options.enabled()
    if not enabled:
        problems.append(
            f"stages[{index}]: no model enabled (set enabled = true in one of "
            + ", ".join(f"[stages.{m}]" for m in models.names())
            + ")"
        )
    for m, variant in options.sim.pace_as.items():
        try:
            models.npu2_work(m, variant)
        except (models.ModelLoadError, KeyError) as exc:
            problems.append(f"stages[{index}].sim.pace_as.{m}: {exc}")
    key = "checkpoint" if options.backend == "cpu" else "bundle"
    for m in enabled:
        mo = options.model(m)
        raw = getattr(mo, key)
        path = resolve(config.base_dir, raw)
        kind = "missing" if path is None else path_kind(path)
        where = f"stages[{index}].{m}.{key}"
        if kind == "missing" and not (mo.synthetic and options.backend != "npu"):
            what = "is not set" if raw is None else f"{path} does not exist"
            fix = (
                "synthetic models run on cpu and sim only"
                if mo.synthetic
                else "or set synthetic = true"
            )
            problems.append(f"{where}: {what} (backend {options.backend}; {fix})")
        elif kind != "missing" and path is not None:
            problems.extend(_path_problems(where, Path(path), kind, key))
        problems.extend(runtime_class(m).check_options(mo, config.base_dir, f"stages[{index}].{m}"))
    problems.extend(_without_producer(config, index, enabled))
    return problems


_BASE_PRODUCES = getattr(Stage.produces, "__func__", None)


def _without_producer(config: Config, index: int, enabled: list[str]) -> list[str]:
    """A `key: problem` line for each enabled model whose jobs no stage of the config makes
    (Stage.produces: a detect stage for the targets the model runs on, the dark stage's
    face points...): enabled, it would run nothing, silently. A config with a stage of user
    code (a "module:Class" kind, not imported here), or without any stage that declares
    making jobs (an infer stage checked alone), is not checked: its jobs come from elsewhere."""
    made: set[type] = set()
    producers = 0  # stages that declare what they make (Stage.produces overridden)
    for stage in config.stages:
        try:
            _, _, registered = parse_kind(stage.kind)
            if not registered:
                return []
            cls = stage_class(stage.kind)
            made.update(cls.produces(cls.Options.model_validate(stage.options)))
        except (LookupError, ValidationError):
            continue  # check_stages reports it
        producers += getattr(cls.produces, "__func__", None) is not _BASE_PRODUCES
    if not producers:
        return []  # no stage here can make jobs: they come from elsewhere, unchecked
    problems = []
    for m in enabled:
        job_type = runtime_class(m).job_type
        if any(issubclass(t, job_type) for t in made):
            continue
        runs_on = models.spec(m).runs_on
        needs = (
            f"it runs on {runs_on.target} targets ({runs_on.cadence} cadence): a detect stage "
            "whose keys find them and leave its jobs on"
            if runs_on is not None
            else "it declares no targets: a stage of its own must send them"
        )
        problems.append(
            f"stages[{index}].{m}: enabled, but no stage of this config makes its jobs "
            f"({job_type.__name__}; {needs})"
        )
    return problems


def infer_stage_indexes(config: Config) -> list[int]:
    """The indexes of the config's infer stages (kind "infer" or stages.infer:Infer), read
    from their kinds only, nothing imported."""
    found = []
    for i, stage in enumerate(config.stages):
        try:
            module, cls, _ = parse_kind(stage.kind)
        except LookupError:
            continue
        if (module, cls) == ("stages.infer", "Infer"):
            found.append(i)
    return found


def enabled_models(config: Config) -> list[str] | None:
    """The models enabled in the config's infer stages, in registry order; None when it has
    no infer stage (the NPU runs in another process: every model may get jobs). A stage
    whose keys do not validate counts for none (check_stages reports it)."""
    indexes = infer_stage_indexes(config)
    if not indexes:
        return None
    enabled: set[str] = set()
    for i in indexes:
        try:
            enabled.update(InferOptions.model_validate(config.stages[i].options).enabled())
        except ValidationError:
            continue
    return [m for m in models.names() if m in enabled]
