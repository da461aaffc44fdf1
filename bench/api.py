"""What the HTTP service (`haco serve`) adds over the SDK: sequential invocations of the
fast backend (role ``one`` of bench/fixtures/runtime_pool.toml, a ~0 s simulated model)
through ``HacoClient.invoke``, ``await HacoClient.ainvoke`` (an event loop in a thread)
and POST /v1/chat/completions of a real uvicorn server on 127.0.0.1 (one keep-alive httpx
connection), interleaved call by call so every path sees the same machine.

    python -m bench.api [--n N]

Redis from HACO_REDIS_URL, else embedded in a temp dir; one `haco worker` subprocess.
JSON on stdout, a table on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Self, TypeVar

import httpx
import uvicorn
from rich.table import Table

from bench.console import show
from bench.machine import machine
from bench.rtlib import Services, bench_client, summary_ms
from coordinator.api.app import create_app
from coordinator.config import HacoSettings
from coordinator.runtime.client import HacoClient

T = TypeVar("T")
ROLE = "one"
DEADLINE_S = 10.0
WARMUP = 20
START_TIMEOUT_S = 20.0


def free_port() -> int:
    """A port free now on 127.0.0.1. (uvicorn is given the port, not a bound socket: on a
    socket passed in, its connections wait out the peer's ~40 ms delayed ACKs.)"""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ThreadedUvicorn:
    """A uvicorn server in a thread of this process: ready inside ``with``, stopped after
    (within ``start_timeout_s`` each way)."""

    name = "uvicorn"

    def __init__(self, config: uvicorn.Config, start_timeout_s: float, daemon: bool) -> None:
        self.start_timeout_s = start_timeout_s
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=daemon)

    def __enter__(self) -> Self:
        self.thread.start()
        end = time.monotonic() + self.start_timeout_s
        while not self.server.started:
            if time.monotonic() > end:
                raise RuntimeError(f"{self.name} did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=self.start_timeout_s)


class Server(ThreadedUvicorn):
    """uvicorn on a free port of 127.0.0.1, in a thread."""

    def __init__(self, client: HacoClient, settings: HacoSettings) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(
            create_app(settings, client), port=port, log_level="warning", ws="none"
        )
        super().__init__(config, START_TIMEOUT_S, daemon=False)


class LoopThread:
    """An event loop in a thread: ``HacoClient.ainvoke`` as the service awaits it, without
    HTTP (separates the async core's cost from the HTTP layer's)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> LoopThread:
        self.thread.start()
        return self

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=START_TIMEOUT_S)
        self.loop.close()


def measure(client: HacoClient, http: httpx.Client, n: int) -> dict[str, list[float]]:
    body: dict[str, Any] = {"model": ROLE, "messages": [{"role": "user", "content": "x"}]}
    body["haco"] = {"deadline_s": DEADLINE_S}
    out: dict[str, list[float]] = {"sdk": [], "async": [], "http": []}
    with LoopThread() as aio:
        for i in range(n + WARMUP):
            t0 = time.perf_counter()
            client.invoke(ROLE, "x", deadline_s=DEADLINE_S)
            t1 = time.perf_counter()
            aio.run(client.ainvoke(ROLE, "x", deadline_s=DEADLINE_S))
            t2 = time.perf_counter()
            res = http.post("/v1/chat/completions", json=body)
            t3 = time.perf_counter()
            if res.status_code != 200:
                raise RuntimeError(f"HTTP {res.status_code}: {res.text}")
            if i >= WARMUP:
                out["sdk"].append(t1 - t0)
                out["async"].append(t2 - t1)
                out["http"].append(t3 - t2)
        aio.run(client.hubs.aclose())
    return out


def run(n: int, tmp: Path) -> dict[str, Any]:
    svc = Services(tmp, concurrency=8)
    try:
        svc.start_haco()
        with (
            bench_client(svc.url) as client,
            Server(client, client.settings) as server,
            httpx.Client(base_url=server.url, timeout=DEADLINE_S * 2) as http,
        ):
            client.invoke(ROLE, "ready?", deadline_s=60.0)  # the worker consumes
            times = measure(client, http, n)
    finally:
        svc.close()
    sdk, aio, api = (summary_ms(times[k]) for k in ("sdk", "async", "http"))
    keys = ("p50_ms", "p90_ms", "p99_ms", "mean_ms")
    return {
        "n": n,
        "machine": machine(),
        "sdk": sdk,
        "async": aio,
        "http": api,
        "http_minus_sdk": {k: api[k] - sdk[k] for k in keys},
        "http_minus_async": {k: api[k] - aio[k] for k in keys},
    }


def table(res: dict[str, Any]) -> Table:
    t = Table(title=f"HTTP API overhead over the SDK, ms (n={res['n']} sequential calls each)")
    for c in ("path", "p50", "p90", "p99", "mean"):
        t.add_column(c, justify="left" if c == "path" else "right")
    for name, key in (("HacoClient.invoke", "sdk"), ("await HacoClient.ainvoke", "async"),
                      ("POST /v1/chat/completions", "http"), ("HTTP − invoke", "http_minus_sdk"),
                      ("HTTP − ainvoke", "http_minus_async")):  # fmt: skip
        s = res[key]
        t.add_row(name, *(f"{s[k]:.2f}" for k in ("p50_ms", "p90_ms", "p99_ms", "mean_ms")))
    return t


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.api", description=__doc__)
    parser.add_argument("--n", type=int, default=1000, help="calls per path")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error(f"--n={args.n}; expected a positive number")
    with tempfile.TemporaryDirectory(prefix="haco-bench-api-") as tmp:
        res = run(args.n, Path(tmp))
    show(table(res))
    json.dump(res, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
