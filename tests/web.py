"""A real HTTP server for the tests: uvicorn on a free port of 127.0.0.1, in a thread."""

from __future__ import annotations

import socket
import threading
from typing import Any

import uvicorn
from polling import wait_for


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class UvicornThread:
    """A real uvicorn server on a free port of 127.0.0.1, in a thread."""

    def __init__(self, app: Any) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(app, port=port, log_level="warning", lifespan="on", ws="none")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run)

    def __enter__(self) -> UvicornThread:
        self.thread.start()
        wait_for("uvicorn to start", lambda: self.server.started, 20.0)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20.0)
