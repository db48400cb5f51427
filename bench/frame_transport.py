"""Frames across the split: npucam's zmq_push stage -> `zmq:` camera against a bare pyzmq
PUSH/PULL of the same bytes, between two processes, in the same run.

The bare pair: PUSH with the same SNDHWM / PULL with the same RCVHWM as npucam's, kernel buffers
left to the OS, the sender sending one pre-built payload with copy=False as fast as send()
returns, the receiver taking copy=False frames into np.frombuffer arrays. npucam's pair: a
FramePush stage fed by a camera-like thread at 1.25x the bare pair's frame rate (so the link,
not the camera, limits it, and the sender's flow control has frames to drop), received by a
CameraReader on a `zmq:` url (receive_buffer_bytes RAW_RECEIVE_BUFFER for raw frames), both
processes set up as the npucam executable sets itself up (pipeline/entry.py).

The ratio (target >= 0.8) comes from the pairs taking turns inside one pair of processes
(ab_send, ab_recv): bare, npucam, bare, control, bare, ... for --phases phases each of npucam
and of the control (the bare sender with npucam's camera thread beside it, handing it frames:
what the frames' source costs without npucam's sender) of --phase-s each, each phase's
received frames/s against the mean of the bare phases either side of it; the median over
--ab-runs runs' phases is the figure. On two shared cores one pair's rate
swings up to 2x between runs seconds apart (a bare run against the bare run before it ranged
0.64-1.44), far more than the gap measured, while phases a second apart see the same machine.
Each phase also gives lag (receive time - capture time, one host clock), each side's CPU time
per received frame and the receiver's page faults per frame, by path. The table before it runs
each pair in processes of its own (--repeat times), for what only that shows: each side's CPU
in cores and RSS peak (VmHWM). JPEG rows run npucam's pair with format = "jpeg" at a camera's
30 fps and at 200 fps offered, with the encode and decode cost of one frame measured in this
process; the image is bikes.mp4's first frame resized to the row's size plus Gaussian noise
(sigma 3), so JPEG has natural-ish detail to code.

    .venv/bin/python bench/frame_transport.py [--seconds 5] [--repeat 1] [--ab-runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import zmq

SIZES = {"1080p": (1920, 1080), "720p": (1280, 720)}
PORT = 25_700
IDLE_S = 1.5  # a receiver ends this long after its last frame
CPU_SAMPLE_S = 0.02  # ab_recv: how often the receiver's CPU time is read
SETTLE_S = 0.15  # ab: the start of a phase, while the other path's frames drain, is not counted
# The `zmq:` camera's receive_buffer_bytes for raw frames (docs/configuration.md): 1 MiB, the
# default for JPEG, holds less than one raw 720p frame, and the link then waits on the reader.
RAW_RECEIVE_BUFFER = 8 << 20


def test_image(width: int, height: int) -> np.ndarray:
    """uint8 [height, width, 3] BGR: bikes.mp4's first frame resized, plus noise."""
    import cv2

    from pipeline.assets import asset_path

    cap = cv2.VideoCapture(str(asset_path("bikes.mp4")))
    ok, image = cap.read()
    cap.release()
    if not ok:
        raise SystemExit("bikes.mp4 not found: run `make setup`")
    image = cv2.resize(image, (width, height), interpolation=cv2.INTER_CUBIC)
    noise = np.random.default_rng(0).normal(0, 3, image.shape)
    return np.clip(image + noise, 0, 255).astype(np.uint8)


class Usage:
    """CPU seconds and wall time of this process from start() to stop()."""

    def start(self) -> None:
        self.t0, self.cpu0 = time.perf_counter(), _cpu()

    def stop(self) -> dict:
        wall = time.perf_counter() - self.t0
        return {
            "cpu_cores": (_cpu() - self.cpu0) / wall if wall > 0 else 0.0,
            "rss_peak_mb": _peak_rss_mb(),
            "wall_s": wall,
        }


