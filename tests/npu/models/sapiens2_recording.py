"""A Sapiens2 bundle at the real 0.4b widths (zero weights, for a recording fake pyxrt that
computes nothing) and the device events of its layers as the fake records them.

Not a conftest.py: a conftest here would make pytest resolve `npu` to tests/npu.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FAKE = Path(__file__).parents[1] / "fake_pyxrt.py"


def fake_pyxrt():
    """A fresh copy of tests/npu/fake_pyxrt.py as a module."""
    spec = importlib.util.spec_from_file_location("fake_pyxrt", FAKE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def real_width_config():
    """0.4b's backbone at its real widths and tokens (D 1024, 16 x 64 heads, I 4096, 8
    registers, 1024 x 768 -> 3081 tokens), 2 layers (kv 16: qkv3072; kv 8: qkv2048), and a
    token head (up 16, convs 16, K 16) that the layer table does not involve."""
    from npu.models.sapiens2.config import Config

    return Config(
        D=1024, I=4096, layers=2, heads=16, hd=64, kv_heads=(16, 8), regs=8, patch=16,
        H=1024, W=768, eps=1e-6, in_eps=1e-5, up=(16,), convs=(16,), K=16,
        flip_pairs=((1, 2),),
    )  # fmt: skip


def write_real_width_bundle(path: Path, monkeypatch) -> Path:
    """A bias-free zero-weight bundle of real_width_config(); B tensors are K·N/8·9 zero
    bytes (bfp16ebs8 of zeros is all zero bytes, so packing is skipped)."""
    import npu.sim_kernels
    from npu.bf16 import bfp16_packed_size
    from npu.models.sapiens2.export import write_sim_bundle
    from npu.models.sapiens2.model import KeyedOps, Sapiens2Pose, gemm_shapes, rope_tables
    from npu.ops import GemmWeights, NumpyOps

    cfg = real_width_config()
    gemms = {}
    for key, (k, n) in gemm_shapes(cfg).items():
        swiglu = key.endswith(".gu")
        gemms[key] = GemmWeights(np.zeros((k, 2 * n if swiglu else n), np.float32), None,
                                 "swiglu" if swiglu else "none")  # fmt: skip
    cos, sin = rope_tables(cfg)
    host = {"prefix": np.zeros(cfg.prefix * cfg.D, np.float32), "rope.cos": cos, "rope.sin": sin}
    for i in range(cfg.layers):
        host[f"{i}.q_norm"] = host[f"{i}.k_norm"] = np.ones(cfg.hd, np.float32)
    model = Sapiens2Pose(cfg, KeyedOps(NumpyOps(gemms), cfg), host, weights=gemms)
    monkeypatch.setattr(
        npu.sim_kernels, "pack_gemm_b",
        lambda w, bias, *tiles: np.zeros(bfp16_packed_size(*w.shape), np.uint8),
    )  # fmt: skip
    return write_sim_bundle(model, path)


@dataclass(frozen=True)
class Event:
    """One device event of a forward: a dispatch argument or a host sync.

    step: the record key of a dispatch, or "sync to device" / "sync from device"; arg: the
    argument (A, B, C; q, k, v, o) or "" for a sync; buffer: the root it is a view of (a flat
    buffer's or a weight tensor's name); offset / nbytes: of the view within that root.
    """

    layer: int
    step: str
    arg: str
    buffer: str
    offset: int
    nbytes: int


ARGS = {"gemm": ("A", "B", "C"), "mha": ("q", "k", "v", "o")}


def layer_events(fake, replay, start: int, layers: int) -> list[Event]:  # noqa: C901
    """The events from fake.calls[start:] of the first `layers` layers of a forward, in
    order: the dispatches qkv<w>, mha, o, gu, down with their arguments, and the host syncs
    (a sync to the device belongs to the next dispatch's layer, one from it to the last's)."""
    names = {f.root.bo.id: n for n, f in replay.flats.items()}
    names.update({b.bo.id: n for n, b in replay.weights.items()})
    run_kernel = {run.id: key for key, k in replay.kernels.items() for run in k.runs.values()}
    subs, run_args = {}, {}
    for c in fake.calls:
        if c[0] == "bo.sub":
            subs[c[4]] = (c[1], c[2], c[3])
        elif c[0] == "set_arg" and c[3] == "bo" and c[2] >= 3:
            run_args.setdefault(c[1], {})[c[2] - 3] = c[4]

    def where(bo: int) -> tuple[str, int, int]:
        if bo in subs:
            parent, size, offset = subs[bo]
            return names[parent], offset, size
        return names[bo], 0, replay.weights[names[bo]].nbytes

    events: list[Event] = []
    pending: list[tuple[str, int]] = []  # syncs to the device, waiting for their dispatch
    dispatch, layer = 0, -1
    for c in fake.calls[start:]:
        if c[0] == "start":
            key = run_kernel[c[1]]
            if key == "patch":
                pending = []  # the patch GEMM's A
                continue
            dispatch += 1
            layer = (dispatch - 1) // 5
            if layer >= layers:
                break
            for step, bo in pending:
                events.append(Event(layer, step, "", *where(bo)))
            pending = []
            kind = "mha" if key == "mha" else "gemm"
            for i, bo in sorted(run_args[c[1]].items()):
                events.append(Event(layer, key, ARGS[kind][i], *where(bo)))
        elif c[0] == "sync" and (c[1] in subs or c[1] in names):
            if where(c[1])[0] in replay.weights:
                continue
            if c[2].endswith("TO_DEVICE"):
                pending.append(("sync to device", c[1]))
            elif layer >= 0:
                events.append(Event(layer, "sync from device", "", *where(c[1])))
    return events


def real_config(model: str, layers: int | None = None):
    """Sapiens2 0.4b or 1b at its real widths, tokens and head (0.4b: D 1024, 16 x 64 heads,
    I 4096, up (1024, 768); 1b: D 1536, 24 heads, I 6144, up (1536, 1024); both convs (768,
    512, 256), 1024 x 768 -> 3081 tokens, 308 x 256 x 192 heatmaps), 24 / 40 layers unless
    `layers` says fewer. KV heads: full attention in the first and last third of the layers,
    heads / 2 in the middle third (0.4b: layers 8-15 with 8, docs/bundles.md)."""
    from npu.models.sapiens2.config import Config

    d, full, heads, inter, up = {
        "0.4b": (1024, 24, 16, 4096, (1024, 768)),
        "1b": (1536, 40, 24, 6144, (1536, 1024)),
    }[model]
    n = full if layers is None else layers
    kv = tuple(heads // 2 if n // 3 <= i < 2 * n // 3 else heads for i in range(n))
    return Config(D=d, I=inter, layers=n, heads=heads, hd=64, kv_heads=kv, regs=8, patch=16,
                  H=1024, W=768, eps=1e-6, in_eps=1e-5, up=up, convs=(768, 512, 256), K=308,
                  flip_pairs=((1, 2),))  # fmt: skip


def write_random_bundle(cfg, path: Path, host_bias: bool = False, per_record: bool = False):
    """A format-2 bundle of taconite-sapiens2's records (npu.models.sapiens2.export's layout)
    for a device that computes nothing (the fake pyxrt): random weight bytes of the packed
    sizes, random host tensors (and `{i}.down.bias` with host_bias), arbitrary instruction
    words. Contexts: one per K, as the sim writer's; per_record: one per record, named
    `<key>.xclbin`, so that the fake pyxrt can give each kernel its own dispatch time.
    Written to `path`.partial, then renamed."""
    from npu.bf16 import bfp16_packed_size
    from npu.bundle_writer import BundleWriter
    from npu.models.sapiens2.export import record_layout
    from npu.models.sapiens2.model import rope_tables
    from npu.models.sapiens2.npu import gemm_keys, qkv_width
    from npu.sim_bundle import write_xclbin

    rng = np.random.default_rng(0)
    layout = record_layout(cfg)
    tmp = path.with_name(path.name + ".partial")
    with BundleWriter(tmp, 2) as bw:
        for name in ("D", "I", "layers", "heads", "hd", "regs", "patch", "H", "W", "eps",
                     "in_eps", "K", "box_pad", "blur"):  # fmt: skip
            bw.param(name, getattr(cfg, name))
        for name in ("kv_heads", "up", "convs", "mean", "std"):
            bw.param(name, ",".join(map(str, getattr(cfg, name))))
        bw.param("flip_pairs", ",".join(f"{a}:{b}" for a, b in cfg.flip_pairs) or "0:0")
        keys = gemm_keys(cfg)
        ctx = {k: k if per_record else f"gemm_k{layout[k]['K']}" for k in keys}
        for name in sorted(set(ctx.values())) + ["mha"]:
            write_xclbin(bw, name)
        bw.file("kernels/any.bin", np.arange(16, dtype=np.uint32).tobytes())  # never run
        for key in keys:
            bw.record("gemm", key, **layout[key], ctx=ctx[key], insts="kernels/any.bin")
        t, d = cfg.tokens, cfg.D
        bw.record("mha", q_elems=t * 3 * d, k_elems=t * 3 * d, v_elems=t * 3 * d,
                  o_elems=t * d, ctx="mha", insts="kernels/any.bin")  # fmt: skip

        def weight(name: str, key: str) -> None:
            f = layout[key]
            cols = 2 * f["N"] if key == "gu" else f["N"]
            bw.tensor(name, rng.integers(0, 256, bfp16_packed_size(f["K"], cols), np.uint8), "u8")

        weight("patch", "patch")
        for i in range(cfg.layers):
            weight(f"{i}.qkv", f"qkv{qkv_width(cfg, i)}")
            for n in ("o", "gu", "down"):
                weight(f"{i}.{n}", n)
        for j in range(len(cfg.up)):
            weight(f"d{j}", f"d{j}")
        for j in range(len(cfg.convs)):
            weight(f"c{j}", f"c{j}")
        weight("pred", "pred")
        cos, sin = rope_tables(cfg)
        bw.tensor("prefix", rng.normal(size=cfg.prefix * d).astype(np.float32), "f32")
        bw.tensor("rope.cos", cos.reshape(-1), "f32")
        bw.tensor("rope.sin", sin.reshape(-1), "f32")
        for i in range(cfg.layers):
            for n in ("q_norm", "k_norm"):
                bw.tensor(f"{i}.{n}", (1 + 0.1 * rng.normal(size=cfg.hd)).astype(np.float32))
            if host_bias:
                bw.tensor(f"{i}.down.bias", (0.01 * rng.normal(size=d)).astype(np.float32))
    tmp.rename(path)
    return path
