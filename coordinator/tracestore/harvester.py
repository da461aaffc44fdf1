"""The harvester: the trace stream (``keys.TRACES``) into Postgres, at least once, without
double counting.

One batch: ``XREADGROUP`` up to ``harvest_batch`` entries (its own pending entries first,
then new ones), decode each as a :class:`MemberReport` (field ``keys.REPORT_FIELD``) or a
:class:`GroupVerdict` (``keys.VERDICT_FIELD``, appended by the coordinator when it closes
a group) (:mod:`coordinator.tracestore.tracecodec`: msgspec, pydantic for the rare odd
entry), then in one transaction (:mod:`coordinator.tracestore.harvestsql`) insert into
``members`` what is not there yet (no second row for a redelivered entry), the link
observation the trace carries, and one ``invocations`` upsert per group counting only
the newly inserted members and taking the group's first verdict. After
``COMMIT``, one ``MULTI``: dead letters, counters, ``XACK`` of the batch; then its entries
out of the stream (``XTRIM MINID`` below the group's oldest unacknowledged entry;
:mod:`coordinator.tracestore.harvestack`). A
crash between the two leaves the entries pending; whoever reads them next (this consumer
on restart, or another harvester's :meth:`Harvester.reclaim` once they are idle for
``harvest_reclaim_idle_s``) inserts nothing twice. Throughput scales with more
harvester processes (one consumer each).

Only a redelivery can find its rows stored: entries read again from the pending list
or claimed go through the deduplicating merge. Entries delivered for the first time
(``>``) are copied straight in (binary ``COPY``), unless a row would not fit its column
unchecked; if one is stored all the same (a producer appended a trace twice), the
unique key fails the ``COPY``, the transaction rolls back and the batch is merged: the
fast way falls back, it never counts twice.

:meth:`Harvester.run` pipelines: store threads write batches to Postgres, up to
``harvest_inflight`` at once (each its own transaction and pool connection, like as many
harvesters; the upserts take groups in order, so they cannot deadlock), while the loop
reads and decodes the next batch and acknowledges each one once committed. A batch is
acknowledged only after its own commit, so a crash leaves at most ``harvest_inflight``
+ 1 batches pending, for the merge. :meth:`Harvester.run_once` does one batch from
read to acknowledgement.

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

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psycopg
import redis
from psycopg_pool import ConnectionPool

from coordinator.config import HacoSettings
from coordinator.state import keys
from coordinator.state.codec import text
from coordinator.state.lean import lean_for
from coordinator.tracestore.harvestack import HarvestAcks
from coordinator.tracestore.harvestlag import Lag, read_lag
from coordinator.tracestore.harvestsql import FreshRows, Staged, write, write_fresh
from coordinator.tracestore.tracecodec import Batch, parse_batch

log = logging.getLogger(__name__)

LAG_LOG_EVERY_S = 10.0  # lag is logged at INFO this often (DEBUG on every batch)
_BACKOFF_START_S = 0.1
_MS = 1000


@dataclass(frozen=True)
class _Stored:
    """A committed batch: members inserted, verdicts stored, rows rejected (with why)."""

    inserted: int = 0
    verdicts: int = 0
    rejected: list[tuple[Staged, str]] = field(default_factory=list)


# A batch handed to the store thread, and its outcome (None: not stored, left pending).
_Job = tuple[Batch, "Future[_Stored | None]"]


def _unparsed(response: Any, **_: Any) -> Any:
    return response


def _abandon(jobs: deque[_Job]) -> None:
    """Wait for the jobs after a Redis failure, without acknowledging them: their
    entries stay pending, to be read again (a Redis failure of their own is the same
    outage)."""
    while jobs:
        with contextlib.suppress(redis.RedisError):
            jobs.popleft()[1].result()


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
        # XREADGROUP replies as they come (no dict per entry: tracecodec.parse_batch reads
        # the flat field lists): a client of its own on the same pool, without that parser.
        self._reader = redis.Redis(connection_pool=redis_client.connection_pool)
        self._reader.set_response_callback("XREADGROUP", _unparsed)
        self._acks = HarvestAcks(lean_for(redis_client), self.stream, self.group, settings)
        self._own_pending = True  # a restart under the same name resumes its own entries
        self._group_ready = False
        self._backoff = 0.0
        self._stop = threading.Event()
        self._last_lag_log = 0.0
        self.last_lag: Lag | None = None

    def run(self, stop: threading.Event) -> None:
        """Harvest until ``stop`` is set; reclaims idle entries every half idle period.
        Redis and Postgres failures are logged and retried with backoff, never fatal.
        Batches are pipelined (:meth:`_step`)."""
        self._stop = stop
        next_reclaim = redis_wait = 0.0
        jobs: deque[_Job] = deque()  # oldest first
        depth = self.s.harvest_inflight
        with ThreadPoolExecutor(depth, thread_name_prefix="harvest-store") as store:
            while not stop.is_set():
                try:
                    if time.monotonic() >= next_reclaim:
                        self._settle(jobs)
                        self.reclaim()
                        next_reclaim = time.monotonic() + self.s.harvest_reclaim_idle_s / 2
                    self._step(store, jobs, depth)
                    redis_wait = 0.0
                except redis.RedisError as exc:
                    _abandon(jobs)
                    self._group_ready, self._own_pending = False, True
                    what = f"redis failed while harvesting ({exc})"
                    redis_wait = self._back_off(what, redis_wait)
            try:
                self._settle(jobs)
            except redis.RedisError as exc:
                log.error("stopping: the last batches stay pending (redis failed: %s)", exc)

    def _step(self, store: ThreadPoolExecutor, jobs: deque[_Job], depth: int) -> None:
        """One step of the pipeline: read and decode a batch while the store threads
        write earlier ones to Postgres (up to ``depth`` batches, each its own
        transaction); hand it over, then acknowledge the batches committed, oldest first.
        Postgres and this process work at the same time. A read of this consumer's own
        pending entries first settles every job, whose entries it would read again."""
        self._ensure_group()
        own = self._own_pending  # a store thread sets it when a batch fails
        if own:
            self._settle(jobs)
        entries, fresh = self._read(own)
        if entries:
            batch = parse_batch(entries, fresh)
            if len(jobs) >= depth:
                jobs[0][1].result()  # wait for room
            jobs.append((batch, store.submit(self._save, batch)))
        while jobs and jobs[0][1].done():
            done, outcome = jobs.popleft()
            self._ack(done, outcome.result())
        self.update_lag()

    def _settle(self, jobs: deque[_Job]) -> None:
        """Wait for every job and acknowledge what it stored."""
        while jobs:
            batch, outcome = jobs.popleft()
            self._ack(batch, outcome.result())

    def run_once(self) -> int:
        """Harvest one batch; returns how many new rows it stored."""
        self._ensure_group()
        stored = self._harvest(*self._read(self._own_pending))
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
                stored += self._harvest(entries, fresh=False)
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

    def _read(self, own_pending: bool) -> tuple[list[Any], bool]:
        """A batch, and whether it is delivered for the first time."""
        if own_pending:  # entries we read before and did not acknowledge
            got = self._xread("0", None)
            if got:
                return got, False
            self._own_pending = False
        return self._xread(">", self.s.harvest_block_ms), True

    def _xread(self, start: str, block: int | None) -> list[Any]:
        n, name = self.s.harvest_batch, self.consumer
        resp: Any = self._reader.xreadgroup(self.group, name, {self.stream: start}, n, block)
        if not resp:
            return []
        # RESP2: [[stream, entries]]; RESP3: {stream: entries}
        entries = next(iter(resp.values())) if isinstance(resp, dict) else resp[0][1]
        return list(entries)

    def _harvest(self, entries: list[Any], fresh: bool) -> int:
        if not entries:
            return 0
        batch = parse_batch(entries, fresh)
        return self._ack(batch, self._save(batch))

    def _save(self, batch: Batch) -> _Stored | None:
        """Store a batch in Postgres (None: it failed, the entries stay pending)."""
        try:
            (inserted, verdicts), rejected = self._store(batch.rows, batch.fresh_rows)
        except psycopg.Error as exc:
            self._own_pending = True
            self._count({"harvest_db_errors": 1})
            what = f"postgres failed to store {len(batch.ids)} trace entries ({exc})"
            self._backoff = self._back_off(what, self._backoff)
            return None
        self._backoff = 0.0
        if self._after_commit is not None and batch.rows:
            self._after_commit()  # fault injection: committed, not yet acknowledged
        return _Stored(inserted, verdicts, rejected)

    def _ack(self, batch: Batch, stored: _Stored | None) -> int:
        """After the commit: dead letters, acknowledgement, counts; the rows stored."""
        if stored is None:
            return 0
        rejected = stored.rejected
        batch.dead += [(row[-1], batch.raw[row[-1]], e) for (_, row), e in rejected]
        if batch.lost:
            self._report_lost(batch.lost, "read")
        for sid, _, error in batch.dead:
            log.error("trace entry %s moved to %s: %s", sid, keys.TRACES_DEAD, error)
        dups = len(batch.rows) - len(rejected) - stored.inserted - stored.verdicts
        counts = {"harvest_entries": len(batch.ids), "harvest_rows": stored.inserted}
        counts |= {"harvest_verdicts": stored.verdicts, "harvest_duplicates": dups}
        self._acks.finish(batch, {**counts, "harvest_dead_letter": len(batch.dead)})
        return stored.inserted + stored.verdicts

    def _store(
        self, rows: list[Staged], fresh: FreshRows | None
    ) -> tuple[tuple[int, int], list[tuple[Staged, str]]]:
        """Write rows in one transaction: (members inserted, verdicts stored), rejected
        (with the reason). A first delivery is copied straight in; if any row is there
        already or cannot be stored, that rolls back and the batch is merged instead."""
        if not rows:
            return (0, 0), []
        if fresh is not None:
            try:
                return self._write(lambda cur: write_fresh(cur, fresh)), []
            except (psycopg.DataError, psycopg.IntegrityError, OverflowError) as exc:
                what = str(exc).strip().splitlines()[0]
                log.info("a fresh batch of %d entries is merged instead (%s)", len(rows), what)
        return self._merge(rows)

    def _merge(self, rows: list[Staged]) -> tuple[tuple[int, int], list[tuple[Staged, str]]]:
        """The deduplicating write. A row Postgres rejects (data, constraint), or whose
        numbers no column can hold, is isolated by halving, to be dead-lettered; any other
        failure propagates."""
        try:
            return self._write(lambda cur: write(cur, rows)), []
        except (psycopg.DataError, psycopg.IntegrityError, OverflowError) as exc:
            if len(rows) == 1:
                by = "postgres" if isinstance(exc, psycopg.Error) else "the client"
                return (0, 0), [(rows[0], f"rejected by {by}: {str(exc).strip()}")]
            mid = len(rows) // 2
            (m1, v1), bad1 = self._merge(rows[:mid])
            (m2, v2), bad2 = self._merge(rows[mid:])
            return (m1 + m2, v1 + v2), bad1 + bad2

    def _write(self, how: Callable[[psycopg.Cursor[Any]], tuple[int, int]]) -> tuple[int, int]:
        with self.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            return how(cur)

    def _report_lost(self, ids: list[str], where: str) -> None:
        log.error(
            f"{len(ids)} trace entries were trimmed from {self.stream} before they were "
            f"stored ({where}, first {ids[0]}): the stream outgrew trace_stream_maxlen="
            f"{self.s.trace_stream_maxlen} while the harvest was behind"
        )
        self._count({"harvest_lost": len(ids)})

    def _queue_counts(self, pipe: Any, counts: dict[str, int]) -> None:
        for command in self._acks.count_commands(counts):
            pipe.execute_command(*command)

    def _count(self, counts: dict[str, int]) -> None:
        pipe = self.r.pipeline(transaction=False)
        self._queue_counts(pipe, counts)
        pipe.execute()

    def lag(self) -> Lag:
        """Stream length, pending count and ages, on the Redis server's clock."""
        return read_lag(self.r, self.stream, self.group)

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
