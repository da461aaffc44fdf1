"""CeleryDispatcher's prebuilt member messages (coordinator.state.celery_wire) against
Celery's own: the same list entry as ``send_task`` writes, run and acked by a real Celery
worker, restored after the visibility timeout, one round trip per batch, and Celery's
path where the fast one would differ (events, publish signals).

Real Redis: the broker is this run's leased database (``redis_url``), not keys.BROKER_DB.
"""

from __future__ import annotations

import base64
import json
import math
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis
from celery import Celery, signals
from celery.contrib.testing.worker import start_worker
from kombu import Connection, Queue
from polling import wait_for
from runtime_helpers import SLOW, ScriptedBackend, Step, build_runtime, small_pool
from services import UNREACHABLE_REDIS_URL

from coordinator.config import HacoSettings
from coordinator.errors import AllFailedError, InputError, StoreError
from coordinator.runtime.dispatch import CeleryDispatcher, ThreadDispatcher
from coordinator.state.broker import BROKER_TRANSPORT, celery_conf
from coordinator.state.celery_wire import EMBED
from coordinator.state.keys import MEMBER_TASK, queue_for
from coordinator.state.opening import GroupOpening
from schemas.enums import LaunchMode
from schemas.models import BackendSpec, Candidate, MemberTask, Message

ZONES = frozenset({"local", "remote"})
# What differs between two messages of the same task: fresh ids (the task id is also
# root_id and correlation_id), the repr of the args (JSON text here, saferepr there).
PER_MESSAGE_HEADERS = {"id", "root_id", "argsrepr"}
PER_MESSAGE_PROPERTIES = {"correlation_id", "delivery_tag"}


def member(
    rank: int = 0, zone: str = "local", content: str = "plot the sales – by month"
) -> MemberTask:
    cand = Candidate(
        id=f"c{rank}", role="coder", model="m", zone=zone, backend=BackendSpec(kind="http")
    )
    now = time.time()
    return MemberTask(
        group_id="g1",
        member_id=f"g1.{rank}",
        rank=rank,
        candidate=cand,
        caller_zone="local",
        # Non-ASCII, a non-finite float: encoded as kombu encodes them.
        payload=[Message(role="user", content=content)],
        deadline_at_s=now + 30.0,
        enqueued_at_s=now,
        u_plus=float("inf"),
        r_minus=0.25,
    )


def app_on(broker_url: str, **settings: Any) -> Celery:
    """The sending app of the product (celery_conf), its broker on ``broker_url``."""
    app = Celery("haco", set_as_current=False)
    conf = celery_conf(HacoSettings(**settings), broker_url)
    conf["broker_url"] = broker_url
    app.conf.update(conf)
    return app


@pytest.fixture
def broker(redis_db: redis.Redis, redis_url: str) -> Iterator[tuple[Celery, redis.Redis]]:
    """The product's sending app on an empty broker database, and a client on it."""
    yield app_on(redis_url), redis_db


