"""Writes bundles in the format npu.bundle reads (docs/bundles.md): for tests, the simulator
and tools.

Tensors are streamed into tensors.bin at 64-byte aligned offsets with zero padding between
them (the alignment taconite-bundle documents for IRON's writer); manifest.txt and tensors.txt
are written on close(), in the order the calls were made. Every value is checked to read back
as written: a token may not contain whitespace, a tag may not start with `#`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import IO, Any

import ml_dtypes
import numpy as np

from npu.bf16 import f32_to_bf16
from npu.bundle import (
    DTYPE_NUMPY,
    MANIFEST,
    RUST_WHITESPACE,
    TENSORS_BIN,
    TENSORS_TXT,
    BundleError,
    confine,
)

ALIGN = 64
_HAS_WS = re.compile(f"[{RUST_WHITESPACE}]")
_NUMPY_TO_DTYPE = {
    np.dtype(np.float32): "f32",
    np.dtype(ml_dtypes.bfloat16): "bf16",
    np.dtype(np.uint8): "u8",
    np.dtype(np.int32): "i32",
}


def _token(kind: str, text: str) -> str:
    if not text or _HAS_WS.search(text):
        raise BundleError(f"bundle writer: {kind} {text!r} is empty or contains whitespace")
    return text


def format_value(value: Any) -> str:
    """A field or param value as text: ints and floats round-trip through Rust's parsers
    (repr of a float, e.g. 1e-05), bools are 0/1, lists and tuples are comma-separated."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        return repr(float(value))
    if isinstance(value, list | tuple):
        return ",".join(format_value(v) for v in value)
    return str(value)


class BundleWriter:
    """Builds one bundle directory; use as a context manager or call close().

    The directory is created; an existing manifest.txt in it is refused (bundles are written to
    new directories, never rewritten in place).
    """

    def __init__(self, path: str | os.PathLike[str], version: int) -> None:
        self.root = Path(path)
        self.root.mkdir(parents=True, exist_ok=True)
        if (self.root / MANIFEST).exists():
            raise BundleError(f"{self.root}: already holds a bundle; write a new directory")
        self._lines: list[str] = [f"version {int(version)}"]
        self._tensor_lines: list[str] = []
        self._names: set[str] = set()
        self._bin: IO[bytes] | None = (self.root / TENSORS_BIN).open("wb")
        self._offset = 0

    # -- manifest ------------------------------------------------------------------

    def comment(self, text: str) -> None:
        """A `# text` line (the reader skips it)."""
        if "\n" in text or "\r" in text:
            raise BundleError(f"bundle writer: comment {text!r} spans lines")
        self._lines.append(f"# {text}")

    def param(self, name: str, value: Any) -> None:
        """`param <name> <value>`; the value may contain inner spaces (read back by rest(1))."""
        text = format_value(value)
        if not text or "\n" in text or "\r" in text or _HAS_WS.match(text):
            raise BundleError(f"bundle writer: param {name} value {text!r} would not read back")
        self._lines.append(f"param {_token('param name', name)} {text}")

    def xclbin(
        self, key: str, rel: str, kernel: str = "MLIR_AIE", data: bytes | None = None
    ) -> None:
        """`xclbin <key> <rel> <kernel>`: a hardware context; with `data`, also writes the file."""
        if data is not None:
            self.file(rel, data)
        self._lines.append(
            f"xclbin {_token('xclbin key', key)} {_token('path', rel)} {_token('kernel', kernel)}"
        )

    def record(self, tag: str, *fields: Any, tail: str | None = None, **kv: Any) -> None:
        """`<tag> <fields...> <k=v...> [tail]`: a model record. `tail` is free text (spaces
        allowed), read back by Record.rest(len(fields) + len(kv))."""
        if _token("tag", tag).startswith("#") or tag in ("version", "param", "xclbin"):
            raise BundleError(f"bundle writer: {tag!r} is not a model record tag")
        parts = [tag]
        parts += [_token("field", format_value(f)) for f in fields]
        parts += [f"{_token('key', k)}={_token('value', format_value(v))}" for k, v in kv.items()]
        if tail is not None:
            if "\n" in tail or "\r" in tail or _HAS_WS.match(tail):
                raise BundleError(f"bundle writer: tail {tail!r} would not read back")
            parts.append(tail)
        self._lines.append(" ".join(parts))

    def file(self, rel: str, data: bytes) -> Path:
        """Write a file the manifest names (an xclbin, insts, a tokenizer...), inside the bundle."""
        try:
            target = confine(self.root, rel)
        except ValueError as exc:
            raise BundleError(f"{self.root}: {exc}") from None
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return target

    # -- tensors -------------------------------------------------------------------

    def tensor(
        self,
        name: str,
        array: np.ndarray | bytes,
        dtype: str | None = None,
        shape: tuple[int, ...] | None = None,
    ) -> int:
        """Append a tensor at the next 64-byte aligned offset; returns the offset.

        dtype: "f32" | "bf16" | "u8" | "i32"; inferred from float32 / ml_dtypes.bfloat16 /
        uint8 / int32 arrays. A float array written as "bf16" is rounded with f32_to_bf16; a
        uint16 array written as "bf16" is taken as bit patterns. shape defaults to the array's
        (a scalar is written as 1); bytes are written as u8.
        """
        if self._bin is None:
            raise BundleError("bundle writer: already closed")
        _token("tensor name", name)
        if name in self._names:
            raise BundleError(f"bundle writer: tensor {name} written twice")
        a = np.frombuffer(array, np.uint8) if isinstance(array, bytes | bytearray) else array
        a = np.asarray(a)
        if dtype is None:
            if a.dtype not in _NUMPY_TO_DTYPE:
                raise BundleError(f"bundle writer: tensor {name} has dtype {a.dtype}; name one")
            dtype = _NUMPY_TO_DTYPE[a.dtype]
        if dtype not in DTYPE_NUMPY:
            raise BundleError(f"bundle writer: unknown dtype {dtype}")
        if dtype == "bf16" and a.dtype != np.uint16:
            data = f32_to_bf16(a.astype(np.float32))
        elif dtype == "bf16" or a.dtype == DTYPE_NUMPY[dtype]:
            data = a
        else:
            data = a.astype(DTYPE_NUMPY[dtype])
        data = np.ascontiguousarray(data, dtype=DTYPE_NUMPY[dtype])
        shape = tuple(a.shape) if shape is None else tuple(shape)
        if not shape:
            shape = (1,)
        pad = -self._offset % ALIGN
        self._bin.write(b"\0" * pad)
        self._offset += pad
        offset = self._offset
        self._bin.write(data.reshape(-1).view(np.uint8))
        self._offset += data.nbytes
        self._names.add(name)
        dims = ",".join(str(int(d)) for d in shape)
        self._tensor_lines.append(f"{name} {dtype} {dims} {offset} {data.nbytes}")
        return offset

    # -- finish --------------------------------------------------------------------

    def close(self) -> Path:
        """Finish tensors.bin and write tensors.txt and manifest.txt; returns the directory."""
        if self._bin is None:
            return self.root
        self._bin.close()
        self._bin = None
        (self.root / TENSORS_TXT).write_text("".join(f"{t}\n" for t in self._tensor_lines))
        (self.root / MANIFEST).write_text("".join(f"{line}\n" for line in self._lines))
        return self.root

    def __enter__(self) -> BundleWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
