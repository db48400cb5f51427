"""npu/models/adaface_steps.py + adaface_export.py + npu/sim_conv.py: a tiny IR network built in
torch (docs/face-id.md), exported as a bundle in taconite-adaface's record format, replayed on the
simulated NPU; the self-check, load-time checks and the context LRU."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from adaface_torch_ref import tiny_ir  # beside this file

from npu.bf16 import f32_to_bf16, round_bf16
from npu.bundle import Bundle, BundleError
from npu.bundle_writer import BundleWriter
from npu.device import DeviceError, KernelSpec
from npu.models.adaface.check import check_bundle
from npu.models.adaface.checkpoint import from_pretrained as load_adaface
from npu.models.adaface.export import channel_groups, export_bundle
from npu.models.adaface.model import Conv, Head, IrProgram, PreluBias
from npu.models.adaface.npu import AdafaceBundle, InputError, from_tiled, head_f32, to_tiled
from npu.models.adaface.post import cosine
from npu.sim import SimDevice
from npu.sim_conv import CONV_KIND, conv_insts, pack_conv_weights
from stages.commands.face import check_command

torch.set_num_threads(1)
WIDTHS = (16, 32, 48, 64)
MAX_ICG = 24  # groups of 24 leave remainders (32 = 24 + 8, 64 = 24 + 24 + 16)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(torch net, input [3, 112, 112], bundle dir): stem 8, one unit per stage."""
    net = tiny_ir(seed=3, stem=8, widths=WIDTHS, units=(1, 1, 1, 1))
    x = np.random.default_rng(0).uniform(-1, 1, (3, 112, 112)).astype(np.float32)
    sd = {k: v.numpy() for k, v in net.state_dict().items()}
    path = export_bundle(
        sd, tmp_path_factory.mktemp("adaface") / "tiny", x, model="IR-tiny", max_icg=MAX_ICG
    )
    return net, x, path


@pytest.fixture
def sim(tmp_path):
    dev = SimDevice(registry_dir=tmp_path / "hwctx")
    yield dev
    dev.close()


