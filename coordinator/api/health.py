"""GET /healthz (the process answers) and GET /readyz: Redis answers a ping, Postgres
(when one is configured or running) accepts a connection, and at least one worker
consumes each zone queue of the pool. The readiness answer is reused for
HACO_API_READY_CACHE_S; 503 when not ready."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from coordinator.api.deps import client_of, settings_of
from coordinator.config import HacoSettings
from coordinator.errors import HacoError
from coordinator.runtime.client import HacoClient
from coordinator.services.embedded_pg import running_url
from coordinator.state.keys import lane_queue, queue_for
from coordinator.tracestore.db import connect

router = APIRouter()


def _redis(client: HacoClient) -> str | None:
    try:
        client.redis.ping()
    except Exception as exc:  # any driver failure is "not ready", named
        return f"redis: {exc}"
    return None


def _postgres(settings: HacoSettings) -> str | None:
    url = running_url(settings)
    if url is None:
        return None  # no trace store configured: not needed to serve
    try:
        connect(url, timeout_s=max(1, int(settings.api_inspect_timeout_s))).close()
    except HacoError as exc:
        return str(exc)
    return None


def _workers(client: HacoClient, timeout_s: float) -> str | None:
    try:
        replies: dict[str, Any] = (
            client.app.control.inspect(timeout=timeout_s).active_queues() or {}
        )
    except Exception as exc:  # a broker failure is "not ready", named
        return f"workers: cannot inspect: {exc}"
    consumed = {q.get("name") for queues in replies.values() for q in queues or []}
    # A lane worker's Celery consumer listens on the zone's lane queue (workers/lane.py).
    missing = sorted(z for z in client.pool.zones if not {queue_for(z), lane_queue(z)} & consumed)
    if missing:
        return f"workers: no worker consumes the queues of zones {missing}"
    return None


class Readiness:
    """The cached readiness of the service's dependencies."""

    def __init__(
        self,
        client: HacoClient,
        settings: HacoSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.settings = settings
        self.clock = clock
        self._lock = threading.Lock()
        self._at: float | None = None
        self._problems: list[str] = []

    def _check(self) -> list[str]:
        found = [
            _redis(self.client),
            _postgres(self.settings),
            _workers(self.client, self.settings.api_inspect_timeout_s),
        ]
        return [p for p in found if p is not None]

    def problems(self) -> list[str]:
        with self._lock:
            now = self.clock()
            if self._at is None or now - self._at >= self.settings.api_ready_cache_s:
                self._problems = self._check()
                self._at = self.clock()
            return list(self._problems)


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    readiness: Readiness = request.app.state.readiness
    problems = await asyncio.to_thread(readiness.problems)
    if problems:
        return JSONResponse({"status": "not ready", "problems": problems}, status_code=503)
    zones = sorted(client_of(request).pool.zones)
    pg = running_url(settings_of(request)) is not None
    return JSONResponse({"status": "ready", "zones": zones, "postgres": pg})
