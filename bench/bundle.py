"""Opening a large bundle costs O(manifest), not O(bytes): Bundle.open against reading
tensors.bin once, in the same process.

Writes a synthetic ~700 MB bundle (IRON-like: per-layer packed bfp16 GEMM weights, bf16 and
f32 tensors, one manifest record per kernel) to a temporary folder, then measures
  1. Bundle.open: wall time (first and median of 5) and RSS growth before any tensor is
     touched (targets: <= 50 ms, <= 10 MB);
  2. the reference: reading tensors.bin once into memory (time and RSS growth);
  3. for information, reading every 1024th element of every tensor through the mapping.
RSS is VmRSS from /proc/self/status. The file was just written, so the page cache is warm
for both; neither number includes disk reads.

Run: .venv/bin/python bench/bundle.py [--mb 700] [--keep DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from npu.bf16 import bfp16_packed_size
from npu.bundle import Bundle
from npu.bundle_writer import BundleWriter

LAYER_K, LAYER_N = 1024, 1024  # one packed GEMM weight: 1024*1024/8*9 bytes = 1.125 MiB


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def write_synthetic(root: Path, target_mb: int) -> tuple[int, int]:
    """A bundle of ~target_mb MB; returns (tensor count, record count)."""
    rng = np.random.default_rng(0)
    packed_bytes = bfp16_packed_size(LAYER_K, LAYER_N)
    # Reused payloads: the bench measures the reader, not the writer's random numbers.
    packed = rng.integers(0, 256, packed_bytes, dtype=np.uint8)
    bias = rng.standard_normal(LAYER_N).astype(np.float32)
    norm = rng.standard_normal(LAYER_K).astype(np.float32)
    layer_bytes = packed_bytes + bias.nbytes + norm.nbytes // 2 + norm.nbytes
    layers = max(1, target_mb * 2**20 // layer_bytes)
    tensors = records = 0
    with BundleWriter(root, version=1) as w:
        w.param("model", "synthetic bench bundle")
        w.param("layers", layers)
        w.xclbin("ctx0", "kernels/gemm.xclbin", data=b"\0" * 4096)
        for i in range(layers):
            w.file(f"kernels/g{i}.bin", b"\0" * 256)
            w.record(
                "gemm",
                f"l{i}",
                ctx="ctx0",
                insts=f"kernels/g{i}.bin",
                M=256,
                K=LAYER_K,
                N=LAYER_N,
                tile_k=512,
                tile_n=64,
                ct_k=128,
                bias=1,
                b_bytes=packed_bytes,
            )
            w.tensor(f"l{i}.w", packed)
            w.tensor(f"l{i}.bias", bias)
            w.tensor(f"l{i}.norm", norm, dtype="bf16")
            w.tensor(f"l{i}.scale", norm)
            tensors += 4
            records += 1
    return tensors, records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=700, help="approximate tensors.bin size")
    parser.add_argument("--keep", type=Path, help="write the bundle here and keep it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="npucam-bench-bundle-") as tmp:
        root = args.keep or Path(tmp) / "bundle"
        t0 = time.perf_counter()
        n_tensors, n_records = write_synthetic(root, args.mb)
        blob = root / "tensors.bin"
        size = blob.stat().st_size
        print(
            f"wrote {size / 2**20:.0f} MiB, {n_tensors} tensors, {n_records} records "
            f"in {time.perf_counter() - t0:.1f} s"
        )

        rss0 = rss_bytes()
        t0 = time.perf_counter()
        bundle = Bundle.open(root, version=1)
        first_open = time.perf_counter() - t0
        rss_open = rss_bytes() - rss0
        opens = []
        for _ in range(5):
            t0 = time.perf_counter()
            Bundle.open(root, version=1).close()
            opens.append(time.perf_counter() - t0)
        open_s = statistics.median(opens)

        rss1 = rss_bytes()
        t0 = time.perf_counter()
        data = blob.read_bytes()
        read_s = time.perf_counter() - t0
        rss_read = rss_bytes() - rss1
        assert len(data) == size
        del data

        t0 = time.perf_counter()
        total = 0.0
        rss2 = rss_bytes()
        for name in bundle.tensors:
            total += float(bundle.view(name)[::1024].sum())
        touch_s = time.perf_counter() - t0
        rss_touch = rss_bytes() - rss2
        bundle.close()

        mib = 2**20
        print(
            f"Bundle.open: first {first_open * 1e3:.1f} ms, median of 5 {open_s * 1e3:.1f} ms;"
            f" RSS +{rss_open / mib:.1f} MiB before tensors are touched"
        )
        print(f"read tensors.bin once: {read_s * 1e3:.0f} ms; RSS +{rss_read / mib:.0f} MiB")
        print(f"ratio open/read: time {open_s / read_s:.4f}, RSS {rss_open / max(rss_read, 1):.4f}")
        print(
            f"(reading every 1024th element of every tensor through the mapping: "
            f"{touch_s * 1e3:.0f} ms, RSS +{rss_touch / mib:.1f} MiB)"
        )
        ok = open_s <= 0.050 and rss_open <= 10 * mib
        print(f"targets (open <= 50 ms, RSS <= 10 MB): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
