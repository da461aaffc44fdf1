"""The harvester: the trace stream (``keys.TRACES``) into Postgres, at least once, without
double counting.

One batch: ``XREADGROUP`` up to ``harvest_batch`` entries (its own pending entries first,
then new ones), parse each as a :class:`MemberReport` (field ``keys.REPORT_FIELD``) or a
:class:`GroupVerdict` (``keys.VERDICT_FIELD``, appended by the coordinator when it closes
a group), then in one transaction (:mod:`coordinator.tracestore.harvestsql`) insert into
``members`` what is not there yet (no second row for a redelivered entry), the link
observation the trace carries, and one ``invocations`` upsert per group counting only
the newly inserted members and taking the group's first verdict. After
``COMMIT``, one ``MULTI``: dead letters, ``XACK`` and ``XDEL`` of the batch, counters. A
crash between the two leaves the entries pending; whoever reads them next (this consumer
on restart, or another harvester's :meth:`Harvester.reclaim` once they are idle for
``harvest_reclaim_idle_s``) inserts nothing twice. Throughput scales with more
harvester processes (one consumer each).

Postgres down: nothing is acknowledged, entries stay in the stream, the harvester backs
off and retries. The buffer is the stream, ``trace_stream_maxlen`` entries: producers'
``MAXLEN ~`` trimming drops the oldest beyond it. Above ``harvest_buffer_alarm`` entries
every batch logs an ERROR and counts ``harvest_buffer_alarm``; an entry found trimmed
before it was stored is logged and counted as ``harvest_lost``. An entry that is not a
valid report or verdict, or a row Postgres rejects, goes to the dead-letter stream
``TRACES_DEAD``.

Metrics (``keys.METRICS``), counters: harvest_ entries, rows (members), verdicts,
duplicates, dead_letter, lost, db_errors, buffer_alarm; gauges: harvest_ stream_len,
pending, oldest_pending_ms, oldest_entry_ms.

Fault injection: ``after_commit``, when given, is called right after a batch that stored
rows is committed and before it is acknowledged (tests kill the process there).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import redis
from psycopg_pool import ConnectionPool
from pydantic import ValidationError

from coordinator.config import HacoSettings
from coordinator.errors import describe_validation_error
from coordinator.state import keys
from coordinator.state.codec import text
from coordinator.tracestore.harvestsql import Staged, trace_row, verdict_row, write
from schemas.models import GroupVerdict, MemberReport

log = logging.getLogger(__name__)

LAG_LOG_EVERY_S = 10.0  # lag is logged at INFO this often (DEBUG on every batch)
_BACKOFF_START_S = 0.1
_MS = 1000

_NONE: tuple[tuple[int, int], list[tuple[Staged, str]]] = ((0, 0), [])


def _field(fields: dict[Any, Any], name: str) -> bytes | str | None:
    """A stream entry's field (the client may or may not decode responses)."""
    got: bytes | str | None = fields.get(name.encode(), fields.get(name))
    return got


def _id_ms(entry_id: bytes | str) -> int:
    return int(text(entry_id).split("-", 1)[0])


@dataclass(frozen=True)
class Lag:
    """Entries not yet stored (harvested ones are deleted), read but unacked, and ages."""

    stream_len: int
    pending: int
    oldest_pending_age_s: float | None
    oldest_entry_age_s: float | None


@dataclass
class _Batch:
    ids: list[str] = field(default_factory=list)
    rows: list[Staged] = field(default_factory=list)
    raw: dict[str, bytes | str] = field(default_factory=dict)
    dead: list[tuple[str, bytes | str, str]] = field(default_factory=list)  # (id, raw, error)
    lost: list[str] = field(default_factory=list)


