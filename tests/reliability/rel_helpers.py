"""Helpers of the reliability tests: a subscriber that records every message with the time it
arrived, and small statistics used to compare runs."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.asyncio
from engine_stages import start

from pipeline import wire
from pipeline.messages import now_ns


@dataclass
class Seen:
    """One received message: its decoded form and the subscriber's wall clock (ns) on arrival."""

    message: wire.Message
    received_ns: int

    @property
    def header(self) -> dict:
        return self.message.header


@dataclass
class Recorder:
    """A SUB socket read by an asyncio task until stop(); every message kept in order."""

    endpoint: str
    topic: str = ""
    rcvhwm: int = 1000
    also: tuple[str, ...] = ()  # more topic prefixes to subscribe to
    seen: list[Seen] = field(default_factory=list)

    async def start(self) -> Recorder:
        ctx = zmq.asyncio.Context.instance()
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, self.rcvhwm)
        for topic in (self.topic, *self.also):
            self.sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.sock.connect(self.endpoint)
        self._task = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        while True:
            parts = await self.sock.recv_multipart()
            self.seen.append(Seen(wire.decode(parts), now_ns()))

    async def stop(self, idle_s: float = 0.3) -> list[Seen]:
        """Read until nothing arrived for idle_s, then close."""
        n = -1
        while n != len(self.seen):
            n = len(self.seen)
            await asyncio.sleep(idle_s)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.sock.close(0)
        return self.seen

    def frames(self, camera: str) -> list[Seen]:
        return [s for s in self.seen if s.message.topic == f"det/{camera}"]

    def stats(self) -> list[Seen]:
        return [s for s in self.seen if s.message.topic == "stats"]

    async def wait_for(self, predicate, timeout: float, what: str) -> float:
        """Poll predicate() every 5 ms; the monotonic time it first held (AssertionError after
        timeout)."""
        end = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < end, f"timed out after {timeout} s waiting for {what}"
            await asyncio.sleep(0.005)
        return time.monotonic()


# a `zmq:` camera "remote" (pushed_run's socket at {endpoint}) beside a synthetic card at
# 25 fps, published with a blocking inbox: what a hostile sender does to the other camera
REMOTE_AND_CARD = """
    [metrics]
    stats_interval_s = 0.2
    [[cameras]]
    name = "remote"
    url = "zmq:{endpoint}"
    staleness_ms = 60000
    [[cameras]]
    name = "card"
    url = "synthetic:?width=64&height=48&fps=25"
    [[stages]]
    kind = "capture"
    [[stages]]
    kind = "publish"
    bind = "tcp://127.0.0.1:*"
    inbox = {{ size = 64, policy = "block" }}
    """


@dataclass
class PushedRun:
    """A running config whose `zmq:` camera pulls from `push`, with `rec` subscribed to its
    publish stage; `code` is the pipeline's exit code once pushed_run() has stopped it."""

    push: zmq.Socket
    pipeline: object
    rec: Recorder
    code: int | None = None


@contextlib.asynccontextmanager
async def pushed_run(path, endpoint: str):
    """A PUSH socket bound at endpoint (the config's `zmq:` camera connects to it), the
    pipeline of the config at path started, its publish stage bound and a Recorder on it. On
    leaving: the pipeline stopped (its exit code in .code) and the socket closed; then, unless
    the body raised, the recorder read until idle."""
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.setsockopt(zmq.SNDTIMEO, 5000)
    push.bind(endpoint)
    pipeline, task = await start(path)
    run: PushedRun | None = None
    try:
        await asyncio.wait_for(pipeline.stages["publish"].bound.wait(), 5)
        rec = await Recorder(pipeline.stages["publish"].endpoint).start()
        run = PushedRun(push, pipeline, rec)
        yield run
    finally:
        pipeline.stop()
        code = await asyncio.wait_for(task, 10)
        push.close(0)
        ctx.term()
        if run is not None:
            run.code = code
    await run.rec.stop(idle_s=0.1)


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of values by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def seq_gaps(seqs: list[int]) -> int:
    """How many seqs are missing between the first and last of an increasing list."""
    return (seqs[-1] - seqs[0] + 1 - len(seqs)) if seqs else 0


def catches(pid: int, sig: int) -> bool:
    """Whether process pid has a handler for sig (Linux: SigCgt of /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next((ln.split()[1] for ln in status.splitlines() if ln.startswith("SigCgt:")), "0")
    return bool(int(caught, 16) >> (sig - 1) & 1)


class NpucamRun:
    """`python -m pipeline run CONFIG` as a subprocess (own process group); stop() sends a
    signal and waits for the exit code; kill() at teardown if it is still running."""

    def __init__(self, config: str, duration: float | None = None, env: dict | None = None):
        import os
        import subprocess
        import sys

        args = [sys.executable, "-m", "pipeline", "run", str(config)]
        if duration is not None:
            args += ["--duration", str(duration)]
        full_env = {**os.environ, **(env or {})}
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
            start_new_session=True,
        )

    def signal(self, sig: int, ready_timeout: float = 60.0) -> None:
        """Send sig once the process catches it (its handler is installed: bit sig - 1 of
        SigCgt in /proc/PID/status), so a signal sent while a loaded host is still starting
        the interpreter is not the default action (exit -sig)."""
        end = time.monotonic() + ready_timeout
        while self.proc.poll() is None and time.monotonic() < end:
            if catches(self.proc.pid, sig):
                break
            time.sleep(0.05)
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 20.0) -> tuple[int, str]:
        """(exit code, stderr text)."""
        _, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, err.decode(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