def _peak_rss_mb() -> float:
    """This process's peak RSS: VmHWM, which (unlike ru_maxrss) starts again at exec, so a
    child does not report its parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def paced(fps: float, seconds: float):
    """Yield at fps (0: as fast as the caller loops) for seconds, never bursting to catch up."""
    period = 1.0 / fps if fps else 0.0
    end = due = time.perf_counter()
    end += seconds
    while (now := time.perf_counter()) < end:
        if now < due:
            time.sleep(due - now)
        due = max(due + period, time.perf_counter() - period)
        yield


# ---------------------------------------------------------------- the four processes


def bare_send(args) -> dict:
    w, h = SIZES[args.size]
    payload = np.random.default_rng(1).integers(0, 256, (h, w, 3), np.uint8).tobytes()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, args.sndhwm)
    sock.bind(args.endpoint)
    time.sleep(0.5)  # the receiver connects
    usage = Usage()
    usage.start()
    sent = _bare_sends(sock, payload, w, h, args.fps, args.seconds)
    out = {"sent": sent, **usage.stop()}
    sock.close(linger=5000)
    ctx.term()
    return out


def bare_recv(args) -> dict:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.RCVHWM, args.rcvhwm)
    sock.connect(args.endpoint)
    print("ready", flush=True)
    lags, usage, first, last = [], Usage(), None, None
    deadline = time.monotonic() + args.seconds + 15
    while time.monotonic() < deadline and sock.poll(int(IDLE_S * 1000) if lags else 5000):
        lag = _bare_take(sock)
        if first is None:
            usage.start()
            first = time.perf_counter()
        last = time.perf_counter()
        lags.append(lag)
    return _received(lags, first, last, usage)


def _bare_sends(
    sock: zmq.Socket, payload: bytes, w: int, h: int, fps: float, seconds: float, frames=None
) -> int:
    """The bare sender: the pre-built payload at fps (0: as fast as send() returns) for
    seconds, each with its header; with frames (an inbox), taking the camera's newest frame
    before each send, which the payload stands for. Returns how many were sent."""
    sent = 0
    for _ in paced(fps, seconds):
        if frames is not None:
            frames.get_nowait()
        sock.send_multipart([_bare_header(sent, w, h), payload], copy=False)
        sent += 1
    return sent


def _bare_take(sock: zmq.Socket) -> float:
    """The bare receiver's work on one frame: recv it without a copy into an array; its lag
    in ms."""
    header, payload = sock.recv_multipart(copy=False)
    h = json.loads(header.bytes)
    image = np.frombuffer(payload, np.uint8).reshape(h["shape"])
    lag = (time.time_ns() - h["capture_ts_ns"]) / 1e6
    del image
    return lag


def npucam_send(args) -> dict:
    w, h = SIZES[args.size]
    image = test_image(w, h) if args.fmt == "jpeg" else None
    if image is None:
        image = np.random.default_rng(1).integers(0, 256, (h, w, 3), np.uint8)
    stage, metrics = _push_stage(args.endpoint, args.fmt, args.quality)
    usage = Usage()

    async def main() -> int:
        inbox, task = await _started(stage, metrics)
        await asyncio.sleep(0.5)  # the receiver connects
        usage.start()
        offered = await asyncio.to_thread(_camera, inbox, image, args.fps, args.seconds, 0)
        inbox.producer_done()
        await task
        return offered

    offered = asyncio.run(main())
    work = metrics.work_time["push"]
    return {
        "sent": metrics.items_out["push", "bench"],
        "offered": offered,
        "peer_slow": metrics.dropped("push", reason="peer_slow"),
        "queue_full": metrics.dropped("push", reason="queue_full"),
        "work_ms": work.total / work.count * 1e3 if work.count else 0.0,
        **usage.stop(),
    }


def npucam_recv(args) -> dict:
    from pipeline.config import DEFAULT_RECEIVE_BUFFER_BYTES
    from pipeline.messages import now_ns

    lags, usage, times = [], Usage(), []

    def emit(frame) -> None:
        now = now_ns()
        if not times:
            usage.start()
        times.append(time.perf_counter())
        lags.append((now - frame.capture_ts_ns) / 1e6)

    buffer = RAW_RECEIVE_BUFFER if args.fmt == "raw" else DEFAULT_RECEIVE_BUFFER_BYTES
    reader = _zmq_camera(args.endpoint, buffer, emit)
    reader.start()
    print("ready", flush=True)
    deadline = time.monotonic() + args.seconds + 15
    while time.monotonic() < deadline and not (times and time.perf_counter() - times[-1] > IDLE_S):
        time.sleep(0.1)
    reader.stop()
    out = _received(lags, times[0] if times else None, times[-1] if times else None, usage)
    out["bad_messages"] = reader.stats()["bad_messages"]
    return out


def _push_stage(endpoint: str, fmt: str, quality: int = 90):
    """npucam's sender: a zmq_push stage bound to endpoint, and its Metrics."""
    from pipeline.config import parse_config
    from pipeline.graph import Context
    from pipeline.metrics import Metrics
    from stages.frame_push import FramePush, FramePushOptions

    stages = [{"name": "push", "kind": "zmq_push", "bind": endpoint, "format": fmt}]
    config = parse_config({"metrics": {"stats_interval_s": 0}, "stages": stages}, Path("b.toml"))
    metrics = Metrics()
    options = FramePushOptions(bind=endpoint, format=fmt, quality=quality)
    return FramePush("push", options, Context(config, metrics)), metrics