class Harvester:
    """One consumer of the harvest group. ``redis_client`` is the application database's
    client (tests pass another DB); ``pool`` a psycopg pool on the trace store;
    ``after_commit`` a fault-injection point between a batch's commit and its ack."""

    def __init__(
        self,
        redis_client: redis.Redis,
        pool: ConnectionPool,
        settings: HacoSettings,
        consumer_name: str,
        after_commit: Callable[[], None] | None = None,
    ) -> None:
        self.r, self.pool, self.s, self.consumer = redis_client, pool, settings, consumer_name
        self.stream, self.group = keys.TRACES, settings.harvest_group
        maxlen = settings.trace_stream_maxlen  # producers trim past it: alarm before that
        self.alarm_at = min(settings.harvest_buffer_alarm or int(0.8 * maxlen), maxlen - 1)
        self._after_commit = after_commit
        self._own_pending = True  # a restart under the same name resumes its own entries
        self._group_ready = False
        self._backoff = 0.0
        self._stop = threading.Event()
        self._last_lag_log = 0.0
        self.last_lag: Lag | None = None

    def run(self, stop: threading.Event) -> None:
        """Harvest until ``stop`` is set; reclaims idle entries every half idle period.
        Redis and Postgres failures are logged and retried with backoff, never fatal."""
        self._stop = stop
        next_reclaim = redis_wait = 0.0
        while not stop.is_set():
            try:
                if time.monotonic() >= next_reclaim:
                    self.reclaim()
                    next_reclaim = time.monotonic() + self.s.harvest_reclaim_idle_s / 2
                self.run_once()
                redis_wait = 0.0
            except redis.RedisError as exc:
                self._group_ready, self._own_pending = False, True
                redis_wait = self._back_off(f"redis failed while harvesting ({exc})", redis_wait)

    def run_once(self) -> int:
        """Harvest one batch; returns how many new rows it stored."""
        self._ensure_group()
        stored = self._harvest(self._read())
        self.update_lag()
        return stored

    def reclaim(self) -> int:
        """Claim and harvest entries other consumers left pending longer than
        ``harvest_reclaim_idle_s`` (a crashed harvester); forget idle empty consumers."""
        self._ensure_group()
        idle = int(self.s.harvest_reclaim_idle_s * _MS)
        cursor: bytes | str = "0-0"
        stored, n = 0, self.s.harvest_batch
        while True:
            got: Any = self.r.xautoclaim(self.stream, self.group, self.consumer, idle, cursor, n)
            cursor, entries, deleted = got
            if deleted:
                self._report_lost([text(d) for d in deleted], "reclaim")
            if entries:
                log.warning("reclaimed %d idle pending trace entries", len(entries))
                self._own_pending = True
                stored += self._harvest(entries)
            if text(cursor) == "0-0" or self._backoff > 0:
                break
        self._forget_idle_consumers(idle)
        return stored

    def _ensure_group(self) -> None:
        if self._group_ready:
            return
        try:
            self.r.xgroup_create(self.stream, self.group, id="0", mkstream=True)
            self.r.pexpire(self.stream, int(self.s.trace_stream_ttl_s * _MS), nx=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    def _read(self) -> list[Any]:
        if self._own_pending:  # entries we read before and did not acknowledge
            got = self._xread("0", None)
            if got:
                return got
            self._own_pending = False
        return self._xread(">", self.s.harvest_block_ms)

    def _xread(self, start: str, block: int | None) -> list[Any]:
        n, name = self.s.harvest_batch, self.consumer
        resp: Any = self.r.xreadgroup(self.group, name, {self.stream: start}, n, block)
        return list(resp[0][1]) if resp else []

    def _parse(self, entries: list[Any]) -> _Batch:
        b = _Batch()
        for entry_id, fields in entries:
            sid = text(entry_id)
            b.ids.append(sid)
            if not fields:  # trimmed (MAXLEN) or deleted after we read it
                b.lost.append(sid)
                continue
            verdict = _field(fields, keys.VERDICT_FIELD)
            raw = verdict if verdict is not None else _field(fields, keys.REPORT_FIELD) or b""
            try:
                if verdict is not None:
                    staged = verdict_row(GroupVerdict.model_validate_json(raw), sid)
                else:
                    staged = trace_row(MemberReport.model_validate_json(raw).trace, sid)
            except ValidationError as exc:
                b.dead.append((sid, raw, describe_validation_error(exc, f"entry {sid}")))
                continue
            b.rows.append(staged)
            b.raw[sid] = raw
        return b

    def _harvest(self, entries: list[Any]) -> int:
        if not entries:
            return 0
        batch = self._parse(entries)
        try:
            (inserted, verdicts), rejected = self._store(batch.rows) if batch.rows else _NONE
        except psycopg.Error as exc:
            self._own_pending = True
            self._count({"harvest_db_errors": 1})
            what = f"postgres failed to store {len(batch.ids)} trace entries ({exc})"
            self._backoff = self._back_off(what, self._backoff)
            return 0
        self._backoff = 0.0
        if self._after_commit is not None and batch.rows:
            self._after_commit()  # fault injection: committed, not yet acknowledged
        batch.dead += [
            (r.stream_id, batch.raw[r.stream_id], f"rejected by postgres: {e}") for r, e in rejected
        ]
        if batch.lost:
            self._report_lost(batch.lost, "read")
        for sid, _, error in batch.dead:
            log.error("trace entry %s moved to %s: %s", sid, keys.TRACES_DEAD, error)
        dups = len(batch.rows) - len(rejected) - inserted - verdicts
        counts = {"harvest_entries": len(batch.ids), "harvest_rows": inserted}
        counts |= {"harvest_verdicts": verdicts, "harvest_duplicates": dups}
        self._finish(batch, {**counts, "harvest_dead_letter": len(batch.dead)})
        return inserted + verdicts

    def _store(self, rows: list[Staged]) -> tuple[tuple[int, int], list[tuple[Staged, str]]]:
        """Write rows in one transaction: (members inserted, verdicts stored), rejected.
        A row Postgres rejects (data, constraint) is isolated by halving, to be
        dead-lettered; any other failure propagates."""
        try:
            return self._write(rows), []
        except (psycopg.DataError, psycopg.IntegrityError) as exc:
            if len(rows) == 1:
                return (0, 0), [(rows[0], str(exc).strip())]
            mid = len(rows) // 2
            (m1, v1), bad1 = self._store(rows[:mid])
            (m2, v2), bad2 = self._store(rows[mid:])
            return (m1 + m2, v1 + v2), bad1 + bad2

    def _write(self, rows: list[Staged]) -> tuple[int, int]:
        with self.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            return write(cur, rows)

    def _finish(self, batch: _Batch, counts: dict[str, int]) -> None:
        """After the commit: dead letters, acknowledge and delete the batch, count — all
        or nothing (MULTI), so an entry is never acknowledged without its dead letter."""
        pipe = self.r.pipeline(transaction=True)
        cap = self.s.harvest_dead_letter_maxlen
        for sid, raw, error in batch.dead:
            fields = {"id": sid, "report": raw, "error": error}
            pipe.xadd(keys.TRACES_DEAD, fields, maxlen=cap, approximate=True)  # type: ignore[arg-type]
        if batch.dead:
            pipe.pexpire(keys.TRACES_DEAD, int(self.s.harvest_dead_letter_ttl_s * _MS))
        pipe.xack(self.stream, self.group, *batch.ids)
        pipe.xdel(self.stream, *batch.ids)
        self._queue_counts(pipe, counts)
        pipe.execute()

    def _report_lost(self, ids: list[str], where: str) -> None:
        log.error(
            f"{len(ids)} trace entries were trimmed from {self.stream} before they were "
            f"stored ({where}, first {ids[0]}): the stream outgrew trace_stream_maxlen="
            f"{self.s.trace_stream_maxlen} while the harvest was behind"
        )
        self._count({"harvest_lost": len(ids)})

    def _queue_counts(self, pipe: Any, counts: dict[str, int]) -> None:
        for name, n in counts.items():
            if n:
                pipe.hincrby(keys.METRICS, name, n)
        pipe.pexpire(keys.METRICS, int(self.s.profile_ttl_s * _MS))

    def _count(self, counts: dict[str, int]) -> None:
        pipe = self.r.pipeline(transaction=False)
        self._queue_counts(pipe, counts)
        pipe.execute()

    def lag(self) -> Lag:
        """Stream length, pending count and ages, on the Redis server's clock."""
        pipe = self.r.pipeline(transaction=False)
        pipe.time()
        pipe.xlen(self.stream)
        pipe.xpending(self.stream, self.group)
        pipe.xrange(self.stream, count=1)
        (secs, micros), length, pending, first = pipe.execute()
        now_ms = secs * _MS + micros // _MS
        oldest = pending.get("min")
        return Lag(
            stream_len=int(length),
            pending=int(pending.get("pending") or 0),
            oldest_pending_age_s=max(0, now_ms - _id_ms(oldest)) / _MS if oldest else None,
            oldest_entry_age_s=max(0, now_ms - _id_ms(first[0][0])) / _MS if first else None,
        )

    def update_lag(self) -> Lag:
        """Write the lag gauges to keys.METRICS and log them; above the buffer alarm,
        log an ERROR and count ``harvest_buffer_alarm`` (on every call while above)."""
        lag = self.lag()
        self.last_lag = lag
        gauges = {
            "harvest_stream_len": lag.stream_len,
            "harvest_pending": lag.pending,
            "harvest_oldest_pending_ms": int((lag.oldest_pending_age_s or 0) * _MS),
            "harvest_oldest_entry_ms": int((lag.oldest_entry_age_s or 0) * _MS),
        }
        pipe: Any = self.r.pipeline(transaction=False)
        pipe.hset(keys.METRICS, mapping=gauges)
        alarm = lag.stream_len > self.alarm_at
        self._queue_counts(pipe, {"harvest_buffer_alarm": int(alarm)})
        pipe.execute()
        if alarm:
            log.error(
                f"trace buffer alarm: {lag.stream_len} entries wait in {self.stream} (alarm "
                f"at {self.alarm_at}; beyond trace_stream_maxlen={self.s.trace_stream_maxlen} "
                "the oldest are lost); is Postgres down?"
            )
        now = time.monotonic()
        level = logging.INFO if now - self._last_lag_log >= LAG_LOG_EVERY_S else logging.DEBUG
        if level == logging.INFO:
            self._last_lag_log = now
        log.log(level, "harvest lag: %s", gauges)
        return lag

    def _back_off(self, what: str, previous_s: float) -> float:
        wait = min(self.s.harvest_backoff_max_s, max(_BACKOFF_START_S, 2 * previous_s))
        log.error("%s; entries stay pending, retrying in %.1f s", what, wait)
        self._stop.wait(wait)
        return wait

    def _forget_idle_consumers(self, idle_ms: int) -> None:
        """Drop consumers idle for 10 periods with nothing pending (dead processes)."""
        for c in self.r.xinfo_consumers(self.stream, self.group):
            name = text(c["name"])
            if name != self.consumer and not c["pending"] and c["idle"] > 10 * idle_ms:
                self.r.xgroup_delconsumer(self.stream, self.group, name)
