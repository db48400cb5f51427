"""Fit npu.sim_cost's NPU2 constants to taconite's published NPU2 timings (docs/device.md §6)
and print them with the residuals of every published figure.

Each family's fixed cost per dispatch is taconite's single-dispatch median (232 us, an
eltwise multiply through XRT) except CLIP's GEMMs, whose per-chunk cost the least-squares
fit over their qkv / o / fc2 figures gives; every other constant is solved from one figure
(or two for AdaFace: a conv rate and a per-forward host span). The dispatch lists are the
released models' (npu.models.<model>.npu2). No device, no timing: pure arithmetic.

    .venv/bin/python bench/calibrate_npu2.py
"""

from __future__ import annotations

import numpy as np

from npu.models.adaface import npu2 as adaface
from npu.models.clip import npu2 as clip
from npu.models.sapiens2 import npu2 as sapiens2
from npu.sim_cost import NPU2, SINGLE_DISPATCH_S, Dispatch

PUBLISHED = {
    "sapiens2-0.4b gemms": 1.600,
    "sapiens2-0.4b mha": 0.800,
    "clip v_qkv": 0.12,
    "clip v_o": 0.10,
    "clip v_fc1": 0.27,
    "clip v_fc2": 0.12,
    "clip v_mha": 0.08,
    "clip v_addln": 0.07,
    "clip text": 0.45,
    "adaface-ir18": 0.2,
    "adaface-ir101": 0.5,
}


def _sums(ds: list[Dispatch]) -> tuple[int, float, float, float]:
    """(dispatches, flops, bytes, GELU output elements)."""
    return (
        len(ds),
        sum(d.flops for d in ds),
        sum(d.nbytes for d in ds),
        sum(d.epilogue_elems for d in ds),
    )


def fit() -> dict[str, float]:
    d0 = SINGLE_DISPATCH_S
    s2 = list(sapiens2.work("0.4b").passes["forward"].dispatches)
    n, f, _, _ = _sums([d for d in s2 if d.family == "flm_gemm"])
    out = {"flm_gemm flops_per_s": f / (PUBLISHED["sapiens2-0.4b gemms"] - n * d0)}
    n, f, _, _ = _sums([d for d in s2 if d.family == "s2_mha"])
    out["s2_mha flops_per_s"] = f / (PUBLISHED["sapiens2-0.4b mha"] - n * d0)

    vision = clip.dispatches(clip.VIT_H_14)["images"]
    by = {k: [d for d in vision if d.key == k] for k in ("v_qkv", "v_o", "v_fc1", "v_fc2")}
    rows = [(len(by[k]), _sums(by[k])[1]) for k in ("v_qkv", "v_o", "v_fc2")]
    fixed, per_flop = np.linalg.lstsq(
        np.array(rows, float),
        np.array([PUBLISHED[f"clip {k}"] for k in ("v_qkv", "v_o", "v_fc2")]),
        rcond=None,
    )[0]
    out["clip_gemm fixed_s"] = fixed
    out["clip_gemm flops_per_s"] = 1 / per_flop
    n, f, _, e = _sums(by["v_fc1"])
    out["clip_gemm epilogue_s"] = (PUBLISHED["clip v_fc1"] - n * fixed - f * per_flop) / e
    n, f, _, _ = _sums([d for d in vision if d.key == "v_mha"])
    out["clip_mha flops_per_s"] = f / (PUBLISHED["clip v_mha"] - n * d0)
    n, _, b, _ = _sums([d for d in vision if d.key == "v_addln"])
    out["addln bytes_per_s"] = b / (PUBLISHED["clip v_addln"] - n * d0)

    # AdaFace: n·d0 + F·x + host = published, for IR-18 and IR-101
    eqs = []
    for v in ("ir18", "ir101"):
        n, f, _, _ = _sums(adaface.dispatches(adaface.UNITS[v]))
        eqs.append(([f, 1.0], PUBLISHED[f"adaface-{v}"] - n * d0))
    x, host_s = np.linalg.solve(np.array([e[0] for e in eqs]), np.array([e[1] for e in eqs]))
    out["conv flops_per_s"] = 1 / x
    out["ADAFACE_HOST_S"] = host_s
    return out


def _unscaled_text_s() -> float:
    return sum(NPU2.dispatch_s(d) for d in clip.dispatches(clip.VIT_H_14)["texts"])


def residuals() -> list[tuple[str, float, float]]:
    """(figure, modelled s, published s) with the constants npu.sim_cost holds now."""
    s2 = sapiens2.work("0.4b").passes["forward"]
    fam = NPU2.by_family(s2)
    rows = [
        ("sapiens2-0.4b gemms", fam["flm_gemm"]),
        ("sapiens2-0.4b mha", fam["s2_mha"]),
    ]
    cw = clip.work()
    keys = NPU2.by_key(cw.passes["forward"])
    rows += [(f"clip {k}", keys[k]) for k in ("v_qkv", "v_o", "v_fc1", "v_fc2", "v_mha", "v_addln")]
    rows.append(("clip text", NPU2.pass_s(cw.passes["texts"])))
    for v in ("ir18", "ir101"):
        rows.append((f"adaface-{v}", NPU2.pass_s(adaface.work(v).passes["forward"])))
    return [(name, got, PUBLISHED[name]) for name, got in rows]


def main() -> None:
    print("fitted constants:")
    for name, value in fit().items():
        print(f"  {name:24s} {value:.6g}")
    print(f"  {'CLIP_TEXT_SCALE':24s} {0.45 / _unscaled_text_s():.6g}  (with the constants held)")
    print("\nmodelled with npu.sim_cost's constants vs published:")
    for name, got, want in residuals():
        print(f"  {name:22s} {got:8.4f} s  published {want:6.3f} s  ratio {got / want:.4f}")


if __name__ == "__main__":
    main()
