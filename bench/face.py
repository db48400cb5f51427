"""Face path throughput on one core: detection + alignment per frame, and alignment alone
against the scikit-image path (SimilarityTransform.from_estimate + cv2.warpAffine, insightface's
norm_crop) in the same run; optionally the cpu AdaFace forward against torch.

Frames: every frame of the carphone sample clip (176x144, one frontal face) and
skimage's astronaut (512x512). All runs use one thread (cv2.setNumThreads(1), LiteRT
num_threads=1, torch.set_num_threads(1)), so the numbers are per core.

  1. detect+align: BlazeFace short-range (letterbox, LiteRT, decode, weighted NMS) and
     stages.align.align_face_4pt on each detected face.
  2. align only: stages.align.align_face (our Umeyama + warp) vs the scikit-image path on
     the same 5-point landmark sets (the ratio is ours / reference time).
  3. embed (--embed): the IR-18-shaped cpu forward (random weights) vs torch on one core,
     and the same network as a sim bundle through the step interpreter (host wall time and
     the simulator's modelled device time, which is not a hardware measurement).

Run: .venv/bin/python bench/face.py [--repeat 3] [--embed]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import cv2
import numpy as np
import skimage.data
from skimage.transform import SimilarityTransform
from timing import best_of

from pipeline.assets import asset_path
from stages.align import ARCFACE_TEMPLATE, align_face, align_face_4pt, blazeface_alignment_points
from stages.detectors.blazeface import BlazeFace


def carphone_frames() -> list[np.ndarray]:
    cap = cv2.VideoCapture(str(asset_path("carphone_pristine.mp4")))
    frames = []
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame)
    cap.release()
    return frames


def skimage_align(image: np.ndarray, lmk: np.ndarray) -> np.ndarray:
    tform = SimilarityTransform.from_estimate(lmk, ARCFACE_TEMPLATE)
    return cv2.warpAffine(image, tform.params[0:2, :], (112, 112), borderValue=0.0)


def bench_detect_align(frames: list[np.ndarray], repeat: int) -> None:
    det = BlazeFace("short")
    faces = sum(len(det.detect(f)) for f in frames)

    def run() -> None:
        for f in frames:
            d = det.detect(f)
            for kp in d.keypoints:
                align_face_4pt(f, blazeface_alignment_points(kp))

    t = best_of(repeat, run)
    print(
        f"detect+align  {len(frames)} frames {frames[0].shape[1]}x{frames[0].shape[0]}, "
        f"{faces} faces: {1e3 * t / len(frames):.2f} ms/frame, {faces / t:.0f} faces/s/core"
    )


def bench_align(frames: list[np.ndarray], repeat: int) -> None:
    rng = np.random.default_rng(0)
    jobs = []
    for i in range(2000):
        f = frames[i % len(frames)]
        th = rng.uniform(-0.5, 0.5)
        rot = np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]])
        lmk = (ARCFACE_TEMPLATE - 56) @ rot.T * rng.uniform(0.3, 1.0) + [88, 72]
        jobs.append((f, lmk + rng.normal(0, 1, (5, 2))))

    def ours() -> None:
        for f, lmk in jobs:
            align_face(f, lmk)

    def ref() -> None:
        for f, lmk in jobs:
            skimage_align(f, lmk)

    # interleaved, best of each: the machine is shared, so load shifts between runs
    t_ours, t_ref = float("inf"), float("inf")
    for _ in range(repeat):
        t_ours = min(t_ours, best_of(1, ours))
        t_ref = min(t_ref, best_of(1, ref))
    n = len(jobs)
    print(
        f"align only    {n} faces: ours {1e6 * t_ours / n:.1f} us/face "
        f"({n / t_ours:.0f} faces/s/core); scikit-image {1e6 * t_ref / n:.1f} us/face "
        f"({n / t_ref:.0f} faces/s/core); ours/ref time = {t_ours / t_ref:.2f}"
    )


def bench_embed(repeat: int) -> None:
    import torch

    torch.set_num_threads(1)
    from npu.models.adaface.checkpoint import lower_iresnet
    from npu.models.adaface.model import AdaFaceCpu

    here = os.path.dirname(os.path.abspath(__file__))
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "adaface_torch_ref",
        os.path.join(here, "..", "tests", "npu", "models", "adaface_torch_ref.py"),
    )
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    net = ref.tiny_ir(seed=0, stem=64, widths=(64, 128, 256, 512), units=(2, 2, 2, 2))
    sd = {k: v.numpy() for k, v in net.state_dict().items()}
    model = AdaFaceCpu(lower_iresnet(sd, "IR-18-random"))
    x = np.random.default_rng(0).uniform(-1, 1, (3, 112, 112)).astype(np.float32)
    xt = torch.from_numpy(x)[None]
    model.embed(x)
    t_ours, t_ref = float("inf"), float("inf")
    with torch.no_grad():
        net(xt)
        for _ in range(repeat):
            t_ours = min(t_ours, best_of(1, lambda: model.embed(x)))
            t_ref = min(t_ref, best_of(1, lambda: net(xt)))
    print(
        f"embed IR-18   ours (numpy im2col+gemm) {1e3 * t_ours:.0f} ms/face "
        f"({1 / t_ours:.1f} faces/s/core); torch {1e3 * t_ref:.0f} ms/face; "
        f"ours/torch time = {t_ours / t_ref:.2f}"
    )
    bench_embed_sim(model, x, t_ours, repeat)


def bench_embed_sim(model, x: np.ndarray, t_cpu: float, repeat: int) -> None:
    """The same IR-18 as a sim bundle, replayed by the step interpreter on SimDevice."""
    import tempfile

    from npu.models.adaface.export import export_bundle
    from npu.models.adaface.npu import AdafaceBundle
    from npu.models.adaface.post import cosine
    from npu.sim import SimDevice

    with tempfile.TemporaryDirectory() as tmp:
        export_bundle(model.program, os.path.join(tmp, "b"), x, model=model.model())
        dev = SimDevice(registry_dir=os.path.join(tmp, "hwctx"))
        try:
            sim = AdafaceBundle.load(os.path.join(tmp, "b"), dev)
            e = sim.embed(x)  # cold: loads the kernels and creates the contexts
            before = dev.sim.device_time_s
            t_sim = float("inf")
            for _ in range(repeat):
                t_sim = min(t_sim, best_of(1, lambda: sim.embed(x)))
            device_s = (dev.sim.device_time_s - before) / repeat
            print(
                f"embed IR-18   sim bundle ({sim.num_conv_dispatches()} conv dispatches): host "
                f"wall {1e3 * t_sim:.0f} ms/face; simulated device time {1e3 * device_s:.1f} "
                f"ms/face (sim, not hardware); host/cpu-forward time = {t_sim / t_cpu:.2f}; "
                f"cosine to the cpu forward {cosine(e, model.embed(x)):.5f}"
            )
        finally:
            dev.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--embed", action="store_true", help="also time the cpu AdaFace forward")
    args = ap.parse_args()
    cv2.setNumThreads(1)
    frames = carphone_frames()
    astro = cv2.cvtColor(skimage.data.astronaut(), cv2.COLOR_RGB2BGR)
    bench_detect_align(frames, args.repeat)
    bench_detect_align([astro] * 30, args.repeat)
    bench_align(frames, args.repeat)
    if args.embed:
        bench_embed(args.repeat)


if __name__ == "__main__":
    main()
