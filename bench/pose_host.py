"""Sapiens2-Pose host work per box at full depth and width on the bundle path, with a device
that computes nothing: the forward's glue and DARK's decoding, against the same code at
BASE_REV (before issue 26's host work) and the replay before issue 14's host glue (OLD_REV),
in the same run, box by box in turn.

The bundle (0.4b: 24 layers, D 1024, 16 heads x 64, I 4096, 3081 tokens, 308 x 256 x 192
heatmaps, head up (1024, 768), convs (768, 512, 256); 1b: 40 layers, D 1536, 24 heads, I 6144,
up (1536, 1024), convs (768, 512, 256)) has taconite-sapiens2's records
(npu.models.sapiens2.export.record_layout), random weight bytes of the packed sizes and random
host tensors; it is written once to .cache/npucam/bench/. The device is npu.xrt.XrtDevice over
the test fake pyxrt (tests/npu/fake_pyxrt.py) with a dispatch time of 0: every start, sync and
wait is the real npucam code, the kernels compute nothing. The C buffers the host reads (`c`,
`qkv<w>`) are filled once with random bf16 values, the same for every path, and the
predictor's C rows with peaked heatmaps (a Gaussian peak and noise per keypoint, amplitudes
log-uniform in [0.003, 1]: the weak ones take DARK's full-blur path, as a real person's
hidden keypoints do), so every path must return the same heatmaps bit for bit (checked).

The base path is npu/models/sapiens2/{kernels,model,glue,npu,post}.py at BASE_REV, written to
.cache/npucam/bench/base-<rev>/ under other names (numba caches them there). The old replay is
npu/models/sapiens2/{model,npu}.py at OLD_REV imported under other names, with its dispatches
waited one at a time and its Flat.put, as they were; its boxes are decoded with the base DARK.

Measured: process CPU time (all threads; time.process_time) and wall per box, the forward and
DARK apart: the first box (cold: it first-touches the glue's buffers) and the best and median
of the later ones; the peak RSS of one box over the RSS before it (/proc/self/status VmHWM
after resetting it through /proc/self/clear_refs); the process's peak RSS over all boxes of the
first path measured, after loading, less the weights' bytes (run one path alone, `--paths new`,
for that figure of each); a component table (process CPU inside each part of the glue). Load
average before and after, since the machine is shared. Host-glue threads are
npu.rows.host_threads() (NPUCAM_HOST_THREADS sets them).

Run: .venv/bin/python bench/pose_host.py [--model 0.4b 1b] [--boxes 3] [--paths new base old]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import inspect
import os
import re
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
# hazards only recorded: the base and old paths start o with the attention in flight, as they
# did (docs/device.md, "Ordering"); their host work is what is measured here
fake.fail_hazards = False
sys.modules["pyxrt"] = fake
bundles = _load("sapiens2_recording", "tests/npu/models/sapiens2_recording.py")
config, write_random_bundle = bundles.real_config, bundles.write_random_bundle

import npu.models.sapiens2.npu as s2npu  # noqa: E402
from npu import ops  # noqa: E402
from npu.bf16 import f32_to_bf16  # noqa: E402
from npu.bundle import Bundle  # noqa: E402
from npu.models.sapiens2 import glue, post  # noqa: E402
from npu.models.sapiens2.config import Config  # noqa: E402
from npu.models.sapiens2.preprocess import crop_windows  # noqa: E402
from npu.xrt import XrtDevice  # noqa: E402
from pipeline.assets import cache_dir  # noqa: E402

OLD_REV = "1d2a137"  # main before issue 14's host glue (the replay of issue 13)
BASE_REV = "f157aef"  # main before issue 26's host work (DARK's blur, InstanceNorm's squares)
BUNDLE_VERSION = 2  # the format write_random_bundle writes (1b's host down bias)
BOX = np.array([[300.0, 120.0, 360.0, 700.0]], np.float32)  # a person's box, x y w h


def bundle_path(model: str, cfg: Config) -> Path:
    path = cache_dir() / "bench" / f"sapiens2-{model}-host-v{BUNDLE_VERSION}"
    if not (path / "manifest.txt").is_file():
        print(f"writing {path} (once) ...", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_random_bundle(cfg, path, host_bias=model == "1b")
    return path


def _git_show(rev: str, rel: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{rel}"], check=True,
                          capture_output=True, text=True).stdout  # fmt: skip


def base_modules(rev: str) -> tuple[types.ModuleType, types.ModuleType]:
    """(npu, post) of npu/models/sapiens2 at `rev` as modules s2base_*, written to
    .cache/npucam/bench/base-<rev>/ (a directory, so numba can cache their loops)."""
    names = ("kernels", "model", "glue", "npu", "post")
    imports = {
        "import npu.models.sapiens2.model as s2model": "import s2base_model as s2model",
        "from npu.models.sapiens2 import glue, kernels":
            "import s2base_glue as glue\nimport s2base_kernels as kernels",
        "from npu.models.sapiens2 import kernels": "import s2base_kernels as kernels",
        "from npu.models.sapiens2.model import": "from s2base_model import",
        # the factory left npu.device for npu.backends (issue 28)
        "    open_device,\n)": ")\nfrom npu.backends import open_device",
    }  # fmt: skip
    where = cache_dir() / "bench" / f"base-{rev}"
    where.mkdir(parents=True, exist_ok=True)
    for name in names:
        text = _git_show(rev, f"npu/models/sapiens2/{name}.py")
        for old, new in imports.items():
            text = text.replace(old, new)
        for line in text.splitlines():
            if re.match(
                r"(import|from) npu\.models\.sapiens2(\.(kernels|model|glue)\b| import)", line
            ):
                raise RuntimeError(f"{rev}:{name}.py: an import not rewritten here: {line}")
        path = where / f"s2base_{name}.py"
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
    sys.path.insert(0, str(where))
    return importlib.import_module("s2base_npu"), importlib.import_module("s2base_post")


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
    """Random bf16 values in the C buffers the host reads (the no-op device never writes),
    then peaked heatmaps in the predictor's C rows (the same for every path)."""
    rng = np.random.default_rng(rng_seed)
    flats = replay.flats
    for name in sorted(flats):
        if name == "c" or name.startswith("qkv"):
            bits = flats[name].host()
            bits[:] = f32_to_bf16(rng.normal(size=bits.size).astype(np.float32))
    cfg, rec = replay.config, replay.gemms["pred"]
    k, h, w = cfg.K, 4 * cfg.gh, 4 * cfg.gw
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    hm = np.empty((h * w, k), np.float32)
    for i in range(k):
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        amp, sigma = np.exp(rng.uniform(np.log(0.003), 0.0)), rng.uniform(1.5, 4.0)
        peak = amp * np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * sigma * sigma))
        hm[:, i] = (peak + rng.normal(0, 0.002, (h, w))).reshape(-1)
    c = flats["c"].host()
    rows = np.lib.stride_tricks.as_strided(c, (h * w, k), (rec.c_stride * 2, 2))
    rows[:] = f32_to_bf16(hm)


