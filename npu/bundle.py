"""Reads the IRON bundles the NPU runtimes replay: manifest.txt, tensors.txt, tensors.bin.

Follows Brishen/taconite taconite-bundle/src/lib.rs (Manifest, Record, Store) line for line in
grammar and error text (docs/bundles.md), with three additions: integers
are parsed as Rust parses them (`^\\+?[0-9]+$`, not Python's int()), a path a manifest names
may be neither absolute nor climb out with `..` (symlinked files are fine), and tensors.bin is
mapped with np.memmap so opening a multi-GB bundle reads only its two text files.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from npu.bf16 import bf16_to_f32
from pipeline.errors import NpucamError

MANIFEST = "manifest.txt"
TENSORS_TXT = "tensors.txt"
TENSORS_BIN = "tensors.bin"

U32_MAX = 2**32 - 1
USIZE_MAX = 2**64 - 1  # Rust's usize on the 64-bit hosts the runtimes target


class BundleError(NpucamError):
    """A bundle is missing, unreadable or malformed; the message names the file and line."""


# Rust's char::is_whitespace (Unicode White_Space). Python's str.split() also splits on
# U+001C..U+001F, which Rust keeps inside a token.
RUST_WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_TOKEN = re.compile(f"[^{RUST_WHITESPACE}]+")
_LEADING_WS = re.compile(f"^[{RUST_WHITESPACE}]+")
_FIRST_WS = re.compile(f"[{RUST_WHITESPACE}]")
_UINT = re.compile(r"\+?[0-9]+")
# Rust's f32/f64 FromStr: decimal or exponent notation, inf / infinity / nan in any case.
_FLOAT = re.compile(
    r"[+-]?(?:inf|infinity|nan|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)", re.I
)


def rust_lines(text: str) -> list[str]:
    """text split as Rust's str::lines: at "\\n", dropping one "\\r" right before it; a final
    line without "\\n" keeps a trailing "\\r", and a trailing "\\n" adds no empty line."""
    pieces = text.split("\n")
    last = pieces.pop()
    lines = [p[:-1] if p.endswith("\r") else p for p in pieces]
    if last:
        lines.append(last)
    return lines


def tokens(text: str) -> list[str]:
    """Whitespace-separated tokens, as Rust's str::split_whitespace."""
    # Printable ASCII has one whitespace character, the space, in both languages.
    if text.isascii() and text.isprintable():
        return text.split()
    return _TOKEN.findall(text)


def parse_uint(text: str, limit: int = USIZE_MAX) -> int | None:
    """An unsigned integer as Rust's FromStr reads it (optional '+', digits only), or None."""
    if text.isascii() and text.isdigit() and len(text) < 10:
        value = int(text)  # the common case: plain digits, below every limit used here
        return value if value <= limit else None
    if not _UINT.fullmatch(text):
        return None
    digits = text.lstrip("+").lstrip("0") or "0"
    # Checked before int(): Python refuses to convert strings of more than 4300 digits.
    if len(digits) > len(str(limit)):
        return None
    value = int(digits)
    return value if value <= limit else None


def parse_float(text: str) -> float | None:
    """A float as Rust's f64 FromStr reads it, or None (Python's float() also takes '1_0' and
    surrounding spaces)."""
    return float(text) if _FLOAT.fullmatch(text) else None


def _parse_as(text: str, kind: type) -> Any:
    """text as `kind` (str, int: unsigned 64-bit, float), or None when malformed."""
    if kind is str:
        return text
    if kind is int:
        return parse_uint(text)
    if kind is float:
        return parse_float(text)
    raise TypeError(f"bundle fields are read as str, int or float, not {kind!r}")


