"""stages.runtimes: what each model tells the scheduler, its host glue against the functions it
must equal (crop_persons on the RGB frame, embedder_input, ClipModel.pixels), padding to the
export size with padded slots marked and never carrying an output, per-job failures, and the
load rules (explicit backend, synthetic only when allowed, errors naming the config key).
"""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest

from npu.models import ModelLoadError, npu2_work, spec, synthetic
from npu.models.adaface import synthetic as ada_synthetic
from npu.models.adaface.preprocess import embedder_input
from npu.models.clip import synthetic as clip_synthetic
from npu.models.loading import ModelSource
from npu.models.sapiens2.preprocess import crop_persons
from npu.sim import SimDevice
from npu.sim_cost import NPU2
from pipeline.messages import now_ns
from stages.infer import _measured_cost
from stages.models.adaface.job import FaceJob
from stages.models.clip.job import ClipJob
from stages.models.clip.runtime import ClipOptions
from stages.models.sapiens2.job import PoseJob
from stages.runtimes import JobInputError, Pacing, open_runtime

SYN = ModelSource(synthetic=True, where="stage infer: m")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("synthetic-cache")


@pytest.fixture(scope="module")
def device(tmp_path_factory):
    dev = SimDevice(registry_dir=tmp_path_factory.mktemp("hwctx"))
    yield dev
    dev.close()


@pytest.fixture(scope="module")
def sim_runtimes(cache, device):
    return {
        name: open_runtime(
            name,
            "sim",
            SYN,
            device=device,
            options=ClipOptions(labels=["a person", "a car"]) if name == "clip" else None,
            synthetic_cache=cache,
        )
        for name in ("sapiens2", "adaface", "clip")
    }


def frame(seed: int = 0, h: int = 120, w: int = 160) -> np.ndarray:
    """A BGR frame whose channels differ (so a colour swap shows)."""
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    img[..., 0] //= 4  # little blue, so BGR != RGB
    return img


def _ids(seq: int) -> dict:
    t = now_ns()
    return dict(camera="cam", seq=seq, capture_ts_ns=t, deadline_ns=t + 10**10)


def pose_job(seq: int = 0, box=(30, 20, 50, 90)) -> PoseJob:
    return PoseJob(
        **_ids(seq), track_id=seq, box_xywh=np.array(box, np.float32), score=0.9, image=frame(seq)
    )


def face_job(seq: int = 0, aligned: bool = True) -> FaceJob:
    return FaceJob(
        **_ids(seq),
        box_xywh=np.zeros(4, np.float32),
        score=0.9,
        landmarks=np.zeros((5, 2), np.float32),
        aligned=frame(seq, 112, 112) if aligned else None,
    )


def clip_job(seq: int = 0, box=(10, 10, 100, 80)) -> ClipJob:
    return ClipJob(**_ids(seq), box_xywh=np.array(box, np.float32), image=frame(seq))


def test_profiles_from_bundles(sim_runtimes):
    pose, face, clip = (sim_runtimes[n] for n in ("sapiens2", "adaface", "clip"))
    assert (pose.batch_size, face.batch_size, clip.batch_size) == (1, 1, 4)
    assert all(rt.backend == "sim" and rt.synthetic for rt in sim_runtimes.values())
    # AdaFace uses one context per distinct conv kernel; models never share a context
    assert len(face.contexts) == face.model.num_conv_kernels()
    # Sapiens2: one xclbin per GEMM K (512, 1024) and the attention's, as the 0.4b bundle's
    # contexts; CLIP: the GEMM xclbin record, and the MHA and AddLN ops that name theirs
    assert len(pose.contexts) == 3 and len(clip.contexts) == 3
    keys = [set(rt.contexts) for rt in sim_runtimes.values()]
    assert not (keys[0] & keys[1]) and not (keys[0] & keys[2]) and not (keys[1] & keys[2])
    assert pose.warm_up() > 0


