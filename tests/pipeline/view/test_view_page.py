"""The live view as a user opens it: the demo config runs, `npucam view` relays it, and headless
Chromium (Debian's chromium + chromedriver, `make setup-test`) draws both cameras' frames,
boxes and skeletons from the stream, read back from the page and from its overlay pixels."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

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


@pytest.mark.timeout(120)
def test_the_page_draws_frames_boxes_and_skeletons_of_both_demo_cameras(demo_config, tmp_path):
    config, endpoint = demo_config
    groups = json.loads((REPO / "docs" / "meta.json").read_text())["pose"]["groups"]
    body = next(g["color"] for g in groups if g["name"] == "body")  # from the contract file
    run = subprocess.Popen(
        [str(NPUCAM), "run", str(config), "--duration", "50"],
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
        end = time.monotonic() + 40
        counts, pixels = {}, {}
        while time.monotonic() < end:
            counts = driver.execute_script("return window.npucamView.counts()")
            pixels = {
                cam: driver.execute_script(
                    "return window.npucamView.overlayPixels(arguments[0], arguments[1])", cam, body
                )
                for cam in CAMERAS
            }
            done = all(
                cam in counts
                and counts[cam]["frames"] > 0
                and counts[cam]["boxes"] > 0
                and counts[cam]["skeletons"] > 0
                and pixels[cam] > 0
                for cam in CAMERAS
            )
            if done:
                break
            time.sleep(0.5)
        driver.save_screenshot(str(tmp_path / "view.png"))
        banner = driver.execute_script("return !document.getElementById('synthetic').hidden")
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
        assert pixels[cam] > 0, f"{cam}: no pixel in the body keypoints' colour {body}"
    assert banner  # the demo runs synthetic weights, and the page says so
    assert len(stats_text) == 2 and all(t.startswith("fps ") for t in stats_text), stats_text
    assert all("device busy" in t and "%" in t for t in stats_text), stats_text
    assert (tmp_path / "view.png").stat().st_size > 10_000
