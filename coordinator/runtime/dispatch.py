"""Dispatchers: how a member task reaches a worker.

:class:`CeleryDispatcher` puts it on its zone's queue by task name (the product): the
runtime never imports the workers that define the task. It writes Celery's own messages
(:mod:`coordinator.state.celery_wire`) straight into the broker's lists, every member
of a batch in one Redis round trip, and falls back to ``app.send_task`` where those
would differ from Celery's. :class:`ThreadDispatcher` runs it in this process on a
thread pool through an injected runner (the workers' member code, wired by the caller)
against the in-memory store: the second backend the runtime tests run through.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import redis
from celery import Celery, signals
from kombu.exceptions import OperationalError
from redis.backoff import ConstantBackoff
from redis.retry import Retry

from coordinator.config import HacoSettings
from coordinator.errors import StoreError
from coordinator.runtime.pool import check_zone
from coordinator.state.broker import celery_conf
from coordinator.state.celery_wire import MemberWire, task_args, wire_unsupported
from coordinator.state.keys import BUDGET, MEMBER_TASK, group_state, queue_for
from coordinator.state.lean import DEFAULT_HOT_CONNECTIONS, close_lean, lean_for
from coordinator.state.lua import script
from coordinator.state.opening import GroupOpening
from schemas.enums import GroupSignal
from schemas.models import MemberTask

MemberRunner = Callable[[MemberTask], object]

# Celery's default publish retry (task_publish_retry_policy: 3 retries, 0.2 s apart at
# most): a caller gets a StoreError within about 0.6 s while the broker is down, as
# with send_task, rather than after redis-py's default (10 retries, up to 1 s apart).
PUBLISH_RETRY = Retry(ConstantBackoff(0.2), 3)


def sending_app(settings: HacoSettings, redis_url: str) -> Celery:
    """A Celery app that only sends: the same configuration as the workers' app
    (:func:`coordinator.state.broker.celery_conf`), and no tasks of its own."""
    app = Celery("haco", set_as_current=False)
    app.conf.update(celery_conf(settings, redis_url))
    return app


# One ping's wait for the answers: a worker that is up answers in milliseconds, and a
# caller that waits for every worker pings again, so a short wait only costs a retry.
PING_TIMEOUT_S = 0.5


def node_prefix(zone: str) -> str:
    """A worker's Celery node name before ``@host`` (`haco worker`'s ``-n``): the zone's,
    or the judge's for ``judge``."""
    return f"haco-{zone}"


def worker_node(zone: str, host: str) -> str:
    """The Celery node name of ``zone``'s worker on ``host`` (haco-<zone>@<host>)."""
    return f"{node_prefix(zone)}@{host}"


def answering(app: Celery, nodes: Iterable[str], timeout_s: float = PING_TIMEOUT_S) -> set[str]:
    """Which of the Celery ``nodes`` answer one ping within ``timeout_s``."""
    replies = app.control.ping(destination=sorted(nodes), timeout=timeout_s)
    return {name for reply in replies for name in reply}


def await_answers(
    app: Celery,
    nodes: Iterable[str],
    deadline_s: float,
    clock: Callable[[], float] = time.monotonic,
    stop: threading.Event | None = None,
) -> set[str]:
    """Ping ``nodes`` until each has answered, ``clock()`` reaches ``deadline_s`` or
    ``stop`` is set; the nodes that answered. A ping that fails counts as no answer:
    the broker may still be starting."""
    want, seen = set(nodes), set[str]()
    while not want <= seen and clock() < deadline_s and not (stop and stop.is_set()):
        with contextlib.suppress(Exception):
            seen |= answering(app, want - seen)
    return seen


def redacted(url: str) -> str:
    """``url`` without its password, if it has one."""
    return re.sub(r"(://[^/:@]*:)[^/@]*@", r"\1***@", url)


def _publish_hooked() -> bool:
    """Something listens to Celery's publish signals (tracing that injects headers, for
    one): only send_task sends them, so the members take it."""
    return bool(signals.before_task_publish.receivers or signals.after_task_publish.receivers)


