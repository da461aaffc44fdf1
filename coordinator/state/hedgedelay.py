"""The hedge delay of a role: a percentile of its recent completion latencies.

Under ``staggered`` launch the next member starts when this delay expires with no success
yet (spec ``hedging.md``, "Hedge delay"). The delay is never hard-coded: every completed
attempt is :meth:`DelayWindow.record`-ed into a rolling window of the last
``hedge_delay_window`` latencies of its role, and :meth:`DelayWindow.delay_s` is the
``hedge_delay_percentile`` percentile (nearest-rank) of that window, so roughly the
slowest ``100 - percentile`` % of calls trigger a backup and the delay follows warm-ups,
deploys and load. Until the window holds ``hedge_delay_min_samples`` latencies, the delay
is ``initial_hedge_delay_s``.

:class:`RedisDelayWindow` keeps each role's window twice, shared by every coordinator
process: in arrival order in the list :func:`keys.hedge_delay_window` (newest first),
which says what leaves the window, and by latency in the sorted set
:func:`keys.hedge_delay_ranked`, from which the percentile is read by rank
(delay_read.lua: one small reply, whatever the window's size, where the whole window
carried to the caller and sorted there grows with it). Both are written in one script
(delay_record.lua); expiry ``profile_ttl_s``, refreshed on every write.
:class:`MemoryDelayWindow` keeps it in this process.
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
from coordinator.state.ids import hex_id
from coordinator.state.lua import script


def delay_from(samples: Sequence[float], settings: HacoSettings) -> float:
    """The hedge delay for a window holding ``samples``."""
    if len(samples) < settings.hedge_delay_min_samples:
        return settings.initial_hedge_delay_s
    return nearest_rank(samples, settings.hedge_delay_percentile)


def _check_role(role: str) -> str:
    if not isinstance(role, str) or not role:
        raise InputError(f"role must be a non-empty string, got {role!r}")
    return role


def window_entry(latency_s: float, unique: str = "") -> str:
    """A window entry (keys.hedge_delay_window): the latency, then an id that keeps equal
    latencies apart in the sorted set (``unique``, else a random one)."""
    return f"{latency_s!r}|{unique or hex_id(16)}"


def entry_latency(raw: bytes | str) -> float:
    """The latency of a window entry (an older plain number reads as itself)."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    return float(text.partition("|")[0])


class RedisDelayWindow:
    """Per-role latency windows in Redis, shared by every coordinator process."""

    def __init__(self, client: redis.Redis, settings: HacoSettings) -> None:
        self._client = client
        self._settings = settings
        self._add = client.register_script(script("delay_add"))
        self._read = client.register_script(script("delay_read"))

    def record(self, role: str, latency_s: float) -> None:
        role = _check_role(role)
        value = check_amount("latency_s", latency_s)
        s = self._settings
        names = [keys.hedge_delay_window(role), keys.hedge_delay_ranked(role)]
        ttl_ms = max(1, round(s.profile_ttl_s * 1000))
        args: list[str | int] = [window_entry(value), s.hedge_delay_window, ttl_ms]
        try:
            self._add(keys=names, args=args)
        except redis.RedisError as exc:
            raise StoreError(f"hedge delay: record on {names[0]} failed: {exc}") from exc

    def samples(self, role: str) -> list[float]:
        """The role's window, newest first."""
        key = keys.hedge_delay_window(_check_role(role))
        try:
            raw = self._client.lrange(key, 0, self._settings.hedge_delay_window - 1)
        except redis.RedisError as exc:
            raise StoreError(f"hedge delay: read of {key} failed: {exc}") from exc
        try:
            return [entry_latency(v) for v in raw]
        except ValueError as exc:
            raise StoreError(f"hedge delay: {key} holds a non-number: {exc}") from exc

    def delay_s(self, role: str) -> float:
        """The window's percentile, read by rank (one round trip, a two-element reply)."""
        key = keys.hedge_delay_ranked(_check_role(role))
        s = self._settings
        try:
            got = self._read(keys=[key], args=[s.hedge_delay_min_samples, s.hedge_delay_percentile])
        except redis.RedisError as exc:
            raise StoreError(f"hedge delay: read of {key} failed: {exc}") from exc
        if len(got) < 2:  # fewer samples than the delay needs
            return s.initial_hedge_delay_s
        return float(got[1])


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
