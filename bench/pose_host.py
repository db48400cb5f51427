"""Sapiens2-Pose host work per box at full depth and width on the bundle path, with a device
that computes nothing, against the replay before issue 14's host glue in the same run.

The bundle (0.4b: 24 layers, D 1024, 16 heads x 64, I 4096, 3081 tokens, 308 x 256 x 192
heatmaps, head up (1024, 768), convs (768, 512, 256); 1b: 40 layers, D 1536, 24 heads, I 6144,
up (1536, 1024), convs (768, 512, 256)) has taconite-sapiens2's records
(npu.models.sapiens2.export.record_layout), random weight bytes of the packed sizes and random
host tensors; it is written once to .cache/npucam/bench/. The device is npu.xrt.XrtDevice over
the test fake pyxrt (tests/npu/fake_pyxrt.py) with a dispatch time of 0: every start, sync and
wait is the real npucam code, the kernels compute nothing. The C buffers the host reads (`c`,
`qkv<w>`) are filled once with random bf16 values, the same for both replays, so the old and
the new replay must return the same heatmaps bit for bit (checked).

The old replay is npu/models/sapiens2/{model,npu}.py at OLD_REV imported under other names,
with its dispatches waited one at a time and its Flat.put, as they were.

Measured: process CPU time (all threads; time.process_time) and wall per box: the first box
(cold: it first-touches the glue's buffers) and the best and median of the later ones; the
peak RSS of one forward over the RSS before it (/proc/self/status VmHWM after resetting it
through /proc/self/clear_refs), cold (the first forward after loading) and warm; a
component table (process CPU inside each part of the glue). Load average before and after,
since the machine is shared. Host-glue threads are npu.rows.host_threads()
(NPUCAM_HOST_THREADS sets them).

Run: .venv/bin/python bench/pose_host.py [--model 0.4b 1b] [--boxes 3] [--no-old]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import inspect
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _load(name: str, rel: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / rel)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


fake = _load("fake_pyxrt", "tests/npu/fake_pyxrt.py")
fake.record = False  # the calls of whole forwards: only counted
sys.modules["pyxrt"] = fake
bundles = _load("sapiens2_recording", "tests/npu/models/sapiens2_recording.py")
config, write_random_bundle = bundles.real_config, bundles.write_random_bundle

import npu.models.sapiens2.npu as s2npu  # noqa: E402
from npu import ops  # noqa: E402
from npu.bf16 import f32_to_bf16  # noqa: E402
from npu.models.sapiens2 import glue  # noqa: E402
from npu.models.sapiens2.config import Config  # noqa: E402
from npu.xrt import XrtDevice  # noqa: E402
from pipeline.assets import cache_dir  # noqa: E402

OLD_REV = "1d2a137"  # main before issue 14's host glue (the replay of issue 13)
BUNDLE_VERSION = 2  # the format write_random_bundle writes (1b's host down bias)


def bundle_path(model: str, cfg: Config) -> Path:
    path = cache_dir() / "bench" / f"sapiens2-{model}-host-v{BUNDLE_VERSION}"
    if not (path / "manifest.txt").is_file():
        print(f"writing {path} (once) ...", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_random_bundle(cfg, path, host_bias=model == "1b")
    return path


def old_replay_module() -> types.ModuleType:
    """npu/models/sapiens2/{model,npu}.py at OLD_REV as modules sapiens2_old_model / _npu."""

    def source(rel: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), "show", f"{OLD_REV}:{rel}"], check=True,
                              capture_output=True, text=True).stdout  # fmt: skip

    modules = {}
    for name, rel in (("sapiens2_old_model", "npu/models/sapiens2/model.py"),
                      ("sapiens2_old_npu", "npu/models/sapiens2/npu.py")):  # fmt: skip
        text = source(rel).replace("from npu.models.sapiens2.model import",
                                   "from sapiens2_old_model import")  # fmt: skip
        mod = types.ModuleType(name)
        sys.modules[name] = mod
        exec(compile(text, f"{OLD_REV}:{rel}", "exec"), mod.__dict__)
        modules[name] = mod
    old = modules["sapiens2_old_npu"]

    class OldFlat(ops.Flat):
        def put(self, bits: np.ndarray) -> None:  # Flat.put at OLD_REV
            np.copyto(self.host(bits.size), bits.reshape(-1))
            self.written(bits.size)

    old.Flat = OldFlat
    old.run_gemm = lambda *a: ops.run_gemm(*a).wait()  # run_gemm at OLD_REV waited
    old.run_mha = lambda *a: ops.run_mha(*a).wait()
    return old


class Parts:
    """Process CPU seconds inside wrapped callables, by part; a call inside another timed
    call counts for the outer one only."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self._depth = 0

    def wrap(self, part: str, owner: object, name: str) -> None:
        fn = getattr(owner, name)
        self.cpu.setdefault(part, 0.0)

        def call(run, *args, **kwargs):
            if self._depth:
                return run(*args, **kwargs)
            self._depth += 1
            t0 = time.process_time()
            try:
                return run(*args, **kwargs)
            finally:
                self.cpu[part] += time.process_time() - t0
                self._depth -= 1

        if inspect.isgeneratorfunction(fn):  # a host step in pieces: time each piece

            @functools.wraps(fn)
            def timed_steps(*args, **kwargs):
                pieces = fn(*args, **kwargs)
                while True:
                    try:
                        piece = call(next, pieces)
                    except StopIteration as stop:
                        return stop.value
                    yield piece

            setattr(owner, name, timed_steps)
        else:  # a function, not a partial: a method wrapped on its class still binds

            @functools.wraps(fn)
            def timed(*args, **kwargs):
                return call(fn, *args, **kwargs)

            setattr(owner, name, timed)

    def reset(self) -> None:
        self.cpu = dict.fromkeys(self.cpu, 0.0)


