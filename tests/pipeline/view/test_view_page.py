"""The live view as a user opens it: the demo config runs, `npucam view` relays it, and headless
Chromium (Debian's chromium + chromedriver, `make setup-test`) draws both cameras' frames,
boxes and skeletons from the stream, read back from the page and from its overlay pixels; and
a rig's pose3d messages drawn as 3D skeletons that a drag turns."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By

from pipeline import wire
from tests.pacing import PACINGS, set_pacing

pytestmark = pytest.mark.heavy  # a whole pipeline run (tests/conftest.py)

REPO = Path(__file__).resolve().parents[3]
NPUCAM = Path(sys.executable).parent / "npucam"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,900",
)
CAMERAS = ("bikes", "carphone")


def browser(profile: Path) -> webdriver.Chrome:
    assert CHROMIUM.exists() and CHROMEDRIVER.exists(), "no chromium: run `make setup-test`"
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))


def view_url(proc: subprocess.Popen, timeout_s: float = 20.0) -> str:
    """The URL `npucam view` prints on its first line."""
    end = time.monotonic() + timeout_s
    line = ""
    while time.monotonic() < end and not line:
        line = proc.stdout.readline()
    assert line.startswith("npucam view: http://"), line or proc.stderr.read()
    return line.split()[2]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("pacing", PACINGS)
def test_the_page_draws_frames_boxes_and_skeletons_of_both_demo_cameras(
    demo_config, tmp_path, pacing
):
    config, endpoint = demo_config
    set_pacing(config, pacing)
    groups = json.loads((REPO / "docs" / "meta.json").read_text())["pose"]["groups"]
    body = next(g["color"] for g in groups if g["name"] == "body")  # from the contract file
    run = subprocess.Popen(
        [str(NPUCAM), "run", str(config), "--duration", "150"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    view = subprocess.Popen(
        [str(NPUCAM), "view", endpoint, "--bind", "127.0.0.1:0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    driver = None
    try:
        url = view_url(view)
        driver = browser(tmp_path / "chromium-profile")
        driver.get(url)
        # polls until both cameras show all of it (seconds on an idle host); 120 s is a hang
        # guard for a loaded one, where the first poses wait for the models' warm-up estimate
        # to relax (docs/scheduler.md, "An inflated warm-up")
        end = time.monotonic() + 120
        counts, pixels, banner, banner_text = {}, {}, False, ""
        while time.monotonic() < end:
            counts = driver.execute_script("return window.npucamView.counts()")
            # a skeleton is drawn only while its track's pose is fresh, so each camera keeps the
            # most body-colour pixels seen in any poll, not only in the latest one
            for cam in CAMERAS:
                px = driver.execute_script(
                    "return window.npucamView.overlayPixels(arguments[0], arguments[1])", cam, body
                )
                pixels[cam] = max(pixels.get(cam, 0), px)
            done = all(
                cam in counts
                and counts[cam]["frames"] > 0
                and counts[cam]["boxes"] > 0
                and counts[cam]["skeletons"] > 0
                and counts[cam]["liveSkeletons"] > 0
                and pixels[cam] > 0
                for cam in CAMERAS
            )
            # the synthetic models' first result (which shows the banner) may come after the
            # per-frame poses
            banner = driver.execute_script("return !document.getElementById('synthetic').hidden")
            banner_text = driver.execute_script(
                "return document.getElementById('synthetic').textContent"
            )
            # and the device busy figure, which the infer stage's first stats bring
            stats_text = driver.execute_script(
                "return [...document.querySelectorAll('.camera .stats')].map(e => e.textContent)"
            )
            busy = len(stats_text) == 2 and all("%" in t for t in stats_text)
            if done and banner and busy:
                break
            time.sleep(0.5)
        driver.save_screenshot(str(tmp_path / "view.png"))
        stats_text = driver.execute_script(
            "return [...document.querySelectorAll('.camera .stats')].map(e => e.textContent)"
        )
    finally:
        if driver is not None:
            driver.quit()
        view.send_signal(signal.SIGTERM)
        run.send_signal(signal.SIGTERM)
        view_code = view.wait(timeout=10)
        run.wait(timeout=15)
        view_err = view.stderr.read()
        run_err = run.stderr.read()
    print(f"screenshot: {tmp_path / 'view.png'}; counts {counts}; body-colour pixels {pixels}")
    assert view_code == 0, view_err
    for cam in CAMERAS:
        assert cam in counts, (counts, run_err[-2000:])
        c = counts[cam]
        assert c["frames"] > 0, f"{cam}: no preview frame drawn: {c}"
        assert c["boxes"] > 0 and c["skeletons"] > 0, f"{cam}: {c}"
        # the per-frame pose of MediaPipe's real-weight landmark models (configs/demo.toml)
        assert c["liveSkeletons"] > 0, f"{cam}: no per-frame skeleton drawn: {c}"
        assert pixels[cam] > 0, f"{cam}: no pixel in the body keypoints' colour {body}"
    assert banner  # the demo runs synthetic weights, and the page says which
    assert banner_text.startswith("SYNTHETIC weights (") and "mediapipe" not in banner_text
    assert len(stats_text) == 2 and all(t.startswith("fps ") for t in stats_text), stats_text
    assert all("device busy" in t and "%" in t for t in stats_text), stats_text
    # wall-clock-ok: not a time: the size of one screenshot taken once the page had drawn
    # every camera's frame, boxes and skeletons (a page that drew nothing compresses smaller)
    assert (tmp_path / "view.png").stat().st_size > 10_000


def pose3d_messages(stop: threading.Event, endpoint: str) -> None:
    """Publish meta, a rig's pose3d (two people, every keypoint triangulated) and the first
    person's fitted body (body/<rig>, its 17 COCO points) every 0.2 s on endpoint, as npucam's
    publish stage would, until stop."""
    from npu.models.sapiens2.keypoints import NAMES
    from stages.body.result import BodyResult
    from stages.meta import contract
    from stages.rig.pose3d import Pose3DResult

    coco = ("nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder",
            "right_shoulder", "left_elbow", "right_elbow", "left_wrist", "right_wrist",
            "left_hip", "right_hip", "left_knee", "right_knee", "left_ankle",
            "right_ankle")  # fmt: skip

    rng = np.random.default_rng(5)
    body = rng.uniform([-0.25, -0.15, 0.0], [0.25, 0.15, 1.8], (308, 3))
    xyz = np.stack([body, body + [1.0, 0.5, 0.0]])
    points = np.concatenate([xyz, np.full((2, 308, 1), 0.9)], -1)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(endpoint)
    rigs = [{"rig": "hall", "cameras": ["a", "b"], "stage": "rig3d"}]
    meta = {**contract(), "cameras": [], "infer": [], "rigs": rigs}
    seq = 0
    try:
        while not stop.wait(0.2):
            ts = time.time_ns()
            header = {
                "kind": "meta",
                "camera": "",
                "seq": 0,
                "capture_ts": ts,
                "publish_ts": ts,
                "backend": "none",
                "model": "none",
                "synthetic": False,
                "meta": meta,
            }
            pub.send_multipart(wire.encode("meta", header))
            result = Pose3DResult(
                camera="hall",
                seq=seq,
                capture_ts_ns=ts,
                deadline_ns=ts + 10**9,
                cameras=("a", "b"),
                points=points.astype(np.float32),
                error=np.ones((2, 308), np.float32),
                used=np.ones((2, 308, 2), np.uint8),
                person_ids=(3, 7),
                tracks=({"a": 1, "b": 2}, {"a": 4, "b": 5}),
                views={"a": seq, "b": seq},
            )
            pub.send_multipart(wire.encode_result(result, time.time_ns()))
            fitted = BodyResult(
                camera="hall",
                seq=seq,
                capture_ts_ns=ts,
                deadline_ns=ts + 10**9,
                keypoint_names=coco,
                person_ids=(3,),
                rotations=np.zeros((1, 0, 3, 3), np.float32),
                translation=np.zeros((1, 3), np.float32),
                phenotype=np.full((1, 6), 0.5, np.float32),
                phenotype_final=(True,),
                keypoints=xyz[0][[NAMES.index(n) for n in coco]][None].astype(np.float32),
                residuals=np.zeros((1, len(coco)), np.float32),
            )
            pub.send_multipart(wire.encode_result(fitted, time.time_ns()))
            seq += 1
    finally:
        pub.close()
        ctx.term()


@pytest.mark.timeout(90)
def test_the_page_draws_a_rigs_3d_skeletons_and_a_drag_turns_them(tmp_path, free_port):
    endpoint = f"tcp://127.0.0.1:{free_port}"
    groups = json.loads((REPO / "docs" / "meta.json").read_text())["pose"]["groups"]
    body = next(g["color"] for g in groups if g["name"] == "body")
    stop = threading.Event()
    publisher = threading.Thread(target=pose3d_messages, args=(stop, endpoint), daemon=True)
    publisher.start()
    view = subprocess.Popen(
        [str(NPUCAM), "view", endpoint, "--bind", "127.0.0.1:0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    driver = None
    try:
        driver = browser(tmp_path / "chromium-profile")
        driver.get(view_url(view))
        counts, pixels, white = {}, 0, 0
        end = time.monotonic() + 30
        while time.monotonic() < end:
            counts = driver.execute_script("return window.npucamView.rigCounts()")
            pixels = driver.execute_script(
                "return window.npucamView.rigPixels('hall', arguments[0])", body
            )
            white = driver.execute_script("return window.npucamView.rigPixels('hall', '#ffffff')")
            hall = counts.get("hall", {})
            if hall.get("skeletons", 0) > 0 and hall.get("bodies", 0) > 0 and pixels and white:
                break
            time.sleep(0.3)
        canvas = driver.find_element(By.CSS_SELECTOR, "section[data-rig='hall'] canvas.rig3d")
        before = driver.execute_script("return arguments[0].toDataURL()", canvas)
        yaw = counts["hall"]["yaw"]
        ActionChains(driver).click_and_hold(canvas).move_by_offset(90, 30).release().perform()
        time.sleep(0.5)
        turned = driver.execute_script("return window.npucamView.rigCounts()")["hall"]
        after = driver.execute_script("return arguments[0].toDataURL()", canvas)
        text = driver.execute_script(
            "return arguments[0].textContent",
            driver.find_element(By.CSS_SELECTOR, "section[data-rig='hall'] .stats"),
        )
        driver.save_screenshot(str(tmp_path / "rig.png"))
    finally:
        if driver is not None:
            driver.quit()
        view.send_signal(signal.SIGTERM)
        view.wait(timeout=10)
        stop.set()
        publisher.join(timeout=5)
    print(f"screenshot: {tmp_path / 'rig.png'}; counts {counts}; body-colour pixels {pixels}")
    assert counts["hall"]["messages"] > 0 and counts["hall"]["skeletons"] > 0, counts
    # every render of a fresh group drew all 308 points of both people (the counter sums the
    # renders', so it is a multiple of 2 x 308), and so did the latest (its stats line)
    assert counts["hall"]["points"] > 0 and counts["hall"]["points"] % (2 * 308) == 0, counts
    assert pixels > 0, f"no pixel in the body keypoints' colour {body}"
    assert counts["hall"]["bodies"] > 0 and white > 0, "the fitted body is not drawn"
    assert turned["yaw"] != yaw and after != before  # the drag turned the view
    assert text.startswith("group ") and f"2 people, {2 * 308} points;" in text, text
    assert "views a, b" in text, text