def _torch(net, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return net(torch.from_numpy(np.ascontiguousarray(x))[None]).numpy()[0]


def test_tiled_layout_is_the_spec_index_formula():
    rng = np.random.default_rng(1)
    c, h, w = 16, 3, 5
    chw = rng.standard_normal((c, h, w)).astype(np.float32)
    flat = to_tiled(chw).reshape(-1)
    for ch, y, x in [(0, 0, 0), (9, 2, 4), (15, 1, 3), (7, 0, 2)]:
        assert flat[((y * (c // 8) + ch // 8) * w + x) * 8 + ch % 8] == chw[ch, y, x]
    assert np.array_equal(from_tiled(to_tiled(chw)), chw)


def test_head_is_taconites_sequential_f32_loop():
    rng = np.random.default_rng(2)
    k, n = 1500, 40  # several HEAD_CHUNK blocks and a partial one
    flat = rng.standard_normal(k).astype(np.float32)
    bT = round_bf16(rng.standard_normal((k, n)).astype(np.float32))
    b2 = rng.standard_normal(n).astype(np.float32)
    e = b2.copy()
    for i in range(k):
        e += flat[i] * bT[i]
    assert np.array_equal(head_f32(flat, bT, b2), e)
    # a different order (f64, then rounded) is not bit-equal: the check can tell them apart
    assert not np.array_equal((b2 + flat.astype(np.float64) @ bT).astype(np.float32), e)


@pytest.mark.parametrize(
    ("k", "h", "w", "wp", "icg", "oc"), [(3, 7, 7, 8, 16, 8), (1, 6, 14, 16, 8, 16)]
)
def test_sim_conv_dispatch_equals_torch_conv2d(tmp_path, sim, k, h, w, wp, icg, oc):
    """One dispatch in the documented layouts = torch's conv2d (float64) of the bf16 operands,
    rounded to float32 and then bf16, on the first w output columns."""
    rng = np.random.default_rng(k)
    x = round_bf16(rng.standard_normal((icg, h, w)).astype(np.float32))
    wt = round_bf16(rng.standard_normal((oc, icg, k, k)).astype(np.float32))
    (tmp_path / "x.xclbin").write_bytes(b"placeholder")
    spec = KernelSpec("c", CONV_KIND, tmp_path / "x.xclbin", "MLIR_AIE",
                      conv_insts(k, h, wp, icg, oc, wp))  # fmt: skip
    kernel = sim.load(spec)
    padded = np.zeros((icg, h, wp), np.float32)
    padded[:, :, :w] = x
    bufs = [sim.alloc(n) for n in (h * icg * wp * 2, oc * icg * k * k * 2, oc * h * wp * 2)]
    bufs[0].write(f32_to_bf16(to_tiled(padded)))
    bufs[1].write(f32_to_bf16(pack_conv_weights(wt)))
    sim.run(kernel, bufs)
    got = from_tiled(np.asarray(bufs[2].array(np.uint16, (h, oc // 8, wp, 8)), np.uint16))
    ref = torch.nn.functional.conv2d(
        torch.from_numpy(x[None]).double(), torch.from_numpy(wt).double(), padding=k // 2
    )[0].numpy()
    assert np.array_equal(got[:, :, :w], f32_to_bf16(ref.astype(np.float32)))


def test_export_writes_taconites_record_format(tiny):
    _, _, path = tiny
    b = Bundle.open(path, version=1)
    tags = [r.tag for r in b.records]
    assert tags[0] == "input" and tags[-1] == "head"
    assert set(tags) == {"input", "conv", "affine", "prelu_bias", "bias", "subsample", "add",
                         "head"}  # fmt: skip
    keys = {
        "input": "buf c h w tensor",
        "conv": "in ict h w c0 icg wp oc oh ow owp ctx insts wt out first last",
        "affine": "in c h w scale shift out",
        "prelu_bias": "buf c h w alpha bias",
        "bias": "buf c h w bias",
        "subsample": "in c h w stride out",
        "add": "a b c h w out",
        "head": "in c h w k n bT b2",
    }
    for r in b.records:
        assert list(r.kv) == keys[r.tag].split(), r.text
    convs = list(b.tagged("conv"))
    # input-channel groups: ict 64 in 24 + 24 + 16, accumulated from first=1 to last=1
    groups = [(r.get("c0"), r.get("icg")) for r in convs if r.get("ict") == 64]
    assert groups[:3] == [(0, 24), (3, 24), (6, 16)] == channel_groups(64, 24)
    # 14x14 and 7x7 inputs are padded to widths 16 and 8; the rest are not
    pads = {(r.get("w"), r.get("wp"), r.get("owp")) for r in convs}
    assert pads == {(112, 112, 112), (56, 56, 56), (28, 28, 28), (14, 16, 16), (7, 8, 8)}
    for name in ("ref.npu_embedding", "ref.cpu_embedding", "ref.input_chw"):
        assert b.entry(name).dtype == "f32"
    assert b.entry("ref.input").dtype == "bf16" and b.entry("ref.input").elems == 8 * 112 * 112


def test_bundle_on_sim_matches_torch_and_its_own_records(tiny, sim):
    net, x, path = tiny
    model = AdafaceBundle.load(path, sim)
    assert model.backend() == "sim" and model.model() == "IR-tiny"
    assert model.input_dims() == (8, 112, 112) and model.embed_dim() == 512
    assert model.num_conv_dispatches() == len(list(model.bundle.tagged("conv")))
    recorded = model.embed_recorded()
    # the replay reproduces the exporter's independent CHW model of the NPU numerics exactly
    assert np.array_equal(recorded, model.bundle.f32("ref.npu_embedding"))
    # embed() of the raw input pads, rounds and tiles it into exactly the recorded input
    api = model.embed(x)
    assert api.dtype == np.float32 and api.shape == (512,)
    assert np.array_equal(api, recorded)
    assert np.array_equal(model.embed(x.reshape(-1)), recorded)
    # the torch module in float32 vs the bf16 NPU path
    assert cosine(recorded, _torch(net, x)) >= 0.999
    for seed in (1, 2):
        y = np.random.default_rng(seed).uniform(-1, 1, (3, 112, 112)).astype(np.float32)
        assert cosine(model.embed(y), _torch(net, y)) >= 0.999
    model.close()


def test_embed_rejects_bad_inputs(tiny, sim):
    _, x, path = tiny
    model = AdafaceBundle.load(path, sim)
    with pytest.raises(InputError, match="not a multiple of h\\*w = 12544"):
        model.embed(np.zeros(100, np.float32))
    with pytest.raises(InputError, match="9 channels, but the bundle's stem takes at most 8"):
        model.embed(np.zeros((9, 112, 112), np.float32))
    with pytest.raises(InputError, match="NaN"):
        model.embed(np.full((3, 112, 112), np.nan, np.float32))
    with pytest.raises(InputError, match="not an array of numbers"):
        model.embed("a face")
    # missing stem channels are zero, and explicit zero channels change nothing
    padded = np.concatenate([x, np.zeros((5, 112, 112), np.float32)])
    assert np.array_equal(model.embed(padded), model.embed(x))


def test_check_bundle_passes_and_prints_run_ir18_lines(tiny, sim, capsys):
    _, _, path = tiny
    report = check_bundle(path, sim, reps=2)
    assert report.passed, report.text()
    assert report.recorder_identical and report.api_identical
    assert 0.999 < report.cos_cpu <= 1.0
    text = report.text()
    assert "IR-tiny forward:" in text and "RESULT: MATCH" in text
    assert "cosine(replay, CPU reference)" in text and "simulated device" in text
    assert check_command(path, sim) == 0
    assert "RESULT: MATCH" in capsys.readouterr().out


def _corrupt(src: Path, dst: Path, pattern: str, repl: str, tag: str) -> Path:
    """A copy of the bundle with `pattern` replaced once on the first `tag` record line."""
    shutil.copytree(src, dst)
    lines = (dst / "manifest.txt").read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if line.split()[0] == tag)
    new = re.sub(pattern, repl, lines[i], count=1)
    assert new != lines[i]
    lines[i] = new
    (dst / "manifest.txt").write_text("\n".join(lines) + "\n")
    return dst


@pytest.mark.parametrize(
    ("tag", "pattern", "repl", "message"),
    [
        ("add", r" c=(\d+)", " c=8", r"a is \(\d+, 56, 56\) \(c, h, w\), the step says \(8, 56"),
        ("conv", r" wt=\S+", " wt=no.such.tensor", "tensor no.such.tensor missing from the bundle"),
        ("input", r" c=8", " c=4", "c must be a positive multiple of 8"),
        ("affine", r" in=\d+", " in=999", "in=999 is not a defined buffer here"),
        ("conv", r" icg=\d+", " icg=12", "icg=12 is not a positive multiple of 8"),
        ("conv", r" ctx=\S+", " ctx=nope", "xclbin nope missing from the manifest"),
        ("head", r" k=\d+", " k=5", "k=5 is not the input's c \\* h \\* w"),
        ("bias", r"^bias", "biass", "unknown step biass"),
        (
            "bias",
            r" bias=\S+",
            " bias=ref.input_chw",
            "tensor ref.input_chw is 37632 x F32, wanted 16 x Bf16",
        ),
    ],
)
def test_check_bundle_fails_on_a_corrupt_manifest_naming_the_line(
    tiny, sim, tmp_path, tag, pattern, repl, message
):
    _, _, path = tiny
    bad = _corrupt(path, tmp_path / "bad", pattern, repl, tag)
    with pytest.raises(BundleError, match=r"manifest.txt:\d+: .*" + message):
        AdafaceBundle.load(bad, sim)
    report = check_bundle(bad, sim)
    assert not report.passed and "manifest.txt:" in report.error
    assert "RESULT: FAIL" in report.text()
    assert check_command(bad, sim) == 1


def test_check_bundle_flags_wrong_weights(tiny, sim, tmp_path):
    """Weights that load fine but are wrong: the cosines catch it (MISMATCH, exit 1)."""
    _, _, path = tiny
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    b = Bundle.open(bad, version=1)
    e = b.entry("u1.conv1.wt0")
    b.close()
    with (bad / "tensors.bin").open("r+b") as f:
        f.seek(e.offset)
        f.write(f32_to_bf16(np.full(e.elems, 0.5, np.float32)).tobytes())
    report = check_bundle(bad, sim)
    assert report.error is None and not report.passed
    assert report.cos_cpu < 0.99 and report.cos_recorder < 0.99
    assert "RESULT: MISMATCH" in report.text()


def test_load_checks_step_structure(tiny, sim, tmp_path):
    _, _, path = tiny
    text = (path / "manifest.txt").read_text()
    lines = text.splitlines()

    def variant(name: str, new_lines: list[str]) -> Path:
        d = tmp_path / name
        shutil.copytree(path, d)
        (d / "manifest.txt").write_text("\n".join(new_lines) + "\n")
        return d

    first_input = next(i for i, line in enumerate(lines) if line.startswith("input "))
    head = next(i for i, line in enumerate(lines) if line.startswith("head "))
    cases = {
        "second input step": lines[: first_input + 1] + [lines[first_input]]
        + lines[first_input + 1 :],
        "in=0 is not a defined buffer here": lines[:first_input]
        + lines[first_input + 1 :],
        "last step is not a head": lines[:head],
        "first=0, but no accumulation into it is open": [
            line.replace("first=1", "first=0", 1) if line.startswith("conv ") else line
            for line in lines
        ],
        "version 2, this runtime reads version 1": [
            "version 2" if line.startswith("version") else line for line in lines
        ],
    }  # fmt: skip
    for i, (message, new) in enumerate(cases.items()):
        with pytest.raises(BundleError, match=message):
            AdafaceBundle.load(variant(f"v{i}", new), sim)


def test_context_lru_smaller_than_the_kernel_count_evicts_and_stays_correct(
    tiny, tmp_path, monkeypatch
):
    _, _, path = tiny
    dev = SimDevice(registry_dir=tmp_path / "a")
    model = AdafaceBundle.load(path, dev)
    want = model.embed_recorded()
    n = model.num_conv_kernels()
    assert 4 < n <= 16
    assert dev.stats.loads == n and dev.stats.evict == 0
    model.embed_recorded()  # warm: every context resident, nothing reloads
    assert dev.stats.loads == n and dev.stats.evict == 0
    assert len(dev.resident_contexts()) == n
    dev.close()

    monkeypatch.setenv("TACONITE_CTX_CACHE", "3")
    small = SimDevice(registry_dir=tmp_path / "b")
    model = AdafaceBundle.load(path, small)
    for _ in range(2):
        assert np.array_equal(model.embed_recorded(), want)
        assert len(small.resident_contexts()) <= 3
    assert small.stats.evict > 0 and small.stats.loads > n
    small.close()


def test_full_hwctx_table_is_shared_with_other_users(tiny, tmp_path):
    """A machine-wide table of only 2 contexts (as if other processes held the rest) under the
    default cap of 16: creation fails like CREATE_HWCTX, the LRU evicts and retries
    (docs/adaface-bundle.md), and the forward is still exact."""
    _, _, path = tiny
    dev = SimDevice(registry_dir=tmp_path / "hw", hwctx_limit=2)
    model = AdafaceBundle.load(path, dev)
    out = model.embed_recorded()
    assert np.array_equal(out, model.bundle.f32("ref.npu_embedding"))
    assert dev.stats.evict > 0 and len(dev.resident_contexts()) <= 2
    dev.close()


def test_exporter_refuses_bad_groups(tmp_path):
    from npu.models.adaface.export import ExportError

    net = tiny_ir(seed=0, stem=8, widths=(8, 16, 24, 32))
    sd = {k: v.numpy() for k, v in net.state_dict().items()}
    x = np.zeros((3, 112, 112), np.float32)
    with pytest.raises(ExportError, match="max_icg=12"):
        export_bundle(sd, tmp_path / "b", x, max_icg=12)
    with BundleWriter(tmp_path / "taken", version=1):
        pass
    with pytest.raises(BundleError, match="already holds a bundle"):
        export_bundle(sd, tmp_path / "taken", x)


def test_conv_dispatches_go_through_the_xrt_device_protocol(tiny, tmp_path, monkeypatch):
    """On XrtDevice (over the recording fake pyxrt, which computes nothing): one launch per
    `conv` record with opcode 3, the record's instruction stream and (input, weights, output)
    BOs sized as docs/adaface-bundle.md says; one hardware context per distinct kernel, created
    once."""
    import importlib.util
    import sys

    from npu import xrt

    spec = importlib.util.spec_from_file_location(
        "fake_pyxrt", Path(__file__).parents[1] / "fake_pyxrt.py"
    )
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    fake.reset()
    monkeypatch.setitem(sys.modules, "pyxrt", fake)
    monkeypatch.delenv("TACONITE_CTX_CACHE", raising=False)
    node = tmp_path / "accel0"
    node.write_bytes(b"")
    dev = xrt.XrtDevice(str(node))
    _, _, path = tiny
    model = AdafaceBundle.load(path, dev)
    assert model.backend() == "npu"
    out = model.embed_recorded()
    model.embed_recorded()
    assert out.shape == (512,) and out.dtype == np.float32
    convs = list(model.bundle.tagged("conv"))
    assert len(fake.of("start")) == 2 * len(convs)
    assert len(fake.of("hw_context")) == model.num_conv_kernels()
    args = {}
    for call in fake.of("set_arg"):
        args.setdefault(call[1], {})[call[2]] = call[3:]
    for run_args in args.values():
        assert run_args[0] == ("int", 3) and run_args[2] == ("int", 7 * 4)
        assert [run_args[i][0] for i in (3, 4, 5)] == ["bo", "bo", "bo"] and 6 not in run_args
    sizes = {c[1] for c in fake.of("bo")}
    first = convs[0]
    h, icg, wp, oc = (first.get(k) for k in ("h", "icg", "wp", "oc"))
    assert {h * icg * wp * 2, oc * icg * 9 * 2, oc * h * wp * 2} <= sizes
    model.close()
    dev.close()


@pytest.mark.slow
def test_ir18_shaped_network_on_sim(tmp_path):
    """IR-18's shapes (stem 64, widths 64..512, two units per stage, random weights): 61
    dispatches over 12 distinct kernels (groups of 64), the replay bit-identical to the
    recorder and within cosine 0.999 of torch; the warm forward reloads nothing."""
    net = tiny_ir(seed=5, stem=64, widths=(64, 128, 256, 512), units=(2, 2, 2, 2))
    x = np.random.default_rng(0).uniform(-1, 1, (3, 112, 112)).astype(np.float32)
    sd = {k: v.numpy() for k, v in net.state_dict().items()}
    path = export_bundle(sd, tmp_path / "ir18", x, model="IR-18")
    dev = SimDevice(registry_dir=tmp_path / "hw")
    model = AdafaceBundle.load(path, dev)
    assert (model.num_conv_dispatches(), model.num_conv_kernels()) == (61, 12)
    out = model.embed_recorded()
    assert np.array_equal(out, model.bundle.f32("ref.npu_embedding"))
    assert cosine(out, _torch(net, x)) >= 0.999
    model.embed_recorded()
    assert dev.stats.loads == 12 and dev.stats.evict == 0
    dev.close()


def test_export_cli_from_a_cvlface_dir(tmp_path, sim, capsys):
    from adaface_torch_ref import save_cvlface_dir

    from npu.models.adaface.export import main

    net = tiny_ir(seed=4, stem=8, widths=(8, 16, 24, 32))
    model_dir = save_cvlface_dir(net, tmp_path / "m", name="IR-cli")
    x = np.random.default_rng(5).uniform(-1, 1, (3, 112, 112)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    argv = [str(model_dir), str(tmp_path / "b"), "--input", str(tmp_path / "x.npy")]
    assert main([*argv, "--max-icg", "16"]) == 0
    report = check_bundle(tmp_path / "b", sim)
    assert report.passed and report.model == "IR-cli"
    assert np.array_equal(Bundle.open(tmp_path / "b").f32("ref.input_chw").reshape(x.shape), x)
    assert main([str(tmp_path / "nowhere"), str(tmp_path / "c")]) == 2
    assert "no such model directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("pattern", "repl", "message"),
    [
        (r" wp=\d+", " wp=100000000", "wp=100000000 is not in w..w\\+63"),
        (r" oh=\d+", " oh=999", "oh=999, ow=112 must be in 1..h, 1..w"),
        (r" first=1", " first=2", "`first=2` is not 0 or 1"),
        (r" out=\d+", " out=4294967296", "`out=4294967296` is malformed"),
    ],
)
def test_conv_record_bounds(tiny, sim, tmp_path, pattern, repl, message):
    _, _, path = tiny
    bad = _corrupt(path, tmp_path / "bad", pattern, repl, "conv")
    with pytest.raises(BundleError, match=r"manifest.txt:\d+: .*" + message):
        AdafaceBundle.load(bad, sim)


def test_check_needs_the_cpu_reference_and_reads_nreps(tiny, sim, tmp_path, monkeypatch, capsys):
    from npu.models.adaface.check import reps_from_env

    _, _, path = tiny
    for name, passes in (("ref.npu_embedding", True), ("ref.cpu_embedding", False)):
        d = tmp_path / name
        shutil.copytree(path, d)
        table = (d / "tensors.txt").read_text().splitlines()
        (d / "tensors.txt").write_text(
            "".join(f"{t}\n" for t in table if not t.startswith(name + " "))
        )
        report = check_bundle(d, sim)
        assert report.passed is passes and report.error is None, report.text()
        assert f"n/a ({name} not in the bundle)" in report.text()
    assert "RESULT: FAIL (no ref.cpu_embedding" in report.text()
    assert [reps_from_env({"NREPS": v}) for v in ("3", "+2", "0", "x", "")] == [3, 2, 1, 1, 1]
    monkeypatch.setenv("NREPS", "2")
    assert check_command(path, sim) == 0
    assert "mean of 1 reps" in capsys.readouterr().out


def _torch_conv64(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """float64 'same' conv of x [ic, h, w] by w [oc, ic, k, k] (both already bf16 values)."""
    return torch.nn.functional.conv2d(
        torch.from_numpy(x.astype(np.float64))[None],
        torch.from_numpy(w.astype(np.float64)),
        padding=w.shape[-1] // 2,
    )[0].numpy()


def test_each_group_partial_is_rounded_to_bf16_before_the_f32_sum(tmp_path, sim):
    """docs/adaface-bundle.md §3's rounding rules, against torch float64 convs: a conv over two
    input-channel groups rounds each group's partial to bf16 and sums them in f32 (not one
    rounding of the full sum), and prelu_bias rounds twice. An identity head hands back the last
    activation exactly, so the whole [16, 8, 8] buffer is compared bit for bit."""
    rng = np.random.default_rng(7)
    w1 = rng.normal(0, 0.3, (16, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (16, 16, 3, 3)).astype(np.float32)
    alpha = rng.uniform(0, 0.5, 16).astype(np.float32)
    bias = rng.normal(0, 0.3, 16).astype(np.float32)
    k = 16 * 8 * 8
    steps = [
        Conv("input", "a", "c1", w1),
        PreluBias("a", alpha, bias),
        Conv("a", "b", "c2", w2),
        Head("b", np.eye(k, dtype=np.float32), np.zeros(k, np.float32)),
    ]
    x = rng.uniform(-1, 1, (3, 8, 8)).astype(np.float32)
    path = export_bundle(IrProgram("two-groups", (), (), steps), tmp_path / "b", x, max_icg=8)
    model = AdafaceBundle.load(path, sim)
    assert model.num_conv_dispatches() == 1 + 2
    got = model.embed(x).reshape(16, 8, 8)

    def bf(v: np.ndarray) -> np.ndarray:  # a float64 result as the device rounds it
        return round_bf16(np.asarray(v, np.float32))

    xin = round_bf16(np.concatenate([x, np.zeros((5, 8, 8), np.float32)]))
    w1p = round_bf16(np.concatenate([w1, np.zeros((16, 5, 3, 3), np.float32)], 1))
    c1 = bf(_torch_conv64(xin, w1p))  # one group: one rounding
    b = round_bf16(bias)[:, None, None]
    al = round_bf16(alpha)[:, None, None]
    t = round_bf16(c1 + b)
    a = round_bf16(np.where(t < 0, al * t, t))
    a_once = round_bf16(np.where(c1 + b < 0, al * (c1 + b), c1 + b))
    w2b = round_bf16(w2)

    def second_conv(act: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p0, p1 = _torch_conv64(act[:8], w2b[:, :8]), _torch_conv64(act[8:], w2b[:, 8:])
        return round_bf16(bf(p0) + bf(p1)), bf(p0 + p1)

    per_group, one_rounding = second_conv(a)
    assert np.array_equal(got, per_group)
    assert np.mean(per_group != one_rounding) > 0.05  # the rules are distinguishable here
    assert np.mean(got != second_conv(a_once)[0]) > 0.01  # and prelu_bias's two roundings


def test_the_simulator_refuses_a_hardware_conv_kernel(tiny, sim, tmp_path):
    """An IRON bundle's instruction streams and packed weights are not the simulator's: the
    first dispatch fails with a DeviceError naming the manifest line (or the kernel), never a
    wrong embedding."""
    _, _, path = tiny
    hw = tmp_path / "hw"
    shutil.copytree(path, hw)
    first = next(Bundle.open(hw).tagged("conv"))
    (hw / first.value("insts")).write_bytes(np.arange(16, dtype="<u4").tobytes())
    model = AdafaceBundle.load(hw, sim)
    with pytest.raises(DeviceError, match=rf"^manifest.txt:{first.line}: not a simulator conv"):
        model.embed_recorded()
    model.close()

    small = tmp_path / "small"
    shutil.copytree(path, small)
    table = (small / "tensors.txt").read_text().splitlines()
    wt = first.value("wt")
    for i, line in enumerate(table):  # the first dispatch's weights, cut to 100 values
        name, dtype, _, offset, _ = line.split()
        if name == wt:
            table[i] = f"{name} {dtype} 100 {offset} 200"
    (small / "tensors.txt").write_text("\n".join(table) + "\n")
    model = AdafaceBundle.load(small, sim)
    with pytest.raises(DeviceError, match=rf"{first.value('ctx')}: argument 1 is 200 bytes"):
        model.embed_recorded()
    model.close()


def test_embedder_interface_matches_the_cpu_model(tmp_path, sim):
    """The bundle and the cpu model of the same cvlface dir answer the embedder interface the
    gallery reads alike (methods on both), so a gallery enrolled on one identifies on the
    other; the colour order travels in npucam's colour_order param (rgb when absent)."""
    from adaface_torch_ref import save_cvlface_dir

    from npu.models.adaface.export import export_pretrained

    net = tiny_ir(seed=8, stem=8, widths=(8, 16, 24, 32))
    model_dir = save_cvlface_dir(net, tmp_path / "m", name="IR-x", color_space="BGR")
    cpu = load_adaface(model_dir)
    bundle = AdafaceBundle.load(export_pretrained(model_dir, tmp_path / "b", max_icg=16), sim)
    for method in ("embed_dim", "model", "colour_order", "fingerprint"):
        assert getattr(bundle, method)() == getattr(cpu, method)(), method
    assert (cpu.backend(), bundle.backend()) == ("cpu", "sim")
    assert cpu.colour_order() == "bgr" and cpu.fingerprint().startswith("IR-x:")
    bundle.close()

    lines = (tmp_path / "b" / "manifest.txt").read_text().splitlines()
    for name, param, expect in (("none", None, "rgb"), ("bad", "param colour_order xyz", None)):
        d = tmp_path / name
        shutil.copytree(tmp_path / "b", d)
        kept = [ln for ln in lines if not ln.startswith("param colour_order")]
        (d / "manifest.txt").write_text("\n".join(kept + ([param] if param else [])) + "\n")
        if expect:
            assert AdafaceBundle.load(d, sim).colour_order() == expect
        else:
            with pytest.raises(BundleError, match="param colour_order must be RGB or BGR"):
                AdafaceBundle.load(d, sim)


def test_finding_10_adaface_check_decides_on_the_cpu_cosine_only(tiny, sim, tmp_path):
    """taconite's cli_run prints every cosine but decides MATCH on cos(replay, CPU reference)
    > 0.99 alone; npucam failed a bundle whose recorder embedding disagreed."""
    from npu.bundle import Bundle

    _, _, path = tiny
    d = tmp_path / "recorder_off"
    shutil.copytree(path, d)
    with Bundle.open(d) as b:
        e = b.entry("ref.npu_embedding")
        flipped = -b.f32("ref.npu_embedding").reshape(-1)
    with open(d / "tensors.bin", "r+b") as f:
        f.seek(e.offset)
        f.write(flipped.astype("<f4").tobytes())
    report = check_bundle(d, sim)
    assert report.cos_recorder < 0 and report.cos_cpu > 0.99
    assert report.passed, report.text()
    assert "RESULT: MATCH (cosine(replay, CPU reference) > 0.99" in report.text()