async def _started(stage, metrics):
    """(inbox, task): stage running on split-capture.toml's inbox, made as the pipeline makes
    it, once its socket is bound."""
    from pipeline.config import InboxConfig
    from pipeline.graph import new_inbox

    inbox = new_inbox(type(stage), "push", InboxConfig(size=4, policy="drop_oldest"), metrics)
    inbox.add_producer()
    task = asyncio.create_task(stage.run(inbox, None))
    bound = asyncio.ensure_future(stage.bound.wait())
    await asyncio.wait([task, bound], return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # the stage failed to start: its error
    return inbox, task


def _camera(inbox, image: np.ndarray, fps: float, seconds: float, seq: int) -> int:
    """A camera thread: frames of image (numbered from seq) into inbox at fps for seconds, as
    a capture reader puts them; returns how many."""
    from pipeline.messages import Frame, now_ns

    n = 0
    for _ in paced(fps, seconds):
        t = now_ns()
        inbox.put_threadsafe(Frame("bench", seq + n, t, t + 10**10, image, "bench"))
        n += 1
    return n


def _zmq_camera(endpoint: str, buffer: int, emit):
    """npucam's receiver: a CameraReader on `zmq:endpoint` calling emit(frame)."""
    from stages.sources import CameraReader, CameraSpec

    spec = CameraSpec(
        "remote", f"zmq:{endpoint}", staleness_ms=10_000, stall_timeout_s=120,
        receive_buffer_bytes=buffer,
    )  # fmt: skip
    return CameraReader(spec, emit)


def ab_send(args) -> dict:
    """The senders in one process, taking turns: bare, npucam, bare, control, bare, ...
    (args.phases phases each of npucam and of the control, args.phase_s each, with a bare one
    before and after each). The bare sender sends as bare_send does, on the port given;
    npucam's stage runs throughout on the next port, idle in the other phases, and in its
    phases a camera thread offers it 1.25x the rate the bare phase before reached; in the
    control's, the same camera thread offers its frames to the bare sender. Returns the
    phases (path, start and end on CLOCK_MONOTONIC, which the receiver process shares, frames
    sent or offered, CPU seconds)."""
    from pipeline.queues import ThreadInbox

    w, h = SIZES[args.size]
    image = np.random.default_rng(1).integers(0, 256, (h, w, 3), np.uint8)
    payload = image.tobytes()
    ctx = zmq.Context()
    bare = ctx.socket(zmq.PUSH)
    bare.setsockopt(zmq.SNDHWM, args.sndhwm)
    bare.bind(args.endpoint)
    stage, metrics = _push_stage(_next_port(args.endpoint), "raw")
    phases: list[dict] = []

    def bare_phase(seconds: float, frames=None) -> int:
        return _bare_sends(bare, payload, w, h, 0, seconds, frames)

    def camera_phase(frames, fps: float) -> int:
        # The control: the bare sender with the same camera thread beside it, handing it
        # frames as to npucam's stage: the cost of the frames' source without npucam's sender.
        camera = threading.Thread(target=_camera, args=(frames, image, fps, args.phase_s, 0))
        camera.start()
        sent = bare_phase(args.phase_s, frames)
        camera.join()
        return sent

    def phase(path: str, run, *a) -> dict:
        t0, cpu0 = time.monotonic(), _cpu()
        count = run(*a)
        return {"path": path, "start": t0, "end": time.monotonic(), "count": count,
                "cpu_s": _cpu() - cpu0}  # fmt: skip

    async def main() -> None:
        inbox, task = await _started(stage, metrics)
        frames = ThreadInbox("camera", 4, "drop_oldest", metrics)
        await asyncio.sleep(1.0)  # the receiver's two sockets connect
        offered = 0
        for path in ("npucam", "camera") * args.phases:
            phases.append(await asyncio.to_thread(phase, "bare", bare_phase, args.phase_s))
            fps = 1.25 * phases[-1]["count"] / (phases[-1]["end"] - phases[-1]["start"])
            if path == "npucam":
                run = (_camera, inbox, image, fps, args.phase_s, offered)
                phases.append(await asyncio.to_thread(phase, "npucam", *run))
                offered += phases[-1]["count"]
            else:
                phases.append(await asyncio.to_thread(phase, "camera", camera_phase, frames, fps))
        phases.append(await asyncio.to_thread(phase, "bare", bare_phase, args.phase_s))
        inbox.producer_done()
        await task

    asyncio.run(main())
    bare.close(linger=5000)
    ctx.term()
    return {"phases": phases, "peer_slow": metrics.dropped("push", reason="peer_slow")}


def ab_recv(args) -> dict:
    """Both receivers in one process: a bare PULL thread (as bare_recv) and npucam's
    CameraReader on the next port. Runs until a line on stdin; returns every frame's
    (path, CLOCK_MONOTONIC receive time, lag ms) and this process's CPU seconds sampled
    every CPU_SAMPLE_S, so the orchestrator can split them by the sender's phases."""
    from pipeline.messages import now_ns

    got: list[tuple[str, float, float]] = []
    stop = threading.Event()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.RCVHWM, args.rcvhwm)
    sock.connect(args.endpoint)

    def bare() -> None:
        while not stop.is_set():
            if sock.poll(50):
                got.append(("bare", time.monotonic(), _bare_take(sock)))

    def emit(frame) -> None:
        got.append(("npucam", time.monotonic(), (now_ns() - frame.capture_ts_ns) / 1e6))

    reader = _zmq_camera(_next_port(args.endpoint), RAW_RECEIVE_BUFFER, emit)
    samples: list[tuple[float, float, int]] = []

    def sample() -> None:
        while not stop.wait(CPU_SAMPLE_S):
            ru = resource.getrusage(resource.RUSAGE_SELF)
            samples.append((time.monotonic(), ru.ru_utime + ru.ru_stime, ru.ru_minflt))

    threads = [threading.Thread(target=f, daemon=True) for f in (bare, sample)]
    for t in threads:
        t.start()
    reader.start()
    print("ready", flush=True)
    sys.stdin.readline()
    stop.set()
    reader.stop()
    for t in threads:
        t.join()
    sock.close(0)
    ctx.term()
    return {"frames": got, "cpu": samples}


