"""The status page of `haco serve`: ``GET /dashboard`` (one self-contained HTML page:
inline CSS, inline JS drawing inline SVG, nothing fetched from elsewhere) and
``GET /v1/dashboard`` (the JSON it polls every few seconds).

Auth: the page itself holds no data and is public, like /healthz; its data lives under
/v1, so it needs the bearer token whenever HACO_API_TOKENS is set, exactly like
/v1/profiles. A browser opens ``/dashboard#token=<token>``: the fragment never leaves the
browser (no access log, no Referer), and the page's script sends it as
``Authorization: Bearer``. Without a token configured, ``/dashboard`` just works.

What the JSON holds:

- ``profiles``: every candidate's effective profile (μ ± σ, ρ, failure rates, latency
  mean and p50/p95, calls), as GET /v1/profiles.
- ``fleet``: the fleet's counters (``keys.METRICS``, written by every coordinator at each
  group close): invocations, hedge rate, backups, backup win rate, all-failed rate,
  refused backup spends.
- ``budget``: the hedge budget's two buckets (now / capacity), backups spent, refusals.
- ``zones``: the rows of `haco zones` (coordinator/runtime/zone_view.py): workers,
  queue depth, in flight, latency, win share, last failure; worker inspection is cached
  for :data:`INSPECT_CACHE_S`.
- ``share``: wins per zone in :data:`SHARE_BINS` bins over the last one to ten minutes
  (as far back as the recent wins go), from the recent member reports and verdicts
  (trace stream, and the trace store when configured): fleet-wide, and it survives a
  restart of this service.
- ``series``: the fleet counters sampled at each poll, kept in the app's state (the last
  :data:`SERIES_LEN` samples, at least :data:`SAMPLE_EVERY_S` apart): the page draws the
  hedge and all-failed rates over time from their differences.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from typing import Any

import redis
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from coordinator.api.dashboard_page import PAGE
from coordinator.api.deps import client_of, settings_of
from coordinator.config import HacoSettings
from coordinator.core.evidence import link_id
from coordinator.errors import HacoError, StoreError
from coordinator.runtime.client import HacoClient
from coordinator.runtime.profile_view import profile_rows
from coordinator.runtime.zone_view import (
    Recent,
    WorkerView,
    inspect_workers,
    queue_depths,
    read_recent,
    share_series,
    supervisor_restarts,
    zone_rows,
)
from coordinator.services.embedded_pg import running_url

router = APIRouter()

INSPECT_CACHE_S = 5.0
SHARE_BINS = 30
SHARE_MIN_SPAN_S, SHARE_MAX_SPAN_S = 60.0, 600.0
SERIES_LEN = 240
SAMPLE_EVERY_S = 2.0
WINDOW_S = 900.0
FLEET_COUNTERS = ("invocations", "hedged", "backups", "backup_wins", "state:all_failed",
                  "state:won", "state:deadline", "budget_refused")  # fmt: skip


class DashboardState:
    """What the page's data keeps between polls: the sampled counters, the last worker
    inspection, a client on the broker database."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.series: deque[dict[str, Any]] = deque(maxlen=SERIES_LEN)
        self.workers: WorkerView | None = None
        self.workers_at = 0.0
        self.broker: redis.Redis | None = None

    def sample(self, now: float, fleet: dict[str, int]) -> list[dict[str, Any]]:
        with self.lock:
            if not self.series or now - self.series[-1]["t"] >= SAMPLE_EVERY_S:
                self.series.append({"t": now, **{k: fleet.get(k, 0) for k in FLEET_COUNTERS}})
            return list(self.series)

    def inspected(self, client: HacoClient, timeout_s: float) -> WorkerView:
        with self.lock:
            fresh = (
                self.workers is not None and time.monotonic() - self.workers_at < INSPECT_CACHE_S
            )
            if fresh and self.workers is not None:
                return self.workers
        view = inspect_workers(client.app, timeout_s)
        with self.lock:
            self.workers, self.workers_at = view, time.monotonic()
        return view

    def broker_of(self, client: HacoClient) -> redis.Redis:
        with self.lock:
            if self.broker is None:
                self.broker = redis.Redis.from_url(str(client.app.conf.broker_url))
            return self.broker


