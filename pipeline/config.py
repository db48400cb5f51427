"""Pipeline configuration: a TOML file validated on load (docs/configuration.md).

Every error names the file, the key path and what was expected, e.g.
`configs/x.toml: cameras[1].url: expected a string (got 5)`; unknown keys are errors.
Stage-specific keys sit in the stage's own table and are checked against the stage class's
Options model by pipeline.graph (which imports stage classes lazily by kind).
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from pipeline.errors import NpucamError

NAME_PATTERN = r"^[A-Za-z0-9_-]+$"


class ConfigError(NpucamError):
    """A config file that cannot be used; one line per problem, each naming file and key."""


DAY_S = 86_400.0
MAX_NUMBER = 1e15  # beyond any count, size or rate a config means


def sane_number(value: Any, info: ValidationInfo) -> Any:
    """Every number of a config: finite and at most MAX_NUMBER; a time (a key ending in _s or
    _ms) at most a day and, unless 0, at least a microsecond. ValueError says which bound
    (the key path is added by explain)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    if not math.isfinite(value):
        raise ValueError(f"{value} is not a finite number")
    if abs(value) > MAX_NUMBER:
        raise ValueError(f"{value:g} is beyond any sane value (at most {MAX_NUMBER:g})")
    name = info.field_name or ""
    scale = 1e3 if name.endswith("_ms") else 1.0 if name.endswith("_s") else None
    if scale is not None:
        unit = "ms" if scale == 1e3 else "s"
        if abs(value) > DAY_S * scale:
            raise ValueError(f"{value:g} {unit} is over a day ({DAY_S * scale:g} {unit})")
        if value and abs(value) < 1e-6 * scale:
            raise ValueError(
                f"{value:g} {unit} is under a microsecond (0 or at least {1e-6 * scale:g})"
            )
    return value


class _Strict(BaseModel):
    """TOML values are typed: no "5" for 5, and no key the model does not declare; numbers are
    sane (sane_number)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    _sane = field_validator("*")(sane_number)


class InboxConfig(_Strict):
    """A stage's input queue: how many items wait, and what happens when it is full."""

    size: int = Field(8, ge=1, le=100_000)
    policy: Literal["drop_oldest", "block", "latest"] = "drop_oldest"
    drop_stale: bool = True  # drop items past their deadline (counted `stale`) before the stage


class SecuritySection(_Strict):
    """[security], or one socket's `security` table: the CURVE key files (docs/security.md).

    Present (even empty) means every ZeroMQ socket of the process uses CURVE; a socket's own
    table overrides these paths one by one. Relative paths resolve against the config file's
    directory. pipeline.security loads and checks the files.
    """

    server_secret_key: str | None = Field(None, min_length=1)  # binding sockets' key pair
    server_public_key: str | None = Field(None, min_length=1)  # connecting sockets: the server
    client_secret_key: str | None = Field(None, min_length=1)  # connecting sockets' key pair
    authorized_clients: str | None = Field(None, min_length=1)  # dir of *.key files, or one


# The largest frame a `zmq:` camera accepts by default (4K UHD): a peer's frame header and JPEG
# cannot make the receiver decode anything bigger (stages/frame_wire.py).
DEFAULT_MAX_PIXELS = 3840 * 2160
# zmq: cameras' SO_RCVBUF (CameraConfig.receive_buffer_bytes): room for JPEG frames, not for lag
DEFAULT_RECEIVE_BUFFER_BYTES = 1 << 20


