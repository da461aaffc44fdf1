"""HACO's kombu Redis transport (coordinator.state.kombu_redis): one synchronous client
per channel and pool, against the real broker database."""

from __future__ import annotations

from kombu import Connection

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
