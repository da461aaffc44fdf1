"""The harvest lag (:mod:`coordinator.tracestore.harvester`): what waits in the trace
stream and how old it is, on the Redis server's clock."""

from __future__ import annotations

from dataclasses import dataclass

import redis

from coordinator.state.codec import text

_MS = 1000


@dataclass(frozen=True)
class Lag:
    """Entries not yet stored (harvested ones are deleted), read but unacked, and ages."""

    stream_len: int
    pending: int
    oldest_pending_age_s: float | None
    oldest_entry_age_s: float | None


def _id_ms(entry_id: bytes | str) -> int:
    return int(text(entry_id).split("-", 1)[0])


def read_lag(r: redis.Redis, stream: str, group: str) -> Lag:
    """Stream length, pending count of ``group`` and ages (since XADD)."""
    pipe = r.pipeline(transaction=False)
    pipe.time()
    pipe.xlen(stream)
    pipe.xpending(stream, group)
    pipe.xrange(stream, count=1)
    (secs, micros), length, pending, first = pipe.execute()
    now_ms = secs * _MS + micros // _MS
    oldest = pending.get("min")
    return Lag(
        stream_len=int(length),
        pending=int(pending.get("pending") or 0),
        oldest_pending_age_s=max(0, now_ms - _id_ms(oldest)) / _MS if oldest else None,
        oldest_entry_age_s=max(0, now_ms - _id_ms(first[0][0])) / _MS if first else None,
    )