def measure_box(path: dict, crop: np.ndarray) -> None:
    """One box on `path` (its model, DARK, parts): CPU and wall of the forward and of DARK,
    the peak RSS over the RSS before, appended to the path's lists."""
    parts = path["parts"]
    before = status_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    parts.reset()
    c0, w0 = time.process_time(), time.perf_counter()
    hm = path["model"].heatmaps(crop[None])
    c1 = time.process_time()
    kp = path["dark"](hm, crop_windows(BOX))
    c2, w2 = time.process_time(), time.perf_counter()
    path["forward"].append(c1 - c0)
    path["dark_cpu"].append(c2 - c1)
    path["cpu"].append(c2 - c0)
    path["wall"].append(w2 - w0)
    path["rss"].append((status_kb("VmHWM") - before) / 1024)
    path["parts_cpu"] = dict(parts.cpu)
    path["heatmaps"], path["keypoints"] = hm, kp


def _later(values: list[float]) -> list[float]:
    """The boxes after the first (which pays the first touch of the glue's buffers), or the
    one box there is."""
    return values[1:] or values


def _first_best_median(values: list[float]) -> str:
    later = _later(values)
    return f"{values[0]:.3f} / {min(later):.3f} / {statistics.median(later):.3f}"


def new_parts(glue_mod: types.ModuleType, dev: XrtDevice) -> Parts:
    """The component table of a path with issue-14 glue (new or base)."""
    parts = Parts()
    for part, fns in {
        "residual adds + RMSNorm -> bf16 into `a` (2 a layer, one pass)": [
            "put_rms", "add_put_rms", "add_rows"],
        "attention staging: qkv -> q/k norm, RoPE, repeats -> `stage`": ["stage_rows"],
        "head GEMM staging: final norm -> pairs, (base: scatter, C reads), heatmaps": [
            "rms_rows_to", "scatter_into", "read_rows", "heatmaps_into", "zero_pair_pads"],
        "InstanceNorm + SiLU -> the next A (new: reading C in place)": ["instance_norm_silu_to"],
    }.items():  # fmt: skip
        for fn in fns:
            if hasattr(glue_mod, fn):  # the base's scatter_into is in the new InstanceNorm
                parts.wrap(part, glue_mod, fn)
    for fn in ("start", "wait", "to_device", "from_device"):
        parts.wrap("dispatch overhead: start, wait, syncs", dev, fn)
    return parts