class CameraConfig(_Strict):
    """One [[cameras]] entry; stages.capture turns it into a stages.sources.CameraSpec."""

    name: str = Field(pattern=NAME_PATTERN)
    url: str = Field(min_length=1)
    loop: bool = False
    realtime: bool = True
    fps: float | None = Field(None, ge=1e-3, le=1000)  # from a frame in 1000 s to 1000 a second
    staleness_ms: float = Field(500.0, gt=0)
    stall_timeout_s: float = Field(5.0, gt=0)
    reconnect_min_s: float = Field(0.5, gt=0)
    reconnect_max_s: float = Field(30.0, gt=0)
    end: Literal["stop", "reconnect"] | None = None
    security: SecuritySection | None = None  # zmq: cameras: overrides of [security]
    max_clock_skew_ms: float = Field(10_000.0, gt=0)  # zmq: cameras: trust of the sender's clock
    max_pixels: int = Field(DEFAULT_MAX_PIXELS, ge=1, le=16384 * 16384)  # zmq: frames
    # zmq: cameras: the kernel's receive buffer (SO_RCVBUF) for the frames' TCP stream
    receive_buffer_bytes: int = Field(DEFAULT_RECEIVE_BUFFER_BYTES, ge=1 << 16, le=1 << 28)


class StageConfig(BaseModel):
    """One [[stages]] entry. Keys other than kind/name/to/inbox are the stage's options."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    kind: str = Field(min_length=1)
    name: str | None = Field(None, pattern=NAME_PATTERN)
    to: list[str] | None = None
    inbox: InboxConfig | None = None

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


STATS_MIN_S = 0.05  # each stats message snapshots every stage and camera


class PipelineSection(_Strict):
    drain_timeout_s: float = Field(3.0, ge=0)


class MetricsSection(_Strict):
    stats_interval_s: float = Field(5.0, ge=0)  # 0: no stats; else at least STATS_MIN_S

    @field_validator("stats_interval_s")
    @classmethod
    def _not_too_often(cls, value: float) -> float:
        if 0 < value < STATS_MIN_S:
            raise ValueError(f"{value:g} s is under {STATS_MIN_S} s (0 turns stats off)")
        return value

    prometheus: str | None = Field(None, pattern=r"^[^:\s]*:\d{1,5}$")


class _ConfigModel(_Strict):
    pipeline: PipelineSection = PipelineSection()
    metrics: MetricsSection = MetricsSection()
    security: SecuritySection | None = None
    cameras: list[CameraConfig] = []
    stages: list[StageConfig] = Field(min_length=1)


class Config:
    """A loaded config: its sections plus the file it came from.

    path: the file as given (used in messages); base_dir: its directory, against which
    relative paths in it resolve. stage_names[i] is the name of stages[i] (name or kind).
    """

    def __init__(self, model: _ConfigModel, path: Path) -> None:
        self.path = path
        self.base_dir = path.resolve().parent
        self.pipeline = model.pipeline
        self.metrics = model.metrics
        self.security = model.security
        self.cameras = model.cameras
        self.stages = model.stages
        self.stage_names = [s.name or s.kind for s in model.stages]

    def error(self, lines: Iterable[str]) -> ConfigError:
        """A ConfigError of `key: problem` lines, each prefixed with this file."""
        return ConfigError("\n".join(f"{self.path}: {line}" for line in lines))


def load_config(path: str | Path) -> Config:
    """Read and check a config file's structure; ConfigError lists every problem found."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    return parse_config(data, path)


def parse_config(data: dict, path: Path) -> Config:
    """Check an already-parsed TOML document (path is only used in messages and paths)."""
    try:
        model = _ConfigModel.model_validate(data)
    except ValidationError as exc:
        raise ConfigError("\n".join(f"{path}: {line}" for line in explain(exc))) from None
    config = Config(model, path)
    problems = _check_names(config)
    if problems:
        raise config.error(problems)
    return config


