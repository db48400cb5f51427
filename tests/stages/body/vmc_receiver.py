"""A VMC "Marionette" stand-in for the tests: python-osc's own UDP server on 127.0.0.1."""

from __future__ import annotations

import threading

from pythonosc.dispatcher import Dispatcher
from pythonosc.osc_server import ThreadingOSCUDPServer


class Receiver:
    """A Marionette stand-in: python-osc's UDP server on 127.0.0.1, keeping every message."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, tuple]] = []
        self.got = threading.Condition()
        dispatcher = Dispatcher()
        dispatcher.set_default_handler(self._keep)
        self.server = ThreadingOSCUDPServer(("127.0.0.1", 0), dispatcher)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _keep(self, address: str, *args) -> None:
        with self.got:
            self.messages.append((address, args))
            self.got.notify_all()

    def wait_for(self, count: int) -> list[tuple[str, tuple]]:
        with self.got:
            assert self.got.wait_for(lambda: len(self.messages) >= count, timeout=30)
            return list(self.messages)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
