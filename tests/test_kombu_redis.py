"""HACO's kombu Redis transport (coordinator.state.kombu_redis): one synchronous client
per channel and pool, against the real broker database."""

from __future__ import annotations

import base64
import json

import pytest
import redis
from kombu import Connection, Exchange, Queue

from coordinator.state.broker import BROKER_TRANSPORT


def test_the_channel_reuses_its_client_until_its_pool_changes(redis_url: str) -> None:
    with Connection(redis_url, transport=BROKER_TRANSPORT) as conn:
        channel = conn.default_channel
        first = channel._create_client()
        assert channel._create_client() is first  # no new client per operation
        with channel.conn_or_acquire() as client:
            assert client is first
            assert client.ping()
        channel._pool = None  # what a reconnect does: a new pool, so a new client
        second = channel._create_client()
        assert second is not first and second.connection_pool is channel.pool
        assert channel._create_client(asynchronous=True) is not second


def _unacked(r: redis.Redis) -> tuple[dict[bytes, bytes], list[bytes]]:
    return r.hgetall("unacked"), r.zrange("unacked_index", 0, -1)


@pytest.mark.parametrize("transport", [BROKER_TRANSPORT, "redis"])
def test_the_ack_bookkeeping_is_kombus_own(
    redis_url: str, redis_db: redis.Redis, transport: str
) -> None:
    # Ours (one script per step) and stock kombu's (MULTI pipelines) leave the same
    # entries: the message, its exchange and routing key under its delivery tag, indexed
    # by delivery time; an ack removes both, a restore puts the message back.
    with Connection(redis_url, transport=transport) as conn:
        queue = Queue("q", Exchange("q"), "q")
        with conn.Producer() as producer:
            producer.publish({"n": 1}, exchange=queue.exchange, routing_key="q", declare=[queue])
            producer.publish({"n": 2}, exchange=queue.exchange, routing_key="q", declare=[queue])
        simple = conn.SimpleQueue(queue)
        first = simple.get(timeout=2.0)
        tag = first.delivery_tag
        hash_, index = _unacked(redis_db)
        assert index == [tag.encode()] and list(hash_) == [tag.encode()]
        raw, exchange, routing_key = json.loads(hash_[tag.encode()])
        assert raw["properties"]["delivery_tag"] == tag
        assert (exchange, routing_key) == ("q", "q")
        assert json.loads(base64.b64decode(raw["body"])) == {"n": 1}
        first.ack()
        assert _unacked(redis_db) == ({}, [])
        second = simple.get(timeout=2.0)
        assert second.payload == {"n": 2}
        simple.channel.qos.restore_unacked()  # what a worker's shutdown does
        assert _unacked(redis_db) == ({}, [])
        assert redis_db.llen("q") == 1  # back on its queue
        simple.close()
