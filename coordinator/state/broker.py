"""Where Celery's broker lives, and the one Celery configuration every process shares.

The broker is Redis database :data:`keys.BROKER_DB` of the same server as HACO's own
keys (:data:`keys.APP_DB`). The runtime builds a sending app from :func:`celery_conf`;
the workers build the consuming app from the same function, so the two cannot disagree
on serializer, routing or acknowledgement.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from coordinator.config import HacoSettings
from coordinator.errors import ConfigError
from coordinator.state import keys

BROKER_TRANSPORT = "coordinator.state.kombu_redis:Transport"


def with_db(url: str, db: int) -> str:
    """The same Redis server, another database number (redis://host:port/db)."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise ConfigError(f"redis URL {url!r}: expected a redis:// or rediss:// URL")
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


def celery_conf(settings: HacoSettings, redis_url: str) -> dict[str, Any]:
    """Celery settings for a HACO app on the server at ``redis_url``."""
    return {
        "broker_url": with_db(redis_url, keys.BROKER_DB),
        # kombu's Redis transport with a fix for losing the broker under load
        # (coordinator/state/kombu_redis.py); redis:// URLs as before.
        "broker_transport": BROKER_TRANSPORT,
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout_s,
            # kombu's defaults, named: a member's report script acks by these keys.
            "unacked_key": keys.UNACKED_HASH,
            "unacked_index_key": keys.UNACKED_INDEX,
        },
        # Reconnection (a restarted Redis, e.g. the embedded one under `haco up`'s
        # supervisor, comes back on the same URL): a worker that loses the broker
        # restarts its consumer and retries the connection (kombu's ensure_connection:
        # 2 s, then 4 s … up to 30 s apart) forever, not the default 100 times, after
        # which the worker would exit. Senders publish with Celery's default retry
        # (task_publish_retry: 3 retries within about 0.6 s), then fail: a caller gets
        # an error (StoreError naming the broker) instead of hanging while Redis is down.
        "broker_connection_retry": True,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        "result_backend": None,
        "task_ignore_result": True,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "worker_pool": "threads",
        "worker_concurrency": settings.worker_concurrency,
        "worker_hijack_root_logger": False,
        "task_serializer": "json",
        "task_routes": {keys.JUDGE_TASK: {"queue": keys.JUDGE_QUEUE}},
        "accept_content": ["json"],
        # Flower and `celery events` see member tasks only with events on (opt-in).
        "worker_send_task_events": settings.task_events,
        "task_send_sent_event": settings.task_events,
    }
