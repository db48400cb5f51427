"""The shipped configs as a user runs them (`npucam run`, a SUB socket on the published
endpoint): the demo publishes det, pose, face and clip messages for both sample cameras;
multicam-pose and face-kiosk validate and run briefly on the simulated NPU; the kiosk's
documented enrol command works on a fresh clone; split-capture + split-infer run the NPU
stage on the received frames and keep the sender's seq."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import zmq

from npu.models.sapiens2.keypoints import NAMES as KEYPOINTS
from pipeline import wire
from stages.record.frame_log import read_index
from tests.pacing import PACINGS, set_pacing

pytestmark = pytest.mark.heavy  # a whole pipeline run (tests/conftest.py)

REPO = Path(__file__).resolve().parents[1]
NPUCAM = Path(sys.executable).parent / "npucam"


def on_free_ports(tmp_path: Path, *names: str) -> tuple[list[str], dict[int, int]]:
    """Copies of configs/<name> in tmp_path/configs with each loopback port moved to a free
    one (the same one in every copy, so split-capture still feeds split-infer): parallel
    workers and other runs on the machine never meet on a shipped port. Their relative
    bundle and gallery paths find nothing there, as on a fresh clone. (paths, {old: new})."""
    texts = {n: (REPO / "configs" / n).read_text() for n in names}
    ports: dict[int, int] = {}
    for text in texts.values():
        for old in map(int, re.findall(r"tcp://127\.0\.0\.1:(\d+)", text)):
            if old not in ports:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    ports[old] = s.getsockname()[1]
    (tmp_path / "configs").mkdir(exist_ok=True)
    paths = []
    for name, text in texts.items():
        text = re.sub(
            r"tcp://127\.0\.0\.1:(\d+)", lambda m: f"tcp://127.0.0.1:{ports[int(m[1])]}", text
        )
        (tmp_path / "configs" / name).write_text(text)
        paths.append(str(tmp_path / "configs" / name))
    return paths, ports


def run_and_collect(config: str, endpoint: str, duration: float, grace: float = 60.0, until=None):
    """Run `npucam run config --duration`, SUBscribed to everything on endpoint; with `until`
    (a predicate of the collected {kind: {camera: [headers]}}) SIGTERM it as soon as that
    holds, so how long a loaded host takes to warm the models up does not decide what
    arrives (`duration` is then only the longest run).
    Returns (returncode, stderr, {kind: {camera: [headers]}}, {kind: [(header, arrays)]})."""
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    proc = subprocess.Popen(
        [str(NPUCAM), "run", config, "--duration", str(duration)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    got: dict = defaultdict(lambda: defaultdict(list))
    arrays: dict = defaultdict(list)
    try:
        end = time.monotonic() + duration + grace
        while time.monotonic() < end and proc.poll() is None:
            if sub.poll(200):
                msg = wire.decode(sub.recv_multipart())
                got[msg.header["kind"]][msg.header["camera"]].append(msg.header)
                arrays[msg.header["kind"]].append((msg.header, msg.arrays))
                if until is not None and until(got):
                    proc.send_signal(signal.SIGTERM)
                    until = None
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        sub.close()
        ctx.term()
    return proc.returncode, err, got, arrays


@pytest.mark.slow
def test_demo_publishes_det_pose_face_and_clip_for_both_cameras():
    code, err, got, arrays = run_and_collect(
        "configs/demo.toml", "tcp://127.0.0.1:5560", duration=20
    )
    assert code == 0, err
    for kind in ("det", "pose", "face", "clip"):
        assert set(got[kind]) == {"bikes", "carphone"}, f"{kind}: {dict(got[kind])}\n{err}"
    for kind in ("pose", "face", "clip"):
        for headers in got[kind].values():
            for h in headers:
                if h.get("live"):  # the per-frame pose: MediaPipe's real weights, on the CPU
                    assert h["model"] == "mediapipe-landmarks" and h["synthetic"] is False, h
                else:  # no bundles here: the synthetic models, and they say so
                    assert h["synthetic"] is True and h["backend"] == "sim", h
    assert any(not h.get("live") for hs in got["pose"].values() for h in hs), "no Sapiens2 pose"
    assert "SYNTHETIC" in err
    for h in (h for hs in got["det"].values() for h in hs):
        # persons followed by the per-frame pose's landmark tracker (detect's `live` on)
        assert h["model"] == "mediapipe-landmarks+blazeface-short" and not h["synthetic"]
        assert len(h["track_ids"]) == h["count"] == len(h["labels"])
    for h in (h for hs in got["pose"].values() for h in hs):
        assert isinstance(h["track_id"], int) and h["count"] == 308 and h["age_ms"] >= 0
    for _, a in arrays["pose"]:
        assert a["keypoints"].shape == (308, 3) and a["keypoints"].dtype == np.float32
    for _, a in arrays["face"]:
        assert a["embedding"].shape == (512,)
        assert abs(float(np.linalg.norm(a["embedding"])) - 1) < 1e-5
    assert_faces_carry_their_person_track(arrays)
    for h, a in arrays["clip"]:
        assert abs(float(a["probabilities"].sum()) - 1) < 1e-5
        assert h["top_label"] in h["labels"]


@pytest.mark.parametrize(
    "config",
    [
        "configs/multicam-pose.toml",
        "configs/face-kiosk.toml",
        "tests/standin_rig/multicam-3d.toml",
        "configs/studio-3d.toml",
        "configs/studio-3d-multi.toml",
    ],
)
def test_configs_validate(config):
    out = subprocess.run(
        [str(NPUCAM), "validate", config], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "ok" in out.stdout


@pytest.mark.parametrize("pacing", PACINGS)
def test_multicam_pose_runs_briefly_on_sim_with_det_for_4_cameras_and_tracked_poses(
    tmp_path, pacing
):
    (config,), ports = on_free_ports(tmp_path, "multicam-pose.toml")
    set_pacing(Path(config), pacing)
    code, err, got, arrays = run_and_collect(
        config,
        f"tcp://127.0.0.1:{ports[5561]}",
        duration=90,
        until=lambda got: len(got["det"]) == 4 and sum(map(len, got["pose"].values())) >= 2,
    )
    assert code == 0, err
    assert set(got["det"]) == {"bikes", "carphone", "bunny", "bikes2"}, err
    assert got["pose"], f"no pose message\n{err}"
    assert "face" not in got and "clip" not in got
    for hs in got["pose"].values():
        assert all(isinstance(h["track_id"], int) and h["synthetic"] for h in hs)
    assert all(a["keypoints"].shape == (308, 3) for _, a in arrays["pose"])


def test_studio_3d_runs_the_pose2sim_demo_rig_with_det_for_4_cameras_and_pose3d(tmp_path):
    """The real views and calibration of Pose2Sim's demo, every group posed by the per-frame
    pose (real weights): the lab's one person in 3D, body keypoints triangulated, and the
    ANNY body fitted to them."""
    (config,), ports = on_free_ports(tmp_path, "studio-3d.toml")
    text = Path(config).read_text().replace('"../.cache/', f'"{REPO}/.cache/')
    Path(config).write_text(text)
    code, err, got, arrays = run_and_collect(
        config,
        f"tcp://127.0.0.1:{ports[5564]}",
        duration=120,
        until=lambda got: (
            len(got["det"]) == 4
            and sum(h["count"] for h in got["pose3d"].get("studio", [])) >= 6
            and sum(h["count"] for h in got["body"].get("studio", [])) >= 3
        ),
    )
    assert code == 0, err
    assert set(got["det"]) == {"cam01", "cam02", "cam03", "cam04"}, err
    people, widths = [], []  # people per group; hip to hip (m) where both are triangulated
    hips = [KEYPOINTS.index(n) for n in ("left_hip", "right_hip")]
    for h, a in arrays["pose3d"]:
        assert h["rig"] == "studio" and h["cameras"] == ["cam01", "cam02", "cam03", "cam04"]
        assert a["points"].shape == (h["count"], 308, 4)
        people.append(h["count"])
        if h["count"]:
            xyz = a["points"][0, hips, :3]
            if np.isfinite(xyz).all():
                widths.append(float(np.linalg.norm(xyz[0] - xyz[1])))
    # one person in the lab, in 3D once followed in the views (a group whose views detect
    # dropped, or before the person is found, has none: how many is the host's speed)
    assert people.count(1) >= 6 and max(people) == 1, people
    # both hips need two views each; how many groups keep them is the host's speed (frames
    # detect drops leave groups short of views)
    assert len(widths) >= 3, (widths, people)
    assert 0.15 < float(np.median(widths)) < 0.45, widths  # an adult's hips, in metres
    # the ANNY body fitted to that person: near its triangulated keypoints (the issue's
    # 25 mm median is bench/studio_body.py's; 50 mm here over the few first fitted groups)
    residuals = [a["residuals"].ravel() for h, a in arrays["body"] if h["count"]]
    assert len(residuals) >= 3 and {h["count"] for h, _ in arrays["body"]} <= {0, 1}
    fitted = np.concatenate(residuals)
    assert float(np.nanmedian(fitted)) < 0.05, np.nanmedian(fitted)
    # cam01 and cam02 decode narrower than the lab calibrated them: named, not hidden
    assert "camera 'cam01' sends 1080x1920 frames" in err


def test_face_kiosk_runs_briefly_on_sim_with_identities_on_face_topic(tmp_path):
    (config,), ports = on_free_ports(tmp_path, "face-kiosk.toml")
    code, err, got, arrays = run_and_collect(
        config,
        f"tcp://127.0.0.1:{ports[5562]}",
        duration=90,
        until=lambda got: sum(map(len, got["face"].values())) >= 3,
    )
    assert code == 0, err
    assert set(got["face"]) == {"kiosk"}, err
    for h in got["face"]["kiosk"]:
        assert h["identity"] is None or isinstance(h["identity"], str)
        assert h["landmark_source"] == "blazeface" and h["synthetic"]
    for _, a in arrays["face"]:
        assert a["landmarks"].shape == (4, 2) and a["box"].shape == (4,)
        assert abs(float(np.linalg.norm(a["embedding"])) - 1) < 1e-5
    assert "pose" not in got and "clip" not in got
    # no person detector: each face is tracked itself, and its message says which track
    assert all(isinstance(h["track_id"], int) for h in got["face"]["kiosk"])
    assert "similarities across models" not in err
    # it recorded its frames (faces blurred first: tests/stages/record/test_record_privacy.py)
    # next to the config copy, and no message log (the face/ messages carry embeddings)
    sessions = list((tmp_path / "recordings").iterdir())
    assert len(sessions) == 1 and not (sessions[0] / "messages").exists()
    assert read_index(next((sessions[0] / "frames" / "kiosk").glob("*.csv")))
    if not (REPO / "gallery.npz").exists():  # a fresh clone: the missing gallery is named
        assert "configs/face-kiosk.toml: stages[4].gallery: " in err
        assert "gallery.npz: no such gallery file" in err


def assert_faces_carry_their_person_track(arrays) -> None:
    """Each face message's track_id is the track of the smallest tracked person box of its
    frame's det message that contains the face's centre (None when there is none)."""
    dets = {(h["camera"], h["seq"]): (h, a) for h, a in arrays["det"]}
    checked = 0
    for h, a in arrays["face"]:
        if (h["camera"], h["seq"]) not in dets:
            continue  # that frame's det message was not received
        det, det_arrays = dets[h["camera"], h["seq"]]
        x1, y1, x2, y2 = (float(v) for v in a["box"])
        cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
        best, area = None, float("inf")
        for box, label, tid in zip(det_arrays["boxes"], det["labels"], det["track_ids"],
                                   strict=True):  # fmt: skip
            bx1, by1, bx2, by2 = (float(v) for v in box)
            inside = bx1 <= cx <= bx2 and by1 <= cy <= by2
            if (
                label == "person"
                and tid is not None
                and inside
                and (bx2 - bx1) * (by2 - by1) < area
            ):
                best, area = tid, (bx2 - bx1) * (by2 - by1)
        assert h["track_id"] == best, (h, det)
        checked += 1
    assert checked, "no face message had its frame's det message"


def kiosk_enrol_command() -> list[str]:
    """The enrol command configs/face-kiosk.toml's comments give, as argv."""
    lines = (REPO / "configs" / "face-kiosk.toml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "npucam face enroll" in line)
    text = ""
    for line in lines[start:]:
        text += line.lstrip("#").strip().removesuffix("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            break
    return text.split()


def test_the_kiosks_documented_enrol_command_works_as_written_and_matches_the_kiosk(tmp_path):
    import cv2
    import skimage.data

    from npu.models.loading import ModelSource
    from stages.gallery import read_gallery
    from stages.runtimes import open_runtime

    argv = kiosk_enrol_command()
    assert argv[:4] == [".venv/bin/npucam", "face", "enroll", "NAME"], argv
    model = argv[argv.index("--model") + 1]
    assert not (REPO / model).exists(), "this checks a fresh clone: no AdaFace bundle there"
    photo = tmp_path / "astronaut.png"
    cv2.imwrite(str(photo), cv2.cvtColor(skimage.data.astronaut(), cv2.COLOR_RGB2BGR))
    gallery = tmp_path / "gallery.npz"
    args = [str(NPUCAM), *argv[1:3], "eileen"]
    # the documented photo1.jpg photo2.jpg become one real photo; the rest as written
    rest = [str(photo)] + [a for a in argv[4:] if not a.startswith("photo")]
    rest[rest.index("--gallery") + 1] = str(gallery)
    done = subprocess.run([*args, *rest], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "SYNTHETIC" in done.stdout and "SYNTHETIC" in done.stderr
    # the gallery holds what the kiosk's infer stage computes: its faces will match it
    rt = open_runtime("adaface", "sim", ModelSource(bundle=str(REPO / model), synthetic=True))
    assert read_gallery(gallery).model == rt.model_id
    rt.close()


SPLIT_KINDS = ("pose", "face", "clip")


@pytest.mark.parametrize("pacing", PACINGS)
def test_split_infer_runs_the_npu_stage_on_received_frames_with_the_senders_seq(tmp_path, pacing):
    (capture_config, infer_config), ports = on_free_ports(
        tmp_path, "split-capture.toml", "split-infer.toml"
    )
    set_pacing(Path(infer_config), pacing)
    capture = subprocess.Popen(
        [str(NPUCAM), "run", capture_config, "--duration", "150"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        code, err, got, arrays = run_and_collect(
            infer_config,
            f"tcp://127.0.0.1:{ports[5560]}",
            duration=90,
            until=lambda got: len(got["det"]) == 2 and all(got[k] for k in SPLIT_KINDS),
        )
    finally:
        capture.terminate()
        capture.communicate(timeout=30)
    assert code == 0, err
    assert set(got["det"]) == {"bikes", "carphone"}, err
    for kind in SPLIT_KINDS:
        assert got[kind], f"no {kind} message from the split infer side\n{err}"
    for camera, headers in got["det"].items():
        for h in headers:  # the sender's camera and seq: `source` names both
            assert f"{camera}#{h['seq']} (" in h["source"], (h["seq"], h["source"])
        seqs = [h["seq"] for h in headers]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert_faces_carry_their_person_track(arrays)