@pytest.mark.parametrize(
    ("name", "released", "seconds"),
    [("sapiens2", "sapiens2-0.4b", 2.4), ("adaface", "adaface-ir101", 0.5),
     ("clip", "clip-vit-h-14", 0.76)],
)  # fmt: skip
def test_a_paced_stand_in_takes_the_released_models_npu2_time(
    cache, tmp_path, name, released, seconds
):
    dev = SimDevice(sleep=True, registry_dir=tmp_path / "hwctx")
    options = ClipOptions(labels=["a person"]) if name == "clip" else None
    rt = open_runtime(
        name, "sim", SYN, device=dev, options=options, synthetic_cache=cache, pacing=Pacing()
    )
    assert rt.synthetic and rt.pacing == f"npu2 as {released}"
    work = npu2_work(name, spec(name).stands_in_for)
    assert rt.contexts == work.contexts  # the scheduler sees the real model's contexts
    before = dev.sim.paced_s
    t0 = time.perf_counter()
    device_s = rt.warm_up()
    wall = time.perf_counter() - t0
    modelled = dev.sim.paced_s - before
    # the pass is the released model's (its contexts already resident from the label pass
    # for CLIP; loaded for the others: a few ms more), in wall time as in device seconds:
    # the device seconds the runtime reports span the paced sleep, inside the call's wall
    assert NPU2.pass_s(work.passes["forward"]) <= modelled < seconds * 1.05 + 0.06
    assert modelled == pytest.approx(seconds, rel=0.05, abs=0.05)
    # wall-clock-ok: an invariant (the reported seconds lie inside the call), not a bound
    assert modelled <= device_s <= wall
    dev.close()


def test_a_paced_first_pass_stretched_by_one_time_host_work_is_measured_again(cache, tmp_path):
    # a fresh install compiles the host kernels on the first pass: its wall time is not what
    # the model costs, and the scheduler would refuse every job that cannot wait that long
    dev = SimDevice(sleep=True, registry_dir=tmp_path / "hwctx")
    rt = open_runtime("adaface", "sim", SYN, device=dev, synthetic_cache=cache, pacing=Pacing())
    forward, calls = rt.forward, []

    def first_slow(inputs):
        calls.append(len(calls))
        if len(calls) == 1:
            time.sleep(1.0)  # one-time host work, past the 0.5 s paced pass
        return forward(inputs)

    rt.forward = first_slow
    cost = _measured_cost(rt)
    assert len(calls) == 2 and cost == pytest.approx(0.5, rel=0.05, abs=0.05)
    rt.forward = forward
    assert _measured_cost(rt) == pytest.approx(0.5, rel=0.05, abs=0.05)  # one pass suffices
    assert len(calls) == 2
    dev.close()


def test_pace_as_picks_another_released_variant_and_stand_in_keeps_own_rates(cache, tmp_path):
    dev = SimDevice(registry_dir=tmp_path / "hwctx")
    rt = open_runtime(
        "adaface", "sim", SYN, device=dev, synthetic_cache=cache,
        pacing=Pacing(pace_as={"adaface": "ir18"}),
    )  # fmt: skip
    before = dev.sim.paced_s
    rt.warm_up()
    assert rt.pacing == "npu2 as adaface-ir18"
    assert dev.sim.paced_s - before == pytest.approx(0.2, rel=0.05, abs=0.05)
    own = open_runtime("adaface", "sim", SYN, device=dev, synthetic_cache=cache)
    paced, dispatched = dev.sim.paced_s, dev.sim.dispatch_s
    own.warm_up()
    assert own.pacing == "stand-in" and own.contexts != rt.contexts
    assert dev.sim.paced_s == paced and dev.sim.dispatch_s > dispatched
    with pytest.raises(ModelLoadError, match="no released variant 'ir50'"):
        open_runtime(
            "adaface", "sim", SYN, device=dev, synthetic_cache=cache,
            pacing=Pacing(pace_as={"adaface": "ir50"}),
        )  # fmt: skip
    dev.close()


