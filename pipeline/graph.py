"""The graph runner: builds the stages a config names, joins them with bounded queues and
runs each as an asyncio task until the sources end, a signal or --duration stops it, or a
stage dies.

How a stage plugs in
--------------------
A stage is a small class (subclass of Stage) registered by kind name as an `npucam.stages`
entry point ("module:Class", pyproject.toml) and imported only when a config uses it, so
pipeline/ names no stage and never imports model code. A config may also name any class
directly: `kind = "mypkg.mystage:MyStage"`; `run` imports that module, `validate` checks
the name only (and imports it with --import): validating a config runs no code it names.

    class AlignOptions(StageOptions):     # the stage's own keys in its [[stages]] table
        size: int = 112

    class Align(MapStage[AlignOptions]):  # self.options is typed AlignOptions
        kind = "align"
        accepts = (Job,)                  # what its inbox takes; () makes it a source
        Options = AlignOptions

        def process(self, job):           # runs in a worker thread
            if not isinstance(job, LandmarkJob):
                return [job]              # jobs without landmarks pass through to infer
            return [aligned(job, self.options.size)]

- `run(inbox, out)` is the whole life of a stage: take items with `async for item in inbox`
  (items past their deadline are already dropped and counted `stale`), send results with
  `await out.send(item)`. MapStage implements run() for the common case: process() in a
  thread, one item at a time; an exception on one item is logged and counted `error`
  (Stage.item_failed, which stages with their own run() call from their except blocks).
  A stage with `inbox_thread = True` gets a ThreadInbox instead, which a worker thread of
  its own takes from with get_wait (zmq_push: frames from capture threads skip the loop).
- A stage with accepts = () is a source (capture): it has no inbox, and stop() must make its
  run() return soon (the runner calls it on SIGINT/SIGTERM or --duration).
- `to` in the config lists where a stage's output goes (default: the next stage). out.send
  delivers an item to every target whose `accepts` matches its type, so detect can send
  Detections (to publish) and crops (to align) from one outbox.
- check(config, index) may return extra `key: problem` lines at validation time (capture
  checks its cameras' urls and files there).

Shutdown: sources stop; each stage's outbox closes when its run() returns, which closes the
next inbox once all its producers are done, so in-flight items drain stage by stage and
publish flushes last. Whatever has not drained after [pipeline] drain_timeout_s is cancelled.
A stage whose run() raises has died: the runner logs which and why, stops the others the
same way and exits 1.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from pipeline import security
from pipeline.config import Config, ConfigError, InboxConfig, explain, load_config, sane_number
from pipeline.metrics import Metrics, start_prometheus
from pipeline.queues import BoundedQueue, ThreadInbox, camera_of

log = logging.getLogger(__name__)
T = TypeVar("T")

STAGE_GROUP = "npucam.stages"  # entry points: kind = "module:Class" (pyproject.toml)


@functools.cache
def stage_kinds() -> dict[str, str]:
    """Stage kind -> "module:Class", from the npucam.stages entry points of every installed
    distribution (npucam's own in its pyproject.toml), so the engine names no stage."""
    return {ep.name: ep.value for ep in entry_points(group=STAGE_GROUP)}


ERROR_TRACEBACKS = 5


class StageOptions(BaseModel):
    """Base of a stage's Options: typed like TOML, unknown keys are errors, every number sane
    (pipeline.config.sane_number: finite, times within a microsecond and a day)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    _sane = field_validator("*")(sane_number)


# a stage's Options type, so that `self.options` is typed by it
OptionsT = TypeVar("OptionsT", bound=StageOptions)


class Context:
    """What a stage may use beyond its options: the whole config, the run's metrics, and
    the objects stages of one run share (`shared`)."""

    def __init__(self, config: Config, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        self._shared: dict[str, Any] = {}
        self._shared_lock = threading.Lock()

    def shared(self, key: str, factory: Callable[[], T]) -> T:
        """The run's one object under `key`, made by factory() on first use: how stages of
        one run share state (e.g. stages.tracks.TrackRegistry) without a module global. Any
        thread."""
        with self._shared_lock:
            if key not in self._shared:
                self._shared[key] = factory()
            return self._shared[key]


class Stage(Generic[OptionsT]):
    """Base of every stage; see the module docstring for the contract."""

    kind: ClassVar[str] = ""
    accepts: ClassVar[tuple[type, ...]] = ()
    Options: ClassVar[type[StageOptions]] = StageOptions
    # True: run() hands its inbox to a worker thread of its own, so the inbox is a ThreadInbox
    inbox_thread: ClassVar[bool] = False

    def __init__(self, name: str, options: OptionsT, context: Context) -> None:
        self.name = name
        self.options: OptionsT = options
        self.context = context
        self.metrics = context.metrics

    async def run(self, inbox: BoundedQueue | None, out: Outbox) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        """Sources: stop producing soon. Called from the event loop."""

    def item_failed(self, item: Any) -> None:
        """Count a failure on one item as an `error` drop and log it (call from an except
        block). The first ERROR_TRACEBACKS get a traceback; then one line per 100, so a
        stage failing on every frame does not flood the log."""
        self._failures = getattr(self, "_failures", 0) + 1
        self.metrics.drop(self.name, camera_of(item), "error")
        n = self._failures
        where = f"stage {self.name}: failed on {camera_of(item)} #{getattr(item, 'seq', '?')}"
        if n <= ERROR_TRACEBACKS:
            log.exception("%s", where)
        elif n % 100 == 0:
            log.error(
                "%s (%d failures so far; tracebacks after the first %d are not logged)",
                where,
                n,
                ERROR_TRACEBACKS,
            )

    @classmethod
    def check(cls, config: Config, index: int) -> list[str]:
        """Extra `key: problem` lines for this stage's part of the config."""
        return []

    @classmethod
    def produces(cls, options: Any) -> tuple[type, ...]:
        """The item types this stage makes with `options` (its validated Options) for other
        stages to consume, as far as a config check needs to know (a stage that consumes
        them can then say when nothing makes them); () when it declares none."""
        return ()

    @classmethod
    def warnings(cls, config: Config, index: int) -> list[str]:
        """`key: warning` lines: what will run, but not as one may expect (validate prints
        them; the stage logs them again when it starts)."""
        return []


class MapStage(Stage[OptionsT]):
    """A stage that turns each item into zero or more items with a blocking process()."""

    def process(self, item: Any) -> Iterable[Any]:
        raise NotImplementedError

    def _results(self, item: Any) -> list[Any]:
        return list(self.process(item))

    async def run(self, inbox: BoundedQueue | None, out: Outbox) -> None:
        assert inbox is not None
        async for item in inbox:
            start = time.perf_counter()
            try:
                results = await asyncio.to_thread(self._results, item)
            except Exception:
                self.item_failed(item)
                continue
            finally:
                self.metrics.observe_work(self.name, time.perf_counter() - start)
            for result in results:
                await out.send(result)


class Outbox:
    """Where a stage's items go: the inboxes of its `to` stages, chosen by accepted type."""

    def __init__(
        self,
        stage: str,
        targets: list[tuple[str, tuple[type, ...], BoundedQueue]],
        metrics: Metrics,
    ) -> None:
        self.stage = stage
        self.targets = targets
        self.metrics = metrics
        self._routes: dict[type, list[BoundedQueue]] = {}

    def _route(self, item: Any) -> list[BoundedQueue]:
        cls = type(item)
        queues = self._routes.get(cls)
        if queues is None:
            queues = [q for _, accepts, q in self.targets if issubclass(cls, accepts)]
            if not queues:
                names = ", ".join(name for name, _, _ in self.targets) or "none"
                log.error(
                    "stage %s: no target takes %s (targets: %s); dropping",
                    self.stage,
                    cls.__name__,
                    names,
                )
            self._routes[cls] = queues
        return queues

    async def send(self, item: Any) -> None:
        """Deliver to every matching target (waits only for `block` inboxes)."""
        queues = self._route(item)
        if not queues:
            self.metrics.drop(self.stage, camera_of(item), "error")
            return
        taken = [await q.put(item) for q in queues]
        if any(taken):
            self.metrics.count_out(self.stage, camera_of(item))

    def send_threadsafe(self, item: Any, give_up=lambda: False) -> bool:
        """send() from a non-loop thread (capture readers); False if no target took it."""
        queues = self._route(item)
        if not queues:
            self.metrics.drop(self.stage, camera_of(item), "error")
            return False
        taken = any([q.put_threadsafe(item, give_up) for q in queues])
        if taken:
            self.metrics.count_out(self.stage, camera_of(item))
        return taken

    def close(self) -> None:
        for _, _, q in self.targets:
            q.producer_done()


_MODULE_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_CLASS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _shown(kind: str) -> str:
    text = repr(kind)
    return text if len(text) <= 80 else text[:77] + "..."


def parse_kind(kind: str) -> tuple[str, str, bool]:
    """(module, class name, registered) of a stage kind: a registered kind name (an
    npucam.stages entry point) or "module.path:Class", checked as names only, nothing
    imported. LookupError says what is wrong; it never raises anything else."""
    kinds = stage_kinds()
    registered = kind in kinds
    target = kinds[kind] if registered else kind
    module_name, sep, cls_name = target.partition(":")
    if not sep:
        raise LookupError(
            f"unknown stage kind {_shown(kind)} (known: {', '.join(kinds)}; or give "
            "module.path:Class)"
        )
    if not _MODULE_PATH.fullmatch(module_name) or not _CLASS_NAME.fullmatch(cls_name):
        raise LookupError(
            f"stage kind {_shown(kind)}: expected module.path:Class (an absolute module path "
            "of identifiers, a colon, a class name)"
        )
    return module_name, cls_name, registered


def stage_class(kind: str) -> type[Stage]:
    """Import the class of a stage kind (a registered kind name or "module:Class"); every
    failure, whatever the imported module raises, is a LookupError naming the kind."""
    module_name, cls_name, _ = parse_kind(kind)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # importing user code may raise anything
        raise LookupError(
            f"stage kind {_shown(kind)}: cannot import {module_name}: {type(exc).__name__}: {exc}"
        ) from None
    cls = getattr(module, cls_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Stage)):
        raise LookupError(
            f"stage kind {_shown(kind)}: {module_name}:{cls_name} is not a Stage class"
        )
    return cls


