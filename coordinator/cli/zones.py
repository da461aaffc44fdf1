"""`haco zones [--watch]`: the zones of the pool at a glance — queue depth, the workers
that consume each zone's queue (a zone without one is **missing**), members in flight,
recent member latency, share of recent wins, the last failure, supervised restarts.
Where each column comes from: coordinator/runtime/zone_view.py."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from coordinator.cli.common import clean_errors, err, show
from coordinator.config import HacoSettings
from coordinator.errors import InputError, StoreError

if TYPE_CHECKING:
    from coordinator.runtime.zone_view import ZoneRow

DEFAULT_WINDOW_S = 900.0


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1000:.0f}"


def _ago(at_s: float, now_s: float) -> str:
    d = max(0.0, now_s - at_s)
    if d < 120:
        return f"{d:.0f}s ago"
    if d < 7200:
        return f"{d / 60:.0f}m ago"
    return f"{d / 3600:.1f}h ago"


def _failure(f: dict[str, Any] | None, now_s: float) -> str:
    if f is None:
        return "—"
    reason = (f.get("reason") or f.get("kind") or f.get("status") or "")[:48]
    return f"{_ago(f['at_s'], now_s)} {f['candidate']}: {reason}"


def zones_table(rows: list[ZoneRow], title: str, now_s: float) -> Table:
    t = Table(title=title)
    cols = ("zone", "status", "workers", "queued", "in flight", "members", "p50 ms",
            "p95 ms", "win share", "last failure", "restarts")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="left" if col in ("zone", "status", "last failure") else "right")
    for r in rows:
        status = "[green]ok[/]" if r.status == "ok" else f"[bold red]{r.status}[/]"
        share = "—" if r.win_share is None else f"{r.win_share:.0%}"
        t.add_row(
            r.zone, status, str(len(r.workers)), "—" if r.queued is None else str(r.queued),
            "—" if r.in_flight is None else str(r.in_flight), f"{r.members} ({r.failures} failed)",
            _ms(r.latency_p50_s), _ms(r.latency_p95_s), share, _failure(r.last_failure, now_s),
            "—" if r.restarts is None else str(r.restarts),
        )  # fmt: skip
    return t


def collect(settings: HacoSettings, timeout_s: float, window_s: float) -> dict[str, Any]:
    """Every zone's row, and what the figures were read from."""
    import redis

    from coordinator.runtime.client import service_url
    from coordinator.runtime.dispatch import sending_app
    from coordinator.runtime.pool import Pool, pool_from_settings
    from coordinator.runtime.zone_view import (
        inspect_workers,
        queue_depths,
        read_recent,
        supervisor_restarts,
        zone_rows,
    )
    from coordinator.services.embedded_pg import running_url
    from coordinator.state import keys
    from coordinator.state.broker import with_db

    pool = Pool(pool_from_settings(settings))
    zones = sorted(pool.zones)
    url = service_url(settings)
    broker = redis.Redis.from_url(with_db(url, keys.BROKER_DB))
    client = redis.Redis.from_url(with_db(url, keys.APP_DB))
    try:
        depths = queue_depths(broker, zones)
        recent = read_recent(client, running_url(settings), window_s)
    except redis.RedisError as exc:
        raise StoreError(f"redis failed to read the queues: {exc}") from exc
    finally:
        broker.close()
        client.close()
    app = sending_app(settings, url)
    try:
        workers = inspect_workers(app, timeout_s)
    finally:
        app.close()
    restarts = supervisor_restarts(settings.state_dir)
    rows = zone_rows(zones, depths, workers, recent, restarts)
    problems = [p for p in (workers.problem, *recent.problems) if p]
    return {
        "at": datetime.now(UTC).isoformat(),
        "window_s": window_s,
        "sources": recent.sources,
        "supervisor": restarts is not None,
        "problems": problems,
        "missing": [r.zone for r in rows if r.status == "missing"],
        "zones": [r.to_dict() for r in rows],
        "_rows": rows,
    }


def _render(found: dict[str, Any]) -> Table:
    from_ = " + ".join(found["sources"]) or "nothing"
    title = f"zones — recent {found['window_s']:.0f} s from {from_}"
    t = zones_table(found["_rows"], title, time.time())
    notes = []
    if found["missing"]:
        notes.append(f"no worker consumes the queues of {', '.join(found['missing'])}")
    notes.extend(found["problems"])
    if notes:
        t.caption = "; ".join(notes)
    return t


@clean_errors
def zones_cmd(
    watch: Annotated[bool, typer.Option("--watch", help="Refresh live until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes (--watch)")] = 2.0,
    timeout: Annotated[
        float | None, typer.Option(help="Seconds to wait for worker replies (default: settings)")
    ] = None,
    window: Annotated[
        float, typer.Option(help="Seconds of recent members for latency, wins, failures")
    ] = DEFAULT_WINDOW_S,
) -> None:
    """Each zone of the pool: queue depth, workers online (a zone without one is missing),
    members in flight, p50/p95 member latency, share of recent wins, last failure,
    supervised restarts. A table on stderr and JSON on stdout; --watch refreshes the table
    until Ctrl-C."""
    settings = HacoSettings()
    wait_s = settings.api_inspect_timeout_s if timeout is None else timeout
    if interval <= 0 or wait_s <= 0 or window <= 0:
        raise InputError("--interval, --timeout and --window must be positive")
    if not watch:
        found = collect(settings, wait_s, window)
        show(_render(found))
        found.pop("_rows")
        print(json.dumps(found, indent=2))
        return
    watch_zones(lambda: _render(collect(settings, wait_s, window)), interval)


def watch_zones(
    render: Callable[[], Any], interval_s: float, sleep: Callable[[float], object] = time.sleep
) -> None:
    """Redraw ``render()`` every ``interval_s`` until Ctrl-C (``sleep`` injectable)."""
    from rich.live import Live

    try:
        with Live(render(), console=err, auto_refresh=False) as live:
            while True:
                sleep(interval_s)
                live.update(render(), refresh=True)
    except KeyboardInterrupt:
        pass


def register_zones(app: typer.Typer) -> None:
    app.command("zones")(zones_cmd)