def test_cpu_runtimes_have_no_contexts(cache):
    rt = open_runtime("adaface", "cpu", SYN, synthetic_cache=cache)
    assert rt.contexts == () and rt.backend == "cpu" and rt.batch_size == 1


def test_pose_glue_crops_the_rgb_frame(sim_runtimes):
    rt = sim_runtimes["sapiens2"]
    job = pose_job(3)
    p = rt.prepare([job])
    cfg = rt.model.config
    want, windows = crop_persons(
        job.image[..., ::-1].copy(), job.box_xywh[None], output_size=(cfg.H, cfg.W)
    )
    np.testing.assert_array_equal(p.inputs[0], want[0])
    np.testing.assert_array_equal(p.aux[0], windows[0])
    bgr, _ = crop_persons(job.image, job.box_xywh[None], output_size=(cfg.H, cfg.W))
    assert not np.allclose(p.inputs[0], bgr[0])
    ran = rt.run(p)
    assert len(ran.outputs) == 1 and ran.outputs[0].output.shape == (308, 64, 48)
    np.testing.assert_array_equal(ran.outputs[0].aux, windows[0])


def test_face_glue_in_the_models_colour_order(sim_runtimes):
    rt = sim_runtimes["adaface"]
    job = face_job(1)
    p = rt.prepare([job])
    np.testing.assert_array_equal(p.inputs[0], embedder_input(job.aligned, "bgr", "rgb"))
    out = rt.run(p).outputs[0]
    assert out.output.shape == (512,) and not out.padded
    np.testing.assert_array_equal(out.output, rt.model.embed(p.inputs[0]))


def test_clip_pads_to_four_and_never_outputs_padding(sim_runtimes):
    rt = sim_runtimes["clip"]
    job = clip_job(2)
    p = rt.prepare([job])
    assert p.inputs.shape == (4, 3, 224, 224) and p.mask == (True, False, False, False)
    want = rt.model.pixels([job.image[10:90, 10:110, ::-1].copy()])[0]
    np.testing.assert_array_equal(p.inputs[0], want)
    ran = rt.run(p)
    assert [s.padded for s in ran.outputs] == [False, True, True, True]
    assert [s.output is None for s in ran.outputs] == [False, True, True, True]
    alone = rt.model.encode_images(p.inputs)[0]
    np.testing.assert_array_equal(ran.outputs[0].output, alone)
    extra = rt.extra()
    assert extra["labels"] == ["a person", "a car"]
    assert extra["text_embeds"].shape == (2, 64) and extra["logit_scale"] > 1
    with pytest.raises(JobInputError, match="5 jobs for a batch of 4"):
        rt.prepare([clip_job(i) for i in range(5)])


def test_one_bad_job_fails_alone(sim_runtimes):
    rt = sim_runtimes["clip"]
    jobs = [clip_job(0, box=(500, 500, 10, 10)), clip_job(1), pose_job(2)]
    p = rt.prepare(jobs)
    assert set(p.failed) == {0, 2} and p.mask == (False, True, False, False)
    assert "outside the 160x120 frame" in str(p.failed[0])
    assert "PoseJob sent to clip" in str(p.failed[2])
    ran = rt.run(p)
    assert ran.outputs[1].output is not None and ran.outputs[1].error is None
    assert ran.outputs[0].output is None and ran.outputs[0].error is p.failed[0]
    face = sim_runtimes["adaface"].prepare([face_job(0, aligned=False)])
    assert "was not aligned" in str(face.failed[0])


def test_missing_path_without_synthetic_names_the_key(tmp_path):
    src = ModelSource(bundle=str(tmp_path / "nope"), where="stage infer: sapiens2")
    with pytest.raises(ModelLoadError, match=r"sapiens2\.bundle = .*nope does not exist"):
        open_runtime("sapiens2", "sim", src)
    with pytest.raises(ModelLoadError, match=r"adaface\.checkpoint is not set"):
        open_runtime("adaface", "cpu", ModelSource(where="stage infer: adaface"))