def _check_names(config: Config) -> list[str]:
    problems = []
    seen: dict[str, int] = {}
    for i, cam in enumerate(config.cameras):
        if cam.name in seen:
            problems.append(
                f"cameras[{i}].name: duplicate camera name {cam.name!r} "
                f"(also cameras[{seen[cam.name]}])"
            )
        seen.setdefault(cam.name, i)
        if cam.reconnect_min_s > cam.reconnect_max_s:
            problems.append(
                f"cameras[{i}].reconnect_min_s: expected at most reconnect_max_s "
                f"({cam.reconnect_max_s:g}), got {cam.reconnect_min_s:g}"
            )
    stages: dict[str, int] = {}
    for i, name in enumerate(config.stage_names):
        if name in stages:
            problems.append(
                f"stages[{i}]: duplicate stage name {name!r} (also stages[{stages[name]}]); "
                "give each stage a distinct `name`"
            )
        stages.setdefault(name, i)
    for i, stage in enumerate(config.stages):
        for j, target in enumerate(stage.to or []):
            if target not in stages:
                problems.append(
                    f"stages[{i}].to[{j}]: no stage named {target!r} "
                    f"(stages: {', '.join(config.stage_names)})"
                )
            elif target == config.stage_names[i]:
                problems.append(f"stages[{i}].to[{j}]: a stage cannot send to itself")
    return problems


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def key_path(loc: Sequence[str | int]) -> str:
    """('cameras', 1, 'url') -> 'cameras[1].url'; a key that is not a bare TOML key is quoted
    as TOML quotes it ('a"b\n' -> "a\"b\n"), so a message stays one line per problem."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        key = str(part) if _BARE_KEY.fullmatch(str(part)) else json.dumps(str(part))
        out += f".{key}" if out else key
    return out or "(top level)"


_TOML_TYPES = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "a table",
}

_EXPECTED = {
    "string_type": "expected a string",
    "int_type": "expected an integer",
    "float_type": "expected a number",
    "bool_type": "expected true or false",
    "list_type": "expected an array",
    "dict_type": "expected a table",
    "model_type": "expected a table",
    "model_attributes_type": "expected a table",
    "int_from_float": "expected an integer",
    "finite_number": "expected a finite number",
}


def explain(exc: ValidationError, prefix: Sequence[str | int] = ()) -> list[str]:
    """pydantic errors as `key.path: expected ... (got ...)` lines, one per problem."""
    lines = []
    for err in exc.errors(include_url=False):
        loc = [*prefix, *(p for p in err["loc"] if not _is_union_tag(p))]
        kind, ctx = err["type"], err.get("ctx") or {}
        if kind == "missing":
            lines.append(f"{key_path(loc)}: required key is missing")
            continue
        if kind == "extra_forbidden":
            lines.append(f"{key_path(loc)}: unknown key")
            continue
        if kind in _EXPECTED:
            what = _EXPECTED[kind]
        elif kind == "literal_error":
            what = f"expected one of {ctx.get('expected')}"
        elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
            op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<",
                  "less_than_equal": "<="}[kind]  # fmt: skip
            bound = next(iter(ctx.values()))
            what = f"expected a value {op} {bound}"
        elif kind == "string_pattern_mismatch":
            what = _pattern_text(loc, ctx.get("pattern", ""))
        elif kind == "string_too_short":
            what = "expected a non-empty string"
        elif kind == "too_short":
            what = f"expected at least {ctx.get('min_length')} item(s)"
        elif kind == "value_error":
            what = str(ctx.get("error", err["msg"]))
        else:
            what = err["msg"]
        lines.append(f"{key_path(loc)}: {what}{_got(err.get('input'))}")
    # A value of the wrong type can fail several union branches; say each thing once.
    return list(dict.fromkeys(lines))


def _is_union_tag(part: str | int) -> bool:
    # pydantic names the branch of an Optional/Literal union it tried ("float", "literal[...]").
    return isinstance(part, str) and (
        part in ("float", "int", "str", "bool", "none") or part.startswith(("literal[", "list["))
    )


def _pattern_text(loc: Sequence[str | int], pattern: str) -> str:
    if pattern == NAME_PATTERN:
        return "expected a name of letters, digits, '_' and '-'"
    if loc and loc[-1] == "prometheus":
        return "expected HOST:PORT (e.g. 127.0.0.1:9108)"
    return f"expected a string matching {pattern}"


def _got(value: object) -> str:
    if isinstance(value, dict):
        return ""
    for py, name in _TOML_TYPES.items():
        if type(value) is py:
            shown = repr(value)
            if len(shown) > 60:
                shown = shown[:57] + "..."
            return f" (got {name}: {shown})"
    return ""
