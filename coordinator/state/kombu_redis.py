"""kombu's Redis transport with one fix and one saving.

The saving: kombu builds a new ``redis.Redis`` for every synchronous operation
(``conn_or_acquire``: each message's delivery bookkeeping and its ack, twice per task),
and redis-py 8 fills a case-insensitive table of ~200 response callbacks for each one,
about as much CPU as the rest of a trivial task's bookkeeping. A client is thread-safe
(every command takes a connection from the pool), so one per channel and pool is kept
and reused; a new pool (after a reconnect) gets a new client.

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

from typing import Any

import redis
from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
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
