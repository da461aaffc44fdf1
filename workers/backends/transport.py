"""The worker's HTTP client: one ``httpx.Client`` per process whose socket reads can be
cancelled.

httpx's sync client blocks in ``recv`` while it waits for the headers or for the next
bytes of a body, and gives no handle to interrupt it. Here every connection's stream is
wrapped (:class:`WatchedStream`): a read waits in slices of the calling thread's
``poll_s``, and between slices asks the thread's :class:`Watch` whether to stop (the
member's group was cancelled) or whether the call's total time is up. Either raises out
of the read; httpcore then closes the connection, so the server sees it closed and stops
generating. A read that sees no byte for its own read timeout raises httpcore's
``ReadTimeout`` as before. The watch is per thread because the sync client does its I/O
in the calling thread (Celery's threads pool: one member per thread).
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

StopCheck = Callable[[], bool]


class StopRequested(Exception):
    """The member's group was cancelled while the call was reading."""


class TotalTimeout(Exception):
    """The call's total time ran out while it was reading."""


@dataclass(frozen=True, slots=True)
class Watch:
    should_stop: StopCheck
    deadline: float  # time.monotonic() by which the call must be over
    poll_s: float

    def check(self) -> None:
        if self.should_stop():
            raise StopRequested("stopped: the group was cancelled")
        if time.monotonic() >= self.deadline:
            raise TotalTimeout("the call's total timeout passed")


_local = threading.local()


@contextmanager
def watching(watch: Watch) -> Iterator[Watch]:
    """Reads on this thread, inside the block, are cancellable by ``watch``."""
    _local.watch = watch
    try:
        yield watch
    finally:
        _local.watch = None


def current_watch() -> Watch | None:
    watch: Watch | None = getattr(_local, "watch", None)
    return watch


class WatchedStream(httpcore.NetworkStream):
    """A connection's stream whose reads wait in slices, checking the thread's watch."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        watch = current_watch()
        if watch is None:
            return self._inner.read(max_bytes, timeout)
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            watch.check()
            now = time.monotonic()
            if end is not None and now >= end:
                raise httpcore.ReadTimeout(f"no data for {timeout} s")
            limit = min(watch.poll_s, watch.deadline - now)
            if end is not None:
                limit = min(limit, end - now)
            try:
                return self._inner.read(max_bytes, max(limit, 0.001))
            except httpcore.ReadTimeout:
                continue  # one slice without data: check, then wait again

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        return WatchedStream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class WatchedBackend(httpcore.NetworkBackend):
    """httpcore's sync network backend with every stream wrapped in a WatchedStream."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return WatchedStream(stream)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        return WatchedStream(self._inner.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


@dataclass(frozen=True, slots=True)
class PoolLimits:
    """The process-wide connection pool (HacoSettings ``http_*``): sized for every
    in-flight member of the worker (its concurrency) to hold a connection."""

    max_connections: int
    max_keepalive: int
    keepalive_expiry_s: float


class WatchedTransport(httpx.HTTPTransport):
    def __init__(self, limits: PoolLimits) -> None:
        super().__init__()
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(),  # httpx's default: certifi's CAs
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive,
            keepalive_expiry=limits.keepalive_expiry_s,
            network_backend=WatchedBackend(),
        )


def make_client(limits: PoolLimits) -> httpx.Client:
    """The process's client. No default timeout (each request carries its candidate's),
    no environment proxies or netrc (a worker's calls go where the pool config says)."""
    return httpx.Client(transport=WatchedTransport(limits), timeout=None, trust_env=False)