def _next_port(endpoint: str) -> str:
    host, port = endpoint.rsplit(":", 1)
    return f"{host}:{int(port) + 1}"


def _bare_header(seq: int, w: int, h: int) -> bytes:
    """stages/frame_wire.py's raw header, built by hand: either receiver takes it."""
    ts = time.time_ns()
    return json.dumps({
        "v": 1, "camera": "bench", "seq": seq, "capture_ts_ns": ts, "deadline_ns": ts + 10**10,
        "source": "bare", "encoding": "raw", "shape": [h, w, 3], "dtype": "uint8",
    }).encode()  # fmt: skip


def _received(lags: list[float], first, last, usage: Usage) -> dict:
    stats = usage.stop() if first is not None else {}
    n = len(lags)
    span = (last - first) if n > 1 else 0.0
    return {
        "received": n,
        "fps": (n - 1) / span if span > 0 else 0.0,
        "lag_p50_ms": float(np.percentile(lags, 50)) if n else None,
        "lag_p95_ms": float(np.percentile(lags, 95)) if n else None,
        **stats,
    }


ROLES = {"bare-send": bare_send, "bare-recv": bare_recv, "npucam-send": npucam_send,
         "npucam-recv": npucam_recv, "ab-send": ab_send, "ab-recv": ab_recv}  # fmt: skip


