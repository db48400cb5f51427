"""The Sapiens2-Pose cpu forward (npu.models.sapiens2, numpy float32) against HF's
Sapiens2ForPoseEstimation in torch, in one run, on the same number of threads.

The model has the 0.4b width on the real 1024x768 input (D 1024, 16 heads x 64, SwiGLU
I 4096, 8 registers, 3081 tokens, 308 keypoints at 256x192) but reduced depth: --layers
(default 2: one MHA layer and one GQA layer with 8 KV heads). Head widths: up (1024, 768),
convs (768, 512, 256); up[0] = 1024 is inferred in docs/pose.md, the rest are assumed
(only the 1b head is sourced). Random weights (HF init, saved with save_pretrained and loaded
back with from_pretrained). Reported: seconds per crop for each, the ratio, the heatmap cosine,
and the cpu forward's split into op time (the GEMMs and the attention, which a device takes over)
and host glue (norms, the attention staging, deconv staging and scatter, InstanceNorm + SiLU).

With --sim, the same weights are also written as a sim bundle (npu.models.sapiens2.
write_sim_bundle) and run once on npu.sim.SimDevice: its host wall time split into host glue
and time inside the kernels (the simulator's numpy execution of each dispatch), and the
simulator's modelled device time, which is an estimate, not a hardware measurement.

Run: .venv/bin/python bench/pose_forward.py [--layers 2] [--threads 1] [--repeat 2] [--sim]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


class Timed:
    """Wraps a callable and accumulates the wall time spent inside it."""

    def __init__(self, fn) -> None:
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0


def run_sim(cpu_model, tmp: str) -> None:
    """One forward of the cpu model's weights as a sim bundle; prints the time split."""
    import numpy as np

    from npu.models.sapiens2.export import write_sim_bundle
    from npu.models.sapiens2.npu import from_bundle
    from npu.sim import SimDevice

    write_sim_bundle(cpu_model, f"{tmp}/bundle")
    dev = SimDevice(registry_dir=f"{tmp}/hwctx")
    model = from_bundle(f"{tmp}/bundle", dev)
    timed = dev.run = Timed(dev.run)  # every dispatch of the replay goes through run
    crop = np.random.default_rng(0).normal(size=(1, 3, 1024, 768)).astype(np.float32)
    t0 = time.perf_counter()
    got = model.heatmaps(crop)
    wall = time.perf_counter() - t0
    ref = cpu_model.heatmaps(crop)
    a, b = got.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    host = wall - timed.seconds
    device = dev.sim.device_time_s
    print("sim backend (one forward):")
    print(f"  host wall {wall:.2f} s = host glue {host:.2f} s + in kernels {timed.seconds:.2f} s")
    print(f"  SIMULATED device time {device:.3f} s (npu.sim CostModel, not hardware)")
    print(f"  host glue / (host glue + simulated device) = {100 * host / (host + device):.1f}%")
    print(f"  heatmap cosine sim vs cpu {a @ b / np.linalg.norm(a) / np.linalg.norm(b):.6f}")
    dev.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--sim", action="store_true")
    args = ap.parse_args()
    # both sides on the same thread count; set before numpy / torch load their BLAS
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    import numpy as np
    import torch
    from transformers import Sapiens2Config, Sapiens2ForPoseEstimation

    from npu.models.sapiens2.checkpoint import from_pretrained

    torch.set_num_threads(args.threads)

    kv = [16 if i % 2 == 0 else 8 for i in range(args.layers)]
    cfg = Sapiens2Config(
        hidden_size=1024, intermediate_size=4096, num_hidden_layers=args.layers,
        num_attention_heads=16, num_key_value_heads_per_layer=kv, num_register_tokens=8,
        image_size=[1024, 768], patch_size=16, num_labels=308,
        head_config={"upsample_out_channels": [1024, 768], "conv_out_channels": [768, 512, 256]},
    )  # fmt: skip
    torch.manual_seed(0)
    hf = Sapiens2ForPoseEstimation(cfg).eval()
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        ours = from_pretrained(tmp)
        if args.sim:
            run_sim(ours, tmp)
    import npu.models.sapiens2.model as s2model

    # op time: the GEMMs and the attention, which a device would take over
    gemm = ours.ops.ops.gemm = Timed(ours.ops.ops.gemm)
    attn = s2model.staged_attention = Timed(s2model.staged_attention)
    crop = np.random.default_rng(0).normal(size=(1, 3, 1024, 768)).astype(np.float32)

    t_ours, t_hf, op_share = [], [], []
    for _ in range(args.repeat):
        gemm.seconds = attn.seconds = 0.0
        t0 = time.perf_counter()
        got = ours.heatmaps(crop)
        t_ours.append(time.perf_counter() - t0)
        op_share.append((gemm.seconds + attn.seconds) / t_ours[-1])
        t0 = time.perf_counter()
        with torch.no_grad():
            ref = hf(torch.from_numpy(crop)).heatmaps.numpy()
        t_hf.append(time.perf_counter() - t0)
    a, b = got.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    cos = a @ b / np.linalg.norm(a) / np.linalg.norm(b)
    best = int(np.argmin(t_ours))
    print(
        f"0.4b width, {args.layers} layers (kv heads {kv}), 1024x768 -> 308x256x192, "
        f"{args.threads} thread(s), best of {args.repeat}"
    )
    print(f"  cpu forward (numpy): {min(t_ours):.2f} s/crop")
    print(f"  HF torch eval:       {min(t_hf):.2f} s/crop")
    print(f"  ours / HF time:      {min(t_ours) / min(t_hf):.2f}")
    print(f"  heatmap cosine:      {cos:.7f}")
    print(
        f"  cpu forward split:   ops {100 * op_share[best]:.1f}%, "
        f"host glue {100 * (1 - op_share[best]):.1f}%"
    )


if __name__ == "__main__":
    main()