def confine(root: Path, rel: str) -> Path:
    """root / rel, refused (ValueError with the reason) when the manifest text would leave
    the bundle: an absolute path or any `..` component (npucam's policy; taconite-bundle
    joins any path). The check is on the text only: symlinks are followed when the file is
    opened, so a bundle whose files link elsewhere (a Hugging Face cache snapshot links
    every file into ../../blobs) loads. The target need not exist.
    """
    if not rel:
        raise ValueError("empty path")
    if "\x00" in rel:
        raise ValueError(f"path {rel!r} contains a NUL byte")
    if rel.startswith(("/", "\\")) or Path(rel).is_absolute():
        raise ValueError(f"path {rel} is absolute")
    if ".." in re.split(r"[/\\]", rel):
        raise ValueError(f"path {rel} climbs out with ..")
    return root / rel


@dataclass
class Record:
    """One manifest line: a tag, then whitespace-separated fields (k=v ones also by key)."""

    line: int  # 1-based line number in manifest.txt
    tag: str
    fields: list[str]
    text: str  # the line as written
    root: Path
    kv: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def parse(cls, line: int, text: str, root: Path) -> Record | None:
        """The record on a line, or None for a blank line or one whose first token is `#...`."""
        toks = tokens(text)
        if not toks or toks[0].startswith("#"):
            return None
        fields = toks[1:]
        kv = {}
        for f in fields:
            key, eq, value = f.partition("=")
            if eq:
                kv[key] = value
        return cls(line, toks[0], fields, text, root, kv)

    def error(self, msg: str) -> BundleError:
        """An error pointing at this line: `manifest.txt:<line>: <msg>, in: <text>`."""
        return BundleError(f"{MANIFEST}:{self.line}: {msg}, in: {self.text}")

    def field(self, i: int) -> str:
        """The i-th field after the tag (0-based)."""
        if i < len(self.fields):
            return self.fields[i]
        raise self.error(f"expected at least {i + 1} fields")

    def field_as(self, i: int, kind: type = int) -> Any:
        """The i-th field parsed as str / int (unsigned) / float."""
        text = self.field(i)
        value = _parse_as(text, kind)
        if value is None:
            raise self.error(f"field {i + 1} ({text}) is malformed")
        return value

    def rest(self, n: int) -> str:
        """The raw text after the tag and the first n fields, inner spacing intact, minus one
        leading space (a free-text tail such as a prompt)."""
        s = self.text
        for _ in range(n + 1):
            s = _LEADING_WS.sub("", s, count=1)
            m = _FIRST_WS.search(s)
            s = s[m.start() :] if m else ""
        return s[1:] if s.startswith(" ") else s

    def has(self, key: str) -> bool:
        return key in self.kv

    def value(self, key: str) -> str:
        """The text of field `key=` (Rust's Record::str)."""
        if key not in self.kv:
            raise self.error(f"`{key}=` missing")
        return self.kv[key]

    def get(self, key: str, kind: type = int, default: Any = None) -> Any:
        """Field `key=` parsed as str / int (unsigned) / float; `default` if absent and given."""
        if default is not None and key not in self.kv:
            return default
        text = self.value(key)
        value = _parse_as(text, kind)
        if value is None:
            raise self.error(f"`{key}={text}` is malformed")
        return value

    def get_list(self, key: str, kind: type = int) -> list[Any]:
        """A comma-separated field `key=a,b,...`, empty items dropped."""
        text = self.value(key)
        out = []
        for item in text.split(","):
            if item:
                value = _parse_as(item, kind)
                if value is None:
                    raise self.error(f"`{key}={text}` is malformed")
                out.append(value)
        return out

    def flag(self, key: str) -> bool:
        """A `key=0` / `key=1` field."""
        value = self.value(key)
        if value not in ("0", "1"):
            raise self.error(f"`{key}={value}` is not 0 or 1")
        return value == "1"

    def path(self, key: str) -> Path:
        """Field `key=` as a bundle path (refused if absolute or climbing out with `..`)."""
        return self.confined(self.value(key))

    def confined(self, rel: str) -> Path:
        """rel (a field of this record) as a path inside the bundle, refused if it escapes."""
        try:
            return confine(self.root, rel)
        except ValueError as exc:
            raise self.error(str(exc)) from None