def state_of(request: Request) -> DashboardState:
    state: DashboardState | None = getattr(request.app.state, "dashboard", None)
    if state is None:
        state = request.app.state.dashboard = DashboardState()
    return state


def _ratio(n: float, d: float) -> float | None:
    return n / d if d > 0 else None


def _profiles(client: HacoClient) -> list[dict[str, Any]]:
    pool = client.pool
    roles = sorted(pool.by_role)
    cands = [c for r in roles for c in pool.candidates(r)]
    caller = pool.config.caller_zone
    view = client.store.load_view(
        [c.id for c in cands], sorted({link_id(caller, c.zone) for c in cands})
    )
    rows = [row for r in roles for row in profile_rows(pool.candidates(r), caller, view)]
    for row in rows:
        prof = view.candidates.get(row["candidate"])
        row["latency_mean_s"] = None if prof is None else prof.latency.mean
    return rows


def _fleet(fleet: dict[str, int]) -> dict[str, Any]:
    n = fleet.get("invocations", 0)
    return {
        "counters": {k: fleet.get(k, 0) for k in FLEET_COUNTERS},
        "hedge_rate": _ratio(fleet.get("hedged", 0), n),
        "backup_win_rate": _ratio(fleet.get("backup_wins", 0), n),
        "backup_win_share": _ratio(fleet.get("backup_wins", 0), fleet.get("backups", 0)),
        "all_failed_rate": _ratio(fleet.get("state:all_failed", 0), n),
    }


def _budget(client: HacoClient, settings: HacoSettings) -> dict[str, Any]:
    try:
        snap = client.coordinator.budget.snapshot()
    except HacoError as exc:
        return {"error": str(exc)}
    return {
        "request_tokens": snap.request_tokens, "request_capacity": settings.budget_burst,
        "llm_tokens": snap.llm_tokens, "llm_capacity": settings.budget_tokens_burst,
        "spent_backups": snap.spent_backups, "exhausted": snap.exhausted,
        "ratio": settings.budget_ratio,
    }  # fmt: skip


def _share(recent: Recent, zones: list[str], now: float) -> dict[str, Any]:
    """Wins per zone over time: :data:`SHARE_BINS` bins spanning the recent wins (at
    least :data:`SHARE_MIN_SPAN_S`, at most :data:`SHARE_MAX_SPAN_S`)."""
    wins = recent.win_zones()
    oldest = wins[0][0] if wins else now
    span = min(SHARE_MAX_SPAN_S, max(SHARE_MIN_SPAN_S, now - oldest))
    bin_s = span / SHARE_BINS
    return {"bin_s": bin_s, "bins": share_series(recent, zones, now, bin_s, SHARE_BINS)}


def read_dashboard(
    client: HacoClient, settings: HacoSettings, state: DashboardState
) -> dict[str, Any]:
    """Everything the page shows (see the module docstring)."""
    now = time.time()
    zones = sorted(client.pool.zones)
    problems: list[str] = []
    try:
        fleet = client.store.metrics()
        depths: dict[str, int] | None = queue_depths(state.broker_of(client), zones)
    except (redis.RedisError, StoreError) as exc:
        raise StoreError(f"redis failed to read the dashboard's data: {exc}") from exc
    recent = read_recent(client.redis, running_url(settings), WINDOW_S, now)
    workers = state.inspected(client, settings.api_inspect_timeout_s)
    rows = zone_rows(zones, depths, workers, recent, supervisor_restarts(settings.state_dir))
    problems += [p for p in (workers.problem, *recent.problems) if p]
    return {
        "at": now,
        "caller_zone": client.pool.config.caller_zone,
        "roles": sorted(client.pool.by_role),
        "profiles": _profiles(client),
        "fleet": _fleet(fleet),
        "budget": _budget(client, settings),
        "zones": [r.to_dict() for r in rows],
        "share": _share(recent, zones, now),
        "series": state.sample(now, fleet),
        "sources": recent.sources,
        "problems": problems,
    }


@router.get("/dashboard", include_in_schema=False)
async def dashboard_page() -> HTMLResponse:
    return HTMLResponse(PAGE, headers={"cache-control": "no-store"})


@router.get("/v1/dashboard")
async def dashboard_data(request: Request) -> dict[str, Any]:
    client, settings, state = client_of(request), settings_of(request), state_of(request)
    return await asyncio.to_thread(read_dashboard, client, settings, state)