def old_parts(old_mod: types.ModuleType, dev: XrtDevice) -> Parts:
    """The component table of the replay at OLD_REV."""
    parts = Parts()
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
            parts.wrap(part, owner, fn)
    return parts


def main() -> None:  # noqa: C901
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", nargs="+", default=["0.4b", "1b"], choices=["0.4b", "1b"])
    ap.add_argument("--boxes", type=int, default=3)
    ap.add_argument("--paths", nargs="+", default=["new", "base", "old"],
                    choices=["new", "base", "old"])  # fmt: skip
    args = ap.parse_args()
    from npu.rows import host_threads

    print(f"host threads {host_threads()}, load average {os.getloadavg()}", flush=True)
    node = Path(tempfile.mkdtemp()) / "accel0"
    node.write_bytes(b"")
    for model_name in args.model:
        cfg = config(model_name)
        bpath = bundle_path(model_name, cfg)
        dev = XrtDevice(str(node))
        base_npu, base_post = base_modules(BASE_REV) if {"base", "old"} & set(args.paths) else (
            None, None)  # fmt: skip
        paths: list[dict] = []
        for name in args.paths:
            rss0 = status_kb("VmRSS")
            if name == "new":
                model, dark = s2npu.from_bundle(bpath, dev), post.dark_keypoints
                parts = new_parts(glue, dev)
            elif name == "base":
                model, dark = base_npu.from_bundle(bpath, dev), base_post.dark_keypoints
                parts = new_parts(sys.modules["s2base_glue"], dev)
            else:
                old_mod = old_replay_module()
                model, dark = old_mod.from_bundle(bpath, dev), base_post.dark_keypoints
                parts = old_parts(old_mod, dev)
            fill_c(model.ops)
            timed = types.SimpleNamespace(dark=dark)
            parts.wrap("DARK (post.dark_keypoints)", timed, "dark")
            dark = timed.dark
            paths.append({"name": name, "model": model, "dark": dark, "parts": parts,
                          "loaded": (status_kb("VmRSS") - rss0) / 1024, "forward": [],
                          "dark_cpu": [], "cpu": [], "wall": [], "rss": []})  # fmt: skip
        bundle = Bundle.open(bpath)
        weights = sum(bundle.view(n).nbytes for n in s2npu.weight_tensors(cfg)) / 2**20
        del bundle
        crop = np.random.default_rng(2).normal(size=(3, cfg.H, cfg.W)).astype(np.float32)
        hm_h, hm_w = 4 * cfg.gh, 4 * cfg.gw
        print(f"\nSapiens2 {model_name}: {cfg.layers} layers, D {cfg.D}, {cfg.heads} heads, "
              f"I {cfg.I}, {cfg.tokens} tokens, {cfg.K} x {hm_h} x {hm_w} heatmaps; weights "
              f"{weights:.0f} MiB; loaded +" + ", +".join(
                  f"{p['loaded']:.0f} MiB ({p['name']})" for p in paths) + " RSS (weights, "
              "flat buffers)", flush=True)  # fmt: skip
        Path("/proc/self/clear_refs").write_text("5")  # the loads' peaks are not a forward's
        first_peak = 0.0  # the process's peak RSS during the first path's boxes
        for _ in range(args.boxes):
            for i, p in enumerate(paths):
                measure_box(p, crop)  # resets VmHWM first: it is then this box's peak
                if i == 0:
                    first_peak = max(first_peak, status_kb("VmHWM") / 1024)
        for p in paths[1:]:
            same = np.array_equal(paths[0]["heatmaps"], p["heatmaps"])
            diff = np.abs(paths[0]["keypoints"] - p["keypoints"]).max()
            print(f"  heatmaps {paths[0]['name']} == {p['name']}, bit for bit: {same}; "
                  f"keypoints max |diff| {diff:.2e} image px")  # fmt: skip
        print(f"  load average after: {os.getloadavg()}")
        print(f"  process peak RSS during the {paths[0]['name']} path's boxes over the weights: "
              f"{first_peak - weights:.0f} MiB ({first_peak:.0f} MiB peak, weights "
              f"{weights:.0f} MiB; with other paths loaded it counts theirs too)")  # fmt: skip
        print(
            "\n| path | CPU s/box, forward + DARK: first / later best / later median | "
            "forward alone: later median | DARK alone: later median | wall s/box: first / "
            "later best / later median | peak RSS over before, MiB: first / later boxes |"
        )
        print("|---|---|---|---|---|---|")
        for p in paths:
            later = f"{max(p['rss'][1:]):.0f}" if len(p["rss"]) > 1 else "-"
            print(f"| {p['name']} | {_first_best_median(p['cpu'])} | "
                  f"{statistics.median(_later(p['forward'])):.3f} | "
                  f"{statistics.median(_later(p['dark_cpu'])):.4f} | "
                  f"{_first_best_median(p['wall'])} | {p['rss'][0]:.0f} / {later} |")  # fmt: skip
        for p in paths:
            print(f"{p['name']}: CPU s per box in order: {', '.join(f'{c:.3f}' for c in p['cpu'])}")
        medians = {p["name"]: statistics.median(_later(p["cpu"])) for p in paths}
        for ref in ("base", "old"):
            if "new" in medians and ref in medians:
                print(
                    f"\nnew / {ref} CPU per box (medians of the later boxes): "
                    f"{medians['new'] / medians[ref]:.3f}"
                )
        for p in paths:
            total = p["cpu"][-1]
            print(f"\n{p['name']} path, last box, process CPU by part:\n\n| part | CPU s | share |"
                  "\n|---|---|---|")  # fmt: skip
            for part, sec in p["parts_cpu"].items():
                print(f"| {part} | {sec:.3f} | {100 * sec / total:.1f}% |")
            rest = total - sum(p["parts_cpu"].values())
            print(
                f"| other (Python around them, patches, concatenations) | {rest:.3f} | "
                f"{100 * rest / total:.1f}% |\n| total | {total:.3f} | 100% |"
            )
        for p in paths:
            p["model"].close()
        dev.close()


if __name__ == "__main__":
    main()