Checked = list[tuple[type[Stage], StageOptions] | None]


def check_stages(config: Config, import_modules: bool = True) -> Checked:
    """Each stage's class and validated options; ConfigError lists every problem.

    Registered kinds (entry points) are always imported. A "module:Class" kind that is not
    registered names user code: with import_modules False (`npucam validate` without
    --import) it is checked as a name only, nothing of it imported, and its entry is None
    (its keys and wiring are checked by `run`). `run` always imports."""
    problems: list[str] = security.check_section(config)
    built: Checked = []
    for i, stage in enumerate(config.stages):
        try:
            _, _, registered = parse_kind(stage.kind)
            if not (registered or import_modules):
                built.append(None)
                continue
            cls = stage_class(stage.kind)
        except LookupError as exc:
            problems.append(f"stages[{i}].kind: {exc}")
            continue
        try:
            options = cls.Options.model_validate(stage.options)
        except ValidationError as exc:
            problems.extend(explain(exc, ("stages", i)))
            continue
        if not cls.accepts and stage.inbox is not None:
            problems.append(f"stages[{i}].inbox: a {stage.kind} stage is a source and has no inbox")
        problems.extend(cls.check(config, i))
        built.append((cls, options))
    for i, entry in enumerate(built if not problems else []):
        if entry is None:
            continue
        cls = entry[0]
        name = config.stage_names[i]
        for j, target in enumerate(_targets(config, i)):
            t_entry = built[config.stage_names.index(target)]
            if t_entry is not None and not t_entry[0].accepts:
                problems.append(f"stages[{i}].to[{j}]: {target!r} is a source; it takes no input")
        if cls.accepts and not any(i in _targets_index(config, k) for k in range(len(built))):
            problems.append(f"stages[{i}]: nothing sends to stage {name!r}")
    if problems:
        raise config.error(dict.fromkeys(problems))  # two capture stages check one camera
    return built


