"""A Sapiens2-Pose bundle replayed on a device (sim or npu): its gemm and mha records bound to
the forward's op keys (docs/pose.md, docs/bundles.md)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from npu.models.sapiens2.config import Config, ModelError
from npu.models.sapiens2.model import Sapiens2Pose


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def gemm_record_keys(cfg: Config) -> dict[str, str]:
    """op key -> the gemm record (kernel) it runs on; one record per distinct shape."""
    keys = {"patch": "patch", "pred": "pred"}
    for i, kv in enumerate(cfg.kv_heads):
        keys[f"{i}.qkv"] = f"qkv{(cfg.heads + 2 * kv) * cfg.hd}"
        keys.update({f"{i}.{n}": n for n in ("o", "gu", "down")})
    keys.update({f"d{j}": f"d{j}" for j in range(len(cfg.up))})
    keys.update({f"c{j}": f"c{j}" for j in range(len(cfg.convs))})
    return keys


class _PaddedGemms:
    """The op interface over a bundle's padded GEMMs: A is zero-padded to the record's K and
    C cut to the model's N (the host side of the padding write_sim_bundle applies).

    strided: the deconv keys whose records read A at lda = 2C (docs/pose.md); the forward calls
    gemm_strided(key, deconv_pairs(x), rows) for them.
    """

    def __init__(
        self,
        ops: Any,
        valid_n: Mapping[str, int],
        k_pad: Mapping[str, int],
        strided: frozenset[str] = frozenset(),
    ) -> None:
        self.ops = ops
        self.backend = ops.backend
        self._n = dict(valid_n)
        self._k = dict(k_pad)
        self.strided = strided

    def gemm_strided(self, key: str, a: np.ndarray, rows: int) -> np.ndarray:
        c = self.ops.gemm_strided(key, a, rows)
        return c[:, : self._n[key]] if key in self._n else c

    def gemm(self, key: str, a: np.ndarray) -> np.ndarray:
        k = self._k.get(key, a.shape[1])
        if k > a.shape[1]:
            a = np.concatenate([a, np.zeros((len(a), k - a.shape[1]), np.float32)], axis=1)
        c = self.ops.gemm(key, a)
        return c[:, : self._n[key]] if key in self._n else c

    def mha(self, key: str, q, k, v, *, scale: float, causal: bool = False) -> np.ndarray:
        return self.ops.mha(key, q, k, v, scale=scale, causal=causal)


def gemm_shapes(cfg: Config) -> dict[str, tuple[int, int]]:
    """op key -> (K, N') the forward passes and expects (N' after a swiglu epilogue)."""
    d, hd = cfg.D, cfg.hd
    shapes = {"patch": (3 * cfg.patch**2, d)}
    for i, kv in enumerate(cfg.kv_heads):
        shapes[f"{i}.qkv"] = (d, (cfg.heads + 2 * kv) * hd)
        shapes[f"{i}.o"] = (d, d)
        shapes[f"{i}.gu"] = (d, cfg.I)
        shapes[f"{i}.down"] = (cfg.I, d)
    c = d
    for j, c_out in enumerate(cfg.up):
        shapes[f"d{j}"] = (4 * c, 4 * c_out)
        c = c_out
    for j, c_out in enumerate(cfg.convs):
        shapes[f"c{j}"] = (c, c_out)
        c = c_out
    shapes["pred"] = (c, cfg.K)
    return shapes


def from_bundle(path: str | Path, device: Any) -> Sapiens2Pose:
    """A bundle (format 1, or 2 with host biases) on a device: an npu.sim.SimDevice or
    npu.xrt.XrtDevice, or the backend name "sim" / "npu" to open one."""
    from npu.bundle import Bundle, BundleError
    from npu.device import kernel_spec, open_device
    from npu.ops import DeviceOps

    path = Path(path)
    bundle = Bundle.open(path)
    where = f"{path}/manifest.txt"
    if bundle.version not in (1, 2):
        raise BundleError(f"{where}: version {bundle.version}; Sapiens2 reads versions 1 and 2")
    cfg = Config.from_params(bundle.manifest.params, where=where)
    device = open_device(device)
    if device is None:
        raise ModelError(f"{path}: a bundle runs on a device (backend sim or npu), not cpu")
    records = {r.fields[0]: r for r in bundle.tagged("gemm") if r.fields}
    shapes = gemm_shapes(cfg)
    k_pad: dict[str, int] = {}
    strided: set[str] = set()
    for key, rec in gemm_record_keys(cfg).items():
        if rec not in records:
            raise BundleError(f"{where}: no gemm record {rec} (for {key})")
        spec = kernel_spec(bundle, records[rec])
        k, n = shapes[key]
        swiglu = spec.get_str("epilogue", "none") == "swiglu"
        kr, nr = spec.get_int("K"), spec.get_int("N") // (2 if swiglu else 1)
        if kr < k or nr < n:
            raise BundleError(f"{spec.where()}: gemm {rec} is K={kr} N'={nr}, {key} needs {k}x{n}")
        lda = spec.get_int("lda", kr)
        if lda != kr:
            if not key.startswith("d") or lda != k // 2:
                raise BundleError(
                    f"{spec.where()}: gemm {rec} has lda={lda}; only the deconvs read A "
                    f"strided, at lda = 2C = {k // 2}"
                )
            strided.add(key)
        k_pad[key] = kr
    host: dict[str, np.ndarray] = {}
    patches = cfg.gh * cfg.gw
    sizes = {
        "prefix": cfg.prefix * cfg.D,
        "rope.cos": patches * cfg.hd,
        "rope.sin": patches * cfg.hd,
    }
    for i in range(cfg.layers):
        sizes[f"{i}.q_norm"] = sizes[f"{i}.k_norm"] = cfg.hd
        if bundle.version == 2:
            sizes[f"{i}.down.bias"] = cfg.D
    if bundle.version == 2:
        sizes.update({f"d{j}.bias": 4 * c for j, c in enumerate(cfg.up)})
    for name, elems in sizes.items():
        bundle.expect(name, "f32", elems)
        host[name] = bundle.f32(name).reshape(-1)
    for key in shapes:
        bundle.entry(key)
    ops = DeviceOps.from_bundle(
        device,
        bundle,
        gemms={key: (rec, key) for key, rec in gemm_record_keys(cfg).items()},
        mhas={"mha": "mha"},
    )
    padded = _PaddedGemms(ops, {k: n for k, (_, n) in shapes.items()}, k_pad, frozenset(strided))
    return Sapiens2Pose(cfg, padded, host)