@dataclass(frozen=True)
class Xclbin:
    """A hardware context: an xclbin file and the kernel name inside it."""

    key: str
    path: Path  # bundle root / the record's path (symlinks not resolved)
    kernel: str
    line: int


@dataclass(frozen=True)
class TensorEntry:
    """One tensors.txt line. shape is as recorded; elems always comes from nbytes / itemsize."""

    name: str
    dtype: str  # "f32" | "bf16" | "u8" | "i32"
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    line: int

    @property
    def itemsize(self) -> int:
        return DTYPE_SIZES[self.dtype]

    @property
    def elems(self) -> int:
        return self.nbytes // self.itemsize


DTYPE_SIZES = {"f32": 4, "bf16": 2, "u8": 1, "i32": 4}
# The numpy dtype a tensor's bytes are viewed as: bf16 stays its uint16 bit patterns.
DTYPE_NUMPY = {
    "f32": np.dtype("<f4"),
    "bf16": np.dtype("<u2"),
    "u8": np.dtype("u1"),
    "i32": np.dtype("<i4"),
}
# Rust's Debug spelling of the DType enum, used in lookup errors.
DTYPE_NAMES = {"f32": "F32", "bf16": "Bf16", "u8": "U8", "i32": "I32"}


def _io_error(path: Path, exc: OSError) -> BundleError:
    """`<path>: <os error>`, worded as Rust's io::Error displays it."""
    if exc.errno is not None and exc.strerror:
        return BundleError(f"{path}: {exc.strerror} (os error {exc.errno})")
    return BundleError(f"{path}: {exc}")


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _io_error(path, exc) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise BundleError(f"{path}: stream did not contain valid UTF-8") from None


class Manifest:
    """manifest.txt: the reserved version / param / xclbin records plus the model's records."""

    def __init__(self, root: Path, text: str, version: int | None, path: Path) -> None:
        self.root = root
        self.records: list[Record] = []
        self.params: dict[str, str] = {}
        self.xclbins: dict[str, Xclbin] = {}
        seen_version: int | None = None
        for i, line in enumerate(rust_lines(text)):
            r = Record.parse(i + 1, line, root)
            if r is None:
                continue
            if r.tag == "version":
                if seen_version is not None:
                    raise r.error("second version record")
                text0 = r.field(0)
                seen_version = parse_uint(text0, U32_MAX)
                if seen_version is None:
                    raise r.error(f"field 1 ({text0}) is malformed")
            elif r.tag == "param":
                name = r.field(0)
                r.field(1)
                if name in self.params:
                    raise r.error(f"param {name} defined twice")
                self.params[name] = r.rest(1)
            elif r.tag == "xclbin":
                key, rel, kernel = r.field(0), r.field(1), r.field(2)
                if key in self.xclbins:
                    raise r.error(f"xclbin {key} defined twice")
                self.xclbins[key] = Xclbin(key, r.confined(rel), kernel, r.line)
            else:
                self.records.append(r)
        if version is not None and seen_version != version:
            found = "no version record" if seen_version is None else f"version {seen_version}"
            raise BundleError(
                f"{path}: {found}, this runtime reads version {version}; re-export the bundle"
            )
        if seen_version is None:
            raise BundleError(f"{path}: no version record; re-export the bundle")
        self.version: int = seen_version

    def tagged(self, tag: str) -> Iterator[Record]:
        """The model records with this tag, in file order."""
        return (r for r in self.records if r.tag == tag)

    def has_param(self, name: str) -> bool:
        return name in self.params

    def param(self, name: str, kind: type = str) -> Any:
        """Param `name` as str (its raw rest-of-line value), int (unsigned) or float."""
        if name not in self.params:
            raise BundleError(f"param {name} missing from the manifest")
        text = self.params[name]
        value = _parse_as(text, kind)
        if value is None:
            raise BundleError(f"param {name} ({text}) is malformed")
        return value

    def param_list(self, name: str, kind: type = int) -> list[Any]:
        """A comma-separated param, empty items dropped (so "" is [] and "1,,2" is [1, 2])."""
        if name not in self.params:
            raise BundleError(f"param {name} missing from the manifest")
        out = []
        for item in self.params[name].split(","):
            if item:
                value = _parse_as(item, kind)
                if value is None:
                    raise BundleError(f"param {name}: bad list item {item}")
                out.append(value)
        return out

    def xclbin(self, key: str) -> Xclbin:
        """The hardware context a record's `ctx=` names."""
        if key not in self.xclbins:
            raise BundleError(f"xclbin {key} missing from the manifest")
        return self.xclbins[key]


