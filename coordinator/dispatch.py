"""Dispatchers: how a member task reaches a worker.

:class:`CeleryDispatcher` puts it on its zone's queue (the product).
:class:`ThreadDispatcher` runs it in this process on a thread pool against the same
member code, with the in-memory store: the second backend the runtime tests run through.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from coordinator.errors import UnknownZoneError
from schemas.models import MemberTask
from workers.app import MEMBER_TASK, queue_for
from workers.member import MemberContext, execute_member


class CeleryDispatcher:
    def __init__(self, app: Any, zones: frozenset[str]) -> None:
        self.app = app
        self.zones = zones

    def send(self, zone: str, task: MemberTask) -> None:
        # Checked again here: a misspelled zone would create a queue nobody consumes.
        if zone not in self.zones:
            raise UnknownZoneError(
                f"unknown zone {zone!r}; the pool's zones are {sorted(self.zones)}"
            )
        self.app.send_task(MEMBER_TASK, args=[task.model_dump(mode="json")], queue=queue_for(zone))


class ThreadDispatcher:
    def __init__(self, ctx: MemberContext, zones: frozenset[str], max_workers: int = 32) -> None:
        self.ctx = ctx
        self.zones = zones
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="haco-member")
        self.futures: list[Future[Any]] = []

    def send(self, zone: str, task: MemberTask) -> None:
        if zone not in self.zones:
            raise UnknownZoneError(
                f"unknown zone {zone!r}; the pool's zones are {sorted(self.zones)}"
            )
        self.futures.append(self.pool.submit(execute_member, task, self.ctx))

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        for f in self.futures:
            f.result()  # surface member errors instead of losing them