def entries(r: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """A queue's entries, oldest first (the order a worker pops them)."""
    return [json.loads(raw) for raw in reversed(r.lrange(queue, 0, -1))]


def test_the_entry_is_the_one_send_task_writes(broker: tuple[Celery, redis.Redis]) -> None:
    app, r = broker
    task = member()
    app.send_task(MEMBER_TASK, args=[task.model_dump(mode="json")], queue=queue_for("local"))
    celery_keys = set(r.keys())
    theirs_raw = r.lpop(queue_for("local"))
    dispatcher = CeleryDispatcher(app, ZONES)
    assert dispatcher.fallback is None
    dispatcher.send("local", task)
    assert set(r.keys()) == celery_keys  # the queue and its bindings, nothing more
    ours_raw = r.lpop(queue_for("local"))
    assert isinstance(theirs_raw, bytes) and isinstance(ours_raw, bytes)
    theirs, ours = json.loads(theirs_raw), json.loads(ours_raw)

    # The same layout, key for key and in kombu's order.
    assert list(ours) == list(theirs)
    assert list(ours["headers"]) == list(theirs["headers"])
    assert list(ours["properties"]) == list(theirs["properties"])
    # The body (base64 of the JSON of [args, kwargs, embed]) reads back as the same
    # values: pydantic's compact UTF-8 text here, kombu's spaced ASCII-escaped text there.
    ours_body, theirs_body = (json.loads(base64.b64decode(m["body"])) for m in (ours, theirs))
    assert ours_body == theirs_body
    assert ours_body[0][0]["u_plus"] == math.inf  # Infinity, as kombu writes it, not null
    assert ours_body[0][0]["payload"][0]["content"] == "plot the sales – by month"
    # kwargs and the embed, as kombu writes them.
    tail = f", {{}}, {EMBED}]".encode()
    assert base64.b64decode(ours["body"]).endswith(tail)
    assert base64.b64decode(theirs["body"]).endswith(tail)
    for field in ("content-type", "content-encoding"):
        assert ours[field] == theirs[field]
    # Every header but the per-message ones, the sender's origin and reply-to included.
    for name, value in theirs["headers"].items():
        if name not in PER_MESSAGE_HEADERS:
            assert ours["headers"][name] == value, name
    for name, value in theirs["properties"].items():
        if name not in PER_MESSAGE_PROPERTIES:
            assert ours["properties"][name] == value, name
    h, p = ours["headers"], ours["properties"]
    assert h["id"] == h["root_id"] == p["correlation_id"] != theirs["headers"]["id"]
    assert p["delivery_tag"] != theirs["properties"]["delivery_tag"]
    # argsrepr: the args' JSON text rather than their Python repr.
    assert json.loads(h["argsrepr"]) == [task.model_dump(mode="json")]


def test_a_long_argsrepr_is_cut_like_celerys(broker: tuple[Celery, redis.Redis]) -> None:
    app, r = broker
    CeleryDispatcher(app, ZONES).send("local", member(content="x" * 5000))
    (entry,) = entries(r, queue_for("local"))
    limit = app.amqp.argsrepr_maxsize
    assert len(entry["headers"]["argsrepr"]) == limit + 3
    assert entry["headers"]["argsrepr"].endswith("...")


def test_a_batch_is_one_round_trip_in_order(
    broker: tuple[Celery, redis.Redis], monkeypatch: pytest.MonkeyPatch
) -> None:
    app, r = broker
    dispatcher = CeleryDispatcher(app, ZONES)
    sent: list[int] = []
    send = redis.connection.AbstractConnection.send_packed_command

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        sent.append(1)  # one write to the server: one round trip
        send(self, command, check_health)

    dispatcher.send_many([("local", member(9))])  # connected, its script loaded
    r.delete(queue_for("local"))
    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
    tasks = [member(0, "local"), member(1, "remote"), member(2, "local")]
    dispatcher.send_many([(t.candidate.zone, t) for t in tasks])
    monkeypatch.undo()
    # One round trip: the new queue's bindings and three LPUSHes in one script
    # (send_members.lua); the binding is there, the messages in their order.
    assert len(sent) == 1
    assert r.smembers("_kombu.binding.haco.zone.remote")
    local = [json.loads(base64.b64decode(e["body"]))[0][0] for e in entries(r, "haco.zone.local")]
    assert [t["rank"] for t in local] == [0, 2]
    (remote,) = entries(r, queue_for("remote"))
    assert remote["properties"]["delivery_info"]["routing_key"] == queue_for("remote")
    r.delete("_kombu.binding.haco.zone.local")
    dispatcher.send_many([("local", member(3))])
    # The binding is declared once per dispatcher, as send_task does.
    assert not r.exists("_kombu.binding.haco.zone.local")
    assert len(entries(r, "haco.zone.local")) == 3


def test_an_unknown_zone_sends_nothing(broker: tuple[Celery, redis.Redis]) -> None:
    app, r = broker
    with pytest.raises(InputError, match="mars"):
        CeleryDispatcher(app, ZONES).send_many([("local", member()), ("mars", member(1))])
    assert r.dbsize() == 0


def test_events_on_take_celerys_path(redis_db: redis.Redis, redis_url: str) -> None:
    """With task events on, send_task publishes a task-sent event per member: the
    dispatcher leaves sending to it (the same message, and the event)."""
    app = app_on(redis_url, task_events=True)
    dispatcher = CeleryDispatcher(app, ZONES)
    assert dispatcher.fallback == "task_send_sent_event is on"
    assert dispatcher.redis is None
    dispatcher.send_many([("local", member())])
    (entry,) = entries(redis_db, queue_for("local"))
    assert entry["headers"]["argsrepr"].startswith("[{'group_id'")  # saferepr: Celery's


def test_publish_signal_receivers_take_celerys_path(broker: tuple[Celery, redis.Redis]) -> None:
    app, r = broker
    seen: list[str] = []

    def note(headers: dict[str, Any], **_: Any) -> None:
        seen.append(headers["task"])

    signals.before_task_publish.connect(note, weak=False)
    try:
        CeleryDispatcher(app, ZONES).send("local", member())
    finally:
        signals.before_task_publish.disconnect(note)
    assert seen == [MEMBER_TASK]
    assert r.llen(queue_for("local")) == 1


def test_other_brokers_take_celerys_path() -> None:
    app = Celery("haco", set_as_current=False)
    app.conf.update(broker_url="memory://", task_serializer="json")
    dispatcher = CeleryDispatcher(app, ZONES)
    assert dispatcher.fallback == "broker_url scheme 'memory' is not redis:// or rediss://"


def test_an_unreachable_broker_is_a_store_error() -> None:
    url = UNREACHABLE_REDIS_URL.replace("://", "://haco:s3cret@")
    dispatcher = CeleryDispatcher(app_on(url), ZONES)
    with pytest.raises(StoreError) as info:
        dispatcher.send("remote", member(zone="remote"))
    message = str(info.value)
    assert "s3cret" not in message and "haco:***@127.0.0.1:1" in message
    assert "g1.0 to haco.zone.remote" in message and "unreachable" in message


def test_a_celery_worker_runs_and_acks_the_members(broker: tuple[Celery, redis.Redis]) -> None:
    app, r = broker
    got: list[dict[str, Any]] = []
    lock = threading.Lock()

    @app.task(name=MEMBER_TASK)  # type: ignore[untyped-decorator]
    def run_member(task: dict[str, Any]) -> None:
        with lock:
            got.append(task)

    tasks = [member(0), member(1)]
    CeleryDispatcher(app, ZONES).send_many([("local", t) for t in tasks])
    assert r.llen(queue_for("local")) == 2
    app.conf.task_queues = [Queue(queue_for("local"))]
    with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING"):
        wait_for("the worker to run both members", lambda: len(got) == 2, 20)
        # acks_late: the ack (removal from the unacked hash) follows the run.
        wait_for("the acks", lambda: r.hlen("unacked") == 0, 10)
    assert got == [t.model_dump(mode="json") for t in tasks]
    assert r.llen(queue_for("local")) == 0
    assert r.zcard("unacked_index") == 0


def test_an_unacked_member_is_restored_after_the_visibility_timeout(
    broker: tuple[Celery, redis.Redis], redis_url: str
) -> None:
    """A worker killed holding a member: kombu restores the entry the dispatcher wrote,
    as it restores Celery's, once its visibility timeout has passed."""
    app, r = broker
    CeleryDispatcher(app, ZONES).send("local", member())
    (sent,) = entries(r, queue_for("local"))
    options = {"visibility_timeout": 0.2, "unacked_restore_throttle": 1}
    # A consumer that takes the member and dies without acking or restoring it.
    dead = Connection(redis_url, transport=BROKER_TRANSPORT, transport_options=options)
    taken = dead.default_channel.basic_get(queue_for("local"), no_ack=False)
    assert taken is not None and taken.payload[0][0]["member_id"] == "g1.0"
    assert r.llen(queue_for("local")) == 0 and r.hlen("unacked") == 1
    dead.default_channel.qos._delivered.clear()  # it crashed: nothing to restore on close
    dead.release()
    # Its delivery a minute ago: past the visibility timeout without waiting for it.
    for tag, delivered_at in r.zrange("unacked_index", 0, -1, withscores=True):
        r.zadd("unacked_index", {tag: delivered_at - 60.0})
    with Connection(redis_url, transport=BROKER_TRANSPORT, transport_options=options) as live:
        live.default_channel.qos.restore_visible(num=10, interval=1)
    (back,) = entries(r, queue_for("local"))
    assert back["body"] == sent["body"]
    assert back["headers"]["id"] == sent["headers"]["id"]
    assert back["properties"]["delivery_tag"] == sent["properties"]["delivery_tag"]
    assert back["properties"]["delivery_info"]["redelivered"] is True
    assert r.hlen("unacked") == 0


# ---------------------------------------------------------------- the coordinator's batches


class Recording:
    """The coordinator's calls to its dispatcher (ranks per call), passed on."""

    def __init__(self, inner: ThreadDispatcher) -> None:
        self.inner = inner
        self.calls: list[tuple[str, list[int]]] = []

    def send(self, zone: str, task: MemberTask) -> None:
        self.calls.append(("send", [task.rank]))
        self.inner.send(zone, task)

    def send_many(
        self, items: Sequence[tuple[str, MemberTask]], opening: GroupOpening | None = None
    ) -> None:
        self.calls.append(("send_many", [t.rank for _, t in items]))
        self.inner.send_many(items, opening)


@pytest.mark.parametrize("mode", [LaunchMode.PARALLEL, LaunchMode.STAGGERED])
def test_the_initial_members_go_in_one_batch_later_ones_alone(mode: LaunchMode) -> None:
    # Every member fails at once: staggered replaces each failure, one send at a time.
    backend = ScriptedBackend({f"c{i}": Step(0.005, ok=False) for i in range(3)})
    rt = build_runtime(backend, small_pool(3), initial_hedge_delay_s=SLOW)
    recording = Recording(rt.dispatcher)
    rt.coordinator.dispatcher = recording
    try:
        with pytest.raises(AllFailedError):
            rt.invoke(launch_mode=mode)
    finally:
        rt.dispatcher.close()
    if mode is LaunchMode.PARALLEL:
        assert recording.calls == [("send_many", [0, 1, 2])]
    else:
        assert recording.calls == [("send_many", [0]), ("send", [1]), ("send", [2])]
