"""Dispatchers: how a member task reaches a worker.

:class:`CeleryDispatcher` puts it on its zone's queue by task name (the product): the
runtime never imports the workers that define the task. :class:`ThreadDispatcher` runs
it in this process on a thread pool through an injected runner (the workers' member
code, wired by the caller) against the in-memory store: the second backend the runtime
tests run through.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from celery import Celery
from kombu.exceptions import OperationalError

from coordinator.config import HacoSettings
from coordinator.errors import StoreError
from coordinator.runtime.pool import check_zone
from coordinator.state.broker import celery_conf
from coordinator.state.keys import MEMBER_TASK, queue_for
from schemas.models import MemberTask

MemberRunner = Callable[[MemberTask], object]


def sending_app(settings: HacoSettings, redis_url: str) -> Celery:
    """A Celery app that only sends: the same configuration as the workers' app
    (:func:`coordinator.state.broker.celery_conf`), and no tasks of its own."""
    app = Celery("haco", set_as_current=False)
    app.conf.update(celery_conf(settings, redis_url))
    return app


class CeleryDispatcher:
    def __init__(self, app: Any, zones: frozenset[str]) -> None:
        self.app = app
        self.zones = zones

    def send(self, zone: str, task: MemberTask) -> None:
        check_zone(zone, self.zones)
        try:
            self.app.send_task(
                MEMBER_TASK, args=[task.model_dump(mode="json")], queue=queue_for(zone)
            )
        except OperationalError as exc:  # the broker is unreachable, after Celery's retries
            # Without its password, if it has one.
            broker = re.sub(r"(://[^/:@]*:)[^/@]*@", r"\1***@", str(self.app.conf.broker_url))
            raise StoreError(
                f"the Celery broker at {broker} is unreachable, failed to send member "
                f"{task.member_id} to {queue_for(zone)}: {exc}"
            ) from exc


class ThreadDispatcher:
    def __init__(self, run: MemberRunner, zones: frozenset[str], max_workers: int = 32) -> None:
        self.run = run
        self.zones = zones
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="haco-member")
        self.futures: list[Future[Any]] = []

    def send(self, zone: str, task: MemberTask) -> None:
        check_zone(zone, self.zones)
        self.futures.append(self.pool.submit(self.run, task))

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        for f in self.futures:
            f.result()  # surface member errors instead of losing them
