"""Ingest benchmark: traces/s through stream -> harvester -> Postgres, side by side with a
raw COPY of the same rows into the same table, in the same run.

    python -m bench.ingest [--n 200000] [--batch 5000] [--harvesters 1 2] [--gc-every 10 0]

Creates a throwaway database in the Postgres at --pg-url (dropped at the end), applies
the migrations, and uses Redis database --redis-url (its HACO keys are deleted first and
last). Phases: (1) raw COPY of the N member rows straight into ``members``, the floor;
then for each count of harvester processes in --harvesters, and each garbage collection
period in --gc-every (``harvest_gc_every_s``; its default alone unless given; 0 is
Python's automatic collector): (2) the N reports XADDed to the trace stream
(pipelined), (3) that many harvesters (``Harvester.run``, as deployed) drain the stream
into the emptied tables, timed until the stream is empty and nothing is pending; lag is
sampled after every batch, and each harvester's CPU time is counted, beside the
Postgres processes', the Redis server's and the whole machine's over the drain (busy
cores: what the drain kept busy, so where the curve from 1 to 2 harvesters bends). A rich
table goes to stderr, JSON to stdout: the first run's figures at the top level (as
before), every run in ``runs``, ``goal`` (traces/s) and ``met`` (the goal reached, every
row stored).
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import redis
from psycopg_pool import ConnectionPool
from rich.console import Console
from rich.table import Table

from bench.machine import machine_busy_s, named_cpu_s, redis_cpu_s
from bench.scratchdb import scratch_database
from coordinator.config import HacoSettings
from coordinator.state import keys
from coordinator.state.codec import text
from coordinator.tracestore.harvester import Harvester
from coordinator.tracestore.harvestgc import collected_on_timer
from coordinator.tracestore.harvestlag import Lag
from schemas.models import MemberReport, MemberTrace

GOAL_TRACES_PER_S = 50_000  # one harvester process, on the 2-core reference machine
POLL_S = 0.005  # how often the end of the drain is checked
MEMBER_COLUMNS = (
    "member_id, group_id, candidate_id, role, zone, caller_zone, model, rank, u_plus, "
    "r_minus, started_at, finished_at, status, failure_kind, failure_reason, quality, "
    "latency_s, proc_latency_s, tokens_in, tokens_out, bytes_sent, rtt_s, bandwidth_bps, "
    "lost, stream_id"
)
ZONES = ("us", "eu", "ap")


def synthetic(i: int, t0: float) -> MemberReport:
    failed = i % 10 == 0
    start = t0 + i * 0.0005
    return MemberReport(
        trace=MemberTrace(
            invocation_id=f"g{i // 3}",
            group_id=f"g{i // 3}",
            member_id=f"g{i // 3}-m{i % 3}",
            candidate_id=f"coder-{ZONES[i % 3]}",
            role="coder",
            model="sim-model",
            zone=ZONES[i % 3],
            caller_zone="eu",
            rank=i % 3,
            u_plus=0.9 - 0.1 * (i % 3),
            r_minus=0.05,
            started_at_s=start,
            finished_at_s=start + 1.25,
            status="failed" if failed else "succeeded",
            failure_kind="internal" if failed else None,
            failure_reason="the service failed" if failed else None,
            success=not failed,
            quality=None if failed else 0.75,
            latency_s=1.3,
            proc_latency_s=1.1,
            tokens_in=512,
            tokens_out=256,
            bytes_sent=2048,
            rtt_s=0.08,
            bandwidth_Bps=2e6,
        ),
        output=None if failed else "some output text of the member",
    )


def member_row(t: MemberTrace, stream_id: str) -> tuple[Any, ...]:
    ts = datetime.fromtimestamp
    return (
        t.member_id, t.group_id, t.candidate_id, t.role, t.zone, t.caller_zone, t.model,
        t.rank, t.u_plus, t.r_minus, ts(t.started_at_s, UTC), ts(t.finished_at_s, UTC),
        t.status.value, t.failure_kind.value if t.failure_kind else None, t.failure_reason,
        t.quality, t.latency_s, t.proc_latency_s, t.tokens_in, t.tokens_out, t.bytes_sent,
        t.rtt_s, t.bandwidth_Bps, t.lost, stream_id,
    )  # fmt: skip


def count(url: str, table: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}".encode()).fetchone()
    return int(row[0]) if row else 0


def raw_copy(url: str, rows: list[tuple[Any, ...]]) -> float:
    with psycopg.connect(url) as conn:
        conn.execute("TRUNCATE members, invocations")
        conn.commit()
        t = time.perf_counter()
        with conn.cursor() as cur:
            query = f"COPY members ({MEMBER_COLUMNS}) FROM STDIN"
            with cur.copy(query.encode()) as copy:
                for row in rows:
                    copy.write_row(row)
        conn.commit()
        elapsed = time.perf_counter() - t
        conn.execute("TRUNCATE members, invocations")
        conn.commit()
    return elapsed


def push(r: redis.Redis, reports: list[str], maxlen: int) -> float:
    t = time.perf_counter()
    for lo in range(0, len(reports), 2000):
        pipe = r.pipeline(transaction=False)
        for rep in reports[lo : lo + 2000]:
            pipe.xadd(keys.TRACES, {"report": rep}, maxlen=maxlen, approximate=True)
        pipe.execute()
    return time.perf_counter() - t


class _Sampled(Harvester):
    """A harvester that keeps, over its batches, the maxima of its lag: stream length, and
    the age (since XADD) of the oldest pending and oldest unharvested entry."""

    batches, max_pending_age, max_len, max_entry_age = 0, 0.0, 0, 0.0

    def update_lag(self) -> Lag:
        lag = super().update_lag()
        self.batches += 1
        self.max_pending_age = max(self.max_pending_age, lag.oldest_pending_age_s or 0.0)
        self.max_entry_age = max(self.max_entry_age, lag.oldest_entry_age_s or 0.0)
        self.max_len = max(self.max_len, lag.stream_len)
        return lag


def drain(
    redis_url: str, pg_url: str, batch: int, gc_every_s: float, name: str, done: Any, out: Any
) -> None:
    """One harvester process, as deployed (``Harvester.run`` in ``collected_on_timer``,
    as ``haco harvester`` runs it), until ``done`` is set; puts its batch count, lag
    maxima and CPU seconds on ``out``."""
    settings = HacoSettings(
        harvest_batch=batch, harvest_block_ms=100, harvest_gc_every_s=gc_every_s
    )
    cpu0 = time.process_time()
    r = redis.Redis.from_url(redis_url)
    pool = ConnectionPool(pg_url, min_size=1, max_size=settings.harvest_inflight, open=False)
    pool.open(wait=True)
    h = _Sampled(r, pool, settings, name)
    stop = threading.Event()

    def relay() -> None:  # the parent's (process) event into run's (thread) event
        done.wait()
        stop.set()

    threading.Thread(target=relay, daemon=True).start()
    try:
        with collected_on_timer(settings.harvest_gc_every_s, settings.harvest_gc_max_young):
            h.run(stop)
    finally:
        pool.close()
        r.close()
    cpu_s = time.process_time() - cpu0
    out.put((h.batches, h.max_pending_age, h.max_len, h.max_entry_age, cpu_s))


def _drained(r: redis.Redis, group: str) -> bool:
    """Everything stored: harvested entries are acknowledged and deleted after commit."""
    try:
        pipe = r.pipeline(transaction=False)
        pipe.xlen(keys.TRACES)
        pipe.xpending(keys.TRACES, group)
        length, pending = pipe.execute()
    except redis.ResponseError:  # no group yet
        return False
    return int(length) == 0 and int(pending["pending"]) == 0


def harvest(
    args: argparse.Namespace, url: str, payloads: list[str], harvesters: int, gc_every_s: float
) -> Run:
    """Push the reports, time ``harvesters`` processes draining them into emptied tables
    (until the stream is empty and nothing is pending, polled from here)."""
    settings = HacoSettings()
    with psycopg.connect(url) as conn:
        conn.execute("TRUNCATE members, invocations")
    r = redis.Redis.from_url(args.redis_url)
    r.delete(keys.TRACES, keys.TRACES_DEAD, keys.METRICS)
    try:
        push_s = push(r, payloads, settings.trace_stream_maxlen)
        # The forked harvesters share this process' heap (N reports, payloads, rows): out
        # of the collector's sight, or its passes copy every page of it into each child.
        gc.freeze()
        ctx = mp.get_context("fork")
        out, done = ctx.Queue(), ctx.Event()
        procs = [
            ctx.Process(
                target=drain,
                args=(args.redis_url, url, args.batch, gc_every_s, f"bench-{k}", done, out),
            )
            for k in range(harvesters)
        ]
        cpu0 = _Cpu.read(r)
        t = time.perf_counter()
        for p in procs:
            p.start()
        while not _drained(r, settings.harvest_group):
            time.sleep(POLL_S)
        harvest_s = time.perf_counter() - t
        cpu = _Cpu.read(r).minus(cpu0)  # before done: the harvesters' connections still open
        done.set()
        stats = [out.get() for _ in procs]
        for p in procs:
            p.join()
        metrics = {text(k): int(v) for k, v in r.hgetall(keys.METRICS).items()}
    finally:
        r.delete(keys.TRACES, keys.TRACES_DEAD, keys.METRICS)
        r.close()
    stored = count(url, "members")
    return Run(harvesters, gc_every_s, push_s, harvest_s, stored, stats, metrics, cpu)


@dataclass(frozen=True)
class _Cpu:
    """CPU seconds of the machine, of Postgres's processes on it (None: not on this
    machine) and of the Redis server: what the drain kept busy besides the harvesters."""

    machine_s: float
    postgres_s: float | None
    redis_s: float

    @classmethod
    def read(cls, r: redis.Redis) -> _Cpu:
        return cls(machine_busy_s(), named_cpu_s("postgres"), redis_cpu_s(r))

    def minus(self, before: _Cpu) -> _Cpu:
        pg = None
        if self.postgres_s is not None and before.postgres_s is not None:
            pg = self.postgres_s - before.postgres_s
        return _Cpu(self.machine_s - before.machine_s, pg, self.redis_s - before.redis_s)


@dataclass(frozen=True)
class Run:
    harvesters: int
    gc_every_s: float
    push_s: float
    harvest_s: float
    stored: int
    stats: list[tuple[int, float, int, float, float]]
    metrics: dict[str, int]
    cpu: _Cpu  # over the drain

    def summary(self, n: int, raw_s: float) -> dict[str, Any]:
        per_s = n / self.harvest_s
        return {
            "harvesters": self.harvesters,
            "gc_every_s": self.gc_every_s,
            "stream_push": {"seconds": self.push_s, "entries_per_s": n / self.push_s},
            "harvest": {
                "seconds": self.harvest_s,
                "traces_per_s": per_s,
                "rows_stored": self.stored,
                "batches": sum(s[0] for s in self.stats),
                "max_oldest_pending_age_s": max(s[1] for s in self.stats),
                "max_stream_len": max(s[2] for s in self.stats),
                "max_oldest_entry_age_s": max(s[3] for s in self.stats),
                # every harvester process's CPU (user + system), per trace stored
                "cpu_us_per_trace": self.harvesters_cpu_s / n * 1e6,
            },
            # CPU s per wall s of the drain: what it kept busy, so where the curve bends
            "busy_cores": self.busy_cores(),
            "harvest_vs_raw_copy": per_s / (n / raw_s),
            "met": per_s >= GOAL_TRACES_PER_S and self.stored == n,
            "metrics": self.metrics,
        }

    @property
    def harvesters_cpu_s(self) -> float:
        return sum(s[4] for s in self.stats)

    def busy_cores(self) -> dict[str, float | None]:
        pg, wall_s = self.cpu.postgres_s, self.harvest_s
        return {
            "harvesters": self.harvesters_cpu_s / wall_s,
            "postgres": None if pg is None else pg / wall_s,
            "redis": self.cpu.redis_s / wall_s,
            "machine": self.cpu.machine_s / wall_s,
        }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=5_000)
    ap.add_argument("--harvesters", type=int, nargs="+", default=[1, 2])
    ap.add_argument(
        "--gc-every",
        type=float,
        nargs="+",
        default=[HacoSettings().harvest_gc_every_s],
        help="harvest_gc_every_s of the harvesters (0: Python's automatic collector); "
        "each value runs every --harvesters count, side by side",
    )
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/11")
    ap.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/test")
    args = ap.parse_args(argv)
    if any(g < 0 for g in args.gc_every) or any(h < 1 for h in args.harvesters):
        ap.error(
            f"--gc-every must be >= 0 and --harvesters >= 1, got {args.gc_every}, {args.harvesters}"
        )
    err = Console(stderr=True)
    with scratch_database(args.pg_url, "haco_ingest") as url:
        t0 = time.time() - 3600
        reports = [synthetic(i, t0) for i in range(args.n)]
        payloads = [rep.model_dump_json() for rep in reports]
        rows = [member_row(rep.trace, f"0-{i}") for i, rep in enumerate(reports)]
        err.print(f"{args.n} synthetic reports, {sum(map(len, payloads)) / args.n:.0f} B each")
        raw_s = raw_copy(url, rows)
        runs = [
            harvest(args, url, payloads, k, g).summary(args.n, raw_s)
            for k in args.harvesters
            for g in args.gc_every
        ]
    result = {
        "n": args.n,
        "batch": args.batch,
        "cpus": os.cpu_count(),
        "goal": GOAL_TRACES_PER_S,
        "raw_copy": {"seconds": raw_s, "rows_per_s": args.n / raw_s},
        **runs[0],  # the first run's figures at the top level, as before; all in "runs"
        "runs": runs,
    }
    table = Table(title=f"ingest of {args.n} traces (goal {GOAL_TRACES_PER_S:,} traces/s)")
    for col in ("path", "seconds", "per second", "vs raw COPY", "CPU µs/trace", "stored"):
        table.add_column(col, justify="left" if col == "path" else "right")
    table.add_row(
        "raw COPY into members", f"{raw_s:.2f}", f"{args.n / raw_s:,.0f} rows", "1.00", ""
    )
    for run in runs:
        h = run["harvest"]
        table.add_row(
            f"harvest, {run['harvesters']} process(es), gc every {run['gc_every_s']:g} s",
            f"{h['seconds']:.2f}",
            f"{h['traces_per_s']:,.0f} traces" + (" (met)" if run["met"] else ""),
            f"{run['harvest_vs_raw_copy']:.2f}",
            f"{h['cpu_us_per_trace']:.1f}",
            f"{h['rows_stored']}/{args.n}",
        )
    err.print(table)
    for run in runs:
        h = run["harvest"]
        err.print(
            f"{run['harvesters']} harvester(s): XADD {run['stream_push']['entries_per_s']:,.0f}"
            f" entries/s; lag after each batch: max stream length {h['max_stream_len']}, "
            f"oldest pending {h['max_oldest_pending_age_s']:.2f} s, oldest entry "
            f"{h['max_oldest_entry_age_s']:.2f} s"
        )
        b, pg = run["busy_cores"], run["busy_cores"]["postgres"]
        err.print(
            f"  busy cores while draining, of {os.cpu_count()}: harvesters {b['harvesters']:.2f},"
            f" Postgres {'not here' if pg is None else f'{pg:.2f}'}, Redis {b['redis']:.2f},"
            f" the machine {b['machine']:.2f}"
        )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
