"""The hedge delay of a role: a percentile of its recent completion latencies.

Under ``staggered`` launch the next member starts when this delay expires with no success
yet (spec ``hedging.md``, "Hedge delay"). The delay is never hard-coded: every completed
attempt is :meth:`DelayWindow.record`-ed into a rolling window of the last
``hedge_delay_window`` latencies of its role, and :meth:`DelayWindow.delay_s` is the
``hedge_delay_percentile`` percentile (nearest-rank) of that window, so roughly the
slowest ``100 - percentile`` % of calls trigger a backup and the delay follows warm-ups,
deploys and load. Until the window holds ``hedge_delay_min_samples`` latencies, the delay
is ``initial_hedge_delay_s``.

:class:`RedisDelayWindow` keeps each role's window in the list
:func:`keys.hedge_delay_window` (newest first; LPUSH + LTRIM + PEXPIRE in one
transaction, expiry ``profile_ttl_s`` refreshed on every write), shared by every
coordinator process. :class:`MemoryDelayWindow` keeps it in this process.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

import redis

from coordinator.config import HacoSettings
from coordinator.core.percentiles import nearest_rank
from coordinator.errors import InputError, StoreError
from coordinator.state import keys
from coordinator.state.checks import check_amount


def delay_from(samples: Sequence[float], settings: HacoSettings) -> float:
    """The hedge delay for a window holding ``samples``."""
    if len(samples) < settings.hedge_delay_min_samples:
        return settings.initial_hedge_delay_s
    return nearest_rank(samples, settings.hedge_delay_percentile)


def _check_role(role: str) -> str:
    if not isinstance(role, str) or not role:
        raise InputError(f"role must be a non-empty string, got {role!r}")
    return role


class RedisDelayWindow:
    """Per-role latency windows in Redis lists, shared by every coordinator process."""

    def __init__(self, client: redis.Redis, settings: HacoSettings) -> None:
        self._client = client
        self._settings = settings

    def record(self, role: str, latency_s: float) -> None:
        key = keys.hedge_delay_window(_check_role(role))
        value = check_amount("latency_s", latency_s)
        ttl_ms = max(1, round(self._settings.profile_ttl_s * 1000))
        try:
            with self._client.pipeline(transaction=True) as pipe:
                pipe.lpush(key, repr(value))
                pipe.ltrim(key, 0, self._settings.hedge_delay_window - 1)
                pipe.pexpire(key, ttl_ms)
                pipe.execute()
        except redis.RedisError as exc:
            raise StoreError(f"hedge delay: record on {key} failed: {exc}") from exc

    def samples(self, role: str) -> list[float]:
        """The role's window, newest first."""
        key = keys.hedge_delay_window(_check_role(role))
        try:
            raw = self._client.lrange(key, 0, self._settings.hedge_delay_window - 1)
        except redis.RedisError as exc:
            raise StoreError(f"hedge delay: read of {key} failed: {exc}") from exc
        try:
            return [float(v) for v in raw]
        except ValueError as exc:
            raise StoreError(f"hedge delay: {key} holds a non-number: {exc}") from exc

    def delay_s(self, role: str) -> float:
        return delay_from(self.samples(role), self._settings)


class MemoryDelayWindow:
    """Per-role latency windows in this process only. No expiry."""

    def __init__(self, settings: HacoSettings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._windows: dict[str, deque[float]] = {}

    def record(self, role: str, latency_s: float) -> None:
        _check_role(role)
        value = check_amount("latency_s", latency_s)
        with self._lock:
            window = self._windows.get(role)
            if window is None:
                window = deque(maxlen=self._settings.hedge_delay_window)
                self._windows[role] = window
            window.appendleft(value)

    def samples(self, role: str) -> list[float]:
        """The role's window, newest first."""
        _check_role(role)
        with self._lock:
            return list(self._windows.get(role, ()))

    def delay_s(self, role: str) -> float:
        return delay_from(self.samples(role), self._settings)
