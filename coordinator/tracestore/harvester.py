"""The harvester: the trace stream (``keys.TRACES``) into Postgres, at least once, without
double counting.

One batch: ``XREADGROUP`` up to ``harvest_batch`` entries (its own pending entries first,
then new ones), parse each as a :class:`MemberReport`, ``COPY`` the rows into a temporary
staging table, then in the same transaction insert into ``members`` what is not there yet
(``ON CONFLICT DO NOTHING`` on its key, member id and finish time, which every redelivery
of an entry repeats: no second row), the link observation the trace carries, and one
``invocations`` upsert per group counting only the newly inserted members. After
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
valid report, or a row Postgres rejects, goes to the dead-letter stream ``TRACES_DEAD``.

Metrics (``keys.METRICS``), counters: harvest_ entries, rows, duplicates, dead_letter,
lost, db_errors, buffer_alarm; gauges: harvest_ stream_len, pending, oldest_pending_ms,
oldest_entry_ms.

Test hook: ``HACO_HARVEST_CRASH_AFTER_COMMIT=1`` in the environment (read once, in
``__init__``) makes the process ``os._exit(17)`` right after a commit, before the ack.
"""

from __future__ import annotations

import logging
import os
import threading
import time
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
from schemas.models import MemberReport, MemberTrace

log = logging.getLogger(__name__)

CRASH_AFTER_COMMIT_ENV = "HACO_HARVEST_CRASH_AFTER_COMMIT"
CRASH_EXIT_CODE = 17
LAG_LOG_EVERY_S = 10.0  # lag is logged at INFO this often (DEBUG on every batch)
_BACKOFF_START_S = 0.1
_MS = 1000

Row = tuple[Any, ...]

_STAGE_DDL = """
CREATE TEMP TABLE IF NOT EXISTS haco_harvest_stage (
    member_id text, group_id text, candidate_id text, role text, zone text,
    caller_zone text, model text, rank integer, u_plus double precision,
    r_minus double precision, started_s double precision, finished_s double precision,
    status text, failure_kind text, failure_reason text, quality double precision,
    latency_s double precision, proc_latency_s double precision, tokens_in integer,
    tokens_out integer, bytes_sent bigint, rtt_s double precision,
    bandwidth_bps double precision, lost boolean, stream_id text
) ON COMMIT DELETE ROWS
"""

_COPY = "COPY haco_harvest_stage FROM STDIN"

# One statement: every data-modifying CTE runs exactly once, on one snapshot. The dedup
# key is members' primary key (member_id, finished_at): every redelivery of an entry
# repeats both. Only rows `ins` really inserted count towards invocations and get links.
_MERGE = """
WITH ins AS (
    INSERT INTO members (member_id, group_id, candidate_id, role, zone, caller_zone, model,
        rank, u_plus, r_minus, started_at, finished_at, status, failure_kind,
        failure_reason, quality, latency_s, proc_latency_s, tokens_in, tokens_out,
        bytes_sent, rtt_s, bandwidth_bps, lost, stream_id)
    SELECT member_id, group_id, candidate_id, role, zone, caller_zone, model,
        rank, u_plus, r_minus, to_timestamp(started_s), to_timestamp(finished_s), status,
        failure_kind, failure_reason, quality, latency_s, proc_latency_s, tokens_in,
        tokens_out, bytes_sent, rtt_s, bandwidth_bps, lost, stream_id
    FROM haco_harvest_stage
    ON CONFLICT DO NOTHING
    RETURNING member_id, finished_at, group_id, role, started_at
), inv AS (
    INSERT INTO invocations AS i (group_id, role, state, members, created_at)
    SELECT group_id, min(role), 'running', count(*), min(started_at)
    FROM ins GROUP BY group_id ORDER BY group_id
    ON CONFLICT (group_id) DO UPDATE SET members = i.members + EXCLUDED.members,
        created_at = LEAST(i.created_at, EXCLUDED.created_at)
), links AS (
    INSERT INTO link_observations (member_id, link_id, observed_at, bytes, lost,
        transfer_s, rtt_s, leg)
    SELECT b.member_id, b.caller_zone || '->' || b.zone, ins.finished_at, b.bytes_sent,
        b.lost, CASE WHEN b.bandwidth_bps > 0 THEN b.bytes_sent / b.bandwidth_bps END, b.rtt_s, 0
    FROM haco_harvest_stage b
    JOIN ins ON ins.member_id = b.member_id AND ins.finished_at = to_timestamp(b.finished_s)
    WHERE b.bytes_sent > 0 OR b.lost OR b.rtt_s IS NOT NULL
    ON CONFLICT DO NOTHING
)
SELECT count(*) FROM ins
"""


