"""A bundle kernel as a device loads it: its spec from a manifest record (context, instruction
stream, fields), instruction patches, and its per-key dispatch timing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from npu.device.errors import DeviceError


def context_key(xclbin: Path | str, kernel_name: str) -> str:
    """The sharing key of a hardware context: xclbin path + "\\n" + kernel name."""
    return f"{xclbin}\n{kernel_name}"


@dataclass(frozen=True)
class KernelSpec:
    """What a device needs to load one bundle kernel.

    kind: the kernel family the simulator executes ("gemm", "mha", ...): the record's
    `kind=` field if present, else its tag. xclbin/kernel_name name the hardware context;
    insts is the raw little-endian u32 instruction stream; fields are the record's `k=v`
    fields (the simulator reads shapes from them); source names the manifest line.
    """

    key: str
    kind: str
    xclbin: Path
    kernel_name: str
    insts: bytes
    fields: Mapping[str, str] = field(default_factory=dict)
    source: str = ""
    owner: str = ""

    @property
    def context_key(self) -> str:
        return context_key(self.xclbin, self.kernel_name)

    def where(self) -> str:
        return self.source or f"kernel {self.key}"

    def get_int(self, name: str, default: int | None = None) -> int:
        """The record field `name` as an unsigned int; DeviceError names the record if bad."""
        raw = self.fields.get(name)
        if raw is None:
            if default is None:
                raise DeviceError(f"{self.where()}: `{name}=` missing")
            return default
        if not re.fullmatch(r"\+?[0-9]+", raw):
            raise DeviceError(f"{self.where()}: `{name}={raw}` is malformed")
        return int(raw)

    def get_flag(self, name: str, default: bool = False) -> bool:
        raw = self.fields.get(name)
        if raw is None:
            return default
        if raw not in ("0", "1"):
            raise DeviceError(f"{self.where()}: `{name}={raw}` is not 0 or 1")
        return raw == "1"

    def get_str(self, name: str, default: str | None = None) -> str:
        raw = self.fields.get(name, default)
        if raw is None:
            raise DeviceError(f"{self.where()}: `{name}=` missing")
        return raw


def kernel_key(record: Any) -> str:
    """A kernel record's key: its first field unless that is a `k=v` field, else its tag."""
    if record.fields and "=" not in record.fields[0]:
        return record.fields[0]
    return record.tag


def kernel_spec(bundle: Any, record: Any, owner: str = "") -> KernelSpec:
    """The KernelSpec of a manifest record (npu.bundle.Record) of `bundle` (npu.bundle.Bundle).

    The context comes from `ctx=<xclbin key>` (an `xclbin` record) or from `xclbin=<path>`
    with `name=<kernel>` (default MLIR_AIE); the instruction stream from `insts=<path>`.
    Paths stay inside the bundle directory (the bundle refuses escapes with a BundleError).
    """
    where = f"manifest.txt:{record.line}"
    key = kernel_key(record)
    if record.has("ctx"):
        xclbin_rec = bundle.xclbin(record.value("ctx"))
        xclbin, kernel_name = xclbin_rec.path, xclbin_rec.kernel
    elif record.has("xclbin"):
        xclbin = record.path("xclbin")
        kernel_name = record.value("name") if record.has("name") else "MLIR_AIE"
    else:
        raise record.error(f"kernel record {key} has neither `ctx=` nor `xclbin=`")
    insts_path = record.path("insts")
    try:
        insts = insts_path.read_bytes()
    except OSError as exc:
        raise DeviceError(f"{insts_path}: {exc.strerror or exc}") from None
    if len(insts) % 4 or not insts:
        raise DeviceError(f"{insts_path}: not whole u32 words ({len(insts)} bytes)")
    return KernelSpec(
        key=key,
        kind=record.kv.get("kind", record.tag),
        xclbin=xclbin,
        kernel_name=kernel_name,
        insts=insts,
        fields=dict(record.kv),
        source=where,
        owner=owner,
    )


def check_insts_words(nbytes: int, words: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Validate instruction-word patches: `(i+1)*4 <= bytes`, values fit u32."""
    out = []
    for i, v in words:
        if i < 0 or (i + 1) * 4 > nbytes:
            raise DeviceError(f"instruction word {i} is past the stream")
        if not 0 <= v < 2**32:
            raise DeviceError(f"instruction word {i}: value {v} does not fit 32 bits")
        out.append((int(i), int(v)))
    return out


EWMA_ALPHA = 0.25


@dataclass
class KernelTiming:
    """Per-kernel-key dispatch counters (host wall time); kernels loaded twice share them.

    expected_s: the measured time of one dispatch, an EWMA (EWMA_ALPHA) of `samples`
    completions, each from when the device could start it (its start, or the completion of
    the dispatch before it) to when its wait saw it done. A completion already done at the
    wait's first poll only bounds the time from above, so it is taken only when it lowers
    the estimate (a late wake-up must not teach a longer time, which would pace the next
    wait later still)."""

    runs: int = 0
    run_s: float = 0.0
    wait_s: float = 0.0
    expected_s: float | None = None
    samples: int = 0

    def learn(self, seconds: float, exact: bool) -> None:
        if self.expected_s is None:
            self.expected_s = seconds
        elif exact or seconds < self.expected_s:
            self.expected_s += EWMA_ALPHA * (seconds - self.expected_s)
        else:
            return
        self.samples += 1


class Kernel(Protocol):
    """A loaded kernel: its spec, and patches that survive context reloads."""

    spec: KernelSpec

    def set_insts_words(self, words: Iterable[tuple[int, int]]) -> None:
        """Overwrite 32-bit instruction words [(index, value)]; they last for later runs."""
        ...


def check_insts_stream(spec: KernelSpec) -> None:
    """A device loads only a non-empty stream of whole u32 words; DeviceError names the spec."""
    if len(spec.insts) % 4 or not spec.insts:
        raise DeviceError(f"{spec.where()}: the instruction stream is not whole u32 words")


def patched_insts(insts: bytes, patches: Mapping[int, int]) -> np.ndarray:
    """The instruction stream as uint32 words with the patches {index: value} applied."""
    words = np.frombuffer(insts, np.uint32).copy()
    for i, v in patches.items():
        words[i] = v
    return words