def _tensor_line(i: int, line: str, entries: dict[str, TensorEntry]) -> TensorEntry:
    """Line i (0-based) of tensors.txt, checked in taconite-bundle's order."""

    def at(msg: str) -> BundleError:
        return BundleError(f"{TENSORS_TXT}:{i + 1}: {msg}, in: {line}")

    f = tokens(line)
    if len(f) != 5:
        raise at("expected <name> <dtype> <shape> <offset> <bytes>")
    name, dtype, dims, off, size = f
    if dtype not in DTYPE_SIZES:
        raise at("unknown dtype")
    shape = tuple(parse_uint(d) for d in dims.split(","))
    if None in shape:
        raise at("bad shape")
    offset = parse_uint(off)
    if offset is None:
        raise at("bad offset")
    nbytes = parse_uint(size)
    if nbytes is None:
        raise at("bad byte count")
    if offset % 8:
        raise at("offset is not 8-byte aligned")
    if nbytes % DTYPE_SIZES[dtype]:
        raise at("byte count is not a whole number of elements")
    if name in entries:
        raise at("tensor defined twice")
    return TensorEntry(name, dtype, shape, offset, nbytes, i + 1)  # type: ignore[arg-type]


def _parse_tensor_table(text: str) -> dict[str, TensorEntry]:
    entries: dict[str, TensorEntry] = {}
    for i, line in enumerate(rust_lines(text)):
        e = _tensor_line(i, line, entries)
        entries[e.name] = e
    return entries