def stage_warnings(config: Config, checked: Checked) -> list[str]:
    """`file: key: warning` lines for what will run but not as one may expect (a gallery
    that does not exist yet; a user kind validate did not import)."""
    lines = []
    for i, entry in enumerate(checked):
        if entry is None:
            lines.append(
                f"stages[{i}].kind: {_shown(config.stages[i].kind)} is not a registered stage "
                "kind: checked as a name only; `npucam run` imports its module and checks its "
                "keys (`npucam validate --import` does it now)"
            )
        else:
            lines.extend(entry[0].warnings(config, i))
    return [f"{config.path}: {line}" for line in lines]


def _targets(config: Config, i: int) -> list[str]:
    stage = config.stages[i]
    if stage.to is not None:
        return list(stage.to)
    return [config.stage_names[i + 1]] if i + 1 < len(config.stages) else []


def _targets_index(config: Config, i: int) -> list[int]:
    return [config.stage_names.index(t) for t in _targets(config, i)]


def load(path: str, import_modules: bool = True) -> tuple[Config, Checked]:
    """load_config + check_stages: everything `npucam validate` checks."""
    config = load_config(path)
    return config, check_stages(config, import_modules)


def new_inbox(cls: type[Stage], name: str, inbox: InboxConfig, metrics: Metrics) -> BoundedQueue:
    """The inbox of stage `name` (of class cls) as the pipeline makes it: a ThreadInbox when
    the stage's own worker thread takes from it (Stage.inbox_thread), else a BoundedQueue."""
    queue = ThreadInbox if cls.inbox_thread else BoundedQueue
    return queue(name, inbox.size, inbox.policy, metrics, inbox.drop_stale)