class CeleryDispatcher:
    """Members onto ``haco.zone.<zone>`` queues of ``app``'s Redis broker.

    ``broker``: the Redis client on the broker's database (default: one from
    ``app.conf.broker_url``, made here, closed by :meth:`close`). ``app_db``: the
    database of HACO's own keys on the broker's server (keys.APP_DB, as HacoClient's);
    with it a group's opening rides in its members' round trip (open_send.lua), without
    it the opening's own round trip goes first. ``hot_connections``: the broker
    client's connections for that round trip (coordinator.state.lean)."""

    def __init__(
        self,
        app: Any,
        zones: frozenset[str],
        broker: redis.Redis | None = None,
        app_db: int | None = None,
        hot_connections: int = DEFAULT_HOT_CONNECTIONS,
    ) -> None:
        self.app = app
        self.zones = zones
        self.broker_url = redacted(str(app.conf.broker_url))
        # Why members take send_task (events on, another broker …); None: the fast path.
        self.fallback = wire_unsupported(app)
        self.wire: MemberWire | None = None
        self.redis: redis.Redis | None = None
        if self.fallback is None:
            self.wire = MemberWire.from_app(app, MEMBER_TASK)
            self.redis = broker or redis.Redis.from_url(
                str(app.conf.broker_url), retry=PUBLISH_RETRY
            )
            lean = lean_for(self.redis, hot_connections)  # coordinator.state.lean
            self._open_send = lean.script(script("open_send"))
            self._send_members = lean.script(script("send_members"))
        self.app_db = app_db
        # Queues whose binding this dispatcher wrote (send_task declares once too).
        self._declared: set[str] = set()

    def send(self, zone: str, task: MemberTask) -> None:
        self._publish([(zone, task)])

    def send_many(
        self, items: Sequence[tuple[str, MemberTask]], opening: GroupOpening | None = None
    ) -> None:
        """Every (zone, member) of ``items`` in one round trip, in order: members of one
        queue are taken in the order given. ``opening``: the group is opened (and the
        budget credited) first, in the same round trip where it can be."""
        self._publish(items, opening)

    def _publish(
        self, items: Sequence[tuple[str, MemberTask]], opening: GroupOpening | None = None
    ) -> None:
        for zone, _ in items:
            check_zone(zone, self.zones)
        client, wire = self.redis, self.wire
        if wire is None or client is None or _publish_hooked():
            send_each(self.send_task, items, opening)
            return
        fused = opening is not None and self.app_db is not None and bool(items)
        if opening is not None and not fused:
            opening.open()  # its own round trip, before any member can start
        reply_to = self.app.thread_oid
        declared: list[str] = []
        bindings: list[tuple[str, str]] = []
        entries: list[tuple[str, str]] = []
        for zone, task in items:
            queue = wire.queue(queue_for(zone))
            if queue.name not in self._declared and queue.name not in declared:
                # The queue's binding, as send_task declares it: kombu routes messages
                # that name the exchange (celery call, other senders) by this table.
                bindings.append((queue.binding_key, queue.binding))
                bindings.append((queue.permanent_key, queue.binding))
                declared.append(queue.name)
            # The task's JSON in one pass of pydantic's serializer (celery_wire.task_args).
            _, entry = wire.message(queue, task_args(task.model_dump_json()), reply_to)
            entries.append((queue.key, entry))
        try:
            if fused and opening is not None:
                self._send_opening(client, opening, bindings, entries)
            else:
                self._send_members(*_batch(bindings, entries))
        except redis.RedisError as exc:
            members = ", ".join(f"{t.member_id} to {queue_for(z)}" for z, t in items)
            lost = isinstance(exc, (redis.ConnectionError, redis.TimeoutError))
            why = "unreachable" if lost else "failing"
            raise StoreError(
                f"the Celery broker at {self.broker_url} is {why}, failed to send member "
                f"{members}: {exc}"
            ) from exc
        self._declared.update(declared)

    def _send_opening(
        self,
        client: redis.Redis,
        o: GroupOpening,
        bindings: list[tuple[str, str]],
        entries: list[tuple[str, str]],
    ) -> None:
        """The group opened, the budget credited and the members queued: one script."""
        amount, budget_ttl_ms = o.credit if o.credit is not None else (0.0, 0)
        broker_db = int(client.connection_pool.connection_kwargs.get("db", 0))
        batch_keys, batch_args = _batch(bindings, entries)
        args: list[str | int] = [
            self.app_db or 0, broker_db, GroupSignal.OPEN.value,
            max(1, int(o.ttl_s * 1000)), repr(float(amount)), budget_ttl_ms, *batch_args,
        ]  # fmt: skip
        self._open_send([group_state(o.group_id), BUDGET, *batch_keys], args)

    def send_task(self, zone: str, task: MemberTask) -> None:
        """One member through Celery's own publish path (``app.send_task``)."""
        check_zone(zone, self.zones)
        try:
            self.app.send_task(
                MEMBER_TASK, args=[task.model_dump(mode="json")], queue=queue_for(zone)
            )
        except OperationalError as exc:  # the broker is unreachable, after Celery's retries
            raise StoreError(
                f"the Celery broker at {self.broker_url} is unreachable, failed to send "
                f"member {task.member_id} to {queue_for(zone)}: {exc}"
            ) from exc

    def close(self) -> None:
        if self.redis is not None:
            close_lean(self.redis)
            self.redis.close()


def _batch(
    bindings: list[tuple[str, str]], entries: list[tuple[str, str]]
) -> tuple[list[str], list[str | int]]:
    """A batch as queue_batch.lua takes it: the binding sets and queues as keys; the
    number of bindings, the bindings and the messages as arguments."""
    names = [k for k, _ in bindings] + [k for k, _ in entries]
    args: list[str | int] = [len(bindings), *(b for _, b in bindings)]
    args += [e for _, e in entries]
    return names, args


def send_each(
    send: Callable[[str, MemberTask], None],
    items: Sequence[tuple[str, MemberTask]],
    opening: GroupOpening | None = None,
) -> None:
    """``items`` one ``send`` at a time, the group opened first (``opening``): a
    dispatcher with no round trip to share does its send_many this way."""
    if opening is not None:
        opening.open()
    for zone, task in items:
        send(zone, task)


class ThreadDispatcher:
    def __init__(self, run: MemberRunner, zones: frozenset[str], max_workers: int = 32) -> None:
        self.run = run
        self.zones = zones
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="haco-member")
        self.futures: list[Future[Any]] = []

    def send(self, zone: str, task: MemberTask) -> None:
        check_zone(zone, self.zones)
        self.futures.append(self.pool.submit(self.run, task))

    def send_many(
        self, items: Sequence[tuple[str, MemberTask]], opening: GroupOpening | None = None
    ) -> None:
        # No round trip to save; through send, so subclasses that hold tasks see each.
        send_each(self.send, items, opening)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        for f in self.futures:
            f.result()  # surface member errors instead of losing them
