"""Reads tensors out of a torch zip checkpoint (`torch.save`) into numpy without torch and
without running pickled code: the unpickler rebuilds only dicts, lists, scalars and tensors
(torch/_utils.py `_rebuild_tensor_v2` over typed storages) and refuses every other global.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import NpucamError

STORAGE_DTYPES: dict[str, np.dtype] = {
    "DoubleStorage": np.dtype("<f8"),
    "FloatStorage": np.dtype("<f4"),
    "HalfStorage": np.dtype("<f2"),
    "LongStorage": np.dtype("<i8"),
    "IntStorage": np.dtype("<i4"),
    "ShortStorage": np.dtype("<i2"),
    "CharStorage": np.dtype("i1"),
    "ByteStorage": np.dtype("u1"),
    "BoolStorage": np.dtype("?"),
}


class TorchZipError(NpucamError):
    """A checkpoint this reader cannot or will not read; names the file and what it holds."""


class _Storage:
    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype


def _rebuild_tensor_v2(
    storage: np.ndarray,
    storage_offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    requires_grad: bool = False,
    backward_hooks: Any = None,
    metadata: Any = None,
) -> np.ndarray:
    if not size:
        return storage[storage_offset].copy()
    item = storage.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(
        storage[storage_offset:],
        shape=tuple(size),
        strides=tuple(s * item for s in stride),
        writeable=False,
    )
    return np.array(view)


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str, name: str) -> None:
        super().__init__(io.BytesIO(data))
        self._archive = archive
        self._prefix = prefix
        self._name = name
        self._storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor_v2
        if module == "torch" and name in STORAGE_DTYPES:
            return _Storage(STORAGE_DTYPES[name])
        if module == "collections" and name == "OrderedDict":
            return OrderedDict
        raise TorchZipError(f"{self._name}: refusing pickled global {module}.{name}")

    def persistent_load(self, pid: Any) -> np.ndarray:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise TorchZipError(f"{self._name}: unknown persistent id {pid!r}")
        _, storage_type, key, _location, numel = pid
        if not isinstance(storage_type, _Storage):
            raise TorchZipError(f"{self._name}: storage {key} has no known dtype")
        if key not in self._storages:
            raw = self._archive.read(f"{self._prefix}data/{key}")
            array = np.frombuffer(raw, dtype=storage_type.dtype)
            if array.size != numel:
                raise TorchZipError(
                    f"{self._name}: storage {key} holds {array.size} items, pickle says {numel}"
                )
            self._storages[key] = array
        return self._storages[key]


def load_torch_zip(source: Path | bytes, name: str | None = None) -> Any:
    """The object a `torch.save` zip file holds, its tensors as numpy arrays (little-endian
    files only). source: the file, or its bytes (name then labels errors)."""
    label = name or str(source if isinstance(source, Path) else "<bytes>")
    handle = source if isinstance(source, Path) else io.BytesIO(source)
    try:
        archive = zipfile.ZipFile(handle)
    except zipfile.BadZipFile as exc:
        raise TorchZipError(f"{label}: not a torch zip checkpoint ({exc})") from exc
    with archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise TorchZipError(f"{label}: expected one */data.pkl, found {len(pickles)}")
        prefix = pickles[0][: -len("data.pkl")]
        order = f"{prefix}byteorder"
        if order in archive.namelist() and archive.read(order).strip() != b"little":
            raise TorchZipError(f"{label}: big-endian checkpoints are not supported")
        return _RestrictedUnpickler(archive.read(pickles[0]), archive, prefix, label).load()