class Bundle:
    """An opened bundle: its manifest and its tensors, mapped (not read) from tensors.bin.

    Open with Bundle.open(dir, version=N); N is the version the calling runtime reads (None
    accepts any version but still requires one version record).
    """

    def __init__(
        self, root: Path, manifest: Manifest, tensors: dict[str, TensorEntry], data: np.ndarray
    ) -> None:
        self.root = root
        self.manifest = manifest
        self.tensors = tensors
        self._data: np.ndarray | None = data

    @classmethod
    def open(cls, path: str | os.PathLike[str], version: int | None = None) -> Bundle:
        """Read manifest.txt and tensors.txt, map tensors.bin and check every tensor fits."""
        root = Path(path)
        manifest_path = root / MANIFEST
        try:
            old_layout = not manifest_path.exists() and (root / "plan.txt").exists()
            has_table = (root / TENSORS_TXT).exists()
        except OSError as exc:
            raise _io_error(root, exc) from None
        if old_layout:
            raise BundleError(
                f"{root}: plan.txt and no manifest.txt: this is the old plan.txt bundle layout;"
                " re-export the bundle"
            )
        text = _read_text(manifest_path)
        if text.startswith("gaic ") and not has_table:
            raise BundleError(
                f"{manifest_path}: a manifest starting with `gaic ` and no tensors.txt: this is"
                " the old GAIC bundle layout; re-export the bundle"
            )
        manifest = Manifest(root, text, version, manifest_path)
        tensors = _parse_tensor_table(_read_text(root / TENSORS_TXT))
        data = _map_blob(root / TENSORS_BIN)
        for e in tensors.values():
            if e.offset + e.nbytes > data.size:
                raise BundleError(f"tensor {e.name} runs past the end of tensors.bin")
        return cls(root, manifest, tensors, data)

    # -- manifest ------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self.manifest.version

    @property
    def records(self) -> list[Record]:
        """Every model record (not version / param / xclbin), in file order."""
        return self.manifest.records

    def tagged(self, tag: str) -> Iterator[Record]:
        return self.manifest.tagged(tag)

    def param(self, name: str, kind: type = str) -> Any:
        return self.manifest.param(name, kind)

    def param_list(self, name: str, kind: type = int) -> list[Any]:
        return self.manifest.param_list(name, kind)

    def has_param(self, name: str) -> bool:
        return self.manifest.has_param(name)

    def xclbin(self, key: str) -> Xclbin:
        return self.manifest.xclbin(key)

    def path(self, rel: str) -> Path:
        """A bundle-relative path, refused if absolute or climbing out with `..`."""
        try:
            return confine(self.root, rel)
        except ValueError as exc:
            raise BundleError(f"{self.root}: {exc}") from None

    # -- tensors -------------------------------------------------------------------

    def has(self, name: str) -> bool:
        return name in self.tensors

    def entry(self, name: str) -> TensorEntry:
        if name not in self.tensors:
            raise BundleError(f"tensor {name} missing from the bundle")
        return self.tensors[name]

    def expect(self, name: str, dtype: str, elems: int) -> TensorEntry:
        """name's entry, checked to be `dtype` ("f32", "bf16", "u8", "i32") with `elems` values."""
        e = self.entry(name)
        if e.dtype != dtype or e.elems != elems:
            raise BundleError(
                f"tensor {name} is {e.elems} x {DTYPE_NAMES[e.dtype]}, "
                f"wanted {elems} x {DTYPE_NAMES[dtype]}"
            )
        return e

    def view(self, name: str, dtype: str | None = None) -> np.ndarray:
        """A read-only 1-D view of the tensor's elements in tensors.bin (no copy).

        f32 -> float32, bf16 -> uint16 bit patterns, u8 -> uint8, i32 -> int32, all
        little-endian. With `dtype`, the tensor must have that dtype.
        """
        e = self.entry(name)
        if self._data is None:
            raise BundleError(f"{self.root}: bundle is closed")
        if dtype is not None and e.dtype != dtype:
            raise BundleError(
                f"tensor {name} is {DTYPE_NAMES[e.dtype]}, wanted {DTYPE_NAMES[dtype]}"
            )
        raw = self._data[e.offset : e.offset + e.nbytes]
        return raw.view(DTYPE_NUMPY[e.dtype])

    def array(self, name: str, dtype: str | None = None) -> np.ndarray:
        """The tensor as a view with its recorded shape, which must hold exactly its elements."""
        e = self.entry(name)
        flat = self.view(name, dtype)
        # Compared before reshaping, so an absurd recorded shape never reaches numpy.
        if math.prod(e.shape) != e.elems:
            raise BundleError(
                f"tensor {name} has shape {','.join(map(str, e.shape))} "
                f"({math.prod(e.shape)} elements) but holds {e.elems}"
            )
        return flat.reshape(e.shape)

    def f32(self, name: str) -> np.ndarray:
        """An f32 or bf16 tensor as a new float32 array of its recorded shape (a copy)."""
        e = self.entry(name)
        if e.dtype not in ("f32", "bf16"):
            raise BundleError(f"tensor {name} is {DTYPE_NAMES[e.dtype]}, wanted F32")
        a = self.array(name)
        if e.dtype == "bf16":
            return bf16_to_f32(a)
        return a.astype(np.float32, copy=True)

    @property
    def tensors_bytes(self) -> int:
        """Total bytes the tensor table points at."""
        return sum(e.nbytes for e in self.tensors.values())

    def close(self) -> None:
        """Drop the mapping; views handed out keep it alive until they go too."""
        self._data = None

    def __enter__(self) -> Bundle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _map_blob(path: Path) -> np.ndarray:
    """tensors.bin as a read-only uint8 np.memmap: pages are read when first touched."""
    try:
        if path.stat().st_size == 0:
            return np.empty(0, np.uint8)
        return np.memmap(path, mode="r", dtype=np.uint8)
    except OSError as exc:
        raise _io_error(path, exc) from None