def _id_ms(entry_id: bytes | str) -> int:
    return int(text(entry_id).split("-", 1)[0])


def trace_row(trace: MemberTrace, stream_id: str) -> Row:
    """The staging row of one trace (column order of ``haco_harvest_stage``)."""
    t = trace
    return (
        t.member_id, t.group_id or t.invocation_id, t.candidate_id, t.role, t.zone,
        t.caller_zone, t.model, t.rank, t.u_plus, t.r_minus, t.started_at_s,
        t.finished_at_s, t.status.value, t.failure_kind.value if t.failure_kind else None,
        t.failure_reason, t.quality, t.latency_s, t.proc_latency_s, t.tokens_in,
        t.tokens_out, t.bytes_sent, t.rtt_s, t.bandwidth_Bps, t.lost, stream_id,
    )  # fmt: skip


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
    rows: list[Row] = field(default_factory=list)
    raw: dict[str, bytes | str] = field(default_factory=dict)
    dead: list[tuple[str, bytes | str, str]] = field(default_factory=list)  # (id, raw, error)
    lost: list[str] = field(default_factory=list)


class Harvester:
    """One consumer of the harvest group. ``redis_client`` is the application database's
    client (tests pass another DB); ``pool`` a psycopg pool on the trace store."""

    def __init__(
        self,
        redis_client: redis.Redis,
        pool: ConnectionPool,
        settings: HacoSettings,
        consumer_name: str,
    ) -> None:
        self.r, self.pool, self.s, self.consumer = redis_client, pool, settings, consumer_name
        self.stream, self.group = keys.TRACES, settings.harvest_group
        maxlen = settings.trace_stream_maxlen  # producers trim past it: alarm before that
        self.alarm_at = min(settings.harvest_buffer_alarm or int(0.8 * maxlen), maxlen - 1)
        self._crash_after_commit = os.environ.get(CRASH_AFTER_COMMIT_ENV) == "1"
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
            raw = fields.get(b"report", fields.get("report")) or b""
            try:
                report = MemberReport.model_validate_json(raw)
            except ValidationError as exc:
                b.dead.append((sid, raw, describe_validation_error(exc, f"entry {sid}")))
                continue
            b.rows.append(trace_row(report.trace, sid))
            b.raw[sid] = raw
        return b

    def _harvest(self, entries: list[Any]) -> int:
        if not entries:
            return 0
        batch = self._parse(entries)
        try:
            inserted, rejected = self._store(batch.rows) if batch.rows else (0, [])
        except psycopg.Error as exc:
            self._own_pending = True
            self._count({"harvest_db_errors": 1})
            what = f"postgres failed to store {len(batch.ids)} trace entries ({exc})"
            self._backoff = self._back_off(what, self._backoff)
            return 0
        self._backoff = 0.0
        if self._crash_after_commit and batch.rows:
            os._exit(CRASH_EXIT_CODE)  # test hook: committed, never acknowledged
        batch.dead += [(r[-1], batch.raw[r[-1]], f"rejected by postgres: {e}") for r, e in rejected]
        if batch.lost:
            self._report_lost(batch.lost, "read")
        for sid, _, error in batch.dead:
            log.error("trace entry %s moved to %s: %s", sid, keys.TRACES_DEAD, error)
        dups = len(batch.rows) - len(rejected) - inserted
        counts = {"harvest_entries": len(batch.ids), "harvest_rows": inserted}
        self._finish(
            batch, {**counts, "harvest_duplicates": dups, "harvest_dead_letter": len(batch.dead)}
        )
        return inserted

    def _store(self, rows: list[Row]) -> tuple[int, list[tuple[Row, str]]]:
        """Write rows in one transaction. A row Postgres rejects (data, constraint) is
        isolated by halving, to be dead-lettered; any other failure propagates."""
        try:
            return self._write(rows), []
        except (psycopg.DataError, psycopg.IntegrityError) as exc:
            if len(rows) == 1:
                return 0, [(rows[0], str(exc).strip())]
            mid = len(rows) // 2
            n1, bad1 = self._store(rows[:mid])
            n2, bad2 = self._store(rows[mid:])
            return n1 + n2, bad1 + bad2

    def _write(self, rows: list[Row]) -> int:
        with self.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            cur.execute(_STAGE_DDL)
            with cur.copy(_COPY) as copy:
                for row in rows:
                    copy.write_row(row)
            cur.execute(_MERGE)
            got = cur.fetchone()
        return int(got[0]) if got else 0

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
