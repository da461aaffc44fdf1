"""A member's Celery message acknowledged by its report script (the report and the ack
one atomic step, one round trip fewer per member): kombu's unacked entries go in the
broker's database of the same server, and kombu's own ack of that tag afterwards only
does its bookkeeping. Real Redis and a real Celery worker."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from kombu import Connection, Exchange, Queue
from polling import wait_for
from services import flush_runtime_dbs

from coordinator.config import HacoSettings
from coordinator.core.params import ProfileSettings
from coordinator.state import keys
from coordinator.state.broker import BROKER_TRANSPORT, celery_conf, with_db
from coordinator.state.memberops import BrokerAck, MemberOutcome, OutcomeLimits
from coordinator.state.scriptacks import SCRIPT_ACKS
from coordinator.state.store import RedisStore
from workers.app import script_acks

TTL = 60.0
LIMITS = OutcomeLimits(profile_ttl_s=TTL, trace_maxlen=1000, trace_ttl_s=TTL)


@pytest.fixture
def dbs(runtime_redis_url: str) -> Iterator[tuple[redis.Redis, redis.Redis]]:
    flush_runtime_dbs(runtime_redis_url)
    app_r = redis.Redis.from_url(with_db(runtime_redis_url, keys.APP_DB))
    broker_r = redis.Redis.from_url(with_db(runtime_redis_url, keys.BROKER_DB))
    yield app_r, broker_r
    app_r.close()
    broker_r.close()
    flush_runtime_dbs(runtime_redis_url)


def _outcome(group: str, owner: str, ack: BrokerAck | None) -> MemberOutcome:
    return MemberOutcome(group, '{"report": 1}', TTL, True, f"outcome:{group}.0", owner, ack=ack)


def _unacked(r: redis.Redis) -> tuple[list[bytes], list[bytes]]:
    return sorted(r.hkeys(keys.UNACKED_HASH)), r.zrange(keys.UNACKED_INDEX, 0, -1)


@pytest.mark.parametrize("owner", ["worker", "someone else"])
def test_the_report_removes_its_message_from_kombus_unacked_entries(
    dbs: tuple[redis.Redis, redis.Redis], owner: str
) -> None:
    app_r, broker_r = dbs
    for tag in ("t1", "t2"):
        broker_r.hset(keys.UNACKED_HASH, tag, json.dumps([{}, "q", "q"]))
        broker_r.zadd(keys.UNACKED_INDEX, {tag: 1.0})
    app_r.set(keys.idempotency("outcome:g.0"), owner)  # whose outcome it is to record
    store = RedisStore(app_r)
    recorded = store.report_member(
        _outcome("g", "worker", BrokerAck(keys.BROKER_DB, "t1")), ProfileSettings(), LIMITS
    )
    assert recorded is (owner == "worker")  # acknowledged on either path
    assert _unacked(broker_r) == ([b"t2"], [b"t2"])
    assert app_r.lrange(keys.group_replies("g"), 0, -1) == [b'{"report": 1}']
    assert not app_r.exists(keys.UNACKED_HASH) and not app_r.exists(keys.UNACKED_INDEX)
    assert SCRIPT_ACKS.take("t1") and not SCRIPT_ACKS.take("t1")
    # Without an ack the entries stay for kombu to remove.
    store.report_member(_outcome("h", "worker", None), ProfileSettings(), LIMITS)
    assert _unacked(broker_r) == ([b"t2"], [b"t2"])


def test_kombus_ack_of_a_script_acknowledged_tag_writes_nothing(
    dbs: tuple[redis.Redis, redis.Redis], runtime_redis_url: str
) -> None:
    _, broker_r = dbs
    url = with_db(runtime_redis_url, keys.BROKER_DB)
    with Connection(url, transport=BROKER_TRANSPORT) as conn:
        queue = Queue("q", Exchange("q"), "q")
        with conn.Producer() as producer:
            producer.publish({"n": 1}, exchange=queue.exchange, routing_key="q", declare=[queue])
        simple = conn.SimpleQueue(queue)
        message = simple.get(timeout=2.0)
        assert broker_r.hlen(keys.UNACKED_HASH) == 1
        SCRIPT_ACKS.add(message.delivery_tag)  # as a report script would have, but ...
        message.ack()
        # ... its entries are still here: kombu trusted the script and wrote nothing.
        assert broker_r.hlen(keys.UNACKED_HASH) == 1
        simple.channel.qos._flush()  # kombu's own bookkeeping: the tag is done with
        assert not simple.channel.qos._delivered
        simple.close()


def test_a_celery_worker_hands_the_member_its_delivery_tag(
    dbs: tuple[redis.Redis, redis.Redis], runtime_redis_url: str
) -> None:
    _, broker_r = dbs
    app = Celery("haco", set_as_current=False)
    app.conf.update(celery_conf(HacoSettings(), runtime_redis_url))
    got: list[BrokerAck | None] = []
    lock = threading.Lock()

    @app.task(name="t.ack", bind=True, acks_late=True, shared=False)  # type: ignore[untyped-decorator]
    def take(self: Any) -> None:
        with lock:
            got.append(script_acks(app)(self.request))

    app.conf.task_queues = [Queue("q.ack")]
    result = app.send_task("t.ack", queue="q.ack")
    (raw,) = broker_r.lrange("q.ack", 0, -1)
    tag = json.loads(raw)["properties"]["delivery_tag"]
    with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING"):
        wait_for("the task to run", lambda: len(got) == 1, 20)
        wait_for("kombu's ack", lambda: broker_r.hlen(keys.UNACKED_HASH) == 0, 10)
    assert got == [BrokerAck(keys.BROKER_DB, tag)] and result.id


def test_no_script_ack_where_the_keys_are_not_kombus_defaults(runtime_redis_url: str) -> None:
    app = Celery("x", set_as_current=False)
    conf = celery_conf(HacoSettings(), runtime_redis_url)
    app.conf.update(conf)
    request = type("R", (), {"properties": {"delivery_tag": "t9"}})()
    assert script_acks(app)(request) == BrokerAck(keys.BROKER_DB, "t9")
    app.conf.broker_transport_options = {
        **conf["broker_transport_options"],
        "global_keyprefix": "p:",
    }
    assert script_acks(app)(request) is None
    app.conf.broker_transport_options = conf["broker_transport_options"]
    app.conf.broker_transport = "redis"  # kombu's stock transport: no ScriptAcks check
    assert script_acks(app)(request) is None
    app.conf.broker_transport = BROKER_TRANSPORT
    assert script_acks(app)(type("R", (), {"properties": {}})()) is None