def test_synthetic_is_never_used_on_npu(cache):
    with pytest.raises(ModelLoadError, match="synthetic models have no hardware bundle"):
        open_runtime("clip", "npu", SYN, options=ClipOptions(labels=["x"]), synthetic_cache=cache)


def unmarked(path, dest):
    """A copy of a synthetic model directory without its SYNTHETIC marker: a "real" model
    as far as npucam can tell (a bundle or checkpoint from elsewhere)."""
    shutil.copytree(path, dest, ignore=shutil.ignore_patterns(synthetic.MARKER))
    return dest


def test_real_bundle_is_preferred_to_synthetic(tmp_path, cache, device):
    path = unmarked(synthetic.bundle_path("sapiens2", cache), tmp_path / "sapiens2-real")
    rt = open_runtime(
        "sapiens2", "sim", ModelSource(bundle=str(path), synthetic=True), device=device
    )
    assert not rt.synthetic and rt.model_id == path.name


def test_synthetic_weights_named_by_their_path_are_still_labelled_synthetic(cache, device):
    path = synthetic.bundle_path("sapiens2", cache)
    rt = open_runtime("sapiens2", "sim", ModelSource(bundle=str(path)), device=device)
    assert rt.synthetic and rt.model_id == path.name  # loaded from the path, marked


def test_real_checkpoints_and_bundles_load_on_their_backends(tmp_path, cache, device):
    from safetensors.numpy import save_file

    # an HF CLIPModel directory
    clip_dir = unmarked(clip_synthetic.checkpoint_path(cache), tmp_path / "clip-hf")
    rt = open_runtime(
        "clip", "cpu", ModelSource(checkpoint=str(clip_dir)), options=ClipOptions(labels=["a dog"])
    )
    assert (rt.backend, rt.synthetic, rt.batch_size, rt.contexts) == ("cpu", False, 4, ())
    face_dir = tmp_path / "adaface"  # a cvlface-style directory
    face_dir.mkdir()
    save_file(ada_synthetic.state_dict(), str(face_dir / "model.safetensors"))
    (face_dir / "config.json").write_text('{"name": "IR-test", "units": [1, 1, 1, 1]}')
    rt = open_runtime("adaface", "cpu", ModelSource(checkpoint=str(face_dir)))
    # the id a gallery records: the model's name and its head's digest
    assert rt.model_id == rt.model.fingerprint() and rt.model_id.startswith("IR-test:")
    assert not rt.synthetic
    for name in ("adaface", "clip"):
        bundle = unmarked(synthetic.bundle_path(name, cache), tmp_path / f"{name}-bundle")
        options = ClipOptions(labels=["x"]) if name == "clip" else None
        rt = open_runtime(
            name, "sim", ModelSource(bundle=str(bundle)), device=device, options=options
        )
        assert rt.backend == "sim" and not rt.synthetic and rt.contexts


def test_a_job_whose_glue_raises_any_error_fails_alone_naming_its_camera(sim_runtimes):
    # A degenerate frame (grayscale, no channel axis) makes the CLIP glue raise a plain
    # IndexError, not an NpucamError: only that job fails; the other three of the batch run.
    rt = sim_runtimes["clip"]
    bad = clip_job(1)
    bad.camera = "gray-cam"
    bad.image = bad.image[..., 1].copy()
    jobs = [clip_job(0), bad, clip_job(2), clip_job(3)]
    p = rt.prepare(jobs)
    assert set(p.failed) == {1} and p.mask == (True, False, True, True)
    assert isinstance(p.failed[1], JobInputError)
    assert "'gray-cam' #1" in str(p.failed[1])
    ran = rt.run(p)
    assert [s.output is None for s in ran.outputs] == [False, True, False, False]
    assert ran.outputs[1].error is p.failed[1]
    for i in (0, 2, 3):
        want = rt.model.pixels([jobs[i].image[10:90, 10:110, ::-1].copy()])[0]
        np.testing.assert_array_equal(p.inputs[i], want)