# ---------------------------------------------------------------- the orchestrator


def run_pair(path: str, size: str, fmt: str, fps: float, seconds: float, port: int) -> dict:
    """One sender and one receiver process of `path` ("bare" or "npucam"): both reports."""
    common = _role_args(port, size, "--fmt", fmt, "--fps", str(fps), "--seconds", str(seconds))
    me = [sys.executable, __file__]
    recv = subprocess.Popen([*me, "--role", f"{path}-recv", *common], stdout=subprocess.PIPE)
    if recv.stdout.readline().strip() != b"ready":
        raise SystemExit(f"{path} receiver did not start")
    send = subprocess.run([*me, "--role", f"{path}-send", *common], capture_output=True)
    if send.returncode:
        raise SystemExit(f"{path} sender failed:\n{send.stderr.decode()}")
    out, _ = recv.communicate(timeout=seconds + 30)
    return {"send": json.loads(send.stdout), "recv": json.loads(out.splitlines()[-1])}


def _role_args(port: int, size: str, *more: str) -> list[str]:
    """A role process's arguments: its endpoint and size, npucam's high-water marks (which
    the bare roles use too), and more."""
    from stages.frame_push import FramePushOptions
    from stages.source_kinds.zmq_pull import ZmqSource

    return [
        "--endpoint", f"tcp://127.0.0.1:{port}", "--size", size,
        "--sndhwm", str(FramePushOptions.model_fields["sndhwm"].default),
        "--rcvhwm", str(ZmqSource.RCVHWM), *more,
    ]  # fmt: skip


def codec_cost(size: str, quality: int) -> dict:
    """ms per frame of encode_frame (JPEG) and decode_frame for the row's image, bytes."""
    from pipeline.messages import Frame
    from stages.frame_wire import decode_frame, encode_frame

    w, h = SIZES[size]
    frame = Frame("bench", 0, 0, 0, test_image(w, h))
    parts = encode_frame(frame, "jpeg", quality)
    reps = 10
    t0 = time.perf_counter()
    for _ in range(reps):
        parts = encode_frame(frame, "jpeg", quality)
    t1 = time.perf_counter()
    for _ in range(reps):
        decode_frame(parts)
    t2 = time.perf_counter()
    return {
        "encode_ms": (t1 - t0) / reps * 1e3,
        "decode_ms": (t2 - t1) / reps * 1e3,
        "bytes": len(parts[1]),
    }


