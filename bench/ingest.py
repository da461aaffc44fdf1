"""Ingest benchmark: traces/s through stream -> harvester -> Postgres, side by side with a
raw COPY of the same rows into the same table, in the same run.

    python -m bench.ingest [--n 200000] [--batch 5000] [--harvesters 1]

Creates a throwaway database in the Postgres at --pg-url (dropped at the end), applies
the migrations, and uses Redis database --redis-url (its HACO keys are deleted first and
last). Phases: (1) raw COPY of the N member rows straight into ``members``, (2) the N
reports XADDed to the trace stream (pipelined), (3) the harvester(s) drain the stream
into the emptied tables; lag is sampled after every batch. A rich table goes to stderr,
JSON to stdout.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from datetime import UTC, datetime
from typing import Any

import psycopg
import redis
from psycopg_pool import ConnectionPool
from rich.console import Console
from rich.table import Table

from bench.scratchdb import scratch_database
from coordinator.config import HacoSettings
from coordinator.state import keys
from coordinator.state.codec import text
from coordinator.tracestore.harvester import Harvester
from schemas.models import MemberReport, MemberTrace

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
        conn.execute("TRUNCATE members, invocations, link_observations")
        conn.commit()
        t = time.perf_counter()
        with conn.cursor() as cur:
            query = f"COPY members ({MEMBER_COLUMNS}) FROM STDIN"
            with cur.copy(query.encode()) as copy:
                for row in rows:
                    copy.write_row(row)
        conn.commit()
        elapsed = time.perf_counter() - t
        conn.execute("TRUNCATE members, invocations, link_observations")
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


def drain(redis_url: str, pg_url: str, batch: int, name: str, out: Any) -> None:
    """One harvester until the stream is empty; puts its lag maxima on ``out``. Lag is
    sampled after each batch: stream length, and the age (since XADD) of the oldest
    pending and oldest unharvested entry."""
    settings = HacoSettings(harvest_batch=batch, harvest_block_ms=100)
    r = redis.Redis.from_url(redis_url)
    pool = ConnectionPool(pg_url, min_size=1, max_size=1, open=False)
    pool.open(wait=True)
    h = Harvester(r, pool, settings, name)
    batches, max_pending_age, max_entry_age, max_len = 0, 0.0, 0.0, 0
    try:
        while True:
            h.run_once()
            batches += 1
            lag = h.last_lag
            if lag is not None:
                max_pending_age = max(max_pending_age, lag.oldest_pending_age_s or 0.0)
                max_entry_age = max(max_entry_age, lag.oldest_entry_age_s or 0.0)
                max_len = max(max_len, lag.stream_len)
                if lag.stream_len == 0 and lag.pending == 0:
                    break
    finally:
        pool.close()
        r.close()
    out.put((batches, max_pending_age, max_len, max_entry_age))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=5_000)
    ap.add_argument("--harvesters", type=int, default=1)
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/11")
    ap.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/test")
    args = ap.parse_args()
    err = Console(stderr=True)
    settings = HacoSettings()
    with scratch_database(args.pg_url, "haco_ingest") as url:
        r = redis.Redis.from_url(args.redis_url)
        r.delete(keys.TRACES, keys.TRACES_DEAD, keys.METRICS)
        try:
            t0 = time.time() - 3600
            reports = [synthetic(i, t0) for i in range(args.n)]
            payloads = [rep.model_dump_json() for rep in reports]
            rows = [member_row(rep.trace, f"0-{i}") for i, rep in enumerate(reports)]
            err.print(f"{args.n} synthetic reports, {sum(map(len, payloads)) / args.n:.0f} B each")
            raw_s = raw_copy(url, rows)
            push_s = push(r, payloads, settings.trace_stream_maxlen)
            out: Any = mp.get_context("fork").Queue()
            procs = [
                mp.get_context("fork").Process(
                    target=drain, args=(args.redis_url, url, args.batch, f"bench-{k}", out)
                )
                for k in range(args.harvesters)
            ]
            t = time.perf_counter()
            for p in procs:
                p.start()
            stats = [out.get() for _ in procs]
            harvest_s = time.perf_counter() - t
            for p in procs:
                p.join()
            stored = count(url, "members")
            raw = r.hgetall(keys.METRICS)
            metrics = {text(k): int(v) for k, v in raw.items()}
        finally:
            r.delete(keys.TRACES, keys.TRACES_DEAD, keys.METRICS)
            r.close()
    result = {
        "n": args.n,
        "batch": args.batch,
        "harvesters": args.harvesters,
        "cpus": os.cpu_count(),
        "raw_copy": {"seconds": raw_s, "rows_per_s": args.n / raw_s},
        "stream_push": {"seconds": push_s, "entries_per_s": args.n / push_s},
        "harvest": {
            "seconds": harvest_s,
            "traces_per_s": args.n / harvest_s,
            "rows_stored": stored,
            "batches": sum(s[0] for s in stats),
            "max_oldest_pending_age_s": max(s[1] for s in stats),
            "max_stream_len": max(s[2] for s in stats),
            "max_oldest_entry_age_s": max(s[3] for s in stats),
        },
        "harvest_vs_raw_copy": (args.n / harvest_s) / (args.n / raw_s),
        "metrics": metrics,
    }
    table = Table(title=f"ingest of {args.n} traces ({args.harvesters} harvester(s))")
    for col in ("path", "seconds", "per second"):
        table.add_column(col, justify="left" if col == "path" else "right")
    table.add_row("raw COPY into members", f"{raw_s:.2f}", f"{args.n / raw_s:,.0f} rows")
    table.add_row("XADD to the stream", f"{push_s:.2f}", f"{args.n / push_s:,.0f} entries")
    table.add_row(
        "stream → harvester → Postgres", f"{harvest_s:.2f}", f"{args.n / harvest_s:,.0f} traces"
    )
    err.print(table)
    err.print(
        f"stored {stored}/{args.n}; harvest lag after each batch: max stream length "
        f"{result['harvest']['max_stream_len']}, oldest pending "
        f"{result['harvest']['max_oldest_pending_age_s']:.2f} s, oldest entry "
        f"{result['harvest']['max_oldest_entry_age_s']:.2f} s"
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
