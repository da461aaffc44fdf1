"""Maintenance tasks of the Celery app (:func:`workers.app.create_app`): the periodic
profile recompute (``haco.recompute``, coordinator.tracestore.recompute) every
``recompute_interval_s`` and the trace store's retention (``haco.retention``: daily
partitions ahead, old ones dropped) every ``retention_interval_s``, on queue
``haco.maintenance``, scheduled by Celery beat.

Run the scheduler and the consumer of the queue with ``haco beat`` (one process: a solo
worker on ``haco.maintenance`` with an embedded beat). ``celery -A … beat`` cannot find
the app, which is built explicitly by ``create_app`` (no module-level app); ``haco
recompute`` runs one recompute now without Celery. Run one beat per deployment: two
would recompute twice as often (harmless: a Postgres advisory lock serialises them).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis

from coordinator.config import HacoSettings
from coordinator.errors import HacoError
from coordinator.runtime.pool import configured_domain_pools
from coordinator.services import embedded_pg
from coordinator.state.keys import MAINTENANCE_QUEUE, RECOMPUTE_TASK, RETENTION_TASK
from coordinator.tracestore.db import connect
from coordinator.tracestore.migrate import drop_older_than, ensure_partitions
from coordinator.tracestore.recompute import recompute_once

RETENTION_ENTRY = "haco-retention"
PARTITIONS_AHEAD_DAYS = 7  # daily partitions kept ready, so rows rarely land in default
SCHEDULE_ENTRY = "haco-recompute"
log = logging.getLogger(__name__)


def register_maintenance(app: Any, settings: HacoSettings, app_redis_url: str) -> None:
    """Add the recompute task and its beat schedule to ``app``. ``app_redis_url``: the
    application database (keys.APP_DB), not the broker's."""

    def recompute() -> None:
        pools = configured_domain_pools(settings, log.warning)
        client = redis.Redis.from_url(app_redis_url)
        try:
            url = embedded_pg.trace_store_url(settings)
            result = recompute_once(client, url, settings, pools=pools)
        except HacoError as exc:  # logged, not retried: the next beat tick tries again
            log.error("profile recompute failed: %s", exc)
            return
        finally:
            client.close()
        log.info("profile recompute: %s", result.to_dict())

    # shared=False: a shared task would be added to every app created later in the process.
    app.task(name=RECOMPUTE_TASK, ignore_result=True, shared=False)(recompute)
    schedule = dict(app.conf.beat_schedule or {})
    schedule[SCHEDULE_ENTRY] = {
        "task": RECOMPUTE_TASK,
        "schedule": settings.recompute_interval_s,
        # A tick nobody consumed in time is dropped, not piled up behind a stopped worker.
        "options": {"queue": MAINTENANCE_QUEUE, "expires": settings.recompute_interval_s},
    }
    _register_retention(app, settings, schedule)
    app.conf.beat_schedule = schedule


def _register_retention(app: Any, settings: HacoSettings, schedule: dict[str, Any]) -> None:
    """Keep the daily partitions ahead and drop the ones older than retention_days."""

    def retention() -> None:
        try:
            url = embedded_pg.running_url(settings)
            if not url:
                log.info("retention skipped: no trace store configured")
                return
            cutoff = datetime.now(UTC) - timedelta(days=settings.retention_days)
            with connect(url) as conn:
                created = ensure_partitions(conn, PARTITIONS_AHEAD_DAYS)
                result = drop_older_than(conn, cutoff)
        except HacoError as exc:  # logged: the next tick tries again
            log.error("retention failed: %s", exc)
            return
        log.info(
            "retention: created %s, dropped %s, deleted %d default rows",
            created,
            result.dropped,
            result.deleted,
        )

    app.task(name=RETENTION_TASK, ignore_result=True, shared=False)(retention)
    schedule[RETENTION_ENTRY] = {
        "task": RETENTION_TASK,
        "schedule": settings.retention_interval_s,
        "options": {"queue": MAINTENANCE_QUEUE, "expires": settings.retention_interval_s},
    }


def beat_argv(settings: HacoSettings) -> list[str]:
    """``worker_main`` arguments of the maintenance process: beat + a solo worker."""
    schedule_file = Path(settings.state_dir).absolute() / "celerybeat-schedule"
    schedule_file.parent.mkdir(parents=True, exist_ok=True)
    return [
        "worker",
        "--queues",
        MAINTENANCE_QUEUE,
        "--beat",
        "--schedule",
        str(schedule_file),
        "--pool",
        "solo",
        "--hostname",
        "haco-maintenance@%h",
        "--loglevel",
        "INFO",
        "--without-mingle",
        "--without-gossip",
    ]
