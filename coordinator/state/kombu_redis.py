"""kombu's Redis transport with one fix and two savings.

The first saving: kombu builds a new ``redis.Redis`` for every synchronous operation
(``conn_or_acquire``: each message's delivery bookkeeping and its ack, twice per task),
and redis-py 8 fills a case-insensitive table of ~200 response callbacks for each one,
about as much CPU as the rest of a trivial task's bookkeeping. A client is thread-safe
(every command takes a connection from the pool), so one per channel and pool is kept
and reused; a new pool (after a reconnect) gets a new client.

The second: kombu's ack emulation writes each delivered message into the unacked index
and hash, and removes it at the ack, each time in a MULTI/EXEC pipeline of two commands
(four commands to pack and four replies to parse, twice per task). Here each is one
script call with the same two writes, as atomic as the transaction: the same keys and
the same entries, so kombu (any worker's) restores unacked messages exactly as before.
With a ``global_keyprefix`` (which kombu adds per command) the stock path runs.

The fix: a worker survives losing the broker while it holds unacknowledged members.

Celery 5.7's consumer, on a broker connection error, first ``collect``s the connection
(closing its channel, which fails while Redis is down, and detaching the transport from
the connection: ``transport.client = None``) and then closes it again. The second close
of the channel restores the unacknowledged messages: it builds a Redis client from the
connection's parameters, ``transport.client.hostname``, and kombu 5.7 raises
AttributeError on the None there instead of a connection error. Celery treats that as an
"Unrecoverable error" and the worker exits, under load, whenever Redis restarts.

Here the missing connection is reported as what it is, a Redis ConnectionError, one of
the transport's ``connection_errors``, which kombu's close ignores; the worker then
reconnects like an idle one. Nothing else changes: the messages this worker could not
restore (Redis was down anyway) stay in the broker's unacked set, which kombu restores
after the visibility timeout, as after any crash. Used by name through
``broker_transport`` in :func:`coordinator.state.broker.celery_conf`.
"""

from __future__ import annotations

from time import time
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.json import dumps

from coordinator.state.lean import LeanScript, lean_for
from coordinator.state.scriptacks import SCRIPT_ACKS

# KEYS: the unacked index (a zset of delivery tags by delivery time), the unacked hash.
# ARGV: delivery time, delivery tag, [message, exchange, routing key] as JSON.
APPEND_SCRIPT = """redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
return 1"""
# KEYS: as _APPEND. ARGV: the delivery tag.
ACK_SCRIPT = """redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1"""


class QoS(kombu_redis.QoS):
    """kombu's Redis ack emulation, each bookkeeping step one script call."""

    channel: Any
    unacked_index_key: str
    unacked_key: str
    # (the client, its append script, its ack script), made on first use of a client
    _scripts_: tuple[Any, LeanScript, LeanScript] | None = None

    def _scripts(self, client: Any) -> tuple[LeanScript, LeanScript]:
        made = self._scripts_
        if made is None or made[0] is not client:  # EVALSHA; its text again after NOSCRIPT
            lean = lean_for(client)  # without redis-py's per-command path
            scripts = lean.script(APPEND_SCRIPT), lean.script(ACK_SCRIPT)
            made = self._scripts_ = (client, *scripts)
        return made[1], made[2]

    def append(self, message: Any, delivery_tag: Any) -> None:
        if self.channel.global_keyprefix:
            super().append(message, delivery_tag)  # type: ignore[no-untyped-call]
            return
        delivery = message.delivery_info
        route = [message._raw, delivery["exchange"], delivery["routing_key"]]
        entry = dumps(route)  # type: ignore[no-untyped-call]
        with self.channel.conn_or_acquire() as client:
            keys = [self.unacked_index_key, self.unacked_key]
            self._scripts(client)[0](keys, [repr(time()), delivery_tag, entry])
            virtual.QoS.append(self, message, delivery_tag)  # type: ignore[no-untyped-call]

    def ack(self, delivery_tag: Any) -> None:
        if SCRIPT_ACKS.take(delivery_tag):  # the member's report removed it already
            virtual.QoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]
            return
        if self.channel.global_keyprefix:
            super().ack(delivery_tag)  # type: ignore[no-untyped-call]
            return
        with self.channel.conn_or_acquire() as client:
            keys = [self.unacked_index_key, self.unacked_key]
            self._scripts(client)[1](keys, [delivery_tag])
        virtual.QoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]


class Channel(kombu_redis.Channel):
    QoS = QoS
    _haco_client: tuple[Any, Any] | None = None  # (pool, the client on it)

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
        pool, cached = self.pool, self._haco_client
        if cached is not None and cached[0] is pool:
            return cached[1]
        client = super()._create_client(asynchronous=False)  # type: ignore[no-untyped-call]
        self._haco_client = (pool, client)
        return client

    def _connparams(self, asynchronous: bool = False) -> Any:
        if self.connection.client is None:
            raise redis.ConnectionError("the broker connection is closed")
        return super()._connparams(asynchronous=asynchronous)  # type: ignore[no-untyped-call]


class Transport(kombu_redis.Transport):
    Channel = Channel
