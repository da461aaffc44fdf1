"""The Celery app, defined explicitly: no ``shared_task``, no default app.

One queue per zone, ``haco.zone.<zone>``, consumed by the workers of that zone. Member
tasks are acknowledged late and rejected (requeued) when their worker is lost, one at a
time per worker thread; their results are ignored — members reply on their group's
Redis list, which is the only reply path. The broker is Redis database
:data:`coordinator.keys.BROKER_DB`, apart from HACO's own keys.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from celery import Celery
from pydantic import ValidationError

from coordinator import keys
from coordinator.config import HacoSettings
from coordinator.errors import ConfigError, InputError
from coordinator.hedgedelay import RedisDelayWindow
from coordinator.store import RedisStore
from schemas.models import MemberTask
from schemas.pool import SimSection
from workers.backends.base import Backend
from workers.backends.sim import SimBackend
from workers.member import MemberContext, execute_member

MEMBER_TASK = "haco.member"
log = logging.getLogger(__name__)


def queue_for(zone: str) -> str:
    return f"haco.zone.{zone}"


def with_db(url: str, db: int) -> str:
    """The same Redis server, another database number (redis://host:port/db)."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise ConfigError(f"redis URL {url!r}: expected a redis:// or rediss:// URL")
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class WorkerRuntime:
    """Per-process state of a worker, built on first use (no import-time side effects)."""

    def __init__(self, settings: HacoSettings, redis_url: str) -> None:
        self.settings = settings
        self.redis_url = redis_url
        self._lock = threading.Lock()
        self._ctx: MemberContext | None = None
        self._sims: dict[tuple[str, float], SimBackend] = {}

    def context(self) -> MemberContext:
        with self._lock:
            if self._ctx is None:
                client = redis.Redis.from_url(with_db(self.redis_url, keys.APP_DB))
                self._client = client
                self._ctx = MemberContext(
                    store=RedisStore(client),
                    backends=self.backend_for,
                    settings=self.settings,
                    delays=RedisDelayWindow(client, self.settings),
                )
            return self._ctx

    def _faults(self) -> Mapping[str, float]:
        raw = self._client.hgetall(keys.SIM_FAULTS)
        return {_text(k): float(v) for k, v in raw.items()}

    def _effect(self, task: MemberTask) -> None:
        key = keys.sim_effects(task.idempotency_key or task.member_id)
        pipe = self._client.pipeline(transaction=True)
        pipe.incr(key)
        pipe.pexpire(key, int(self.settings.idempotency_ttl_s * 1000))
        pipe.execute()

    def backend_for(self, task: MemberTask) -> Backend:
        spec = task.candidate.backend
        if spec.kind != "sim":
            raise InputError(f"backend kind {spec.kind!r} is not available in this worker")
        sim = SimSection.model_validate(spec.settings.get("sim", {}))
        scale = sim.time_scale or self.settings.sim_time_scale
        key = (sim.scenario, scale)
        with self._lock:
            if key not in self._sims:
                from coordinator.poolconfig import sim_scenario  # noqa: PLC0415 - avoids a cycle

                self._sims[key] = SimBackend(
                    sim_scenario(sim),
                    scale,
                    self.settings.cancel_poll_s,
                    self._faults,
                    commit_effect=self._effect,
                )
            return self._sims[key]


def create_app(settings: HacoSettings, redis_url: str) -> Celery:
    app = Celery("haco", set_as_current=False)
    app.conf.update(
        broker_url=with_db(redis_url, keys.BROKER_DB),
        broker_transport_options={"visibility_timeout": settings.visibility_timeout_s},
        broker_connection_retry_on_startup=True,
        result_backend=None,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_pool="threads",
        worker_concurrency=settings.worker_concurrency,
        worker_hijack_root_logger=False,
        task_serializer="json",
        accept_content=["json"],
        # Flower and `celery events` see member tasks only with events on.
        worker_send_task_events=True,
        task_send_sent_event=True,
    )
    runtime = WorkerRuntime(settings, redis_url)

    @app.task(name=MEMBER_TASK, ignore_result=True, acks_late=True)
    def member(payload: dict[str, Any]) -> None:
        try:
            task = MemberTask.model_validate(payload)
        except ValidationError as exc:
            # A malformed payload cannot be answered (it may lack a group); it is
            # logged loudly and acknowledged so it does not loop through the queue.
            log.error("rejected member task payload: %s", exc)
            return
        execute_member(task, runtime.context())

    app.conf.haco_runtime = runtime
    return app