class Pipeline:
    """One run of a config. `await run(duration)` returns the exit code (0 ok, 1 a stage died).

    After run(): stages (by name), inboxes (by stage name) and metrics stay inspectable.
    """

    def __init__(self, config: Config, metrics: Metrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        # run imports every kind (import_modules=True), so no entry is None
        self.classes = [entry for entry in check_stages(config) if entry is not None]
        self.stages: dict[str, Stage] = {}
        self.inboxes: dict[str, BoundedQueue] = {}
        self.abandoned: list[str] = []
        self.prometheus_server = None
        self._stop = asyncio.Event()
        self._force = False

    def stop(self) -> None:
        """Ask the run to end as on SIGTERM (safe to call from the loop; idempotent)."""
        if self._stop.is_set():
            self._force = True
        self._stop.set()

    def _build(self) -> list[tuple[Stage, BoundedQueue | None, Outbox]]:
        context = Context(self.config, self.metrics)
        names = self.config.stage_names
        for name, (cls, options) in zip(names, self.classes, strict=True):
            self.stages[name] = cls(name, options, context)
        for i, (name, (cls, _)) in enumerate(zip(names, self.classes, strict=True)):
            if cls.accepts:
                q = new_inbox(cls, name, self.config.stages[i].inbox or InboxConfig(), self.metrics)
                self.inboxes[name] = q
                self.metrics.add_queue(name, q.__len__)
        wired = []
        for i, name in enumerate(names):
            targets = []
            for target in _targets(self.config, i):
                q = self.inboxes[target]
                q.add_producer()
                targets.append((target, type(self.stages[target]).accepts, q))
            wired.append(
                (self.stages[name], self.inboxes.get(name), Outbox(name, targets, self.metrics))
            )
        return wired

    async def run(self, duration: float | None = None, handle_signals: bool = True) -> int:
        loop = asyncio.get_running_loop()
        wired = self._build()
        server = None
        if self.config.metrics.prometheus:
            server = start_prometheus(self.metrics, self.config.metrics.prometheus)
            self.prometheus_server = server
            log.info("prometheus metrics on http://%s:%d/metrics", *server.server_address[:2])
            host, port = server.server_address[:2]
            if not security.is_loopback(f"tcp://{host}:{port}"):
                log.warning(
                    "prometheus metrics on %s are plain HTTP without authentication, "
                    "reachable from the network (docs/security.md)",
                    host,
                )
        signals = (signal.SIGINT, signal.SIGTERM) if handle_signals else ()
        for sig in signals:
            loop.add_signal_handler(sig, self._on_signal, sig)
        tasks = {asyncio.create_task(self._run_stage(*w), name=w[0].name): w[0] for w in wired}
        died: list[tuple[str, BaseException]] = []
        try:
            await self._wait(tasks, duration, died)
            for stage in self.stages.values():
                if not stage.accepts:
                    stage.stop()
            await self._drain(tasks, died)
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
            if server is not None:
                server.shutdown()
                server.server_close()
        if died:
            for name, exc in died:
                log.error("stage %s died: %s: %s", name, type(exc).__name__, exc)
            log.error("pipeline stopped because stage %s died", died[0][0])
            return 1
        return 0

    def _on_signal(self, sig: int) -> None:
        log.info(
            "%s: stopping (drain up to %.1f s)%s",
            signal.Signals(sig).name,
            self.config.pipeline.drain_timeout_s,
            "; second signal: cancelling now" if self._stop.is_set() else "",
        )
        self.stop()

    async def _run_stage(self, stage: Stage, inbox: BoundedQueue | None, out: Outbox) -> None:
        try:
            await stage.run(inbox, out)
        finally:
            out.close()
            if inbox is not None:
                lost = inbox.discard()
                if lost:
                    log.warning("stage %s ended with %d item(s) in its inbox", stage.name, lost)

    async def _wait(self, tasks: dict, duration: float | None, died: list) -> None:
        """Until stop(), the duration, every stage ending, or one dying."""
        deadline = None if duration is None else time.monotonic() + duration
        stop_wait = asyncio.create_task(self._stop.wait())
        pending = set(tasks)
        try:
            while pending:
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                done, pending = await asyncio.wait(
                    pending | {stop_wait}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                pending.discard(stop_wait)
                for task in done - {stop_wait}:
                    if not task.cancelled() and task.exception() is not None:
                        died.append((tasks[task].name, task.exception()))
                if died or stop_wait in done:
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    log.info("duration %.1f s reached: stopping", duration)
                    return
        finally:
            stop_wait.cancel()

    async def _drain(self, tasks: dict, died: list) -> None:
        timeout = self.config.pipeline.drain_timeout_s
        pending = {t for t in tasks if not t.done()}
        end = time.monotonic() + timeout
        while pending and not self._force and time.monotonic() < end:
            done, pending = await asyncio.wait(pending, timeout=min(0.1, timeout))
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    died.append((tasks[task].name, task.exception()))
        for task in pending:
            log.warning(
                "stage %s did not drain within %.1f s: cancelling", tasks[task].name, timeout
            )
            task.cancel()
        if pending:
            done, still = await asyncio.wait(pending, timeout=2.0)
            self.abandoned = [tasks[t].name for t in still]
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    died.append((tasks[task].name, task.exception()))


__all__ = [
    "STAGE_GROUP",
    "ConfigError",
    "Context",
    "MapStage",
    "Outbox",
    "Pipeline",
    "Stage",
    "StageOptions",
    "check_stages",
    "load",
    "parse_kind",
    "stage_class",
    "stage_kinds",
    "stage_warnings",
]