def row(label: str, size: str, fmt: str, offered: str, r: dict) -> str:
    s, v = r["send"], r["recv"]
    w, h = SIZES[size]
    mbps = v["fps"] * (w * h * 3 if fmt == "raw" else r.get("bytes", 0)) / 1e6
    drops = s.get("peer_slow", "-")
    return (
        f"| {label} | {size} {fmt} | {offered} | {v['fps']:.1f} | {mbps:,.0f} | "
        f"{v['lag_p50_ms']:.1f} / {v['lag_p95_ms']:.1f} | {drops} | "
        f"{s['cpu_cores']:.2f} / {s['rss_peak_mb']:.0f} | "
        f"{v['cpu_cores']:.2f} / {v['rss_peak_mb']:.0f} |"
    )


def orchestrate(args) -> None:
    print(
        "| path | frames | offered fps | received fps | MB/s | lag p50 / p95 ms | sender "
        "drops (peer_slow) | sender CPU cores / RSS MB | receiver CPU cores / RSS MB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    port = PORT
    for rep in range(args.repeat):
        for size in SIZES:
            bare = run_pair("bare", size, "raw", 0, args.seconds, port)
            offer = 1.25 * bare["recv"]["fps"]
            ours = run_pair("npucam", size, "raw", offer, args.seconds, port + 1)
            port += 2
            print(row(f"bare pyzmq (run {rep})", size, "raw", "max", bare))
            print(row(f"npucam (run {rep})", size, "raw", f"{offer:.0f}", ours))
    for size in SIZES:
        cost = codec_cost(size, args.quality)
        for fps in (30, 200):
            r = run_pair("npucam", size, "jpeg", fps, args.seconds, port)
            port += 1
            r["bytes"] = cost["bytes"]
            print(row(f"npucam, JPEG q{args.quality}", size, "jpeg", str(fps), r))
        print(
            f"  JPEG q{args.quality} {size}: encode {cost['encode_ms']:.2f} ms, decode "
            f"{cost['decode_ms']:.2f} ms per frame (one core), {cost['bytes'] / 1e3:.0f} kB "
            f"({cost['bytes'] / (SIZES[size][0] * SIZES[size][1] * 3):.3f} of raw)"
        )
    print(
        f"\nTaking turns in one pair of processes ({args.phases} phases each of npucam and of the "
        f"bare sender with npucam's camera thread beside it, {args.phase_s:g} s, each between "
        f"two bare ones), {args.ab_runs} runs a size:"
    )
    for size in SIZES:
        ratios: dict[str, list[float]] = {"npucam": [], "camera": []}
        for rep in range(args.ab_runs):
            r = run_ab(size, args.phases, args.phase_s, port)
            port += 2
            for path in ratios:
                ratios[path] += r["ratios"][path]
            print(f"  {size} run {rep}: " + ab_line(r), flush=True)
        for path, label in (("npucam", "npucam"), ("camera", "bare + npucam's camera thread")):
            q25, q50, q75 = np.percentile(ratios[path], [25, 50, 75])
            target = " (target >= 0.8)" if path == "npucam" else ""
            print(
                f"ratio {label} / bare frames/s, {size} raw: median of {len(ratios[path])} "
                f"phases {q50:.2f}{target}, quartiles {q25:.2f} / {q75:.2f}"
            )


def ab_line(r: dict) -> str:
    """One taking-turns run: its phase ratios, rates, lag, CPU and faults per frame by path."""
    med = statistics.median
    return (
        "; ".join(
            f"{p} / bare median {med(r['ratios'][p]):.2f} "
            f"(phases {', '.join(f'{x:.2f}' for x in r['ratios'][p])})"
            for p in ("npucam", "camera")
        )
        + "; "
        + "; ".join(
            f"{p}: {med(r['fps'][p]):.0f} frames/s, lag p50/p95 {r['lag'][p][0]:.1f}/"
            f"{r['lag'][p][1]:.1f} ms, CPU us a frame sender {r['cpu_us'][p][0]:.0f} / receiver "
            f"{r['cpu_us'][p][1]:.0f}, receiver page faults a frame {r['faults'][p]:.0f}"
            for p in ("bare", "npucam", "camera")
        )
        + f"; npucam sender drops (peer_slow) {r['peer_slow']}"
    )


def run_ab(size: str, phases: int, phase_s: float, port: int) -> dict:
    """One ab-send / ab-recv pair: per npucam and control phase, its received frames/s against
    the mean of the bare phases either side of it; rates, lag, CPU and faults per path."""
    common = _role_args(port, size, "--phases", str(phases), "--phase-s", str(phase_s))
    me = [sys.executable, __file__]
    recv = subprocess.Popen(
        [*me, "--role", "ab-recv", *common], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    if recv.stdout.readline().strip() != b"ready":
        raise SystemExit("ab receiver did not start")
    send = subprocess.run([*me, "--role", "ab-send", *common], capture_output=True)
    time.sleep(IDLE_S)
    out, _ = recv.communicate(b"stop\n", timeout=60)
    if send.returncode:
        raise SystemExit(f"ab sender failed:\n{send.stderr.decode()}")
    sent, got = json.loads(send.stdout), json.loads(out.splitlines()[-1])
    times = np.array([c[0] for c in got["cpu"]])
    cpus = np.array([c[1] for c in got["cpu"]])
    faults = np.array([c[2] for c in got["cpu"]], float)
    paths = ("bare", "npucam", "camera")
    rates: list[float] = []
    fps, lags, cpu, flt = ({p: [] for p in paths} for _ in range(4))
    for ph in sent["phases"]:
        t0, t1, path = ph["start"] + SETTLE_S, ph["end"], ph["path"]
        socket = "npucam" if path == "npucam" else "bare"  # the camera control sends bare
        mine = [f for f in got["frames"] if f[0] == socket and t0 <= f[1] < t1]
        rates.append(len(mine) / (t1 - t0))
        fps[path].append(rates[-1])
        lags[path] += [f[2] for f in mine]
        r0, r1 = np.interp([t0, t1], times, cpus)
        f0, f1 = np.interp([t0, t1], times, faults)
        frames = max(1, len(mine))
        flt[path].append((f1 - f0) / frames)
        cpu[path].append(
            ((ph["cpu_s"] * (t1 - t0) / (ph["end"] - ph["start"])) / frames, (r1 - r0) / frames)
        )
    ratios: dict[str, list[float]] = {"npucam": [], "camera": []}
    for i in range(1, len(rates), 2):
        ratios[sent["phases"][i]["path"]].append(rates[i] / ((rates[i - 1] + rates[i + 1]) / 2))
    return {
        "ratios": ratios,
        "fps": fps,
        "lag": {p: (np.percentile(v, 50), np.percentile(v, 95)) for p, v in lags.items()},
        "cpu_us": {p: tuple(np.median(np.array(v), axis=0) * 1e6) for p, v in cpu.items()},
        "faults": {p: float(np.median(v)) for p, v in flt.items()},
        "peer_slow": sent["peer_slow"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--quality", type=int, default=90)
    parser.add_argument("--role", choices=sorted(ROLES))
    parser.add_argument("--endpoint")
    parser.add_argument("--size", choices=sorted(SIZES))
    parser.add_argument("--fmt", choices=("raw", "jpeg"), default="raw")
    parser.add_argument("--fps", type=float, default=0.0)
    parser.add_argument("--sndhwm", type=int, default=2)
    parser.add_argument("--rcvhwm", type=int, default=1)
    parser.add_argument("--ab-runs", type=int, default=3)
    parser.add_argument("--phases", type=int, default=8)
    parser.add_argument("--phase-s", type=float, default=1.0)
    args = parser.parse_args()
    if args.role:
        if not args.role.startswith("bare"):
            from pipeline.entry import configure_process

            configure_process()  # as the npucam executable runs (pipeline/entry.py)
        print(json.dumps(ROLES[args.role](args)), flush=True)
    else:
        orchestrate(args)


if __name__ == "__main__":
    main()
