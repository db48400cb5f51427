"""`npucam view ENDPOINT`: serve the live page of a pipeline's PUB endpoint (loopback default).

Exits 0 on SIGINT/SIGTERM (within EXIT_DEADLINE_S whatever the pages do), 2 (pipeline.cli)
for a bad --bind, key file or endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

from pipeline import security

log = logging.getLogger(__name__)

# A stop signal ends the process by then: the graceful close (pipeline.view.server: pages shut
# within CLOSE_TIMEOUT_S / 2, the HTTP runner within as long) is what normally ends it, and
# the interpreter's own exit follows; a host too loaded to finish both in time is cut short.
EXIT_DEADLINE_S = 1.5


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "view", help="a live page of a pipeline's results (boxes, skeletons, identities, stats)"
    )
    p.add_argument("endpoint", help="the pipeline's PUB endpoint, e.g. tcp://127.0.0.1:5560")
    p.add_argument(
        "--topic",
        action="append",
        metavar="PREFIX",
        help="topic prefix to show, repeatable (default: all), subscribed only while a page "
        "is open; `meta` is always read",
    )
    p.add_argument(
        "--bind",
        default="127.0.0.1:8560",
        metavar="HOST:PORT",
        help="where the page is served (default 127.0.0.1:8560; port 0 picks a free one)",
    )
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name pages may use to reach the view, repeatable (loopback names and, "
        "beyond a loopback bind, IP addresses are always allowed; other names are refused "
        "against DNS rebinding)",
    )
    security.add_client_key_args(p, "viewer")
    p.set_defaults(func=cmd_view)


def cmd_view(args: argparse.Namespace) -> int:
    from pipeline.view.server import ViewServer, parse_bind, serve  # aiohttp: only for `view`

    curve = security.curve_of_args(args, "view")
    host, port = parse_bind(args.bind)
    server = ViewServer(args.endpoint, args.topic or [""], curve, host, port, args.allow_host)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def stopping() -> None:
            if not stop.is_set():
                exit_by(EXIT_DEADLINE_S)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping)
        await serve(server, stop)

    asyncio.run(main())
    return 0


def exit_by(deadline_s: float, hard_exit: Callable[[int], object] = os._exit) -> threading.Timer:
    """End the process with status 0 `deadline_s` from now if it has not ended by itself
    (a daemon timer: a process that ends first never sees it fire)."""

    def cut_short() -> None:
        log.warning("view: not closed %.1f s after the stop signal: exiting now", deadline_s)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        hard_exit(0)

    timer = threading.Timer(deadline_s, cut_short)
    timer.daemon = True
    timer.start()
    return timer
