"""The camera source registry: every url scheme belongs to one SourceKind, which parses and
checks its urls, opens its sources and says how `npucam plan` probes them. Built-in kinds
load on first use (as npu/models/__init__.py loads models), then those of the installed
distributions' npucam.sources entry points (as pipeline/graph.py finds stage kinds), so a
plugin reaches every `npucam` command; a module in the same process may call register()."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from stages.source_kinds.base import Source

if TYPE_CHECKING:
    import threading

    from stages.source_kinds.spec import CameraSpec

# in the order the unknown-scheme error lists their url forms
BUILTIN = (
    "stages.source_kinds.file",
    "stages.source_kinds.usb",
    "stages.source_kinds.stream",
    "stages.source_kinds.images",
    "stages.source_kinds.zmq_pull",
    "stages.source_kinds.synthetic",
    "stages.source_kinds.recording",
)
PLUGIN_GROUP = "npucam.sources"  # entry points: name = "module:KIND", KIND a SourceKind
PROBES = ("read", "live", "known")


class SourceKind:
    """One kind of camera source; a module defines a subclass and registers one instance.

    name: the camera's `kind` (CameraSpec.kind, the planner's CameraProbe.kind).
    schemes: the url schemes it owns, lower case; "" owns urls without a scheme (file paths).
    forms: its url forms as the unknown-scheme error lists them ("usb:", "rtsp://").
    live: it delivers at its own pace: never paced, reopened by default when it ends.
    probe: how `npucam plan` measures it (stages/planning/probe.py): "read" opens it and
        reads its first frames, at the camera's `fps` or the source's native rate; "live"
        reads it for a few seconds and measures the rate frames arrive at; "known" reads
        nothing and takes known_format().
    """

    name: ClassVar[str]
    schemes: ClassVar[tuple[str, ...]]
    forms: ClassVar[tuple[str, ...]]
    live: ClassVar[bool] = False
    probe: ClassVar[str] = "read"

    def parse(self, spec: CameraSpec, scheme: str, rest: str) -> Any:
        """The target of url `scheme:rest` (rest is the whole url when scheme is ""), kept as
        spec.target; spec.error(...) names the camera and url when it is invalid."""
        raise NotImplementedError

    def path(self, spec: CameraSpec) -> Path | None:
        """The file or folder the camera reads (it may not exist yet); None if none."""
        return None

    def missing(self, spec: CameraSpec) -> str | None:
        """Why `npucam validate` says the camera cannot be read now, or None: checks what
        open() will need that is there before the run (files, folders)."""
        return None

    def open(self, spec: CameraSpec, stop: threading.Event) -> Source:
        """The camera's source, not opened yet (its reader opens it); stop is set when the
        reader stops, for a source that waits on its own. spec.error(...) for a camera that
        can never be read."""
        raise NotImplementedError

    def known_format(self, spec: CameraSpec) -> tuple[float, tuple[int, int]]:
        """probe = "known": (frame rate, (width, height)) of the camera's frames."""
        raise NotImplementedError


_REGISTRY: dict[str, SourceKind] = {}
_loaded = False


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in BUILTIN:
        register(importlib.import_module(module).KIND)
    for ep in entry_points(group=PLUGIN_GROUP):
        try:
            kind = ep.load()
        except Exception as exc:
            raise ImportError(
                f"{PLUGIN_GROUP} entry point {ep.name} = {ep.value!r}: {exc}"
            ) from exc
        register(kind)


def register(kind: SourceKind) -> None:
    """Add a kind of source; a name or scheme another kind has is an error."""
    _load()
    if kind.probe not in PROBES:
        raise ValueError(f"source kind {kind.name!r}: probe must be one of {PROBES}")
    for other in _REGISTRY.values():
        if other is kind:
            return
        taken = set(other.schemes) & set(kind.schemes)
        if other.name == kind.name or taken:
            what = f"scheme {sorted(taken)[0]!r}" if taken else "its name"
            raise ValueError(f"source kind {kind.name!r}: {what} belongs to {other.name!r}")
    _REGISTRY[kind.name] = kind


def unregister(name: str) -> None:
    """Remove a kind added with register (tests that add one clean up with this)."""
    _load()
    _REGISTRY.pop(name, None)


def for_scheme(scheme: str) -> SourceKind | None:
    """The kind owning url scheme `scheme` (lower case; "" for a bare path), or None."""
    _load()
    return next((k for k in _REGISTRY.values() if scheme in k.schemes), None)


def forms() -> str:
    """Every registered url form, for an error: "a, b or c"."""
    _load()
    every = [form for kind in _REGISTRY.values() for form in kind.forms]
    return ", ".join(every[:-1]) + " or " + every[-1]