def status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def fill_c(replay, rng_seed: int = 1) -> None:
    """Random bf16 values in the C buffers the host reads (the no-op device never writes)."""
    rng = np.random.default_rng(rng_seed)
    flats = replay.flats
    for name in sorted(flats):
        if name == "c" or name.startswith("qkv"):
            bits = flats[name].host()
            bits[:] = f32_to_bf16(rng.normal(size=bits.size).astype(np.float32))


def measure(name: str, model, crop: np.ndarray, boxes: int, parts: Parts) -> dict:
    """CPU and wall per box, peak RSS over the RSS before (cold: the first box), parts."""
    out: dict = {"name": name, "cpu": [], "wall": [], "rss": []}
    hm = None
    for _ in range(boxes):
        before = status_kb("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        parts.reset()
        c0, w0 = time.process_time(), time.perf_counter()
        hm = model.heatmaps(crop[None])
        out["cpu"].append(time.process_time() - c0)
        out["wall"].append(time.perf_counter() - w0)
        out["rss"].append((status_kb("VmHWM") - before) / 1024)
        out["parts"] = dict(parts.cpu)
    out["heatmaps"] = hm
    return out


def _later(values: list[float]) -> list[float]:
    """The boxes after the first (which pays the first touch of the glue's buffers), or the
    one box there is."""
    return values[1:] or values


def _first_best_median(values: list[float]) -> str:
    later = _later(values)
    return f"{values[0]:.3f} / {min(later):.3f} / {statistics.median(later):.3f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", nargs="+", default=["0.4b", "1b"], choices=["0.4b", "1b"])
    ap.add_argument("--boxes", type=int, default=3)
    ap.add_argument("--no-old", action="store_true")
    args = ap.parse_args()
    from npu.rows import host_threads

    print(f"host threads {host_threads()}, load average {os.getloadavg()}", flush=True)
    node = Path(tempfile.mkdtemp()) / "accel0"
    node.write_bytes(b"")
    for model_name in args.model:
        cfg = config(model_name)
        path = bundle_path(model_name, cfg)
        dev = XrtDevice(str(node))
        rss0 = status_kb("VmRSS")
        model = s2npu.from_bundle(path, dev)
        fill_c(model.ops)
        loaded = (status_kb("VmRSS") - rss0) / 1024
        parts = Parts()
        for part, fns in {
            "residual adds + RMSNorm -> bf16 into `a` (2 a layer, one pass)": [
                "put_rms", "add_put_rms", "add_rows"],
            "attention staging: qkv -> q/k norm, RoPE, repeats -> `stage`": ["stage_rows"],
            "head GEMM staging: final norm -> pairs, scatter, C reads": [
                "rms_rows_to", "scatter_into", "read_rows", "heatmaps_into", "zero_pair_pads"],
            "InstanceNorm + SiLU -> the next A": ["instance_norm_silu_to"],
        }.items():  # fmt: skip
            for fn in fns:
                parts.wrap(part, glue, fn)
        for fn in ("start", "wait", "to_device", "from_device"):
            parts.wrap("dispatch overhead: start, wait, syncs", dev, fn)
        crop = np.random.default_rng(2).normal(size=(3, cfg.H, cfg.W)).astype(np.float32)
        print(f"\nSapiens2 {model_name}: {cfg.layers} layers, D {cfg.D}, {cfg.heads} heads, "
              f"I {cfg.I}, {cfg.tokens} tokens, {cfg.K} x {4 * cfg.gh} x {4 * cfg.gw} heatmaps; "
              f"loaded +{loaded:.0f} MiB RSS (weights, flat buffers)", flush=True)  # fmt: skip
        results = [measure("new", model, crop, args.boxes, parts)]
        if not args.no_old:
            old_mod = old_replay_module()
            old_model = old_mod.from_bundle(path, dev)
            fill_c(old_model.ops)
            old_parts = Parts()
            om = sys.modules["sapiens2_old_model"]
            for part, owner, fns in (
                ("f32 -> bf16 staging (f32_to_bf16, put)", old_mod, ["f32_to_bf16"]),
                ("f32 -> bf16 staging (f32_to_bf16, put)", old_mod.Flat, ["put"]),
                ("C reads (bf16_to_f32)", old_mod, ["bf16_to_f32"]),
                ("attention staging (stage_attention)", om, ["stage_attention"]),
                ("RMSNorm (rms_norm)", om, ["rms_norm"]),
                ("deconv pairs and scatter", old_mod, ["deconv_pairs"]),
                ("deconv pairs and scatter", om, ["deconv_scatter"]),
                ("InstanceNorm + SiLU", om, ["instance_norm_silu"]),
                ("dispatch overhead: start, wait, syncs", dev,
                 ["start", "wait", "to_device", "from_device"]),
            ):  # fmt: skip
                for fn in fns:
                    old_parts.wrap(part, owner, fn)
            results.append(measure("old", old_model, crop, args.boxes, old_parts))
            same = np.array_equal(results[0]["heatmaps"], results[1]["heatmaps"])
            print(f"  heatmaps new == old, bit for bit: {same}")
            old_model.close()
        print(f"  load average after: {os.getloadavg()}")
        print(
            "\n| path | CPU s/box: first / later best / later median | wall s/box: first / "
            "later best / later median | peak RSS over before, MiB: first / later boxes |"
        )
        print("|---|---|---|---|")
        for r in results:
            later = f"{max(r['rss'][1:]):.0f}" if len(r["rss"]) > 1 else "-"
            print(f"| {r['name']} | {_first_best_median(r['cpu'])} | "
                  f"{_first_best_median(r['wall'])} | {r['rss'][0]:.0f} / {later} |")  # fmt: skip
        for r in results:
            print(f"{r['name']}: CPU s per box in order: {', '.join(f'{c:.3f}' for c in r['cpu'])}")
        if len(results) > 1:
            new, old = (statistics.median(_later(r["cpu"])) for r in results)
            print(f"\nnew / old CPU per box (medians of the later boxes): {new / old:.3f}")
        for r in results:
            total = r["cpu"][-1]
            print(f"\n{r['name']} path, last box, process CPU by part:\n\n| part | CPU s | share |"
                  "\n|---|---|---|")  # fmt: skip
            for part, s in r["parts"].items():
                print(f"| {part} | {s:.3f} | {100 * s / total:.1f}% |")
            rest = total - sum(r["parts"].values())
            print(
                f"| other (Python around them, patches, concatenations) | {rest:.3f} | "
                f"{100 * rest / total:.1f}% |\n| total | {total:.3f} | 100% |"
            )
        model.close()
        dev.close()


if __name__ == "__main__":
    main()
