"""Run a server on a local port in a background thread, and stop it: for tests and notebooks.

``BackgroundServer(app)`` binds 127.0.0.1 on a free port itself (port 0, so no two servers
race for one), hands the socket to uvicorn on a thread of its own, and returns once the server
accepts connections. ``stop()`` asks uvicorn to exit, which closes the socket, lets open
requests finish (``drain_timeout_s``) and runs the app's shutdown (the engine drains). Use it
as a context manager so that it always stops.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn


class BackgroundServer:
    """uvicorn serving ``app`` on ``host`` (default 127.0.0.1) in a daemon thread."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0,
                 drain_timeout_s: float = 30.0, log_level: str = "warning"):
        self.app, self.host = app, host
        # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY on the connections of a TCP
        # socket only, and without it each response's body waits for the client's delayed ACK
        # after the headers (40 ms a response on Linux)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(app, log_level=log_level, lifespan="on",
                                timeout_graceful_shutdown=drain_timeout_s)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]},
                                       name=f"inferlab-serve-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> "BackgroundServer":
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop accepting, drain the open requests, shut the engine down, join the thread."""
        self.server.should_exit = True
        self.thread.join(timeout_s)
        self._sock.close()
        if self.thread.is_alive():
            raise RuntimeError(f"the server on {self.url} did not stop within {timeout_s} s")

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
